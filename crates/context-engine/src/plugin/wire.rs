//! The plugin protocol's messages as typed values (`docs/plugin-protocol.md`):
//! the `params` of every request the host sends, and the shapes of the
//! answers it reads. Logic-free: what to send and how to judge an answer is
//! the engine adapter's business ([`super::ProcessEngine`]); framing and
//! JSON-RPC ids are the transport's (`rpc.rs`).
//!
//! Field order is the order on the wire. Every text a request carries was
//! already redacted by the adapter ([`crate::redact::Egress`]).
//!
//! Each answer is read into its shape, never looked up key by key; an answer
//! that does not fit is refused with the path of the field that is wrong.
//! Unknown fields are ignored everywhere (the protocol's additive changes
//! add fields); what the protocol leaves optional is an `Option`.
//!
//! | method | answer |
//! |---|---|
//! | `initialize` | [`InitializeResult`] |
//! | `should_compress`, `should_compress_preflight`, `should_defer_preflight_to_real_usage`, `has_content_to_compress` | `bool` |
//! | `should_compress_info` | [`CompressInfoAnswer`] |
//! | `compress` | [`CompressAnswer`] |
//! | `prune_tool_results_only` | `null` or [`PruneAnswer`] |
//! | `select_context` | `null`, [`SelectAnswer`] or a bare list of messages |
//! | `update_from_response`, `on_turn_complete`, `on_session_start`, `on_session_end`, `on_session_reset`, `update_model` | `null` or [`NotifyAnswer`] |
//! | `handle_tool_call` | [`ToolCallAnswer`] |
//! | `get_status` | `null` or [`StatusAnswer`] |

use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::engine::{BlockReason, EngineState, TurnInfo, Usage};
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
#[serde(expecting = "an object with `protocol_version`")]
pub struct InitializeResult {
    /// The plugin's own engine name.
    #[serde(default)]
    pub name: Option<String>,
    /// Must equal [`PROTOCOL_VERSION`].
    #[serde(default)]
    pub protocol_version: Option<u64>,
    /// The hooks it implements (unknown names are ignored with a log).
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// JSON schemas of its tools.
    #[serde(default)]
    pub tools: Option<Vec<Map<String, Value>>>,
}

/// The part of the `initialize` answer read first: a plugin of another
/// version may shape the rest differently.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(expecting = "an object with `protocol_version`")]
pub struct InitializeVersion {
    /// Must equal [`PROTOCOL_VERSION`].
    #[serde(default)]
    pub protocol_version: Option<u64>,
}

/// The optional `state` object an answer may carry: the host adopts each
/// key given (unknown keys are ignored; `null` leaves a key as it is,
/// except `last_prompt_tokens`, where it means "awaiting real usage").
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, expecting = "an object of token-state fields")]
pub struct StatePatch {
    /// `Some(None)`: the key was `null`.
    #[serde(deserialize_with = "present")]
    pub last_prompt_tokens: Option<Option<u64>>,
    /// Prompt size at which compaction fires.
    pub threshold_tokens: Option<u64>,
    /// The model's window.
    pub context_length: Option<u64>,
    /// Compactions this session.
    pub compression_count: Option<u64>,
    /// Fraction of the window at which compaction fires.
    pub threshold_percent: Option<f64>,
    /// Head messages kept verbatim.
    pub protect_first_n: Option<usize>,
    /// Tail messages kept verbatim.
    pub protect_last_n: Option<usize>,
}

/// A key that is present, `null` included (`Some(None)`); an absent one is
/// the field's default (`None`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(d).map(Some)
}

/// The answer of a hook that only reports (`update_from_response`,
/// `on_turn_complete`, `on_session_start`, `on_session_end`,
/// `on_session_reset`, `update_model`) when it is not `null`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(expecting = "null or an object")]
pub struct NotifyAnswer {
    /// State the host adopts.
    #[serde(default)]
    pub state: Option<StatePatch>,
}

/// The `should_compress_info` answer.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(expecting = "an object with `should_compress`")]
pub struct CompressInfoAnswer {
    /// Compaction should fire this turn.
    pub should_compress: bool,
    /// Why a due compaction is held back.
    #[serde(default)]
    pub block_reason: Option<BlockReason>,
}

/// The `compress` answer.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(expecting = "an object with `messages`")]
pub struct CompressAnswer {
    /// The compacted transcript.
    pub messages: Vec<Message>,
    /// State the host adopts once it accepts the transcript.
    #[serde(default)]
    pub state: Option<StatePatch>,
}

/// The `prune_tool_results_only` answer when it is not `null`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(expecting = "null or an object with `messages`")]
pub struct PruneAnswer {
    /// The pruned transcript; `null` prunes nothing.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    /// Messages pruned (counted by the host when absent).
    #[serde(default)]
    pub pruned: Option<u64>,
}

/// The `select_context` answer when it is an object.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(expecting = "null, a list of messages or an object with `messages`")]
pub struct SelectAnswer {
    /// The request to send instead; `null` keeps it.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
}

/// The `handle_tool_call` answer: the tool result's text, or any other
/// JSON value (serialized as the text).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ToolCallAnswer {
    /// The text itself.
    Text(String),
    /// Anything else.
    Json(Value),
}

/// The `get_status` answer when it is not `null`: fields added to the
/// status report.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(expecting = "null or an object")]
pub struct StatusAnswer(pub Map<String, Value>);

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
