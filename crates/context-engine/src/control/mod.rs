//! The engine tools through which an agent sees and steers its own
//! context: `context_status` (the window, this request's tokens, the
//! threshold, the compactions so far and what each archived, the per-tool
//! rules in force) and `context_compact` (the next request compacted, with
//! an optional focus handed to the summarizer, as `ctx compact --focus`
//! and Hermes's `/compress <focus>` do).
//!
//! They are offered where the engine's tools are: beside the agent's own
//! tools (`ctx serve` offers engine tools only to a request with tools of
//! its own, so a text-action agent is never told of them; Hermes through
//! its plugin's `get_tool_schemas`). The engine that answers them (the
//! compressor) owns the state: the pending ask and its compaction notes.
//! This module owns the schemas, the reading of the arguments and the
//! answers' shape, and decides nothing.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use crate::tool_output::{COMPACT_TOOL, STATUS_TOOL};

/// Longest focus the compaction takes, in characters; a longer one is
/// refused with this limit named (a summary's focus line is clipped
/// shorter still).
pub const MAX_FOCUS_CHARS: usize = 2000;

/// How many compactions [`status`](status_answer) lists, newest last; the
/// count covers them all.
pub const LISTED_COMPACTIONS: usize = 16;

/// A compaction the agent asked for through [`COMPACT_TOOL`], pending
/// until the next request compacts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionAsk {
    /// What the summary should keep in detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub focus: Option<String>,
}

/// One compaction as the status tool reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionNote {
    /// The session's compaction number, from 1.
    pub number: u64,
    /// Messages the summary replaced.
    pub messages_summarized: usize,
    /// Tokens of the history before and after, by the engine's counter.
    pub tokens_before: u64,
    /// See [`tokens_before`](Self::tokens_before).
    pub tokens_after: u64,
    /// The summarizer whose text went in (`extractive` on a fallback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summarizer: Option<String>,
    /// The focus the summary was written with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub focus: Option<String>,
    /// The handle the replaced messages were archived under
    /// (`context_expand` takes it); `None` when nothing archives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived: Option<String>,
    /// Whether the agent asked for it ([`COMPACT_TOOL`]).
    #[serde(default)]
    pub asked_by_agent: bool,
}

/// What the status tool reports, gathered by the engine that answers it.
#[derive(Clone, Debug)]
pub struct Budget<'a> {
    /// The model's window in tokens; 0 when unknown.
    pub context_length: u64,
    /// The prompt size at which the engine compacts.
    pub threshold_tokens: u64,
    /// This request's tokens and where the figure comes from.
    pub request_tokens: Option<(u64, &'static str)>,
    /// Compactions this session.
    pub compactions: u64,
    /// The newest of them, oldest first.
    pub notes: &'a [CompactionNote],
    /// A compaction the agent asked for and the next request will make.
    pub pending: Option<&'a CompactionAsk>,
    /// Why compaction is held back now (a cooldown), if it is.
    pub blocked: Option<String>,
    /// The per-tool rules in force, as the configuration states them.
    pub tool_rules: Value,
}

/// The chat-completions schema of [`STATUS_TOOL`].
pub fn status_tool_schema() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": STATUS_TOOL,
            "description": "Report this conversation's context budget: the model's window, this \
    request's tokens, the size at which older turns are compacted into a summary, the compactions \
    so far (what each summarized and the handle it archived under) and the per-tool rules in force.",
            "parameters": {
                "type": "object",
                "properties": {},
                "additionalProperties": false
            }
        }
    })
}

/// The chat-completions schema of [`COMPACT_TOOL`].
pub fn compact_tool_schema() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": COMPACT_TOOL,
            "description": "Ask for this conversation's older turns to be compacted into a summary \
    before the next model call, freeing room in the context window. Everything compacted stays \
    recallable. Give a focus to have the summary keep that subject in detail.",
            "parameters": {
                "type": "object",
                "properties": {
                    "focus": {
                        "type": "string",
                        "description": "Optional: what the summary should keep in detail (a file, a failing test, a decision)."
                    }
                },
                "additionalProperties": false
            }
        }
    })
}

/// Both schemas, status first.
pub fn tool_schemas() -> Vec<Value> {
    vec![status_tool_schema(), compact_tool_schema()]
}

/// Whether `name` is one of this module's tools.
pub fn is_tool(name: &str) -> bool {
    name == STATUS_TOOL || name == COMPACT_TOOL
}

/// Why a [`COMPACT_TOOL`] call's arguments are refused (the text is the
/// tool's answer, so it says what to send instead).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// The arguments are not a JSON object.
    #[error("{COMPACT_TOOL}: arguments must be an object such as {{\"focus\": \"the parser\"}}")]
    NotAnObject,
    /// An argument other than `focus`.
    #[error("{COMPACT_TOOL}: unknown argument `{0}`; the one argument is `focus` (optional text)")]
    Unknown(String),
    /// `focus` is not text.
    #[error("{COMPACT_TOOL}: `focus` must be text, not {0}")]
    FocusNotText(&'static str),
    /// `focus` is too long.
    #[error("{COMPACT_TOOL}: `focus` is {0} characters; at most {MAX_FOCUS_CHARS}")]
    FocusTooLong(usize),
}

/// The ask a [`COMPACT_TOOL`] call's `args` make: `focus` must be a
/// string (blank means none) of at most [`MAX_FOCUS_CHARS`] characters;
/// no other argument is taken.
pub fn compact_ask(args: &Value) -> Result<CompactionAsk, AskError> {
    let Some(object) = args.as_object() else {
        return Err(AskError::NotAnObject);
    };
    if let Some(other) = object.keys().find(|k| k.as_str() != "focus") {
        return Err(AskError::Unknown(other.clone()));
    }
    let focus = match object.get("focus") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.trim()).filter(|s| !s.is_empty()),
        Some(other) => return Err(AskError::FocusNotText(json_kind(other))),
    };
    if let Some(f) = focus {
        let chars = f.chars().count();
        if chars > MAX_FOCUS_CHARS {
            return Err(AskError::FocusTooLong(chars));
        }
    }
    Ok(CompactionAsk {
        focus: focus.map(str::to_owned),
    })
}

/// The answer to a [`COMPACT_TOOL`] call once `ask` is recorded (an ask
/// is forced: nothing holds it back).
pub fn compact_answer(ask: &CompactionAsk) -> String {
    let mut answer = json!({
        "scheduled": true,
        "when": "before the next model call",
        "note": "older turns become a summary; what they held stays recallable with \
                 context_recall / context_expand",
    });
    if let Some(focus) = &ask.focus {
        answer["focus"] = json!(focus);
    }
    answer.to_string()
}

/// The answer to a [`STATUS_TOOL`] call.
pub fn status_answer(budget: &Budget<'_>) -> String {
    let mut answer = json!({
        "context_length": budget.context_length,
        "threshold_tokens": budget.threshold_tokens,
        "compactions": budget.compactions,
        "recent_compactions": budget.notes,
        "tool_rules": budget.tool_rules,
    });
    if let Some((tokens, source)) = budget.request_tokens {
        answer["request_tokens"] = json!(tokens);
        answer["request_tokens_source"] = json!(source);
        if budget.context_length > 0 {
            let used = tokens as f64 / budget.context_length as f64 * 100.0;
            answer["window_used_percent"] = json!((used * 10.0).round() / 10.0);
        }
        if budget.threshold_tokens > 0 {
            answer["tokens_until_compaction"] =
                json!(budget.threshold_tokens.saturating_sub(tokens));
        }
    }
    if let Some(ask) = budget.pending {
        answer["compaction_pending"] = json!(ask);
    }
    if let Some(why) = &budget.blocked {
        answer["compaction_blocked"] = json!(why);
    }
    answer.to_string()
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
