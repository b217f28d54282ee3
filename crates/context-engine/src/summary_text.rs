//! The summary message's text: the wrapper that opens and closes every
//! summary, how a later compaction (or a front, or the retention pass)
//! finds it again, and where it was placed.
//!
//! The summary is recognised by its text alone (prefix and end marker): no
//! private key travels with the message, so nothing internal reaches the
//! provider, and a transcript reloaded after a restart still yields it.

use crate::message::Message;

// The marks live with the message model, which reads around them.
pub use crate::message::summary_marks::{SUMMARY_END, SUMMARY_PREFIX};

/// The full summary text for `body`.
pub fn wrap_summary(body: &str) -> String {
    format!("{SUMMARY_PREFIX}\n\n{}\n{SUMMARY_END}", body.trim())
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
}
