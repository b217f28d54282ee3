//! The token state and compaction parameters every engine maintains.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::threshold::{compaction_threshold, resolve_model_threshold};
use super::types::ModelInfo;
use super::usage::Usage;

// The defaults the configuration schema shares (`config` is the leaf).
pub use crate::config::{
    DEFAULT_PROTECT_FIRST_N, DEFAULT_PROTECT_LAST_N, DEFAULT_THRESHOLD_PERCENT,
};

/// The prompt size of the last request, or the fact that it is unknown
/// because the transcript was just compacted.
///
/// After a compaction the last real prompt count describes a transcript that
/// no longer exists; trusting it would re-trigger compaction at once. The
/// reference design stores `-1` there; this type makes the state explicit so
/// it can never leak into arithmetic or status output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptTokens {
    /// The provider reported this many prompt tokens for the last call.
    Known(u64),
    /// Compaction just ran; waiting for the next real usage report.
    AwaitingRealUsage,
}

impl Default for PromptTokens {
    fn default() -> PromptTokens {
        PromptTokens::Known(0)
    }
}

impl PromptTokens {
    /// The count, or `None` while awaiting real usage.
    pub fn known(self) -> Option<u64> {
        match self {
            PromptTokens::Known(n) => Some(n),
            PromptTokens::AwaitingRealUsage => None,
        }
    }

    /// The count, or 0 while awaiting real usage (what displays show).
    pub fn or_zero(self) -> u64 {
        self.known().unwrap_or(0)
    }
}

/// Token tracking and compaction parameters shared by all engines.
///
/// Traits cannot hold fields, so each engine owns one of these and exposes
/// it through [`ContextEngine::state`](super::ContextEngine::state); the
/// trait's default methods (reset, status, model switch) work on it. Hosts
/// read it directly, as the reference design's host reads engine attributes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EngineState {
    /// Prompt tokens of the last provider call (or awaiting real usage).
    pub last_prompt_tokens: PromptTokens,
    /// Completion tokens of the last provider call.
    pub last_completion_tokens: u64,
    /// Total tokens of the last provider call.
    pub last_total_tokens: u64,
    /// Prompt size at which compaction fires (see
    /// [`compaction_threshold`]: the percent of the window less the reply
    /// reserve).
    pub threshold_tokens: u64,
    /// The model's context window; 0 when unknown.
    pub context_length: u64,
    /// Compactions performed this session.
    pub compression_count: u64,
    /// Fraction of the context window at which compaction fires.
    pub threshold_percent: f64,
    /// Tokens reserved for the model's reply, subtracted from the window
    /// before the percent applies; `None` reserves nothing.
    #[serde(default)]
    pub reply_reserve: Option<u64>,
    /// Non-system head messages kept verbatim, in addition to the system
    /// prompt, which is always protected (3 keeps the historical head shape).
    pub protect_first_n: usize,
    /// Tail messages kept verbatim.
    pub protect_last_n: usize,
    /// `false` keeps successful automatic compaction silent (routine
    /// background maintenance); warnings, errors and manual compaction still
    /// surface.
    pub emit_automatic_compaction_status: bool,
    /// Per-model threshold overrides (see [`resolve_model_threshold`]).
    pub model_thresholds: BTreeMap<String, f64>,
    /// The configured `threshold_percent`, snapshotted by the first
    /// [`apply_model`](EngineState::apply_model) so later model switches fall
    /// back to it rather than to the previous model's override. `None` until
    /// then.
    pub config_threshold_percent: Option<f64>,
}

impl Default for EngineState {
    fn default() -> EngineState {
        EngineState {
            last_prompt_tokens: PromptTokens::default(),
            last_completion_tokens: 0,
            last_total_tokens: 0,
            threshold_tokens: 0,
            context_length: 0,
            compression_count: 0,
            threshold_percent: DEFAULT_THRESHOLD_PERCENT,
            reply_reserve: None,
            protect_first_n: DEFAULT_PROTECT_FIRST_N,
            protect_last_n: DEFAULT_PROTECT_LAST_N,
            emit_automatic_compaction_status: true,
            model_thresholds: BTreeMap::new(),
            config_threshold_percent: None,
        }
    }
}

impl EngineState {
    /// The state of an engine for a `context_length` window (0 when
    /// unknown) that compacts at `threshold_percent` of it less
    /// `reply_reserve`; everything else at its default.
    pub fn new(context_length: u64, threshold_percent: f64, reply_reserve: Option<u64>) -> Self {
        let mut state = EngineState {
            context_length,
            threshold_percent,
            reply_reserve,
            ..EngineState::default()
        };
        state.recompute_threshold();
        state
    }

    /// Sets the head and tail protections.
    pub fn with_protection(mut self, first_n: usize, last_n: usize) -> Self {
        self.protect_first_n = first_n;
        self.protect_last_n = last_n;
        self
    }

    /// Sets the per-model threshold overrides (applied by the next
    /// [`apply_model`](Self::apply_model)).
    pub fn with_model_thresholds(mut self, overrides: BTreeMap<String, f64>) -> Self {
        self.model_thresholds = overrides;
        self
    }

    /// Recomputes [`threshold_tokens`](Self::threshold_tokens) from the
    /// window, the percent and the reply reserve ([`compaction_threshold`]).
    pub fn recompute_threshold(&mut self) {
        self.threshold_tokens = compaction_threshold(
            self.context_length,
            self.threshold_percent,
            self.reply_reserve,
        );
    }

    /// Records the real usage of a provider call (ends the awaiting state).
    pub fn record_usage(&mut self, usage: &Usage) {
        self.last_prompt_tokens = PromptTokens::Known(usage.prompt_tokens);
        self.last_completion_tokens = usage.completion_tokens;
        self.last_total_tokens = usage.total_tokens;
    }

    /// Records a finished compaction: counts it and marks the last prompt
    /// count stale until the next real usage arrives.
    pub fn record_compression(&mut self) {
        self.compression_count = self.compression_count.saturating_add(1);
        self.last_prompt_tokens = PromptTokens::AwaitingRealUsage;
    }

    /// Whether `prompt_tokens` (or, when `None`, the last real prompt count)
    /// has reached the threshold. False while awaiting real usage without an
    /// explicit count, and while no threshold is known.
    pub fn exceeds_threshold(&self, prompt_tokens: Option<u64>) -> bool {
        let Some(tokens) = prompt_tokens.or(self.last_prompt_tokens.known()) else {
            return false;
        };
        self.threshold_tokens > 0 && tokens >= self.threshold_tokens
    }

    /// Zeroes the per-session counters and token tracking; model and
    /// threshold configuration survive.
    pub fn reset_counters(&mut self) {
        self.last_prompt_tokens = PromptTokens::Known(0);
        self.last_completion_tokens = 0;
        self.last_total_tokens = 0;
        self.compression_count = 0;
    }

    /// Adopts a new model's context window and recomputes the threshold,
    /// applying the per-model override if one matches.
    pub fn apply_model(&mut self, model: &ModelInfo) {
        self.context_length = model.context_length;
        let configured = *self
            .config_threshold_percent
            .get_or_insert(self.threshold_percent);
        self.threshold_percent = resolve_model_threshold(
            &model.model,
            model.provider.as_deref().unwrap_or(""),
            &self.model_thresholds,
            configured,
        );
        self.recompute_threshold();
    }

    /// The standard status report (see [`EngineStatus`]).
    pub fn status(&self) -> EngineStatus {
        let last_prompt = self.last_prompt_tokens.or_zero();
        let usage_percent = if self.context_length == 0 {
            0.0
        } else {
            (last_prompt as f64 / self.context_length as f64 * 100.0).clamp(0.0, 100.0)
        };
        EngineStatus {
            last_prompt_tokens: last_prompt,
            threshold_tokens: self.threshold_tokens,
            context_length: self.context_length,
            usage_percent,
            compression_count: self.compression_count,
            awaiting_real_usage: self.last_prompt_tokens == PromptTokens::AwaitingRealUsage,
            extra: Map::new(),
        }
    }
}

/// What hosts display about an engine; field names match the reference
/// design's status dict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EngineStatus {
    /// Prompt tokens of the last call; 0 while awaiting real usage.
    pub last_prompt_tokens: u64,
    /// Prompt size at which compaction fires.
    pub threshold_tokens: u64,
    /// The model's context window; 0 when unknown.
    pub context_length: u64,
    /// `last_prompt_tokens / context_length * 100`, within 0..=100; 0 when
    /// the context length is unknown or while awaiting real usage.
    pub usage_percent: f64,
    /// Compactions performed this session.
    pub compression_count: u64,
    /// Compaction just ran and no real usage has been reported since.
    pub awaiting_real_usage: bool,
    /// Engine-specific fields, serialized next to the standard ones.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}
