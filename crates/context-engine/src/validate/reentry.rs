//! Text tool-result envelopes: agents that call tools in plain text (arbiter
//! style) feed the results back as a *user* message. Such a message is the
//! second half of the assistant turn before it, not a new user turn.

use super::{Property, Violation};
use crate::message::{Message, Role};

/// The marker that closes an arbiter-style block of tool results.
const END_MARKER: &str = "[END TOOL RESULTS]";

/// Whether `message` is a user message that carries text tool-result
/// envelopes: its text contains `[END TOOL RESULTS]` and a line starting
/// with `[/` (the closing tag of an envelope).
pub fn is_tool_reentry(message: &Message) -> bool {
    if message.role != Role::User {
        return false;
    }
    let text = message.text();
    text.contains(END_MARKER) && text.lines().any(|line| line.starts_with("[/"))
}

/// Whether `message` is a user turn written by the user (or the harness as
/// the user), not a tool re-entry.
pub fn is_real_user_turn(message: &Message) -> bool {
    message.role == Role::User && !is_tool_reentry(message)
}

/// A tool re-entry stays with the assistant turn before it: a kept tail must
/// not start on one, or the results would reach the model without the calls
/// that produced them. Not a rule about requests, so it reports nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct ToolReentry;

impl Property for ToolReentry {
    fn name(&self) -> &'static str {
        "tool-reentry"
    }

    fn check(&self, _messages: &[Message], _out: &mut Vec<Violation>) {}

    fn forbid(&self, messages: &[Message], forbidden: &mut [bool]) {
        for (i, message) in messages.iter().enumerate() {
            if is_tool_reentry(message)
                && let Some(slot) = forbidden.get_mut(i)
            {
                *slot = true;
            }
        }
    }
}
