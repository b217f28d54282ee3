//! The [`ContextEngine`] trait: pluggable policy for when and how a
//! conversation is compacted near the model's token limit.
//!
//! An engine tracks token usage, decides when compaction fires, performs it
//! (summarize, drop, build an index — anything that returns a valid
//! transcript), and may expose tools to the agent. One engine is active at a
//! time. Lifecycle, as a host drives it:
//!
//! 1. [`on_session_start`](ContextEngine::on_session_start);
//! 2. after every provider response, [`update_from_response`](ContextEngine::update_from_response);
//! 3. every turn, [`should_compress`](ContextEngine::should_compress) and, if
//!    so, [`compress`](ContextEngine::compress);
//! 4. [`on_session_end`](ContextEngine::on_session_end) at real session
//!    boundaries only (exit, reset, expiry), never per turn.
//!
//! Only identity, token tracking and compaction itself are required; every
//! other hook has a default that keeps an engine written before the hook
//! existed working unchanged.

mod background;
mod compaction;
mod error;
mod fit_report;
mod memory;
mod state;
mod threshold;
mod types;
mod usage;

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use crate::message::Message;

pub use background::{
    DEFAULT_SUMMARY_WATERMARK, PreparedSummary, SummaryJob, SummarySource, prefix_key, summary_due,
};
pub use compaction::{Compaction, CompactionReport, Outcome, Span, THRASH_CALLS};
pub use error::{BoxError, EngineError};
pub use fit_report::{FitStep, FitStepKind, Unfittable};
pub use memory::{
    MEMORY_CONTEXT_HEAD_CHARS, MEMORY_CONTEXT_MAX_CHARS, MEMORY_CONTEXT_TAIL_CHARS,
    MEMORY_CONTEXT_TRUNCATION_MARKER, sanitize_memory_context,
};
pub use state::{
    DEFAULT_PROTECT_FIRST_N, DEFAULT_PROTECT_LAST_N, DEFAULT_THRESHOLD_PERCENT, EngineState,
    EngineStatus, PromptTokens,
};
pub use threshold::{
    SMALL_WINDOW_PERCENT, compaction_threshold, ledger_ceiling, resolve_model_threshold,
    resolve_model_window, threshold_tokens,
};
pub use types::{
    BlockReason, CompactionPhase, CompactionStatusContext, CompressDecision, CompressRequest,
    ModelInfo, SelectRequest, SessionInfo, ToolCallContext, TurnInfo,
};
pub use usage::{Usage, UsageError};

/// A pluggable context engine (see the module docs for the lifecycle).
///
/// `Send` so a host can move its engine to a worker thread; the trait is
/// object safe, so hosts hold `Box<dyn ContextEngine>`.
pub trait ContextEngine: Send {
    // -- Identity and state ---------------------------------------------

    /// Short identifier (e.g. "compressor", "lcm"), used in errors and logs.
    fn name(&self) -> &str;

    /// The engine's token tracking and compaction parameters.
    fn state(&self) -> &EngineState;

    /// Mutable access to [`state`](Self::state), for the default hooks.
    fn state_mut(&mut self) -> &mut EngineState;

    // -- Core -------------------------------------------------------------

    /// Records the usage of every LLM call; most engines call
    /// [`EngineState::record_usage`] and maybe keep more.
    fn update_from_response(&mut self, usage: &Usage);

    /// Whether compaction should fire this turn, for `prompt_tokens` or, when
    /// `None`, the engine's last known count.
    fn should_compress(&self, prompt_tokens: Option<u64>) -> bool;

    /// [`should_compress`](Self::should_compress) with the reason compaction
    /// is held back, so hosts can warn instead of silently skipping.
    /// Engines with a cooldown or anti-thrashing guard override it; the
    /// default never reports a reason.
    fn should_compress_info(&self, prompt_tokens: Option<u64>) -> CompressDecision {
        CompressDecision::plain(self.should_compress(prompt_tokens))
    }

    /// Compacts `messages` into a valid transcript that fits the budget,
    /// and reports what it did ([`Compaction`]: the messages and a
    /// [`CompactionReport`] with the summarized span of the input, so a
    /// host or store never needs the concrete engine type to explain or
    /// archive a compaction). An engine that does not track its cut can
    /// build the result with [`Compaction::from_diff`].
    ///
    /// The input is borrowed: on error the host keeps the original, so a
    /// failing engine never loses history ([`CompactionReport::failed`]
    /// turns the error into a report). Engines typically finish with
    /// [`EngineState::record_compression`].
    fn compress(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Result<Compaction, EngineError>;

    // -- Optional hooks -----------------------------------------------------

    /// A summary of what a compaction of `messages` would summarize now,
    /// to prepare off the request path (see [`SummaryJob`]); the host runs
    /// it and hands the result to [`adopt_summary`](Self::adopt_summary).
    /// `None` when there is nothing to summarize or the engine prepares
    /// no summaries ahead (the default).
    fn prepare_summary(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Option<SummaryJob> {
        let _ = (messages, request);
        None
    }

    /// Takes a summary a [`SummaryJob`] of this engine prepared; the next
    /// [`compress`](Self::compress) uses it while the history up to its
    /// cut is unchanged. Default: ignored.
    fn adopt_summary(&mut self, summary: PreparedSummary) {
        let _ = summary;
    }

    /// Whether the agent asked for a compaction (the `context_compact`
    /// tool) that no request has made yet: the host compacts before the
    /// next request whatever its size, and prepares its summary in the
    /// background without waiting for the watermark. Default: never.
    fn compaction_requested(&self) -> bool {
        false
    }

    /// Deterministically trims old tool-result payloads without an LLM call.
    ///
    /// Runs on a cheap, cost-oriented trigger independent of
    /// [`should_compress`](Self::should_compress), so large-window engines
    /// reclaim re-sent tool output long before full compaction. Returns the
    /// messages and how many results were pruned; the default borrows the
    /// input unchanged and prunes nothing.
    fn prune_tool_results_only<'a>(
        &mut self,
        messages: &'a [Message],
        current_tokens: Option<u64>,
    ) -> (Cow<'a, [Message]>, usize) {
        let _ = current_tokens;
        (Cow::Borrowed(messages), 0)
    }

    /// Optionally replaces the context of THIS request, before generation.
    ///
    /// Runs on every provider request (retries included), independent of
    /// compaction: `compress` shrinks context that is too long, this swaps in
    /// a different one (retrieval, topic routing, branch switching). The
    /// result is request-only, never persisted; stored history cannot be
    /// changed through the shared references. `None` (the default) leaves the
    /// request byte-identical, keeping the provider's prompt cache warm.
    ///
    /// See [`SelectRequest`] for what the host passes; it is a struct so that
    /// hosts can add fields without breaking engines.
    fn select_context(&mut self, request: &SelectRequest<'_>) -> Option<Vec<Message>> {
        let _ = request;
        None
    }

    /// [`select_context`](Self::select_context) as a view that borrows
    /// the request's messages it leaves unchanged: a host that owns its
    /// history can then send it without copying every message each call.
    /// The same decision as `select_context` (an engine implements one in
    /// terms of the other); the default wraps `select_context`.
    fn select_context_view<'a>(
        &mut self,
        request: &SelectRequest<'a>,
    ) -> Option<Vec<std::borrow::Cow<'a, Message>>> {
        self.select_context(request)
            .map(|v| v.into_iter().map(std::borrow::Cow::Owned).collect())
    }

    /// How many leading messages of `request` (the view prepared for this
    /// call) the engine expects the next call's request to carry as they
    /// are. A host whose provider caches at explicit breakpoints
    /// (Anthropic's `cache_control`) marks the last of them: an entry
    /// written past it would never be read again. Default: all of them
    /// (the engine promises an append-only request).
    fn stable_prefix(&self, request: &[Message]) -> usize {
        request.len()
    }

    /// Observes a finished turn (the complement of
    /// [`select_context`](Self::select_context)) to index or update routing
    /// state. Best-effort: some abnormal exits skip it. `usage` is `None`
    /// when the turn never reached a provider response. Default: nothing.
    fn on_turn_complete(&mut self, messages: &[Message], usage: Option<&Usage>, turn: &TurnInfo) {
        let _ = (messages, usage, turn);
    }

    /// Cheap check before the API call, without a real token count.
    /// Default: never.
    fn should_compress_preflight(&self, messages: &[Message]) -> bool {
        let _ = messages;
        false
    }

    /// [`should_compress_preflight`](Self::should_compress_preflight) when
    /// the host has already counted `messages` (`tokens`, request overhead
    /// included, with the counter it shares with the engine): an engine
    /// that would count them itself uses the count, so the hot path counts
    /// once. Default: asks [`should_compress_preflight`](Self::should_compress_preflight).
    fn should_compress_preflight_counted(&self, messages: &[Message], tokens: u64) -> bool {
        let _ = tokens;
        self.should_compress_preflight(messages)
    }

    /// Whether preflight should trust recent real usage over the noisy rough
    /// estimate, so a compacted request that already fit is not compacted
    /// again. Default: no.
    fn should_defer_preflight_to_real_usage(&self, rough_tokens: u64) -> bool {
        let _ = rough_tokens;
        false
    }

    /// The user-visible status of an automatic compaction, or `None` to stay
    /// silent. Default: `default_message`, unless the state's
    /// `emit_automatic_compaction_status` is off. Warnings, errors and manual
    /// compaction are not governed by this hook. Hosts call it through
    /// [`automatic_compaction_status_message`].
    fn automatic_compaction_status(
        &self,
        phase: CompactionPhase,
        default_message: &str,
        context: &CompactionStatusContext,
    ) -> Option<String> {
        let _ = (phase, context);
        self.state()
            .emit_automatic_compaction_status
            .then(|| default_message.to_owned())
    }

    /// What the last [`compress`](Self::compress) did (a failure's report
    /// too), for hosts that show it; `None` before any, or when the engine
    /// keeps none (the default).
    fn last_report(&self) -> Option<&CompactionReport> {
        None
    }

    /// Guard for a manual compaction: `false` reports "nothing to compress
    /// yet" without an LLM call (e.g. everything is protected). Default: yes.
    fn has_content_to_compress(&self, messages: &[Message]) -> bool {
        let _ = messages;
        true
    }

    /// A session begins: load persisted state. Default: nothing.
    fn on_session_start(&mut self, session_id: &str, info: &SessionInfo) {
        let _ = (session_id, info);
    }

    /// A real session boundary (exit, reset, expiry), never per turn.
    /// Default: nothing.
    fn on_session_end(&mut self, session_id: &str, messages: &[Message]) {
        let _ = (session_id, messages);
    }

    /// `/new` or `/reset`: per-session state starts over. Default: zero the
    /// counters and token tracking ([`EngineState::reset_counters`]).
    fn on_session_reset(&mut self) {
        self.state_mut().reset_counters();
    }

    /// JSON schemas of the tools this engine offers the agent. Default: none.
    fn tool_schemas(&self) -> Vec<Value> {
        Vec::new()
    }

    /// Handles a call to one of [`tool_schemas`](Self::tool_schemas); returns
    /// the tool result as a JSON string. Default: every tool is unknown, and
    /// the result is `{"error": "Unknown context engine tool: NAME"}`.
    fn handle_tool_call(&mut self, name: &str, args: &Value, ctx: &ToolCallContext<'_>) -> String {
        let _ = (args, ctx);
        unknown_tool(name)
    }

    /// The engine's state as JSON, for a session store to persist after
    /// every step so that a restarted host resumes with the same decisions.
    /// Default: the [`EngineState`]; engines with more state (cooldowns,
    /// streaks) override this and [`restore`](Self::restore) together.
    fn snapshot(&self) -> Value {
        serde_json::to_value(self.state()).unwrap_or(Value::Null)
    }

    /// Adopts a [`snapshot`](Self::snapshot) taken earlier (possibly by
    /// another process). On error the engine is unchanged.
    fn restore(&mut self, snapshot: &Value) -> Result<(), EngineError> {
        let state = EngineState::deserialize(snapshot).map_err(|e| EngineError::Restore {
            engine: self.name().to_owned(),
            reason: e.to_string(),
        })?;
        *self.state_mut() = state;
        Ok(())
    }

    /// The standard status report; engines may add fields to its `extra`.
    fn status(&self) -> EngineStatus {
        self.state().status()
    }

    /// The wall-clock time of the coming provider call, in seconds since
    /// the Unix epoch, when the host knows it better than the system clock:
    /// a replay passes each recorded call's time, so the rules that follow
    /// the prompt cache's lifetime see the recording's idle gaps. `None`
    /// goes back to the system clock. Default: ignored.
    fn set_call_time(&mut self, at: Option<f64>) {
        let _ = at;
    }

    /// Model switch or fallback: adopt the new context length and recompute
    /// the threshold, honouring per-model overrides and the reply reserve
    /// ([`EngineState::apply_model`], [`compaction_threshold`]): the same
    /// threshold the built-in engines compute.
    fn update_model(&mut self, model: &ModelInfo) {
        self.state_mut().apply_model(model);
    }
}

/// The JSON error a tool call to an unknown tool returns.
pub fn unknown_tool(name: &str) -> String {
    serde_json::json!({ "error": format!("Unknown context engine tool: {name}") }).to_string()
}

/// The host-visible status of an automatic compaction, or `None` to emit
/// nothing.
///
/// Engines suppress it through `emit_automatic_compaction_status` or
/// customize it through
/// [`automatic_compaction_status`](ContextEngine::automatic_compaction_status);
/// whatever they return is trimmed, and a blank message is no message.
pub fn automatic_compaction_status_message<E: ContextEngine + ?Sized>(
    engine: &E,
    phase: CompactionPhase,
    default_message: &str,
    context: &CompactionStatusContext,
) -> Option<String> {
    if !engine.state().emit_automatic_compaction_status {
        return None;
    }
    let message = engine.automatic_compaction_status(phase, default_message, context)?;
    let trimmed = message.trim();
    if trimmed.is_empty() {
        None
    } else if trimmed.len() == message.len() {
        Some(message)
    } else {
        Some(trimmed.to_owned())
    }
}

#[cfg(test)]
mod tests;
