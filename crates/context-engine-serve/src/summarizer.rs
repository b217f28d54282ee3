//! `summarizer.kind: upstream`: compaction summaries asked of the proxy's
//! own upstream, in the client's API (chat completions, Anthropic
//! Messages, Responses), with the credential the client's request carried
//! (or the proxy's provider key), the model `summarizer.model` names or
//! else the request's.
//!
//! One [`UpstreamSummarizer`] serves every session of the proxy. What a
//! summary is asked *of* (URL, API, headers, model, the session's window)
//! is the request that started the background summary: the session step
//! captures it as a [`Target`] ([`Target::of`]) and
//! [`background::spawn`](crate::session::background::spawn) runs the job
//! inside [`in_scope`], which hands the target to the summarizer on that
//! thread and collects what the call spent ([`CallStats`]). Outside a
//! scope (a manual compaction) the summarizer is not configured, and the
//! compressor's policy puts the extractive summary in its place, saying
//! why.
//!
//! The prompt is the core's ([`model::bounded_prompt`]): redacted with the
//! user's patterns like every egress, within the summary model's window
//! (`summarizer.context_length`, else the session's), the reply checked
//! and followed by the state record ([`model::finish`]). 429 and 5xx are
//! retried by the one retry policy, honouring `Retry-After`. Summaries
//! are asked with temperature 0 (for repeatable summaries); a model that
//! refuses a temperature is asked once more without it.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use axum::http::header::{self, HeaderName};
use axum::http::{HeaderMap, HeaderValue};
use context_engine::redact::Egress;
use context_engine::retry::Backoff;
use context_engine::summarize::model::{self, Reply, ReplyShape};
use context_engine::summarize::openai::{CallStats, OpenAiConfig};
use context_engine::summarize::prompt::Prompt;
use context_engine::summarize::window::{Window, WindowSource};
use context_engine::summarize::{ModelSummarizer, SummarizeError, Summarizer, SummaryRequest};
use context_engine::tokens::counter_for_model;
use serde_json::{Value, json};

/// Where one session's summaries go: the request that started them.
#[derive(Clone, Debug)]
pub struct Target {
    /// The API the client speaks.
    pub api: ReplyShape,
    /// The upstream URL the client's request went to (the summary goes
    /// to the same endpoint).
    pub url: String,
    /// The headers that went upstream with it (the client's credential or
    /// the proxy's key; never the proxy's access token, the gateway's
    /// identity header or hop-by-hop headers).
    pub headers: HeaderMap,
    /// The request's model.
    pub model: Option<String>,
    /// The window the session is managed against, in tokens.
    pub window: u64,
}

impl Target {
    /// The target of a request of `api` sent to `url` with `headers`
    /// (as they went upstream), naming `model`, in a session managed
    /// against `window` tokens.
    pub fn of(
        api: ReplyShape,
        url: &str,
        headers: &HeaderMap,
        model: Option<String>,
        window: u64,
    ) -> Target {
        let mut headers = headers.clone();
        // The summary is read whole, as JSON.
        for name in [header::ACCEPT, header::CONTENT_TYPE, header::CONTENT_LENGTH] {
            headers.remove(name);
        }
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Target {
            api,
            url: url.to_owned(),
            headers,
            model,
            window,
        }
    }
}

/// What one summary call spent, and why it failed if it did.
#[derive(Clone, Debug)]
pub struct Spent {
    /// Its figures (attempts, tokens the upstream reported, window).
    pub stats: CallStats,
    /// Its error, when it failed (the extractive summary stands in).
    pub failure: Option<String>,
}

thread_local! {
    /// The target of the summary being prepared on this thread, and what
    /// its call spent.
    static SCOPE: RefCell<Option<(Target, Option<Spent>)>> = const { RefCell::new(None) };
}

/// Runs `job` (a background summary) with `target` as the upstream
/// summarizer's target on this thread; what its call spent comes back
/// with the result (`None`: no upstream call was made).
pub fn in_scope<T>(target: Target, job: impl FnOnce() -> T) -> (T, Option<Spent>) {
    /// Clears the scope however the job ends, a panic included: a
    /// session's credential never outlives its job on a pooled thread,
    /// where another session's work runs next.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            SCOPE.with(|s| s.borrow_mut().take());
        }
    }
    SCOPE.with(|s| *s.borrow_mut() = Some((target, None)));
    let clear = Clear;
    let out = job();
    let spent = SCOPE
        .with(|s| s.borrow_mut().take())
        .and_then(|(_, stats)| stats);
    drop(clear);
    (out, spent)
}

fn current_target() -> Option<Target> {
    SCOPE.with(|s| s.borrow().as_ref().map(|(t, _)| t.clone()))
}

fn record(call: Spent) {
    SCOPE.with(|s| {
        if let Some((_, spent)) = s.borrow_mut().as_mut() {
            *spent = Some(call);
        }
    });
}

/// The summarizer `summarizer.kind: upstream` names (see the module
/// docs).
pub struct UpstreamSummarizer {
    client: reqwest::Client,
    /// `summarizer.*`: the model (empty: the request's), the reply cap,
    /// the summary model's window, the timeout; the prompt's caps.
    config: OpenAiConfig,
    egress: Egress,
    name: String,
}

impl std::fmt::Debug for UpstreamSummarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamSummarizer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl UpstreamSummarizer {
    /// A summarizer with `config` (its `base_url` and key are not used:
    /// the target's are), its prompts redacted by `egress`.
    pub fn new(config: OpenAiConfig, egress: Egress) -> Result<UpstreamSummarizer, SummarizeError> {
        // One process-wide TLS provider; a second install is a no-op error.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout.min(config.timeout))
            .timeout(config.timeout)
            .build()
            .map_err(|e| SummarizeError::NotConfigured(format!("upstream summarizer: {e}")))?;
        let name = match config.model.trim() {
            "" => "upstream".to_owned(),
            m => format!("upstream:{m}"),
        };
        Ok(UpstreamSummarizer {
            client,
            config,
            egress,
            name,
        })
    }

    fn call(
        &self,
        request: &SummaryRequest<'_>,
        stats: &mut CallStats,
    ) -> Result<String, SummarizeError> {
        let target = current_target().ok_or_else(|| {
            SummarizeError::NotConfigured(
                "upstream summarizer: no proxied request to take the upstream, credential and \
                 model from (summaries are prepared in the background of a request)"
                    .into(),
            )
        })?;
        let model = match self.config.model.trim() {
            "" => target.model.clone().unwrap_or_default(),
            m => m.to_owned(),
        };
        if model.trim().is_empty() {
            return Err(SummarizeError::NotConfigured(
                "upstream summarizer: the request names no model and summarizer.model is not set"
                    .into(),
            ));
        }
        let window = match self.config.context_length {
            Some(tokens) => Window {
                tokens: Some(tokens),
                source: WindowSource::Configured,
            },
            None => Window {
                tokens: (target.window > 0).then_some(target.window),
                source: WindowSource::Session,
            },
        };
        let counter = counter_for_model(&model);
        let (prompt, counted) = model::bounded_prompt(
            &self.config,
            counter.as_ref(),
            request,
            window,
            "upstream summarizer",
        )?;
        stats.counted_prompt_tokens = counted;
        stats.window_tokens = window.tokens;
        stats.window_source = window.source;
        // A Messages request must say how long the reply may be.
        stats.max_tokens = self
            .config
            .output_reserve_for(window.tokens)
            .or(match target.api {
                ReplyShape::Messages => Some(4096),
                _ => None,
            });
        let prompt = Prompt {
            system: prompt.system,
            user: self.egress.text(&prompt.user).into_owned(),
        };
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            SummarizeError::NotConfigured("upstream summarizer: no runtime to send on".into())
        })?;
        let mut temperature = true;
        let reply = loop {
            let body = body(target.api, &model, &prompt, stats.max_tokens, temperature);
            match handle.block_on(self.send(&target, body, stats)) {
                Err(SummarizeError::Server {
                    status: 400,
                    message,
                }) if temperature && message.to_ascii_lowercase().contains("temperature") => {
                    temperature = false;
                }
                other => break other?,
            }
        };
        stats.prompt_tokens = reply.prompt_tokens;
        stats.completion_tokens = reply.completion_tokens;
        model::finish(
            &reply.text,
            request,
            counter.as_ref(),
            self.config.deterministic_sections,
        )
    }

    /// One summary request, with the retries of the retry policy.
    async fn send(
        &self,
        target: &Target,
        body: String,
        stats: &mut CallStats,
    ) -> Result<Reply, SummarizeError> {
        loop {
            stats.attempts += 1;
            let (error, retry_after) = match self.attempt(target, body.clone()).await {
                Ok(reply) => return Ok(reply),
                Err(failure) => failure,
            };
            let retryable = matches!(
                error,
                SummarizeError::RateLimited { .. }
                    | SummarizeError::Server {
                        status: 408 | 500..=599,
                        ..
                    }
            );
            if !retryable || stats.attempts > self.config.max_retries {
                return Err(error);
            }
            let wait = match retry_after {
                Some(wait) if wait > self.config.max_retry_wait => return Err(error),
                Some(wait) => wait,
                None => Backoff::exponential(self.config.retry_base_delay)
                    .capped(self.config.max_retry_wait)
                    .delay(stats.attempts),
            };
            tokio::time::sleep(wait).await;
            stats.waited += wait;
        }
    }

    async fn attempt(
        &self,
        target: &Target,
        body: String,
    ) -> Result<Reply, (SummarizeError, Option<Duration>)> {
        let response = self
            .client
            .post(&target.url)
            .headers(target.headers.clone())
            .body(body)
            .send()
            .await
            .map_err(|e| (self.transport(&e, &target.url), None))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(HeaderName::from_static("retry-after"))
            .and_then(|v| v.to_str().ok())
            .and_then(model::parse_retry_after);
        let bytes = read_capped(response, self.config.max_reply_bytes)
            .await
            .map_err(|e| (e, None))?;
        let message = || model::error_message(&bytes);
        match status {
            200..=299 => model::parse_reply(target.api, &bytes).map_err(|e| (e, None)),
            401..=403 => Err((
                SummarizeError::Auth {
                    status,
                    message: message(),
                },
                None,
            )),
            429 => Err((SummarizeError::RateLimited { retry_after }, retry_after)),
            _ => Err((
                SummarizeError::Server {
                    status,
                    message: message(),
                },
                retry_after,
            )),
        }
    }

    fn transport(&self, e: &reqwest::Error, url: &str) -> SummarizeError {
        if e.is_timeout() && !e.is_connect() {
            SummarizeError::Timeout(self.config.timeout)
        } else {
            SummarizeError::Network(format!("{url}: {e}"))
        }
    }
}

/// The reply body, at most `limit` bytes.
async fn read_capped(
    mut response: reqwest::Response,
    limit: u64,
) -> Result<Vec<u8>, SummarizeError> {
    let mut bytes = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                bytes.extend_from_slice(&chunk);
                if bytes.len() as u64 > limit {
                    return Err(SummarizeError::Malformed(format!(
                        "reply larger than {limit} bytes"
                    )));
                }
            }
            Ok(None) => return Ok(bytes),
            Err(e) if e.is_timeout() => {
                return Err(SummarizeError::Network(format!("the reply was cut: {e}")));
            }
            Err(e) => return Err(SummarizeError::Network(format!("the reply was cut: {e}"))),
        }
    }
}

/// The summary request in `api`'s own shape: not streamed, not stored.
fn body(
    api: ReplyShape,
    model: &str,
    prompt: &Prompt,
    max_tokens: Option<u32>,
    temperature: bool,
) -> String {
    let mut body = match api {
        ReplyShape::Chat => json!({
            "model": model,
            "messages": [
                {"role": "system", "content": prompt.system},
                {"role": "user", "content": prompt.user},
            ],
            "stream": false,
        }),
        ReplyShape::Messages => json!({
            "model": model,
            "system": prompt.system,
            "messages": [{"role": "user", "content": prompt.user}],
            "stream": false,
        }),
        ReplyShape::Responses => json!({
            "model": model,
            "instructions": prompt.system,
            "input": [{"role": "user", "content": prompt.user}],
            "stream": false,
            "store": false,
        }),
    };
    let cap = match api {
        ReplyShape::Chat => "max_tokens",
        ReplyShape::Messages => "max_tokens",
        ReplyShape::Responses => "max_output_tokens",
    };
    if let (Some(n), Value::Object(map)) = (max_tokens, &mut body) {
        map.insert(cap.to_owned(), json!(n));
    }
    if temperature && let Value::Object(map) = &mut body {
        map.insert("temperature".to_owned(), json!(0));
    }
    body.to_string()
}

impl Summarizer for UpstreamSummarizer {
    fn name(&self) -> &str {
        &self.name
    }

    fn summarize(&self, request: &SummaryRequest<'_>) -> Result<String, SummarizeError> {
        let started = Instant::now();
        let mut stats = CallStats::default();
        let result = self.call(request, &mut stats);
        stats.elapsed = started.elapsed();
        if stats.attempts > 0 {
            record(Spent {
                stats,
                failure: result.as_ref().err().map(ToString::to_string),
            });
        }
        result
    }
}

impl ModelSummarizer for UpstreamSummarizer {
    /// Calls are per session: what one spent travels with its summary
    /// ([`in_scope`]), not here.
    fn last_call(&self) -> CallStats {
        CallStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer a"));
        Target::of(
            ReplyShape::Chat,
            "http://127.0.0.1:9/v1/chat/completions",
            &headers,
            None,
            1,
        )
    }

    #[test]
    fn a_target_lives_only_inside_its_scope_even_when_the_job_panics() {
        assert!(current_target().is_none());
        let (seen, _) = in_scope(target(), || current_target().map(|t| t.headers));
        assert_eq!(seen.unwrap()[header::AUTHORIZATION], "Bearer a");
        assert!(current_target().is_none(), "cleared after the job");
        let panicked = std::panic::catch_unwind(|| in_scope(target(), || panic!("boom")));
        assert!(panicked.is_err());
        assert!(current_target().is_none(), "cleared after a panic too");
    }

    #[test]
    fn outside_a_scope_the_summarizer_is_not_configured() {
        let s = UpstreamSummarizer::new(OpenAiConfig::default(), Egress::builtin()).unwrap();
        let turns = [context_engine::Message::user("fix the parser")];
        let err = s.summarize(&SummaryRequest::new(&turns, 100)).unwrap_err();
        assert!(matches!(err, SummarizeError::NotConfigured(_)), "{err}");
    }

    #[test]
    fn each_api_gets_its_own_request_shape() {
        let prompt = Prompt {
            system: "sys".into(),
            user: "material".into(),
        };
        let chat: Value =
            serde_json::from_str(&body(ReplyShape::Chat, "m", &prompt, Some(9), true)).unwrap();
        assert_eq!(chat["messages"][0]["content"], "sys");
        assert_eq!(
            (chat["max_tokens"].as_u64(), chat["temperature"].as_u64()),
            (Some(9), Some(0))
        );
        let messages: Value =
            serde_json::from_str(&body(ReplyShape::Messages, "m", &prompt, Some(9), false))
                .unwrap();
        assert_eq!(messages["system"], "sys");
        assert_eq!(messages["messages"][0]["content"], "material");
        assert!(messages.get("temperature").is_none());
        let responses: Value =
            serde_json::from_str(&body(ReplyShape::Responses, "m", &prompt, Some(9), true))
                .unwrap();
        assert_eq!(responses["instructions"], "sys");
        assert_eq!(responses["max_output_tokens"], 9);
        assert_eq!(responses["store"], false);
    }
}
