//! What a [`compress`](super::ContextEngine::compress) call did, in terms
//! every engine can fill and every host can read: the compacted messages and
//! a [`CompactionReport`] (outcome, sizes, what was kept, which input
//! messages the summary replaced).

use serde::Serialize;

use super::error::EngineError;
use super::fit_report::{FitStep, Unfittable};
use crate::message::Message;
use crate::summary_text::Placement;
use crate::tokens::TokenCounter;

/// The result of a successful compaction: the new transcript and what
/// happened to produce it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Compaction {
    /// The compacted transcript, valid for the host's provider profile.
    pub messages: Vec<Message>,
    /// How it was made.
    pub report: CompactionReport,
}

impl Compaction {
    /// A compaction whose report an engine already filled.
    pub fn with_report(messages: Vec<Message>, report: CompactionReport) -> Compaction {
        Compaction { messages, report }
    }

    /// A compaction of `input` into `output`, the report derived by
    /// comparing them: the common prefix is the kept head, the common suffix
    /// the kept tail, and whatever lies between in the input was replaced
    /// (see [`CompactionReport::from_diff`]). For engines that do not track
    /// their cut themselves (plugins, simple third-party engines).
    pub fn from_diff(
        input: &[Message],
        output: Vec<Message>,
        counter: &dyn TokenCounter,
        threshold_tokens: u64,
    ) -> Compaction {
        let report = CompactionReport::from_diff(input, &output, counter, threshold_tokens);
        Compaction {
            messages: output,
            report,
        }
    }
}

/// How a compaction ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// The engine's primary method (summary model, plugin) produced it.
    Compacted,
    /// The primary failed; a deterministic fallback summary was inserted.
    Fallback,
    /// The summarizer failed in a way that must not be papered over
    /// (auth, network): the transcript is unchanged.
    Aborted,
    /// Nothing between the head and the tail, or no saving possible.
    NothingToCompress,
    /// A cooldown or the anti-thrash guard declined an unforced compaction.
    Blocked,
    /// The result would have broken a provider rule; unchanged.
    InvalidOutput,
    /// The summary prepared in the background was not ready and the host
    /// asked for no other; unchanged.
    Deferred,
    /// The engine failed otherwise (a plugin crashed or answered nonsense);
    /// unchanged.
    Failed,
}

impl Outcome {
    /// The outcome an [`EngineError`] stands for (the transcript is
    /// unchanged in every one of them).
    pub fn of_error(error: &EngineError) -> Outcome {
        match error {
            EngineError::Summarizer { .. } => Outcome::Aborted,
            EngineError::InvalidOutput { .. } => Outcome::InvalidOutput,
            EngineError::NothingToCompress { .. } => Outcome::NothingToCompress,
            EngineError::Blocked { .. } => Outcome::Blocked,
            EngineError::SummaryNotReady { .. } => Outcome::Deferred,
            EngineError::Plugin { .. } | EngineError::Restore { .. } => Outcome::Failed,
        }
    }

    /// Whether the transcript changed.
    pub fn changed(self) -> bool {
        matches!(self, Outcome::Compacted | Outcome::Fallback)
    }
}

/// A range of message indices of the input, `start..end` (end exclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Span {
    /// First index.
    pub start: usize,
    /// One past the last index.
    pub end: usize,
}

impl Span {
    /// `start..end`.
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }

    /// Number of indices in the span.
    pub fn len(self) -> usize {
        self.end.saturating_sub(self.start)
    }

    /// Whether the span holds no index.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Whether `index` lies in the span.
    pub fn contains(self, index: usize) -> bool {
        (self.start..self.end).contains(&index)
    }
}

/// What one [`compress`](super::ContextEngine::compress) call did, for
/// reports (`ctx compact --report json` prints it flattened), hosts and
/// stores. Engine-agnostic: fields an engine cannot know stay `None`/0.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct CompactionReport {
    /// How it ended.
    pub outcome: Outcome,
    /// Messages in the input.
    pub messages_before: usize,
    /// Messages in the result (the input's count when unchanged).
    pub messages_after: usize,
    /// Tokens of the input, by the engine's counter.
    pub tokens_before: u64,
    /// Tokens of the result (the input's when unchanged).
    pub tokens_after: u64,
    /// The threshold at the time.
    pub threshold_tokens: u64,
    /// The head kept verbatim.
    pub head: Option<Span>,
    /// The latest user message, kept verbatim between head and summary
    /// (inside [`summarized`](Self::summarized) when set).
    pub pinned: Option<usize>,
    /// The tail kept verbatim.
    pub tail: Option<Span>,
    /// The input messages the summary replaced: `start..end` of the input,
    /// except [`pinned`](Self::pinned) when it lies inside. What a store
    /// archives when it persists the compacted history.
    pub summarized: Option<Span>,
    /// Messages replaced by the summary.
    pub summarized_messages: usize,
    /// The summarizer whose text was inserted (or that failed).
    pub summarizer: Option<String>,
    /// Where the summary went.
    pub placement: Option<Placement>,
    /// The size the summary aimed for.
    pub target_tokens: usize,
    /// Tokens of the inserted summary message text.
    pub summary_tokens: usize,
    /// A previous summary was updated rather than summarised again.
    pub iterative: bool,
    /// Why it fell back, aborted, was blocked or had nothing to do.
    pub reason: Option<String>,
    /// The cooldown started by a failure.
    pub cooldown_seconds: Option<u64>,
    /// The result is at or under the threshold (false only when even the
    /// system prompt and the latest ask exceed it).
    pub within_budget: bool,
    /// The escalation steps taken to bring the result under the threshold
    /// (see [`crate::compressor::fit`]), in order; empty when the normal
    /// budget sufficed.
    pub escalation: Vec<FitStep>,
    /// Why no result could fit the threshold, when none could.
    pub unfittable: Option<Unfittable>,
    /// Set when this compaction followed the previous one within
    /// [`THRASH_CALLS`] calls (the window barely holds the system prompt
    /// and the tail): the calls between them. Such a compaction aims
    /// deeper (the minimal tail) and the host warns.
    pub thrash: Option<u32>,
}

/// Compactions fewer calls apart than this are thrash (see
/// [`CompactionReport::thrash`]).
pub const THRASH_CALLS: u32 = 3;

impl CompactionReport {
    /// A report for a call that left `messages` messages of `tokens`
    /// tokens unchanged.
    pub fn unchanged(outcome: Outcome, messages: usize, tokens: u64, threshold: u64) -> Self {
        CompactionReport {
            outcome,
            messages_before: messages,
            messages_after: messages,
            tokens_before: tokens,
            tokens_after: tokens,
            threshold_tokens: threshold,
            head: None,
            pinned: None,
            tail: None,
            summarized: None,
            summarized_messages: 0,
            summarizer: None,
            placement: None,
            target_tokens: 0,
            summary_tokens: 0,
            iterative: false,
            reason: None,
            cooldown_seconds: None,
            within_budget: tokens <= threshold,
            escalation: Vec::new(),
            unfittable: None,
            thrash: None,
        }
    }

    /// The report of a failed call: `input` unchanged, the outcome and the
    /// reason taken from `error` (the cooldown too, when the error says).
    pub fn failed(
        error: &EngineError,
        input: &[Message],
        counter: &dyn TokenCounter,
        threshold: u64,
    ) -> Self {
        let tokens = counter.count_messages(input) as u64;
        let mut report =
            CompactionReport::unchanged(Outcome::of_error(error), input.len(), tokens, threshold);
        report.reason = Some(error.reason());
        if let EngineError::Summarizer {
            cooldown_seconds, ..
        } = error
        {
            report.cooldown_seconds = *cooldown_seconds;
        }
        report
    }

    /// The report of a compaction of `input` into `output`, derived by
    /// comparing them: the longest common prefix is the kept head, the
    /// longest common suffix (not overlapping it) the kept tail, and the
    /// input messages between them were replaced.
    pub fn from_diff(
        input: &[Message],
        output: &[Message],
        counter: &dyn TokenCounter,
        threshold: u64,
    ) -> Self {
        let tokens_before = counter.count_messages(input) as u64;
        let tokens_after = counter.count_messages(output) as u64;
        let prefix = input.iter().zip(output).take_while(|(a, b)| a == b).count();
        let room = input.len().min(output.len()) - prefix;
        let suffix = input
            .iter()
            .rev()
            .zip(output.iter().rev())
            .take(room)
            .take_while(|(a, b)| a == b)
            .count();
        let tail_start = input.len() - suffix;
        let summarized = Span::new(prefix, tail_start);
        CompactionReport {
            messages_after: output.len(),
            tokens_after,
            head: Some(Span::new(0, prefix)),
            tail: Some(Span::new(tail_start, input.len())),
            summarized: (!summarized.is_empty()).then_some(summarized),
            summarized_messages: summarized.len(),
            within_budget: tokens_after <= threshold,
            ..CompactionReport::unchanged(Outcome::Compacted, input.len(), tokens_before, threshold)
        }
    }
}
