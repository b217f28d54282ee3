//! Wire formats and agent session logs, converted at the edge into chat
//! messages through the format bridges ([`crate::anthropic::bridge`],
//! [`crate::responses::bridge`]).
//!
//! - An Anthropic Messages request (`{"system"?, "messages": [...]}` or a
//!   bare array of Anthropic messages) is recognised by a `tool_use` /
//!   `tool_result` block or a top-level `system`; a Responses request by an
//!   `input` array with no `messages`.
//! - Claude Code's session log (`~/.claude/projects/<project>/<session>.jsonl`):
//!   one entry per line, `type` `user` / `assistant` carrying the Anthropic
//!   `message`, linked by `uuid` / `parentUuid`; other types (`summary`,
//!   `system`, `file-history-snapshot`…) are not part of the conversation.
//!   The conversation is the chain ending at the last main-chain entry,
//!   followed back through `parentUuid` (and through a compaction's
//!   `logicalParentUuid`), without sidechains (sub-agents). Claude Code
//!   writes one entry per content block of a reply and one per tool result;
//!   consecutive entries of the same role are merged into one message, as it
//!   does when it sends them.
//! - Codex's rollout (`~/.codex/sessions/**/rollout-*.jsonl`): one
//!   `{"timestamp", "type", "payload"}` per line; `response_item` payloads
//!   are the Responses input items, `session_meta`'s `instructions` the
//!   instructions, and a `compacted` entry with a `replacement_history`
//!   replaces the items before it (Codex's own compaction); `event_msg` and
//!   `turn_context` are not part of the conversation.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::{Format, LoadError, is_json_ws};
use crate::anthropic::{self, FormatError};
use crate::responses::{self, Item};

/// A request in a wire format, with the way back from chat messages.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Wire {
    Anthropic {
        request: anthropic::Request,
        bridged: anthropic::bridge::Bridged,
        /// Read from a bare array of messages (written back as one).
        bare: bool,
    },
    Responses {
        request: responses::Request,
        bridged: responses::bridge::Bridged,
    },
}

impl Wire {
    pub(crate) fn anthropic(request: anthropic::Request, bare: bool) -> Wire {
        let bridged = anthropic::bridge::to_chat(&request);
        Wire::Anthropic {
            request,
            bridged,
            bare,
        }
    }

    pub(crate) fn responses(request: responses::Request) -> Wire {
        let bridged = responses::bridge::to_chat(&request);
        Wire::Responses { request, bridged }
    }

    /// Times of the chat messages from `times`, indexed like the native
    /// messages (Anthropic) or input items (Responses): a chat message made
    /// of several takes the latest; the system prompt and instructions have
    /// none.
    pub(crate) fn chat_times(&self, times: &[Option<f64>]) -> Vec<Option<f64>> {
        let at = |i: &usize| times.get(*i).copied().flatten();
        match self {
            Wire::Anthropic { bridged, .. } => bridged
                .origins
                .iter()
                .map(|o| match o {
                    anthropic::bridge::Origin::Message { index, .. } => at(index),
                    anthropic::bridge::Origin::System => None,
                })
                .collect(),
            Wire::Responses { bridged, .. } => bridged
                .origins
                .iter()
                .map(|o| match o {
                    responses::bridge::Origin::Items(items) => {
                        items.iter().filter_map(at).reduce(f64::max)
                    }
                    _ => None,
                })
                .collect(),
        }
    }

    /// The chat messages the engine works on.
    pub(crate) fn messages(&self) -> Vec<crate::message::Message> {
        match self {
            Wire::Anthropic { bridged, .. } => bridged.messages.clone(),
            Wire::Responses { bridged, .. } => bridged.messages.clone(),
        }
    }

    /// `messages` (the engine's result) in this wire format: every part the
    /// engine did not change as it was read.
    pub(crate) fn render(&self, messages: &[crate::message::Message]) -> Value {
        match self {
            Wire::Anthropic {
                request,
                bridged,
                bare,
            } => {
                let r = anthropic::bridge::from_chat(request, bridged, messages);
                if *bare {
                    serde_json::to_value(&r.messages).unwrap_or(Value::Null)
                } else {
                    r.to_value()
                }
            }
            Wire::Responses { request, bridged } => {
                responses::bridge::from_chat(request, bridged, messages).to_value()
            }
        }
    }

    /// The rules of this wire format on `messages` converted back into it:
    /// the rule set's name and every violation, indexed in the format's own
    /// `messages` / input items.
    pub(crate) fn violations(
        &self,
        messages: &[crate::message::Message],
    ) -> (&'static str, Vec<crate::validate::Violation>) {
        match self {
            Wire::Anthropic {
                request, bridged, ..
            } => {
                let r = anthropic::bridge::from_chat(request, bridged, messages);
                ("anthropic", crate::validate::anthropic::validate(&r))
            }
            Wire::Responses { request, bridged } => {
                let r = responses::bridge::from_chat(request, bridged, messages);
                ("responses", crate::validate::responses::validate(&r))
            }
        }
    }

    /// An empty request of `format`'s wire kind, for converting chat
    /// messages into it (every message is then new).
    pub(crate) fn empty(format: Format) -> Option<Wire> {
        match format {
            Format::Anthropic | Format::ClaudeCode => {
                Some(Wire::anthropic(anthropic::Request::new(Vec::new()), false))
            }
            Format::Responses | Format::Codex => {
                Some(Wire::responses(responses::Request::new(Vec::new())))
            }
            _ => None,
        }
    }
}

/// What the first non-blank line (or the whole object) says the format is,
/// for the formats of this module.
pub(super) fn detect(text: &str) -> Option<Format> {
    let first = text
        .split('\n')
        .map(|l| l.trim_matches(is_json_ws))
        .find(|l| !l.is_empty())?;
    let value: Value = serde_json::from_str(first).ok()?;
    let o = value.as_object()?;
    let ty = o.get("type").and_then(Value::as_str);
    if o.contains_key("payload") && o.contains_key("timestamp") && ty.is_some() {
        return Some(Format::Codex);
    }
    let claude_keys = ["sessionId", "parentUuid", "leafUuid", "isSidechain"];
    if ty.is_some() && claude_keys.iter().any(|k| o.contains_key(*k)) {
        return Some(Format::ClaudeCode);
    }
    None
}

/// Whether a whole-file object or array is an Anthropic request: a
/// `tool_use`/`tool_result` block, or a top-level `system` next to
/// `messages`.
pub(super) fn is_anthropic(value: &Value) -> bool {
    let has_blocks = |messages: &Value| {
        messages.as_array().is_some_and(|ms| {
            ms.iter().any(|m| {
                m.get("content")
                    .and_then(Value::as_array)
                    .is_some_and(|bs| {
                        bs.iter().any(|b| {
                            matches!(
                                b.get("type").and_then(Value::as_str),
                                Some("tool_use" | "tool_result" | "thinking" | "redacted_thinking")
                            )
                        })
                    })
            })
        })
    };
    match value {
        Value::Array(_) => has_blocks(value),
        Value::Object(o) => {
            let messages = o.get("messages").unwrap_or(&Value::Null);
            messages.is_array() && (o.contains_key("system") || has_blocks(messages))
        }
        _ => false,
    }
}

/// Whether a whole-file object is a Responses request.
pub(super) fn is_responses(value: &Value) -> bool {
    value.as_object().is_some_and(|o| {
        o.get("input").is_some_and(Value::is_array)
            && !o.contains_key("messages")
            && !o.contains_key("history")
    })
}

fn format_error(source_name: &str, line: Option<usize>, error: FormatError) -> LoadError {
    LoadError::Format {
        source_name: source_name.to_owned(),
        line,
        error,
    }
}

/// An Anthropic request (object) or bare message array.
pub(super) fn anthropic_request(source_name: &str, value: Value) -> Result<Wire, LoadError> {
    let bare = value.is_array();
    let request = if let Value::Array(items) = value {
        let mut messages = Vec::with_capacity(items.len());
        for (i, v) in items.into_iter().enumerate() {
            messages.push(anthropic::Message::from_value(v).map_err(|e| {
                format_error(
                    source_name,
                    None,
                    FormatError::At {
                        what: "message",
                        index: i,
                        error: Box::new(e),
                    },
                )
            })?);
        }
        anthropic::Request::new(messages)
    } else {
        anthropic::Request::from_value(value).map_err(|e| format_error(source_name, None, e))?
    };
    Ok(Wire::anthropic(request, bare))
}

pub(super) fn responses_request(source_name: &str, value: Value) -> Result<Wire, LoadError> {
    let request =
        responses::Request::from_value(value).map_err(|e| format_error(source_name, None, e))?;
    Ok(Wire::responses(request))
}

/// The non-blank lines of a JSON Lines file, parsed, with their 1-based
/// line numbers.
/// One parsed line: its 1-based number and its object.
type Line = (usize, Map<String, Value>);

fn lines(source_name: &str, text: &str) -> Result<Vec<Line>, LoadError> {
    let mut out = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        let line = line.trim_matches(is_json_ws);
        if line.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|e| LoadError::Json {
            source_name: source_name.to_owned(),
            line: i + 1,
            column: e.column(),
            message: e.to_string(),
            truncated: e.is_eof(),
        })?;
        match value {
            Value::Object(o) => out.push((i + 1, o)),
            other => {
                return Err(format_error(
                    source_name,
                    Some(i + 1),
                    FormatError::NotAnObject {
                        found: crate::message::json_type(&other),
                    },
                ));
            }
        }
    }
    if out.is_empty() {
        return Err(LoadError::Empty {
            source_name: source_name.to_owned(),
        });
    }
    Ok(out)
}

/// When a session-log entry was written, in seconds since the Unix epoch:
/// its `timestamp`, an RFC 3339 string (Claude Code, Codex) or a number of
/// seconds; `None` when absent or unreadable (the entry still counts).
fn entry_time(o: &Map<String, Value>) -> Option<f64> {
    match o.get("timestamp")? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => humantime::parse_rfc3339_weak(s)
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs_f64()),
        _ => None,
    }
}

/// A session log read: the request, and when each of its messages (or
/// input items) was written, as far as the log says.
pub(super) type Log = (Wire, Vec<Option<f64>>);

/// A Claude Code session log (see the module docs).
pub(super) fn claude_code(source_name: &str, text: &str) -> Result<Log, LoadError> {
    let entries = lines(source_name, text)?;
    let uuid =
        |o: &Map<String, Value>, k: &str| o.get(k).and_then(Value::as_str).map(str::to_owned);
    let by_uuid: HashMap<String, usize> = entries
        .iter()
        .enumerate()
        .filter_map(|(i, (_, o))| Some((uuid(o, "uuid")?, i)))
        .collect();
    let is_turn = |o: &Map<String, Value>| {
        matches!(
            o.get("type").and_then(Value::as_str),
            Some("user" | "assistant")
        ) && o.get("isSidechain").and_then(Value::as_bool) != Some(true)
    };
    let Some(leaf) = entries.iter().rposition(|(_, o)| is_turn(o)) else {
        return Err(format_error(
            source_name,
            None,
            FormatError::Missing {
                field: "a `user` or `assistant` entry",
            },
        ));
    };
    // Walk back from the leaf; a log without uuids is read in file order.
    let mut chain = Vec::new();
    let mut at = Some(leaf);
    let mut steps = 0;
    while let Some(i) = at {
        chain.push(i);
        steps += 1;
        if steps > entries.len() {
            break; // a cycle: stop rather than loop
        }
        let o = &entries[i].1;
        let parent = uuid(o, "parentUuid").or_else(|| uuid(o, "logicalParentUuid"));
        at = parent.and_then(|p| by_uuid.get(&p).copied());
    }
    chain.reverse();
    if by_uuid.is_empty() {
        chain = (0..=leaf).collect();
    }
    let mut messages: Vec<anthropic::Message> = Vec::new();
    let mut times: Vec<Option<f64>> = Vec::new();
    for i in chain {
        let (line, o) = &entries[i];
        if !is_turn(o) {
            continue;
        }
        let Some(message) = o.get("message").cloned() else {
            return Err(format_error(
                source_name,
                Some(*line),
                FormatError::Missing { field: "message" },
            ));
        };
        let m = anthropic::Message::from_value(message)
            .map_err(|e| format_error(source_name, Some(*line), e))?;
        let at = entry_time(o);
        match (messages.last_mut(), times.last_mut()) {
            (Some(prev), Some(prev_at)) if prev.role == m.role => {
                anthropic::bridge::append_blocks(prev, m);
                *prev_at = at.or(*prev_at);
            }
            _ => {
                messages.push(m);
                times.push(at);
            }
        }
    }
    Ok((
        Wire::anthropic(anthropic::Request::new(messages), false),
        times,
    ))
}

/// A Codex rollout (see the module docs).
pub(super) fn codex(source_name: &str, text: &str) -> Result<Log, LoadError> {
    let entries = lines(source_name, text)?;
    let mut items: Vec<Item> = Vec::new();
    let mut times: Vec<Option<f64>> = Vec::new();
    let mut instructions: Option<String> = None;
    for (line, o) in entries {
        let payload = o.get("payload");
        match o.get("type").and_then(Value::as_str) {
            Some("session_meta") => {
                if let Some(i) = payload
                    .and_then(|p| p.get("instructions"))
                    .and_then(Value::as_str)
                {
                    instructions = Some(i.to_owned());
                }
            }
            Some("response_item") => match payload {
                Some(Value::Object(p)) => {
                    items.push(Item::from_map(p.clone()));
                    times.push(entry_time(&o));
                }
                _ => {
                    return Err(format_error(
                        source_name,
                        Some(line),
                        FormatError::Missing {
                            field: "payload (an input item object)",
                        },
                    ));
                }
            },
            Some("compacted") => {
                if let Some(Value::Array(history)) =
                    payload.and_then(|p| p.get("replacement_history"))
                {
                    items = history
                        .iter()
                        .filter_map(Value::as_object)
                        .map(|m| Item::from_map(m.clone()))
                        .collect();
                    times = vec![entry_time(&o); items.len()];
                } else if let Some(summary) = payload
                    .and_then(|p| p.get("message"))
                    .and_then(Value::as_str)
                {
                    items.push(Item::new_message("user", summary));
                    times.push(entry_time(&o));
                }
            }
            _ => {}
        }
    }
    let mut request = responses::Request::new(items);
    if let Some(i) = instructions {
        request
            .extra
            .insert("instructions".into(), Value::String(i));
    }
    Ok((Wire::responses(request), times))
}
