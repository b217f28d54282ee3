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
mod compaction;
mod context_engine;
pub mod fit;
mod insert;
mod options;
mod plan;

use std::sync::Arc;
use std::time::Duration;

use crate::control::{CompactionAsk, CompactionNote, LISTED_COMPACTIONS};
use crate::engine::{BlockReason, EngineState};
use crate::redact::{Egress, Redactor};
use crate::schedule::{ScheduleState, Scheduler};
use crate::summarize::Summarizer;
use crate::summarize::extractive::ExtractiveSummarizer;
use crate::tokens::TokenCounter;

use compaction::{Ready, preflight_slack};

pub use clock::{Clock, ManualClock, SystemClock};
pub use fit::{FitStep, FitStepKind, Fitted, Unfittable, fit, fit_noted, ledger_kept};
pub use insert::{
    Placement, SUMMARY_END, SUMMARY_PREFIX, SYSTEM_NOTE, find_summary, is_summary, summary_body,
    without_summary, wrap_summary,
};
pub use options::{
    COOLDOWN_MALFORMED, COOLDOWN_NOT_CONFIGURED, COOLDOWN_OTHER, COOLDOWN_TRANSIENT,
    CompressorOptions,
};
pub use plan::{NothingToCut, Plan};

// The report and the threshold policy are engine-level; re-exported here
// for callers that name them through the compressor.
pub use crate::engine::{
    CompactionReport, Outcome, SMALL_WINDOW_PERCENT, Span, THRASH_CALLS, compaction_threshold,
};

/// The engine's name.
pub const NAME: &str = "compressor";

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
    /// Provider responses since the last compaction (`None` before the
    /// first): a compaction fewer than [`THRASH_CALLS`] after it is thrash.
    calls_since_compaction: Option<u32>,
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
    /// Where a call's time comes from when the host gives none: the wall
    /// clock, or a clock a test moves (see [`Compressor::with_wall_clock`]).
    wall_clock: Option<Arc<dyn Clock>>,
    /// Whether the last request view found the prompt cache expired: the
    /// preflight that follows it in the same call may compact from the
    /// cold floor. Set by every view.
    cold_call: bool,
    /// A compaction the agent asked for ([`crate::control`]'s
    /// `context_compact`): the next preflight compacts, forced, with its
    /// focus.
    asked: Option<CompactionAsk>,
    /// The newest compactions, for `context_status` (at most
    /// [`LISTED_COMPACTIONS`]).
    notes: Vec<CompactionNote>,
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
            calls_since_compaction: None,
            seen_real_usage: false,
            last_report: None,
            egress: Egress::builtin(),
            call_time: None,
            wall_clock: None,
            cold_call: false,
            scheduler,
            asked: None,
            notes: Vec::new(),
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
        self.call_time.or_else(|| match &self.wall_clock {
            Some(clock) => Some(clock.now().as_secs_f64()),
            None => crate::schedule::now(),
        })
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

    /// Reads a call's time (seconds since the Unix epoch) from `clock`
    /// instead of the wall clock when the host gives none: a test moves
    /// a [`ManualClock`] past a cache's lifetime instead of sleeping.
    pub fn with_wall_clock(mut self, clock: Arc<dyn Clock>) -> Compressor {
        self.wall_clock = Some(clock);
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
        if self.asked.is_some() {
            // The agent asked (`context_compact`): as a manual compaction,
            // no cooldown or ineffectiveness holds it back.
            return None;
        }
        if let Some(seconds_left) = self.cooldown_seconds_left() {
            return Some(BlockReason::Cooldown { seconds_left });
        }
        let attempts = self.ineffective_streak.max(self.fallback_streak);
        (attempts >= 2).then_some(BlockReason::Ineffective {
            attempts,
            last_savings_percent: self.last_savings_percent,
        })
    }
}

impl Compressor {
    /// A compaction the agent asked for, pending until the next one.
    pub fn compaction_ask(&self) -> Option<&CompactionAsk> {
        self.asked.as_ref()
    }

    /// The newest compactions, oldest first (at most
    /// [`LISTED_COMPACTIONS`]).
    pub fn compaction_notes(&self) -> &[CompactionNote] {
        &self.notes
    }

    /// Records a compaction for `context_status`.
    fn note_compaction(&mut self, note: CompactionNote) {
        self.notes.push(note);
        if self.notes.len() > LISTED_COMPACTIONS {
            let extra = self.notes.len() - LISTED_COMPACTIONS;
            self.notes.drain(..extra);
        }
    }
}

#[cfg(test)]
mod tests;
