//! OpenAI Responses rules and cut points, on the lossless
//! [`crate::responses`] model. Violations carry the input item index.
//!
//! - every client tool call (`function_call`, `custom_tool_call`,
//!   `local_shell_call`…) is answered later by an output with its `call_id`
//!   ([`Rule::UnansweredToolCall`]), call ids are unique
//!   ([`Rule::DuplicateToolCallId`]);
//! - an output answers an earlier call, once ([`Rule::OrphanToolResult`],
//!   [`Rule::DuplicateToolResult`]);
//! - a `reasoning` item is followed by the item it was produced with (an
//!   assistant message or a call, possibly after more reasoning), never by a
//!   user turn, an output or the end ([`Rule::ReasoningNotFollowed`]);
//! - message roles are `user`, `assistant`, `system` or `developer`
//!   ([`Rule::UnknownRole`]).
//!
//! Cut points: a boundary is safe unless a call before it is answered after
//! it, a reasoning item is right before it, or an item of a type this crate
//! does not model is right after it (it stays with what precedes it).

use std::collections::{HashMap, HashSet};

use super::cut::CutPoints;
use super::{Rule, Violation};
use crate::responses::{Item, ItemKind, Request};

/// Every violation of the Responses rules in `request`'s input.
/// Whether item `b`, a rewrite of `a`, is the same to every rule of this
/// module: the same type and kind, role or `call_id`. An input whose items
/// are each the same shape as the original's, in the same order, has
/// exactly the original's violations.
pub fn same_shape(a: &Item, b: &Item) -> bool {
    a.item_type() == b.item_type()
        && match (a.kind(), b.kind()) {
            (ItemKind::Message { role: x, .. }, ItemKind::Message { role: y, .. }) => x == y,
            (ItemKind::Call { call_id: x, .. }, ItemKind::Call { call_id: y, .. })
            | (ItemKind::Output { call_id: x, .. }, ItemKind::Output { call_id: y, .. }) => x == y,
            (ItemKind::Reasoning { .. }, ItemKind::Reasoning { .. })
            | (ItemKind::Other(_), ItemKind::Other(_)) => a == b,
            _ => false,
        }
}

pub fn validate(request: &Request) -> Vec<Violation> {
    let items = request.items();
    let mut out = Vec::new();
    let mut calls: HashSet<&str> = HashSet::new();
    let mut answered: HashSet<&str> = HashSet::new();
    let outputs: HashSet<&str> = items
        .iter()
        .filter_map(|it| match it.kind() {
            ItemKind::Output { call_id, .. } => Some(call_id),
            _ => None,
        })
        .collect();
    let mut later_outputs: HashMap<&str, usize> = HashMap::new();
    for (i, it) in items.iter().enumerate() {
        if let ItemKind::Output { call_id, .. } = it.kind() {
            later_outputs.insert(call_id, i);
        }
    }
    for (i, it) in items.iter().enumerate() {
        match it.kind() {
            ItemKind::Message { role, .. } => {
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    out.push(Violation::new(
                        i,
                        Rule::UnknownRole,
                        format!(
                            "message role `{role}` is not user, assistant, system or developer"
                        ),
                    ));
                }
            }
            ItemKind::Call { call_id, .. } => {
                if !calls.insert(call_id) {
                    out.push(Violation::new(
                        i,
                        Rule::DuplicateToolCallId,
                        format!("call_id `{call_id}` is used again"),
                    ));
                }
                let later = later_outputs.get(call_id).is_some_and(|&o| o > i);
                if !outputs.contains(call_id) || !later {
                    out.push(Violation::new(
                        i,
                        Rule::UnansweredToolCall,
                        format!("call `{call_id}` has no output after it"),
                    ));
                }
            }
            ItemKind::Output { call_id, .. } => {
                if !calls.contains(call_id) {
                    out.push(Violation::new(
                        i,
                        Rule::OrphanToolResult,
                        format!("output for `{call_id}` answers no earlier call"),
                    ));
                } else if !answered.insert(call_id) {
                    out.push(Violation::new(
                        i,
                        Rule::DuplicateToolResult,
                        format!("a second output for `{call_id}`"),
                    ));
                }
            }
            ItemKind::Reasoning { .. } => {
                let follower = items[i + 1..]
                    .iter()
                    .find(|n| !matches!(n.kind(), ItemKind::Reasoning { .. }));
                let ok = follower.is_some_and(|n| match n.kind() {
                    ItemKind::Message { role, .. } => role == "assistant",
                    ItemKind::Call { .. } | ItemKind::Other(_) => true,
                    _ => false,
                });
                if !ok {
                    out.push(Violation::new(
                        i,
                        Rule::ReasoningNotFollowed,
                        "a reasoning item must be followed by the assistant message or call it was produced with",
                    ));
                }
            }
            ItemKind::Other(_) => {}
        }
    }
    out
}

/// Safe boundaries of the input items (see the module docs).
pub fn cut_points(request: &Request) -> CutPoints {
    let items = request.items();
    let mut forbidden = vec![false; items.len() + 1];
    let mut last_output: HashMap<&str, usize> = HashMap::new();
    for (i, it) in items.iter().enumerate() {
        if let ItemKind::Output { call_id, .. } = it.kind() {
            last_output.insert(call_id, i);
        }
    }
    // Open calls: forbid every boundary between a call and its last output.
    let mut open_until: Option<usize> = None;
    for (i, it) in items.iter().enumerate() {
        if open_until.is_some_and(|o| o >= i) {
            forbidden[i] = true;
        }
        match it.kind() {
            ItemKind::Call { call_id, .. } => {
                if let Some(&o) = last_output.get(call_id) {
                    open_until = open_until.max(Some(o));
                }
            }
            ItemKind::Reasoning { .. } => forbidden[i + 1] = true,
            ItemKind::Other(_) => forbidden[i] = true,
            _ => {}
        }
    }
    CutPoints::from_forbidden(forbidden, None)
}
