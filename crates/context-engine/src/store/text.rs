//! The text a store indexes, shared by the backends so that all answer a
//! search the same way (which messages and lines match:
//! [`super::matched_lines`]; the SQLite store's query and per-session
//! terms: `context-engine-sqlite`'s `index.rs`).

use crate::message::Message;

/// A message's indexed text: its content, then each tool call's name and
/// arguments (what retention searches too).
pub fn index_text(message: &Message) -> String {
    crate::retention::searchable(message, &message.text())
}
