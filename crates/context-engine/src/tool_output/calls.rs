//! The calls of a transcript and where their output is: tool calls
//! answered by tool results, and text actions answered by observations.

use std::collections::HashMap;

use serde_json::Value;

use super::shell::is_shell_tool;
use super::shell_paths;
use crate::message::Message;
use crate::validate::{TextActions, observation_with, text_action};

/// Argument keys that name the file a tool reads or writes.
const PATH_KEYS: &[&str] = &[
    "path",
    "file_path",
    "filepath",
    "filename",
    "file",
    "target_file",
    "paths",
];

/// One call: a tool call, or one command of a text action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Index of the assistant message that made it.
    pub at: usize,
    /// The tool call's id (`None` for a text action).
    pub id: Option<String>,
    /// The tool's name (`bash` for a fenced shell block; SWE-agent's
    /// `action` keeps its own command word).
    pub name: String,
    /// The arguments as written (JSON for a tool call, the command text for
    /// a text action).
    pub arguments: String,
    /// The shell command it runs, when it is one.
    pub command: Option<String>,
    /// Files it reads or writes, as written, in order.
    pub paths: Vec<String>,
    /// Index of the message holding its output, when in the transcript.
    pub result: Option<usize>,
    /// Whether it is a text action (its output is an observation).
    pub text_action: bool,
}

/// Every call of `messages`, in order. A tool result answers the latest
/// call with its id made before it (agents that reuse ids answer the
/// nearest call); an observation answers the text action right before it.
pub fn calls(messages: &[Message], actions: &TextActions) -> Vec<Call> {
    let mut out = Vec::new();
    let mut open: HashMap<&str, usize> = HashMap::new();
    for (at, message) in messages.iter().enumerate() {
        if message.is_tool_result() {
            if let Some(k) = message
                .tool_call_id
                .as_deref()
                .and_then(|id| open.remove(id))
                && let Some(call) = out.get_mut(k)
            {
                let call: &mut Call = call;
                call.result = Some(at);
            }
            continue;
        }
        for tool_call in message.tool_calls() {
            let Some(f) = tool_call.function.as_ref() else {
                continue;
            };
            let args = serde_json::from_str::<Value>(&f.arguments).ok();
            let mut paths = Vec::new();
            if let Some(args) = args.as_ref().and_then(Value::as_object) {
                for key in PATH_KEYS {
                    if let Some(v) = args.get(*key) {
                        string_leaves(v, &mut |p| paths.push(p.to_owned()));
                    }
                }
            }
            let command = args
                .as_ref()
                .and_then(|a| {
                    ["command", "cmd"]
                        .iter()
                        .find_map(|k| a.get(*k).and_then(Value::as_str))
                })
                .filter(|_| is_shell_tool(&f.name))
                .map(str::to_owned);
            if let Some(c) = &command {
                paths.extend(shell_paths(c));
            }
            if let Some(id) = tool_call.id.as_deref() {
                open.insert(id, out.len());
            }
            out.push(Call {
                at,
                id: tool_call.id.clone(),
                name: f.name.clone(),
                arguments: f.arguments.clone(),
                command,
                paths,
                result: None,
                text_action: false,
            });
        }
        if let Some(action) = text_action(message) {
            let result = observation_with(messages, at + 1, actions).map(|_| at + 1);
            for command in action.commands {
                let name = if action.from_field {
                    command
                        .split_whitespace()
                        .next()
                        .unwrap_or("action")
                        .to_owned()
                } else {
                    "bash".to_owned()
                };
                out.push(Call {
                    at,
                    id: None,
                    name,
                    paths: shell_paths(&command),
                    arguments: command.clone(),
                    command: Some(command),
                    result,
                    text_action: true,
                });
            }
        }
    }
    out
}

/// Calls `f` on every string inside `value`.
pub(crate) fn string_leaves<'v>(value: &'v Value, f: &mut impl FnMut(&'v str)) {
    match value {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter().for_each(|v| string_leaves(v, f)),
        Value::Object(map) => map.values().for_each(|v| string_leaves(v, f)),
        _ => {}
    }
}
