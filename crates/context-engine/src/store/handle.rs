//! Handles: short, stable names for archived content, computed from the
//! content alone so that the compressor can name a span before (and
//! without) any store, and a store can check the name it is given.
//!
//! - `s` + 12 hex digits: a span of messages ([`span_handle`]);
//! - `m` + 16 hex digits: one message ([`message_handle`]);
//! - a tool result keeps the handle the digest and the prune show (its
//!   `tool_call_id`, or `h` + 16 hex digits of its body), see
//!   [`result_handles`].

use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

use crate::digest::{ToolChannel, envelope_block_handles, result_handle};
use crate::message::{Message, Role};
use crate::tool_output::{EXPAND_TOOL, SEARCH_TOOL};
use crate::validate::is_tool_reentry;

/// A message's content address: xxh3-128 of its exact JSON, 32 hex digits.
/// Two messages with the same address are byte for byte the same message.
pub fn message_hash(message: &Message) -> String {
    let json = message_json(message);
    format!("{:032x}", xxh3_128(json.as_bytes()))
}

/// The exact JSON of `message` (parse then serialize is the identity).
pub fn message_json(message: &Message) -> String {
    serde_json::to_string(message).unwrap_or_else(|e| {
        // Serializing a parsed message cannot fail; keep a trace if it did.
        Value::String(format!("unserializable message: {e}")).to_string()
    })
}

/// The handle of one message: `m` and the first 16 hex digits of its hash.
pub fn message_handle(hash: &str) -> String {
    format!("m{}", &hash[..hash.len().min(16)])
}

/// The handle of the span `messages` (in order): `s` and 12 hex digits of
/// a hash over the messages' hashes. Deterministic: the same messages give
/// the same handle in any process, with or without a store.
pub fn span_handle(messages: &[Message]) -> String {
    let hashes: Vec<String> = messages.iter().map(message_hash).collect();
    span_handle_of_hashes(&hashes)
}

/// [`span_handle`] from the messages' [`message_hash`]es.
pub fn span_handle_of_hashes(hashes: &[String]) -> String {
    let joined = hashes.join(",");
    format!("s{:012x}", xxh3_64(joined.as_bytes()) & 0xffff_ffff_ffff)
}

/// The handles a tool result or text tool-result envelope is recalled by:
/// the digest's and the prune's (`tool_call_id` or `h…` body hash), and one
/// per envelope block.
pub fn result_handles(message: &Message) -> Vec<String> {
    if message.is_tool_result() {
        return vec![result_handle(message, &message.text())];
    }
    if message.role == Role::User && is_tool_reentry(message) {
        return envelope_block_handles(&message.text());
    }
    Vec::new()
}

/// Whether `text` looks like a handle of [`span_handle`] or
/// [`message_handle`] form.
pub fn is_store_handle(text: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    match text.split_at_checked(1) {
        Some(("s", rest)) => hex(rest, 12),
        Some(("m", rest)) => hex(rest, 16),
        _ => false,
    }
}

/// The line a summary carries for the span it replaces: messages
/// `start..end` of the compaction's input (end exclusive; shown as the
/// inclusive range `start-(end-1)`) archived under `handle`, for an agent
/// that calls tools ([`archive_note_for`]).
pub fn archive_note(start: usize, end: usize, handle: &str) -> String {
    archive_note_for(start, end, handle, ToolChannel::Tools)
}

/// [`archive_note`] for an agent on `channel`: with tools, it names the
/// tools that bring the span back; a text-action agent, which cannot call
/// them, reads only that the span was archived.
pub fn archive_note_for(start: usize, end: usize, handle: &str, channel: ToolChannel) -> String {
    let last = end.saturating_sub(1).max(start);
    match channel {
        ToolChannel::Tools => format!(
            "Messages {start}-{last} archived verbatim (handle {handle}): \
             {EXPAND_TOOL} {{\"handle\":\"{handle}\"}} shows them; {SEARCH_TOOL} finds words in them."
        ),
        ToolChannel::TextActions => format!(
            "Messages {start}-{last} archived verbatim (handle {handle}); \
             this summary is what remains of them in the conversation."
        ),
    }
}

/// The note a request carries for the `n` messages it left out to fit the
/// window, archived under `handle`, for an agent on `channel` (see
/// [`archive_note_for`]).
pub fn left_out_note(n: usize, handle: &str, channel: ToolChannel) -> String {
    let s = if n == 1 { "" } else { "s" };
    match channel {
        ToolChannel::Tools => format!(
            "[{n} earlier message{s} left out of this request to fit the window, archived (handle {handle}): \
             {EXPAND_TOOL} {{\"handle\":\"{handle}\"}} shows them; {SEARCH_TOOL} finds words in them.]"
        ),
        ToolChannel::TextActions => format!(
            "[{n} earlier message{s} left out of this request to fit the window, archived (handle {handle}).]"
        ),
    }
}

/// An [`archive_note`] found in a text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveNote<'t> {
    /// The span's first input index.
    pub start: usize,
    /// One past its last.
    pub end: usize,
    /// Its handle.
    pub handle: String,
    /// The note as written (to the end of its line).
    pub text: &'t str,
}

impl ArchiveNote<'_> {
    /// The channel the note was written for.
    pub fn channel(&self) -> ToolChannel {
        if self.text.contains(EXPAND_TOOL) {
            ToolChannel::Tools
        } else {
            ToolChannel::TextActions
        }
    }
}

/// The span a summary names through [`archive_note`]: `(start, end, handle)`
/// with `end` exclusive. A summary opens with its own note; notes of the
/// earlier summaries it carries come later, so the first note wins.
pub fn parse_archive_note(text: &str) -> Option<(usize, usize, String)> {
    find_archive_note(text).map(|n| (n.start, n.end, n.handle))
}

/// The first [`archive_note`] in `text`, as written.
pub fn find_archive_note(text: &str) -> Option<ArchiveNote<'_>> {
    archive_notes(text).next()
}

/// Every [`archive_note`] in `text`, in order.
pub fn parse_archive_notes(text: &str) -> Vec<(usize, usize, String)> {
    archive_notes(text)
        .map(|n| (n.start, n.end, n.handle))
        .collect()
}

fn archive_notes(text: &str) -> impl Iterator<Item = ArchiveNote<'_>> {
    const MARK: &str = " archived verbatim (handle ";
    let mut from = 0;
    std::iter::from_fn(move || {
        while let Some(at) = text[from..].find(MARK).map(|i| from + i) {
            from = at + MARK.len();
            if let Some(note) = note_at(text, at, MARK) {
                return Some(note);
            }
        }
        None
    })
}

fn note_at<'t>(text: &'t str, at: usize, mark: &str) -> Option<ArchiveNote<'t>> {
    let before = &text[..at];
    let open = before.rfind("Messages ")?;
    let (start, last) = before[open + "Messages ".len()..].split_once('-')?;
    let start: usize = start.trim().parse().ok()?;
    let last: usize = last.trim().parse().ok()?;
    let rest = &text[at + mark.len()..];
    let handle = &rest[..rest.find(')')?];
    let close = text[at..].find('\n').map_or(text.len(), |i| at + i);
    (is_store_handle(handle) && start <= last).then(|| ArchiveNote {
        start,
        end: last + 1,
        handle: handle.to_owned(),
        text: &text[open..close],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_short_stable_and_content_derived() {
        let a = vec![Message::user("fix it"), Message::assistant("done")];
        let b = vec![Message::user("fix it"), Message::assistant("done!")];
        let h = span_handle(&a);
        assert_eq!(h, span_handle(&a.clone()));
        assert_ne!(h, span_handle(&b));
        assert_eq!(h.len(), 13);
        assert!(is_store_handle(&h));
        let m = message_handle(&message_hash(&a[0]));
        assert_eq!(m.len(), 17);
        assert!(is_store_handle(&m));
        assert!(!is_store_handle("call_1"));
        assert!(!is_store_handle("sxyz"));
    }

    #[test]
    fn the_note_parses_back() {
        let note = archive_note(12, 58, "s0123456789ab");
        assert!(note.starts_with("Messages 12-57 archived verbatim (handle s0123456789ab)"));
        let text = format!("summary head\n{note}\nmore");
        assert_eq!(
            parse_archive_note(&text),
            Some((12, 58, "s0123456789ab".to_owned()))
        );
        assert_eq!(
            parse_archive_note("Messages 1-2 archived verbatim (handle nope)"),
            None
        );
        assert_eq!(parse_archive_note("no note"), None);
        // A summary that carries an older one: its own note comes first.
        let nested = format!(
            "{}\n\nprevious: {}",
            archive_note(3, 9, "s111111111111"),
            archive_note(1, 5, "s222222222222")
        );
        assert_eq!(
            parse_archive_note(&nested).map(|n| n.2),
            Some("s111111111111".into())
        );
        assert_eq!(parse_archive_notes(&nested).len(), 2);
    }

    #[test]
    fn a_text_action_agents_note_names_no_tool_and_parses_back() {
        let tools = archive_note_for(3, 9, "s111111111111", ToolChannel::Tools);
        let text = archive_note_for(3, 9, "s111111111111", ToolChannel::TextActions);
        assert_eq!(tools, archive_note(3, 9, "s111111111111"));
        for name in [EXPAND_TOOL, SEARCH_TOOL, "context_recall"] {
            assert!(!text.contains(name), "{text}");
            assert!(!left_out_note(4, "s1", ToolChannel::TextActions).contains(name));
        }
        assert!(tools.contains(EXPAND_TOOL));
        assert!(left_out_note(1, "s1", ToolChannel::Tools).contains(SEARCH_TOOL));
        for (note, channel) in [
            (&tools, ToolChannel::Tools),
            (&text, ToolChannel::TextActions),
        ] {
            let body = format!("[CONTEXT SUMMARY]\n{note}\n\nwhat happened");
            let found = find_archive_note(&body).expect("note");
            assert_eq!((found.start, found.end), (3, 9));
            assert_eq!(found.text, note.as_str());
            assert_eq!(found.channel(), channel);
        }
    }

    #[test]
    fn tool_results_keep_the_digest_handle() {
        let r = Message::tool_result("call_7", "out");
        assert_eq!(result_handles(&r), vec!["call_7".to_owned()]);
        assert!(result_handles(&Message::assistant("x")).is_empty());
    }
}
