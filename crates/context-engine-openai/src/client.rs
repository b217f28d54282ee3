//! The HTTP client of the OpenAI-compatible summarizer: requests, retries,
//! reply parsing.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::json;

use context_engine::redact::{Egress, Redactor};
use context_engine::retry::Backoff;
use context_engine::summarize::model::{self, Reply, ReplyShape, error_message, parse_retry_after};
use context_engine::summarize::openai::{ApiKey, CallStats, OpenAiConfig};
use context_engine::summarize::window::{self, Window, WindowSource};
use context_engine::summarize::{ModelSummarizer, SummarizeError, Summarizer, SummaryRequest};
use context_engine::tokens::{TokenCounter, counter_for_model};

use crate::discover;

/// The OpenAI-compatible summarizer. Cheap to share: one connection pool,
/// and `&self` methods only.
pub struct OpenAiSummarizer {
    config: OpenAiConfig,
    key: ApiKey,
    endpoint: String,
    name: String,
    agent: ureq::Agent,
    counter: Arc<dyn TokenCounter>,
    last: Mutex<CallStats>,
    /// The summary model's window once discovered or learned: asked of the
    /// server once per client (one client serves every session of a
    /// configuration), never a process-wide cache.
    window: Mutex<Option<Window>>,
    /// The last line of defence for a caller that hands unredacted turns:
    /// the prompt is redacted again before it is sent (a no-op on the
    /// compressor's already redacted input).
    egress: Egress,
}

impl fmt::Debug for OpenAiSummarizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiSummarizer")
            .field("endpoint", &self.endpoint)
            .field("model", &self.config.model)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl OpenAiSummarizer {
    /// Builds the client with the key in `config.api_key` (the library
    /// reads no environment: [`with_env`](Self::with_env) looks the
    /// variable `config.api_key_env` up in the caller's).
    /// A missing base URL, model or key is [`SummarizeError::NotConfigured`].
    pub fn new(config: OpenAiConfig) -> Result<OpenAiSummarizer, SummarizeError> {
        OpenAiSummarizer::with_env(config, |_| None)
    }

    /// Like [`new`](Self::new), the key (unless `config.api_key` is set)
    /// from the variable `config.api_key_env` as `env` looks it up: the
    /// caller's environment snapshot (`context_engine::config::Env`) or a host's
    /// own settings.
    pub fn with_env(
        mut config: OpenAiConfig,
        env: impl FnOnce(&str) -> Option<String>,
    ) -> Result<OpenAiSummarizer, SummarizeError> {
        let base = config.base_url.trim().trim_end_matches('/');
        if base.is_empty() {
            return Err(SummarizeError::NotConfigured(
                "openai summarizer: no base URL".into(),
            ));
        }
        let endpoint = format!("{base}/chat/completions");
        check_endpoint(&endpoint)?;
        if config.model.trim().is_empty() {
            return Err(SummarizeError::NotConfigured(
                "openai summarizer: no model".into(),
            ));
        }
        let key = match config.api_key.take() {
            Some(key) => key,
            None => env(&config.api_key_env).map(ApiKey::new).ok_or_else(|| {
                SummarizeError::NotConfigured(format!(
                    "openai summarizer: environment variable {} is not set",
                    config.api_key_env
                ))
            })?,
        };
        if key.expose().trim().is_empty() {
            return Err(SummarizeError::NotConfigured(format!(
                "openai summarizer: empty API key (from {})",
                config.api_key_env
            )));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            // Statuses are classified here (auth vs retry), not by ureq.
            .http_status_as_error(false)
            .timeout_global(Some(config.timeout))
            .timeout_connect(Some(config.connect_timeout.min(config.timeout)))
            .user_agent(concat!("context-engine/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(OpenAiSummarizer {
            name: format!("openai:{}", config.model),
            counter: counter_for_model(&config.model),
            config,
            key,
            endpoint,
            agent,
            last: Mutex::new(CallStats::default()),
            window: Mutex::new(None),
            egress: Egress::builtin(),
        })
    }

    /// Redacts the prompt with `redactor` (the user's patterns) rather than
    /// the built-in rules alone.
    pub fn with_redactor(mut self, redactor: Arc<Redactor>) -> OpenAiSummarizer {
        self.egress = Egress::new(Some(redactor));
        self
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The settings (the key, if one was given directly, is moved out).
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The stats of the most recent call (default before any).
    pub fn last_call(&self) -> CallStats {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// HTTP attempts of the most recent call.
    pub fn last_attempts(&self) -> u32 {
        self.last_call().attempts
    }

    /// [`Summarizer::summarize`] that also says how many attempts it took
    /// and how long it waited between them.
    pub fn summarize_with_stats(
        &self,
        request: &SummaryRequest<'_>,
    ) -> (Result<String, SummarizeError>, CallStats) {
        let started = Instant::now();
        let mut stats = CallStats::default();
        let result = self.call(request, &mut stats);
        stats.elapsed = started.elapsed();
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = stats;
        (result, stats)
    }

    /// The summary model's window: configured, cached for this base URL
    /// and model, or asked of the server now.
    pub fn window(&self) -> Window {
        if let Some(tokens) = self.config.context_length {
            return Window {
                tokens: Some(tokens),
                source: WindowSource::Configured,
            };
        }
        if !self.config.discover_window {
            return Window::UNKNOWN;
        }
        let (base, model) = (&self.config.base_url, &self.config.model);
        if let Some(known) = *self.window.lock().unwrap_or_else(PoisonError::into_inner) {
            return known;
        }
        let found = discover::discover(&self.agent, base, model, self.key.expose());
        *self.window.lock().unwrap_or_else(PoisonError::into_inner) = Some(found);
        found
    }

    fn call(
        &self,
        request: &SummaryRequest<'_>,
        stats: &mut CallStats,
    ) -> Result<String, SummarizeError> {
        let mut window = self.window();
        let mut relearned = false;
        let reply = loop {
            match self.send(request, window, stats) {
                Ok(reply) => break reply,
                // A context overflow that names the limit: retry once,
                // bounded to it (or tighter, when already bounded to it).
                Err(failure) if failure.limit.is_some() && !relearned => {
                    let limit = failure.limit.unwrap_or_default();
                    let tokens = match window.tokens {
                        Some(w) if w <= limit => w.saturating_mul(3) / 4,
                        _ => limit,
                    };
                    let learned = Window {
                        tokens: Some(tokens),
                        source: WindowSource::LearnedFromError,
                    };
                    *self.window.lock().unwrap_or_else(PoisonError::into_inner) = Some(learned);
                    window = learned;
                    relearned = true;
                }
                Err(failure) => return Err(failure.error),
            }
        };
        stats.prompt_tokens = reply.prompt_tokens;
        stats.completion_tokens = reply.completion_tokens;
        model::finish(
            &reply.text,
            request,
            self.counter.as_ref(),
            self.config.deterministic_sections,
        )
    }

    /// One request for `request` bounded by `window`, with the retries of
    /// the retry policy.
    fn send(
        &self,
        request: &SummaryRequest<'_>,
        window: Window,
        stats: &mut CallStats,
    ) -> Result<Reply, Failure> {
        let (prompt, counted) = model::bounded_prompt(
            &self.config,
            self.counter.as_ref(),
            request,
            window,
            "openai summarizer",
        )
        .map_err(Failure::final_)?;
        stats.counted_prompt_tokens = counted;
        stats.max_tokens = self.config.output_reserve_for(window.tokens);
        stats.window_tokens = window.tokens;
        stats.window_source = window.source;
        let mut body = json!({
            "model": self.config.model,
            "messages": [
                {"role": "system", "content": prompt.system},
                {"role": "user", "content": self.egress.text(&prompt.user)},
            ],
            "temperature": 0,
        });
        if let Some(max_tokens) = stats.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        if let Some(seed) = self.config.seed {
            body["seed"] = json!(seed);
        }
        let body = body.to_string();
        loop {
            stats.attempts += 1;
            let failure = match self.attempt(&body) {
                Ok(reply) => return Ok(reply),
                Err(failure) => failure,
            };
            if !failure.retryable || stats.attempts > self.config.max_retries {
                return Err(failure);
            }
            let wait = match failure.retry_after {
                Some(wait) if wait > self.config.max_retry_wait => return Err(failure),
                Some(wait) => wait,
                None => Backoff::exponential(self.config.retry_base_delay)
                    .capped(self.config.max_retry_wait)
                    .delay(stats.attempts),
            };
            std::thread::sleep(wait);
            stats.waited += wait;
        }
    }

    fn attempt(&self, body: &str) -> Result<Reply, Failure> {
        let mut response = self
            .agent
            .post(&self.endpoint)
            .header("Authorization", format!("Bearer {}", self.key.expose()))
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .send(body)
            .map_err(|e| self.transport_failure(e))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let bytes = response
            .body_mut()
            .with_config()
            .limit(self.config.max_reply_bytes)
            .read_to_vec()
            .map_err(|e| self.transport_failure(e))?;
        match status {
            200..=299 => model::parse_reply(ReplyShape::Chat, &bytes).map_err(Failure::final_),
            401..=403 => Err(Failure::final_(SummarizeError::Auth {
                status,
                message: error_message(&bytes),
            })),
            429 => Err(Failure {
                error: SummarizeError::RateLimited { retry_after },
                retryable: true,
                retry_after,
                limit: None,
            }),
            408 | 500..=599 => Err(Failure {
                error: SummarizeError::Server {
                    status,
                    message: error_message(&bytes),
                },
                retryable: true,
                retry_after,
                limit: None,
            }),
            _ => Err(Failure {
                limit: matches!(status, 400 | 413)
                    .then(|| window::limit_from_error(&bytes))
                    .flatten(),
                ..Failure::final_(SummarizeError::Server {
                    status,
                    message: error_message(&bytes),
                })
            }),
        }
    }

    fn transport_failure(&self, error: ureq::Error) -> Failure {
        Failure::final_(classify(error, &self.endpoint, self.config.timeout))
    }
}

impl Summarizer for OpenAiSummarizer {
    fn name(&self) -> &str {
        &self.name
    }

    fn summarize(&self, request: &SummaryRequest<'_>) -> Result<String, SummarizeError> {
        self.summarize_with_stats(request).0
    }
}

impl ModelSummarizer for OpenAiSummarizer {
    fn last_call(&self) -> CallStats {
        OpenAiSummarizer::last_call(self)
    }
}

/// One failed attempt and whether another may follow.
struct Failure {
    error: SummarizeError,
    retryable: bool,
    retry_after: Option<Duration>,
    /// The window a context-overflow error named.
    limit: Option<u64>,
}

impl Failure {
    fn final_(error: SummarizeError) -> Failure {
        Failure {
            error,
            retryable: false,
            retry_after: None,
            limit: None,
        }
    }
}

fn check_endpoint(endpoint: &str) -> Result<(), SummarizeError> {
    let bad = |why: &str| {
        SummarizeError::NotConfigured(format!("openai summarizer: base URL {endpoint}: {why}"))
    };
    let uri: ureq::http::Uri = endpoint.parse().map_err(|e| bad(&format!("{e}")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(bad("scheme must be http or https")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    Ok(())
}

/// Maps a transport error. Connection problems (refused, DNS, reset, a body
/// cut short) are `Network`; running out of the overall deadline is
/// `Timeout`; a connect timeout is `Network` too (the host is unreachable,
/// not slow to answer).
fn classify(error: ureq::Error, endpoint: &str, timeout: Duration) -> SummarizeError {
    use std::io::ErrorKind;
    match error {
        ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => {
            SummarizeError::Network(format!("{endpoint}: could not connect in time"))
        }
        ureq::Error::Timeout(_) => SummarizeError::Timeout(timeout),
        ureq::Error::Io(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
            SummarizeError::Timeout(timeout)
        }
        ureq::Error::BodyExceedsLimit(limit) => {
            SummarizeError::Malformed(format!("reply larger than {limit} bytes"))
        }
        other => SummarizeError::Network(format!("{endpoint}: {other}")),
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
