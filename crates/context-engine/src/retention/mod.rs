//! Retention probes: what of a session survived after the engine managed it.
//!
//! A compaction or a digest is only as good as what the agent can still see
//! (or fetch back). [`extract_probes`] reads a transcript for the facts an
//! agent relies on later: the user's asks, the files it read or wrote, the
//! commands it ran (with their exit status) and the errors they reported.
//! [`check`] then looks for each probe in what the engine sent (`view`) and in
//! the stored history the `context_recall` tool reads (`stored`), and says,
//! per probe, the best of:
//!
//! 1. [`ProbeStatus::Verbatim`]: in a non-summary message of the view
//!    (digest lines count: they are in the view and keep the writ and the
//!    first error line);
//! 2. [`ProbeStatus::InSummary`]: in the body of a summary message;
//! 3. [`ProbeStatus::Recallable`]: in a stored tool result whose recall
//!    handle (its `tool_call_id`, or the `h…` hash of its body) is in the view,
//!    or, with a session store ([`check_with_archive`]), in an archived
//!    message reachable from a handle the view names
//!    ([`reachable`](crate::store::reachable)); only for an agent that can
//!    call the engine's tools: a text-action agent
//!    ([`ToolChannel::TextActions`]) reaches nothing it does not see, so
//!    what it does not see is lost;
//! 4. [`ProbeStatus::Lost`].
//!
//! Matching is on whitespace-normalised text (runs of whitespace collapsed
//! to one space): a digest or a summary re-flows lines, and that is not a
//! loss. Deterministic, and one substring search per probe over each
//! haystack, so it is fast on the largest transcripts.
//!
//! ```
//! use context_engine::retention::{ProbeKind, check, extract_probes};
//! use context_engine::{Message, ToolCall};
//!
//! let history = vec![
//!     Message::user("fix the failing test"),
//!     Message::assistant_tool_calls("", vec![ToolCall::function(
//!         "c1", "bash", r#"{"command": "python -m pytest -q tests/test_io.py"}"#)]),
//!     Message::tool_result("c1", "FAILED tests/test_io.py::test_read - KeyError: 'x'\n[exit 1]"),
//! ];
//! let probes = extract_probes(&history, &context_engine::validate::TextActions::auto());
//! assert!(probes.iter().any(|p| p.kind == ProbeKind::Command && p.exit_status == Some(1)));
//! let report = check(&probes, &history, &history);
//! assert_eq!(report.verbatim, report.probes);
//! // A view that dropped everything but the ask loses the rest.
//! let report = check(&probes, &history[..1], &history);
//! assert_eq!(report.lost, report.probes - 1);
//! ```

mod extract;

use std::collections::HashSet;

use memchr::memmem;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::digest::{ToolChannel, result_handle};
use crate::message::Message;
use crate::summary_text::{SUMMARY_PREFIX, summary_body, without_summary};
use crate::tool_output::string_leaves;

pub use extract::extract_probes;

/// What kind of fact a probe stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// A real user ask (its start, see [`ASK_MAX_BYTES`]).
    UserAsk,
    /// A file a tool call read or wrote, as the call wrote it.
    FilePath,
    /// A shell command's first line.
    Command,
    /// The error line a failing command reported.
    ErrorMessage,
}

/// One fact to look for, with where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// What the fact is.
    pub kind: ProbeKind,
    /// The text looked for, whitespace-normalised and clipped.
    pub text: String,
    /// Index of the message it was read from (for a command, the assistant
    /// message that ran it; for an error, the result that reported it).
    pub source_index: usize,
    /// For a [`ProbeKind::Command`], the exit status its result reported
    /// (`<returncode>N</returncode>`, `[exit N]`, `exit code: N`, a
    /// `returncode` field); `None` when the result says none or is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i64>,
}

/// Where a probe was found; the first that holds, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStatus {
    /// In a non-summary message of the view.
    Verbatim,
    /// In a summary's body.
    InSummary,
    /// In a stored tool result whose recall handle is in the view.
    Recallable,
    /// Nowhere the agent can see or fetch.
    Lost,
}

/// How many probes ended where. `verbatim + in_summary + recallable + lost
/// == probes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RetentionReport {
    /// Probes checked.
    pub probes: usize,
    /// Found verbatim in the view.
    pub verbatim: usize,
    /// Found in a summary.
    pub in_summary: usize,
    /// Recallable from the stored history.
    pub recallable: usize,
    /// Lost.
    pub lost: usize,
    /// The lost probes, in input order.
    pub lost_probes: Vec<Probe>,
    /// The probes only recallable (through a handle the view names), in
    /// input order.
    pub recallable_probes: Vec<Probe>,
    /// The user asks among the probes, counted the same way.
    pub asks: AskCounts,
}

/// Where the user asks ended (a part of a [`RetentionReport`]): every ask
/// should stay present, verbatim or in a summary, not only recallable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AskCounts {
    /// User-ask probes.
    pub probes: usize,
    /// Verbatim in the view.
    pub verbatim: usize,
    /// In a summary.
    pub in_summary: usize,
    /// Only recallable.
    pub recallable: usize,
    /// Lost.
    pub lost: usize,
    /// The asks not present (only recallable or lost), in input order.
    pub not_present: Vec<Probe>,
}

/// Longest user-ask probe, in bytes. An ask is identified by its start: a
/// pasted issue runs to thousands of characters, and a summary that keeps
/// the ask keeps it clipped (the extractive summarizer keeps its first
/// ~390 bytes), so comparing the whole text would call every clipped ask
/// lost. 200 bytes is long enough to tell asks apart.
pub const ASK_MAX_BYTES: usize = 200;

/// Longest command probe (its first line), in bytes: enough to identify the
/// command, short enough to survive a digest's writ.
pub const COMMAND_MAX_BYTES: usize = 200;

/// Longest error probe, in bytes: below the digest's error-line clip (200
/// bytes with the ellipsis), so a digested failure still shows the probe.
pub const ERROR_MAX_BYTES: usize = 150;

/// Looks up every probe (see the module docs): `view` is the request the
/// engine sent, `stored` the (possibly compacted) history that recall reads.
pub fn check(probes: &[Probe], view: &[Message], stored: &[Message]) -> RetentionReport {
    check_with_archive(probes, view, stored, &[], ToolChannel::Tools)
}

/// [`check`], where `archived` (the archived messages the view reaches
/// through the handles it names) also counts as recallable, whole, for an
/// agent on `channel`: one without tools ([`ToolChannel::TextActions`])
/// can recall nothing, so only what it sees counts.
pub fn check_with_archive(
    probes: &[Probe],
    view: &[Message],
    stored: &[Message],
    archived: &[Message],
    channel: ToolChannel,
) -> RetentionReport {
    let index = match channel {
        ToolChannel::Tools => Haystacks::new(view, stored, archived),
        ToolChannel::TextActions => Haystacks::new(view, &[], &[]),
    };
    let mut report = RetentionReport {
        probes: probes.len(),
        ..RetentionReport::default()
    };
    for probe in probes {
        let status = index.status(&probe.text);
        match status {
            ProbeStatus::Verbatim => report.verbatim += 1,
            ProbeStatus::InSummary => report.in_summary += 1,
            ProbeStatus::Recallable => {
                report.recallable += 1;
                report.recallable_probes.push(probe.clone());
            }
            ProbeStatus::Lost => {
                report.lost += 1;
                report.lost_probes.push(probe.clone());
            }
        }
        if probe.kind == ProbeKind::UserAsk {
            let asks = &mut report.asks;
            asks.probes += 1;
            match status {
                ProbeStatus::Verbatim => asks.verbatim += 1,
                ProbeStatus::InSummary => asks.in_summary += 1,
                ProbeStatus::Recallable => asks.recallable += 1,
                ProbeStatus::Lost => asks.lost += 1,
            }
            if matches!(status, ProbeStatus::Recallable | ProbeStatus::Lost) {
                asks.not_present.push(probe.clone());
            }
        }
    }
    report
}

/// The status of each probe, in order (what [`check`] counts).
pub fn statuses(probes: &[Probe], view: &[Message], stored: &[Message]) -> Vec<ProbeStatus> {
    let index = Haystacks::new(view, stored, &[]);
    probes.iter().map(|p| index.status(&p.text)).collect()
}

/// Separates messages in a haystack. Normalised text has no line breaks, so
/// no match can span two messages.
const SEPARATOR: char = '\n';

/// The normalised texts, each message once, joined per kind of place.
struct Haystacks {
    verbatim: String,
    summaries: String,
    recallable: String,
}

impl Haystacks {
    fn new(view: &[Message], stored: &[Message], archived: &[Message]) -> Haystacks {
        let mut verbatim = String::new();
        let mut summaries = String::new();
        let mut ids: HashSet<&str> = HashSet::new();
        for message in view {
            let text = message.text();
            let own = if text.contains(SUMMARY_PREFIX) {
                if let Some(body) = summary_body(&text) {
                    push_normalised(&mut summaries, body);
                }
                // A summary merged into a kept message: the message's own
                // words are still verbatim.
                without_summary(&text)
            } else {
                text.into_owned()
            };
            push_normalised(&mut verbatim, &searchable(message, &own));
            if let Some(id) = message.tool_call_id.as_deref() {
                ids.insert(id);
            }
            ids.extend(message.tool_calls().iter().filter_map(|c| c.id.as_deref()));
        }
        // A handle is in the view as a message's id, or quoted as a recall
        // argument (`{"handle":"…"}`) in a digest line, a prune marker or a
        // summary.
        let visible = |handle: &str| {
            let quoted = serde_json::json!({ "handle": handle }).to_string();
            let quoted = quoted.trim_start_matches('{').trim_end_matches('}');
            ids.contains(handle)
                || memmem::find(verbatim.as_bytes(), quoted.as_bytes()).is_some()
                || memmem::find(summaries.as_bytes(), quoted.as_bytes()).is_some()
        };
        let mut recallable = String::new();
        for message in stored.iter().filter(|m| m.is_tool_result()) {
            let body = message.text();
            if visible(&result_handle(message, &body)) {
                push_normalised(&mut recallable, &body);
            }
        }
        for message in archived {
            push_normalised(&mut recallable, &searchable(message, &message.text()));
        }
        Haystacks {
            verbatim,
            summaries,
            recallable,
        }
    }

    fn status(&self, needle: &str) -> ProbeStatus {
        let needle = normalise(needle);
        let finder = memmem::Finder::new(needle.as_bytes());
        let found = |hay: &str| finder.find(hay.as_bytes()).is_some();
        if found(&self.verbatim) {
            ProbeStatus::Verbatim
        } else if found(&self.summaries) {
            ProbeStatus::InSummary
        } else if found(&self.recallable) {
            ProbeStatus::Recallable
        } else {
            ProbeStatus::Lost
        }
    }
}

/// A message's searchable text: `content` (given, summary removed), then
/// each tool call's name, its raw arguments and their decoded string
/// values (a command with quotes or line breaks is escaped in the JSON).
pub(crate) fn searchable(message: &Message, content: &str) -> String {
    let mut out = content.to_owned();
    for call in message.tool_calls() {
        let Some(f) = call.function.as_ref() else {
            continue;
        };
        out.push(' ');
        out.push_str(&f.name);
        out.push(' ');
        out.push_str(&f.arguments);
        if let Ok(value) = serde_json::from_str::<Value>(&f.arguments) {
            string_leaves(&value, &mut |s| {
                out.push(' ');
                out.push_str(s);
            });
        }
    }
    if let Some(f) = message.function_call.as_ref() {
        out.push(' ');
        out.push_str(&f.name);
        out.push(' ');
        out.push_str(&f.arguments);
    }
    out
}

fn push_normalised(hay: &mut String, text: &str) {
    let mut first = true;
    for word in text.split_whitespace() {
        if !first {
            hay.push(' ');
        }
        hay.push_str(word);
        first = false;
    }
    hay.push(SEPARATOR);
}

/// Runs of whitespace (line breaks included) collapsed to one space, ends
/// trimmed.
pub fn normalise(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` normalised and clipped to at most `max` bytes at a character
/// boundary (no ellipsis: the probe must stay a substring of its source).
pub(crate) fn clip_normalised(text: &str, max: usize) -> String {
    let mut s = normalise(text);
    if s.len() > max {
        let mut end = max;
        while end > 0 && !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.truncate(s.trim_end().len());
    }
    s
}

#[cfg(test)]
mod tests;
