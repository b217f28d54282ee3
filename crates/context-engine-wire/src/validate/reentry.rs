//! Tool re-entries: user messages that are the second half of the assistant
//! turn before them, not a new user turn.
//!
//! Two kinds, recognised here and nowhere else:
//!
//! - a text tool-result *envelope* (arbiter style, see `envelope.rs`):
//!   self-describing, recognised from the message alone
//!   ([`is_tool_reentry`]);
//! - an *observation* of a text-action agent (see `observation.rs`): the
//!   output of the action the assistant wrote as text, sent back as a user
//!   message; recognised from the message and the assistant message before
//!   it ([`is_observation`]).
//!
//! [`is_real_user_turn`] is the complement: the one definition of "a user
//! ask" for every engine, summary and probe.

use super::envelope;
use super::observation::{TextActions, observation_with};
use crate::message::{Message, Role};

/// Whether `message` is a user message that carries text tool-result
/// envelopes (`[/verb args] … [END VERB]` or `[verb] … [/verb]` blocks and
/// a closing `[END TOOL RESULTS]` line), or their digest. Needs no context.
pub fn is_tool_reentry(message: &Message) -> bool {
    message.role == Role::User && envelope::is_envelope(&message.text())
}

/// Whether message `i` of `messages` is a tool re-entry: an envelope or an
/// observation under the text-action setting `actions`. False for `i` out
/// of range.
pub fn is_reentry_with(messages: &[Message], i: usize, actions: &TextActions) -> bool {
    messages
        .get(i)
        .is_some_and(|m| is_tool_reentry(m) || observation_with(messages, i, actions).is_some())
}

/// Every message's answer to [`is_reentry_with`], computed once (O(n) plus
/// the scanned user texts).
pub fn reentries_with(messages: &[Message], actions: &TextActions) -> Vec<bool> {
    (0..messages.len())
        .map(|i| is_reentry_with(messages, i, actions))
        .collect()
}

/// Whether message `i` is a user turn written by the user (or the harness
/// as the user): a user message that is neither an envelope nor an
/// observation under `actions`. When in doubt it is one: only a message
/// that matches a known observation shape right after an assistant action
/// is not.
pub fn is_real_user_turn(messages: &[Message], i: usize, actions: &TextActions) -> bool {
    messages
        .get(i)
        .is_some_and(|m| m.role == Role::User && !is_reentry_with(messages, i, actions))
}
