//! Reading the probes out of a transcript.

use std::collections::HashSet;

use super::{ASK_MAX_BYTES, COMMAND_MAX_BYTES, ERROR_MAX_BYTES, Probe, ProbeKind, clip_normalised};
use crate::message::{Message, Role};
use crate::summary_text::is_summary;
use crate::tool_output::{self, Flags, calls};
use crate::validate::{TextActions, is_real_user_turn};

/// The probes of `messages`, in transcript order (see the module docs):
///
/// - each real user ask ([`is_real_user_turn`]: observations and
///   envelopes are tool output; summaries and empty turns skipped), its
///   start;
/// - each file path a tool call read or wrote (JSON arguments such as
///   `path`, `file_path`, `filename`; the files of shell commands, in tool
///   calls or in a fenced block of the assistant's text), once each;
/// - each shell command (its first line) with the exit status its result
///   reported (tool calls and text actions alike: an observation is the
///   result of the action before it);
/// - the error line of each failing command (the first error line, or a
///   traceback's final exception), once per distinct line, at its last
///   occurrence.
pub fn extract_probes(messages: &[Message], actions: &TextActions) -> Vec<Probe> {
    let mut probes = Vec::new();
    let mut paths = HashSet::new();
    let mut errors: Vec<Probe> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        if message.role == Role::User
            && !is_summary(message)
            && is_real_user_turn(messages, i, actions)
        {
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
    }
    for call in calls(messages, actions) {
        if messages.get(call.at).is_some_and(is_summary) {
            continue;
        }
        for path in &call.paths {
            add_path(&mut probes, &mut paths, path, call.at);
        }
        if let Some(command) = &call.command {
            let result = call.result.and_then(|r| Some((r, messages.get(r)?)));
            add_command(&mut probes, &mut errors, command, call.at, result);
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
    errors: &mut Vec<Probe>,
    command: &str,
    index: usize,
    result: Option<(usize, &Message)>,
) {
    let Some(first_line) = command.lines().find(|l| !l.trim().is_empty()) else {
        return;
    };
    let mut exit_status = None;
    if let Some((at, message)) = result {
        let body = message.text();
        let reading = tool_output::read(&body, &Flags::of(&message.extra));
        exit_status = reading.exit;
        if reading.failed
            && let Some(line) = reading.first_error.as_deref()
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
