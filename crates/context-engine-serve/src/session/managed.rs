//! One session driven through the library's host driver: what the proxy
//! does with each request's messages and each response's usage.

use std::sync::Arc;

use context_engine::engine::{PreparedSummary, SessionInfo, SummaryJob, Usage};
use context_engine::host::{self, Compaction, HostOptions, InPlace, Notice};
use context_engine::message::{Message, Role};
use context_engine::tokens::TokenCounter;
use context_engine::validate::{
    introduced_violation, is_real_user_turn, is_reentry_with, validate,
};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use super::EngineFactory;
use super::SessionError;
use super::calls::ClientTokens;
use super::lineage::{self, Lineage, Reconcile};
use super::persist::Staged;

/// What every session of a server shares.
pub struct SessionContext {
    /// Builds each session's engine.
    pub factory: Arc<dyn EngineFactory>,
    /// Counts tokens for the driver (shared cache).
    pub counter: Arc<dyn TokenCounter>,
    /// The driver's options (provider profile included).
    pub host: HostOptions,
    /// The engine may block on I/O (a model summarizer, a plugin process):
    /// its steps then run on the runtime's bounded blocking pool instead of
    /// an async worker.
    pub blocking: bool,
}

impl std::fmt::Debug for SessionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionContext")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

/// Per-session figures, for `/ctx/sessions/{id}`.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SessionStats {
    /// Chat requests seen.
    pub requests: u64,
    /// Requests sent managed.
    pub managed: u64,
    /// Requests sent unmanaged (fail open).
    pub fallbacks: u64,
    /// Why the last unmanaged request was not managed.
    pub last_fallback: Option<String>,
    /// Lineages started by diverging client histories.
    pub new_lineages: u64,
    /// Compactions accepted.
    pub compactions: u64,
    /// Background summaries started.
    pub background_started: u64,
    /// Background summaries that arrived and were handed to the engine.
    pub background_summaries: u64,
    /// Of those, the ones a model call wrote (`summarizer.kind:
    /// upstream`), and the tokens the upstream reported for them: the
    /// engine's own spend, apart from the agent's.
    pub summary_calls: u64,
    /// Prompt tokens of those summary calls.
    pub summary_prompt_tokens: u64,
    /// Completion tokens of those summary calls.
    pub summary_completion_tokens: u64,
    /// Why the last summary call failed, if it did (the extractive
    /// summary then stands in).
    pub last_summary_failure: Option<String>,
    /// Who wrote the last compaction's summary (`extractive`,
    /// `upstream`, `openai:M`, ...).
    pub last_summarizer: Option<String>,
    /// Why the last compaction's summary is not the model's, when it is
    /// not (a failed or refused call, one not ready in time).
    pub last_summary_fallback: Option<String>,
    /// Prompt tokens the upstream reported, summed.
    pub prompt_tokens: u64,
    /// Completion tokens the upstream reported, summed.
    pub completion_tokens: u64,
    /// Tokens of the last managed request, counted.
    pub last_request_tokens: u64,
    /// Messages in the client's last request and in the managed one.
    pub last_client_messages: usize,
    /// Messages in the last managed request.
    pub last_managed_messages: usize,
    /// Times the session went to sleep idle ([`Managed::hibernate`]).
    pub sleeps: u64,
    /// Tokens of the client's last history, counted (with the request's
    /// overhead, as `last_request_tokens`).
    pub last_client_tokens: u64,
}

/// A background summary as it comes back to its session: the engine's
/// result and, when a model call wrote it, what that call spent.
#[derive(Debug)]
pub struct Background {
    /// For the engine.
    pub summary: PreparedSummary,
    /// The model call, if one was made.
    pub spent: Option<crate::summarizer::Spent>,
}

/// What [`Managed::prepare`] produced for one request.
#[derive(Debug)]
pub struct Plan {
    /// The managed `messages` array, as JSON text.
    pub messages_json: String,
    /// Bytes of it identical to the session's previous request.
    pub reused_bytes: usize,
    /// A compaction accepted for this request.
    pub compaction: Option<Compaction>,
    /// The client's history diverged and a new lineage started.
    pub diverged: bool,
    /// What the driver had to say (logged).
    pub notices: Vec<Notice>,
    /// A summary to prepare in the background (the prompt reached the
    /// summary watermark); the caller runs it off the request path and
    /// hands the receiver to [`Managed::await_summary`].
    pub summary_job: Option<SummaryJob>,
    /// The managed request's messages (what `messages_json` holds); empty
    /// from [`Managed::prepare_json`] when the view was applied in place.
    pub request: Vec<Message>,
    /// Tokens of the client's history, counted (the page's "sent by the
    /// client").
    pub client_tokens: u64,
    /// Tokens of the managed request, counted.
    pub request_tokens: u64,
    /// The engine's view replaced the request (digests).
    pub selected: bool,
    /// Tool results a proactive prune shortened for this request.
    pub pruned: usize,
}

/// One session: the host driver, the managed history and its figures.
pub struct Managed {
    ctx: Arc<SessionContext>,
    id: String,
    host: host::Session,
    lineage: Lineage,
    calls: u64,
    /// The background summary on its way, if one is being prepared.
    pending: Option<oneshot::Receiver<Background>>,
    /// The model the requests name ([`use_model`](Self::use_model)).
    model: Option<String>,
    /// The figures shown by `/ctx/sessions/{id}`.
    pub stats: SessionStats,
    /// With a session store: the staging store the host commits to and
    /// the version of the stored record this copy matches.
    stored: Option<(Arc<Staged>, u64)>,
    /// The last version check found this copy current: this instance is
    /// the session's only writer lately, so the next step may run on the
    /// copy and let the compare-and-swap tell ([`persist`](super::persist)).
    current: bool,
    /// The instance whose response to this session's last step has not
    /// been settled yet (its usage is on the way): stored with the record,
    /// so that another instance waits for it ([`persist`](super::persist)).
    awaiting: Option<String>,
    /// The tokens of the client's history, message by message.
    client: ClientTokens,
}

impl std::fmt::Debug for Managed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed")
            .field("id", &self.id)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

impl Managed {
    /// A new session `id` with a fresh engine.
    pub fn new(ctx: Arc<SessionContext>, id: &str) -> Result<Managed, SessionError> {
        let host = new_host(&ctx, id)?;
        Ok(Managed {
            ctx,
            id: id.to_owned(),
            host,
            lineage: Lineage::default(),
            calls: 0,
            pending: None,
            model: None,
            stats: SessionStats::default(),
            stored: None,
            current: false,
            awaiting: None,
            client: ClientTokens::default(),
        })
    }

    /// The host driver (engine status, tools).
    pub fn host(&self) -> &host::Session {
        &self.host
    }

    /// The host driver, mutably (engine tools).
    pub fn host_mut(&mut self) -> &mut host::Session {
        &mut self.host
    }

    /// The managed history (empty while the session sleeps: see
    /// [`managed_messages`](Self::managed_messages)).
    pub fn history(&self) -> &[Message] {
        self.lineage.messages()
    }

    /// Messages in the managed history, asleep or awake.
    pub fn managed_messages(&self) -> usize {
        self.lineage.len()
    }

    /// Approximate heap bytes of the managed history and bookkeeping.
    pub fn heap_bytes(&self) -> usize {
        self.lineage.heap_bytes()
    }

    /// Whether the session sleeps ([`hibernate`](Self::hibernate)).
    pub fn is_asleep(&self) -> bool {
        self.lineage.is_asleep()
    }

    /// Puts an idle session to sleep: the managed history keeps only its
    /// frozen texts, deflated, and drops the parsed messages; the engine
    /// and the driver stay as they are, so the next request (which wakes
    /// it) gets the same decisions and the same bytes as if it never
    /// slept. A background summary that arrived is adopted first; one
    /// still on its way keeps the session awake (`false`).
    pub fn hibernate(&mut self) -> bool {
        if self.lineage.is_asleep() {
            return true;
        }
        self.take_summary();
        if self.pending.is_some() {
            return false;
        }
        self.lineage.sleep();
        if self.lineage.is_asleep() {
            self.stats.sleeps += 1;
        }
        self.lineage.is_asleep()
    }

    /// Wakes a sleeping session (parses its managed history again). Texts
    /// that cannot be read back (never expected) start the session over
    /// from the client's history, as a dropped session would.
    fn wake(&mut self) -> Result<(), SessionError> {
        if let Err(why) = self.lineage.wake() {
            tracing::warn!(session = %self.id, reason = %why, "sleeping session unreadable: it starts over");
            self.lineage = Lineage::default();
            self.host = self.fresh_host()?;
            self.calls = 0;
            self.pending = None;
        }
        Ok(())
    }

    /// Takes the client's full history (`raw`, each message as the client
    /// wrote it) and returns the managed request. On `Err` the caller sends
    /// the client's request unmanaged; the reason says why.
    pub fn prepare(&mut self, raw: &[&RawValue]) -> Result<Plan, SessionError> {
        self.prepare_as(raw, true)
    }

    /// [`prepare`](Self::prepare) for a caller that sends
    /// [`Plan::messages_json`] only (chat completions): [`Plan::request`]
    /// is left empty when the engine's view could be applied in place, so
    /// the managed history is not copied for the request.
    pub fn prepare_json(&mut self, raw: &[&RawValue]) -> Result<Plan, SessionError> {
        self.prepare_as(raw, false)
    }

    pub(crate) fn prepare_as(
        &mut self,
        raw: &[&RawValue],
        keep_request: bool,
    ) -> Result<Plan, SessionError> {
        self.wake()?;
        self.stats.requests += 1;
        self.take_summary();
        self.stats.last_client_messages = raw.len();
        let chain = lineage::chain(raw);
        let (new_from, diverged) = self.reconcile(&chain)?;
        let mut step = self.take_new(raw, &chain, new_from)?;
        self.host.start(&SessionInfo::default());
        if let Some(model) = &self.model {
            // The window of the model this request names.
            self.host.use_model(model);
        }
        let (rendered, request) = self.before_request(raw, keep_request, &mut step)?;
        if step.compaction.is_some() {
            self.stats.compactions += 1;
        }
        let summary_job = match self.pending {
            Some(_) => None,
            None => self.host.summary_job(self.lineage.messages()),
        };
        Ok(Plan {
            messages_json: rendered.json,
            reused_bytes: rendered.reused_bytes,
            compaction: step.compaction,
            diverged,
            notices: step.notices,
            summary_job,
            request,
            client_tokens: self.stats.last_client_tokens,
            request_tokens: self.stats.last_request_tokens,
            selected: step.selected,
            pruned: step.pruned,
        })
    }

    /// Matches the client's history (`chain`, its messages' hashes) with
    /// the lineage: where the new messages start, and whether the history
    /// diverged (a new lineage; the engine starts over when it dropped what
    /// the engine made).
    fn reconcile(&mut self, chain: &[u128]) -> Result<(usize, bool), SessionError> {
        Ok(match self.lineage.reconcile(chain) {
            Reconcile::Extends { new_from } => (new_from, false),
            Reconcile::Diverged {
                new_from,
                dropped_engine_made,
                ..
            } => {
                self.stats.new_lineages += 1;
                if dropped_engine_made {
                    // The engine's state (its previous summary) belongs to
                    // the old lineage: start the engine over. What the
                    // lineage kept derives only from the common messages.
                    self.host = self.fresh_host()?;
                    self.calls = 0;
                    // A summary on its way describes the old lineage.
                    self.pending = None;
                }
                (new_from, true)
            }
        })
    }

    /// Parses the client's messages from `new_from` and adds them to the
    /// lineage in the reference host's order (and of `ctx replay`): the
    /// reply to the previous call, then its tool results (post-tool check
    /// and prune), then a new user turn closes the previous turn.
    fn take_new(
        &mut self,
        raw: &[&RawValue],
        chain: &[u128],
        new_from: usize,
    ) -> Result<Step, SessionError> {
        // Parse everything new before touching the lineage. The last
        // managed message goes first, as context: whether a user message
        // is a tool observation depends on the action before it.
        let context = usize::from(new_from > 0 && !self.lineage.messages().is_empty());
        let mut batch: Vec<Message> = self
            .lineage
            .messages()
            .last()
            .cloned()
            .into_iter()
            .take(context)
            .collect();
        for (i, m) in raw.iter().enumerate().skip(new_from) {
            batch.push(parse(m, i)?);
        }
        let counter = self.ctx.counter.as_ref();
        self.stats.last_client_tokens =
            self.client
                .update(raw, new_from, &batch[context..], counter)
                + counter.request_overhead() as u64;
        let mut step = Step::default();
        let replies = batch[context..]
            .iter()
            .take_while(|m| m.role == Role::Assistant)
            .count();
        let actions = &self.ctx.host.text_actions;
        let tools = (context + replies..batch.len())
            .take_while(|&k| batch[k].is_tool_result() || is_reentry_with(&batch, k, actions))
            .count();
        let real_user_turn =
            (context + replies + tools..batch.len()).any(|k| is_real_user_turn(&batch, k, actions));
        let mut rest = batch.into_iter().skip(context).zip(new_from..);
        for (m, i) in rest.by_ref().take(replies + tools) {
            self.lineage.push_client(m, raw[i], i);
        }
        if self.calls > 0 && tools > 0 {
            self.lineage.set_chain(&chain[..new_from + replies + tools]);
            let update = self.host.after_tools(self.lineage.messages());
            step.pruned += update.pruned;
            step.notices.extend(update.notices);
            if let Some(h) = update.new_history {
                self.lineage.replace(h);
            }
            step.compaction = update.compaction;
        }
        if self.calls > 0 && real_user_turn {
            self.host
                .turn_complete(self.lineage.messages(), &Default::default());
        }
        for (m, i) in rest {
            self.lineage.push_client(m, raw[i], i);
        }
        self.lineage.set_chain(chain);
        Ok(step)
    }

    /// The engine's step before the call: the managed request, rendered
    /// (and its messages when `keep_request`), never one that breaks a
    /// provider rule the client's own request kept.
    fn before_request(
        &mut self,
        raw: &[&RawValue],
        keep_request: bool,
        step: &mut Step,
    ) -> Result<(lineage::Rendered, Vec<Message>), SessionError> {
        let profile = self.ctx.host.profile;
        match self
            .host
            .before_request_in_place(self.lineage.view_in_place())
        {
            InPlace::Applied(mut applied) => {
                // The managed history is the request now (the engine's
                // view swapped in, validated by the driver); rendered
                // without a copy, then restored.
                step.notices.append(&mut applied.update.notices);
                step.selected = applied.selected;
                step.pruned += applied.update.pruned;
                self.calls += 1;
                // A view the driver swapped in is valid; the history as it
                // stands (no view) is checked as any request is. (Without
                // a view nothing was swapped in: nothing to restore.)
                if !applied.selected && !validate(self.lineage.messages(), profile).is_empty() {
                    check_introduced(raw, self.lineage.messages(), profile)?;
                }
                self.stats.last_request_tokens = applied.request_tokens;
                self.stats.last_managed_messages = self.lineage.len();
                let rendered = self.lineage.render_applied(&applied.originals);
                let request = if keep_request {
                    self.lineage.messages().to_vec()
                } else {
                    Vec::new()
                };
                applied.restore(self.lineage.view_in_place());
                Ok((rendered, request))
            }
            InPlace::Prepared(prepared) => {
                step.selected = prepared.selected;
                step.pruned += prepared.update.pruned;
                step.notices.extend(prepared.update.notices);
                if let Some(e) = &prepared.unfittable {
                    // A proxy does not drop a call: the managed request, the
                    // smallest the engine made, goes out over the window and
                    // the upstream answers it (or says it is too long).
                    step.notices.push(Notice {
                        kind: host::NoticeKind::Warning,
                        text: format!("sent over the window as managed, the upstream decides: {e}"),
                    });
                }
                if let Some(h) = prepared.update.new_history {
                    self.lineage.replace(h);
                }
                if prepared.update.compaction.is_some() {
                    step.compaction = prepared.update.compaction;
                }
                self.calls += 1;
                if !validate(&prepared.request, profile).is_empty() {
                    check_introduced(raw, &prepared.request, profile)?;
                }
                self.stats.last_request_tokens = prepared.request_tokens;
                self.stats.last_managed_messages = prepared.request.len();
                Ok((self.lineage.render(&prepared.request), prepared.request))
            }
        }
    }

    /// Leading messages of `request` (this session's managed request) the
    /// next request should carry as they are: where a front marks
    /// Anthropic's prompt cache (see
    /// [`context_engine::host::Session::stable_prefix`]).
    pub fn stable_prefix(&self, request: &[Message]) -> usize {
        self.host.stable_prefix(request)
    }

    /// The next requests name `model` (the request's `model` field): the
    /// engine manages the window `context.model_windows` gives it, else
    /// the configured one (see [`host::Session::use_model`]).
    pub fn use_model(&mut self, model: Option<String>) {
        self.model = model;
    }

    /// The model the last request named.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The background summary of [`Plan::summary_job`] will arrive on
    /// `summary`; it is adopted by the first request that finds it ready.
    pub fn await_summary(&mut self, summary: oneshot::Receiver<Background>) {
        self.stats.background_started += 1;
        self.pending = Some(summary);
    }

    /// Whether a background summary is on its way.
    pub fn summary_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Adopts the background summary if it has arrived; forgets it if its
    /// job was dropped. The engine checks that it still describes the
    /// history when it uses it.
    fn take_summary(&mut self) {
        let Some(rx) = self.pending.as_mut() else {
            return;
        };
        match rx.try_recv() {
            Ok(Background { summary, spent }) => {
                self.pending = None;
                self.stats.background_summaries += 1;
                if let Some(spent) = spent {
                    self.stats.summary_calls += 1;
                    self.stats.summary_prompt_tokens += spent.stats.prompt_tokens.unwrap_or(0);
                    self.stats.summary_completion_tokens +=
                        spent.stats.completion_tokens.unwrap_or(0);
                    self.stats.last_summary_failure = spent.failure;
                }
                self.host.adopt_summary(summary);
            }
            Err(oneshot::error::TryRecvError::Empty) => {}
            Err(oneshot::error::TryRecvError::Closed) => self.pending = None,
        }
    }

    /// The managed request a client history `raw` would get now, without
    /// running the engine or recording anything: the managed history and
    /// the client's messages past it, when `raw` extends what the session
    /// saw (`None` otherwise: the client's own messages then stand).
    pub fn peek(&self, raw: &[&RawValue]) -> Option<Vec<Message>> {
        let chain = lineage::chain(raw);
        let seen = self.lineage.consumed();
        if seen == 0 || chain.len() < seen || chain[..seen] != self.lineage.chain()[..] {
            return None;
        }
        let mut out = self.lineage.parsed().ok()?.into_owned();
        for (i, m) in raw.iter().enumerate().skip(seen) {
            out.push(parse(m, i).ok()?);
        }
        Some(out)
    }

    /// The provider's usage of the call just made.
    pub fn after_response(&mut self, usage: &Usage) {
        self.bill(usage);
        self.host.after_response(usage);
    }

    /// Counts a call's usage in the session's stats only: an engine-tool
    /// round resolved in the proxy, whose prompt the next round's
    /// supersedes for the engine.
    pub fn bill(&mut self, usage: &Usage) {
        self.stats.prompt_tokens += usage.prompt_tokens;
        self.stats.completion_tokens += usage.completion_tokens;
    }
}

fn new_host(ctx: &SessionContext, id: &str) -> Result<host::Session, SessionError> {
    let engine = create_engine(ctx, id)?;
    Ok(host::Session::new(id, engine, Arc::clone(&ctx.counter)).with_options(ctx.host.clone()))
}

/// Session `id`'s engine, from the server's factory.
fn create_engine(
    ctx: &SessionContext,
    id: &str,
) -> Result<Box<dyn context_engine::engine::ContextEngine>, SessionError> {
    ctx.factory
        .create(id)
        .map_err(|error| SessionError::EngineStart {
            session: id.to_owned(),
            error,
        })
}

fn parse(raw: &RawValue, index: usize) -> Result<Message, SessionError> {
    serde_json::from_str(raw.get()).map_err(|error| SessionError::Message { index, error })
}

/// What one step gathered on its way to the request.
#[derive(Default)]
struct Step {
    compaction: Option<Compaction>,
    notices: Vec<Notice>,
    selected: bool,
    pruned: usize,
}

/// Refuses `request` when it breaks a provider rule the client's own
/// request (`raw`) kept.
fn check_introduced(
    raw: &[&RawValue],
    request: &[Message],
    profile: context_engine::validate::Profile,
) -> Result<(), SessionError> {
    let unmanaged: Vec<Message> = raw
        .iter()
        .enumerate()
        .map(|(i, m)| parse(m, i))
        .collect::<Result<_, _>>()?;
    match introduced_violation(&unmanaged, request, profile) {
        Some(v) => Err(SessionError::Violation(v)),
        None => Ok(()),
    }
}

impl Managed {
    /// Runs engine tool `name` on the managed history; `None` when it is
    /// not an engine tool.
    pub fn handle_tool_call(&mut self, name: &str, args: &str) -> Option<String> {
        // Awake already (a tool call answers the request being served).
        self.wake().ok()?;
        self.host
            .handle_tool_call(name, args, self.lineage.messages())
    }
}

/// The proxy's own part of a stored session record.
#[derive(Serialize, serde::Deserialize)]
struct ServeState {
    calls: u64,
    stats: SessionStats,
    /// See [`Managed::awaiting`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    awaiting: Option<String>,
    /// The digest of the stored lineage ([`RecordPrints::digest`], hex):
    /// a copy that applies only the segments written since its version
    /// checks what it built against it.
    ///
    /// [`RecordPrints::digest`]: super::lineage::RecordPrints::digest
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lineage: Option<String>,
}

impl Managed {
    /// A session kept in a store: `store_id` names it there, `staged` is
    /// the staging store its host commits to; `record` is the stored
    /// record to resume from (`None`: a new session).
    pub(crate) fn stored(
        ctx: Arc<SessionContext>,
        store_id: &str,
        staged: Arc<Staged>,
        record: Option<super::persist::Loaded>,
    ) -> Result<Managed, SessionError> {
        let (version, state, history) = match record {
            Some(r) => (r.version, Some(r.state), r.history),
            None => (0, None, Vec::new()),
        };
        let lineage = Lineage::from_segments(&history)?;
        let mark = super::persist::HistoryMark::loaded(&lineage, &history);
        Self::restore(ctx, store_id, staged.inner(), version, state, lineage, mark)
    }

    /// This copy brought to stored `version`, whose history is the
    /// copy's first `from` segments and then `segments` (what
    /// [`Since::Appended`](context_engine::store::Since::Appended)
    /// answers): the segments applied to the copy's lineage, checked
    /// against the digest stored in `state`, and the host restored from
    /// `state`. `Err` when the copy is not what the store held of its
    /// version or the result is not the stored lineage: read the whole
    /// record then.
    pub(crate) fn advance(
        mut self,
        version: u64,
        state: serde_json::Value,
        from: usize,
        segments: &[String],
    ) -> Result<Managed, SessionError> {
        let Some((staged, _)) = &self.stored else {
            return Err(SessionError::NotStored);
        };
        let staged = Arc::clone(staged);
        let Some(mark) = staged.mark() else {
            return Err(SessionError::NoStoredHistory);
        };
        if mark.segments() != from {
            return Err(SessionError::Segments {
                from,
                held: mark.segments(),
            });
        }
        if !self.lineage.record_prints().same_parts(mark.prints()) {
            return Err(SessionError::CopyChanged);
        }
        let want = state
            .pointer("/serve/lineage")
            .and_then(serde_json::Value::as_str)
            .and_then(|h| u128::from_str_radix(h, 16).ok())
            .ok_or(SessionError::NoDigest)?;
        let mut lineage = std::mem::take(&mut self.lineage);
        lineage.apply_segments(segments, from)?;
        let mark = mark.appended(&lineage, segments);
        if mark.digest() != want {
            return Err(SessionError::DigestMismatch);
        }
        Self::restore(
            Arc::clone(&self.ctx),
            &self.id,
            staged.inner(),
            version,
            Some(state),
            lineage,
            Some(mark),
        )
    }

    /// A stored session from its parts: `state` (the host's, with the
    /// proxy's own), `lineage` and what of it the store holds (`mark`).
    fn restore(
        ctx: Arc<SessionContext>,
        store_id: &str,
        store: &Arc<dyn context_engine::store::SessionStore>,
        version: u64,
        state: Option<serde_json::Value>,
        lineage: Lineage,
        mark: Option<super::persist::HistoryMark>,
    ) -> Result<Managed, SessionError> {
        let serve: Option<ServeState> = state
            .as_ref()
            .and_then(|s| s.get("serve"))
            .map(|v| serde_json::from_value(v.clone()))
            .transpose()
            .map_err(|error| SessionError::Record {
                session: store_id.to_owned(),
                error,
            })?;
        let staging = Arc::new(Staged::new(Arc::clone(store), state));
        staging.set_mark(mark);
        let engine = create_engine(&ctx, store_id)?;
        let host = host::Session::new(store_id, engine, Arc::clone(&ctx.counter))
            .with_options(ctx.host.clone())
            .with_store(Arc::clone(&staging) as Arc<dyn context_engine::store::SessionStore>)
            .map_err(SessionError::Restore)?;
        let serve = serve.unwrap_or(ServeState {
            calls: 0,
            stats: SessionStats::default(),
            awaiting: None,
            lineage: None,
        });
        // The record keeps the client's tokens as a sum only.
        let overhead = ctx.counter.request_overhead() as u64;
        let client = ClientTokens::resume(
            serve.stats.last_client_messages,
            serve.stats.last_client_tokens.saturating_sub(overhead),
        );
        Ok(Managed {
            ctx,
            id: store_id.to_owned(),
            host,
            lineage,
            calls: serve.calls,
            stats: serve.stats,
            stored: Some((staging, version)),
            current: false,
            awaiting: serve.awaiting,
            pending: None,
            model: None,
            client,
        })
    }

    /// How many history segments of the stored version this copy holds
    /// (0: none, or not stored).
    pub(crate) fn held_segments(&self) -> usize {
        self.stored
            .as_ref()
            .and_then(|(staged, _)| staged.held())
            .map_or(0, |(segments, _)| segments)
    }

    /// A new host for this session (a divergence dropped the engine's
    /// state), attached to the staging store when there is one. The
    /// store keeps the compaction records of every lineage the session
    /// id named: the new host numbers its records after them.
    fn fresh_host(&self) -> Result<host::Session, SessionError> {
        let host = new_host(&self.ctx, &self.id)?;
        match &self.stored {
            Some((staged, _)) => Ok(host
                .with_store(Arc::clone(staged) as Arc<dyn context_engine::store::SessionStore>)
                .map_err(SessionError::Restore)?
                .with_records_after(self.host.records_numbered())),
            None => Ok(host),
        }
    }

    /// The session's id (for a stored session, its name in the store).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The version of the stored record this copy matches, when stored.
    pub(crate) fn stored_version(&self) -> Option<u64> {
        self.stored.as_ref().map(|(_, v)| *v)
    }

    /// Whether the last version check found this stored copy current.
    pub(crate) fn is_current(&self) -> bool {
        self.current && self.stored.is_some()
    }

    /// Records what the last version check found.
    pub(crate) fn set_current(&mut self, current: bool) {
        self.current = current;
    }

    /// Marks the session's response as awaited by instance `owner`
    /// (`None`: settled), for the next record written.
    pub(crate) fn set_awaiting(&mut self, owner: Option<String>) -> Option<String> {
        std::mem::replace(&mut self.awaiting, owner)
    }

    /// What to write: the batches the step collected, the state (host
    /// snapshot plus the proxy's figures) and, when `with_history`, what
    /// changed in the lineage since the stored version.
    pub(crate) fn record(
        &self,
        with_history: bool,
    ) -> Result<
        (
            Vec<context_engine::store::Batch>,
            serde_json::Value,
            Option<super::persist::HistoryDelta>,
        ),
        SessionError,
    > {
        let Some((staged, _)) = &self.stored else {
            return Err(SessionError::NotStored);
        };
        let history = if with_history {
            staged.history_delta(&self.lineage)?
        } else {
            None
        };
        let digest = match &history {
            Some(h) => Some(h.mark.digest()),
            None => staged.held().map(|(_, digest)| digest),
        };
        let mut state = self.host.snapshot();
        let serve = ServeState {
            calls: self.calls,
            stats: self.stats.clone(),
            awaiting: self.awaiting.clone(),
            lineage: digest.map(|d| format!("{d:032x}")),
        };
        if let serde_json::Value::Object(map) = &mut state {
            map.insert(
                "serve".into(),
                serde_json::to_value(serve).map_err(|error| SessionError::Encode {
                    session: self.id.clone(),
                    error,
                })?,
            );
        }
        // A batch that carries only a state snapshot is superseded by the
        // record.
        let batches = staged
            .take()
            .into_iter()
            .filter(|b| {
                !(b.messages().is_empty() && b.handles().is_empty() && b.compactions().is_empty())
            })
            .collect();
        Ok((batches, state, history))
    }

    /// The record was written as `version`, with the history `mark`
    /// says when it was written (`None`: unchanged).
    pub(crate) fn set_stored_version(
        &mut self,
        version: u64,
        mark: Option<super::persist::HistoryMark>,
    ) {
        if let Some((staged, v)) = &mut self.stored {
            *v = version;
            if mark.is_some() {
                staged.set_mark(mark);
            }
        }
    }
}
