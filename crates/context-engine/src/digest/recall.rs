//! Recall: the exact original body behind a digest line, from the stored
//! history, so nothing the digest hides is lost to the agent.

use serde_json::{Value, json};

use super::{hash_handle, is_digest_line, result_handle};
use crate::message::{Message, Role};
use crate::validate::{envelope, is_tool_reentry, observation};

/// The name of the tool an engine offers for recall.
pub const RECALL_TOOL: &str = "context_recall";

/// A 1-based, inclusive range of lines; `end: None` runs to the last line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineRange {
    /// First line, from 1.
    pub start: usize,
    /// Last line, inclusive; past the end means the last line.
    pub end: Option<usize>,
}

/// Why a recall gave no body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecallError {
    /// No tool result or envelope block in the history has this handle.
    #[error("no tool result with handle `{handle}` in the stored history")]
    UnknownHandle {
        /// The handle asked for.
        handle: String,
    },
    /// The history given holds only the digest (a request view was passed
    /// instead of the stored history).
    #[error(
        "tool result `{handle}` (message {index}) is itself a digest; recall needs the stored history"
    )]
    Digested {
        /// The handle asked for.
        handle: String,
        /// Index of the digested message.
        index: usize,
    },
    /// The line range is empty or starts past the last line.
    #[error("lines {start}..={end} are out of range for `{handle}`, which has {lines} line(s)")]
    BadRange {
        /// The handle asked for.
        handle: String,
        /// First line asked for.
        start: usize,
        /// Last line asked for (the last line when open).
        end: usize,
        /// Lines in the body.
        lines: usize,
    },
    /// The tool call's arguments are not what the schema says.
    #[error("bad {RECALL_TOOL} arguments: {0}")]
    BadArguments(String),
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

fn find(messages: &[Message], handle: &str) -> Result<String, RecallError> {
    let mut digested = None;
    for (index, message) in messages.iter().enumerate() {
        if message.is_tool_result() {
            let body = message.text();
            if result_handle(message, &body) != handle {
                continue;
            }
            if is_digest_line(&body) {
                digested.get_or_insert(index);
                continue;
            }
            return Ok(body.into_owned());
        }
        if message.role == Role::User
            && !is_tool_reentry(message)
            && observation(messages, index).is_some()
        {
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

fn slice_lines(body: &str, handle: &str, range: LineRange) -> Result<String, RecallError> {
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

/// The chat-completions schema of the `context_recall` tool, for an
/// engine's `tool_schemas`.
pub fn recall_tool_schema() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": RECALL_TOOL,
            "description": "Return the full original output of an earlier tool result that the \
    conversation shows only as a one-line digest. Pass the handle the digest names; optionally a \
    1-based inclusive line range to read part of a long output.",
            "parameters": {
                "type": "object",
                "properties": {
                    "handle": {
                        "type": "string",
                        "description": "The handle from the digest line (a tool call id or an h… hash)."
                    },
                    "start_line": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "First line to return (1-based). Default: 1."
                    },
                    "end_line": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Last line to return, inclusive. Default: the last line."
                    }
                },
                "required": ["handle"],
                "additionalProperties": false
            }
        }
    })
}

/// Answers a `context_recall` call against the stored history: a JSON
/// string with `handle`, `content`, `total_lines` and the `lines` returned,
/// or `{"error": …}`. An engine's `handle_tool_call` delegates here.
pub fn handle_recall_call(messages: &[Message], args: &Value) -> String {
    match answer(messages, args) {
        Ok(v) => v.to_string(),
        Err(e) => json!({ "error": e.to_string() }).to_string(),
    }
}

fn answer(messages: &[Message], args: &Value) -> Result<Value, RecallError> {
    let handle = args
        .get("handle")
        .and_then(Value::as_str)
        .ok_or_else(|| RecallError::BadArguments("`handle` must be a string".into()))?;
    let line = |key: &str| -> Result<Option<usize>, RecallError> {
        match args.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    RecallError::BadArguments(format!("`{key}` must be a positive integer"))
                }),
        }
    };
    let (start, end) = (line("start_line")?, line("end_line")?);
    let body = find(messages, handle)?;
    let total = body.split_inclusive('\n').count();
    let range = (start.is_some() || end.is_some()).then_some(LineRange {
        start: start.unwrap_or(1),
        end,
    });
    let content = match range {
        Some(r) => slice_lines(&body, handle, r)?,
        None => body,
    };
    let first = range.map_or(1, |r| r.start);
    let last = range.and_then(|r| r.end).map_or(total, |e| e.min(total));
    Ok(json!({
        "handle": handle,
        "total_lines": total,
        "lines": [first.min(total), last],
        "content": content,
    }))
}
