//! Layered configuration: built-in defaults < YAML file < environment
//! (`CTX_<SECTION>__<KEY>`) < command-line overrides (`key.path=value`).
//!
//! [`ConfigLoader`] finds and merges the layers and deserializes the result
//! once into [`Config`], so a wrong value is reported the same way wherever
//! it came from: with the file, line and column, the variable or the flag
//! ([`Source`]). Unknown keys are warnings ([`ConfigWarning`]), not errors,
//! so that an older binary still runs with a newer file.
//!
//! ```
//! use context_engine::config::{ConfigLoader, Source};
//!
//! let loaded = ConfigLoader::new()
//!     .with_search(false)
//!     .with_env([("CTX_CONTEXT__THRESHOLD_PERCENT".to_owned(), "60".to_owned())])
//!     .with_overrides(["summarizer.kind=openai"])
//!     .load()?;
//! assert_eq!(loaded.config.context.threshold_percent, 0.6); // 60 read as a percent
//! assert_eq!(loaded.source("summarizer.kind"), Source::Flag { arg: "summarizer.kind=openai".into() });
//! assert_eq!(loaded.source("context.engine"), Source::Default);
//! # Ok::<(), context_engine::config::ConfigError>(())
//! ```

mod env;
mod load;
mod sections;
mod tree;
mod url;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};

use context_engine_wire::validate::{TextActions, TextActionsConfig, TextActionsError};

pub use env::{DISABLE_ENV, Env, is_disable_value};
pub use load::{
    ConfigError, ConfigLoader, ConfigWarning, ENV_PREFIX, Entry, FILE_ENV, Loaded, Source,
};
pub use sections::{
    DEFAULT_PROTECT_FIRST_N, DEFAULT_PROTECT_LAST_N, DEFAULT_THRESHOLD_PERCENT, DigestConfig,
    PRICE_PRESETS, PruneConfig, ScheduleConfig,
};
pub use url::{redacted_url, url_has_password};

/// Name of the config file looked up in the working directory and in the
/// user's config folder (`$XDG_CONFIG_HOME/context-engine/`).
pub const FILE_NAME: &str = "config.yaml";

/// The whole configuration. Every section and field has a default, so an
/// empty file (or none) is a valid configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// When and how the context is compacted.
    pub context: ContextConfig,
    /// Who writes the summaries.
    pub summarizer: SummarizerConfig,
    /// What is masked before text leaves the process.
    pub security: SecurityConfig,
    /// Where engine plugins are found.
    pub plugins: PluginsConfig,
    /// What the provider bills, for the cache-aware schedule and estimates.
    pub pricing: PricingConfig,
    /// Where the session store lives.
    pub store: StoreConfig,
    /// `ctx serve`, the OpenAI-compatible proxy.
    pub serve: ServeConfig,
    /// Engine-specific sections, passed to the engine of that name untyped:
    /// the engine, not this crate, knows their shape.
    pub engines: BTreeMap<String, serde_json::Value>,
}

/// The built-in table of `context.model_windows`: the windows of widely
/// used model families, as their providers publish them.
pub fn default_model_windows() -> BTreeMap<String, u64> {
    [
        ("claude", 200_000),
        ("deepseek", 128_000),
        ("gemini-2.5", 1_048_576),
        ("gpt-4.1", 1_047_576),
        ("gpt-4o", 128_000),
        ("gpt-5", 400_000),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// `context`: the engine and its compaction policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContextConfig {
    /// Name of the engine that manages the context (`compressor` is built in).
    pub engine: String,
    /// Fail when the named engine cannot be loaded instead of falling back to
    /// `compressor`: for setups where a silent fallback would hide a broken
    /// plugin.
    pub engine_required: bool,
    /// Fraction of the usable window at which compaction fires, in (0, 1].
    /// A value above 1 (up to 100) is read as a percent: `75` = `0.75`;
    /// `1` means the whole window.
    #[serde(deserialize_with = "de_percent")]
    pub threshold_percent: f64,
    /// Non-system head messages kept verbatim on the first compaction.
    pub protect_first_n: usize,
    /// Tail messages kept verbatim at least (the engine clamps to 3..=8).
    pub protect_last_n: usize,
    /// Tail budget as a fraction of the threshold, in (0, 1).
    #[serde(deserialize_with = "de_fraction")]
    pub tail_ratio: f64,
    /// Per-model threshold overrides: key `"substring"` or
    /// `"provider:substring"` of the model name, value as for
    /// `threshold_percent` (see
    /// [`resolve_model_threshold`](crate::engine::resolve_model_threshold)).
    #[serde(deserialize_with = "de_percent_map")]
    pub model_thresholds: BTreeMap<String, f64>,
    /// The model's window in tokens, for hosts that do not know it.
    pub context_length: Option<u64>,
    /// Known context windows: key `"substring"` or `"provider:substring"`
    /// of the model name (matched as `model_thresholds`), value in tokens.
    /// A host whose requests name their model (`ctx serve`) uses the
    /// window of the best match instead of `context_length`; a file that
    /// sets the table replaces the built-in one
    /// ([`default_model_windows`]).
    pub model_windows: BTreeMap<String, u64>,
    /// The tool-result digest of request views and summarizer input.
    pub digest: DigestConfig,
    /// The proactive prune (off until `proactive_prune_tokens` is set).
    pub prune: PruneConfig,
    /// How the observations of text-action agents (tool output sent back
    /// as a user message) are recognised: `auto`, `off`, or a list of
    /// `mini-swe-agent`, `swe-agent` and regular expressions (see
    /// [`crate::validate::TextActionsConfig`]).
    pub text_actions: TextActionsConfig,
    /// The cache-aware schedule of digest steps and prunes (prices from
    /// `pricing`).
    pub schedule: ScheduleConfig,
}

/// `pricing`: a provider preset and overrides of its prices (USD per
/// million tokens) and cache model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PricingConfig {
    /// A preset of `PriceModel::preset` ([`PRICE_PRESETS`]): `openai`, `anthropic`,
    /// `anthropic-1h`, `deepseek` or `none`.
    #[serde(deserialize_with = "de_preset")]
    pub provider: String,
    /// Uncached input.
    pub input: Option<f64>,
    /// Cached input (a cache read).
    pub cached_input: Option<f64>,
    /// Input written to the cache.
    pub cache_write: Option<f64>,
    /// Output.
    pub output: Option<f64>,
    /// Prompts shorter than this are not cached.
    pub cache_min_prefix_tokens: Option<u64>,
    /// Cached prefixes are multiples of this many tokens.
    pub cache_granularity_tokens: Option<u64>,
    /// An unused cache entry lives this long.
    pub cache_lifetime_secs: Option<u64>,
}

impl Default for PricingConfig {
    fn default() -> PricingConfig {
        PricingConfig {
            provider: "openai".to_owned(),
            input: None,
            cached_input: None,
            cache_write: None,
            output: None,
            cache_min_prefix_tokens: None,
            cache_granularity_tokens: None,
            cache_lifetime_secs: None,
        }
    }
}

fn de_preset<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    if !PRICE_PRESETS.contains(&name.as_str()) {
        return Err(serde::de::Error::custom(format!(
            "unknown provider preset `{name}`, expected one of: {}",
            PRICE_PRESETS.join(", ")
        )));
    }
    Ok(name)
}

impl Default for ContextConfig {
    fn default() -> ContextConfig {
        ContextConfig {
            engine: "compressor".to_owned(),
            engine_required: false,
            threshold_percent: DEFAULT_THRESHOLD_PERCENT,
            protect_first_n: DEFAULT_PROTECT_FIRST_N,
            protect_last_n: DEFAULT_PROTECT_LAST_N,
            tail_ratio: DEFAULT_TAIL_RATIO,
            model_thresholds: BTreeMap::new(),
            context_length: None,
            model_windows: default_model_windows(),
            digest: DigestConfig::default(),
            prune: PruneConfig::default(),
            text_actions: TextActionsConfig::default(),
            schedule: ScheduleConfig::default(),
        }
    }
}

/// `summarizer.api_key_env` by default (what the OpenAI SDKs read).
pub const DEFAULT_API_KEY_ENV: &str = "OPENAI_API_KEY";

/// `summarizer.timeout_seconds` by default.
pub const DEFAULT_SUMMARY_TIMEOUT_SECONDS: u64 = 120;

/// `context.tail_ratio` by default.
pub const DEFAULT_TAIL_RATIO: f64 = 0.20;

/// Which summarizer writes compaction summaries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SummarizerKind {
    /// Offline and deterministic, built from the span itself.
    #[default]
    Extractive,
    /// An OpenAI-compatible chat-completions endpoint.
    Openai,
    /// `ctx serve`'s own upstream, in the client's API, with the request's
    /// credential and `summarizer.model` or else the request's model.
    /// Other commands have no upstream: the extractive summary stands in.
    Upstream,
}

/// `summarizer`: the summary writer and, for `openai`, its endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SummarizerConfig {
    /// `extractive` (default, offline), `openai` or `upstream` (`ctx
    /// serve`'s upstream).
    pub kind: SummarizerKind,
    /// Base URL as in the OpenAI SDKs (`http://127.0.0.1:8080/v1`); needed
    /// for `openai`.
    pub base_url: Option<String>,
    /// Model name sent to the endpoint; needed for `openai`; for
    /// `upstream`, unset means the request's model.
    pub model: Option<String>,
    /// NAME of the environment variable holding the API key. The key itself
    /// never goes in the file: a key-looking value under any `api_key*` key
    /// is an error.
    pub api_key_env: String,
    /// Whole-request deadline of one summary call, in seconds.
    pub timeout_seconds: u64,
    /// The summary model's window in tokens, when it is smaller than the
    /// agent model's (bounds the summarizer input).
    pub context_length: Option<u64>,
    /// Cap on the summary length in tokens; `None` lets the engine's target
    /// size decide.
    pub max_output_tokens: Option<u32>,
}

impl Default for SummarizerConfig {
    fn default() -> SummarizerConfig {
        SummarizerConfig {
            kind: SummarizerKind::Extractive,
            base_url: None,
            model: None,
            api_key_env: DEFAULT_API_KEY_ENV.to_owned(),
            timeout_seconds: DEFAULT_SUMMARY_TIMEOUT_SECONDS,
            context_length: None,
            max_output_tokens: None,
        }
    }
}

/// `security`: redaction of secrets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SecurityConfig {
    /// Mask secrets in text shown or stored; text sent to a summarizer or a
    /// plugin is redacted whatever this says.
    pub redact_secrets: bool,
    /// Extra regexes whose matches are masked, on top of the built-in rules.
    pub redact_patterns: Vec<String>,
}

impl Default for SecurityConfig {
    fn default() -> SecurityConfig {
        SecurityConfig {
            redact_secrets: true,
            redact_patterns: Vec::new(),
        }
    }
}

/// `plugins`: where engine plugins live.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PluginsConfig {
    /// Folders searched for plugins, in order. Relative paths given in a
    /// file are resolved against that file's folder by the loader (so a
    /// project's config works from any working directory); from the
    /// environment or a flag, against the working directory.
    pub dirs: Vec<PathBuf>,
}

/// `store`: the session store that archives what compaction removes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreConfig {
    /// The store file, or `:memory:`; unset means `store.db` in the user
    /// data folder ([`default_store_path`]).
    pub path: Option<PathBuf>,
    /// A shared store for a fleet of `ctx serve` instances:
    /// `postgres://user@host:port/db`, never with a password (see
    /// [`password_env`](Self::password_env)). Wins over `path` for
    /// `ctx serve`.
    pub url: Option<String>,
    /// NAME of the environment variable holding the database password.
    pub password_env: Option<String>,
    /// Database connections per instance.
    pub pool_size: usize,
    /// Seconds a database call (connect, wait for a connection, query) may
    /// take before it fails (and the request goes unmanaged).
    pub timeout_seconds: u64,
    /// Whether a write (a step's state and lineage, the usage after it, a
    /// compaction's archive) waits for the database to flush it to disk
    /// (Postgres `synchronous_commit`). Off by default: the write is atomic
    /// and visible at once either way, a `ctx serve` crash loses nothing
    /// acknowledged, and only a crash of the database server itself may
    /// lose the last fraction of a second of writes, each whole or not at
    /// all (a session then resumes from an older version, whose history
    /// still holds what a lost archive held), as the SQLite store's
    /// `synchronous = NORMAL` does.
    pub durable_records: bool,
    /// Keep archived messages, session state and history verbatim instead
    /// of redacted (the default masks secrets before anything is stored).
    /// With [`encryption_key_env`](Self::encryption_key_env) they are then
    /// encrypted; without it they are at rest in the clear (a loud
    /// warning at start-up).
    pub verbatim: bool,
    /// NAME of the environment variable holding the 32-byte key (64 hex
    /// digits or base64) that encrypts every stored text of a verbatim
    /// store (XChaCha20-Poly1305); needed to read such a store back.
    pub encryption_key_env: Option<String>,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig {
            path: None,
            url: None,
            password_env: None,
            pool_size: 16,
            timeout_seconds: 5,
            durable_records: false,
            verbatim: false,
            encryption_key_env: None,
        }
    }
}

impl StoreConfig {
    /// [`path`](Self::path), else the default in the user data folder
    /// ([`default_store_path`]); `None` when neither is known (no `HOME`).
    pub fn resolved_path(&self, env: &Env) -> Option<PathBuf> {
        self.path.clone().or_else(|| default_store_path(env))
    }
}

/// The default store file: `$XDG_DATA_HOME/context-engine/store.db`, else
/// `$HOME/.local/share/context-engine/store.db`; `None` when neither is set.
pub fn default_store_path(env: &Env) -> Option<PathBuf> {
    let data = match env.non_empty("XDG_DATA_HOME") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env.non_empty("HOME")?).join(".local/share"),
    };
    Some(data.join("context-engine").join("store.db"))
}

/// `serve.mode`: what the proxy does with the traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServeMode {
    /// Requests are managed: the engine's request goes upstream.
    #[default]
    Managed,
    /// Requests go upstream untouched; the engine runs beside them and
    /// the page, `/metrics` and `/ctx/sessions/{id}` show what it would
    /// have sent.
    Observe,
}

/// `serve`: the OpenAI-compatible proxy (`ctx serve`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServeConfig {
    /// `managed` (the default) or `observe`: every request goes upstream
    /// as the client sent it and the engine runs beside the traffic,
    /// showing what it would have sent.
    pub mode: ServeMode,
    /// Address to listen on. Loopback by default; any other address needs
    /// `auth_token_env`.
    pub listen: String,
    /// The provider the proxy forwards to.
    pub upstream: UpstreamConfig,
    /// NAME of the environment variable holding the access token clients
    /// must present (`Authorization: Bearer …` or `x-ctx-token`); required
    /// when `listen` is not a loopback address, and when
    /// `upstream.api_key_env` is set (else anyone could spend the key).
    pub auth_token_env: Option<String>,
    /// Host names (`name`, `name:port`, `*.domain`, an IP, or `*` for
    /// any) requests may name in `Host` and `Origin` besides the loopback
    /// names, the listen address and the address a connection arrived on:
    /// the names clients (or a load balancer passing their `Host` on)
    /// reach the proxy under. Anything else is refused (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Request body bytes all requests in flight may hold together; a
    /// request past it is refused at once (503 with `Retry-After`). At
    /// least `max_body_bytes`.
    pub max_inflight_bytes: usize,
    /// Seconds from a request's first byte (a new connection's accept) to
    /// the end of its headers; past it the connection is closed.
    pub header_read_timeout_seconds: u64,
    /// Seconds from the start of a request body's read to its last byte;
    /// past it the request is answered 408.
    pub body_read_timeout_seconds: u64,
    /// Seconds a kept-alive connection may wait for its next request.
    pub keepalive_idle_seconds: u64,
    /// Offer the engine's tools (`context_recall`, ...) to the model on
    /// requests that carry tools of their own, and resolve their calls in
    /// the proxy (on by default: the digest's one-liners name
    /// `context_recall`, which the model can then call).
    pub engine_tools: bool,
    /// The header the operator's gateway names each user in (e.g.
    /// `x-user`): behind the access token every user shares, requests are
    /// told apart (and may read their own archives) by its value. Requires
    /// `auth_token_env`; configure it only behind a gateway that sets it on
    /// every request (and drops a client's own), since whoever holds the
    /// token can send any value.
    pub identity_header: Option<String>,
    /// Upstream round trips spent on engine-tool calls per request.
    pub max_tool_rounds: u32,
    /// Sessions kept in memory; the least recently used goes first.
    pub max_sessions: usize,
    /// A session unused this long (seconds) is dropped.
    pub session_idle_seconds: u64,
    /// A session unused this long (seconds) sleeps: only the deflated
    /// texts of its managed history and its engine state stay in memory
    /// (with a session store, nothing); its next request wakes it. `0`:
    /// never.
    pub hibernate_seconds: u64,
    /// Share of the compaction threshold at which a model summary starts
    /// being prepared in the background, in (0, 1).
    #[serde(deserialize_with = "de_fraction")]
    pub summary_watermark: f64,
    /// How long a shutdown waits for in-flight requests, in seconds.
    pub shutdown_grace_seconds: u64,
    /// How long a request waits for its session while another call of it
    /// holds it (one still drained after its client left): past it the
    /// request goes upstream unmanaged, logged and counted.
    pub session_wait_seconds: u64,
    /// The page `ctx serve` answers at `/ui`.
    pub ui: UiConfig,
}

/// `serve.ui`: the live page at `/ui` and the per-call figures it shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UiConfig {
    /// Answer `/ui` and its JSON, and keep each session's last calls for
    /// it. Off: the routes answer 404 and no call is kept.
    pub enabled: bool,
    /// Answer the page on connections that did not arrive on a loopback
    /// address too (the access token and the identity rules still hold).
    pub remote: bool,
    /// NAME of the environment variable holding the operator's token: a
    /// request presenting it (`x-ctx-operator-token`) sees every session,
    /// not only its own identity's.
    pub operator_token_env: Option<String>,
    /// Calls kept per session for its chart (the oldest go first); about
    /// 16 bytes each.
    pub calls_per_session: usize,
    /// Bytes of the last managed calls' bodies (the client's and the
    /// upstream's) kept for the page's view of a call's request, all sessions together; the
    /// oldest go first; 0 keeps none.
    pub request_bytes: usize,
}

impl Default for UiConfig {
    fn default() -> UiConfig {
        UiConfig {
            enabled: true,
            remote: false,
            operator_token_env: None,
            calls_per_session: 1000,
            request_bytes: 32 << 20,
        }
    }
}

impl Default for ServeConfig {
    fn default() -> ServeConfig {
        ServeConfig {
            mode: ServeMode::Managed,
            listen: "127.0.0.1:8787".to_owned(),
            upstream: UpstreamConfig::default(),
            auth_token_env: None,
            allowed_hosts: Vec::new(),
            max_body_bytes: 64 * 1024 * 1024,
            max_inflight_bytes: 96 * 1024 * 1024,
            header_read_timeout_seconds: 10,
            body_read_timeout_seconds: 60,
            keepalive_idle_seconds: 90,
            engine_tools: true,
            identity_header: None,
            max_tool_rounds: 3,
            max_sessions: 10_000,
            session_idle_seconds: 3600,
            hibernate_seconds: 60,
            summary_watermark: 0.7,
            shutdown_grace_seconds: 30,
            session_wait_seconds: 30,
            ui: UiConfig::default(),
        }
    }
}

/// `serve.upstream`: where requests go and how long they may take.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UpstreamConfig {
    /// Base URL as in the OpenAI SDKs (`https://…/v1`): `/v1/X` on the proxy
    /// goes to `{url}/X`.
    pub url: Option<String>,
    /// NAME of the environment variable holding the provider key; when set,
    /// it replaces the client's `Authorization`. Unset: the client's header
    /// goes upstream as it came.
    pub api_key_env: Option<String>,
    /// Whole-request deadline of a non-streamed call, and the longest
    /// silence inside a stream, in seconds.
    pub timeout_seconds: u64,
    /// Deadline of the TCP/TLS connect, in seconds.
    pub connect_timeout_seconds: u64,
    /// Retries of an upstream connection that failed before any byte of
    /// the request was sent (refused, reset while connecting), with a
    /// jittered exponential backoff from 25 ms; 0: none. A request that
    /// may have reached the model is never retried.
    pub connect_retries: u32,
}

impl Default for UpstreamConfig {
    fn default() -> UpstreamConfig {
        UpstreamConfig {
            url: None,
            api_key_env: None,
            timeout_seconds: 600,
            connect_timeout_seconds: 10,
            connect_retries: 3,
        }
    }
}

impl Config {
    /// The untyped section `engines.<name>`, `Null` when absent: what a
    /// plugin or custom engine receives as its settings.
    pub fn engine_section(&self, name: &str) -> serde_json::Value {
        self.engines
            .get(name)
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    }

    /// `context.text_actions`, compiled (the loader checks it once; the
    /// builder hands the result to the digest and prune options); a
    /// pattern that is not a regular expression is an error naming it.
    pub fn text_actions(&self) -> Result<TextActions, TextActionsError> {
        TextActions::from_config(&self.context.text_actions)
    }
}

/// A threshold that is neither a fraction in (0, 1] nor a percent in
/// (1, 100] (the key's path is added by the loader).
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("invalid value: {0}, expected a fraction in (0, 1] or a percent in (1, 100]")]
pub(crate) struct NotAPercent(f64);

/// Reads a threshold: a fraction in (0, 1], or a percent in (1, 100].
fn percent(value: f64) -> Result<f64, NotAPercent> {
    if value.is_finite() && value > 0.0 && value <= 1.0 {
        Ok(value)
    } else if value.is_finite() && value > 1.0 && value <= 100.0 {
        Ok(value / 100.0)
    } else {
        Err(NotAPercent(value))
    }
}

fn de_percent<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    percent(f64::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn de_fraction<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let value = f64::deserialize(d)?;
    if value.is_finite() && value > 0.0 && value < 1.0 {
        Ok(value)
    } else {
        Err(serde::de::Error::custom(format!(
            "invalid value: {value}, expected a fraction in (0, 1)"
        )))
    }
}

/// A map entry's threshold, normalised like `threshold_percent`; a newtype
/// so that an error names the entry, not the whole map.
struct Percent(f64);

impl<'de> Deserialize<'de> for Percent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Percent, D::Error> {
        de_percent(d).map(Percent)
    }
}

fn de_percent_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
    let map = BTreeMap::<String, Percent>::deserialize(d)?;
    Ok(map.into_iter().map(|(k, v)| (k, v.0)).collect())
}

#[cfg(test)]
mod tests;
