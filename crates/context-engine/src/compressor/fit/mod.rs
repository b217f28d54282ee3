//! Guaranteed fit: the escalation ladder that brings a request under a
//! token budget when the normal compaction did not, losing least first.
//!
//! [`fit`] takes a request (or a compacted history) and a budget and, while
//! the request is over it, climbs these steps in order, stopping as soon as
//! it fits:
//!
//! 1. [`FitStepKind::DigestResults`]: large tool results, the newest batch's
//!    included, keep the head and tail of their body and a recall handle
//!    (largest first);
//! 2. [`FitStepKind::ShrinkTail`]: whole tool-call groups between the head
//!    and the protected core (the latest user ask and the last group) are
//!    left out, oldest first;
//! 3. [`FitStepKind::Clip`]: long assistant texts, other user texts and the
//!    string leaves of tool-call arguments are clipped (valid JSON stays
//!    valid JSON), largest first;
//! 4. [`FitStepKind::LowerSummary`]: the summary's body is cut down to what
//!    is left: its narrative first, then its ledger (the state record)
//!    rendered again in less room, then the rest;
//! 5. [`FitStepKind::Truncate`]: deterministic truncation to the system
//!    prompt, the latest ask and what of the last group still fits.
//!
//! When even the system prompt and the latest ask exceed the budget no
//! request can fit: [`Unfittable`] names the sizes and the host does not
//! send. Every step keeps the request valid under the profile (no new
//! violation, no new same-role adjacency, asked of [`crate::validate`]);
//! every reduced tool result names its recall handle, and the stored
//! history still holds the original.

use super::insert::{SUMMARY_END, SUMMARY_PREFIX, is_summary, without_summary};
use crate::digest::{names_recall_handle, result_handle};
pub use crate::engine::{FitStep, FitStepKind, Unfittable};
use crate::message::{Content, Message, Role};
use crate::prune::clip_arguments;
use crate::recall::RECALL_TOOL;
use crate::summarize::state::StateRecord;
use crate::tokens::TokenCounter;

use crate::validate::{
    CutPoints, Profile, TextActions, introduced_adjacency, introduced_violation, is_real_user_turn,
    is_reentry_with, may_join, may_place, reentries_with,
};

/// Tool results of at least this many bytes are digested by step 1.
pub const RESULT_MIN_BYTES: usize = 2048;
/// Bytes kept at each end of a digested result.
const RESULT_KEEP_BYTES: usize = 512;
/// Texts of at least this many bytes are clipped by step 3.
const TEXT_MIN_BYTES: usize = 1024;
/// Bytes kept at each end of a clipped text.
const TEXT_KEEP_BYTES: usize = 256;
/// Characters kept of each long string leaf of tool-call arguments.
const ARGUMENT_LEAF_CHARS: usize = 200;
/// Bytes kept at each end in the final truncation.
const TRUNCATE_KEEP_BYTES: usize = 64;

/// A request brought under its budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Fitted {
    /// The request.
    pub messages: Vec<Message>,
    /// The steps taken, in order (empty when it already fitted).
    pub steps: Vec<FitStep>,
    /// Tokens before.
    pub tokens_before: u64,
    /// Tokens after (at most the budget).
    pub tokens_after: u64,
    /// Indexes of the input messages that are not in the request as they
    /// were (left out, clipped or digested), in order. A host with a
    /// session store archives their originals under
    /// [`archive_handle`](Self::archive_handle).
    pub left_out: Vec<usize>,
    /// The span handle of the originals of [`left_out`](Self::left_out)
    /// that the request names in its left-out note (see [`fit_noted`]);
    /// `None` when nothing was left out or the note did not fit.
    pub archive_handle: Option<String>,
}

/// `messages` brought to at most `budget` tokens by the ladder (see the
/// module docs), or why no request can fit.
pub fn fit(
    messages: &[Message],
    budget: u64,
    counter: &dyn TokenCounter,
    profile: Profile,
    actions: &TextActions,
) -> Result<Fitted, Unfittable> {
    fit_impl(messages, budget, counter, profile, actions, false)
}

/// [`fit`], and when the ladder left anything out of the request (or cut
/// it without a handle of its own), the request names what it lost: a
/// note (a user message of its own where the request first departs from
/// its input, so the cached prefix before it is untouched; where no such
/// message may stand, appended to the system prompt, else to the latest
/// ask) gives the
/// [span handle](crate::store::span_handle) of the originals of every
/// such message and repeats the user's asks among them (from a left-out
/// summary's state record too), so the asks stay in the request and the
/// rest stays reachable; what room the budget leaves after the note
/// carries the ledger of the left-out messages (their files, commands and
/// error lines the request does not show elsewhere), so they stay in the
/// request too. `originals[i]` is the stored original of
/// `messages[i]` (the request may be a digested view); the handle is
/// computed over them, so a host archives exactly
/// `left_out.map(|i| originals[i])` under it. The ladder runs again with
/// room for the note; when the asks do not fit the note names the handle
/// alone, unless `require_asks`; when even that cannot fit, the request
/// goes without it (`archive_handle` is `None`).
pub fn fit_noted(
    messages: &[Message],
    originals: &[Message],
    budget: u64,
    counter: &dyn TokenCounter,
    profile: Profile,
    actions: &TextActions,
    require_asks: bool,
) -> Result<Fitted, Unfittable> {
    let first = fit_impl(messages, budget, counter, profile, actions, false)?;
    if first.left_out.is_empty() || originals.len() != messages.len() {
        return Ok(first);
    }
    // Room for the note, sized on the first fit's (a second fit leaves out
    // at least as much, so its note may be longer: it is counted again).
    let modes: &[bool] = if require_asks {
        &[true]
    } else {
        &[true, false]
    };
    for &with_asks in modes {
        let Some((_, note)) = left_out_note(&first, originals, with_asks, actions) else {
            break;
        };
        let mut reserve = counter.count_message(&Message::system(note)) as u64;
        // A fit with less room may leave more out (a longer note): the
        // reserve grows by what the last try was over, a few times.
        for _ in 0..3 {
            let Ok(mut second) = fit_impl(
                messages,
                budget.saturating_sub(reserve),
                counter,
                profile,
                actions,
                false,
            ) else {
                break;
            };
            let Some((handle, note)) = left_out_note(&second, originals, with_asks, actions) else {
                break;
            };
            // Where the request first departs from its input: the note
            // stands there as a message of its own, so the prefix before it
            // (the part a provider has cached) stays byte for byte.
            let gap = note_gap(&second.messages, messages, profile, actions);
            let target = match gap {
                Some(_) => None,
                None => match note_target(&second.messages, actions) {
                    Some(at) => Some(at),
                    None => return Ok(first),
                },
            };
            // The request with `note` placed, and its tokens.
            let place = |note: &str| -> (Message, u64) {
                match target {
                    None => {
                        let noted = Message::user(note.to_owned());
                        let tokens = second.tokens_after + counter.count_message(&noted) as u64;
                        (noted, tokens)
                    }
                    Some(at) => {
                        let noted = with_appended(&second.messages[at], note);
                        let tokens = second.tokens_after
                            - counter.count_message(&second.messages[at]) as u64
                            + counter.count_message(&noted) as u64;
                        (noted, tokens)
                    }
                }
            };
            let (mut noted, mut tokens) = place(&note);
            if tokens > budget {
                reserve += tokens - budget;
                continue;
            }
            // What room the budget leaves carries the ledger of what was
            // left out: its files, commands and error lines stay in the
            // request, not only behind the handle.
            let mut room = (budget - tokens) as usize * 4;
            let ledger = (room >= LEDGER_NOTE_MIN_BYTES)
                .then(|| left_out_ledger(&second.messages, &gone_of(&second, originals), actions))
                .flatten();
            while let Some(record) = ledger.as_ref().filter(|_| room >= LEDGER_NOTE_MIN_BYTES) {
                let Some(entries) = record.render_entries(room) else {
                    break;
                };
                let (n, t) = place(&format!("{note}\n{entries}"));
                if t <= budget {
                    (noted, tokens) = (n, t);
                    break;
                }
                room = room * 3 / 4;
            }
            match (gap, target) {
                (Some(at), _) => second.messages.insert(at, noted),
                (None, Some(at)) => second.messages[at] = noted,
                (None, None) => return Ok(first),
            }
            second.tokens_after = tokens;
            second.archive_handle = Some(handle);
            return Ok(second);
        }
    }
    Ok(first)
}

/// The longest ask a left-out note repeats, in bytes.
const NOTE_ASK_MAX: usize = 400;
/// The smallest room, in bytes, worth giving a left-out note's ledger.
const LEDGER_NOTE_MIN_BYTES: usize = 160;

/// The originals of what `fitted` left out.
fn gone_of(fitted: &Fitted, originals: &[Message]) -> Vec<Message> {
    fitted
        .left_out
        .iter()
        .filter_map(|&i| originals.get(i).cloned())
        .collect()
}

/// The ledger of the `gone` messages (a left-out summary's carried too)
/// that a left-out note carries: their files, commands and error lines,
/// those the `kept` request shows verbatim left out (the asks are the
/// note's own); `None` when none is left.
fn left_out_ledger(
    kept: &[Message],
    gone: &[Message],
    actions: &TextActions,
) -> Option<StateRecord> {
    let shown: String = kept
        .iter()
        .map(|m| crate::retention::normalise(&crate::retention::searchable(m, &m.text())))
        .collect::<Vec<_>>()
        .join("\n");
    let mut record = StateRecord::build(gone, actions);
    for m in gone.iter().filter(|m| is_summary(m)) {
        record.carry_over(&m.text());
    }
    let hidden = |t: &str| !shown.contains(&crate::retention::normalise(t));
    record.asks.clear();
    record.next = None;
    record.files.retain(|f| hidden(f));
    record.commands.retain(|c| hidden(&c.command));
    record.failing_tests.retain(|t| hidden(t));
    record.errors.retain(|e| hidden(e));
    let empty = record.files.is_empty() && record.commands.is_empty() && record.errors.is_empty();
    (!empty).then_some(record)
}

/// The handle of what `fitted` left out (over the originals) and the note
/// naming it, with the user's asks among them unless `with_asks` is false
/// (asks still in the request verbatim are not repeated).
fn left_out_note(
    fitted: &Fitted,
    originals: &[Message],
    with_asks: bool,
    actions: &TextActions,
) -> Option<(String, String)> {
    let gone = gone_of(fitted, originals);
    if gone.is_empty() {
        return None;
    }
    let handle = crate::store::span_handle(&gone);
    let channel = crate::digest::ToolChannel::of(originals, actions);
    let mut note = crate::store::left_out_note(gone.len(), &handle, channel);
    if with_asks {
        let kept: String = fitted
            .messages
            .iter()
            .map(|m| crate::retention::normalise(&m.text()))
            .collect::<Vec<_>>()
            .join("\n");
        let mut record = StateRecord::build(&gone, actions);
        for m in gone.iter().filter(|m| is_summary(m)) {
            record.carry_over(&m.text());
        }
        let asks: Vec<String> = record
            .asks
            .iter()
            .filter(|a| {
                let head = crate::retention::clip_normalised(a, 150);
                !head.is_empty() && !kept.contains(&head)
            })
            .map(|a| crate::summarize::state::clip_middle(a.trim(), NOTE_ASK_MAX))
            .collect();
        if !asks.is_empty() {
            note.push_str("\nThe user's asks among them:");
            for a in asks {
                note.push_str("\n- ");
                note.push_str(&a.replace('\n', "\n  "));
            }
        }
    }
    Some((handle, note))
}

/// Where a left-out note may stand as a message of its own: the first
/// place, from where `fitted` first departs from its `input` on, at which
/// a user message breaks no rule the fitted request kept and does not come
/// between an action and its observation. Everything from that departure
/// on is sent anew anyway, so the note costs the provider's prompt cache
/// nothing there, and the prefix before it (instructions, summary, turns
/// kept) stays byte for byte whether or not a request carries a note.
fn note_gap(
    fitted: &[Message],
    input: &[Message],
    profile: Profile,
    actions: &TextActions,
) -> Option<usize> {
    let lead = fitted
        .iter()
        .take_while(|m| m.role.is_instruction())
        .count();
    let departs = fitted
        .iter()
        .zip(input)
        .take_while(|(a, b)| a == b)
        .count()
        .max(lead)
        .max(1);
    // Never after the last message: the request still ends as the agent
    // left it.
    (departs..fitted.len()).find(|&at| {
        if is_reentry_with(fitted, at, actions)
            || !may_place(&fitted[..at], &Role::User, &fitted[at..], profile)
        {
            return false;
        }
        let mut placed = fitted.to_vec();
        placed.insert(at, Message::user(String::new()));
        introduced_violation(fitted, &placed, profile).is_none()
            && introduced_adjacency(fitted, &placed, profile).is_none()
    })
}

/// Where a left-out note goes when it cannot stand on its own: the last
/// leading instruction message, else the latest real user message.
fn note_target(messages: &[Message], actions: &TextActions) -> Option<usize> {
    let lead = messages
        .iter()
        .take_while(|m| m.role.is_instruction())
        .count();
    if lead > 0 {
        return Some(lead - 1);
    }
    (0..messages.len())
        .rev()
        .find(|&i| is_real_user_turn(messages, i, actions))
}

/// `message` with `note` appended to its text (a new text part when it has
/// parts).
fn with_appended(message: &Message, note: &str) -> Message {
    let mut out = message.clone();
    out.content = match &message.content {
        Content::Text(t) if !t.is_empty() => Content::Text(format!("{t}\n\n{note}")),
        Content::Parts(parts) => {
            let mut parts = parts.clone();
            parts.push(crate::message::ContentPart::new_text(note.to_owned()));
            Content::Parts(parts)
        }
        _ => Content::Text(note.to_owned()),
    };
    out
}

/// [`fit`] for a stored history (a compaction's result): no turn is left
/// out before the last resort, and the summary and the last group never
/// are (the agent appends its next turn after them); they are only clipped.
pub(crate) fn fit_history(
    messages: &[Message],
    budget: u64,
    counter: &dyn TokenCounter,
    profile: Profile,
    actions: &TextActions,
) -> Result<Fitted, Unfittable> {
    fit_impl(messages, budget, counter, profile, actions, true)
}

fn fit_impl(
    messages: &[Message],
    budget: u64,
    counter: &dyn TokenCounter,
    profile: Profile,
    actions: &TextActions,
    history: bool,
) -> Result<Fitted, Unfittable> {
    let mut work = Work::new(messages, counter, actions);
    work.history = history;
    let tokens_before = work.total();
    if tokens_before > budget {
        let (system, ask) = work.core_tokens();
        if system + ask > budget {
            return Err(Unfittable {
                system_tokens: system,
                ask_tokens: ask,
                window: budget,
            });
        }
    }
    let mut steps = Vec::new();
    for step in [
        FitStepKind::DigestResults,
        FitStepKind::ShrinkTail,
        FitStepKind::Clip,
        FitStepKind::LowerSummary,
        FitStepKind::Truncate,
    ] {
        if work.total() <= budget {
            break;
        }
        // A stored history shrinks its tail by re-planning (the compactor's
        // own second step, into the summary), never by leaving turns out.
        if history && step == FitStepKind::ShrinkTail {
            continue;
        }
        let changed = work.run(step, budget, messages, profile);
        if changed > 0 {
            steps.push(FitStep {
                step,
                messages: changed,
                tokens_after: work.total(),
            });
        }
    }
    let tokens_after = work.total();
    if tokens_after > budget {
        let (system, ask) = work.core_tokens();
        return Err(Unfittable {
            system_tokens: system,
            ask_tokens: ask,
            window: budget,
        });
    }
    let left_out = (0..messages.len())
        .filter(|&i| work.dropped[i] || work.messages[i] != messages[i])
        .collect();
    Ok(Fitted {
        messages: work.into_messages(),
        steps,
        tokens_before,
        tokens_after,
        left_out,
        archive_handle: None,
    })
}

/// Tokens of the leading instructions of `messages` plus the request's own
/// overhead: what every request of this conversation costs at least. A
/// window no larger than this can never hold a request.
pub fn system_prompt_tokens(messages: &[Message], counter: &dyn TokenCounter) -> u64 {
    let lead = messages
        .iter()
        .take_while(|m| m.role.is_instruction())
        .count();
    counter.count_messages(&messages[..lead]) as u64
}

/// Runs one rung on `messages` towards `budget` (the compressor climbs the
/// ladder itself, with its own second rung): how many messages it changed.
pub(crate) fn run_step(
    messages: &mut Vec<Message>,
    step: FitStepKind,
    budget: u64,
    counter: &dyn TokenCounter,
    profile: Profile,
    actions: &TextActions,
) -> usize {
    let input = messages.clone();
    let mut work = Work::new(messages, counter, actions);
    let changed = work.run(step, budget, &input, profile);
    *messages = work.into_messages();
    changed
}

/// The messages being fitted, with their token counts.
struct Work<'c> {
    messages: Vec<Message>,
    tokens: Vec<u64>,
    /// Left out of the request (step 2 and 5).
    dropped: Vec<bool>,
    overhead: u64,
    counter: &'c dyn TokenCounter,
    /// Which user messages are tool output (`context.text_actions`).
    actions: &'c TextActions,
    /// Fitting a stored history: keep the summary and the last group.
    history: bool,
}

impl<'c> Work<'c> {
    fn new(
        messages: &[Message],
        counter: &'c dyn TokenCounter,
        actions: &'c TextActions,
    ) -> Work<'c> {
        Work {
            actions,
            tokens: messages
                .iter()
                .map(|m| counter.count_message(m) as u64)
                .collect(),
            dropped: vec![false; messages.len()],
            messages: messages.to_vec(),
            overhead: counter.request_overhead() as u64,
            counter,
            history: false,
        }
    }

    fn total(&self) -> u64 {
        self.overhead
            + self
                .tokens
                .iter()
                .zip(&self.dropped)
                .filter(|(_, d)| !**d)
                .map(|(t, _)| *t)
                .sum::<u64>()
    }

    fn set(&mut self, i: usize, message: Message) {
        self.tokens[i] = self.counter.count_message(&message) as u64;
        self.messages[i] = message;
    }

    fn into_messages(self) -> Vec<Message> {
        self.messages
            .into_iter()
            .zip(self.dropped)
            .filter_map(|(m, d)| (!d).then_some(m))
            .collect()
    }

    /// The kept messages, for validity checks.
    fn kept(&self) -> Vec<Message> {
        self.messages
            .iter()
            .zip(&self.dropped)
            .filter(|(_, d)| !**d)
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Number of leading instruction messages.
    fn lead(&self) -> usize {
        self.messages
            .iter()
            .take_while(|m| m.role.is_instruction())
            .count()
    }

    /// The latest real user message, if any.
    fn ask(&self) -> Option<usize> {
        (0..self.messages.len()).rev().find(|&i| {
            let m = &self.messages[i];
            // A summary in a user message is not an ask, unless it was
            // merged into one (the ask's own words follow it).
            !self.dropped[i]
                && is_real_user_turn(&self.messages, i, self.actions)
                && (!is_summary(m) || !without_summary(&m.text()).is_empty())
        })
    }

    /// The summary message, if any.
    fn summary(&self) -> Option<usize> {
        self.messages.iter().rposition(is_summary)
    }

    /// Tokens of the system prompt (with the request overhead) and of the
    /// latest ask's own words: what no request can do without.
    fn core_tokens(&self) -> (u64, u64) {
        let lead = self.lead();
        let system = self.overhead + self.tokens[..lead].iter().sum::<u64>();
        let ask = self.ask().map_or(0, |u| {
            let m = &self.messages[u];
            if is_summary(m) {
                self.counter
                    .count_message(&with_text(m, without_summary(&m.text()))) as u64
            } else {
                self.tokens[u]
            }
        });
        (system, ask)
    }

    fn run(
        &mut self,
        step: FitStepKind,
        budget: u64,
        input: &[Message],
        profile: Profile,
    ) -> usize {
        match step {
            FitStepKind::DigestResults => self.digest_results(budget),
            FitStepKind::ShrinkTail => self.shrink_tail(budget, input, profile),
            FitStepKind::Clip => self.clip(budget),
            FitStepKind::LowerSummary => self.lower_summary(budget),
            FitStepKind::Truncate => self.truncate(budget, input, profile),
        }
    }

    /// Step 1: large tool results (and the user messages that are tool
    /// output: text envelopes, text-action observations) keep the head and
    /// tail of their body and a recall handle, largest first.
    fn digest_results(&mut self, budget: u64) -> usize {
        let reentry = reentries_with(&self.messages, self.actions);
        let mut candidates: Vec<usize> = (0..self.messages.len())
            .filter(|&i| {
                let m = &self.messages[i];
                !self.dropped[i]
                    && (m.is_tool_result() || reentry[i])
                    && matches!(&m.content, Content::Text(t) if t.len() >= RESULT_MIN_BYTES)
            })
            .collect();
        candidates.sort_by_key(|&i| std::cmp::Reverse(self.tokens[i]));
        let mut changed = 0;
        for i in candidates {
            if self.total() <= budget {
                break;
            }
            let m = &self.messages[i];
            let body = m.text();
            let handle = names_recall_handle(m).then(|| result_handle(m, &body));
            let clipped = clip_middle(&body, RESULT_KEEP_BYTES, handle.as_deref());
            let out = with_text(m, clipped);
            self.set(i, out);
            changed += 1;
        }
        changed
    }

    /// Step 2: whole atomic groups between the head and the protected core
    /// (the latest ask, the summary, the last group) are left out, oldest
    /// first, where the messages meeting at the join may be adjacent.
    fn shrink_tail(&mut self, budget: u64, input: &[Message], profile: Profile) -> usize {
        let kept = self.kept();
        let index: Vec<usize> = (0..self.messages.len())
            .filter(|&i| !self.dropped[i])
            .collect();
        let cuts = CutPoints::with_profile(&kept, profile, self.actions);
        let groups: Vec<std::ops::Range<usize>> = cuts.groups().collect();
        let Some(last) = groups.last().cloned() else {
            return 0;
        };
        let lead = kept.iter().take_while(|m| m.role.is_instruction()).count();
        let (ask, summary) = (self.ask(), self.summary());
        let protected = |k: usize| {
            Some(index[k]) == ask || Some(index[k]) == summary || last.contains(&k) || k < lead
        };
        let before = self.dropped.clone();
        let mut changed = 0;
        for g in &groups {
            if self.total() <= budget {
                break;
            }
            if g.clone().any(protected) {
                continue;
            }
            // The nearest kept messages around the group, once it is gone.
            let prev = (0..g.start).rev().find(|&k| !self.dropped[index[k]]);
            let next = (g.end..kept.len()).find(|&k| !self.dropped[index[k]]);
            let before_slice = prev.map_or(&kept[..0], |k| &kept[k..=k]);
            let after_slice = next.map_or(&kept[..0], |k| &kept[k..=k]);
            if !may_join(before_slice, after_slice, profile) {
                continue;
            }
            for k in g.clone() {
                self.dropped[index[k]] = true;
            }
            changed += g.len();
        }
        if changed > 0 && !self.still_valid(input, profile) {
            self.dropped = before;
            return 0;
        }
        changed
    }

    /// Step 3: long texts (assistant turns, user turns other than the latest
    /// ask and the summary) and the long string leaves of tool-call
    /// arguments are clipped, largest first.
    fn clip(&mut self, budget: u64) -> usize {
        let ask = self.ask();
        let summary = self.summary();
        let lead = self.lead();
        let mut candidates: Vec<usize> = (lead..self.messages.len())
            .filter(|&i| !self.dropped[i] && Some(i) != ask && Some(i) != summary)
            .collect();
        candidates.sort_by_key(|&i| std::cmp::Reverse(self.tokens[i]));
        let mut changed = 0;
        for i in candidates {
            if self.total() <= budget {
                break;
            }
            if let Some(out) = clipped(&self.messages[i], TEXT_KEEP_BYTES, ARGUMENT_LEAF_CHARS) {
                self.set(i, out);
                changed += 1;
            }
        }
        changed
    }

    /// Step 5: only the system prompt, the latest ask (its own words) and
    /// the last group stay, the group clipped hard; then the group goes too.
    fn truncate(&mut self, budget: u64, input: &[Message], profile: Profile) -> usize {
        let before = (
            self.messages.clone(),
            self.tokens.clone(),
            self.dropped.clone(),
        );
        let lead = self.lead();
        let ask = self.ask();
        let kept = self.kept();
        let index: Vec<usize> = (0..self.messages.len())
            .filter(|&i| !self.dropped[i])
            .collect();
        let cuts = CutPoints::with_profile(&kept, profile, self.actions);
        let last_start = cuts.groups().last().map_or(kept.len(), |g| g.start);
        let mut changed = 0;
        // Everything between the instructions and the last group, but the ask.
        let summary = self.summary().filter(|_| self.history);
        for &i in &index[lead..last_start] {
            if Some(i) != ask && Some(i) != summary {
                self.dropped[i] = true;
                changed += 1;
            }
        }
        if let Some(u) = ask
            && !self.history
            && is_summary(&self.messages[u])
        {
            let m = &self.messages[u];
            let own = with_text(m, without_summary(&m.text()));
            self.set(u, own);
        }
        // The last group's other messages are clipped first; then a
        // summary among them keeps its state record when that fits, else
        // the note naming what it replaced: the way back to everything
        // before it.
        let mut summary_in_group = None;
        // Room for taking a dropped summary's state record back (below).
        let take_back = self
            .summary()
            .filter(|&s| self.dropped[s])
            .and_then(|s| input.get(s))
            .filter(|m| is_summary(m))
            .and_then(summary_ledger_only)
            .map_or(0, |m| self.counter.count_message(&m) as u64);
        for &i in &index[last_start..] {
            if self.total() + take_back <= budget {
                break;
            }
            if is_summary(&self.messages[i]) {
                summary_in_group = Some(i);
                continue;
            }
            if Some(i) != ask
                && let Some(out) = clipped(&self.messages[i], TRUNCATE_KEEP_BYTES, 32)
            {
                self.set(i, out);
                changed += 1;
            }
        }
        if let Some(i) = summary_in_group
            && self.total() > budget
        {
            let original = self.messages[i].clone();
            if let Some(out) = summary_ledger_only(&original) {
                self.set(i, out);
                changed += 1;
            }
            // A stored history keeps the record (see `lower_summary`).
            if self.total() > budget
                && !self.history
                && let Some(out) = summary_note_only(&original)
            {
                self.set(i, out);
                changed += 1;
            }
        }
        if self.total() > budget
            && !self.history
            && ask.is_some_and(|u| u < index.get(last_start).copied().unwrap_or(usize::MAX))
        {
            for &i in &index[last_start..] {
                self.dropped[i] = true;
                changed += 1;
            }
        }
        if !self.still_valid(input, profile) {
            (self.messages, self.tokens, self.dropped) = before;
            return 0;
        }
        // A request that left its summary out takes back the summary's
        // state record alone where the room and the roles allow: the facts
        // of every earlier compaction, in a few hundred tokens.
        // Where it may not stand on its own (between two turns of one
        // role), it goes before the latest ask's own words, as a summary
        // merged into the ask.
        // The record as the input had it: a lower rung may have collapsed it.
        if let Some(s) = self.summary().filter(|&s| self.dropped[s])
            && let Some(ledger) = input
                .get(s)
                .filter(|m| is_summary(m))
                .and_then(summary_ledger_only)
        {
            let kept = (self.messages[s].clone(), self.tokens[s]);
            self.dropped[s] = false;
            self.set(s, ledger.clone());
            if self.total() > budget || !self.still_valid(input, profile) {
                self.dropped[s] = true;
                (self.messages[s], self.tokens[s]) = kept;
                if let Some(u) = self.ask().filter(|&u| !is_summary(&self.messages[u])) {
                    let own = (self.messages[u].clone(), self.tokens[u]);
                    let merged = super::insert::prepend_text(&own.0, &ledger.text());
                    self.set(u, merged);
                    if self.total() > budget || !self.still_valid(input, profile) {
                        (self.messages[u], self.tokens[u]) = own;
                    }
                }
            }
        }
        changed
    }

    /// Whether the kept messages add no violation and no same-role pair
    /// that `input` did not have.
    fn still_valid(&self, input: &[Message], profile: Profile) -> bool {
        let kept = self.kept();
        introduced_violation(input, &kept, profile).is_none()
            && introduced_adjacency(input, &kept, profile).is_none()
    }
}

/// `message` with its content replaced by `text`.
fn with_text(message: &Message, text: String) -> Message {
    let mut out = message.clone();
    out.content = Content::Text(text);
    out
}

/// `message` with a long text content clipped to `keep` bytes at each end
/// and the long string leaves of its tool-call arguments to `leaf_chars`;
/// `None` when nothing was long. Where the agent can call the recall tool
/// ([`names_recall_handle`]) the marker names the handle.
fn clipped(message: &Message, keep: usize, leaf_chars: usize) -> Option<Message> {
    let mut out = message.clone();
    let mut changed = false;
    if let Content::Text(text) = &message.content
        && text.len() > (2 * keep).max(TEXT_MIN_BYTES.min(4 * keep + 64))
    {
        let handle = names_recall_handle(message).then(|| result_handle(message, text));
        out.content = Content::Text(clip_middle(text, keep, handle.as_deref()));
        changed = true;
    }
    for call in out.tool_calls.iter_mut().flatten() {
        if let Some(function) = &mut call.function
            && let Some(args) = clip_arguments(&function.arguments, leaf_chars)
        {
            function.arguments = args;
            changed = true;
        }
    }
    changed.then_some(out)
}

/// `text` with its middle replaced by a marker: the first and last `keep`
/// bytes (at character boundaries) stay; the marker names the recall
/// handle when there is one.
fn clip_middle(text: &str, keep: usize, handle: Option<&str>) -> String {
    if text.len() <= 2 * keep {
        return text.to_owned();
    }
    let mut head = keep;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - keep;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    let omitted = tail - head;
    let marker = match handle {
        Some(h) => {
            let arg = serde_json::json!({ "handle": h });
            format!(
                "[… {omitted} bytes omitted to fit the window; full output: {RECALL_TOOL} {arg}]"
            )
        }
        None => format!("[… {omitted} bytes omitted to fit the window]"),
    };
    format!("{}\n{marker}\n{}", &text[..head], &text[tail..])
}

mod summary;

pub use summary::{NARRATIVE_CUT, ledger_kept};
use summary::{summary_ledger_only, summary_note_only};

#[cfg(test)]
mod tests;
