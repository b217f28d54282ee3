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

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::compressor::fit::{FitStep, Fitted, Unfittable, fit, fit_noted};
use crate::engine::{
    CompactionPhase, CompactionReport, CompactionStatusContext, CompressRequest, ContextEngine,
    EngineError, EngineStatus, ModelInfo, PreparedSummary, SelectRequest, SessionInfo, SummaryJob,
    SummarySource, ToolCallContext, TurnInfo, Usage, automatic_compaction_status_message,
    resolve_model_window, summary_due,
};
use crate::message::Message;
use crate::recall::{self, Sources};
use crate::store::{Batch, CompactionInfo, SessionStore, StoreError};
use crate::tokens::TokenCounter;
use crate::validate::{Profile, introduced_violation, validate};

/// How the driver runs compaction; defaults follow the reference host.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct HostOptions {
    /// Compaction passes per trigger: a pass that still leaves the prompt
    /// over the threshold may be followed by another, up to this many.
    pub max_passes: u32,
    /// A pass that saves less than this share of the prompt ends the loop:
    /// another would thrash (summaries of summaries) for nothing.
    pub min_pass_savings: f64,
    /// Provider rules every engine output must keep (no new violations).
    pub profile: Profile,
    /// Summaries are prepared in the background from this share of the
    /// threshold on ([`Session::summary_job`]), and an automatic compaction
    /// never waits for a summary model: it uses the prepared summary when
    /// it is ready; when not, the request goes out as selected (the
    /// digest), and only a request over the window is compacted with the
    /// deterministic extractive summary. `None` (the default): the
    /// summarizer runs inline, when the threshold is crossed.
    pub summary_watermark: Option<f64>,
    /// Context windows by model-name substring (or `provider:substring`),
    /// for hosts whose requests name their model
    /// ([`Session::use_model`]); a model no key matches gets the engine's
    /// own window.
    pub model_windows: BTreeMap<String, u64>,
    /// Which user messages are a text-action agent's tool output
    /// (`context.text_actions`): where a fitted request may place its note.
    pub text_actions: crate::validate::TextActions,
}

impl Default for HostOptions {
    fn default() -> HostOptions {
        HostOptions {
            max_passes: 3,
            min_pass_savings: 0.05,
            profile: Profile::OpenAi,
            summary_watermark: None,
            model_windows: BTreeMap::new(),
            text_actions: crate::validate::TextActions::default(),
        }
    }
}

impl HostOptions {
    /// Sets [`profile`](Self::profile).
    pub fn with_profile(mut self, profile: Profile) -> HostOptions {
        self.profile = profile;
        self
    }

    /// Sets [`text_actions`](Self::text_actions).
    pub fn with_text_actions(mut self, actions: crate::validate::TextActions) -> HostOptions {
        self.text_actions = actions;
        self
    }

    /// Sets [`summary_watermark`](Self::summary_watermark).
    pub fn with_summary_watermark(mut self, watermark: Option<f64>) -> HostOptions {
        self.summary_watermark = watermark;
        self
    }

    /// Sets [`model_windows`](Self::model_windows).
    pub fn with_model_windows(mut self, windows: BTreeMap<String, u64>) -> HostOptions {
        self.model_windows = windows;
        self
    }

    /// Sets [`max_passes`](Self::max_passes).
    pub fn with_max_passes(mut self, passes: u32) -> HostOptions {
        self.max_passes = passes;
        self
    }
}

/// How loudly a [`Notice`] should reach the user.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// An automatic compaction's status; the engine decided to show it.
    Status,
    /// Something went wrong or was held back; always shown.
    Warning,
    /// The result of a manual compaction; always shown.
    Manual,
}

/// A message for the user, from the driver or the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Notice {
    /// How it should be shown.
    pub kind: NoticeKind,
    /// The text, one line.
    pub text: String,
}

impl Notice {
    fn warning(text: impl Into<String>) -> Notice {
        Notice {
            kind: NoticeKind::Warning,
            text: text.into(),
        }
    }
}

/// One accepted compaction (all its passes).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Compaction {
    /// Where it was triggered.
    pub trigger: Trigger,
    /// Passes whose result was accepted.
    pub passes: u32,
    /// Tokens of the history before the first pass.
    pub tokens_before: u64,
    /// Tokens of the history after the last accepted pass.
    pub tokens_after: u64,
    /// Tokens of the request that would have been sent before it (after
    /// selection), and of the request after it: the same request, counted
    /// the same way, so that the two compare.
    pub request_tokens_before: u64,
    /// Tokens of the request after it.
    pub request_tokens_after: u64,
    /// Messages before and after.
    pub messages_before: usize,
    /// Messages after the last accepted pass.
    pub messages_after: usize,
    /// Wall time of all passes (summarizer calls included).
    #[serde(rename = "elapsed_ms", serialize_with = "as_millis")]
    pub elapsed: Duration,
    /// The engine's report of each accepted pass, in order. The indices of
    /// pass `k` refer to its input: the history for the first, the previous
    /// pass's output after that. Not serialized (replay's JSON stays as it
    /// was); a store archives `summarized` spans from here.
    #[serde(skip)]
    pub reports: Vec<CompactionReport>,
}

/// What set a compaction off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Before a request, from the counted size of the history.
    Preflight,
    /// After tool results, from the provider's real usage.
    PostTool,
    /// A manual `/compress`.
    Manual,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// What a driver step changed. The caller's history is never touched: when
/// [`new_history`](Self::new_history) is set, the caller replaces its
/// persisted history with it (a compaction or prune was accepted).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Update {
    /// The history to persist instead of the caller's, if anything changed.
    pub new_history: Option<Vec<Message>>,
    /// The compaction accepted in this step, if any.
    pub compaction: Option<Compaction>,
    /// Tool results the proactive prune shortened in this step.
    pub pruned: usize,
    /// What to tell the user.
    pub notices: Vec<Notice>,
    /// A compaction that was due in this step but did not happen, and why.
    pub missed: Option<Missed>,
}

/// A compaction that was due but did not happen: what a report needs to
/// tell "never reached the threshold" from "tried and failed" and "held
/// back".
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Missed {
    /// Where it was due.
    pub trigger: Trigger,
    /// How it went.
    pub kind: MissedKind,
    /// Why, for the user (one line).
    pub reason: String,
}

/// How a due compaction did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissedKind {
    /// Attempted; the engine failed (summarizer, plugin crash, timeout).
    Failed,
    /// Attempted; the result was refused (it would break a provider rule,
    /// or the engine judged its own output invalid).
    Refused,
    /// Not attempted: a cooldown or the anti-thrash guard held it back.
    Blocked,
    /// Attempted; everything was protected or already compact.
    NothingToCompress,
    /// Not attempted: the summary prepared in the background is not ready
    /// and the request fits the window as it is.
    Deferred,
}

impl MissedKind {
    /// The kind of an engine's error.
    fn of(err: &EngineError) -> MissedKind {
        match err {
            EngineError::Blocked { .. } => MissedKind::Blocked,
            EngineError::NothingToCompress { .. } => MissedKind::NothingToCompress,
            EngineError::InvalidOutput { .. } => MissedKind::Refused,
            EngineError::SummaryNotReady { .. } => MissedKind::Deferred,
            _ => MissedKind::Failed,
        }
    }
}

/// What [`Session::before_request`] prepared.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Prepared {
    /// The messages to send in this request (a request view: never persist
    /// it, unless it is also [`Update::new_history`]).
    pub request: Vec<Message>,
    /// Whether `select_context` replaced the request (digest, retrieval).
    pub selected: bool,
    /// Tokens of `request`, counted exactly.
    pub request_tokens: u64,
    /// Compaction and notices of the preflight.
    pub update: Update,
    /// The escalation steps that brought a request over the window under
    /// it (a request view: the history is unchanged), in order.
    pub fit: Vec<FitStep>,
    /// Set when even the system prompt and the latest user ask exceed the
    /// window: no request can fit, so **do not send** `request`; the host
    /// decides (switch to a larger model, ask the user to shorten).
    pub unfittable: Option<Unfittable>,
}

/// What [`Session::before_request_in_place`] did.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum InPlace {
    /// The request view is the history itself, edited in place.
    Applied(Applied),
    /// The history is unchanged; the request as
    /// [`Session::before_request`] prepares it.
    Prepared(Prepared),
}

/// A request view applied to the history in place
/// ([`Session::before_request_in_place`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct Applied {
    /// The history's messages the view replaced, by index (ascending);
    /// the view's own are in the history until [`restore`](Self::restore).
    pub originals: Vec<(usize, Message)>,
    /// Whether `select_context` replaced anything.
    pub selected: bool,
    /// Tokens of the request (the edited history), counted exactly.
    pub request_tokens: u64,
    /// Notices of the preflight (never a compaction: that takes the full
    /// way).
    pub update: Update,
}

impl Applied {
    /// Puts the originals back into `history`; returns the view's messages
    /// that stood in their place, by index.
    pub fn restore(mut self, history: &mut [Message]) -> Vec<(usize, Message)> {
        for (i, m) in &mut self.originals {
            if let Some(h) = history.get_mut(*i) {
                std::mem::swap(h, m);
            }
        }
        self.originals
    }
}

/// Swaps each `(index, message)` of `edits` with the history's message at
/// that index (twice: as before).
fn swap_edits(history: &mut [Message], edits: &mut [(usize, Message)]) {
    for (i, m) in edits {
        if let Some(h) = history.get_mut(*i) {
            std::mem::swap(h, m);
        }
    }
}

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

    /// Attaches a session store: what leaves the history is archived there,
    /// the state is saved after every step, and the recall tools read it.
    /// When the store already has this session's state (a restart), the
    /// engine and the driver resume from it.
    pub fn with_store(mut self, store: Arc<dyn SessionStore>) -> Result<Session, StoreError> {
        if let Some(saved) = store.load_state(&self.id)? {
            let corrupt = |detail: String| StoreError::Corrupt {
                location: store.location(),
                detail: format!("state of session `{}`: {detail}", self.id),
            };
            let host: HostState = saved
                .get("host")
                .cloned()
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| corrupt(e.to_string()))?
                .ok_or_else(|| corrupt("no `host` part".into()))?;
            let engine = saved
                .get("engine_state")
                .ok_or_else(|| corrupt("no `engine_state` part".into()))?;
            self.engine
                .restore(engine)
                .map_err(|e| corrupt(e.to_string()))?;
            self.awaiting_usage = host.awaiting_usage;
            self.last_usage = host.last_usage;
            self.calls_this_turn = host.calls_this_turn;
            self.recorded = host.recorded;
        }
        self.store = Some(store);
        Ok(self)
    }

    /// Compaction records this session has numbered in its store so far
    /// (the next is numbered after them).
    pub fn records_numbered(&self) -> u64 {
        self.recorded
    }

    /// Numbers this session's next compaction records after the first `n`
    /// its store holds under its name. A host that starts over under a
    /// name that already compacted (a new conversation under a session id
    /// a server reuses) continues the store's numbering instead of
    /// clashing with the records there.
    pub fn with_records_after(mut self, n: u64) -> Session {
        self.number_records_after(n);
        self
    }

    /// [`with_records_after`](Self::with_records_after) on a running
    /// session (one whose count fell behind the store's records).
    pub fn number_records_after(&mut self, n: u64) {
        self.recorded = self.recorded.max(n);
    }

    /// The attached session store.
    pub fn store(&self) -> Option<&Arc<dyn SessionStore>> {
        self.store.as_ref()
    }

    /// The state a store keeps for this session: the engine's snapshot and
    /// the driver's counters (what [`with_store`](Self::with_store) resumes
    /// from).
    pub fn snapshot(&self) -> Value {
        let host = HostState {
            awaiting_usage: self.awaiting_usage,
            last_usage: self.last_usage,
            calls_this_turn: self.calls_this_turn,
            recorded: self.recorded,
        };
        serde_json::json!({
            "engine": self.engine.name(),
            "engine_state": self.engine.snapshot(),
            "host": host,
        })
    }

    /// Commits `batch` with the current state; `Err` with a warning text.
    fn commit(&self, mut batch: Batch) -> Result<(), String> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        batch.set_state(self.snapshot());
        store.commit(&self.id, &batch).map_err(|e| e.to_string())
    }

    /// Saves the state alone; a failure becomes a warning on the next update.
    fn save_state(&mut self) {
        if let Err(e) = self.commit(Batch::new()) {
            self.pending.push(Notice::warning(format!(
                "session store: cannot save the engine state: {e}"
            )));
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

    /// Leading messages of `request` (prepared by this session) the next
    /// request should carry as they are ([`ContextEngine::stable_prefix`]):
    /// where a host whose provider caches at breakpoints marks the cache.
    /// Asked only by such hosts, so other requests never pay for it.
    pub fn stable_prefix(&self, request: &[Message]) -> usize {
        self.engine.stable_prefix(request)
    }

    /// Preflight and context selection for the next model call on
    /// `history` (the persisted conversation, system prompt included).
    pub fn before_request(&mut self, history: &[Message]) -> Prepared {
        let mut update = Update::default();
        update.notices.append(&mut self.pending);
        // Preflight measures the request that would be sent, after
        // selection: a digest that keeps requests small also postpones
        // compaction, which keeps detail and the prompt cache longer.
        let (view, selected) = self.select(history, &mut update.notices);
        self.prepare_with(history, view, selected, update)
    }

    /// [`before_request`](Self::before_request) for a host that owns its
    /// history and sends it without a copy: when the engine's request view
    /// only replaces messages in place (a digest) and the step is a plain
    /// one (no compaction, nothing to fit to the window, a valid view), the
    /// replaced messages are swapped into `history`, which **is** the
    /// request until [`Applied::restore`] puts the originals back (do so
    /// before anything else reads the history). Otherwise `history` is
    /// left as it was and the result is exactly `before_request`'s. The
    /// decisions are the same either way.
    pub fn before_request_in_place(&mut self, history: &mut [Message]) -> InPlace {
        let mut update = Update::default();
        update.notices.append(&mut self.pending);
        let budget = self.engine.state().context_length;
        let edits = {
            let shared: &[Message] = history;
            let mut request = SelectRequest::new(shared, shared);
            if budget > 0 {
                request = request.with_budget_tokens(budget);
            }
            match self.engine.select_context_view(&request) {
                None => Ok(None),
                Some(view) => {
                    let in_place = view.len() == shared.len()
                        && view.iter().zip(shared).all(|(v, h)| match v {
                            std::borrow::Cow::Borrowed(b) => std::ptr::eq(*b, h),
                            std::borrow::Cow::Owned(_) => true,
                        });
                    if in_place {
                        Ok(Some(
                            view.into_iter()
                                .enumerate()
                                .filter_map(|(i, v)| match v {
                                    std::borrow::Cow::Owned(m) => Some((i, m)),
                                    std::borrow::Cow::Borrowed(_) => None,
                                })
                                .collect::<Vec<_>>(),
                        ))
                    } else {
                        Err(view
                            .into_iter()
                            .map(std::borrow::Cow::into_owned)
                            .collect::<Vec<_>>())
                    }
                }
            }
        };
        let (mut edits, selected) = match edits {
            Ok(Some(edits)) => (edits, true),
            Ok(None) => (Vec::new(), false),
            Err(view) => {
                let (view, selected) = self.checked(history, view, &mut update.notices);
                return InPlace::Prepared(self.prepare_with(history, view, selected, update));
            }
        };
        swap_edits(history, &mut edits);
        // From here `history` is the request view. A view with findings,
        // a compaction or a request over the window: the full way, on a
        // copy of the view, the history restored.
        let full_way = |this: &mut Session,
                        history: &mut [Message],
                        edits: &mut Vec<(usize, Message)>,
                        update: Update| {
            let view = selected.then(|| history.to_vec());
            swap_edits(history, edits);
            match view {
                Some(view) => {
                    let (view, selected) = this.checked(history, view, &mut Vec::new());
                    this.prepare_with(history, view, selected, update)
                }
                None => this.prepare_with(history, None, false, update),
            }
        };
        if selected && !validate(history, self.options.profile).is_empty() {
            let mut update = update;
            let view = history.to_vec();
            swap_edits(history, &mut edits);
            let (view, selected) = self.checked(history, view, &mut update.notices);
            return InPlace::Prepared(self.prepare_with(history, view, selected, update));
        }
        let window = self.engine.state().context_length;
        let mut measured = None;
        if !self.awaiting_usage {
            let rough = self.counter.count_messages(history) as u64;
            if self.engine.should_compress_preflight(history) || (window > 0 && rough > window) {
                return InPlace::Prepared(full_way(self, history, &mut edits, update));
            }
            measured = Some(rough);
            if !self.engine.should_defer_preflight_to_real_usage(rough) {
                let decision = self.engine.should_compress_info(Some(rough));
                if let Some(reason) = decision.block_reason {
                    held_back(&mut update, Trigger::Preflight, &reason);
                }
            }
        }
        let request_tokens =
            measured.unwrap_or_else(|| self.counter.count_messages(history) as u64);
        if window > 0 && request_tokens > window {
            return InPlace::Prepared(full_way(self, history, &mut edits, update));
        }
        self.calls_this_turn = self.calls_this_turn.saturating_add(1);
        self.last_request_tokens = request_tokens;
        InPlace::Applied(Applied {
            originals: edits,
            selected,
            request_tokens,
            update,
        })
    }

    /// The rest of [`before_request`](Self::before_request) once the
    /// engine's view (`view`, checked) is known.
    fn prepare_with(
        &mut self,
        history: &[Message],
        mut view: Option<Vec<Message>>,
        mut selected: bool,
        mut update: Update,
    ) -> Prepared {
        // Tokens of the request as it now stands, when already counted:
        // counting is the costly part of this hot path, so never twice.
        let mut measured = None;
        if !self.awaiting_usage {
            let request = view.as_deref().unwrap_or(history);
            let rough = self.counter.count_messages(request) as u64;
            measured = Some(rough);
            if self.engine.should_compress_preflight(request) {
                let tokens = match view {
                    Some(_) => self.counter.count_messages(history) as u64,
                    None => rough,
                };
                self.compact(
                    history,
                    tokens,
                    Trigger::Preflight,
                    self.automatic_request(),
                    &mut update,
                );
                let window = self.engine.state().context_length;
                if update
                    .missed
                    .as_ref()
                    .is_some_and(|m| m.kind == MissedKind::Deferred)
                    && window > 0
                    && rough > window
                {
                    // The prepared summary is not ready and the request
                    // would not fit at all: the deterministic summary now.
                    update.missed = None;
                    let request = CompressRequest::new().with_summary(SummarySource::Deterministic);
                    self.compact(history, tokens, Trigger::Preflight, request, &mut update);
                }
                if let Some(new) = &update.new_history {
                    (view, selected) = self.select(new, &mut update.notices);
                    measured = match (&view, &update.compaction) {
                        (None, Some(c)) => Some(c.tokens_after),
                        _ => None,
                    };
                }
            } else if !self.engine.should_defer_preflight_to_real_usage(rough) {
                let decision = self.engine.should_compress_info(Some(rough));
                if let Some(reason) = decision.block_reason {
                    held_back(&mut update, Trigger::Preflight, &reason);
                }
            }
        }
        let base = update.new_history.as_deref().unwrap_or(history);
        let mut request = view.unwrap_or_else(|| base.to_vec());
        let mut request_tokens =
            measured.unwrap_or_else(|| self.counter.count_messages(&request) as u64);
        // Never over the window: what compaction and selection left over
        // it is fitted (a view; the history keeps every original).
        let (mut steps, mut unfittable) = (Vec::new(), None);
        let window = self.engine.state().context_length;
        if window > 0 && request_tokens > window {
            let originals = originals_of(&request, base);
            match self.fit_request(&request, &originals, window) {
                Ok(fitted) => match self.check_output(base, &fitted.messages) {
                    Ok(()) => {
                        self.archive_left_out(&fitted, &originals, &mut update.notices);
                        request = fitted.messages;
                        request_tokens = fitted.tokens_after;
                        steps = fitted.steps;
                        selected = true;
                    }
                    Err(why) => update.notices.push(Notice::warning(format!(
                        "the request is over the window and its fitted form was rejected: {why}"
                    ))),
                },
                Err(e) => {
                    // Whether it is sent is the caller's decision
                    // (`Prepared::unfittable`): the notice says only what is.
                    update.notices.push(Notice::warning(format!(
                        "the request cannot fit the window: {e}"
                    )));
                    unfittable = Some(e);
                }
            }
        }
        self.calls_this_turn = self.calls_this_turn.saturating_add(1);
        self.last_request_tokens = request_tokens;
        Prepared {
            request,
            selected,
            request_tokens,
            update,
            fit: steps,
            unfittable,
        }
    }

    /// `request` fitted under the compaction threshold (room for the next
    /// turns), else under the `window` itself.
    fn fit_request(
        &self,
        request: &[Message],
        originals: &[Message],
        window: u64,
    ) -> Result<Fitted, Unfittable> {
        let threshold = self.engine.state().threshold_tokens;
        let counter = self.counter.as_ref();
        let profile = self.options.profile;
        let actions = &self.options.text_actions;
        // Without a store, no note: its handle would name nothing.
        let Some(_) = &self.store else {
            return match (threshold > 0 && threshold < window)
                .then(|| fit(request, threshold, counter, profile, actions).ok())
                .flatten()
            {
                Some(f) => Ok(f),
                None => fit(request, window, counter, profile, actions),
            };
        };
        // The first that names what it left out with the asks among them,
        // else the handle alone: under the threshold (room for the next
        // turns), then under the window.
        let mut budgets = vec![window];
        if threshold > 0 && threshold < window {
            budgets.insert(0, threshold);
        }
        // A request that cannot fit under the threshold may still fit the
        // window: only the window says that no request can fit.
        let mut fallback = None;
        for require_asks in [true, false] {
            for &budget in &budgets {
                match fit_noted(
                    request,
                    originals,
                    budget,
                    counter,
                    profile,
                    actions,
                    require_asks,
                ) {
                    Ok(f) if f.left_out.is_empty() || f.archive_handle.is_some() => return Ok(f),
                    Ok(f) => fallback = fallback.or(Some(f)),
                    Err(_) => {}
                }
            }
        }
        match fallback {
            Some(f) => Ok(f),
            None => fit(request, window, counter, profile, actions),
        }
    }

    /// With a store, archives the originals of what the fitted request left
    /// out or cut, under the handle its note names, so nothing that leaves
    /// a request is lost (the history keeps them too; the archive is what
    /// the handle reaches after a later compaction). A store that cannot
    /// commit leaves the request as fitted, with a warning.
    fn archive_left_out(&self, fitted: &Fitted, originals: &[Message], notices: &mut Vec<Notice>) {
        if self.store.is_none() || fitted.left_out.is_empty() {
            return;
        }
        let gone: Vec<Message> = fitted
            .left_out
            .iter()
            .filter_map(|&i| originals.get(i).cloned())
            .collect();
        let (Some(&first), Some(&last)) = (fitted.left_out.first(), fitted.left_out.last()) else {
            return;
        };
        let mut batch = Batch::new();
        batch.archive_span(&gone, first, last + 1);
        if let Err(e) = self.commit(batch) {
            notices.push(Notice::warning(format!(
                "session store: cannot archive what the request left out to fit the window: {e}"
            )));
        }
    }

    /// Tokens of the request `history` would be sent as (after selection).
    fn request_tokens(&mut self, history: &[Message]) -> u64 {
        let mut scratch = Vec::new();
        match self.select(history, &mut scratch).0 {
            Some(view) => self.counter.count_messages(&view) as u64,
            None => self.counter.count_messages(history) as u64,
        }
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
                self.commit(batch)
                    .map_err(|e| format!("session store cannot archive it: {e}"))
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
    fn automatic_request(&self) -> CompressRequest {
        match self.options.summary_watermark {
            Some(_) => CompressRequest::new().with_summary(SummarySource::Prepared),
            None => CompressRequest::new(),
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
        if self.awaiting_usage || !summary_due(self.last_request_tokens, threshold, watermark) {
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
        let ctx = ToolCallContext::default().with_messages(history);
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

    /// Runs up to `max_passes` compaction passes on `history`, accepting
    /// each valid result; records everything in `update`.
    fn compact(
        &mut self,
        history: &[Message],
        tokens: u64,
        trigger: Trigger,
        request: CompressRequest,
        update: &mut Update,
    ) {
        let started = Instant::now();
        let mut current: Option<Vec<Message>> = None;
        let mut current_tokens = tokens;
        let mut passes = 0;
        let mut reports = Vec::new();
        // With a store: what each pass removed, committed with the state
        // once the compaction is accepted, before the caller sees it.
        let archiving = self.store.is_some();
        let before = archiving.then(|| self.engine.snapshot());
        let mut batch = Batch::new();
        while passes < self.options.max_passes.max(1) {
            let input = current.as_deref().unwrap_or(history);
            let request = request
                .clone()
                .with_current_tokens(current_tokens)
                .with_archive(archiving);
            let out = match self.engine.compress(input, &request) {
                Ok(compaction) => {
                    reports.push(compaction.report);
                    compaction.messages
                }
                Err(EngineError::SummaryNotReady { .. }) if passes == 0 => {
                    update.missed = Some(Missed {
                        trigger,
                        kind: MissedKind::Deferred,
                        reason: "the summary prepared in the background is not ready".into(),
                    });
                    break;
                }
                Err(EngineError::SummaryNotReady { .. }) => break,
                Err(err) => {
                    if passes == 0 || !matches!(err, EngineError::NothingToCompress { .. }) {
                        update.notices.push(error_notice(&err, trigger));
                    }
                    if passes == 0 {
                        update.missed = Some(Missed {
                            trigger,
                            kind: MissedKind::of(&err),
                            reason: err.to_string(),
                        });
                    }
                    break;
                }
            };
            if let Err(why) = self.check_output(input, &out) {
                reports.pop();
                let reason = format!(
                    "engine `{}`: compaction result rejected, history unchanged: {why}",
                    self.engine.name()
                );
                update.notices.push(Notice::warning(reason.clone()));
                if passes == 0 {
                    update.missed = Some(Missed {
                        trigger,
                        kind: MissedKind::Refused,
                        reason,
                    });
                }
                break;
            }
            let after = self.counter.count_messages(&out) as u64;
            if archiving {
                let report = reports.last();
                let mut info = CompactionInfo::new(
                    self.recorded + u64::from(passes) + 1,
                    trigger_name(trigger),
                    self.engine.name(),
                )
                .with_summarizer(report.and_then(|r| r.summarizer.clone()))
                .with_tokens(current_tokens, after);
                if let Some(span) = report.and_then(|r| r.summarized) {
                    info = info.with_span(span.start, span.end, report.and_then(|r| r.pinned));
                }
                batch.compaction(input, &out, &info);
            }
            passes += 1;
            let saved = current_tokens.saturating_sub(after) as f64 / current_tokens.max(1) as f64;
            current = Some(out);
            current_tokens = after;
            if trigger == Trigger::Manual
                || saved < self.options.min_pass_savings
                || !self.engine.should_compress(Some(after))
            {
                break;
            }
        }
        let Some(out) = current else { return };
        // A compaction never makes the request bigger: compare the request
        // that would have gone out with the one that will.
        let request_before = self.request_tokens(history);
        let request_after = self.request_tokens(&out);
        if request_after >= request_before {
            update.notices.push(Notice::warning(format!(
                "engine `{}`: compaction rejected, history unchanged: the request would not be smaller ({request_before} -> {request_after} tokens)",
                self.engine.name()
            )));
            return;
        }
        let history_tokens = self.counter.count_messages(history) as u64;
        if archiving {
            let recorded = self.recorded;
            self.recorded += u64::from(passes);
            let awaiting = self.awaiting_usage;
            self.awaiting_usage = true;
            if let Err(e) = self.commit(batch) {
                // Nothing may be lost: without its archive the compaction
                // is not accepted, and the engine forgets it happened.
                self.recorded = recorded;
                self.awaiting_usage = awaiting;
                if let Some(before) = &before {
                    let _ = self.engine.restore(before);
                }
                update.notices.push(Notice::warning(format!(
                    "compaction not applied, history unchanged: the session store cannot archive it: {e}"
                )));
                return;
            }
        }
        let compaction = Compaction {
            trigger,
            passes,
            tokens_before: history_tokens,
            tokens_after: current_tokens,
            request_tokens_before: request_before,
            request_tokens_after: request_after,
            messages_before: history.len(),
            messages_after: out.len(),
            elapsed: started.elapsed(),
            reports,
        };
        self.awaiting_usage = true;
        let text = format!(
            "Compacted the conversation: {} → {} tokens, {} → {} messages.",
            history_tokens,
            current_tokens,
            history.len(),
            out.len()
        );
        let notice = match trigger {
            Trigger::Manual => Some(Notice {
                kind: NoticeKind::Manual,
                text,
            }),
            Trigger::Preflight | Trigger::PostTool => {
                let phase = if trigger == Trigger::Preflight {
                    CompactionPhase::Preflight
                } else {
                    CompactionPhase::Compress
                };
                let mut context = CompactionStatusContext::default().with_approx_tokens(tokens);
                let threshold = self.engine.state().threshold_tokens;
                if threshold > 0 {
                    context = context.with_threshold_tokens(threshold);
                }
                automatic_compaction_status_message(self.engine.as_ref(), phase, &text, &context)
                    .map(|text| Notice {
                        kind: NoticeKind::Status,
                        text,
                    })
            }
        };
        update.notices.extend(notice);
        update.new_history = Some(out);
        update.compaction = Some(compaction);
    }

    /// `select_context` for `base`, failing open on an empty or invalid view.
    fn select(
        &mut self,
        base: &[Message],
        notices: &mut Vec<Notice>,
    ) -> (Option<Vec<Message>>, bool) {
        let budget = self.engine.state().context_length;
        let mut request = SelectRequest::new(base, base);
        if budget > 0 {
            request = request.with_budget_tokens(budget);
        }
        match self.engine.select_context(&request) {
            None => (None, false),
            Some(view) => self.checked(base, view, notices),
        }
    }

    /// An engine's request view of `base`, kept when acceptable
    /// ([`check_output`](Self::check_output)), else dropped with a notice.
    fn checked(
        &self,
        base: &[Message],
        view: Vec<Message>,
        notices: &mut Vec<Notice>,
    ) -> (Option<Vec<Message>>, bool) {
        match self.check_output(base, &view) {
            Ok(()) => (Some(view), true),
            Err(why) => {
                notices.push(Notice::warning(format!(
                    "engine `{}`: context selection ignored, sending the history as is: {why}",
                    self.engine.name()
                )));
                (None, false)
            }
        }
    }

    /// An engine output is acceptable when it is not empty (for a
    /// non-empty input) and adds no provider-rule violation.
    fn check_output(&self, input: &[Message], output: &[Message]) -> Result<(), String> {
        if output.is_empty() && !input.is_empty() {
            return Err("the engine returned no messages".into());
        }
        match introduced_violation(input, output, self.options.profile) {
            Some(v) => Err(v.to_string()),
            None => Ok(()),
        }
    }
}

/// How a compaction record names its trigger.
fn trigger_name(trigger: Trigger) -> &'static str {
    match trigger {
        Trigger::Preflight => "preflight",
        Trigger::PostTool => "post_tool",
        Trigger::Manual => "manual",
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

/// The context is over the threshold but the engine holds compaction back.
fn held_back(update: &mut Update, trigger: Trigger, reason: &impl std::fmt::Display) {
    update.notices.push(Notice::warning(format!(
        "context is over the compaction threshold, but compaction is held back: {reason}"
    )));
    update.missed = Some(Missed {
        trigger,
        kind: MissedKind::Blocked,
        reason: reason.to_string(),
    });
}

fn error_notice(err: &EngineError, trigger: Trigger) -> Notice {
    match err {
        EngineError::NothingToCompress { .. } if trigger == Trigger::Manual => Notice {
            kind: NoticeKind::Manual,
            text: format!("Nothing to compress: {err}"),
        },
        _ => Notice::warning(format!("compaction failed, history unchanged: {err}")),
    }
}

/// The stored original of each message of `request` (a view of `history`):
/// a digested tool result's original is the history's result with the same
/// call id; any other message is its own.
fn originals_of(request: &[Message], history: &[Message]) -> Vec<Message> {
    let by_id: std::collections::HashMap<&str, &Message> = history
        .iter()
        .filter(|m| m.is_tool_result())
        .filter_map(|m| Some((m.tool_call_id.as_deref()?, m)))
        .collect();
    request
        .iter()
        .map(|m| {
            m.tool_call_id
                .as_deref()
                .filter(|_| m.is_tool_result())
                .and_then(|id| by_id.get(id))
                .map_or_else(|| m.clone(), |&o| o.clone())
        })
        .collect()
}
