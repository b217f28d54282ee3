//! Recall from the live history: the exact original body behind a digest
//! line, so nothing the digest hides is lost to the agent.

use super::RecallError;
use crate::digest::{hash_handle, is_digest_line, result_handle};
use crate::message::{Message, Role};
use crate::tool_output::PRUNE_MARK;
use crate::validate::{envelope, is_tool_reentry};

/// A 1-based, inclusive range of lines; `end: None` runs to the last line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineRange {
    /// First line, from 1.
    pub start: usize,
    /// Last line, inclusive; past the end means the last line.
    pub end: Option<usize>,
}

/// The full original body for `handle` (a `tool_call_id`, or the `h…` hash
/// a digest shows for results without one and for envelope blocks), or the
/// lines `lines` of it, byte for byte (line breaks included).
///
/// `messages` must be the stored history, not a digested request view.
pub fn recall(
    messages: &[Message],
    handle: &str,
    lines: Option<LineRange>,
) -> Result<String, RecallError> {
    let body = find(messages, handle)?;
    match lines {
        None => Ok(body),
        Some(range) => slice_lines(&body, handle, range),
    }
}

pub(super) fn find(messages: &[Message], handle: &str) -> Result<String, RecallError> {
    let mut digested = None;
    for (index, message) in messages.iter().enumerate() {
        if message.is_tool_result() {
            let body = message.text();
            if result_handle(message, &body) != handle {
                continue;
            }
            // A digest or prune line is not the body: it was replaced in
            // the history (prune) or the caller passed a request view.
            if is_digest_line(&body) || body.starts_with(PRUNE_MARK) {
                digested.get_or_insert(index);
                continue;
            }
            return Ok(body.into_owned());
        }
        if message.role == Role::User && !is_tool_reentry(message) {
            let text = message.text();
            if hash_handle(&text) == handle {
                return Ok(text.into_owned());
            }
            continue;
        }
        if message.role == Role::User && is_tool_reentry(message) {
            let text = message.text();
            if envelope::is_digested(&text) {
                continue;
            }
            if let Some(block) = envelope::blocks(&text)
                .into_iter()
                .find(|b| hash_handle(b.body) == handle)
            {
                return Ok(block.body.to_owned());
            }
        }
    }
    Err(match digested {
        Some(index) => RecallError::Digested {
            handle: handle.to_owned(),
            index,
        },
        None => RecallError::UnknownHandle {
            handle: handle.to_owned(),
        },
    })
}

pub(super) fn slice_lines(
    body: &str,
    handle: &str,
    range: LineRange,
) -> Result<String, RecallError> {
    let all: Vec<&str> = body.split_inclusive('\n').collect();
    let last = range.end.unwrap_or(all.len()).min(all.len());
    if range.start == 0 || range.start > last {
        return Err(RecallError::BadRange {
            handle: handle.to_owned(),
            start: range.start,
            end: range.end.unwrap_or(all.len()),
            lines: all.len(),
        });
    }
    Ok(all[range.start - 1..last].concat())
}
