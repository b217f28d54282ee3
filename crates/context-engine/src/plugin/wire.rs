//! The plugin protocol's messages as typed values (`docs/plugin-protocol.md`):
//! the `params` of every request the host sends, and the shapes of the
//! answers it reads. Logic-free: what to send and how to judge an answer is
//! the engine adapter's business ([`super::ProcessEngine`]); framing and
//! JSON-RPC ids are the transport's (`rpc.rs`).
//!
//! Field order is the order on the wire. Every text a request carries was
//! already redacted by the adapter ([`crate::redact::Egress`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::engine::{EngineState, TurnInfo, Usage};
use crate::message::Message;

/// The protocol version this host speaks (sent in `initialize`; a plugin
/// answering another one is refused).
pub const PROTOCOL_VERSION: u64 = 1;

/// JSON-RPC error code a plugin answers `compress` with when there is
/// nothing to compress.
pub const ERROR_NOTHING_TO_COMPRESS: i64 = 1;
/// JSON-RPC error code a plugin answers `compress` with when it declines an
/// unforced compaction.
pub const ERROR_BLOCKED: i64 = 2;

/// The host's token state, sent as `state` with most hooks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StateSnapshot {
    /// `null` right after a compaction, until the next real usage.
    pub last_prompt_tokens: Option<u64>,
    /// Completion tokens of the last call.
    pub last_completion_tokens: u64,
    /// Total tokens of the last call.
    pub last_total_tokens: u64,
    /// Prompt size at which compaction fires.
    pub threshold_tokens: u64,
    /// The model's window; 0 when unknown.
    pub context_length: u64,
    /// Compactions this session.
    pub compression_count: u64,
    /// Fraction of the window at which compaction fires.
    pub threshold_percent: f64,
    /// Head messages kept verbatim.
    pub protect_first_n: usize,
    /// Tail messages kept verbatim.
    pub protect_last_n: usize,
}

impl From<&EngineState> for StateSnapshot {
    fn from(s: &EngineState) -> StateSnapshot {
        StateSnapshot {
            last_prompt_tokens: s.last_prompt_tokens.known(),
            last_completion_tokens: s.last_completion_tokens,
            last_total_tokens: s.last_total_tokens,
            threshold_tokens: s.threshold_tokens,
            context_length: s.context_length,
            compression_count: s.compression_count,
            threshold_percent: s.threshold_percent,
            protect_first_n: s.protect_first_n,
            protect_last_n: s.protect_last_n,
        }
    }
}

/// `initialize`.
#[derive(Clone, Debug, Serialize)]
pub struct InitializeParams<'a> {
    /// [`PROTOCOL_VERSION`].
    pub protocol_version: u64,
    /// The name the plugin was selected by.
    pub engine: &'a str,
    /// The engine's configuration section.
    pub config: &'a Value,
    /// The model's window; 0 when unknown.
    pub context_length: u64,
    /// The model the session runs.
    pub model: Option<&'a str>,
    /// The host's state.
    pub state: StateSnapshot,
}

/// The `initialize` answer, as far as the host reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct InitializeResult {
    /// The plugin's own engine name.
    #[serde(default)]
    pub name: Option<Value>,
    /// Must equal [`PROTOCOL_VERSION`].
    #[serde(default)]
    pub protocol_version: Option<Value>,
    /// The hooks it implements (unknown names are ignored with a log).
    #[serde(default)]
    pub capabilities: Option<Value>,
    /// JSON schemas of its tools.
    #[serde(default)]
    pub tools: Option<Value>,
}

/// Hooks that only carry the state: `on_session_reset`, `get_status`.
#[derive(Clone, Debug, Serialize)]
pub struct StateParams {
    /// The host's state.
    pub state: StateSnapshot,
}

/// `update_from_response`.
#[derive(Clone, Debug, Serialize)]
pub struct UsageParams<'a> {
    /// The provider's usage.
    pub usage: &'a Usage,
    /// The host's state (already updated with `usage`).
    pub state: StateSnapshot,
}

/// `should_compress`, `should_compress_info`.
#[derive(Clone, Debug, Serialize)]
pub struct PromptTokensParams {
    /// The prompt size asked about (the last known one when absent).
    pub prompt_tokens: Option<u64>,
    /// The host's state.
    pub state: StateSnapshot,
}

/// `compress`.
#[derive(Clone, Debug, Serialize)]
pub struct CompressParams {
    /// The transcript, redacted.
    pub messages: Vec<Message>,
    /// The host's prompt count, if it has one.
    pub current_tokens: Option<u64>,
    /// `/compress <topic>`, redacted.
    pub focus_topic: Option<String>,
    /// Bypass the plugin's own cooldown.
    pub force: bool,
    /// Memory-provider text, sanitized (redacted, clipped).
    pub memory_context: String,
    /// The host's state.
    pub state: StateSnapshot,
}

/// `prune_tool_results_only`.
#[derive(Clone, Debug, Serialize)]
pub struct PruneParams {
    /// The transcript, redacted.
    pub messages: Vec<Message>,
    /// The host's prompt count, if it has one.
    pub current_tokens: Option<u64>,
    /// The host's state.
    pub state: StateSnapshot,
}

/// `select_context`.
#[derive(Clone, Debug, Serialize)]
pub struct SelectParams {
    /// The assembled request, redacted.
    pub request_messages: Vec<Message>,
    /// The stored history, redacted.
    pub conversation_messages: Vec<Message>,
    /// The message that starts the turn, redacted.
    pub incoming_message: Option<Message>,
    /// The model's window, when known.
    pub budget_tokens: Option<u64>,
    /// The host's state.
    pub state: StateSnapshot,
}

/// `on_turn_complete`.
#[derive(Clone, Debug, Serialize)]
pub struct TurnCompleteParams<'a> {
    /// The transcript, redacted.
    pub messages: Vec<Message>,
    /// The turn's usage, when it reached a provider response.
    pub usage: Option<&'a Usage>,
    /// The turn.
    pub turn: &'a TurnInfo,
}

/// `should_compress_preflight`, `has_content_to_compress`.
#[derive(Clone, Debug, Serialize)]
pub struct MessagesParams {
    /// The transcript, redacted.
    pub messages: Vec<Message>,
    /// The host's state.
    pub state: StateSnapshot,
}

/// `should_defer_preflight_to_real_usage`.
#[derive(Clone, Debug, Serialize)]
pub struct RoughTokensParams {
    /// The rough estimate of the prompt.
    pub rough_tokens: u64,
    /// The host's state.
    pub state: StateSnapshot,
}

/// `on_session_start` (replayed after a restart).
#[derive(Clone, Debug, Serialize)]
pub struct SessionStartParams {
    /// The host's session id.
    pub session_id: String,
    /// The host's data directory.
    pub home_dir: Option<String>,
    /// The front end.
    pub platform: Option<String>,
    /// The model the session starts with.
    pub model: Option<String>,
}

impl SessionStartParams {
    /// The params for `session_id` with `home_dir`, `platform`, `model`.
    pub fn new(
        session_id: &str,
        home_dir: Option<&PathBuf>,
        platform: Option<&str>,
        model: Option<&str>,
    ) -> SessionStartParams {
        SessionStartParams {
            session_id: session_id.to_owned(),
            home_dir: home_dir.map(|p| p.to_string_lossy().into_owned()),
            platform: platform.map(str::to_owned),
            model: model.map(str::to_owned),
        }
    }
}

/// `on_session_end`.
#[derive(Clone, Debug, Serialize)]
pub struct SessionEndParams<'a> {
    /// The host's session id.
    pub session_id: &'a str,
    /// The transcript, redacted.
    pub messages: Vec<Message>,
}

/// `handle_tool_call`.
#[derive(Clone, Debug, Serialize)]
pub struct ToolCallParams<'a> {
    /// The tool's name.
    pub name: &'a str,
    /// Its arguments, redacted.
    pub arguments: Value,
    /// The live conversation, redacted, when the host passed it.
    pub messages: Option<Vec<Message>>,
}

/// `update_model`. Never the API key: the plugin gets what it needs to
/// count.
#[derive(Clone, Debug, Serialize)]
pub struct UpdateModelParams<'a> {
    /// Model name.
    pub model: &'a str,
    /// Its window; 0 when unknown.
    pub context_length: u64,
    /// Provider name.
    pub provider: Option<&'a str>,
    /// Endpoint.
    pub base_url: Option<&'a str>,
    /// The host's API flavour.
    pub api_mode: Option<&'a str>,
    /// The host's state.
    pub state: StateSnapshot,
}
