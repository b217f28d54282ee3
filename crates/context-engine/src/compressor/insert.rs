//! The summary message: its wrapper, where it goes, which role it takes, and
//! how a later compaction finds it again.
//!
//! The summary is recognised by its text alone (prefix and end marker): no
//! private key travels with the message, so nothing internal reaches the
//! provider, and a transcript reloaded after a restart still yields it.

use crate::message::{Content, ContentPart, Message, Role};
use crate::validate::{Profile, may_place};

/// Opens every summary: marks it as reference material, not a new request.
pub const SUMMARY_PREFIX: &str = "[CONTEXT SUMMARY: reference only] Earlier turns of this \
conversation were compacted into the summary below. It is background, not a new request; \
where it disagrees with the messages after it, those messages win.";

/// Closes every summary.
pub const SUMMARY_END: &str = "[END CONTEXT SUMMARY]";

/// The one-time note appended to the system prompt.
pub const SYSTEM_NOTE: &str = "Note: earlier turns of this conversation have been compacted \
into a summary marked [CONTEXT SUMMARY]; treat it as background and prefer the messages that \
follow it.";

/// The full summary text for `body`.
pub fn wrap_summary(body: &str) -> String {
    format!("{SUMMARY_PREFIX}\n\n{}\n{SUMMARY_END}", body.trim())
}

/// `body` opened by the line naming the archived span `start..end` of the
/// input and its handle (see [`crate::store::archive_note`]).
pub fn with_archive_note(body: &str, start: usize, end: usize, handle: &str) -> String {
    let note = crate::store::archive_note(start, end, handle);
    format!("{note}\n\n{}", body.trim())
}

/// The summary body inside `text`, if `text` carries one.
pub fn summary_body(text: &str) -> Option<&str> {
    let start = text.find(SUMMARY_PREFIX)? + SUMMARY_PREFIX.len();
    let rest = &text[start..];
    let end = rest.find(SUMMARY_END).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

/// `text` without the summary it carries (for a summary merged into a
/// message: the message's own words).
pub fn without_summary(text: &str) -> String {
    let Some(start) = text.find(SUMMARY_PREFIX) else {
        return text.to_owned();
    };
    let rest = &text[start..];
    let end = rest
        .find(SUMMARY_END)
        .map_or(text.len(), |e| start + e + SUMMARY_END.len());
    format!("{}{}", &text[..start], &text[end..])
        .trim()
        .to_owned()
}

/// Whether `message` carries a summary.
pub fn is_summary(message: &Message) -> bool {
    message.text().contains(SUMMARY_PREFIX)
}

/// The last message carrying a summary, with its body.
pub fn find_summary(messages: &[Message]) -> Option<(usize, String)> {
    messages.iter().enumerate().rev().find_map(|(i, m)| {
        let text = m.text();
        summary_body(&text).map(|b| (i, b.to_owned()))
    })
}

/// How the summary was put into the transcript.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Its own `user` message.
    User,
    /// Its own `assistant` message.
    Assistant,
    /// Prepended to the first tail message (both roles would collide).
    Merged,
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
    fn wrap_and_recover() {
        let wrapped = wrap_summary("  body text \n");
        assert_eq!(summary_body(&wrapped), Some("body text"));
        let merged = format!("{wrapped}\n\nthe user's own words");
        assert_eq!(without_summary(&merged), "the user's own words");
        let history = vec![
            Message::user("a"),
            Message::user(wrap_summary("old")),
            Message::assistant("b"),
            Message::user(wrap_summary("new")),
        ];
        assert_eq!(find_summary(&history), Some((3, "new".to_owned())));
    }

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
