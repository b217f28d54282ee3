//! What the driver hands back: the request to send, the history to
//! persist, the compactions it accepted and the notices for the user.

use std::time::Duration;

use serde::Serialize;

use crate::compressor::fit::{FitStep, Unfittable};
use crate::engine::{CompactionReport, EngineError};
use crate::message::Message;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// An automatic compaction's status; the engine decided to show it.
    Status,
    /// Something went wrong or was held back; always shown.
    Warning,
    /// The result of a manual compaction; always shown.
    Manual,
}

/// A message for the user, from the driver or the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Notice {
    /// How it should be shown.
    pub kind: NoticeKind,
    /// The text, one line.
    pub text: String,
}

impl Notice {
    pub(super) fn warning(text: impl Into<String>) -> Notice {
        Notice {
            kind: NoticeKind::Warning,
            text: text.into(),
        }
    }
}

/// One accepted compaction (all its passes).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Compaction {
    /// Where it was triggered.
    pub trigger: Trigger,
    /// Passes whose result was accepted.
    pub passes: u32,
    /// Tokens of the history before the first pass.
    pub tokens_before: u64,
    /// Tokens of the history after the last accepted pass.
    pub tokens_after: u64,
    /// Tokens of the request that would have been sent before it (after
    /// selection), and of the request after it: the same request, counted
    /// the same way, so that the two compare.
    pub request_tokens_before: u64,
    /// Tokens of the request after it.
    pub request_tokens_after: u64,
    /// Messages before and after.
    pub messages_before: usize,
    /// Messages after the last accepted pass.
    pub messages_after: usize,
    /// Wall time of all passes (summarizer calls included).
    #[serde(rename = "elapsed_ms", serialize_with = "as_millis")]
    pub elapsed: Duration,
    /// The engine's report of each accepted pass, in order. The indices of
    /// pass `k` refer to its input: the history for the first, the previous
    /// pass's output after that. Not serialized (replay's JSON stays as it
    /// was); a store archives `summarized` spans from here.
    #[serde(skip)]
    pub reports: Vec<CompactionReport>,
}

/// What set a compaction off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Before a request, from the counted size of the history.
    Preflight,
    /// After tool results, from the provider's real usage.
    PostTool,
    /// A manual `/compress`.
    Manual,
    /// The agent asked, through the `context_compact` tool (see
    /// [`crate::control`]); made at the next check, whatever the size.
    Agent,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// What a driver step changed. The caller's history is never touched: when
/// [`new_history`](Self::new_history) is set, the caller replaces its
/// persisted history with it (a compaction or prune was accepted).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Update {
    /// The history to persist instead of the caller's, if anything changed.
    pub new_history: Option<Vec<Message>>,
    /// The compaction accepted in this step, if any.
    pub compaction: Option<Compaction>,
    /// Tool results the proactive prune shortened in this step.
    pub pruned: usize,
    /// What to tell the user.
    pub notices: Vec<Notice>,
    /// A compaction that was due in this step but did not happen, and why.
    pub missed: Option<Missed>,
}

/// A compaction that was due but did not happen: what a report needs to
/// tell "never reached the threshold" from "tried and failed" and "held
/// back".
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Missed {
    /// Where it was due.
    pub trigger: Trigger,
    /// How it went.
    pub kind: MissedKind,
    /// Why, for the user (one line).
    pub reason: String,
}

/// How a due compaction did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissedKind {
    /// Attempted; the engine failed (summarizer, plugin crash, timeout).
    Failed,
    /// Attempted; the result was refused (it would break a provider rule,
    /// or the engine judged its own output invalid).
    Refused,
    /// Not attempted: a cooldown or the anti-thrash guard held it back.
    Blocked,
    /// Attempted; everything was protected or already compact.
    NothingToCompress,
    /// Not attempted: the summary prepared in the background is not ready
    /// and the request fits the window as it is.
    Deferred,
}

impl MissedKind {
    /// The kind of an engine's error.
    pub(super) fn of(err: &EngineError) -> MissedKind {
        match err {
            EngineError::Blocked { .. } => MissedKind::Blocked,
            EngineError::NothingToCompress { .. } => MissedKind::NothingToCompress,
            EngineError::InvalidOutput { .. } => MissedKind::Refused,
            EngineError::SummaryNotReady { .. } => MissedKind::Deferred,
            _ => MissedKind::Failed,
        }
    }
}

/// What [`Session::before_request`] prepared.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Prepared {
    /// The messages to send in this request (a request view: never persist
    /// it, unless it is also [`Update::new_history`]).
    pub request: Vec<Message>,
    /// Whether `select_context` replaced the request (digest, retrieval).
    pub selected: bool,
    /// Tokens of `request`, counted exactly.
    pub request_tokens: u64,
    /// Compaction and notices of the preflight.
    pub update: Update,
    /// The escalation steps that brought a request over the window under
    /// it (a request view: the history is unchanged), in order.
    pub fit: Vec<FitStep>,
    /// Set when even the system prompt and the latest user ask exceed the
    /// window: no request can fit, so **do not send** `request`; the host
    /// decides (switch to a larger model, ask the user to shorten).
    pub unfittable: Option<Unfittable>,
}

/// What [`Session::before_request_in_place`] did.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum InPlace {
    /// The request view is the history itself, edited in place.
    Applied(Applied),
    /// The history is unchanged; the request as
    /// [`Session::before_request`] prepares it.
    Prepared(Prepared),
}

/// A request view applied to the history in place
/// ([`Session::before_request_in_place`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct Applied {
    /// The history's messages the view replaced, by index (ascending);
    /// the view's own are in the history until [`restore`](Self::restore).
    pub originals: Vec<(usize, Message)>,
    /// Whether `select_context` replaced anything.
    pub selected: bool,
    /// Tokens of the request (the edited history), counted exactly.
    pub request_tokens: u64,
    /// Notices of the preflight (never a compaction: that takes the full
    /// way).
    pub update: Update,
}

impl Applied {
    /// Puts the originals back into `history`; returns the view's messages
    /// that stood in their place, by index.
    pub fn restore(mut self, history: &mut [Message]) -> Vec<(usize, Message)> {
        for (i, m) in &mut self.originals {
            if let Some(h) = history.get_mut(*i) {
                std::mem::swap(h, m);
            }
        }
        self.originals
    }
}

/// Swaps each `(index, message)` of `edits` with the history's message at
/// that index (twice: as before).
pub(super) fn swap_edits(history: &mut [Message], edits: &mut [(usize, Message)]) {
    for (i, m) in edits {
        if let Some(h) = history.get_mut(*i) {
            std::mem::swap(h, m);
        }
    }
}
