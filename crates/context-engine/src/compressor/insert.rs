//! The summary message: its wrapper, where it goes, which role it takes, and
//! how a later compaction finds it again.
//!
//! The summary is recognised by its text alone (prefix and end marker): no
//! private key travels with the message, so nothing internal reaches the
//! provider, and a transcript reloaded after a restart still yields it.

use crate::message::{Content, ContentPart, Message, Role};
use crate::validate::{Profile, may_place};

pub use crate::summary_text::{
    Placement, SUMMARY_END, SUMMARY_PREFIX, find_summary, is_summary, summary_body,
    without_summary, wrap_summary,
};

/// The one-time note appended to the system prompt.
pub const SYSTEM_NOTE: &str = "Note: earlier turns of this conversation have been compacted \
into a summary marked [CONTEXT SUMMARY]; treat it as background and prefer the messages that \
follow it.";

/// `body` opened by the line naming the archived span `start..end` of the
/// input and its handle, worded for an agent on `channel` (see
/// [`crate::store::archive_note_for`]).
pub fn with_archive_note(
    body: &str,
    start: usize,
    end: usize,
    handle: &str,
    channel: crate::digest::ToolChannel,
) -> String {
    let note = crate::store::archive_note_for(start, end, handle, channel);
    format!("{note}\n\n{}", body.trim())
}

/// Where the summary goes between `before` (head and pinned messages) and
/// `after` (the tail). `user_survives`: some real user message stays.
///
/// The reference design's rule: after the system prompt, after an
/// assistant turn, or when no user message survives, the summary is the
/// user's turn, else the assistant's; when that role may not stand there
/// under `profile` (asked of [`may_place`]), the other one; when neither
/// may, it is merged into the first tail message. Under every profile this
/// adds no same-role adjacency.
pub fn choose_placement(
    before: &[Message],
    after: &[Message],
    user_survives: bool,
    profile: Profile,
) -> Placement {
    let prev = before.iter().rev().find_map(|m| match m.role {
        Role::Assistant => Some(false),
        Role::User | Role::Tool | Role::Function => Some(true),
        _ => None,
    });
    let want_user = prev.is_none() || !user_survives || prev == Some(false);
    let (first, second) = if want_user {
        (Placement::User, Placement::Assistant)
    } else {
        (Placement::Assistant, Placement::User)
    };
    for placement in [first, second] {
        let role = match placement {
            Placement::User => Role::User,
            _ => Role::Assistant,
        };
        if may_place(before, &role, after, profile) {
            return placement;
        }
    }
    if after.is_empty() {
        // Nothing to merge into: the preferred role, even if it collides.
        first
    } else {
        Placement::Merged
    }
}

/// `message` with `text` put before its own content.
pub fn prepend_text(message: &Message, text: &str) -> Message {
    let mut out = message.clone();
    out.content = match &message.content {
        Content::Text(own) if own.trim().is_empty() => Content::Text(text.to_owned()),
        Content::Text(own) => Content::Text(format!("{text}\n\n{own}")),
        Content::Parts(parts) => {
            let mut parts = parts.clone();
            parts.insert(0, ContentPart::new_text(text));
            Content::Parts(parts)
        }
        Content::Absent | Content::Null => Content::Text(text.to_owned()),
    };
    out
}

/// The system message with the one-time compaction note (unchanged when it
/// already has it).
pub fn with_system_note(message: &Message) -> Message {
    if message.text().contains(SYSTEM_NOTE) {
        return message.clone();
    }
    let mut out = message.clone();
    out.content = match &message.content {
        Content::Text(own) => Content::Text(format!("{own}\n\n{SYSTEM_NOTE}")),
        Content::Parts(parts) => {
            let mut parts = parts.clone();
            parts.push(ContentPart::new_text(SYSTEM_NOTE));
            Content::Parts(parts)
        }
        Content::Absent | Content::Null => Content::Text(SYSTEM_NOTE.to_owned()),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_follows_the_neighbours() {
        use Placement::{Assistant, Merged, User};
        let sys = [Message::system("s")];
        let user = [Message::user("u")];
        let asst = [Message::assistant("a")];
        let tool = [Message::tool_result("c", "r")];
        for p in Profile::ALL {
            // After the system prompt: user, unless the tail starts with a user.
            assert_eq!(choose_placement(&sys, &asst, true, p), User);
            // Between an assistant and a user turn both roles collide.
            assert_eq!(choose_placement(&asst, &user, true, p), Merged);
            assert_eq!(choose_placement(&user, &user, true, p), Assistant);
            assert_eq!(choose_placement(&asst, &asst, true, p), User);
            assert_eq!(choose_placement(&tool, &user, true, p), Assistant);
            assert_eq!(choose_placement(&user, &asst, false, p), Merged);
        }
        // OpenAI lets a user turn follow tool results, or open the talk.
        assert_eq!(
            choose_placement(&sys, &user, true, Profile::OpenAi),
            Assistant
        );
        assert_eq!(choose_placement(&sys, &user, true, Profile::Strict), Merged);
        assert_eq!(choose_placement(&tool, &asst, true, Profile::OpenAi), User);
        assert_eq!(
            choose_placement(&tool, &asst, true, Profile::Strict),
            Merged
        );
    }

    #[test]
    fn system_note_is_added_once() {
        let once = with_system_note(&Message::system("You are helpful."));
        assert_eq!(with_system_note(&once), once);
        assert!(once.text().ends_with(SYSTEM_NOTE));
    }
}
