//! Where a compaction cuts: the head and tail kept verbatim, the latest user
//! message pinned, the middle summarised. Cuts only at the safe boundaries
//! [`CutPoints`] gives; this module never re-derives tool-call groups.

use super::CompressorOptions;
use super::insert::{find_summary, is_summary, without_summary};
use crate::message::{Message, Role};
use crate::tokens::TokenCounter;
use crate::validate::{CutPoints, is_real_user_turn, may_join, may_place};

/// The cut of one compaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Messages `..head_end` are kept verbatim.
    pub head_end: usize,
    /// The latest real user message, when it would otherwise fall in the
    /// middle: kept verbatim right after the head.
    pub pinned: Option<usize>,
    /// Messages `tail_start..` are kept verbatim.
    pub tail_start: usize,
    /// The previous summary inside the middle: its index and body.
    pub previous: Option<(usize, String)>,
    /// The summary goes before the pinned message, as the assistant's
    /// turn (head, summary, pinned ask, tail): where the rules forbid the
    /// ask right after the head (strict alternation) and the head would
    /// otherwise grow to an assistant turn before it.
    pub summary_first: bool,
}

/// Why a transcript has nothing to compact: the protected head and the
/// tail kept verbatim leave nothing between them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("nothing between the protected head ({head} messages) and the tail ({tail} messages)")]
pub struct NothingToCut {
    /// Messages of the head.
    pub head: usize,
    /// Messages of the tail.
    pub tail: usize,
}

impl Plan {
    /// Indices of the messages the summary replaces.
    pub fn middle(&self) -> impl Iterator<Item = usize> + '_ {
        (self.head_end..self.tail_start).filter(move |i| Some(*i) != self.pinned)
    }

    /// Number of messages kept verbatim, out of `len`.
    pub fn kept(&self) -> usize {
        self.head_end + usize::from(self.pinned.is_some())
    }
}

/// How much of the conversation's end a plan keeps verbatim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tail {
    /// The tail's token budget (`tail_ratio` of the threshold), at least
    /// `protect_last_n` messages (3 to 8).
    Normal,
    /// Half that budget, the same floor: a compaction close behind the
    /// previous one (thrash) aims deeper.
    Deep,
    /// The last group only (the escalation's second step).
    Minimal,
}

/// The plan for `messages`, or why there is nothing to compress.
pub(super) fn plan(
    messages: &[Message],
    opts: &CompressorOptions,
    threshold: u64,
    compression_count: u64,
    counter: &dyn TokenCounter,
    tail: Tail,
) -> Result<Plan, NothingToCut> {
    let minimal_tail = tail == Tail::Minimal;
    let n = messages.len();
    let cuts = CutPoints::with_profile(messages, opts.profile, opts.text_actions());
    let previous = find_summary(messages);

    // Head: the leading instructions plus, until the first compaction,
    // `protect_first_n` more messages.
    let leading = messages
        .iter()
        .take_while(|m| m.role.is_instruction())
        .count();
    let extra = if compression_count > 0 || previous.is_some() {
        0
    } else {
        opts.protect_first_n
    };
    let mut head_end = cuts.at_or_after((leading + extra).min(n));

    // Tail: walk back within the token budget, at least `floor` messages.
    let tokens: Vec<usize> = messages.iter().map(|m| counter.count_message(m)).collect();
    let mut tail_start = budget_tail(&tokens, &cuts, head_end, opts, threshold, tail);

    // A previous summary belongs to the middle, to be updated.
    let mut previous = previous.filter(|(i, _)| *i >= head_end);
    // Unless it sits in the last group (merged into its first message):
    // then it stays in the tail, which must not become empty.
    if let Some((s, _)) = &previous
        && *s >= tail_start
    {
        let after = cuts.at_or_after(s + 1);
        if after < n {
            tail_start = after;
        } else {
            previous = None;
        }
    }
    let summary_at = previous.as_ref().map(|(s, _)| *s);

    // The latest assistant text stays in the tail.
    let latest_text = messages
        .iter()
        .rposition(|m| m.role == Role::Assistant && !m.text().trim().is_empty() && !is_summary(m));
    if let Some(a) = latest_text
        && !minimal_tail
        && a >= head_end
        && a < tail_start
        && summary_at.is_none_or(|s| a > s)
    {
        tail_start = cuts.at_or_before(a).max(head_end);
    }

    // The latest user message stays verbatim: in the head, the tail, or
    // pinned between them.
    let mut pinned = None;
    let mut summary_first = false;
    // A summary merged into an ask leaves it an ask (its own words).
    let latest_user = (0..messages.len()).rev().find(|&i| {
        let m = &messages[i];
        is_real_user_turn(messages, i, opts.text_actions())
            && (!is_summary(m) || !without_summary(&m.text()).trim().is_empty())
    });
    if let Some(u) = latest_user
        && u >= head_end
        && u < tail_start
    {
        // The pinned message must be allowed right after the head (no new
        // same-role pair): grow the head to such a boundary before `u`.
        let joinable = |b: usize| may_join(&messages[..b], &messages[u..=u], opts.profile);
        // Else the summary may stand between the head and the ask as the
        // assistant's turn, the ask before the tail: the head stays.
        let between = || {
            let ask = &messages[u..=u];
            may_place(&messages[..head_end], &Role::Assistant, ask, opts.profile)
                && may_join(ask, &messages[tail_start..], opts.profile)
        };
        let head = (head_end..=u).find(|&b| cuts.is_safe(b) && joinable(b));
        match head {
            _ if !cuts.is_safe(u) || !cuts.is_safe(u + 1) => {
                tail_start = cuts.at_or_before(u).max(head_end);
            }
            Some(b) if b == head_end => pinned = Some(u),
            _ if u > head_end && between() => {
                pinned = Some(u);
                summary_first = true;
            }
            Some(b) => {
                head_end = b;
                pinned = Some(u);
            }
            None => tail_start = cuts.at_or_before(u).max(head_end),
        }
    }
    if previous.as_ref().is_some_and(|(s, _)| *s >= tail_start) {
        previous = None;
    }

    let plan = Plan {
        head_end,
        pinned,
        tail_start,
        previous,
        summary_first,
    };
    if plan.middle().next().is_none() {
        return Err(NothingToCut {
            head: head_end,
            tail: n - tail_start,
        });
    }
    Ok(plan)
}

/// Where the tail starts: walked back from the end within the token budget
/// of `tail` (at least `floor` messages), moved to a safe cut, and not
/// before `head_end`.
fn budget_tail(
    tokens: &[usize],
    cuts: &CutPoints,
    head_end: usize,
    opts: &CompressorOptions,
    threshold: u64,
    tail: Tail,
) -> usize {
    let n = tokens.len();
    let total: usize = tokens.iter().sum();
    let basis = if threshold > 0 {
        threshold as f64
    } else {
        total as f64
    };
    // The minimal tail (escalation): the last group only.
    // A deep one (thrash): half the budget, the same floor.
    let budget = match tail {
        Tail::Minimal => 0,
        Tail::Deep => (basis * opts.tail_ratio / 2.0) as usize,
        Tail::Normal => (basis * opts.tail_ratio) as usize,
    };
    let ceiling = (budget as f64 * opts.tail_ceiling) as usize;
    let floor = if tail == Tail::Minimal {
        1
    } else {
        opts.protect_last_n.clamp(3, 8)
    };
    let mut start = n;
    let mut acc = 0usize;
    while start > head_end {
        let cost = tokens[start - 1];
        if n - start >= floor && acc + cost > budget {
            break;
        }
        acc += cost;
        start -= 1;
    }
    let suffix = |from: usize| tokens[from.min(n)..].iter().sum::<usize>();
    let mut tail_start = cuts.at_or_before(start);
    if suffix(tail_start) > ceiling {
        let smaller = cuts.at_or_after(start);
        if smaller < n && smaller > tail_start {
            tail_start = smaller;
        }
    }
    tail_start.max(head_end)
}
