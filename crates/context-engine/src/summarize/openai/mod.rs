//! A [`Summarizer`] backed by any OpenAI-compatible chat-completions endpoint
//! (OpenAI, OpenRouter, vLLM, llama.cpp server, Ollama).
//!
//! The client is blocking ([`ureq`]) because a summary is one call per
//! compaction and the [`Summarizer`] trait is blocking. Every failure is
//! mapped to the [`SummarizeError`] variant the compressor's policy needs:
//! credentials refused (401/402/403) and unreachable endpoints abort,
//! everything else falls back to the extractive summary. 429 and 5xx are
//! retried with exponential backoff, honouring `Retry-After`.
//!
//! A small local model needs a bound in tokens: the summary model's window
//! is [`OpenAiConfig::context_length`] when given, else asked of the server
//! once per base URL and model ([`window`](super::window): llama.cpp's
//! `/props`, the `/models` list), else learned from a context-overflow
//! error, which is retried once bounded to the limit it names. With a
//! window every request fits it (prompt counted with the project's tokenizer times
//! [`OpenAiConfig::token_margin`], plus the reply reserve
//! [`OpenAiConfig::max_output_tokens`], which is then sent as `max_tokens`).
//! With no window known, no `max_tokens` is sent (a capped reply is a
//! truncated summary) and only the character caps bound the input (see
//! [`OpenAiConfig::max_input_chars`]).
//! Requests use temperature 0 and a fixed `seed`, so a summary can be
//! reproduced. The model's text is followed by the user asks, files and
//! errors extracted from the messages
//! ([`OpenAiConfig::deterministic_sections`]): a small model's prose may
//! miss them.
//!
//! ```no_run
//! use std::time::Duration;
//! use context_engine::summarize::openai::{OpenAiConfig, OpenAiSummarizer};
//! use context_engine::summarize::{Summarizer, SummaryRequest};
//! use context_engine::Message;
//!
//! let config = OpenAiConfig::new("http://127.0.0.1:8080/v1", "qwen2.5-7b-instruct")
//!     .with_api_key_env("LLAMA_API_KEY")
//!     .with_timeout(Duration::from_secs(60));
//! let summarizer = OpenAiSummarizer::with_env(config, |name| std::env::var(name).ok())?;
//! let turns = [Message::user("port the lexer to Rust")];
//! let summary = summarizer.summarize(&SummaryRequest::new(&turns, 500))?;
//! # Ok::<(), context_engine::summarize::SummarizeError>(())
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::prompt::{self, Limits, TokenBound};
use super::quality;
use super::state::StateRecord;
use super::window::{self, Window, WindowSource};
use super::{SummarizeError, Summarizer, SummaryRequest};
use crate::redact::{Egress, Redactor};
use crate::tokens::{TokenCounter, counter_for_model};

/// The seed sent by default: any fixed value makes runs repeatable.
pub const DEFAULT_SEED: u64 = 42;

/// Longest excerpt of a server's error body kept in an error message.
const ERROR_EXCERPT_CHARS: usize = 300;

/// An API key. Its `Debug` output is a placeholder so the key never ends up
/// in logs or error reports.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<hidden>)")
    }
}

/// Settings of an [`OpenAiSummarizer`]. Start from [`OpenAiConfig::new`] (or
/// `Default` and set `base_url` and `model`) and adjust with the `with_*`
/// methods.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OpenAiConfig {
    /// Base URL as in the OpenAI SDKs, e.g. `http://127.0.0.1:8080/v1`; the
    /// client posts to `{base_url}/chat/completions`.
    pub base_url: String,
    /// Model name sent in the request.
    pub model: String,
    /// Environment variable the key is read from at construction when
    /// [`api_key`](Self::api_key) is not set. Default `OPENAI_API_KEY`.
    pub api_key_env: String,
    /// A key given directly; takes precedence over the environment.
    pub api_key: Option<ApiKey>,
    /// Whole-request deadline (connect, send, wait, read). Default 120 s.
    pub timeout: Duration,
    /// Deadline for establishing the connection (capped by `timeout`).
    /// Default 10 s.
    pub connect_timeout: Duration,
    /// Retries after the first attempt for 408, 429 and 5xx. Default 3.
    pub max_retries: u32,
    /// First backoff delay when the server gives no `Retry-After`; doubles on
    /// each retry. Default 1 s.
    pub retry_base_delay: Duration,
    /// Longest single wait between attempts. A `Retry-After` beyond it ends
    /// the retries at once: the caller's cooldown is the better place to wait
    /// that long. Default 30 s.
    pub max_retry_wait: Duration,
    /// Cap on the rendered input, in characters; past it the turns keep their
    /// first 45% and last 55%. Default 400 000 (about 100k tokens).
    pub max_input_chars: usize,
    /// Cap on one message's text or one tool call's arguments, in
    /// characters; past it the text keeps its head and tail. Default 20 000.
    pub max_message_chars: usize,
    /// Largest reply body accepted, in bytes. Default 8 MiB.
    pub max_reply_bytes: u64,
    /// The summary model's window, in tokens (`summarizer.context_length`):
    /// when set, the prompt is bounded so that it plus the reply reserve fits.
    /// Default none: asked of the server when
    /// [`discover_window`](Self::discover_window), else only the character
    /// caps apply.
    pub context_length: Option<u64>,
    /// Without a [`context_length`](Self::context_length), ask the server
    /// for the model's window (once per base URL and model) and learn it
    /// from a context-overflow error. Default true.
    pub discover_window: bool,
    /// Longest reply, in tokens (`summarizer.max_output_tokens`), sent as
    /// `max_tokens` and reserved in the window. Default none; with a
    /// `context_length` the reserve is then a quarter of it, at most 2048.
    pub max_output_tokens: Option<u32>,
    /// Multiplies the project's token counts when bounding the prompt: the
    /// server's tokenizer splits text differently. Default 1.3.
    pub token_margin: f64,
    /// Sent as `seed` (with temperature 0) for repeatable summaries.
    /// Default [`DEFAULT_SEED`].
    pub seed: Option<u64>,
    /// Append the user asks, files and errors extracted from the messages
    /// to the model's summary. Default true.
    pub deterministic_sections: bool,
}

impl Default for OpenAiConfig {
    fn default() -> OpenAiConfig {
        OpenAiConfig {
            base_url: String::new(),
            model: String::new(),
            api_key_env: "OPENAI_API_KEY".into(),
            api_key: None,
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_retries: 3,
            retry_base_delay: Duration::from_secs(1),
            max_retry_wait: Duration::from_secs(30),
            max_input_chars: 400_000,
            max_message_chars: 20_000,
            max_reply_bytes: 8 << 20,
            context_length: None,
            discover_window: true,
            max_output_tokens: None,
            token_margin: 1.3,
            seed: Some(DEFAULT_SEED),
            deterministic_sections: true,
        }
    }
}

impl OpenAiConfig {
    /// Defaults with the endpoint and model set.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> OpenAiConfig {
        OpenAiConfig {
            base_url: base_url.into(),
            model: model.into(),
            ..OpenAiConfig::default()
        }
    }

    /// Sets [`api_key`](Self::api_key).
    pub fn with_api_key(mut self, key: impl Into<String>) -> OpenAiConfig {
        self.api_key = Some(ApiKey::new(key));
        self
    }

    /// Sets [`api_key_env`](Self::api_key_env).
    pub fn with_api_key_env(mut self, name: impl Into<String>) -> OpenAiConfig {
        self.api_key_env = name.into();
        self
    }

    /// Sets [`timeout`](Self::timeout).
    pub fn with_timeout(mut self, timeout: Duration) -> OpenAiConfig {
        self.timeout = timeout;
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> OpenAiConfig {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`max_retries`](Self::max_retries).
    pub fn with_max_retries(mut self, retries: u32) -> OpenAiConfig {
        self.max_retries = retries;
        self
    }

    /// Sets [`retry_base_delay`](Self::retry_base_delay).
    pub fn with_retry_base_delay(mut self, delay: Duration) -> OpenAiConfig {
        self.retry_base_delay = delay;
        self
    }

    /// Sets [`max_retry_wait`](Self::max_retry_wait).
    pub fn with_max_retry_wait(mut self, wait: Duration) -> OpenAiConfig {
        self.max_retry_wait = wait;
        self
    }

    /// Sets [`max_input_chars`](Self::max_input_chars).
    pub fn with_max_input_chars(mut self, chars: usize) -> OpenAiConfig {
        self.max_input_chars = chars;
        self
    }

    /// Sets [`max_message_chars`](Self::max_message_chars).
    pub fn with_max_message_chars(mut self, chars: usize) -> OpenAiConfig {
        self.max_message_chars = chars;
        self
    }

    /// Sets [`max_reply_bytes`](Self::max_reply_bytes).
    pub fn with_max_reply_bytes(mut self, bytes: u64) -> OpenAiConfig {
        self.max_reply_bytes = bytes;
        self
    }

    /// Sets [`context_length`](Self::context_length).
    pub fn with_context_length(mut self, tokens: u64) -> OpenAiConfig {
        self.context_length = Some(tokens);
        self
    }

    /// Sets [`discover_window`](Self::discover_window).
    pub fn with_discover_window(mut self, on: bool) -> OpenAiConfig {
        self.discover_window = on;
        self
    }

    /// Sets [`max_output_tokens`](Self::max_output_tokens).
    pub fn with_max_output_tokens(mut self, tokens: u32) -> OpenAiConfig {
        self.max_output_tokens = Some(tokens);
        self
    }

    /// Sets [`token_margin`](Self::token_margin) (values below 1 count as 1).
    pub fn with_token_margin(mut self, factor: f64) -> OpenAiConfig {
        self.token_margin = factor;
        self
    }

    /// Sets [`seed`](Self::seed); `None` sends none.
    pub fn with_seed(mut self, seed: Option<u64>) -> OpenAiConfig {
        self.seed = seed;
        self
    }

    /// Sets [`deterministic_sections`](Self::deterministic_sections).
    pub fn with_deterministic_sections(mut self, on: bool) -> OpenAiConfig {
        self.deterministic_sections = on;
        self
    }

    /// The reply reserve: [`max_output_tokens`](Self::max_output_tokens),
    /// or with only a [`context_length`](Self::context_length) a quarter of
    /// it (at most 2048); `None` when neither is set.
    pub fn output_reserve(&self) -> Option<u32> {
        self.output_reserve_for(self.context_length)
    }

    /// The reply reserve for a summary model window of `window` tokens
    /// (see [`output_reserve`](Self::output_reserve)).
    pub fn output_reserve_for(&self, window: Option<u64>) -> Option<u32> {
        match (self.max_output_tokens, window) {
            (Some(n), _) => Some(n),
            (None, Some(ctx)) => Some(u32::try_from((ctx / 4).min(2048)).unwrap_or(2048)),
            (None, None) => None,
        }
    }
}

/// What one [`OpenAiSummarizer::summarize_with_stats`] call did, for reports
/// (serialized as `ctx compact --report json` prints it: `latency_ms`, …)
/// and for tests that pin the retry policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct CallStats {
    /// HTTP attempts made (1 when the first succeeded or failed for good).
    pub attempts: u32,
    /// Total time slept between attempts.
    #[serde(skip)]
    pub waited: Duration,
    /// Wall time of the whole call (prompt building, attempts, waits).
    #[serde(
        rename = "latency_ms",
        serialize_with = "crate::duration_ms::serialize"
    )]
    pub elapsed: Duration,
    /// The prompt as the client counted it (margin and template included).
    pub counted_prompt_tokens: usize,
    /// `max_tokens` sent, if any.
    pub max_tokens: Option<u32>,
    /// Prompt tokens the server reported in `usage`.
    pub prompt_tokens: Option<u64>,
    /// Reply tokens the server reported in `usage`.
    pub completion_tokens: Option<u64>,
    /// The summary model's window the last attempt was bounded by.
    pub window_tokens: Option<u64>,
    /// Where that window came from.
    pub window_source: WindowSource,
}

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
    /// caller's environment snapshot ([`crate::config::Env`]) or a host's
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
            None => env(&config.api_key_env).map(ApiKey).ok_or_else(|| {
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
        if let Some(known) = window::cached(base, model) {
            return known;
        }
        let found = window::discover(&self.agent, base, model, self.key.expose());
        window::remember(base, model, found);
        found
    }

    /// The prompt for `request` and what it counts, bounded by `window`
    /// when it is known.
    fn prompt(
        &self,
        request: &SummaryRequest<'_>,
        window: Window,
    ) -> Result<(prompt::Prompt, usize), SummarizeError> {
        let limits = Limits {
            max_input_chars: self.config.max_input_chars,
            max_message_chars: self.config.max_message_chars,
        };
        let reserve = self.config.output_reserve_for(window.tokens);
        let window_source = window.source;
        let mut request = *request;
        if let Some(reserve) = reserve {
            // Asking for more than the reply may hold gets a cut-off summary.
            let cap = usize::try_from(reserve).unwrap_or(usize::MAX) * 3 / 4;
            request.target_tokens = request.target_tokens.min(cap.max(1));
        }
        let bound = |max_prompt_tokens| TokenBound {
            counter: self.counter.as_ref(),
            factor: self.config.token_margin,
            max_prompt_tokens,
        };
        match window.tokens {
            None => {
                let p = prompt::build(&request, limits);
                let counted = bound(usize::MAX).prompt_cost(&p);
                Ok((p, counted))
            }
            Some(window) => {
                let source = window_source;
                let window = usize::try_from(window).unwrap_or(usize::MAX);
                let reserve = reserve.map_or(0, |r| usize::try_from(r).unwrap_or(usize::MAX));
                let bound = bound(window.saturating_sub(reserve));
                let p = prompt::build_bounded(&request, limits, bound).map_err(|e| {
                    SummarizeError::NotConfigured(format!(
                        "openai summarizer: a context length of {window} tokens ({}) with \
                         {reserve} reserved for the reply leaves {} for the prompt, which needs \
                         at least {}",
                        source.describe(),
                        e.available,
                        e.needed
                    ))
                })?;
                let counted = bound.prompt_cost(&p);
                Ok((p, counted))
            }
        }
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
                    window::remember(&self.config.base_url, &self.config.model, learned);
                    window = learned;
                    relearned = true;
                }
                Err(failure) => return Err(failure.error),
            }
        };
        stats.prompt_tokens = reply.prompt_tokens;
        stats.completion_tokens = reply.completion_tokens;
        if let Some(defect) = quality::degenerate(&reply.text, request, self.counter.as_ref()) {
            return Err(SummarizeError::Degenerate(defect));
        }
        if !self.config.deterministic_sections {
            return Ok(reply.text);
        }
        let budget = request.target_tokens.saturating_mul(2).clamp(1_200, 8_000);
        let budget = request.ledger_room(budget, 4);
        let mut record = StateRecord::build(request.turns, request.text_actions);
        if let Some(previous) = request.previous_summary {
            record.carry_over(previous);
        }
        let record = record.render(budget, request.archive_handle);
        Ok(format!("{}\n\n{record}", reply.text.trim_end()))
    }

    /// One request for `request` bounded by `window`, with the retries of
    /// the retry policy.
    fn send(
        &self,
        request: &SummaryRequest<'_>,
        window: Window,
        stats: &mut CallStats,
    ) -> Result<Reply, Failure> {
        let (prompt, counted) = self.prompt(request, window).map_err(Failure::final_)?;
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
                None => backoff(self.config.retry_base_delay, stats.attempts)
                    .min(self.config.max_retry_wait),
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
            200..=299 => {
                let text = parse_reply(&bytes).map_err(Failure::final_)?;
                let (prompt_tokens, completion_tokens) = reply_usage(&bytes);
                Ok(Reply {
                    text,
                    prompt_tokens,
                    completion_tokens,
                })
            }
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

/// A successful attempt: the summary text and the usage the server reported.
struct Reply {
    text: String,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// `usage.prompt_tokens` and `usage.completion_tokens` of a reply body.
fn reply_usage(bytes: &[u8]) -> (Option<u64>, Option<u64>) {
    let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
        return (None, None);
    };
    let usage = value.get("usage");
    let field = |k: &str| usage.and_then(|u| u.get(k)).and_then(Value::as_u64);
    (field("prompt_tokens"), field("completion_tokens"))
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

/// `base * 2^(attempt-1)`, saturating.
fn backoff(base: Duration, attempt: u32) -> Duration {
    match 1u32.checked_shl(attempt.saturating_sub(1)) {
        Some(factor) => base.saturating_mul(factor),
        None => Duration::MAX,
    }
}

/// `Retry-After` in seconds (the HTTP-date form is rare on these APIs and is
/// treated as absent, which falls back to the backoff).
fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    value
        .parse::<f64>()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
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

/// The summary text from a chat-completions reply body.
fn parse_reply(bytes: &[u8]) -> Result<String, SummarizeError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| SummarizeError::Malformed(format!("not JSON ({e}): {}", excerpt(bytes))))?;
    let Some(choices) = value.get("choices") else {
        if value.get("error").is_some() {
            return Err(SummarizeError::Malformed(format!(
                "error object instead of a completion: {}",
                error_message(bytes)
            )));
        }
        return Err(SummarizeError::Malformed(
            "no `choices` in the reply".into(),
        ));
    };
    let first = choices
        .as_array()
        .and_then(|c| c.first())
        .ok_or_else(|| SummarizeError::Malformed("`choices` is not a non-empty array".into()))?;
    let message = first
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| SummarizeError::Malformed("`choices[0].message` missing".into()))?;
    let text = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        Some(other) => {
            return Err(SummarizeError::Malformed(format!(
                "`choices[0].message.content` is {}",
                crate::message::json_type(other)
            )));
        }
    };
    let text = strip_think(&text).trim();
    if text.is_empty() {
        return Err(SummarizeError::Empty);
    }
    Ok(text.to_owned())
}

/// Drops a leading `<think>...</think>` block that some reasoning models
/// (served by Ollama or vLLM) put in `content`.
fn strip_think(text: &str) -> &str {
    let trimmed = text.trim_start();
    if let Some(rest) = trimmed.strip_prefix("<think>")
        && let Some(end) = rest.find("</think>")
    {
        return &rest[end + "</think>".len()..];
    }
    text
}

/// The message of an error body (`{"error": {"message": ..}}`, `{"error":
/// ".."}`, `{"message": ..}`), or an excerpt of the raw body.
fn error_message(bytes: &[u8]) -> String {
    let from_json = serde_json::from_slice::<Value>(bytes).ok().and_then(|v| {
        let error = v.get("error");
        error
            .and_then(|e| e.get("message"))
            .or(error)
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let text = from_json.unwrap_or_else(|| excerpt(bytes));
    prompt::clip_middle(&text, ERROR_EXCERPT_CHARS).into_owned()
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    prompt::clip_middle(text.trim(), ERROR_EXCERPT_CHARS).into_owned()
}

#[cfg(test)]
mod tests;
