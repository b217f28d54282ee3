//! Lining up an engine's result with the chat messages it was given, so a
//! format bridge ([`crate::anthropic::bridge`], [`crate::responses::bridge`])
//! can give every unchanged part back byte for byte.
//!
//! An engine returns plain [`Message`]s: some equal to the ones it was handed,
//! some rewritten in place (a digest replaces a tool result's content, a clip
//! shortens a text or a call's arguments), some left out (a compaction's
//! summarized span) and some new (the summary). [`align`] recovers which is
//! which, in output order:
//! 1. an output message equal to a not yet matched input message (searching
//!    forward from the last match) is [`Step::Same`];
//! 2. otherwise one with the same tool identity (a tool result's
//!    `tool_call_id`, an assistant turn's first call id) is
//!    [`Step::Changed`];
//! 3. between two such anchors, remaining output messages pair in order with
//!    remaining input messages of the same role ([`Step::Changed`]); the
//!    rest are [`Step::New`]. Input messages no step names were dropped.

use std::collections::HashMap;

use crate::message::{Message, Role};

/// What became of one output message.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step<'a> {
    /// Equal to input message `j`.
    Same(usize),
    /// Input message `j`, rewritten into this.
    Changed(usize, &'a Message),
    /// Not from the input (a summary, a note).
    New(&'a Message),
}

impl Step<'_> {
    /// The input index this step comes from, if any.
    pub fn source(&self) -> Option<usize> {
        match *self {
            Step::Same(j) | Step::Changed(j, _) => Some(j),
            Step::New(_) => None,
        }
    }
}

/// Tool identity of a message, stable under content rewrites.
fn identity(m: &Message) -> Option<(bool, &str)> {
    if m.is_tool_result() {
        return m.tool_call_id.as_deref().map(|id| (false, id));
    }
    if m.role == Role::Assistant {
        return m
            .tool_calls()
            .first()
            .and_then(|c| c.id.as_deref())
            .map(|id| (true, id));
    }
    None
}

/// Aligns `output` with `input` (see the module docs). Monotonic: the
/// sources of the steps are increasing. O(n + m) lookups plus one
/// serialization of each message.
pub fn align<'a>(input: &[Message], output: &'a [Message]) -> Vec<Step<'a>> {
    // Fast path: the common prefix of equal messages (all of them for a
    // no-op pass), compared without serializing.
    let same = input.iter().zip(output).take_while(|(a, b)| a == b).count();
    let mut steps: Vec<Step<'a>> = (0..same).map(Step::Same).collect();
    if same == output.len() {
        return steps;
    }
    // Second fast path: the same number of messages, each past the prefix
    // equal to its input or a rewrite of the tool turn at its position (a
    // digested result, clipped arguments: what a request view does on most
    // calls), lined up by position without serializing.
    if input.len() == output.len()
        && input[same..].iter().zip(&output[same..]).all(|(a, b)| {
            a == b || (a.role == b.role && identity(a).is_some() && identity(a) == identity(b))
        })
    {
        steps.extend(
            input[same..]
                .iter()
                .zip(&output[same..])
                .enumerate()
                .map(|(k, (a, b))| {
                    if a == b {
                        Step::Same(same + k)
                    } else {
                        Step::Changed(same + k, b)
                    }
                }),
        );
        return steps;
    }
    steps.extend(
        align_rest(&input[same..], &output[same..])
            .into_iter()
            .map(|s| match s {
                Step::Same(j) => Step::Same(j + same),
                Step::Changed(j, m) => Step::Changed(j + same, m),
                Step::New(m) => Step::New(m),
            }),
    );
    steps
}

fn align_rest<'a>(input: &[Message], output: &'a [Message]) -> Vec<Step<'a>> {
    let key = |m: &Message| serde_json::to_string(m).unwrap_or_default();
    let mut by_text: HashMap<String, Vec<usize>> = HashMap::new();
    for (j, m) in input.iter().enumerate().rev() {
        by_text.entry(key(m)).or_default().push(j);
    }
    let mut by_id: HashMap<(bool, &str), Vec<usize>> = HashMap::new();
    for (j, m) in input.iter().enumerate().rev() {
        if let Some(id) = identity(m) {
            by_id.entry(id).or_default().push(j);
        }
    }
    // First pass: anchors.
    let mut anchors: Vec<Option<Step<'a>>> = vec![None; output.len()];
    let mut cursor = 0usize;
    let next_at_or_after = |list: Option<&mut Vec<usize>>, cursor: usize| -> Option<usize> {
        let list = list?;
        while let Some(&j) = list.last() {
            if j >= cursor {
                return Some(j);
            }
            list.pop();
        }
        None
    };
    for (k, m) in output.iter().enumerate() {
        if let Some(j) = next_at_or_after(by_text.get_mut(&key(m)), cursor) {
            anchors[k] = Some(Step::Same(j));
            cursor = j + 1;
        } else if let Some(j) =
            identity(m).and_then(|id| next_at_or_after(by_id.get_mut(&id), cursor))
        {
            anchors[k] = Some(Step::Changed(j, m));
            cursor = j + 1;
        }
    }
    // Second pass: pair the gaps by role.
    let mut steps = Vec::with_capacity(output.len());
    let mut from = 0usize; // first input index after the previous anchor
    let mut k = 0usize;
    while k < output.len() {
        if let Some(step) = anchors[k] {
            from = step.source().map_or(from, |j| j + 1);
            steps.push(step);
            k += 1;
            continue;
        }
        let gap_end = (k..output.len())
            .find(|&i| anchors[i].is_some())
            .unwrap_or(output.len());
        let until = anchors
            .get(gap_end)
            .and_then(|a| a.and_then(|s| s.source()))
            .unwrap_or(input.len());
        let mut j = from;
        for m in &output[k..gap_end] {
            let found =
                (j..until).find(|&i| input[i].role == m.role && identity(&input[i]).is_none());
            match found {
                Some(i) => {
                    steps.push(Step::Changed(i, m));
                    j = i + 1;
                }
                None => steps.push(Step::New(m)),
            }
        }
        from = j;
        k = gap_end;
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;

    fn msgs() -> Vec<Message> {
        vec![
            Message::system("sys"),
            Message::user("do it"),
            Message::assistant_tool_calls("", vec![ToolCall::function("c1", "sh", "{}")]),
            Message::tool_result("c1", "long output"),
            Message::assistant("done"),
        ]
    }

    #[test]
    fn identical_output_is_all_same() {
        let input = msgs();
        let steps = align(&input, &input);
        assert_eq!(steps, (0..5).map(Step::Same).collect::<Vec<_>>());
    }

    #[test]
    fn rewritten_result_is_changed_and_summary_is_new() {
        let input = msgs();
        let digested = Message::tool_result("c1", "[digest]");
        let summary = Message::user("summary");
        let output = vec![
            input[0].clone(),
            summary.clone(),
            input[2].clone(),
            digested.clone(),
            Message::assistant("done, clipped"),
        ];
        let steps = align(&input, &output);
        assert_eq!(
            steps,
            vec![
                Step::Same(0),
                Step::Changed(1, &output[1]),
                Step::Same(2),
                Step::Changed(3, &output[3]),
                Step::Changed(4, &output[4]),
            ]
        );
        // With the user ask dropped, the summary is new.
        let output = vec![input[0].clone(), summary, input[4].clone()];
        let steps = align(&input, &output);
        assert_eq!(
            steps,
            vec![Step::Same(0), Step::Changed(1, &output[1]), Step::Same(4)]
        );
        let output = vec![
            input[0].clone(),
            Message::assistant("note"),
            input[4].clone(),
        ];
        let steps = align(&input, &output);
        assert_eq!(
            steps,
            vec![Step::Same(0), Step::New(&output[1]), Step::Same(4)]
        );
    }
}
