//! The schedule applied to the engine's edits: the digest's frontier and
//! the proactive prune's commit.

use std::borrow::Cow;

use xxhash_rust::xxh3::xxh3_64;

use super::{Edit, Scheduler, Verdict, Why};
use crate::digest::{Batches, DigestOptions, DigestReport};
use crate::message::Message;
use crate::tokens::TokenCounter;

/// The digest of one request under the schedule, and what it decided.
#[derive(Debug)]
pub struct ScheduledDigest<'a> {
    /// The request view.
    pub view: Vec<Cow<'a, Message>>,
    /// What the view's digest replaced (frozen batches included).
    pub report: DigestReport,
    /// The verdict on the pending steps, when there were any.
    pub verdict: Option<Verdict>,
    /// Digest steps (batches) applied by this call.
    pub advanced: usize,
}

/// The request view of `messages`: batches up to the schedule's frontier
/// digested; pending ones (old enough to digest, not yet frozen) digested
/// too when the scheduler says the saving pays for the cache it breaks.
/// Advances the frontier and records the request. `threshold_tokens` is the
/// engine's compaction threshold; `now` in seconds (any fixed epoch).
pub fn scheduled_digest<'a>(
    scheduler: &mut Scheduler,
    messages: &'a [Message],
    opts: &DigestOptions,
    counter: &dyn TokenCounter,
    threshold_tokens: u64,
    now: Option<f64>,
) -> ScheduledDigest<'a> {
    // Batches and re-entries found once, shared by every pass below.
    let batches = Batches::of(messages, &opts.text_actions);
    let starts = batches.starts();
    let target = starts.len().saturating_sub(opts.keep_batches);
    let state = scheduler.state();
    // The frontier holds only while the batch it ends with is still the
    // same message at the same place; otherwise the history was rewritten
    // before it (compaction, prune) and the cache broke there anyway.
    let anchored = state.digested_batches == 0
        || (state.digested_batches <= starts.len()
            && state.anchor == anchor_of(messages, starts, state.digested_batches));
    let frontier = if anchored {
        state.digested_batches.min(target)
    } else {
        0
    };

    let mut verdict = None;
    let mut through = frontier;
    let mut counted = None;
    if !anchored {
        through = target;
        verdict = Some(Verdict::Apply(Why::Rewritten));
    } else if target > frontier {
        // One digest pass: the held view is the advanced one before the
        // first batch past the frontier (batch `k` is digested identically
        // whatever the frontier) and the messages as they are from there on.
        let advanced = batches.digest_through(messages, opts, target);
        let from = starts.get(frontier).copied().unwrap_or(messages.len());
        // The cache breaks at the first message the step changes (a
        // result), not at the batch's call, which stays as it was. The
        // views agree before it, so the prefix is counted once.
        let at = (from..messages.len())
            .find(|&i| {
                advanced
                    .0
                    .get(i)
                    .is_some_and(|a| a.as_ref() != &messages[i])
            })
            .unwrap_or(messages.len());
        let at_tokens = count(counter, &advanced.0[..at]);
        let held_tokens = at_tokens
            + messages[at..]
                .iter()
                .map(|m| counter.count_message(m) as u64)
                .sum::<u64>();
        let advanced_tokens = at_tokens + count(counter, &advanced.0[at..]);
        let overhead = counter.request_overhead() as u64;
        let edit = Edit {
            at_tokens,
            saved_tokens: held_tokens.saturating_sub(advanced_tokens),
            request_tokens: advanced_tokens + overhead,
        };
        let v = scheduler.decide(&edit, threshold_tokens, now);
        counted = Some(if v.applies() {
            through = target;
            (advanced, advanced_tokens + overhead)
        } else {
            // Deferred (rare: most steps are free): the held view with its
            // own report.
            let held = batches.digest_through(messages, opts, frontier);
            (held, held_tokens + overhead)
        });
        verdict = Some(v);
    }
    let ((view, report), tokens) = match counted {
        Some(c) => c,
        None => {
            let digested = batches.digest_through(messages, opts, through);
            let tokens = count(counter, &digested.0) + counter.request_overhead() as u64;
            (digested, tokens)
        }
    };
    let state = scheduler.state_mut();
    state.digested_batches = through;
    state.anchor = anchor_of(messages, starts, through);
    scheduler.record_request(tokens, now);
    ScheduledDigest {
        view,
        report,
        verdict,
        advanced: through.saturating_sub(frontier),
    }
}

/// Whether a prune that turned `before` into `after` is committed now.
/// Nothing changes when it is not: the prune is asked again next time.
pub fn schedule_prune(
    scheduler: &Scheduler,
    before: &[Message],
    after: &[Message],
    counter: &dyn TokenCounter,
    threshold_tokens: u64,
    now: Option<f64>,
) -> Verdict {
    let first = before
        .iter()
        .zip(after)
        .position(|(a, b)| a != b)
        .unwrap_or(before.len().min(after.len()));
    let before_tokens = counter.count_messages(before) as u64;
    let after_tokens = counter.count_messages(after) as u64;
    let edit = Edit {
        at_tokens: after[..first]
            .iter()
            .map(|m| counter.count_message(m) as u64)
            .sum(),
        saved_tokens: before_tokens.saturating_sub(after_tokens),
        request_tokens: after_tokens,
    };
    scheduler.decide(&edit, threshold_tokens, now)
}

/// A hash of the message opening the last of the first `batches` batches
/// (its tool-call ids and text: what identifies a call, without hashing
/// the raw provider fields a recording carries).
fn anchor_of(messages: &[Message], starts: &[usize], batches: usize) -> Option<u64> {
    let index = *starts.get(batches.checked_sub(1)?)?;
    let message = messages.get(index)?;
    let mut key = format!("{index}\u{0}{}", message.text());
    for call in message.tool_calls() {
        key.push('\u{0}');
        key.push_str(call.id.as_deref().unwrap_or_default());
    }
    Some(xxh3_64(key.as_bytes()))
}

fn count(counter: &dyn TokenCounter, view: &[Cow<'_, Message>]) -> u64 {
    view.iter().map(|m| counter.count_message(m) as u64).sum()
}
