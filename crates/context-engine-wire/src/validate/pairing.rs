//! Tool calls and their results: every call has an id and a name, every id is
//! used once, and every call is answered by exactly one `tool` message that
//! follows its assistant turn directly.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::{Property, Rule, Violation};
use crate::message::{Message, Role};

/// A tool call's id, treating an empty string as missing (no result can
/// meaningfully answer `""`).
fn call_id(id: Option<&String>) -> Option<&str> {
    id.map(String::as_str).filter(|s| !s.is_empty())
}

/// Every tool call has a non-empty `id` and function name, and no id is used
/// twice in the transcript (providers match results to calls by id, so a
/// reused id makes the pairing ambiguous).
#[derive(Clone, Copy, Debug, Default)]
pub struct ToolCallShape;

impl Property for ToolCallShape {
    fn name(&self) -> &'static str {
        "tool-call-shape"
    }

    fn check(&self, messages: &[Message], out: &mut Vec<Violation>) {
        let count = messages.iter().map(|m| m.tool_calls().len()).sum();
        let mut first_use: HashMap<&str, usize> = HashMap::with_capacity(count);
        for (i, message) in messages.iter().enumerate() {
            for (j, call) in message.tool_calls().iter().enumerate() {
                match call_id(call.id.as_ref()) {
                    None => out.push(Violation::new(
                        i,
                        Rule::ToolCallWithoutId,
                        format!("tool call {j} has no id, so no result can answer it"),
                    )),
                    Some(id) => match first_use.entry(id) {
                        Entry::Vacant(slot) => {
                            slot.insert(i);
                        }
                        Entry::Occupied(first) => out.push(Violation::new(
                            i,
                            Rule::DuplicateToolCallId,
                            format!(
                                "tool call {j} reuses id `{id}`, first used in message {}",
                                first.get()
                            ),
                        )),
                    },
                }
                if call.name().is_none_or(str::is_empty) {
                    out.push(Violation::new(
                        i,
                        Rule::ToolCallWithoutName,
                        format!("tool call {j} has no function name"),
                    ));
                }
            }
        }
    }
}

/// Every `tool` message answers, by `tool_call_id`, a call of the assistant
/// turn it follows, once; and every call is answered before the next
/// assistant message or the end of the transcript.
///
/// Decisions:
/// * A call still unanswered at the very end of the transcript is a
///   violation: sent as a request, providers reject it (the agent must send
///   the results first).
/// * A result that answers its call but comes after a non-tool message (say a
///   user message between call and result) is reported once, as
///   [`Rule::ToolResultNotAdjacent`] on the result, not also as unanswered.
/// * A result whose call belongs to an earlier assistant turn is an orphan:
///   the turn ended at the next assistant message.
///
/// As a cut constraint it forbids every boundary from just after an assistant
/// tool-call message through its last result (the call and its results are
/// one atomic group), and the boundary before any tool result.
#[derive(Clone, Copy, Debug, Default)]
pub struct ToolResultPairing;

/// Calls and results of one id within one assistant turn.
#[derive(Default)]
struct Tally {
    calls: usize,
    results: usize,
}

/// The assistant turn whose results are being read.
struct Turn {
    at: usize,
    /// First non-tool message since the assistant message.
    interrupted_by: Option<usize>,
    /// Last message that answered one of this turn's calls.
    last_result: Option<usize>,
}

/// Walks the transcript once; reports violations to `out` (when given) and
/// each turn's span `(assistant, last result)` to `span`.
fn walk<'a>(
    messages: &'a [Message],
    mut out: Option<&mut Vec<Violation>>,
    mut span: impl FnMut(usize, usize),
) {
    // The open turn's calls by id; one map reused for every turn.
    let mut ids: HashMap<&'a str, Tally> = HashMap::new();
    let mut turn: Option<Turn> = None;
    // Orphan results (index, id), explained after the walk.
    let mut orphans: Vec<(usize, &'a str)> = Vec::new();
    let reporting = out.is_some();
    let mut report = |v: Violation| {
        if let Some(out) = out.as_deref_mut() {
            out.push(v);
        }
    };
    for (i, message) in messages.iter().enumerate() {
        match message.role {
            Role::Assistant => {
                if let Some(done) = turn.take() {
                    close(messages, &done, &mut ids, Some(i), &mut report, &mut span);
                }
                if message.has_tool_calls() {
                    ids.clear();
                    for call in message.tool_calls() {
                        if let Some(id) = call_id(call.id.as_ref()) {
                            ids.entry(id).or_default().calls += 1;
                        }
                    }
                    turn = Some(Turn {
                        at: i,
                        interrupted_by: None,
                        last_result: None,
                    });
                }
            }
            Role::Tool => {
                let Some(id) = call_id(message.tool_call_id.as_ref()) else {
                    report(Violation::new(
                        i,
                        Rule::ToolResultWithoutId,
                        "tool message has no tool_call_id",
                    ));
                    continue;
                };
                let (Some(open), Some(tally)) = (turn.as_mut(), ids.get_mut(id)) else {
                    orphans.push((i, id));
                    continue;
                };
                open.last_result = Some(i);
                if tally.results >= tally.calls {
                    report(Violation::new(
                        i,
                        Rule::DuplicateToolResult,
                        format!("second result for tool call `{id}` of message {}", open.at),
                    ));
                    continue;
                }
                tally.results += 1;
                if let Some(k) = open.interrupted_by {
                    report(Violation::new(
                        i,
                        Rule::ToolResultNotAdjacent,
                        format!(
                            "result for tool call `{id}` of message {} comes after message {k} \
                             ({}), not directly after the call",
                            open.at, messages[k].role
                        ),
                    ));
                }
            }
            _ => {
                if let Some(open) = turn.as_mut() {
                    open.interrupted_by.get_or_insert(i);
                }
            }
        }
    }
    if let Some(done) = turn.take() {
        close(messages, &done, &mut ids, None, &mut report, &mut span);
    }
    if reporting && !orphans.is_empty() {
        explain_orphans(messages, &orphans, &mut report);
    }
}

/// Reports orphan results, naming the earlier turn that called the id when
/// there is one. A second pass only when orphans exist, so the common case
/// builds no transcript-wide map.
fn explain_orphans(
    messages: &[Message],
    orphans: &[(usize, &str)],
    report: &mut impl FnMut(Violation),
) {
    let wanted: HashMap<&str, ()> = orphans.iter().map(|&(_, id)| (id, ())).collect();
    let mut owner: HashMap<&str, usize> = HashMap::new();
    for (i, message) in messages.iter().enumerate() {
        if message.role != Role::Assistant {
            continue;
        }
        for call in message.tool_calls() {
            if let Some(id) = call_id(call.id.as_ref())
                && wanted.contains_key(id)
            {
                owner.entry(id).or_insert(i);
            }
        }
    }
    for &(i, id) in orphans {
        let detail = match owner.get(id) {
            Some(k) if *k < i => format!(
                "tool_call_id `{id}` answers a call of message {k}, an earlier assistant turn"
            ),
            _ => format!("tool_call_id `{id}` matches no earlier assistant tool call"),
        };
        report(Violation::new(i, Rule::OrphanToolResult, detail));
    }
}

/// Ends a turn at message `next` (or the end): reports its unanswered calls
/// in call order.
fn close(
    messages: &[Message],
    turn: &Turn,
    ids: &mut HashMap<&str, Tally>,
    next: Option<usize>,
    report: &mut impl FnMut(Violation),
    span: &mut impl FnMut(usize, usize),
) {
    if let Some(r) = turn.last_result {
        span(turn.at, r);
    }
    let Some(message) = messages.get(turn.at) else {
        return;
    };
    for call in message.tool_calls() {
        let Some(id) = call_id(call.id.as_ref()) else {
            continue;
        };
        let Some(tally) = ids.get_mut(id) else {
            continue;
        };
        if tally.results < tally.calls {
            // Report each id once, even if it was called several times.
            tally.results = tally.calls;
            let name = call.name().unwrap_or("?");
            let before = match next {
                Some(k) => format!("before the next assistant message ({k})"),
                None => "before the end of the transcript".to_owned(),
            };
            report(Violation::new(
                turn.at,
                Rule::UnansweredToolCall,
                format!("tool call `{id}` ({name}) has no result {before}"),
            ));
        }
    }
}

impl Property for ToolResultPairing {
    fn name(&self) -> &'static str {
        "tool-result-pairing"
    }

    fn check(&self, messages: &[Message], out: &mut Vec<Violation>) {
        walk(messages, Some(out), |_, _| {});
    }

    fn forbid(&self, messages: &[Message], forbidden: &mut [bool]) {
        // Turns do not overlap (a turn ends at the next assistant message), so
        // marking each span directly stays O(n) in total.
        walk(messages, None, |at, last| {
            for slot in forbidden.iter_mut().take(last + 1).skip(at + 1) {
                *slot = true;
            }
        });
        for (i, message) in messages.iter().enumerate() {
            if message.is_tool_result()
                && let Some(slot) = forbidden.get_mut(i)
            {
                *slot = true;
            }
        }
    }
}
