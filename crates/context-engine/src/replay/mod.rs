//! Replay a recorded agent session through an engine: what would it have
//! sent, when would it have compacted, what would the provider's prompt
//! cache have saved, and what survived.
//!
//! Each assistant message of the recording is one model call whose request
//! was everything before it. The replay drives a [`Session`] exactly as an
//! agent would: the recorded messages are appended to a stored history,
//! accepted compactions and prunes replace that history, and every request
//! goes through [`Session::before_request`]. The unmanaged agent's request
//! is the recording's own prefix, counted with the same tokenizer so that
//! the two columns compare like with like.

use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;

use crate::compressor::fit::{FitStep, Unfittable};
use crate::digest::ToolChannel;
use crate::engine::Usage;
use crate::host::{Compaction, Missed, MissedKind, Notice, Session};
use crate::message::{Message, Role};
use crate::pricing::{CostParts, PromptCache};
use crate::retention::{Probe, RetentionReport, check_with_archive, extract_probes};
use crate::store::{ArchivedCompaction, archived_compactions};
use crate::summary_text::is_summary;
use crate::tokens::{TokenCounter, recorded_prompt_tokens};
use crate::transcript::recorded_time;
use crate::validate::{
    Profile, Rule, introduced_violation, is_real_user_turn, reentries_with, validate,
};

pub use crate::pricing::PriceModel;

mod run;

use run::Run;

/// Why a recording cannot be replayed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// Nothing to replay: no message was written by the model.
    #[error(
        "no assistant message: there is no model call to replay (is this an agent transcript? try `ctx inspect`)"
    )]
    NoAssistantTurns,
    /// A request of the recording is one no provider would accept, so no
    /// engine can be measured against it.
    #[error(
        "message {index}: {rule}: {detail}; the recorded requests are not valid, so they cannot be replayed (run `ctx validate` for every problem)"
    )]
    BrokenPairing {
        /// The offending message.
        index: usize,
        /// The rule it breaks.
        rule: Rule,
        /// What is wrong.
        detail: String,
    },
}

/// Options of a replay.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Prices for the cost estimate.
    pub price: PriceModel,
    /// Rules every request must keep (checked per call: no new violation).
    pub profile: Profile,
    /// When each recorded message was written (seconds since the Unix
    /// epoch), by index, for recordings whose messages do not carry it
    /// (session logs: [`Transcript::message_times`](crate::transcript::Transcript::message_times));
    /// empty or `None` falls back to the message's own
    /// [`recorded_time`](crate::transcript::recorded_time).
    pub message_times: Vec<Option<f64>>,
    /// Which user messages are a text-action agent's tool output
    /// (`context.text_actions`): where calls end and what is an ask.
    pub text_actions: crate::validate::TextActions,
}

impl Default for ReplayOptions {
    fn default() -> ReplayOptions {
        ReplayOptions {
            price: PriceModel::default(),
            profile: Profile::OpenAi,
            message_times: Vec::new(),
            text_actions: crate::validate::TextActions::default(),
        }
    }
}

impl ReplayOptions {
    /// Sets [`price`](Self::price).
    pub fn with_price(mut self, price: PriceModel) -> ReplayOptions {
        self.price = price;
        self
    }

    /// Sets [`text_actions`](Self::text_actions).
    pub fn with_text_actions(mut self, actions: crate::validate::TextActions) -> ReplayOptions {
        self.text_actions = actions;
        self
    }

    /// Sets [`profile`](Self::profile).
    pub fn with_profile(mut self, profile: Profile) -> ReplayOptions {
        self.profile = profile;
        self
    }

    /// Sets [`message_times`](Self::message_times).
    pub fn with_message_times(mut self, times: Vec<Option<f64>>) -> ReplayOptions {
        self.message_times = times;
        self
    }
}

/// One model call of the replay.
#[derive(Clone, Debug, Serialize)]
pub struct CallRecord {
    /// Position among the calls, from 0.
    pub call: usize,
    /// Index of the assistant message in the recording.
    pub message_index: usize,
    /// Prompt tokens the unmanaged agent sent (the recording's prefix).
    pub tokens_without_engine: u64,
    /// Prompt tokens of the request the engine prepared.
    pub tokens_with_engine: u64,
    /// The provider's recorded prompt tokens for this call, when the
    /// recording has them.
    pub recorded_prompt_tokens: Option<u64>,
    /// Completion tokens of the call (recorded, else counted).
    pub completion_tokens: u64,
    /// What the provider's prompt cache would serve of the engine's
    /// request: the longest common prefix, in tokens, with an earlier
    /// request still alive under the cache's lifetime, rounded down to its
    /// granularity, zero under its minimum (see [`PromptCache`]).
    pub cache_hit_tokens: u64,
    /// The same for the unmanaged agent.
    pub cache_hit_tokens_without_engine: u64,
    /// Uncached tokens of the engine's request billed at the cache-write
    /// price (see [`CacheLookup::written_tokens`](crate::pricing::CacheLookup));
    /// the rest of the uncached ones pay the input price. Under a
    /// breakpoint cache the engine's request is marked at its system
    /// prompt and at the end of what the next request keeps
    /// ([`Session::stable_prefix`]), the unmanaged
    /// agent's at its system prompt and its last message.
    pub cache_written_tokens: u64,
    /// The same for the unmanaged agent.
    pub cache_written_tokens_without_engine: u64,
    /// The engine's request changed something before content the previous
    /// request had, which is then sent again uncached (see
    /// [`CacheLookup::resent_tokens`](crate::pricing::CacheLookup)), or the
    /// cache had expired.
    pub cache_broke: bool,
    /// Every earlier cache entry had expired (an idle gap longer than the
    /// cache's lifetime before this call): the request went out uncached
    /// whatever the engine did.
    pub cache_expired: bool,
    /// Tokens of the engine's request that the previous request had after
    /// the point where this one changed it: cached content sent again at
    /// the full price (see [`CacheLookup::resent_tokens`](crate::pricing::CacheLookup)).
    pub cache_resent_tokens: u64,
    /// Tokens of the engine's request that an earlier request had too: the
    /// common prefix before the cache's rounding, plus the re-sent tokens.
    /// What the cache could at best have served.
    pub cache_reusable_tokens: u64,
    /// The same for the unmanaged agent.
    pub cache_reusable_tokens_without_engine: u64,
    /// When the call was made, in seconds since the Unix epoch, when the
    /// recording has timestamps.
    pub sent_at: Option<f64>,
    /// A compaction accepted before this call.
    pub compaction: Option<Compaction>,
    /// Tool results the proactive prune shortened before this call.
    pub pruned: usize,
    /// The engine replaced the request (digest, retrieval).
    pub selected: bool,
    /// Messages in the request the engine prepared.
    pub messages_with_engine: usize,
    /// Violations of the profile this request has that the unmanaged
    /// request did not (0 for a correct engine).
    pub violations_introduced: usize,
    /// The request would have gone out larger than the window.
    pub over_window: bool,
    /// The escalation steps the host took to fit this request.
    pub fit: Vec<FitStep>,
    /// No request could fit (system prompt + latest ask over the window):
    /// the host would not have sent this call.
    pub unfittable: Option<Unfittable>,
    /// Time spent in the engine for this call (preflight, selection,
    /// post-tool checks and usage update), summarizer calls included.
    #[serde(
        rename = "engine_time_ms",
        serialize_with = "crate::duration_ms::serialize"
    )]
    pub engine_time: Duration,
    /// Notices the driver raised for this call.
    pub notices: Vec<Notice>,
    /// A compaction that was due before this call but did not happen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missed_compaction: Option<Missed>,
}

/// Sums over all calls.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    /// Model calls replayed.
    pub calls: usize,
    /// Prompt tokens sent with the engine.
    pub prompt_tokens_with_engine: u64,
    /// Prompt tokens the unmanaged agent sent.
    pub prompt_tokens_without_engine: u64,
    /// `with / without`.
    pub token_ratio: f64,
    /// Completion tokens (the same with and without: the replay does not
    /// change what the model answered).
    pub completion_tokens: u64,
    /// Prompt-cache hits with the engine.
    pub cache_hit_tokens: u64,
    /// Prompt-cache hits without it.
    pub cache_hit_tokens_without_engine: u64,
    /// `cache_hit_tokens / prompt_tokens_with_engine`.
    pub cache_hit_share: f64,
    /// `cache_hit_tokens_without_engine / prompt_tokens_without_engine`.
    pub cache_hit_share_without_engine: f64,
    /// The engine's cache-hit share over the calls that do not follow a
    /// compaction (a compaction rewrites the request by design).
    pub cache_hit_share_between_compactions: f64,
    /// The engine's cache-hit share over the calls between compactions
    /// proper: neither the call a compaction rewrote nor the one right
    /// after it (the goal's measure; those calls miss by design).
    pub cache_hit_share_steady: f64,
    /// The unmanaged agent's cache-hit share over the same calls as
    /// [`cache_hit_share_steady`](Self::cache_hit_share_steady), so the two
    /// compare like with like.
    pub cache_hit_share_steady_without_engine: f64,
    /// Calls whose request broke the engine's cache.
    pub cache_breaks: usize,
    /// Calls that broke it neither at a compaction nor right after one, nor
    /// after an idle gap that expired the cache: the breaks the schedule's
    /// edits (digest steps, prunes, fitting) caused.
    pub cache_breaks_between_compactions: usize,
    /// Of the tokens an earlier request had too, the share the cache
    /// served, over the calls that do not follow a compaction: what the
    /// engine's edits and the cache's rounding kept of the reusable prefix
    /// (the hit share also falls when the engine shrinks the request, since
    /// the new content of each call stays the same).
    pub cache_reuse_share_between_compactions: f64,
    /// The same for the unmanaged agent, over every call.
    pub cache_reuse_share_without_engine: f64,
    /// Tokens sent again uncached after a break, over all calls.
    pub resent_tokens: u64,
    /// The same, on the calls right after a compaction.
    pub resent_tokens_at_compactions: u64,
    /// The engine's bill by what its tokens were billed as.
    pub cost_parts_with_engine: CostParts,
    /// The unmanaged agent's.
    pub cost_parts_without_engine: CostParts,
    /// Estimated cost with the engine, in the price model's currency.
    pub estimated_cost_with_engine: f64,
    /// Estimated cost without it.
    pub estimated_cost_without_engine: f64,
    /// The largest request with the engine.
    pub largest_request_with_engine: u64,
    /// The largest request without it.
    pub largest_request_without_engine: u64,
    /// Compactions accepted.
    pub compactions: usize,
    /// Compactions attempted that the engine failed (summarizer, plugin).
    pub compactions_failed: usize,
    /// Compactions attempted whose result was refused (invalid output).
    pub compactions_refused: usize,
    /// Calls where a due compaction was held back (cooldown, anti-thrash).
    pub compactions_blocked: usize,
    /// The first failed or refused attempt's reason.
    pub first_compaction_failure: Option<String>,
    /// The first hold-back's reason.
    pub first_compaction_block: Option<String>,
    /// Calls preceded by a proactive prune.
    pub prunes: usize,
    /// Calls whose request the engine replaced (digested).
    pub selected: usize,
    /// Engine time per call.
    pub engine_time: TimeStats,
    /// Requests that would have gone out larger than the window.
    pub over_window: OverWindow,
    /// Calls (from 1) that could not fit at all and were not sent.
    pub unfittable_calls: Vec<usize>,
    /// Calls whose request the host fitted under the window by escalation.
    pub fitted: usize,
    /// Calls (from 1) whose compaction followed the previous one within
    /// [`THRASH_CALLS`](crate::engine::THRASH_CALLS) calls (each warned):
    /// the window barely holds the system prompt and the tail.
    pub thrash_calls: Vec<usize>,
    /// Calls (from 1) whose request could not hold the summary's state
    /// record whole and carried it cut (each warned): what of the session
    /// such a request lacks, the history still holds.
    pub ledger_cut_calls: Vec<usize>,
}

/// Requests over the window: how many, the largest, at which calls.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OverWindow {
    /// How many.
    pub requests: usize,
    /// Tokens of the largest.
    pub largest: u64,
    /// The calls (from 1).
    pub calls: Vec<usize>,
}

/// Median, 99th percentile and maximum of the engine time per call.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct TimeStats {
    /// Median, in milliseconds.
    pub median_ms: f64,
    /// 99th percentile (nearest rank), in milliseconds.
    pub p99_ms: f64,
    /// Maximum, in milliseconds.
    pub max_ms: f64,
}

/// Everything a replay measured.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    /// The engine's name.
    pub engine: String,
    /// The model window the engine managed.
    pub context_length: u64,
    /// The engine's compaction threshold at the start.
    pub threshold_tokens: u64,
    /// The price model of the estimates.
    pub price: PriceModel,
    /// Sums.
    pub totals: Totals,
    /// The bill of the unmanaged agent, of the engine digesting on every
    /// call and of the scheduled engine, side by side, when the replay was
    /// compared with a baseline ([`with_baseline`](Self::with_baseline)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub costs: Option<CostComparison>,
    /// What survived in the last request: probes (user asks, files,
    /// commands, errors) of the messages seen until then.
    pub retention: RetentionReport,
    /// Every accepted compaction, with what survived right after it.
    pub compactions: Vec<CompactionRecord>,
    /// One entry per model call.
    pub calls: Vec<CallRecord>,
    /// The request of the last call, as the engine prepared it.
    #[serde(skip)]
    pub final_request: Vec<Message>,
    /// The stored history at the end (after compactions and prunes).
    #[serde(skip)]
    pub final_history: Vec<Message>,
    /// Every accepted compaction: the call before which it ran, the request
    /// it produced, and the stored history then (for retention checks).
    #[serde(skip)]
    pub compaction_views: Vec<CompactionView>,
}

/// One policy's bill over a replay.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostLine {
    /// Estimated cost, in the price model's currency.
    pub estimated_cost: f64,
    /// Prompt tokens sent.
    pub prompt_tokens: u64,
    /// Prompt tokens read from the cache.
    pub cache_hit_tokens: u64,
    /// `cache_hit_tokens / prompt_tokens`.
    pub cache_hit_share: f64,
    /// The same over calls not preceded by a compaction.
    pub cache_hit_share_between_compactions: f64,
    /// The same over the calls neither at a compaction nor right after one
    /// (for the unmanaged agent: over the scheduled engine's such calls).
    pub cache_hit_share_steady: f64,
    /// Of the tokens an earlier request had too, the share read from the
    /// cache, over calls not preceded by a compaction.
    pub cache_reuse_share_between_compactions: f64,
    /// Calls that broke the cache.
    pub cache_breaks: usize,
    /// Of those, the ones neither at or right after a compaction nor after
    /// the cache expired.
    pub cache_breaks_between_compactions: usize,
    /// Tokens sent again uncached after a break.
    pub resent_tokens: u64,
    /// The same, on the calls right after a compaction.
    pub resent_tokens_at_compactions: u64,
    /// The bill by what its tokens were billed as: cache reads, new
    /// content, content re-sent after a break, output.
    pub parts: CostParts,
    /// Compactions.
    pub compactions: usize,
}

/// The unmanaged agent, the engine digesting one batch per call, and the
/// engine under the cache-aware schedule, on the same recording and prices.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostComparison {
    /// The recording as it was sent.
    pub unmanaged: CostLine,
    /// The engine with the schedule off (every digest step at once).
    pub every_call_digest: CostLine,
    /// The engine under the schedule.
    pub scheduled: CostLine,
}

impl CostLine {
    fn engine(t: &Totals) -> CostLine {
        CostLine {
            estimated_cost: t.estimated_cost_with_engine,
            prompt_tokens: t.prompt_tokens_with_engine,
            cache_hit_tokens: t.cache_hit_tokens,
            cache_hit_share: t.cache_hit_share,
            cache_hit_share_between_compactions: t.cache_hit_share_between_compactions,
            cache_hit_share_steady: t.cache_hit_share_steady,
            cache_reuse_share_between_compactions: t.cache_reuse_share_between_compactions,
            cache_breaks: t.cache_breaks,
            cache_breaks_between_compactions: t.cache_breaks_between_compactions,
            resent_tokens: t.resent_tokens,
            resent_tokens_at_compactions: t.resent_tokens_at_compactions,
            parts: t.cost_parts_with_engine,
            compactions: t.compactions,
        }
    }

    fn unmanaged(t: &Totals) -> CostLine {
        CostLine {
            estimated_cost: t.estimated_cost_without_engine,
            prompt_tokens: t.prompt_tokens_without_engine,
            cache_hit_tokens: t.cache_hit_tokens_without_engine,
            cache_hit_share: t.cache_hit_share_without_engine,
            cache_hit_share_between_compactions: t.cache_hit_share_without_engine,
            cache_hit_share_steady: t.cache_hit_share_steady_without_engine,
            cache_reuse_share_between_compactions: t.cache_reuse_share_without_engine,
            cache_breaks: 0,
            cache_breaks_between_compactions: 0,
            resent_tokens: 0,
            resent_tokens_at_compactions: 0,
            parts: t.cost_parts_without_engine,
            compactions: 0,
        }
    }
}

impl ReplayReport {
    /// Adds the side-by-side bill ([`costs`](Self::costs)): this report is
    /// the scheduled engine's, `every_call` the same recording replayed
    /// with the schedule off.
    pub fn with_baseline(mut self, every_call: &ReplayReport) -> ReplayReport {
        self.costs = Some(CostComparison {
            unmanaged: CostLine::unmanaged(&self.totals),
            every_call_digest: CostLine::engine(&every_call.totals),
            scheduled: CostLine::engine(&self.totals),
        });
        self
    }
}

/// One accepted compaction and what survived it.
#[derive(Clone, Debug, Serialize)]
pub struct CompactionRecord {
    /// The call before which it ran (from 0).
    pub call: usize,
    /// What the driver reported of it.
    #[serde(flatten)]
    pub compaction: Compaction,
    /// Probes of the messages seen until then, checked in the request sent
    /// right after it and the stored history then.
    pub retention: RetentionReport,
    /// The summary as the model received it: the messages of the request
    /// sent right after the compaction that carry a summary (its state
    /// record included).
    pub summary: Vec<Message>,
    /// Each pass as the session store archived it: the span it replaced,
    /// with the replaced messages, and the summary it added. Empty without
    /// a store (`ctx replay --no-store`).
    pub archived: Vec<ArchivedCompaction>,
}

/// The state right after one compaction, kept for retention checks.
#[derive(Clone, Debug)]
pub struct CompactionView {
    /// The call before which it ran.
    pub call: usize,
    /// How many messages of the recording had been seen then.
    pub seen: usize,
    /// The request sent right after it.
    pub request: Vec<Message>,
    /// The stored history right after it.
    pub history: Vec<Message>,
    /// Compaction records the session had numbered after it
    /// ([`Session::records_numbered`]): its passes are the last
    /// `passes` of them.
    pub records_numbered: u64,
}

/// Checks that `messages` can be replayed: at least one model call and no
/// tool result that no request could carry.
pub fn check_replayable(messages: &[Message]) -> Result<(), ReplayError> {
    if !messages.iter().any(|m| m.role == Role::Assistant) {
        return Err(ReplayError::NoAssistantTurns);
    }
    let fatal = [
        Rule::OrphanToolResult,
        Rule::ToolResultWithoutId,
        Rule::DuplicateToolResult,
    ];
    if let Some(v) = validate(messages, Profile::OpenAi)
        .into_iter()
        .find(|v| fatal.contains(&v.rule))
    {
        return Err(ReplayError::BrokenPairing {
            index: v.index,
            rule: v.rule,
            detail: v.detail,
        });
    }
    Ok(())
}

/// Replays `recording` through `session`; `counter` counts both sides;
/// `progress(done, total)` is called after each call.
pub fn replay(
    recording: &[Message],
    session: &mut Session,
    counter: &dyn TokenCounter,
    options: &ReplayOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<ReplayReport, ReplayError> {
    check_replayable(recording)?;
    let call_indexes: Vec<usize> = recording
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Assistant)
        .map(|(i, _)| i)
        .collect();
    let total = call_indexes.len();
    let state = session.engine().state();
    let threshold_tokens = state.threshold_tokens;
    let mut run = Run {
        recording,
        counter,
        options,
        context_length: state.context_length,
        // Tool results that arrive as user messages (envelopes, observations).
        reentry: reentries_with(recording, &options.text_actions),
        history: Vec::new(),
        // Per-message token counts of the recording, summed as the
        // unmanaged prefix grows (count_message is additive).
        unmanaged_tokens: counter.request_overhead() as u64,
        cursor: 0,
        cache: PromptCache::new(options.price.cache.clone()),
        unmanaged_cache: PromptCache::new(options.price.cache.clone()),
        calls: Vec::with_capacity(total),
        compaction_views: Vec::new(),
        last_sent_at: None,
    };
    let mut final_request = Vec::new();
    for (call, &index) in call_indexes.iter().enumerate() {
        let request = run.call(session, call, index);
        if call + 1 == total {
            final_request = request;
        }
        progress(call + 1, total);
    }
    // What follows the last call (its tool results, a closing message).
    run.history.extend_from_slice(&recording[run.cursor..]);
    session.turn_complete(&run.history, &Default::default());
    session.end(&run.history);
    session.set_call_time(None);
    Ok(run.report(session, threshold_tokens, final_request))
}

/// The provider's prompt count `recorded` (for the unmanaged request of
/// `unmanaged` tokens) scaled to the engine's request of `with_engine`
/// tokens; without one, the engine's own count.
fn scaled_prompt(recorded: Option<u64>, unmanaged: u64, with_engine: u64) -> u64 {
    match recorded {
        Some(r) if unmanaged > 0 => {
            (r as f64 * with_engine as f64 / unmanaged as f64).round() as u64
        }
        _ => with_engine,
    }
}

/// When the call answered by `recording[index]` was made: the time of
/// the newest message before it that has one (in this call's segment, else
/// the answer's own), in seconds; `times` first, then the message's own.
/// Where a host marks a breakpoint cache on `request`: the end of its
/// leading system messages (the system prompt, when there is one) and
/// `stable` messages in (the end of the request for an agent on its own).
/// An automatic cache ignores them.
fn cache_marks(request: &[Message], stable: usize) -> [usize; 2] {
    let system = request
        .iter()
        .take_while(|m| m.role == Role::System)
        .count();
    [system, stable]
}

fn call_time(
    recording: &[Message],
    times: &[Option<f64>],
    cursor: usize,
    index: usize,
) -> Option<f64> {
    let at = |k: usize| {
        times
            .get(k)
            .copied()
            .flatten()
            .or_else(|| recording.get(k).and_then(recorded_time))
    };
    (cursor..index).rev().find_map(at).or_else(|| at(index))
}

/// Completion tokens the provider recorded for the call that wrote `m`.
fn recorded_completion_tokens(m: &Message) -> Option<u64> {
    let usage = m
        .extra
        .get("extra")
        .and_then(|e| e.get("response"))
        .or_else(|| m.extra.get("response"))
        .and_then(|r| r.get("usage"))
        .or_else(|| m.extra.get("usage"))?;
    usage
        .get("completion_tokens")
        .or_else(|| usage.get("output_tokens"))
        .and_then(serde_json::Value::as_u64)
}

fn totals(calls: &[CallRecord], price: &PriceModel) -> Totals {
    let mut t = Totals {
        calls: calls.len(),
        ..Totals::default()
    };
    for c in calls {
        t.prompt_tokens_with_engine += c.tokens_with_engine;
        t.prompt_tokens_without_engine += c.tokens_without_engine;
        t.completion_tokens += c.completion_tokens;
        t.cache_hit_tokens += c.cache_hit_tokens;
        t.cache_hit_tokens_without_engine += c.cache_hit_tokens_without_engine;
        let with_engine = price.cost_parts(
            c.tokens_with_engine,
            c.cache_hit_tokens,
            c.cache_written_tokens,
            c.cache_resent_tokens,
            c.completion_tokens,
        );
        let without_engine = price.cost_parts(
            c.tokens_without_engine,
            c.cache_hit_tokens_without_engine,
            c.cache_written_tokens_without_engine,
            0,
            c.completion_tokens,
        );
        t.estimated_cost_with_engine += with_engine.total();
        t.estimated_cost_without_engine += without_engine.total();
        t.cost_parts_with_engine.add(&with_engine);
        t.cost_parts_without_engine.add(&without_engine);
        t.resent_tokens += c.cache_resent_tokens;
        if c.compaction.is_some() {
            t.resent_tokens_at_compactions += c.cache_resent_tokens;
        }
        t.largest_request_with_engine = t.largest_request_with_engine.max(c.tokens_with_engine);
        t.largest_request_without_engine = t
            .largest_request_without_engine
            .max(c.tokens_without_engine);
        t.compactions += usize::from(c.compaction.is_some());
        if let Some(m) = &c.missed_compaction {
            match m.kind {
                MissedKind::Failed => t.compactions_failed += 1,
                MissedKind::Refused => t.compactions_refused += 1,
                MissedKind::Blocked => t.compactions_blocked += 1,
                MissedKind::NothingToCompress | MissedKind::Deferred => {}
            }
            let first = if m.kind == MissedKind::Blocked {
                &mut t.first_compaction_block
            } else {
                &mut t.first_compaction_failure
            };
            if first.is_none()
                && m.kind != MissedKind::NothingToCompress
                && m.kind != MissedKind::Deferred
            {
                *first = Some(m.reason.clone());
            }
        }
        t.prunes += usize::from(c.pruned > 0);
        t.selected += usize::from(c.selected);
        t.fitted += usize::from(!c.fit.is_empty());
        if c.over_window {
            t.over_window.requests += 1;
            t.over_window.largest = t.over_window.largest.max(c.tokens_with_engine);
            t.over_window.calls.push(c.call + 1);
        }
        if c.unfittable.is_some() {
            t.unfittable_calls.push(c.call + 1);
        }
        let warned = |prefix: &str| c.notices.iter().any(|n| n.text.starts_with(prefix));
        if warned(crate::host::THRASH) {
            t.thrash_calls.push(c.call + 1);
        }
        if warned(crate::host::LEDGER_CUT) {
            t.ledger_cut_calls.push(c.call + 1);
        }
    }
    t.token_ratio = ratio(t.prompt_tokens_with_engine, t.prompt_tokens_without_engine);
    t.cache_hit_share = ratio(t.cache_hit_tokens, t.prompt_tokens_with_engine);
    t.cache_hit_share_without_engine = ratio(
        t.cache_hit_tokens_without_engine,
        t.prompt_tokens_without_engine,
    );
    let (mut hits, mut sent, mut reusable) = (0, 0, 0);
    let mut unmanaged_reusable = 0;
    // The steady calls: neither at a compaction nor right after one.
    let (mut steady_hits, mut steady_sent) = (0, 0);
    let (mut steady_unmanaged_hits, mut steady_unmanaged_sent) = (0, 0);
    let mut after_compaction = false;
    for c in calls {
        if c.compaction.is_none() {
            hits += c.cache_hit_tokens;
            sent += c.tokens_with_engine;
            reusable += c.cache_reusable_tokens;
        }
        let steady = c.compaction.is_none() && !after_compaction;
        if steady {
            steady_hits += c.cache_hit_tokens;
            steady_sent += c.tokens_with_engine;
            steady_unmanaged_hits += c.cache_hit_tokens_without_engine;
            steady_unmanaged_sent += c.tokens_without_engine;
            // An expired cache misses for the unmanaged agent too and
            // re-sends nothing (every entry is gone): only edits count.
            t.cache_breaks_between_compactions += usize::from(c.cache_resent_tokens > 0);
        }
        after_compaction = c.compaction.is_some();
        unmanaged_reusable += c.cache_reusable_tokens_without_engine;
        t.cache_breaks += usize::from(c.cache_broke);
    }
    t.cache_hit_share_steady = ratio(steady_hits, steady_sent);
    t.cache_hit_share_steady_without_engine = ratio(steady_unmanaged_hits, steady_unmanaged_sent);
    t.cache_hit_share_between_compactions = ratio(hits, sent);
    t.cache_reuse_share_between_compactions = ratio(hits, reusable);
    t.cache_reuse_share_without_engine =
        ratio(t.cache_hit_tokens_without_engine, unmanaged_reusable);
    let mut times: Vec<f64> = calls
        .iter()
        .map(|c| c.engine_time.as_secs_f64() * 1000.0)
        .collect();
    times.sort_by(f64::total_cmp);
    t.engine_time = TimeStats {
        median_ms: nearest_rank(&times, 0.5),
        p99_ms: nearest_rank(&times, 0.99),
        max_ms: times.last().copied().unwrap_or(0.0),
    };
    t
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The `q` quantile of sorted `xs` by the nearest-rank method.
fn nearest_rank(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let rank = (q * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

#[cfg(test)]
mod tests;
