//! Reading the probes out of a transcript.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::shell::{fenced_commands, shell_paths};
use super::{
    ASK_MAX_BYTES, COMMAND_MAX_BYTES, ERROR_MAX_BYTES, Probe, ProbeKind, clip_normalised,
    string_leaves,
};
use crate::compressor::is_summary;
use crate::digest::{Flags, exit_code, outcome};
use crate::message::{Message, Role};
use crate::prune::effect::is_shell_tool;
use crate::validate::is_real_user_turn;

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

/// The probes of `messages`, in transcript order (see the module docs):
///
/// - each real user ask ([`is_real_user_turn`], summaries and empty turns
///   skipped, and so are the observations a text-action agent sends back
///   as a user message right after an assistant command), its start;
/// - each file path a tool call read or wrote (JSON arguments such as
///   `path`, `file_path`, `filename`; the files of shell commands, in tool
///   calls or in a fenced block of the assistant's text), once each;
/// - each shell command (its first line) with the exit status its result
///   reported;
/// - the error line of each failing command (the first error line, or a
///   traceback's final exception), once per distinct line, at its last
///   occurrence.
pub fn extract_probes(messages: &[Message]) -> Vec<Probe> {
    let results = results_by_id(messages);
    let mut probes = Vec::new();
    let mut paths = HashSet::new();
    let mut errors: Vec<Probe> = Vec::new();
    let mut observation = false;
    for (i, message) in messages.iter().enumerate() {
        let is_observation = std::mem::take(&mut observation);
        if is_summary(message) {
            continue;
        }
        match message.role {
            Role::User if is_real_user_turn(message) && !is_observation => {
                let text = clip_normalised(&message.text(), ASK_MAX_BYTES);
                if !text.is_empty() {
                    probes.push(Probe {
                        kind: ProbeKind::UserAsk,
                        text,
                        source_index: i,
                        exit_status: None,
                    });
                }
            }
            Role::Assistant if message.has_tool_calls() => {
                for call in message.tool_calls() {
                    let Some(f) = call.function.as_ref() else {
                        continue;
                    };
                    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(&f.arguments)
                    else {
                        continue;
                    };
                    let args = Value::Object(args);
                    for key in PATH_KEYS {
                        if let Some(v) = args.get(*key) {
                            string_leaves(v, &mut |p| add_path(&mut probes, &mut paths, p, i));
                        }
                    }
                    let command = ["command", "cmd"]
                        .iter()
                        .find_map(|k| args.get(*k).and_then(Value::as_str))
                        .filter(|_| is_shell_tool(&f.name));
                    if let Some(command) = command {
                        let result = call
                            .id
                            .as_deref()
                            .and_then(|id| results.get(id))
                            .map(|&r| (r, &messages[r]));
                        add_command(&mut probes, &mut paths, &mut errors, command, i, result);
                    }
                }
            }
            Role::Assistant => {
                let commands = fenced_commands(&message.text());
                // The next user message is what these commands printed.
                let result = messages
                    .get(i + 1)
                    .filter(|m| m.role == Role::User || m.is_tool_result())
                    .map(|m| (i + 1, m));
                observation = !commands.is_empty() && result.is_some();
                for command in &commands {
                    add_command(&mut probes, &mut paths, &mut errors, command, i, result);
                }
            }
            _ => {}
        }
    }
    // One probe per distinct error line, at its last occurrence.
    let mut seen = HashSet::new();
    let mut last: Vec<Probe> = errors
        .into_iter()
        .rev()
        .filter(|p| seen.insert(p.text.clone()))
        .collect();
    last.reverse();
    probes.extend(last);
    probes.sort_by_key(|p| p.source_index);
    probes
}

/// Index of the first result of each `tool_call_id`.
fn results_by_id(messages: &[Message]) -> HashMap<&str, usize> {
    let mut out = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        if m.is_tool_result()
            && let Some(id) = m.tool_call_id.as_deref()
        {
            out.entry(id).or_insert(i);
        }
    }
    out
}

fn add_path(probes: &mut Vec<Probe>, seen: &mut HashSet<String>, path: &str, index: usize) {
    let path = path.trim();
    if path.is_empty() || path.contains('\n') || !seen.insert(path.to_owned()) {
        return;
    }
    probes.push(Probe {
        kind: ProbeKind::FilePath,
        text: path.to_owned(),
        source_index: index,
        exit_status: None,
    });
}

/// The probes of one shell command run at message `index`, whose result
/// (index and message) is `result`.
fn add_command(
    probes: &mut Vec<Probe>,
    paths: &mut HashSet<String>,
    errors: &mut Vec<Probe>,
    command: &str,
    index: usize,
    result: Option<(usize, &Message)>,
) {
    for path in shell_paths(command) {
        add_path(probes, paths, &path, index);
    }
    let Some(first_line) = command.lines().find(|l| !l.trim().is_empty()) else {
        return;
    };
    let mut exit_status = None;
    if let Some((at, message)) = result {
        let body = message.text();
        let flags = Flags::of(&message.extra);
        exit_status = flags.exit.or_else(|| exit_code(&body));
        let outcome = outcome(&body, flags);
        if outcome.failed()
            && let Some(line) = outcome.error_line.as_deref()
        {
            let text = clip_normalised(line, ERROR_MAX_BYTES);
            if !text.is_empty() && body.contains(line) {
                errors.push(Probe {
                    kind: ProbeKind::ErrorMessage,
                    text,
                    source_index: at,
                    exit_status: None,
                });
            }
        }
    }
    probes.push(Probe {
        kind: ProbeKind::Command,
        text: clip_normalised(first_line, COMMAND_MAX_BYTES),
        source_index: index,
        exit_status,
    });
}
