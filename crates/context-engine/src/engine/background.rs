//! Summaries prepared off the request path.
//!
//! A host that must not wait for a summary model (a proxy serving many
//! sessions) asks the engine for a [`SummaryJob`] once the prompt reaches
//! the summary watermark ([`summary_due`]), runs it wherever it likes (a
//! worker thread, tokio's blocking pool) and hands the result back with
//! [`adopt_summary`](super::ContextEngine::adopt_summary). When the
//! threshold is crossed later, the engine compacts with that summary: the
//! span it summarizes is a prefix of what a compaction would summarize
//! now, and every message after the prepared cut stays verbatim. A result
//! is only used while the history up to its cut is unchanged (same
//! messages, no compaction since): a [`PreparedSummary`] carries the key
//! of that prefix, and a stale one is dropped.
//!
//! The job and its result are engine-agnostic: the payload is the
//! engine's own, opaque to the host.

use std::any::Any;
use std::fmt;
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::Xxh3;

use super::threshold::threshold_tokens;
use crate::message::Message;

/// The default watermark: a background summary starts at 70% of the
/// compaction threshold.
pub const DEFAULT_SUMMARY_WATERMARK: f64 = 0.70;

/// Whether a prompt of `tokens` has reached the summary watermark:
/// `watermark` (a fraction in (0, 1)) of `threshold` tokens. Never with an
/// unknown threshold (0) or a watermark outside (0, 1).
pub fn summary_due(tokens: u64, threshold: u64, watermark: f64) -> bool {
    threshold > 0
        && watermark > 0.0
        && watermark < 1.0
        && tokens >= threshold_tokens(threshold, watermark)
}

/// How [`compress`](super::ContextEngine::compress) may get its summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SummarySource {
    /// A summary adopted from a background job when one is valid, else
    /// the engine's summarizer, called now (the default).
    #[default]
    Inline,
    /// Only a summary adopted from a background job: without one the
    /// engine returns [`EngineError::SummaryNotReady`](super::EngineError::SummaryNotReady)
    /// and leaves the history unchanged.
    Prepared,
    /// A summary adopted from a background job when one is valid, else the
    /// deterministic extractive summary, never the summary model.
    Deterministic,
}

/// The key of a history prefix: the xxh3-128 of each message's JSON, in
/// order, and of the engine's compaction count. Equal keys mean the same
/// messages up to the cut, with no compaction in between.
pub fn prefix_key(messages: &[Message], compactions: u64) -> u128 {
    let mut h = Xxh3::new();
    h.update(&compactions.to_le_bytes());
    for m in messages {
        // Serialization of a parsed message cannot fail; an error would
        // only make the key differ, which discards the summary.
        let json = serde_json::to_vec(m).unwrap_or_default();
        h.update(&(json.len() as u64).to_le_bytes());
        h.update(&json);
    }
    h.digest128()
}

/// A summary to prepare off the request path. Runs once, blocking (it may
/// call a model); `Send`, so it moves to any thread.
pub struct SummaryJob {
    key: u128,
    messages: usize,
    run: Box<dyn FnOnce() -> Box<dyn Any + Send> + Send>,
}

impl fmt::Debug for SummaryJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SummaryJob")
            .field("key", &format_args!("{:032x}", self.key))
            .field("messages", &self.messages)
            .finish_non_exhaustive()
    }
}

impl SummaryJob {
    /// A job for the prefix keyed `key` that summarizes `messages`
    /// messages; `run` returns the engine's own payload.
    pub fn new(
        key: u128,
        messages: usize,
        run: impl FnOnce() -> Box<dyn Any + Send> + Send + 'static,
    ) -> SummaryJob {
        SummaryJob {
            key,
            messages,
            run: Box::new(run),
        }
    }

    /// The key of the prefix the summary belongs to (see [`prefix_key`]):
    /// two hosts preparing the same key would compute the same summary, so
    /// a fleet can claim it once.
    pub fn key(&self) -> u128 {
        self.key
    }

    /// How many messages the summary replaces.
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// Runs the job (blocking).
    pub fn run(self) -> PreparedSummary {
        let started = Instant::now();
        let payload = (self.run)();
        PreparedSummary {
            key: self.key,
            elapsed: started.elapsed(),
            payload,
        }
    }
}

/// What a [`SummaryJob`] produced, for
/// [`adopt_summary`](super::ContextEngine::adopt_summary).
pub struct PreparedSummary {
    key: u128,
    elapsed: Duration,
    payload: Box<dyn Any + Send>,
}

impl fmt::Debug for PreparedSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedSummary")
            .field("key", &format_args!("{:032x}", self.key))
            .field("elapsed", &self.elapsed)
            .finish_non_exhaustive()
    }
}

impl PreparedSummary {
    /// The key of the prefix it belongs to.
    pub fn key(&self) -> u128 {
        self.key
    }

    /// How long the job ran.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The engine's payload, if it is a `T`.
    pub fn into_payload<T: Any>(self) -> Option<Box<T>> {
        self.payload.downcast().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_is_a_share_of_the_threshold() {
        assert!(!summary_due(69, 100, 0.7));
        assert!(summary_due(70, 100, 0.7));
        assert!(!summary_due(1000, 0, 0.7));
        assert!(!summary_due(1000, 100, 1.0));
        assert!(!summary_due(1000, 100, 0.0));
    }

    #[test]
    fn a_prefix_key_changes_with_any_message_or_a_compaction() {
        let a = vec![Message::user("a"), Message::assistant("b")];
        let b = vec![Message::user("a"), Message::assistant("c")];
        assert_eq!(prefix_key(&a, 0), prefix_key(&a, 0));
        assert_ne!(prefix_key(&a, 0), prefix_key(&b, 0));
        assert_ne!(prefix_key(&a, 0), prefix_key(&a, 1));
    }
}
