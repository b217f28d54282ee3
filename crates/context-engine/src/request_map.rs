//! What a managed request did with the client's history, message by
//! message: the page's view of one call at `ctx serve`'s `/ui`.
//!
//! [`map`] reads the client's messages and the messages that went
//! upstream (both as chat messages; the fronts bridge theirs) and says, for
//! each upstream message, where it came from ([`Source`]) and, for each
//! client message, what became of it ([`Fate`]). It needs nothing but the
//! two lists, so it reads any engine's output, a plugin's included.
//!
//! Matching: an upstream message equal to a client message is that message
//! kept (in order, the first unused equal one at or after the last match;
//! else any unused equal one). One that is not equal but answers or makes
//! the same tool call (its call id), or sits, with the same role, where the
//! next unmatched client message is, is that message changed: a digested
//! or pruned result, clipped call arguments, a text-action observation
//! shortened in place, a note appended. A message carrying a summary is the
//! summary. Anything else the engine added. A client message no upstream
//! message came from was summarized when the request carries a summary,
//! else left out.

use std::collections::HashMap;

use serde::Serialize;

use crate::message::Message;
use crate::summary_text::is_summary;

/// Where an upstream message came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// The client's message `client`, as the client sent it.
    Kept { client: usize },
    /// The client's message `client`, with its text changed by the engine
    /// (digested, pruned, clipped or annotated).
    Changed { client: usize },
    /// A summary of earlier messages.
    Summary,
    /// A message the engine added.
    Added,
}

/// What became of a client message in the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Sent as it came.
    Kept,
    /// Sent with its text changed (see [`Source::Changed`]).
    Changed,
    /// Not sent; the request's summary stands for it.
    Summarized,
    /// Not sent, and the request carries no summary.
    LeftOut,
}

/// The request, message by message (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RequestMap {
    /// One per upstream message, in order.
    pub upstream: Vec<Source>,
    /// One per client message, in order.
    pub client: Vec<Fate>,
}

/// The map of `upstream` against the client's `client` messages.
pub fn map(client: &[Message], upstream: &[Message]) -> RequestMap {
    let mut exact: HashMap<String, Vec<usize>> = HashMap::new();
    // A call id names both the assistant message that makes the call and
    // the result that answers it: keyed by role too.
    let mut by_call: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, m) in client.iter().enumerate() {
        exact.entry(key(m)).or_default().push(i);
        if let Some(id) = call_id(m) {
            by_call.entry((m.role.as_str(), id)).or_insert(i);
        }
    }
    let mut used = vec![false; client.len()];
    let mut next = 0;
    let mut sources = Vec::with_capacity(upstream.len());
    for m in upstream {
        let source = if let Some(i) = exact.get(&key(m)).and_then(|c| pick(c, next, &used)) {
            Source::Kept { client: i }
        } else if is_summary(m) {
            Source::Summary
        } else if let Some(i) = call_id(m)
            .and_then(|id| by_call.get(&(m.role.as_str(), id)).copied())
            .filter(|&i| !used[i])
        {
            Source::Changed { client: i }
        } else if let Some(i) = (next..client.len())
            .find(|&i| !used[i])
            .filter(|&i| client[i].role == m.role)
        {
            Source::Changed { client: i }
        } else {
            Source::Added
        };
        if let Source::Kept { client: i } | Source::Changed { client: i } = source {
            used[i] = true;
            next = i + 1;
        }
        sources.push(source);
    }
    let summarized = sources.contains(&Source::Summary);
    let mut fates: Vec<Fate> = used
        .iter()
        .map(|&u| match (u, summarized) {
            (true, _) => Fate::Kept,
            (false, true) => Fate::Summarized,
            (false, false) => Fate::LeftOut,
        })
        .collect();
    for s in &sources {
        if let Source::Changed { client: i } = *s {
            fates[i] = Fate::Changed;
        }
    }
    RequestMap {
        upstream: sources,
        client: fates,
    }
}

/// The first unused index of `candidates` at or after `next`, else the
/// first unused one.
fn pick(candidates: &[usize], next: usize, used: &[bool]) -> Option<usize> {
    let free = |&&i: &&usize| !used[i];
    candidates
        .iter()
        .filter(free)
        .find(|&&i| i >= next)
        .or_else(|| candidates.iter().find(free))
        .copied()
}

/// A message's identity for an exact match: its whole wire form.
fn key(m: &Message) -> String {
    m.to_value().to_string()
}

/// The tool call a message answers, or the first one it makes.
fn call_id(m: &Message) -> Option<&str> {
    m.tool_call_id
        .as_deref()
        .or_else(|| m.tool_calls().first().and_then(|c| c.id.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use crate::summary_text::SUMMARY_PREFIX;

    fn call(id: &str) -> Message {
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(id, "bash", "{\"command\":\"ls\"}")],
        )
    }

    #[test]
    fn kept_changed_summarized_and_added_are_told_apart() {
        let client = vec![
            Message::system("sys"),
            Message::user("fix the bug"),
            call("a"),
            Message::tool_result("a", "x".repeat(5000)),
            call("b"),
            Message::tool_result("b", "y".repeat(5000)),
            Message::user("now run the tests"),
        ];
        let upstream = vec![
            client[0].clone(),
            Message::user(format!("{SUMMARY_PREFIX} the user asked to fix the bug")),
            client[4].clone(),
            Message::tool_result("b", "[digested: 5000 bytes]"),
            client[6].clone(),
            Message::assistant("engine note"),
        ];
        let v = map(&client, &upstream);
        assert_eq!(
            v.upstream,
            [
                Source::Kept { client: 0 },
                Source::Summary,
                Source::Kept { client: 4 },
                Source::Changed { client: 5 },
                Source::Kept { client: 6 },
                Source::Added,
            ]
        );
        assert_eq!(
            v.client,
            [
                Fate::Kept,
                Fate::Summarized,
                Fate::Summarized,
                Fate::Summarized,
                Fate::Kept,
                Fate::Changed,
                Fate::Kept,
            ]
        );
    }

    #[test]
    fn without_a_summary_what_is_missing_was_left_out() {
        let client = vec![
            Message::user("a"),
            Message::assistant("b"),
            Message::user("c"),
        ];
        let upstream = vec![client[0].clone(), client[2].clone()];
        let v = map(&client, &upstream);
        assert_eq!(v.client, [Fate::Kept, Fate::LeftOut, Fate::Kept]);
    }

    #[test]
    fn a_text_action_observation_shortened_in_place_is_changed() {
        let client = vec![
            Message::user("task"),
            Message::assistant("```bash\ncat big.log\n```"),
            Message::user("z".repeat(4000)),
            Message::assistant("done"),
        ];
        let upstream = vec![
            client[0].clone(),
            client[1].clone(),
            Message::user("[digested: 4000 bytes]"),
            client[3].clone(),
        ];
        let v = map(&client, &upstream);
        assert_eq!(v.upstream[2], Source::Changed { client: 2 });
        assert_eq!(
            v.client,
            [Fate::Kept, Fate::Kept, Fate::Changed, Fate::Kept]
        );
    }

    #[test]
    fn a_changed_result_is_found_by_its_call_id_wherever_it_stands() {
        let calls = vec![
            ToolCall::function("a", "bash", "{\"command\":\"ls\"}"),
            ToolCall::function("b", "bash", "{\"command\":\"pwd\"}"),
        ];
        let client = vec![
            Message::user("task"),
            Message::assistant_tool_calls("", calls),
            Message::tool_result("a", "x".repeat(5000)),
            Message::tool_result("b", "/repo"),
        ];
        // The results in the other order: no position to go by.
        let upstream = vec![
            client[0].clone(),
            client[1].clone(),
            client[3].clone(),
            Message::tool_result("a", "[digested: 5000 bytes]"),
        ];
        let v = map(&client, &upstream);
        assert_eq!(v.upstream[3], Source::Changed { client: 2 });
        assert_eq!(
            v.client,
            [Fate::Kept, Fate::Kept, Fate::Changed, Fate::Kept]
        );
    }

    #[test]
    fn repeated_messages_match_in_order() {
        let client = vec![
            Message::user("next"),
            Message::assistant("ok"),
            Message::user("next"),
        ];
        let v = map(&client, &client);
        assert_eq!(
            v.upstream,
            [
                Source::Kept { client: 0 },
                Source::Kept { client: 1 },
                Source::Kept { client: 2 },
            ]
        );
    }
}
