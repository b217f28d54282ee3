//! The tool-result digest: the request view keeps the newest tool batches
//! whole and shows older bulky results as one line each.
//!
//! Tool output is most of what an agent re-sends on every call, and old
//! output is rarely read again. [`digest`] returns a copy of the transcript
//! for one request in which every tool result older than the newest
//! [`DigestOptions::keep_batches`] batches, and at least
//! [`DigestOptions::min_bytes`] long (or carrying an image or other binary
//! part), has its content replaced by one line:
//!
//! ```text
//! [digested] bash {"command": "cat setup.py"} → ok, 5123 bytes omitted; full output: context_recall {"handle":"call_7"}
//! ```
//!
//! The *writ* (the call's name and arguments), the outcome (`ok` or the first
//! error line, see below) and a handle. The message itself, its role, its
//! `tool_call_id` and every other field stay, so the request stays valid.
//! Nothing is lost: [`recall`] (and the `context_recall` tool, see
//! [`recall_tool_schema`] and [`handle_recall_call`]) gives back the exact
//! original body from the stored history.
//!
//! A *batch* is an assistant message with tool calls plus all its results,
//! or one user message carrying a text tool-result envelope (see
//! [`crate::validate::is_tool_reentry`]); envelopes are digested to
//! [`ENVELOPE_HEADER`], one line per `[/verb args]` writ, the host's notes and
//! banners, and `[END TOOL RESULTS]`.
//!
//! The outcome is `failed` when the body reports a non-zero exit code
//! (`<returncode>1</returncode>`, `[exit 2]`, `exit code: 127`,
//! `returncode: 1`) or the message carries an error flag (`is_error`,
//! `error`, `status: "error"`, a non-zero `returncode`), or when a line
//! starts with `ERR:`, `Error`/`ERROR`, `error:`, `error[E…]`, `fatal:`,
//! `FAILED `, `FAIL:`, or is a Python exception (a traceback reports its
//! final exception line). The
//! first such line is shown; an explicit exit code 0 means success whatever
//! the output says.
//!
//! ```
//! use context_engine::digest::{DigestOptions, digest};
//! use context_engine::recall::handle_recall_call;
//! use context_engine::{Message, ToolCall};
//!
//! let call = |id: &str| Message::assistant_tool_calls("", vec![
//!     ToolCall::function(id, "bash", r#"{"command": "cat setup.py"}"#)]);
//! let history = vec![
//!     Message::user("fix the build"),
//!     call("c1"),
//!     Message::tool_result("c1", "x = 1\n".repeat(1000)),
//!     call("c2"),
//!     Message::tool_result("c2", "ok"),
//! ];
//! let view = digest(&history, &DigestOptions::default());
//! assert_eq!(
//!     view[2].text(),
//!     r#"[digested] bash {"command": "cat setup.py"} → ok, 6000 bytes omitted; full output: context_recall {"handle":"c1"}"#
//! );
//! assert_eq!(view[4], history[4]); // the newest batch is whole
//! // An engine's `handle_tool_call("context_recall", args, ..)` delegates:
//! let answer = handle_recall_call(&history, &serde_json::json!({"handle": "c1", "end_line": 2}));
//! assert!(answer.contains(r#""content":"x = 1\nx = 1\n""#));
//! ```
//!
//! Properties: the input is never mutated; the output is deterministic and
//! idempotent (a digest is never digested again); so from one turn to the
//! next only the previously newest batch changes and the provider's prompt
//! cache still matches everything before it.

mod channel;
mod line;

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::config::DigestConfig;
use crate::message::{Content, FunctionCall, Message, ToolCall};
use crate::tool_output::{self, Flags, RECALL_TOOL, clip};
use crate::validate::{self, TextActions, envelope, observation_with};

pub use crate::validate::ENVELOPE_HEADER;
pub use channel::ToolChannel;
// Recall lives in `crate::recall` (one home for the engine tools); the
// digest's users keep finding it here.
pub use crate::config::{DISABLE_ENV, is_disable_value};

pub use crate::tool_output::DIGEST_MARK;

/// The instruction that goes with [`summarizer_input`].
pub const SUMMARIZER_INSTRUCTION: &str = "Some tool results in this conversation are digests: \
one line naming the call and its outcome, with the output omitted. Summarize only what is shown. \
Do not reconstruct, guess or invent omitted output; where a detail matters and was omitted, say \
so and keep the digest's recall handle.";

/// Digest switches and thresholds. `Default` is the documented behaviour;
/// a config layer fills the fields in (missing fields take their default).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DigestOptions {
    /// Off means every body is sent (`context.digest.enabled`).
    pub enabled: bool,
    /// How many of the newest batches are kept whole, whatever their size.
    pub keep_batches: usize,
    /// Results with at least this many bytes of text are digested; smaller
    /// ones cost little and stay whole.
    pub min_bytes: usize,
    /// Longest writ (tool name and arguments), in bytes, `…` included.
    pub writ_max_bytes: usize,
    /// Longest error line, in bytes, `…` included.
    pub error_max_bytes: usize,
    /// Notes and banners up to this size are kept word for word; longer
    /// ones are clipped.
    pub note_max_bytes: usize,
    /// Which user messages are tool output of a text-action agent
    /// (`context.text_actions`, compiled by the configuration loader; not
    /// a key of this section).
    #[serde(skip)]
    pub text_actions: TextActions,
}

impl Default for DigestOptions {
    fn default() -> DigestOptions {
        DigestOptions::from_config(&DigestConfig::default(), TextActions::default())
    }
}

impl DigestOptions {
    /// The options `context.digest` sets, with the compiled
    /// `context.text_actions`.
    pub fn from_config(config: &DigestConfig, text_actions: TextActions) -> DigestOptions {
        DigestOptions {
            enabled: config.enabled,
            keep_batches: config.keep_batches,
            min_bytes: config.min_bytes,
            writ_max_bytes: config.writ_max_bytes,
            error_max_bytes: config.error_max_bytes,
            note_max_bytes: config.note_max_bytes,
            text_actions,
        }
    }
}

/// What one digest did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DigestReport {
    /// Tool results replaced by a digest line.
    pub results_digested: usize,
    /// Text envelopes replaced by their digest.
    pub envelopes_digested: usize,
    /// Binary parts (images, audio, files) dropped.
    pub binary_parts_dropped: usize,
    /// Text bytes of the digested messages' content, before.
    pub bytes_before: usize,
    /// Text bytes of the same messages' content, after.
    pub bytes_after: usize,
}

/// The request view of `messages`: older bulky tool results digested (see
/// the module docs). The input is not changed.
pub fn digest(messages: &[Message], opts: &DigestOptions) -> Vec<Message> {
    digest_with_report(messages, opts).0
}

/// [`digest`] with a report of what was replaced.
pub fn digest_with_report(
    messages: &[Message],
    opts: &DigestOptions,
) -> (Vec<Message>, DigestReport) {
    let (view, report) = digest_view(messages, opts);
    (view.into_iter().map(Cow::into_owned).collect(), report)
}

/// The digest without copying: unchanged messages are borrowed from the
/// input, digested ones owned. For hosts that serialize the request
/// straight away (cloning a transcript whose messages carry raw provider
/// responses costs more than the digest itself).
pub fn digest_view<'a>(
    messages: &'a [Message],
    opts: &DigestOptions,
) -> (Vec<Cow<'a, Message>>, DigestReport) {
    let reentries = validate::reentries_with(messages, &opts.text_actions);
    let kept_from = kept_from(messages, &reentries, opts.keep_batches);
    digest_until(messages, opts, kept_from, &reentries)
}

/// How many leading messages of the request `view` the next request will
/// still carry as they are, as far as the digest can tell. When the next
/// tool batch arrives, the oldest of the [`DigestOptions::keep_batches`]
/// newest batches turns old and its bulky results are digested, so the
/// next request differs from this one at the first such result;
/// `view.len()` when nothing will change (the digest off, results under
/// [`DigestOptions::min_bytes`], no batch).
///
/// This is where a prompt cache that needs breakpoints (Anthropic's
/// `cache_control`) is best marked: an entry written past it is never read
/// again, and what follows it is billed at the input price instead of the
/// cache-write price. The digest is idempotent, so `view` may be a request
/// the digest already made.
pub fn stable_len(view: &[Message], opts: &DigestOptions) -> usize {
    if !opts.enabled || opts.keep_batches == 0 {
        return view.len();
    }
    // The newest batches, found from the end as `batch_starts` finds them
    // from the start (a result with no call anywhere before it opens a
    // batch of its own), so only the tail's re-entries are read.
    let actions = &opts.text_actions;
    let first_call = view.iter().position(starts_call_batch);
    let opens = |i: usize| {
        let m = &view[i];
        if starts_call_batch(m) {
            true
        } else if m.is_tool_result() {
            first_call.is_none_or(|f| f > i)
        } else {
            validate::is_reentry_with(view, i, actions)
        }
    };
    let mut newest = (0..view.len()).rev().filter(|&i| opens(i));
    let kept: Vec<usize> = newest.by_ref().take(opts.keep_batches).collect();
    let Some(&turning) = kept.get(opts.keep_batches - 1) else {
        return view.len();
    };
    // What the next request keeps whole: the batches after `turning`.
    let next_kept = match opts.keep_batches {
        1 => usize::MAX,
        k => kept[k - 2],
    };
    // The tail from the message before the turning batch (an observation's
    // action) is enough to digest it.
    let from = turning.saturating_sub(1);
    let tail = &view[from..];
    let reentries = validate::reentries_with(tail, actions);
    let (next, _) = digest_until(tail, opts, next_kept.saturating_sub(from), &reentries);
    (turning..view.len())
        .find(|&i| next.get(i - from).is_some_and(|m| m.as_ref() != &view[i]))
        .unwrap_or(view.len())
}

/// The tool batches of `messages`, oldest first, by the index of the
/// message that opens each: an assistant message with tool calls, a result
/// with no call before it, or a text tool-result envelope. The unit a
/// [scheduler](crate::schedule) advances the digest by.
pub fn batch_starts(messages: &[Message], actions: &TextActions) -> Vec<usize> {
    batch_starts_with(messages, &validate::reentries_with(messages, actions))
}

/// [`batch_starts`] with the transcript's re-entries already known.
fn batch_starts_with(messages: &[Message], reentries: &[bool]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut in_batch = false;
    for (i, m) in messages.iter().enumerate() {
        if starts_call_batch(m) {
            in_batch = true;
            starts.push(i);
        } else if m.is_tool_result() {
            // A result with no call before it is a batch of its own.
            if !in_batch {
                starts.push(i);
            }
        } else if reentries.get(i).copied().unwrap_or(false) {
            starts.push(i);
        }
    }
    starts
}

/// The digest of the first `batches` tool batches only (see
/// [`batch_starts`]), never of the newest [`DigestOptions::keep_batches`]:
/// what a request shows while a schedule holds later steps back. Batch `k`
/// is digested identically whatever `batches` is, so advancing the
/// frontier only changes the request from the first newly digested batch on.
pub fn digest_through<'a>(
    messages: &'a [Message],
    opts: &DigestOptions,
    batches: usize,
) -> (Vec<Cow<'a, Message>>, DigestReport) {
    Batches::of(messages, &opts.text_actions).digest_through(messages, opts, batches)
}

/// The tool batches of one transcript and its re-entries, found once and
/// shared by the digest passes over it (a schedule weighing a step digests
/// the same request twice).
#[derive(Clone, Debug)]
pub struct Batches {
    reentries: Vec<bool>,
    starts: Vec<usize>,
}

impl Batches {
    /// The batches of `messages` (see [`batch_starts`]).
    pub fn of(messages: &[Message], actions: &TextActions) -> Batches {
        let reentries = validate::reentries_with(messages, actions);
        let starts = batch_starts_with(messages, &reentries);
        Batches { reentries, starts }
    }

    /// The index of the message opening each batch, oldest first.
    pub fn starts(&self) -> &[usize] {
        &self.starts
    }

    /// [`digest_through`] on the `messages` these batches were found in.
    pub fn digest_through<'a>(
        &self,
        messages: &'a [Message],
        opts: &DigestOptions,
        batches: usize,
    ) -> (Vec<Cow<'a, Message>>, DigestReport) {
        let frontier = self.starts.get(batches).copied().unwrap_or(usize::MAX);
        let kept_from = kept_from_starts(&self.starts, opts.keep_batches);
        digest_until(messages, opts, frontier.min(kept_from), &self.reentries)
    }
}

/// Digests results of batches opening before `kept_from`.
fn digest_until<'a>(
    messages: &'a [Message],
    opts: &DigestOptions,
    kept_from: usize,
    reentries: &[bool],
) -> (Vec<Cow<'a, Message>>, DigestReport) {
    let mut report = DigestReport::default();
    if !opts.enabled {
        return (messages.iter().map(Cow::Borrowed).collect(), report);
    }
    let calls = calls_by_id(messages);
    let mut batch: Option<usize> = None;
    let mut legacy: Option<&FunctionCall> = None;
    let mut out = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        if starts_call_batch(message) {
            batch = Some(i);
            legacy = message.function_call.as_ref();
        }
        let replaced = if message.is_tool_result() {
            if batch.unwrap_or(i) >= kept_from {
                None
            } else {
                let writ = writ_of(message, &calls, legacy);
                digest_result(message, &writ, opts, &mut report)
            }
        } else if i < kept_from && reentries.get(i).copied().unwrap_or(false) {
            if validate::is_tool_reentry(message) {
                digest_envelope(message, opts, &mut report)
            } else {
                observation_with(messages, i, &opts.text_actions)
                    .and_then(|o| digest_observation(message, &o, opts, &mut report))
            }
        } else {
            None
        };
        out.push(replaced.map_or(Cow::Borrowed(message), Cow::Owned));
    }
    (out, report)
}

/// What a summarizer gets: the transcript with every bulky result digested
/// (no batch kept whole) and the instruction not to reconstruct what the
/// digest omitted.
#[derive(Clone, Debug, PartialEq)]
pub struct SummarizerInput {
    /// The digested transcript.
    pub messages: Vec<Message>,
    /// [`SUMMARIZER_INSTRUCTION`], to put in the summarizer's prompt.
    pub instruction: &'static str,
}

/// Builds the summarizer's input through the same digest as the request
/// view, with `keep_batches` forced to 0: the summary is written from the
/// digests, so that call is not a second copy of every tool output.
pub fn summarizer_input(messages: &[Message], opts: &DigestOptions) -> SummarizerInput {
    let opts = DigestOptions {
        keep_batches: 0,
        ..opts.clone()
    };
    SummarizerInput {
        messages: digest(messages, &opts),
        instruction: SUMMARIZER_INSTRUCTION,
    }
}

/// Whether `message` opens a tool batch: an assistant turn that calls tools
/// (or the legacy `function_call`).
fn starts_call_batch(message: &Message) -> bool {
    message.has_tool_calls() || message.function_call.is_some()
}

/// The index of the first message of the oldest kept batch: results (and
/// envelopes) of batches starting at or after it stay whole. `usize::MAX`
/// when no batch is kept.
fn kept_from(messages: &[Message], reentries: &[bool], keep: usize) -> usize {
    kept_from_starts(&batch_starts_with(messages, reentries), keep)
}

/// [`kept_from`] with the batches already found.
fn kept_from_starts(starts: &[usize], keep: usize) -> usize {
    if keep == 0 {
        return usize::MAX;
    }
    starts
        .len()
        .checked_sub(keep)
        .and_then(|k| starts.get(k))
        .copied()
        .unwrap_or(0)
}

/// Every tool call by id; the first call wins when an id repeats, so the
/// writ is the same on every turn.
fn calls_by_id(messages: &[Message]) -> HashMap<&str, &ToolCall> {
    let mut calls = HashMap::new();
    for call in messages.iter().flat_map(Message::tool_calls) {
        if let Some(id) = call.id.as_deref() {
            calls.entry(id).or_insert(call);
        }
    }
    calls
}

/// The writ of a result: the name and arguments of the call it answers.
fn writ_of(
    message: &Message,
    calls: &HashMap<&str, &ToolCall>,
    legacy: Option<&FunctionCall>,
) -> String {
    let call = message
        .tool_call_id
        .as_deref()
        .and_then(|id| calls.get(id))
        .and_then(|c| c.function.as_ref());
    match (call, legacy) {
        (Some(f), _) => line::call_writ(&f.name, &f.arguments),
        (None, Some(f)) if message.tool_call_id.is_none() => line::call_writ(&f.name, &f.arguments),
        _ => message
            .name
            .clone()
            .unwrap_or_else(|| "tool result".to_owned()),
    }
}

/// The writ of a call (name and arguments on one line) clipped to `max`
/// bytes: how `prune`'s markers name the call whose output they replace,
/// in the same words as a digest line.
pub(crate) fn clipped_writ(name: &str, arguments: &str, max: usize) -> String {
    clip(&line::call_writ(name, arguments), max)
}

/// The recall handle of a result: its `tool_call_id`, or a hash of its body
/// when it has none.
pub(crate) fn result_handle(message: &Message, body: &str) -> String {
    match message.tool_call_id.as_deref() {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => hash_handle(body),
    }
}

/// A content-derived handle: stable across turns and compactions.
pub(crate) fn hash_handle(body: &str) -> String {
    format!("h{:016x}", xxh3_64(body.as_bytes()))
}

/// The recall handles of each block of a text tool-result envelope.
pub(crate) fn envelope_block_handles(text: &str) -> Vec<String> {
    if envelope::is_digested(text) {
        return Vec::new();
    }
    envelope::blocks(text)
        .into_iter()
        .map(|b| hash_handle(b.body))
        .collect()
}

/// `full output: context_recall {"handle":"…"}`.
fn hint(handle: &str) -> String {
    let arg = serde_json::json!({ "handle": handle });
    format!("full output: {RECALL_TOOL} {arg}")
}

/// Whether the agent that reads `message` has a tool channel to call
/// [`RECALL_TOOL`] through: a tool result or a text tool-result envelope.
/// The one rule for every line that shortens tool output (digest lines,
/// prune markers, the fit's clipped results): those name their recall
/// handle only where it can be called. A text-action agent's observation
/// has none: such an agent writes its actions as text, its requests carry
/// no tools (so `ctx serve` offers none of the engine's), and a hint would
/// be read as a command to run.
pub fn names_recall_handle(message: &Message) -> bool {
    message.is_tool_result() || validate::is_tool_reentry(message)
}

/// Whether a tool result's text is a digest line.
pub(crate) fn is_digest_line(text: &str) -> bool {
    text.starts_with(DIGEST_MARK)
}

/// Whether every part of the content is text or binary (see
/// [`line::is_accounted`]).
fn accounted(message: &Message) -> bool {
    message.content.parts().iter().all(line::is_accounted)
}

/// One line per binary part of the content.
fn binary_lines(message: &Message, opts: &DigestOptions) -> Vec<String> {
    message
        .content
        .parts()
        .iter()
        .filter(|p| line::is_binary(p))
        .map(|p| line::binary_line(p, opts.writ_max_bytes))
        .collect()
}

fn digest_result(
    message: &Message,
    writ: &str,
    opts: &DigestOptions,
    report: &mut DigestReport,
) -> Option<Message> {
    let body = message.text();
    if is_digest_line(&body) || !accounted(message) {
        return None;
    }
    let binaries = binary_lines(message, opts);
    if body.len() < opts.min_bytes && binaries.is_empty() {
        return None;
    }
    let outcome = tool_output::outcome(&body, Flags::of(&message.extra));
    let mut lines = vec![format!(
        "{DIGEST_MARK} {} → {}; {}",
        clip(writ, opts.writ_max_bytes),
        outcome.render(body.len(), opts.error_max_bytes),
        hint(&result_handle(message, &body)),
    )];
    let dropped = binaries.len();
    lines.extend(binaries);
    lines.extend(line::notes(&body, opts.note_max_bytes));
    let text = lines.join("\n");
    replace(message, body.len(), text, dropped, report).inspect(|_| report.results_digested += 1)
}

fn digest_envelope(
    message: &Message,
    opts: &DigestOptions,
    report: &mut DigestReport,
) -> Option<Message> {
    let text = message.text();
    if envelope::is_digested(&text) || !accounted(message) {
        return None;
    }
    let binaries = binary_lines(message, opts);
    if text.len() < opts.min_bytes && binaries.is_empty() {
        return None;
    }
    let blocks = envelope::blocks(&text);
    if blocks.is_empty() {
        return None;
    }
    let mut lines = vec![ENVELOPE_HEADER.to_owned()];
    for block in &blocks {
        let outcome = tool_output::outcome(block.body, Flags::default());
        lines.push(format!(
            "{} → {}; {}",
            clip(block.writ, opts.writ_max_bytes),
            outcome.render(block.body.len(), opts.error_max_bytes),
            hint(&hash_handle(block.body)),
        ));
    }
    let dropped = binaries.len();
    lines.extend(binaries);
    lines.extend(line::notes(&text, opts.note_max_bytes));
    lines.push(envelope::END_TOOL_RESULTS.to_owned());
    let new = lines.join("\n");
    replace(message, text.len(), new, dropped, report).inspect(|_| report.envelopes_digested += 1)
}

/// An observation of a text-action agent becomes one digest line naming the
/// action, in the agent's own observation shape so its parser still reads
/// it: mini-swe-agent's `<returncode>` and `<output>` tags, SWE-agent's
/// `OBSERVATION:` header or its `(Open file: …)` trailer stay.
fn digest_observation(
    message: &Message,
    obs: &validate::Observation,
    opts: &DigestOptions,
    report: &mut DigestReport,
) -> Option<Message> {
    let body = message.text();
    if body.lines().any(|l| is_digest_line(l.trim_start())) || !accounted(message) {
        return None;
    }
    let binaries = binary_lines(message, opts);
    let dropped = binaries.len();
    if body.len() < opts.min_bytes && binaries.is_empty() {
        return None;
    }
    let command = obs.action.command();
    let writ = if command.trim().is_empty() {
        "action".to_owned()
    } else {
        tool_output::one_line(&command)
    };
    // No recall hint: see `names_recall_handle`.
    let outcome = tool_output::outcome(&body, Flags::of(&message.extra));
    let digest_line = format!(
        "{DIGEST_MARK} {} → {}",
        clip(&writ, opts.writ_max_bytes),
        outcome.render(body.len(), opts.error_max_bytes),
    );
    let mut lines = vec![digest_line];
    lines.extend(binaries);
    let text = observation_shape(&body, lines.join("\n"));
    replace(message, body.len(), text, dropped, report).inspect(|_| report.results_digested += 1)
}

/// `replacement` (a digest line or a prune marker) in the shape of the
/// observation `original`, so the agent's own parser still reads it:
/// mini-swe-agent's `<returncode>` line and `<output>` tags, SWE-agent's
/// `OBSERVATION:` header and its `(Open file: …)` trailer stay.
pub(crate) fn observation_shape(original: &str, replacement: String) -> String {
    let trimmed = original.trim_start();
    if trimmed.starts_with("<returncode>")
        && let Some(end) = trimmed.find("</returncode>")
    {
        let head = &trimmed[..end + "</returncode>".len()];
        return format!("{head}\n<output>\n{replacement}\n</output>");
    }
    let mut out = String::new();
    if trimmed.starts_with("OBSERVATION:") {
        out.push_str("OBSERVATION:\n");
    }
    out.push_str(&replacement);
    let trailer = observation_trailer(original);
    if !trailer.is_empty() {
        out.push_str("\n\n");
        out.push_str(&trailer.join("\n"));
    }
    out
}

/// SWE-agent's trailer: the last lines that show the open file, the
/// current directory and the prompt.
fn observation_trailer(body: &str) -> Vec<&str> {
    let lines: Vec<&str> = body.trim_end().lines().collect();
    let keep = lines
        .iter()
        .rev()
        .take_while(|l| {
            let t = l.trim();
            t.starts_with("(Open file: ")
                || t.starts_with("(Current directory: ")
                || t.starts_with("bash-$")
        })
        .count();
    lines[lines.len() - keep..].to_vec()
}

/// A copy of `message` with `text` as its content, unless that would not
/// make a text-only message shorter.
fn replace(
    message: &Message,
    before: usize,
    text: String,
    dropped: usize,
    report: &mut DigestReport,
) -> Option<Message> {
    if dropped == 0 && text.len() >= before {
        return None;
    }
    report.binary_parts_dropped += dropped;
    report.bytes_before += before;
    report.bytes_after += text.len();
    let mut out = message.clone();
    out.content = Content::Text(text);
    Some(out)
}

#[cfg(test)]
mod tests;
