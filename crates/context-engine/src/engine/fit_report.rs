//! What the guaranteed fit reports (see `compressor::fit`): the steps it
//! took, and the sizes when no request can fit. Here, apart from the fit
//! itself, so that a [`CompactionReport`](super::CompactionReport) names
//! them without the trait depending on an implementation.

use std::fmt;

use serde::Serialize;

use crate::tokens::thousands;

/// Even the system prompt and the latest user ask exceed the window: no
/// request can fit, and none should be sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[error(
    "system prompt {} tokens + latest ask {} > window {}: no request can fit",
    thousands(*system_tokens),
    thousands(*ask_tokens),
    thousands(*window)
)]
pub struct Unfittable {
    /// Tokens of the leading instructions (and the request's own overhead).
    pub system_tokens: u64,
    /// Tokens of the latest real user message (its own words).
    pub ask_tokens: u64,
    /// The budget the request had to fit.
    pub window: u64,
}

/// One rung of the ladder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FitStepKind {
    /// Large tool results, the newest batch's too, reduced to head and tail.
    DigestResults,
    /// Older tool-call groups left out of the request.
    ShrinkTail,
    /// Long texts and tool-call arguments clipped.
    Clip,
    /// The summary's body cut down.
    LowerSummary,
    /// Everything but the system prompt, the latest ask and the last group
    /// dropped or clipped.
    Truncate,
}

impl FitStepKind {
    /// The step's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            FitStepKind::DigestResults => "digest_results",
            FitStepKind::ShrinkTail => "shrink_tail",
            FitStepKind::Clip => "clip",
            FitStepKind::LowerSummary => "lower_summary",
            FitStepKind::Truncate => "truncate",
        }
    }
}

impl fmt::Display for FitStepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A step taken, with its effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FitStep {
    /// Which rung.
    pub step: FitStepKind,
    /// Messages it changed or left out.
    pub messages: usize,
    /// Tokens of the request after it.
    pub tokens_after: u64,
}
