//! Typed arguments and results of the [`ContextEngine`](super::ContextEngine)
//! hooks, where the reference design passes keyword arguments and dicts.
//!
//! Argument structs are `#[non_exhaustive]` with `Default` and `with_*`
//! setters: hosts can learn to pass more without breaking existing engines.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::message::Message;

/// Options of one [`compress`](super::ContextEngine::compress) call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompressRequest {
    /// The host's current prompt token count, if it has one.
    pub current_tokens: Option<u64>,
    /// Topic named by a manual `/compress <topic>`: prioritise it.
    pub focus_topic: Option<String>,
    /// Bypass an engine-owned cooldown (manual compaction).
    pub force: bool,
    /// Memory-provider text to include in the handoff prompt. Raw: an engine
    /// that sends it to an LLM passes it through
    /// [`sanitize_memory_context`](super::sanitize_memory_context) first.
    pub memory_context: String,
    /// The host archives what this compaction removes (a session store is
    /// attached): the summary should name the span's handle
    /// ([`span_handle`](crate::store::span_handle)) so the model can expand it.
    pub archive: bool,
    /// Where the summary may come from: by default a summary prepared in
    /// the background when one is valid, else the engine's summarizer now.
    pub summary: super::SummarySource,
}

impl CompressRequest {
    /// An automatic, unforced request with nothing extra.
    pub fn new() -> CompressRequest {
        CompressRequest::default()
    }

    /// Sets [`current_tokens`](Self::current_tokens).
    pub fn with_current_tokens(mut self, tokens: u64) -> CompressRequest {
        self.current_tokens = Some(tokens);
        self
    }

    /// Sets [`focus_topic`](Self::focus_topic).
    pub fn with_focus_topic(mut self, topic: impl Into<String>) -> CompressRequest {
        self.focus_topic = Some(topic.into());
        self
    }

    /// Sets [`force`](Self::force).
    pub fn with_force(mut self, force: bool) -> CompressRequest {
        self.force = force;
        self
    }

    /// Sets [`archive`](Self::archive).
    pub fn with_archive(mut self, archive: bool) -> CompressRequest {
        self.archive = archive;
        self
    }

    /// Sets [`summary`](Self::summary).
    pub fn with_summary(mut self, source: super::SummarySource) -> CompressRequest {
        self.summary = source;
        self
    }

    /// Sets [`memory_context`](Self::memory_context).
    pub fn with_memory_context(mut self, text: impl Into<String>) -> CompressRequest {
        self.memory_context = text.into();
        self
    }
}

/// Answer of [`should_compress_info`](super::ContextEngine::should_compress_info).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompressDecision {
    /// Compaction should fire this turn.
    pub should_compress: bool,
    /// Why compaction is held back although it would otherwise fire, so
    /// the host can warn the user instead of silently skipping.
    pub block_reason: Option<BlockReason>,
}

impl CompressDecision {
    /// A decision without a block reason.
    pub fn plain(should_compress: bool) -> CompressDecision {
        CompressDecision {
            should_compress,
            block_reason: None,
        }
    }

    /// Compaction is due but blocked for `reason`.
    pub fn blocked(reason: BlockReason) -> CompressDecision {
        CompressDecision {
            should_compress: false,
            block_reason: Some(reason),
        }
    }
}

/// Why an engine declines a compaction that is otherwise due.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum BlockReason {
    /// The summary model failed recently; retrying now would fail again.
    Cooldown {
        /// Seconds until the engine tries again.
        seconds_left: u64,
    },
    /// Recent compactions saved too little (anti-thrashing guard).
    Ineffective {
        /// Consecutive compactions that fell short.
        attempts: u32,
        /// What the last one saved, in percent of the prompt.
        last_savings_percent: f64,
    },
    /// Any other engine-specific reason, already phrased for the user.
    Other {
        /// Human-readable explanation.
        message: String,
    },
}

impl fmt::Display for BlockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockReason::Cooldown { seconds_left } => {
                write!(f, "summarizer cooling down, retry in {seconds_left}s")
            }
            BlockReason::Ineffective {
                attempts,
                last_savings_percent,
            } => write!(
                f,
                "{attempts} recent compactions were ineffective (last saved {last_savings_percent:.1}%)"
            ),
            BlockReason::Other { message } => f.write_str(message),
        }
    }
}

/// One provider request, for
/// [`select_context`](super::ContextEngine::select_context). Borrowed
/// throughout: an engine can read the stored history but not change it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct SelectRequest<'a> {
    /// The assembled request: system prompt, history, ephemeral prefill.
    pub request_messages: &'a [Message],
    /// The persisted history, for reference only.
    pub conversation_messages: &'a [Message],
    /// The message that starts this turn, when there is one.
    pub incoming_message: Option<&'a Message>,
    /// The model's context length; `None` when unknown.
    pub budget_tokens: Option<u64>,
}

impl<'a> SelectRequest<'a> {
    /// A request whose stored history is `conversation_messages`.
    pub fn new(
        request_messages: &'a [Message],
        conversation_messages: &'a [Message],
    ) -> SelectRequest<'a> {
        SelectRequest {
            request_messages,
            conversation_messages,
            incoming_message: None,
            budget_tokens: None,
        }
    }

    /// Sets [`incoming_message`](Self::incoming_message).
    pub fn with_incoming_message(mut self, message: &'a Message) -> SelectRequest<'a> {
        self.incoming_message = Some(message);
        self
    }

    /// Sets [`budget_tokens`](Self::budget_tokens).
    pub fn with_budget_tokens(mut self, tokens: u64) -> SelectRequest<'a> {
        self.budget_tokens = Some(tokens);
        self
    }
}

/// What the host knows about a finished turn, for
/// [`on_turn_complete`](super::ContextEngine::on_turn_complete) (and, as
/// is, the `turn` a plugin receives).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TurnInfo {
    /// Host identifier of the turn.
    pub turn_id: Option<String>,
    /// Host identifier of the task the turn belongs to.
    pub task_id: Option<String>,
    /// Provider calls made during the turn.
    pub api_call_count: u32,
    /// The user interrupted the turn.
    pub interrupted: bool,
    /// The turn ended in an error.
    pub failed: bool,
    /// The host's name for how the turn ended (open set, e.g. "completed").
    pub exit_reason: Option<String>,
}

impl TurnInfo {
    /// Sets [`turn_id`](Self::turn_id).
    pub fn with_turn_id(mut self, id: impl Into<String>) -> TurnInfo {
        self.turn_id = Some(id.into());
        self
    }

    /// Sets [`task_id`](Self::task_id).
    pub fn with_task_id(mut self, id: impl Into<String>) -> TurnInfo {
        self.task_id = Some(id.into());
        self
    }

    /// Sets [`api_call_count`](Self::api_call_count).
    pub fn with_api_call_count(mut self, count: u32) -> TurnInfo {
        self.api_call_count = count;
        self
    }

    /// Sets [`interrupted`](Self::interrupted).
    pub fn with_interrupted(mut self, interrupted: bool) -> TurnInfo {
        self.interrupted = interrupted;
        self
    }

    /// Sets [`failed`](Self::failed).
    pub fn with_failed(mut self, failed: bool) -> TurnInfo {
        self.failed = failed;
        self
    }

    /// Sets [`exit_reason`](Self::exit_reason).
    pub fn with_exit_reason(mut self, reason: impl Into<String>) -> TurnInfo {
        self.exit_reason = Some(reason.into());
        self
    }
}

/// What the host tells an engine when a session starts, for
/// [`on_session_start`](super::ContextEngine::on_session_start).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// The host's data directory, where an engine may persist state.
    pub home_dir: Option<PathBuf>,
    /// The front end the session runs on (e.g. "cli", "telegram").
    pub platform: Option<String>,
    /// The model the session starts with.
    pub model: Option<String>,
}

impl SessionInfo {
    /// Sets [`home_dir`](Self::home_dir).
    pub fn with_home_dir(mut self, dir: impl Into<PathBuf>) -> SessionInfo {
        self.home_dir = Some(dir.into());
        self
    }

    /// Sets [`platform`](Self::platform).
    pub fn with_platform(mut self, platform: impl Into<String>) -> SessionInfo {
        self.platform = Some(platform.into());
        self
    }

    /// Sets [`model`](Self::model).
    pub fn with_model(mut self, model: impl Into<String>) -> SessionInfo {
        self.model = Some(model.into());
        self
    }
}

/// The model now in use, for [`update_model`](super::ContextEngine::update_model).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelInfo {
    /// Model name as sent to the provider.
    pub model: String,
    /// Its context window in tokens; 0 when unknown.
    pub context_length: u64,
    /// Endpoint, for engines that call the same model themselves.
    pub base_url: Option<String>,
    /// Credential for that endpoint; never printed by `Debug`.
    pub api_key: Option<String>,
    /// Provider name; scopes `provider:model` threshold overrides.
    pub provider: Option<String>,
    /// Host's API flavour (e.g. "chat_completions").
    pub api_mode: Option<String>,
}

impl ModelInfo {
    /// A model with a known (or 0 = unknown) context window.
    pub fn new(model: impl Into<String>, context_length: u64) -> ModelInfo {
        ModelInfo {
            model: model.into(),
            context_length,
            base_url: None,
            api_key: None,
            provider: None,
            api_mode: None,
        }
    }

    /// Sets [`base_url`](Self::base_url).
    pub fn with_base_url(mut self, url: impl Into<String>) -> ModelInfo {
        self.base_url = Some(url.into());
        self
    }

    /// Sets [`api_key`](Self::api_key).
    pub fn with_api_key(mut self, key: impl Into<String>) -> ModelInfo {
        self.api_key = Some(key.into());
        self
    }

    /// Sets [`provider`](Self::provider).
    pub fn with_provider(mut self, provider: impl Into<String>) -> ModelInfo {
        self.provider = Some(provider.into());
        self
    }

    /// Sets [`api_mode`](Self::api_mode).
    pub fn with_api_mode(mut self, mode: impl Into<String>) -> ModelInfo {
        self.api_mode = Some(mode.into());
        self
    }
}

/// Debug output ends up in logs, so the key is masked.
impl fmt::Debug for ModelInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelInfo")
            .field("model", &self.model)
            .field("context_length", &self.context_length)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("provider", &self.provider)
            .field("api_mode", &self.api_mode)
            .finish()
    }
}

/// What the host passes along with an engine tool call.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct ToolCallContext<'a> {
    /// The live conversation, read-only.
    pub messages: Option<&'a [Message]>,
    /// Tokens of the request the model answered with this call, by the
    /// host's count (what `context_status` reports), when the host knows.
    pub request_tokens: Option<u64>,
}

impl<'a> ToolCallContext<'a> {
    /// Sets [`messages`](Self::messages).
    pub fn with_messages(mut self, messages: &'a [Message]) -> ToolCallContext<'a> {
        self.messages = Some(messages);
        self
    }

    /// Sets [`request_tokens`](Self::request_tokens).
    pub fn with_request_tokens(mut self, tokens: u64) -> ToolCallContext<'a> {
        self.request_tokens = Some(tokens);
        self
    }
}

/// Where in the host an automatic compaction status is emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionPhase {
    /// Before the API call, from the rough token estimate.
    Preflight,
    /// After a real usage report crossed the threshold.
    Compress,
}

impl CompactionPhase {
    /// The reference design's phase string.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionPhase::Preflight => "preflight",
            CompactionPhase::Compress => "compress",
        }
    }
}

impl fmt::Display for CompactionPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Best-effort numbers accompanying an automatic compaction status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionStatusContext {
    /// Estimated prompt tokens that triggered compaction.
    pub approx_tokens: Option<u64>,
    /// The threshold that was crossed.
    pub threshold_tokens: Option<u64>,
}

impl CompactionStatusContext {
    /// Sets [`approx_tokens`](Self::approx_tokens).
    pub fn with_approx_tokens(mut self, tokens: u64) -> CompactionStatusContext {
        self.approx_tokens = Some(tokens);
        self
    }

    /// Sets [`threshold_tokens`](Self::threshold_tokens).
    pub fn with_threshold_tokens(mut self, tokens: u64) -> CompactionStatusContext {
        self.threshold_tokens = Some(tokens);
        self
    }
}
