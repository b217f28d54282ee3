//! The built-in `compressor` engine: threshold compaction that keeps the head
//! and a token-budgeted tail verbatim and replaces the middle with one
//! structured summary.
//!
//! Policy lives here; the pieces it relies on live elsewhere: safe cut points
//! in [`crate::validate`], the tool-result digest in [`crate::digest`],
//! redaction in [`crate::redact`], summaries behind [`Summarizer`]. The
//! engine never hands back a transcript with a violation its input did not
//! have, and never silently loses the middle: it compacts with the primary
//! summary or the extractive fallback, or leaves the input unchanged and
//! says why ([`Compressor::last_report`]).

mod clock;
pub mod fit;
mod insert;
mod plan;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::digest::{
    DigestOptions, RECALL_TOOL, handle_recall_call, recall_tool_schema, stable_len,
    summarizer_input,
};
use crate::engine::{
    BlockReason, Compaction, CompressDecision, CompressRequest, ContextEngine,
    DEFAULT_PROTECT_FIRST_N, DEFAULT_PROTECT_LAST_N, DEFAULT_THRESHOLD_PERCENT, EngineError,
    EngineState, EngineStatus, ModelInfo, PreparedSummary, PromptTokens, SelectRequest, SummaryJob,
    SummarySource, ToolCallContext, Usage, prefix_key, sanitize_memory_context, unknown_tool,
};
use crate::message::{Content, Message};
use crate::prune::{PruneOptions, prune};
use crate::redact::{Egress, Redactor};
use crate::schedule::{
    CompactionEstimate, ScheduleOptions, ScheduleState, Scheduler, schedule_prune, scheduled_digest,
};
use crate::summarize::extractive::ExtractiveSummarizer;
use crate::summarize::{FailureAction, SummarizeError, Summarizer, SummaryRequest};
use crate::tokens::TokenCounter;
use crate::validate::{
    CutPoints, Profile, Rule, Violation, introduced_adjacency, introduced_violation,
};

pub use clock::{Clock, ManualClock, SystemClock};
pub use fit::{FitStep, FitStepKind, Fitted, Unfittable, fit, fit_noted};
pub use insert::{
    Placement, SUMMARY_END, SUMMARY_PREFIX, SYSTEM_NOTE, find_summary, is_summary, summary_body,
    without_summary, wrap_summary,
};
pub use plan::Plan;

// The report and the threshold policy are engine-level; re-exported here
// for callers that name them through the compressor.
pub use crate::engine::{
    CompactionReport, Outcome, SMALL_WINDOW_PERCENT, Span, compaction_threshold,
};

/// The engine's name.
pub const NAME: &str = "compressor";
/// Cooldown after the summarizer reported it is not configured.
pub const COOLDOWN_NOT_CONFIGURED: Duration = Duration::from_secs(600);
/// Cooldowns after repeated timeouts, 429s and 5xx: first, second, third on.
pub const COOLDOWN_TRANSIENT: [Duration; 3] = [
    Duration::from_secs(60),
    Duration::from_secs(300),
    Duration::from_secs(900),
];
/// Cooldown after a malformed or empty reply.
pub const COOLDOWN_MALFORMED: Duration = Duration::from_secs(30);
/// Cooldown after any other failure (auth, network).
pub const COOLDOWN_OTHER: Duration = Duration::from_secs(60);
/// Tuning of the compressor. `Default` is the documented behaviour.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct CompressorOptions {
    /// Fraction of the usable window at which compaction fires.
    pub threshold_percent: f64,
    /// Tokens reserved for the reply, subtracted from the window first.
    pub max_tokens: Option<u64>,
    /// Non-system head messages kept verbatim on the first compaction
    /// (later ones keep only the system prompt, so early turns do not
    /// fossilise).
    pub protect_first_n: usize,
    /// Tail messages kept at least (clamped to 3..=8).
    pub protect_last_n: usize,
    /// Tail budget as a fraction of the threshold.
    pub tail_ratio: f64,
    /// How far past the tail budget a cut point may push the tail.
    pub tail_ceiling: f64,
    /// Summary target as a fraction of the tokens it replaces.
    pub summary_ratio: f64,
    /// Summary target at most this fraction of the window.
    pub summary_window_ratio: f64,
    /// Summary target at most this many tokens.
    pub summary_max_tokens: usize,
    /// The summary's state record (its ledger of asks, files, commands,
    /// errors) may grow the summary past its target, when it needs to, up
    /// to this fraction of the window (and `summary_max_tokens`): its
    /// literal entries are what the agent needs after a compaction, and
    /// what does not fit collapses into counts only recallable from the
    /// archive.
    pub summary_ledger_window_ratio: f64,
    /// The provider rules the output must keep.
    pub profile: Profile,
    /// The digest applied to the summarizer's input and to request views.
    pub digest: DigestOptions,
    /// The proactive prune behind
    /// [`prune_tool_results_only`](ContextEngine::prune_tool_results_only);
    /// off until `proactive_prune_tokens` is set, because every prune costs
    /// the provider's cached prefix.
    pub prune: PruneOptions,
    /// When the digest advances and a prune commits: only when the saving
    /// pays for the prompt cache it breaks (see [`crate::schedule`]).
    pub schedule: ScheduleOptions,
    /// Per-model threshold overrides (see
    /// [`resolve_model_threshold`](crate::engine::resolve_model_threshold)).
    pub model_thresholds: BTreeMap<String, f64>,
}

impl Default for CompressorOptions {
    fn default() -> CompressorOptions {
        CompressorOptions {
            threshold_percent: DEFAULT_THRESHOLD_PERCENT,
            max_tokens: None,
            protect_first_n: DEFAULT_PROTECT_FIRST_N,
            protect_last_n: DEFAULT_PROTECT_LAST_N,
            tail_ratio: 0.20,
            tail_ceiling: 1.5,
            summary_ratio: 0.20,
            summary_window_ratio: 0.05,
            summary_max_tokens: 12_000,
            summary_ledger_window_ratio: 0.10,
            profile: Profile::OpenAi,
            digest: DigestOptions::default(),
            prune: PruneOptions::default(),
            schedule: ScheduleOptions::default(),
            model_thresholds: BTreeMap::new(),
        }
    }
}

impl CompressorOptions {
    /// The engine state these options give for a `context_length` window:
    /// threshold percent, reply reserve, protections and per-model
    /// overrides (the built-in engines and the plugin host start from it).
    pub fn engine_state(&self, context_length: u64) -> EngineState {
        EngineState::new(context_length, self.threshold_percent, self.max_tokens)
            .with_protection(self.protect_first_n, self.protect_last_n)
            .with_model_thresholds(self.model_thresholds.clone())
    }

    /// Which user messages are a text-action agent's tool output: the
    /// setting the digest options carry (`context.text_actions`).
    pub fn text_actions(&self) -> &crate::validate::TextActions {
        &self.digest.text_actions
    }

    /// Sets the text-action setting of the digest and of the prune's
    /// digest (one setting: [`text_actions`](Self::text_actions)).
    pub fn with_text_actions(mut self, actions: crate::validate::TextActions) -> CompressorOptions {
        self.prune.digest.text_actions = actions.clone();
        self.digest.text_actions = actions;
        self
    }

    /// Sets [`profile`](Self::profile).
    pub fn with_profile(mut self, profile: Profile) -> CompressorOptions {
        self.profile = profile;
        self
    }

    /// Sets [`max_tokens`](Self::max_tokens).
    pub fn with_max_tokens(mut self, tokens: u64) -> CompressorOptions {
        self.max_tokens = Some(tokens);
        self
    }

    /// Sets [`threshold_percent`](Self::threshold_percent).
    pub fn with_threshold_percent(mut self, percent: f64) -> CompressorOptions {
        self.threshold_percent = percent;
        self
    }

    /// Sets [`protect_first_n`](Self::protect_first_n).
    pub fn with_protect_first_n(mut self, n: usize) -> CompressorOptions {
        self.protect_first_n = n;
        self
    }

    /// Sets [`protect_last_n`](Self::protect_last_n).
    pub fn with_protect_last_n(mut self, n: usize) -> CompressorOptions {
        self.protect_last_n = n;
        self
    }

    /// Sets [`digest`](Self::digest).
    pub fn with_digest(mut self, digest: DigestOptions) -> CompressorOptions {
        self.digest = digest;
        self
    }

    /// Sets [`schedule`](Self::schedule).
    pub fn with_schedule(mut self, schedule: ScheduleOptions) -> CompressorOptions {
        self.schedule = schedule;
        self
    }
}

/// The built-in engine (see the module docs).
pub struct Compressor {
    state: EngineState,
    counter: Arc<dyn TokenCounter>,
    primary: Arc<dyn Summarizer>,
    fallback: ExtractiveSummarizer,
    /// A summary prepared in the background, until used or stale.
    prepared: Option<Ready>,
    options: CompressorOptions,
    clock: Arc<dyn Clock>,
    cooldown_until: Option<Duration>,
    transient_failures: usize,
    fallback_streak: u32,
    ineffective_streak: u32,
    last_savings_percent: f64,
    /// Tokens before the last compaction, while its effect is unknown.
    awaiting_effect: Option<u64>,
    seen_real_usage: bool,
    last_report: Option<CompactionReport>,
    /// Redaction of everything sent to the summarizer and of its reply,
    /// with the user's redactor when one was given.
    egress: Egress,
    /// The cache-aware schedule of digest steps and prunes.
    scheduler: Scheduler,
    /// The coming call's time as the host gave it (a replay's recorded
    /// time), else `None`: the system's wall clock.
    call_time: Option<f64>,
    /// Whether the last request view found the prompt cache expired: the
    /// preflight that follows it in the same call may compact from the
    /// cold floor. Set by every view.
    cold_call: bool,
}

impl std::fmt::Debug for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compressor")
            .field("state", &self.state)
            .field("summarizer", &self.primary.name())
            .field("options", &self.options)
            .field("cooldown_until", &self.cooldown_until)
            .field("fallback_streak", &self.fallback_streak)
            .field("ineffective_streak", &self.ineffective_streak)
            .finish_non_exhaustive()
    }
}

impl Compressor {
    /// A compressor with the default options and the extractive summarizer,
    /// for a model with a `context_length` window (0 when unknown).
    pub fn new(counter: Arc<dyn TokenCounter>, context_length: u64) -> Compressor {
        Compressor::with_options(counter, context_length, CompressorOptions::default())
    }

    /// A compressor with `options` and the extractive summarizer.
    pub fn with_options(
        counter: Arc<dyn TokenCounter>,
        context_length: u64,
        options: CompressorOptions,
    ) -> Compressor {
        let state = options.engine_state(context_length);
        let scheduler = Scheduler::new(options.schedule.clone());
        Compressor {
            state,
            counter,
            primary: Arc::new(ExtractiveSummarizer),
            fallback: ExtractiveSummarizer,
            prepared: None,
            options,
            clock: Arc::new(SystemClock::new()),
            cooldown_until: None,
            transient_failures: 0,
            fallback_streak: 0,
            ineffective_streak: 0,
            last_savings_percent: 0.0,
            awaiting_effect: None,
            seen_real_usage: false,
            last_report: None,
            egress: Egress::builtin(),
            call_time: None,
            cold_call: false,
            scheduler,
        }
    }

    /// The schedule's state, for a host that persists the session.
    pub fn schedule_state(&self) -> &ScheduleState {
        self.scheduler.state()
    }

    /// Restores a persisted schedule state (a resumed session).
    pub fn restore_schedule_state(&mut self, state: ScheduleState) {
        self.scheduler.restore(state);
    }

    /// The coming call's time in seconds since the Unix epoch, for the
    /// schedule's cold-cache rules: the host's (a recording's) when it gave
    /// one, else the wall clock. Not the monotonic [`Clock`] of the
    /// cooldowns: the schedule's state is persisted with the session and
    /// read again by other processes (a fleet, a restart), whose monotonic
    /// clocks start elsewhere.
    fn now_secs(&self) -> Option<f64> {
        self.call_time.or_else(crate::schedule::now)
    }

    /// Redacts with `redactor` (e.g. the built-in rules plus the user's
    /// patterns) instead of the built-in rules alone. Text that leaves the
    /// process is always redacted, whatever the redactor's opt-out.
    pub fn with_redactor(mut self, redactor: Arc<Redactor>) -> Compressor {
        self.egress = Egress::new(Some(redactor));
        self
    }

    /// Uses `summarizer` as the primary (the extractive one stays the
    /// fallback).
    pub fn with_summarizer(mut self, summarizer: Box<dyn Summarizer>) -> Compressor {
        self.primary = Arc::from(summarizer);
        self
    }

    /// Uses `clock` for cooldowns and the schedule's idle gaps.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Compressor {
        self.clock = clock;
        self
    }

    /// The options in force.
    pub fn options(&self) -> &CompressorOptions {
        &self.options
    }

    /// The primary summarizer's name.
    pub fn summarizer_name(&self) -> &str {
        self.primary.name()
    }

    /// Seconds left on the summarizer cooldown, if one is running.
    pub fn cooldown_seconds_left(&self) -> Option<u64> {
        let until = self.cooldown_until?;
        let now = self.clock.now();
        (until > now).then(|| (until - now).as_secs_f64().ceil() as u64)
    }

    /// Why an unforced compaction would be declined now, if it would.
    pub fn block_reason(&self) -> Option<BlockReason> {
        if let Some(seconds_left) = self.cooldown_seconds_left() {
            return Some(BlockReason::Cooldown { seconds_left });
        }
        let attempts = self.ineffective_streak.max(self.fallback_streak);
        (attempts >= 2).then_some(BlockReason::Ineffective {
            attempts,
            last_savings_percent: self.last_savings_percent,
        })
    }

    /// Where the next compaction would cut `messages`, or why it cannot.
    pub fn plan(&self, messages: &[Message]) -> Result<Plan, String> {
        self.plan_with(messages, false)
    }

    /// [`plan`](Self::plan), with the tail cut to the last group when
    /// `minimal_tail` (the escalation's second step).
    fn plan_with(&self, messages: &[Message], minimal_tail: bool) -> Result<Plan, String> {
        // The state's protections win: hosts adjust them there.
        let options = CompressorOptions {
            protect_first_n: self.state.protect_first_n,
            protect_last_n: self.state.protect_last_n,
            ..self.options.clone()
        };
        plan::plan(
            messages,
            &options,
            self.state.threshold_tokens,
            self.state.compression_count,
            self.counter.as_ref(),
            minimal_tail,
        )
    }

    /// Tokens of what `plan` keeps verbatim plus the summary's target: the
    /// compacted size before any escalation (per-message counts, cached).
    fn kept_estimate(&self, messages: &[Message], plan: &Plan) -> u64 {
        let c = self.counter.as_ref();
        let kept: usize = messages[..plan.head_end]
            .iter()
            .chain(plan.pinned.map(|u| &messages[u]))
            .chain(&messages[plan.tail_start..])
            .map(|m| c.count_message(m))
            .sum();
        let target = self.target_tokens(self.span_estimate(messages, plan));
        (kept + target + c.request_overhead()) as u64
    }

    /// Tokens of the messages `plan` summarises.
    fn span_estimate(&self, messages: &[Message], plan: &Plan) -> usize {
        plan.middle()
            .map(|i| self.counter.count_message(&messages[i]))
            .sum()
    }

    /// The size the summary aims for: a fifth of what it replaces, at most
    /// 5% of the window and 12k tokens.
    fn target_tokens(&self, span_tokens: usize) -> usize {
        let mut target = (span_tokens as f64 * self.options.summary_ratio) as usize;
        if self.state.context_length > 0 {
            let window =
                (self.state.context_length as f64 * self.options.summary_window_ratio) as usize;
            target = target.min(window);
        }
        target.min(self.options.summary_max_tokens).max(64)
    }

    /// The room the summary's ledger may take when it needs more than the
    /// target leaves it: `summary_ledger_window_ratio` of the window, at
    /// most `summary_max_tokens` (0 without a window).
    fn ledger_tokens(&self) -> usize {
        if self.state.context_length == 0 {
            return 0;
        }
        let room = self.state.context_length as f64 * self.options.summary_ledger_window_ratio;
        (room as usize).min(self.options.summary_max_tokens)
    }

    /// The plan for `messages`, with the tail shrunk to the last group
    /// when what it keeps and the summary's target would exceed the budget
    /// even with the tail's large results digested (decided before the
    /// summarizer runs: one call; the step goes to `escalation`).
    fn plan_for(
        &self,
        messages: &[Message],
        escalation: &mut Vec<FitStep>,
    ) -> Result<Plan, String> {
        let mut plan = self.plan(messages)?;
        let threshold = self.state.threshold_tokens;
        if threshold > 0 && self.kept_estimate(messages, &plan) > threshold {
            let profile = self.options.profile;
            let system_note = !self.options.schedule.enabled;
            let mut provisional = assemble(
                messages,
                &plan,
                &wrap_summary(""),
                profile,
                self.options.text_actions(),
                system_note,
            )
            .0;
            let target = self.target_tokens(self.span_estimate(messages, &plan)) as u64;
            let room = threshold.saturating_sub(target);
            let counter = self.counter.as_ref();
            fit::run_step(
                &mut provisional,
                FitStepKind::DigestResults,
                room,
                counter,
                profile,
                self.options.text_actions(),
            );
            if counter.count_messages(&provisional) as u64 > room
                && let Ok(minimal) = self.plan_with(messages, true)
                && minimal.tail_start > plan.tail_start
            {
                escalation.push(FitStep {
                    step: FitStepKind::ShrinkTail,
                    messages: minimal.tail_start - plan.tail_start,
                    tokens_after: 0,
                });
                plan = minimal;
            }
        }
        Ok(plan)
    }

    /// What the summarizer is given for `plan`'s span: the turns digested
    /// and redacted (without the previous summary's own text), the previous
    /// summary, focus and memory redacted, and the target size.
    fn span_inputs(
        &self,
        messages: &[Message],
        plan: &Plan,
        request: &CompressRequest,
    ) -> SpanInputs {
        // Borrowed when the span is one run of the input (the common case:
        // no copy of 1 MB).
        let previous = plan.previous.as_ref().map(|(_, body)| body.as_str());
        let contiguous = plan.previous.is_none()
            && plan
                .pinned
                .is_none_or(|u| u < plan.head_end || u >= plan.tail_start);
        let span: Cow<'_, [Message]> = if contiguous {
            Cow::Borrowed(&messages[plan.head_end..plan.tail_start])
        } else {
            Cow::Owned(
                plan.middle()
                    .filter_map(|i| {
                        let m = &messages[i];
                        if Some(i) == plan.previous.as_ref().map(|(j, _)| *j) {
                            // The holder's own words and tool calls stay in
                            // the span (a summary merged into a tool-call turn
                            // must not take the calls with it).
                            let own = insert::without_summary(&m.text());
                            return (!own.is_empty() || m.has_tool_calls())
                                .then(|| with_text(m, own));
                        }
                        Some(m.clone())
                    })
                    .collect(),
            )
        };
        let target = self.target_tokens(self.counter.count_messages(&span));
        let egress = &self.egress;
        // The handle the summary's note will name (archived by the host):
        // what the ledger collapses points there.
        let handle = request.archive.then(|| {
            let replaced: Vec<Message> = plan.middle().map(|i| messages[i].clone()).collect();
            crate::store::span_handle(&replaced)
        });
        SpanInputs {
            handle,
            turns: egress.messages(&summarizer_input(&span, &self.options.digest).messages),
            previous: previous.map(|p| egress.string(p)),
            focus: request.focus_topic.as_deref().map(|f| egress.string(f)),
            memory: Some(egress.string(&sanitize_memory_context(&request.memory_context)))
                .filter(|m| !m.is_empty()),
            target,
            ledger: self.ledger_tokens(),
            text_actions: self.options.text_actions().clone(),
        }
    }

    /// The summary prepared in the background, if it belongs to a prefix
    /// of `messages` (same messages up to its cut, no compaction since)
    /// whose cut is still safe; a stale one is dropped.
    fn take_prepared(&mut self, messages: &[Message]) -> Option<Ready> {
        let ready = self.prepared.take()?;
        let (head_end, tail_start) = (ready.plan.head_end, ready.plan.tail_start);
        if tail_start >= messages.len()
            || prefix_key(&messages[..tail_start], self.state.compression_count) != ready.key
        {
            return None;
        }
        let cuts =
            CutPoints::with_profile(messages, self.options.profile, self.options.text_actions());
        (cuts.is_safe(head_end) && cuts.is_safe(tail_start)).then_some(ready)
    }

    /// Whether compacting the request `messages` (`tokens` long) now,
    /// before the threshold, pays for itself (see
    /// [`Scheduler::compaction_pays`]). The extractive summarizer runs
    /// locally and costs nothing; any other is priced as a call to the
    /// session's provider.
    fn early_compaction_pays(&self, messages: &[Message], tokens: u64) -> bool {
        let threshold = self.state.threshold_tokens;
        let from = self.scheduler.compaction_floor(self.cold_call);
        if threshold == 0
            || tokens >= threshold
            || from >= 1.0
            || (tokens as f64) < from * threshold as f64
            || self.scheduler.state().growth_per_call == 0
        {
            return false;
        }
        let Ok(plan) = self.plan(messages) else {
            return false;
        };
        let c = self.counter.as_ref();
        let head: usize = messages[..plan.head_end]
            .iter()
            .chain(plan.pinned.map(|u| &messages[u]))
            .map(|m| c.count_message(m))
            .sum();
        let span = self.span_estimate(messages, &plan);
        let summary = self.target_tokens(span) as u64;
        let billed = self.primary.name() != self.fallback.name();
        let estimate = CompactionEstimate {
            request_tokens: tokens,
            head_tokens: (head + c.request_overhead()) as u64,
            after_tokens: self.kept_estimate(messages, &plan),
            summary_tokens: summary,
            summarizer_input_tokens: if billed { span as u64 } else { 0 },
            summarizer_output_tokens: if billed { summary } else { 0 },
        };
        self.scheduler
            .compaction_pays(&estimate, threshold, self.cold_call)
    }

    fn start_cooldown(&mut self, error: &SummarizeError) -> Duration {
        let length = match error {
            SummarizeError::NotConfigured(_) => COOLDOWN_NOT_CONFIGURED,
            SummarizeError::Timeout(_)
            | SummarizeError::RateLimited { .. }
            | SummarizeError::Server { .. } => {
                let i = self.transient_failures.min(COOLDOWN_TRANSIENT.len() - 1);
                self.transient_failures += 1;
                COOLDOWN_TRANSIENT[i]
            }
            SummarizeError::Malformed(_) | SummarizeError::Empty => COOLDOWN_MALFORMED,
            _ => COOLDOWN_OTHER,
        };
        self.cooldown_until = Some(self.clock.now() + length);
        length
    }

    fn finish(&mut self, report: CompactionReport) {
        self.last_report = Some(report);
    }

    fn compress_inner(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Result<Compaction, EngineError> {
        let tokens_before = self.counter.count_messages(messages) as u64;
        let threshold = self.state.threshold_tokens;
        let unchanged = |outcome| {
            CompactionReport::unchanged(outcome, messages.len(), tokens_before, threshold)
        };
        if !request.force
            && let Some(reason) = self.block_reason()
        {
            self.finish(CompactionReport {
                reason: Some(reason.to_string()),
                ..unchanged(Outcome::Blocked)
            });
            return Err(EngineError::Blocked {
                engine: NAME.to_owned(),
                reason,
            });
        }
        // A summary prepared in the background for a prefix of this
        // history: its cut stands, everything after it stays verbatim.
        let ready = self.take_prepared(messages);
        if ready.is_none() && request.summary == SummarySource::Prepared {
            self.finish(CompactionReport {
                reason: Some("the background summary is not ready".into()),
                ..unchanged(Outcome::Deferred)
            });
            return Err(EngineError::SummaryNotReady {
                engine: NAME.to_owned(),
            });
        }
        let mut escalation: Vec<FitStep> = Vec::new();
        let plan = match &ready {
            Some(r) => r.plan.clone(),
            None => match self.plan_for(messages, &mut escalation) {
                Ok(plan) => plan,
                Err(why) => {
                    self.finish(CompactionReport {
                        reason: Some(why.clone()),
                        ..unchanged(Outcome::NothingToCompress)
                    });
                    return Err(EngineError::NothingToCompress {
                        engine: NAME.to_owned(),
                        reason: why,
                    });
                }
            },
        };

        let (result, primary_name, inputs, stand_in) = match ready {
            Some(r) => (r.result, r.summarizer, r.inputs, false),
            None => {
                let inputs = self.span_inputs(messages, &plan, request);
                let result = if request.summary == SummarySource::Deterministic {
                    None
                } else {
                    Some(match self.primary.summarize(&inputs.request()) {
                        Ok(text) if text.trim().is_empty() => Err(SummarizeError::Empty),
                        other => other,
                    })
                };
                let name = self.primary.name().to_owned();
                match result {
                    Some(result) => (result, name, inputs, false),
                    None => {
                        // Not the summary model's failure: no cooldown and
                        // no streak, the deterministic summary stands in.
                        let text = self.fallback.summarize_span(&inputs.request());
                        (Ok(text), self.fallback.name().to_owned(), inputs, true)
                    }
                }
            }
        };
        let target = inputs.target;
        let (body, outcome, summarizer, reason, cooldown) = match result {
            Ok(text) if stand_in => (
                text,
                Outcome::Fallback,
                primary_name,
                Some("the background summary was not ready".to_owned()),
                None,
            ),
            Ok(text) => {
                self.cooldown_until = None;
                self.transient_failures = 0;
                self.fallback_streak = 0;
                (text, Outcome::Compacted, primary_name, None, None)
            }
            Err(error) => {
                let cooldown = self.start_cooldown(&error);
                if error.action() == FailureAction::Abort {
                    self.finish(CompactionReport {
                        summarizer: Some(primary_name),
                        reason: Some(error.to_string()),
                        cooldown_seconds: Some(cooldown.as_secs()),
                        ..unchanged(Outcome::Aborted)
                    });
                    return Err(EngineError::Summarizer {
                        engine: NAME.to_owned(),
                        reason: error.to_string(),
                        cooldown_seconds: Some(cooldown.as_secs()),
                        source: Some(Box::new(error)),
                    });
                }
                self.fallback_streak = self.fallback_streak.saturating_add(1);
                let text = self.fallback.summarize_span(&inputs.request());
                (
                    text,
                    Outcome::Fallback,
                    self.fallback.name().to_owned(),
                    Some(error.to_string()),
                    Some(cooldown.as_secs()),
                )
            }
        };
        drop(inputs);
        let mut body = self.egress.string(&body);
        if request.archive {
            let replaced: Vec<Message> = plan.middle().map(|i| messages[i].clone()).collect();
            let handle = crate::store::span_handle(&replaced);
            body = insert::with_archive_note(&body, plan.head_end, plan.tail_start, &handle);
        }
        let wrapped = wrap_summary(&body);

        // Under the cache-aware schedule the head stays byte for byte what
        // the provider has cached: the summary's own prefix says what the
        // system note would, so the system prompt is not edited.
        let system_note = !self.options.schedule.enabled;
        let (mut out, placement) = assemble(
            messages,
            &plan,
            &wrapped,
            self.options.profile,
            self.options.text_actions(),
            system_note,
        );
        let mut tokens_after = self.counter.count_messages(&out) as u64;
        // The rest of the ladder on the compacted transcript.
        let mut unfittable = None;
        if threshold > 0 && tokens_after > threshold {
            let counter = self.counter.as_ref();
            match fit::fit_history(
                &out,
                threshold,
                counter,
                self.options.profile,
                self.options.text_actions(),
            ) {
                Ok(fitted) => {
                    if let Some(shrink) = escalation.first_mut() {
                        shrink.tokens_after = tokens_after;
                    }
                    escalation.extend(fitted.steps);
                    out = fitted.messages;
                    tokens_after = fitted.tokens_after;
                }
                Err(e) => unfittable = Some(e),
            }
        } else if let Some(shrink) = escalation.first_mut() {
            shrink.tokens_after = tokens_after;
        }
        let report = CompactionReport {
            outcome,
            messages_before: messages.len(),
            messages_after: out.len(),
            tokens_before,
            tokens_after,
            threshold_tokens: threshold,
            head: Some(Span::new(0, plan.head_end)),
            pinned: plan.pinned,
            tail: Some(Span::new(plan.tail_start, messages.len())),
            summarized: Some(Span::new(plan.head_end, plan.tail_start)),
            summarized_messages: plan.middle().count(),
            summarizer: Some(summarizer),
            placement: Some(placement),
            target_tokens: target,
            summary_tokens: self.counter.count_text(&wrapped),
            iterative: plan.previous.is_some(),
            reason,
            cooldown_seconds: cooldown,
            within_budget: tokens_after <= threshold,
            escalation,
            unfittable,
        };
        if tokens_after >= tokens_before {
            let why = format!(
                "the summary would not be smaller than the {} messages it replaces",
                report.summarized_messages
            );
            self.finish(CompactionReport {
                reason: Some(why.clone()),
                ..unchanged(Outcome::NothingToCompress)
            });
            return Err(EngineError::NothingToCompress {
                engine: NAME.to_owned(),
                reason: why,
            });
        }
        if let Some(i) = introduced_adjacency(messages, &out, self.options.profile) {
            let why = format!(
                "message {i}: the summary's placement would put two `{}` turns in a row",
                out[i].role
            );
            self.finish(CompactionReport {
                reason: Some(why.clone()),
                ..unchanged(Outcome::InvalidOutput)
            });
            return Err(EngineError::InvalidOutput {
                engine: NAME.to_owned(),
                violation: Violation::new(i, Rule::ConsecutiveSameRole, why),
            });
        }
        if let Some(v) = introduced_violation(messages, &out, self.options.profile) {
            self.finish(CompactionReport {
                reason: Some(v.to_string()),
                ..unchanged(Outcome::InvalidOutput)
            });
            return Err(EngineError::InvalidOutput {
                engine: NAME.to_owned(),
                violation: v,
            });
        }
        self.finish(report.clone());
        self.state.record_compression();
        self.awaiting_effect = Some(tokens_before);
        Ok(Compaction::with_report(out, report))
    }
}

/// The compressor's own state in a snapshot (see
/// [`ContextEngine::snapshot`]); the cooldown as time left, so it survives
/// a restart on another clock.
#[derive(serde::Serialize, serde::Deserialize)]
struct Persisted {
    cooldown_left_ms: Option<u64>,
    transient_failures: usize,
    fallback_streak: u32,
    ineffective_streak: u32,
    last_savings_percent: f64,
    awaiting_effect: Option<u64>,
    seen_real_usage: bool,
    /// The cache-aware schedule's state (digest frontier, last request,
    /// growth per call): a restarted host decides as the first one would.
    #[serde(default)]
    schedule: ScheduleState,
}

/// The summarizer's input for one span, owned so a background job can
/// take it to another thread.
struct SpanInputs {
    handle: Option<String>,
    turns: Vec<Message>,
    previous: Option<String>,
    focus: Option<String>,
    memory: Option<String>,
    target: usize,
    ledger: usize,
    text_actions: crate::validate::TextActions,
}

impl SpanInputs {
    fn request(&self) -> SummaryRequest<'_> {
        let mut r = SummaryRequest::new(&self.turns, self.target)
            .with_ledger_tokens(self.ledger)
            .with_text_actions(&self.text_actions);
        if let Some(p) = &self.previous {
            r = r.with_previous_summary(p);
        }
        if let Some(f) = &self.focus {
            r = r.with_focus_topic(f);
        }
        if let Some(m) = &self.memory {
            r = r.with_memory_context(m);
        }
        if let Some(h) = &self.handle {
            r = r.with_archive_handle(h);
        }
        r
    }
}

/// A summary prepared in the background: the cut it was made for, the
/// key of the history prefix up to that cut, the summarizer's answer (a
/// failure falls back to the extractive summary of the same inputs, as
/// inline).
struct Ready {
    key: u128,
    plan: Plan,
    result: Result<String, SummarizeError>,
    summarizer: String,
    inputs: SpanInputs,
}

/// How far the rough estimate may grow past the last real count before
/// preflight stops trusting it: 5% of the threshold, at least 4096 tokens
/// (one large tool result) but never more than 10% of the threshold, so a
/// small window cannot go out over its threshold on the strength of a stale
/// count.
fn preflight_slack(threshold: u64) -> u64 {
    (threshold / 20).max(4096.min(threshold / 10))
}

/// `message` with its content replaced by `text`.
fn with_text(message: &Message, text: String) -> Message {
    let mut out = message.clone();
    out.content = Content::Text(text);
    out
}

/// The compacted transcript: head (system note added when `system_note`),
/// pinned user message, summary, tail.
fn assemble(
    messages: &[Message],
    plan: &Plan,
    wrapped: &str,
    profile: Profile,
    actions: &crate::validate::TextActions,
    system_note: bool,
) -> (Vec<Message>, Placement) {
    let mut out: Vec<Message> = Vec::with_capacity(plan.kept() + 1);
    let system = messages[..plan.head_end]
        .iter()
        .position(|m| m.role == crate::message::Role::System);
    for (i, m) in messages[..plan.head_end].iter().enumerate() {
        out.push(if Some(i) == system && system_note {
            insert::with_system_note(m)
        } else {
            m.clone()
        });
    }
    if let Some(u) = plan.pinned {
        out.push(messages[u].clone());
    }
    let tail = &messages[plan.tail_start..];
    let asks_in = |part: &[Message]| {
        (0..part.len())
            .any(|i| crate::validate::is_real_user_turn(part, i, actions) && !is_summary(&part[i]))
    };
    let user_survives = asks_in(&out) || asks_in(tail);
    let placement = insert::choose_placement(&out, tail, user_survives, profile);
    match placement {
        Placement::User => out.push(Message::user(wrapped)),
        Placement::Assistant => out.push(Message::assistant(wrapped)),
        Placement::Merged => {}
    }
    for (k, m) in tail.iter().enumerate() {
        if k == 0 && placement == Placement::Merged {
            out.push(insert::prepend_text(m, wrapped));
        } else {
            out.push(m.clone());
        }
    }
    (out, placement)
}

impl ContextEngine for Compressor {
    fn name(&self) -> &str {
        NAME
    }

    fn state(&self) -> &EngineState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut EngineState {
        &mut self.state
    }

    /// Records usage; the first real count after a compaction decides
    /// whether it was effective (still at or over the threshold: not).
    fn update_from_response(&mut self, usage: &Usage) {
        self.state.record_usage(usage);
        self.seen_real_usage = true;
        if let Some(before) = self.awaiting_effect.take() {
            let after = usage.prompt_tokens;
            self.last_savings_percent = if before == 0 {
                0.0
            } else {
                (before as f64 - after as f64) / before as f64 * 100.0
            };
            if self.state.threshold_tokens > 0 && after >= self.state.threshold_tokens {
                self.ineffective_streak = self.ineffective_streak.saturating_add(1);
            } else {
                self.ineffective_streak = 0;
            }
        }
    }

    fn should_compress(&self, prompt_tokens: Option<u64>) -> bool {
        self.should_compress_info(prompt_tokens).should_compress
    }

    fn should_compress_info(&self, prompt_tokens: Option<u64>) -> CompressDecision {
        if !self.state.exceeds_threshold(prompt_tokens) {
            return CompressDecision::plain(false);
        }
        match self.block_reason() {
            Some(reason) => CompressDecision::blocked(reason),
            None => CompressDecision::plain(true),
        }
    }

    fn compress(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Result<Compaction, EngineError> {
        self.compress_inner(messages, request)
    }

    /// The summary of the span a compaction would replace now, for a host
    /// to prepare in the background; `None` during a cooldown, when
    /// nothing can be summarized, or while one prepared earlier is held.
    fn prepare_summary(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Option<SummaryJob> {
        if self.block_reason().is_some() {
            return None;
        }
        // One held is checked when it is used (hashing the prefix on every
        // request would cost the request path); a stale one is dropped
        // then, and the next request prepares again.
        if self.prepared.is_some() {
            return None;
        }
        let plan = self.plan(messages).ok()?;
        let key = prefix_key(&messages[..plan.tail_start], self.state.compression_count);
        let inputs = self.span_inputs(messages, &plan, request);
        let summarizer = Arc::clone(&self.primary);
        let count = plan.middle().count();
        Some(SummaryJob::new(key, count, move || {
            let result = match summarizer.summarize(&inputs.request()) {
                Ok(text) if text.trim().is_empty() => Err(SummarizeError::Empty),
                other => other,
            };
            Box::new(Ready {
                key,
                plan,
                result,
                summarizer: summarizer.name().to_owned(),
                inputs,
            })
        }))
    }

    fn adopt_summary(&mut self, summary: PreparedSummary) {
        if let Some(ready) = summary.into_payload::<Ready>() {
            self.prepared = Some(*ready);
        }
    }

    fn prune_tool_results_only<'a>(
        &mut self,
        messages: &'a [Message],
        current_tokens: Option<u64>,
    ) -> (Cow<'a, [Message]>, usize) {
        let outcome = prune(
            messages,
            current_tokens,
            &self.options.prune,
            self.counter.as_ref(),
        );
        if let Cow::Owned(after) = &outcome.messages {
            let verdict = schedule_prune(
                &self.scheduler,
                messages,
                after,
                self.counter.as_ref(),
                self.state.threshold_tokens,
                self.now_secs(),
            );
            if !verdict.applies() {
                return (Cow::Borrowed(messages), 0);
            }
        }
        (outcome.messages, outcome.pruned)
    }

    fn select_context(&mut self, request: &SelectRequest<'_>) -> Option<Vec<Message>> {
        self.select_context_view(request)
            .map(|v| v.into_iter().map(Cow::into_owned).collect())
    }

    fn select_context_view<'a>(
        &mut self,
        request: &SelectRequest<'a>,
    ) -> Option<Vec<Cow<'a, Message>>> {
        let now = self.now_secs();
        self.cold_call = self.scheduler.is_cold(now);
        let digest = scheduled_digest(
            &mut self.scheduler,
            request.request_messages,
            &self.options.digest,
            self.counter.as_ref(),
            self.state.threshold_tokens,
            now,
        );
        let report = digest.report;
        let changed =
            report.results_digested + report.envelopes_digested + report.binary_parts_dropped > 0;
        changed.then_some(digest.view)
    }

    /// Under the schedule, the digest's [`stable_len`]: the next request
    /// digests the newest batch's bulky results, so the cache is best
    /// marked before them. With the schedule off, the whole request (the
    /// engine's behaviour before cache-aware scheduling).
    fn stable_prefix(&self, request: &[Message]) -> usize {
        if self.scheduler.options().enabled {
            stable_len(request, &self.options.digest)
        } else {
            request.len()
        }
    }

    /// At the threshold (unless deferred to real usage), or before it when
    /// the cost model says an early compaction pays (see
    /// [`Scheduler::compaction_pays`]); never while blocked.
    fn should_compress_preflight(&self, messages: &[Message]) -> bool {
        let rough = self.counter.count_messages(messages) as u64;
        let due = self.state.exceeds_threshold(Some(rough))
            && !self.should_defer_preflight_to_real_usage(rough);
        (due || self.early_compaction_pays(messages, rough)) && self.block_reason().is_none()
    }

    /// Defer while awaiting real usage, and while the last real count was
    /// under the threshold and the estimate grew by at most max(4096, 5% of
    /// the threshold) since.
    fn should_defer_preflight_to_real_usage(&self, rough_tokens: u64) -> bool {
        match self.state.last_prompt_tokens {
            PromptTokens::AwaitingRealUsage => true,
            PromptTokens::Known(last) => {
                let threshold = self.state.threshold_tokens;
                let slack = preflight_slack(threshold);
                self.seen_real_usage
                    && last < threshold
                    && rough_tokens <= last.saturating_add(slack)
            }
        }
    }

    fn last_report(&self) -> Option<&CompactionReport> {
        self.last_report.as_ref()
    }

    fn has_content_to_compress(&self, messages: &[Message]) -> bool {
        self.plan(messages).is_ok()
    }

    fn on_session_reset(&mut self) {
        self.state.reset_counters();
        self.cooldown_until = None;
        self.transient_failures = 0;
        self.fallback_streak = 0;
        self.ineffective_streak = 0;
        self.last_savings_percent = 0.0;
        self.awaiting_effect = None;
        self.seen_real_usage = false;
        self.last_report = None;
        self.prepared = None;
        self.scheduler.reset();
    }

    fn tool_schemas(&self) -> Vec<Value> {
        vec![recall_tool_schema()]
    }

    fn handle_tool_call(&mut self, name: &str, args: &Value, ctx: &ToolCallContext<'_>) -> String {
        if name != RECALL_TOOL {
            return unknown_tool(name);
        }
        match ctx.messages {
            Some(messages) => handle_recall_call(messages, args),
            None => {
                json!({ "error": "context_recall needs the conversation; the host passed none" })
                    .to_string()
            }
        }
    }

    /// The [`EngineState`] and the compressor's own: cooldown (as time
    /// left), failure and ineffectiveness streaks, the pending effect check,
    /// the schedule's state.
    fn snapshot(&self) -> Value {
        let own = Persisted {
            cooldown_left_ms: self
                .cooldown_until
                .map(|until| until.saturating_sub(self.clock.now()).as_millis() as u64),
            transient_failures: self.transient_failures,
            fallback_streak: self.fallback_streak,
            ineffective_streak: self.ineffective_streak,
            last_savings_percent: self.last_savings_percent,
            awaiting_effect: self.awaiting_effect,
            seen_real_usage: self.seen_real_usage,
            schedule: self.scheduler.state().clone(),
        };
        json!({ "state": self.state, "compressor": own })
    }

    fn restore(&mut self, snapshot: &Value) -> Result<(), EngineError> {
        #[derive(serde::Deserialize)]
        struct Snapshot {
            state: EngineState,
            compressor: Persisted,
        }
        let s: Snapshot =
            serde::Deserialize::deserialize(snapshot).map_err(|e| EngineError::Restore {
                engine: NAME.to_owned(),
                reason: e.to_string(),
            })?;
        self.state = s.state;
        let own = s.compressor;
        self.cooldown_until = own
            .cooldown_left_ms
            .map(|ms| self.clock.now() + Duration::from_millis(ms));
        self.transient_failures = own.transient_failures;
        self.fallback_streak = own.fallback_streak;
        self.ineffective_streak = own.ineffective_streak;
        self.last_savings_percent = own.last_savings_percent;
        self.awaiting_effect = own.awaiting_effect;
        self.seen_real_usage = own.seen_real_usage;
        self.scheduler.restore(own.schedule);
        Ok(())
    }

    fn status(&self) -> EngineStatus {
        let mut status = self.state.status();
        status
            .extra
            .insert("summarizer".into(), json!(self.primary.name()));
        status.extra.insert(
            "cooldown_seconds_left".into(),
            json!(self.cooldown_seconds_left()),
        );
        status
            .extra
            .insert("fallback_streak".into(), json!(self.fallback_streak));
        status
            .extra
            .insert("ineffective_streak".into(), json!(self.ineffective_streak));
        status
            .extra
            .insert("schedule".into(), json!(self.scheduler.state()));
        status
    }

    fn update_model(&mut self, model: &ModelInfo) {
        self.state.apply_model(model);
    }

    fn set_call_time(&mut self, at: Option<f64>) {
        self.call_time = at;
    }
}
