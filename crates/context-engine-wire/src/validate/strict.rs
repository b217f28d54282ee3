//! Strict (Anthropic-like) turn order: the conversation starts with the user
//! and roles alternate.
//!
//! The mapping assumed is Anthropic's: system and developer messages are
//! lifted out of the conversation; `tool` (and legacy `function`) results
//! become `tool_result` blocks of a *user* turn, so consecutive results after
//! one assistant turn merge into one user turn and are fine. A user message
//! right after tool results would be a second user turn in a row: this
//! profile reports it as [`Rule::ConsecutiveSameRole`] (the API may merge such
//! turns, but a strict check should not rely on it; agents that need it put
//! their text into the results' turn). Unknown roles are reported by
//! [`super::KnownRoles`] and skipped here, so one bad message does not also
//! break the alternation around it.

use super::{Property, Rule, Violation};
use crate::message::{Message, Role};

/// Which side of the conversation a message lands on under the mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// Not part of the alternation (instructions, unknown roles).
    Skip,
    User,
    /// A tool result: a user turn that merges with adjacent results.
    Result,
    Assistant,
}

impl Side {
    pub(crate) fn of(message: &Message) -> Side {
        match message.role {
            Role::User => Side::User,
            Role::Tool | Role::Function => Side::Result,
            Role::Assistant => Side::Assistant,
            Role::System | Role::Developer | Role::Other(_) => Side::Skip,
        }
    }
}

/// Whether message `b` (side `y`) may directly follow message `a` (side
/// `x`), both conversational; `None` when it may.
fn clash(x: Side, y: Side) -> Option<&'static str> {
    match (x, y) {
        (Side::Assistant, Side::Assistant) => Some("two assistant turns in a row"),
        (Side::Result, Side::Result) => None,
        (Side::User | Side::Result, Side::User | Side::Result) => {
            Some("two user turns in a row (tool results count as a user turn)")
        }
        _ => None,
    }
}

/// Whether removing the range `a..b` keeps the strict rules at the join:
/// the last conversational message before `a` and the first at or after `b`
/// may be adjacent, and if nothing conversational precedes `a` the first one
/// after is a user message. `sides[i]` is `Side::of(&messages[i])`.
///
/// Skipped messages are stepped over; they are rare (instructions at the top,
/// an `exit` at the end), so this stays O(1) in practice.
pub(crate) fn join_ok(sides: &[Side], a: usize, b: usize) -> bool {
    let before = sides[..a.min(sides.len())]
        .iter()
        .rev()
        .copied()
        .find(|s| *s != Side::Skip);
    let after = sides
        .get(b..)
        .unwrap_or(&[])
        .iter()
        .copied()
        .find(|s| *s != Side::Skip);
    match (before, after) {
        (Some(x), Some(y)) => clash(x, y).is_none(),
        (None, Some(y)) => y == Side::User,
        (_, None) => true,
    }
}

/// The conversation starts with a user message and roles alternate (see the
/// module docs for the mapping). The constraint on cuts is pairwise (which
/// two messages meet at the join), so it forbids no single boundary; see
/// [`super::CutPoints::can_remove`].
#[derive(Clone, Copy, Debug, Default)]
pub struct StrictAlternation;

impl Property for StrictAlternation {
    fn name(&self) -> &'static str {
        "strict-alternation"
    }

    fn check(&self, messages: &[Message], out: &mut Vec<Violation>) {
        let mut previous: Option<(usize, Side)> = None;
        for (i, message) in messages.iter().enumerate() {
            let side = Side::of(message);
            if side == Side::Skip {
                continue;
            }
            match previous {
                None if message.role != Role::User => out.push(Violation::new(
                    i,
                    Rule::FirstNotUser,
                    format!(
                        "the conversation starts with a `{}` message, not a user message",
                        message.role
                    ),
                )),
                Some((k, before)) => {
                    if let Some(why) = clash(before, side) {
                        out.push(Violation::new(
                            i,
                            Rule::ConsecutiveSameRole,
                            format!("{why}: message {k} is `{}`", messages[k].role),
                        ));
                    }
                }
                None => {}
            }
            previous = Some((i, side));
        }
    }
}
