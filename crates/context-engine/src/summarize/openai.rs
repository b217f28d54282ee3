//! The settings and call figures of an OpenAI-compatible summarizer
//! (OpenAI, OpenRouter, vLLM, llama.cpp server, Ollama). The client itself,
//! `OpenAiSummarizer`, lives in `context-engine-openai` (the core links no
//! HTTP client or TLS), behind [`ModelSummarizer`](super::ModelSummarizer).
//!
//! Every failure is mapped to the [`SummarizeError`](super::SummarizeError)
//! variant the compressor's policy needs: credentials refused
//! (401/402/403) and unreachable endpoints abort, everything else falls back
//! to the extractive summary. 429 and 5xx are retried by the one retry
//! policy ([`crate::retry`]), honouring `Retry-After`.
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

use std::fmt;
use std::time::Duration;

use super::window::WindowSource;

/// The seed sent by default: any fixed value makes runs repeatable.
pub const DEFAULT_SEED: u64 = 42;

/// Longest excerpt of a server's error body kept in an error message.
pub const ERROR_EXCERPT_CHARS: usize = 300;

/// An API key. Its `Debug` output is a placeholder so the key never ends up
/// in logs or error reports.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key itself, for the client's `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<hidden>)")
    }
}

/// Settings of an OpenAI-compatible summarizer client. Start from [`OpenAiConfig::new`] (or
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
            api_key_env: crate::config::DEFAULT_API_KEY_ENV.into(),
            api_key: None,
            timeout: Duration::from_secs(crate::config::DEFAULT_SUMMARY_TIMEOUT_SECONDS),
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

/// What one `OpenAiSummarizer::summarize_with_stats` call did, for reports
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
