//! Anthropic Messages rules and cut points, on the lossless
//! [`crate::anthropic`] model. Violations carry the index in `messages`; the
//! detail names the block.
//!
//! - every `tool_use` of an assistant message is answered by a `tool_result`
//!   in the next message, which is a user message whose tool results come
//!   before any other block ([`Rule::UnansweredToolCall`],
//!   [`Rule::ToolResultNotFirst`]);
//! - a `tool_result` answers only a `tool_use` of the assistant message just
//!   before it, once ([`Rule::OrphanToolResult`],
//!   [`Rule::DuplicateToolResult`]); tool-use ids are unique
//!   ([`Rule::DuplicateToolCallId`]);
//! - roles are `user` and `assistant` (Claude Code's `system` entries are
//!   accepted and sit outside the alternation), the first is `user`, and
//!   they alternate ([`Rule::UnknownRole`], [`Rule::FirstNotUser`],
//!   [`Rule::ConsecutiveSameRole`]);
//! - a rewrite keeps the thinking blocks of every assistant turn that uses
//!   tools byte for byte ([`thinking_changed`], [`Rule::ThinkingChanged`]).
//!
//! Cut points: a boundary is safe unless it separates an assistant message
//! that uses tools from the user message holding its results; role
//! alternation at the join is checked by [`CutPoints::can_remove`].

use std::collections::{HashMap, HashSet};

use super::cut::CutPoints;
use super::strict::Side;
use super::{Rule, Violation};
use crate::anthropic::{Block, BlockKind, Message, Request};

fn tool_use_ids(m: &Message) -> Vec<&str> {
    m.blocks()
        .iter()
        .filter_map(|b| match b.kind() {
            BlockKind::ToolUse { id, .. } => Some(id),
            _ => None,
        })
        .collect()
}

fn side(m: &Message) -> Side {
    match m.role.as_str() {
        "user" => Side::User,
        "assistant" => Side::Assistant,
        _ => Side::Skip,
    }
}

/// Every violation of the Anthropic rules in `request`, by message index.
pub fn validate(request: &Request) -> Vec<Violation> {
    let messages = &request.messages;
    let mut out = Vec::new();
    let mut all_ids: HashSet<&str> = HashSet::new();
    let mut previous: Option<Side> = None;
    for (i, m) in messages.iter().enumerate() {
        if !matches!(m.role.as_str(), "user" | "assistant" | "system") {
            out.push(Violation::new(
                i,
                Rule::UnknownRole,
                format!("role `{}` is neither `user` nor `assistant`", m.role),
            ));
        }
        let s = side(m);
        if s != Side::Skip {
            match previous {
                None if s != Side::User => out.push(Violation::new(
                    i,
                    Rule::FirstNotUser,
                    "the first message must be a user message",
                )),
                Some(p) if p == s => out.push(Violation::new(
                    i,
                    Rule::ConsecutiveSameRole,
                    format!("two `{}` messages in a row", m.role),
                )),
                _ => {}
            }
            previous = Some(s);
        }
        // Calls: unique ids, answered in the next message.
        if m.role == "assistant" {
            let ids = tool_use_ids(m);
            for id in &ids {
                if !all_ids.insert(id) {
                    out.push(Violation::new(
                        i,
                        Rule::DuplicateToolCallId,
                        format!("tool_use id `{id}` is used again"),
                    ));
                }
            }
            let answered: HashSet<&str> = messages
                .get(i + 1)
                .filter(|n| n.role == "user")
                .map(|n| {
                    n.blocks()
                        .iter()
                        .filter_map(|b| match b.kind() {
                            BlockKind::ToolResult { tool_use_id, .. } => Some(tool_use_id),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            for id in ids {
                if !answered.contains(id) {
                    out.push(Violation::new(
                        i,
                        Rule::UnansweredToolCall,
                        format!(
                            "tool_use `{id}` has no tool_result in the next message (message {})",
                            i + 1
                        ),
                    ));
                }
            }
        }
        // Results: first in the message, answering the previous assistant.
        let mut seen_other = false;
        let mut answered: HashSet<&str> = HashSet::new();
        let calls: HashSet<&str> = i
            .checked_sub(1)
            .and_then(|p| messages.get(p))
            .filter(|p| p.role == "assistant")
            .map(|p| tool_use_ids(p).into_iter().collect())
            .unwrap_or_default();
        for (b, block) in m.blocks().iter().enumerate() {
            let BlockKind::ToolResult { tool_use_id, .. } = block.kind() else {
                seen_other = true;
                continue;
            };
            if m.role != "user" {
                out.push(Violation::new(
                    i,
                    Rule::OrphanToolResult,
                    format!("block {b}: a tool_result in a `{}` message", m.role),
                ));
                continue;
            }
            if seen_other {
                out.push(Violation::new(
                    i,
                    Rule::ToolResultNotFirst,
                    format!("block {b}: tool_result `{tool_use_id}` comes after other content"),
                ));
            }
            if !calls.contains(tool_use_id) {
                out.push(Violation::new(
                    i,
                    Rule::OrphanToolResult,
                    format!(
                        "block {b}: tool_result `{tool_use_id}` answers no tool_use of the previous assistant message"
                    ),
                ));
            } else if !answered.insert(tool_use_id) {
                out.push(Violation::new(
                    i,
                    Rule::DuplicateToolResult,
                    format!("block {b}: a second tool_result for `{tool_use_id}`"),
                ));
            }
        }
    }
    out
}

/// The thinking blocks of `m`, in order.
/// Whether `b`, a rewrite of message `a`, is the same to every rule of
/// this module: the role, the blocks in the same order and of the same
/// kinds with the same tool ids, the thinking blocks equal. A request whose
/// messages are each the same shape as the original's has exactly the
/// original's violations, and no changed thinking.
pub fn same_shape(a: &Message, b: &Message) -> bool {
    let kinds_match = |x: &Block, y: &Block| match (x.kind(), y.kind()) {
        (BlockKind::ToolUse { id: i, .. }, BlockKind::ToolUse { id: j, .. }) => i == j,
        (
            BlockKind::ToolResult { tool_use_id: i, .. },
            BlockKind::ToolResult { tool_use_id: j, .. },
        ) => i == j,
        (BlockKind::ToolUse { .. } | BlockKind::ToolResult { .. }, _)
        | (_, BlockKind::ToolUse { .. } | BlockKind::ToolResult { .. }) => false,
        _ if x.is_thinking() || y.is_thinking() => x == y,
        _ => true,
    };
    a.role == b.role
        && a.content.is_some() == b.content.is_some()
        && a.blocks().len() == b.blocks().len()
        && a.blocks()
            .iter()
            .zip(b.blocks())
            .all(|(x, y)| kinds_match(x, y))
}

fn thinking(m: &Message) -> Vec<&Block> {
    m.blocks().iter().filter(|b| b.is_thinking()).collect()
}

/// Violations of "the thinking blocks of an assistant turn with tool use are
/// kept unchanged": for every assistant message of `after` that uses tools,
/// the message of `before` with the same first `tool_use` id must have the
/// same thinking blocks, byte for byte, in the same order. Indexes are in
/// `after`.
pub fn thinking_changed(before: &Request, after: &Request) -> Vec<Violation> {
    let mut by_call: HashMap<&str, &Message> = HashMap::new();
    for m in &before.messages {
        if let Some(id) = tool_use_ids(m).first() {
            by_call.entry(id).or_insert(m);
        }
    }
    let mut out = Vec::new();
    for (i, m) in after.messages.iter().enumerate() {
        if m.role != "assistant" {
            continue;
        }
        let Some(first) = tool_use_ids(m).first().copied() else {
            continue;
        };
        if let Some(orig) = by_call.get(first)
            && thinking(orig) != thinking(m)
        {
            out.push(Violation::new(
                i,
                Rule::ThinkingChanged,
                format!("the thinking blocks of the turn calling `{first}` changed"),
            ));
        }
    }
    out
}

/// Safe boundaries of `request.messages` (see the module docs).
pub fn cut_points(request: &Request) -> CutPoints {
    let messages = &request.messages;
    let mut forbidden = vec![false; messages.len() + 1];
    for (i, m) in messages.iter().enumerate() {
        if m.role == "assistant" && !tool_use_ids(m).is_empty() {
            forbidden[i + 1] = true;
        }
        let starts_with_result = m.role == "user"
            && m.blocks()
                .first()
                .is_some_and(|b| matches!(b.kind(), BlockKind::ToolResult { .. }));
        if starts_with_result {
            forbidden[i] = true;
        }
    }
    CutPoints::from_forbidden(forbidden, Some(messages.iter().map(side).collect()))
}
