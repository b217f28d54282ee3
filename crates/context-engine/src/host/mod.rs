//! The host side of the engine lifecycle: what an agent loop calls around
//! each model request so that any [`ContextEngine`] is driven the way the
//! reference design drives it.
//!
//! An agent author holds one [`Session`] and calls, per model call:
//!
//! 1. [`before_request`](Session::before_request) with the stored history:
//!    `select_context`, then preflight on the request that would be sent
//!    (cheap gate, defer to real usage, `should_compress` with its block
//!    reason, compaction of the history in at most three passes that each
//!    must save 5%, and selection again on the compacted history). It
//!    returns the request to send and, when a compaction was accepted, the
//!    history the caller should persist. After a provider error such as
//!    "context too long", call [`compact_now`](Session::compact_now): the
//!    automatic checks wait for real usage after a compaction;
//! 2. [`after_response`](Session::after_response) with the provider's usage;
//! 3. [`after_tools`](Session::after_tools) once tool results are appended:
//!    the post-tool `should_compress` on real tokens, then the proactive
//!    prune on its own trigger;
//! 4. [`turn_complete`](Session::turn_complete) when the user's turn ends.
//!
//! Around them: [`start`](Session::start), [`compact_now`](Session::compact_now)
//! (manual `/compress`), [`tools`](Session::tools) and
//! [`handle_tool_call`](Session::handle_tool_call), [`end`](Session::end).
//!
//! The driver never changes the caller's history: it returns replacements
//! ([`Update::new_history`]) and the caller decides to persist them. It
//! fails open: an engine error, an empty result or a result that breaks a
//! provider rule the input kept leaves the history (or request) as it was
//! and becomes a [`Notice`].
//!
//! With a [`SessionStore`] attached ([`with_store`](Session::with_store)),
//! nothing compacted is lost: each accepted compaction or prune archives
//! the messages that left the history, records the compaction and saves the
//! engine's state in one transaction *before* the new history is handed
//! back (a store that cannot commit keeps the history unchanged), the state
//! is saved after every response, a new `Session` on the same store and id
//! resumes where the last one stopped, and the `context_recall`,
//! `context_search` and `context_expand` tools answer from the history,
//! then the archive.

mod compact;
mod options;
mod persist;
mod request;
pub use compact::THRASH;
pub use request::LEDGER_CUT;
mod update;

use std::sync::Arc;

use serde_json::Value;

use crate::engine::{
    CompressRequest, ContextEngine, EngineStatus, ModelInfo, PreparedSummary, SessionInfo,
    SummaryJob, SummarySource, ToolCallContext, TurnInfo, Usage, resolve_model_window, summary_due,
};
use crate::message::Message;
use crate::recall::{self, Sources};
use crate::store::{Batch, SessionStore};
use crate::tokens::TokenCounter;
use compact::held_back;

pub use options::HostOptions;
pub use update::{
    Applied, Compaction, InPlace, Missed, MissedKind, Notice, NoticeKind, Prepared, Trigger, Update,
};

/// One agent session driven through a [`ContextEngine`].
pub struct Session {
    engine: Box<dyn ContextEngine>,
    counter: Arc<dyn TokenCounter>,
    options: HostOptions,
    id: String,
    started: bool,
    /// Set when a compaction was accepted and no real usage arrived since:
    /// the engine's numbers describe the old, longer history, so the next
    /// checks would compact again for nothing.
    awaiting_usage: bool,
    last_usage: Option<Usage>,
    calls_this_turn: u32,
    /// The session store, when attached.
    store: Option<Arc<dyn SessionStore>>,
    /// Compactions recorded in the store (numbers the next record).
    recorded: u64,
    /// Store warnings raised where no [`Update`] is returned.
    pending: Vec<Notice>,
    /// Tokens of the last request [`before_request`](Self::before_request)
    /// prepared (the summary watermark's measure).
    last_request_tokens: u64,
    /// The model the requests name ([`use_model`](Self::use_model)) and
    /// the engine's own window before it.
    model: Option<(String, u64)>,
}

/// The driver's own state, saved with the engine's.
#[derive(serde::Serialize, serde::Deserialize)]
struct HostState {
    awaiting_usage: bool,
    last_usage: Option<Usage>,
    calls_this_turn: u32,
    recorded: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("engine", &self.engine.name())
            .field("id", &self.id)
            .field("started", &self.started)
            .field("awaiting_usage", &self.awaiting_usage)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session `id` driving `engine`; `counter` measures the history for
    /// preflight and for the reports.
    pub fn new(
        id: impl Into<String>,
        engine: Box<dyn ContextEngine>,
        counter: Arc<dyn TokenCounter>,
    ) -> Session {
        Session {
            engine,
            counter,
            options: HostOptions::default(),
            id: id.into(),
            started: false,
            awaiting_usage: false,
            last_usage: None,
            calls_this_turn: 0,
            store: None,
            recorded: 0,
            pending: Vec::new(),
            last_request_tokens: 0,
            model: None,
        }
    }

    /// Sets the driver's options.
    pub fn with_options(mut self, options: HostOptions) -> Session {
        self.options = options;
        self
    }

    /// The engine, for its status and name.
    pub fn engine(&self) -> &dyn ContextEngine {
        self.engine.as_ref()
    }

    /// The engine, mutably (engine-specific calls).
    pub fn engine_mut(&mut self) -> &mut dyn ContextEngine {
        self.engine.as_mut()
    }

    /// The session id given to the engine.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The driver's options.
    pub fn options(&self) -> &HostOptions {
        &self.options
    }

    /// Begins the session (loads engine state). Idempotent.
    pub fn start(&mut self, info: &SessionInfo) {
        if !self.started {
            self.engine.on_session_start(&self.id, info);
            self.started = true;
        }
    }

    /// A model switch or fallback: the engine adopts the new window.
    pub fn set_model(&mut self, model: &ModelInfo) {
        self.engine.update_model(model);
    }

    /// When the next call is made, in seconds since the Unix epoch, for a
    /// host that knows better than the system clock (a replay: the
    /// recording's time); `None` goes back to the clock. See
    /// [`ContextEngine::set_call_time`].
    pub fn set_call_time(&mut self, at: Option<f64>) {
        self.engine.set_call_time(at);
    }

    /// The next request names `model`: when it differs from the last one,
    /// the engine adopts its window ([`HostOptions::model_windows`], else
    /// the engine's window from before the first call) and its threshold
    /// override, as on a model switch.
    pub fn use_model(&mut self, model: &str) {
        let base = match &self.model {
            Some((last, _)) if last == model => return,
            Some((_, base)) => *base,
            None => self.engine.state().context_length,
        };
        let window = resolve_model_window(model, "", &self.options.model_windows).unwrap_or(base);
        self.engine.update_model(&ModelInfo::new(model, window));
        self.model = Some((model.to_owned(), base));
    }

    /// Records the provider's usage of the call just made.
    pub fn after_response(&mut self, usage: &Usage) {
        self.engine.update_from_response(usage);
        self.last_usage = Some(*usage);
        self.awaiting_usage = false;
        self.save_state();
    }

    /// After tool results were appended to `history`: the post-tool
    /// compaction check on the last real usage, then the proactive prune.
    pub fn after_tools(&mut self, history: &[Message]) -> Update {
        let mut update = Update::default();
        update.notices.append(&mut self.pending);
        let real = self.engine.state().last_prompt_tokens.known();
        if !self.awaiting_usage {
            let decision = self.engine.should_compress_info(None);
            if decision.should_compress {
                let tokens = real.unwrap_or_else(|| self.counter.count_messages(history) as u64);
                self.compact(
                    history,
                    tokens,
                    Trigger::PostTool,
                    self.automatic_request(),
                    &mut update,
                );
            } else if let Some(reason) = decision.block_reason {
                held_back(&mut update, Trigger::PostTool, &reason);
            }
        }
        let base = update.new_history.as_deref().unwrap_or(history);
        let (pruned, n) = self.engine.prune_tool_results_only(base, real);
        if n > 0 {
            let archived = self.check_output(base, &pruned).and_then(|()| {
                let mut batch = Batch::new();
                batch.archive_removed(base, &pruned);
                self.commit(batch).map_err(compact::Rejected::Archive)
            });
            match archived {
                Ok(()) => {
                    let pruned = pruned.into_owned();
                    update.pruned = n;
                    update.new_history = Some(pruned);
                }
                Err(why) => update.notices.push(Notice::warning(format!(
                    "engine `{}`: proactive prune ignored: {why}",
                    self.engine.name()
                ))),
            }
        }
        update
    }

    /// The request of an automatic compaction: with background summaries,
    /// only a prepared summary (never a wait for the summary model).
    /// An agent's ask (`context_compact`) is made on the next request, as
    /// a manual compaction is: its summary is written then if none was
    /// prepared.
    fn automatic_request(&self) -> CompressRequest {
        match self.options.summary_watermark {
            Some(_) if !self.engine.compaction_requested() => {
                CompressRequest::new().with_summary(SummarySource::Prepared)
            }
            _ => CompressRequest::new(),
        }
    }

    /// With background summaries on ([`HostOptions::summary_watermark`]):
    /// once the last prepared request reached the watermark, the engine's
    /// job summarizing what a compaction of `history` would replace. The
    /// caller runs it off the request path ([`SummaryJob::run`], blocking)
    /// and hands the result to [`adopt_summary`](Self::adopt_summary); the
    /// compaction at the threshold then uses it if the history up to its
    /// cut is unchanged. `None` when not due, right after a compaction
    /// (until real usage), or when the engine prepares nothing (it holds
    /// one not used yet, is in a cooldown, or does not support it).
    pub fn summary_job(&mut self, history: &[Message]) -> Option<SummaryJob> {
        let watermark = self.options.summary_watermark?;
        let threshold = self.engine.state().threshold_tokens;
        let due = summary_due(self.last_request_tokens, threshold, watermark)
            || self.engine.compaction_requested();
        if self.awaiting_usage || !due {
            return None;
        }
        let request = CompressRequest::new().with_archive(self.store.is_some());
        self.engine.prepare_summary(history, &request)
    }

    /// Hands the engine a summary its [`SummaryJob`] prepared.
    pub fn adopt_summary(&mut self, summary: PreparedSummary) {
        self.engine.adopt_summary(summary);
    }

    /// The user's turn ended (best effort: abnormal exits may skip it).
    pub fn turn_complete(&mut self, history: &[Message], turn: &TurnInfo) {
        let mut turn = turn.clone();
        if turn.api_call_count == 0 {
            turn.api_call_count = self.calls_this_turn;
        }
        self.engine
            .on_turn_complete(history, self.last_usage.as_ref(), &turn);
        self.calls_this_turn = 0;
    }

    /// A manual `/compress [focus]`: forced past cooldowns, always reported.
    pub fn compact_now(&mut self, history: &[Message], focus: Option<&str>) -> Update {
        let mut update = Update::default();
        update.notices.append(&mut self.pending);
        if !self.engine.has_content_to_compress(history) {
            update.notices.push(Notice {
                kind: NoticeKind::Manual,
                text: "Nothing to compress yet.".into(),
            });
            return update;
        }
        let tokens = self.counter.count_messages(history) as u64;
        let mut request = CompressRequest::new()
            .with_force(true)
            .with_current_tokens(tokens);
        if let Some(focus) = focus {
            request = request.with_focus_topic(focus);
        }
        self.compact(history, tokens, Trigger::Manual, request, &mut update);
        update
    }

    /// The engine's tools merged into the agent's: the agent's own tools
    /// first, then each engine tool whose function name is not taken.
    /// With a store, `context_recall`, `context_search` and
    /// `context_expand` are among them.
    pub fn tools(&self, agent_tools: &[Value]) -> Vec<Value> {
        let mut out = agent_tools.to_vec();
        let mut engine_tools = self.engine.tool_schemas();
        if self.store.is_some() {
            engine_tools.extend(recall::tool_schemas());
        }
        for tool in engine_tools {
            let name = tool_name(&tool);
            if name.is_none() || !out.iter().any(|t| tool_name(t) == name) {
                out.push(tool);
            }
        }
        out
    }

    /// Whether `name` is one of the engine's tools.
    pub fn is_engine_tool(&self, name: &str) -> bool {
        (self.store.is_some() && recall::is_tool(name))
            || self
                .engine
                .tool_schemas()
                .iter()
                .any(|t| tool_name(t) == Some(name))
    }

    /// Runs the engine's tool `name`; `None` when it is not an engine tool
    /// (the agent runs it itself). `args` is the call's JSON arguments text.
    pub fn handle_tool_call(
        &mut self,
        name: &str,
        args: &str,
        history: &[Message],
    ) -> Option<String> {
        if !self.is_engine_tool(name) {
            return None;
        }
        let args: Value = match serde_json::from_str(args) {
            Ok(v) => v,
            Err(e) => {
                return Some(
                    serde_json::json!({ "error": format!("arguments are not JSON: {e}") })
                        .to_string(),
                );
            }
        };
        if let Some(store) = &self.store
            && recall::is_tool(name)
        {
            let sources = Sources::history(history).with_store(store.as_ref(), &self.id);
            return Some(recall::handle_tool_call(name, &args, sources));
        }
        let mut ctx = ToolCallContext::default().with_messages(history);
        if self.last_request_tokens > 0 {
            ctx = ctx.with_request_tokens(self.last_request_tokens);
        }
        Some(self.engine.handle_tool_call(name, &args, &ctx))
    }

    /// The engine's status report.
    pub fn status(&self) -> EngineStatus {
        self.engine.status()
    }

    /// `/new` or `/reset`: the engine's per-session state starts over.
    pub fn reset(&mut self) {
        self.engine.on_session_reset();
        self.awaiting_usage = false;
        self.last_usage = None;
        self.calls_this_turn = 0;
        self.save_state();
    }

    /// A real session boundary (exit, expiry); the engine may persist.
    pub fn end(&mut self, history: &[Message]) {
        if self.started {
            self.engine.on_session_end(&self.id, history);
            self.started = false;
        }
    }
}

/// A tool schema's function name (`{"type":"function","function":{"name"}}`
/// or a bare `{"name"}`).
fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
}

#[cfg(test)]
mod tests;
