//! The compressor's options and cooldowns.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::digest::DigestOptions;
use crate::engine::{
    DEFAULT_PROTECT_FIRST_N, DEFAULT_PROTECT_LAST_N, DEFAULT_THRESHOLD_PERCENT, EngineState,
};
use crate::prune::PruneOptions;
use crate::schedule::ScheduleOptions;
use crate::validate::Profile;

/// Cooldown after the summarizer reported it is not configured.
pub const COOLDOWN_NOT_CONFIGURED: Duration = Duration::from_secs(600);
/// Cooldowns after repeated timeouts, 429s and 5xx: first, second, third on.
pub const COOLDOWN_TRANSIENT: [Duration; 3] = [
    Duration::from_secs(60),
    Duration::from_secs(300),
    Duration::from_secs(900),
];
/// Cooldown after a malformed or empty reply.
pub const COOLDOWN_MALFORMED: Duration = Duration::from_secs(30);
/// Cooldown after any other failure (auth, network).
pub const COOLDOWN_OTHER: Duration = Duration::from_secs(60);
/// Tuning of the compressor. `Default` is the documented behaviour.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct CompressorOptions {
    /// Fraction of the usable window at which compaction fires.
    pub threshold_percent: f64,
    /// Tokens reserved for the reply, subtracted from the window first.
    pub max_tokens: Option<u64>,
    /// Non-system head messages kept verbatim on the first compaction
    /// (later ones keep only the system prompt, so early turns do not
    /// fossilise).
    pub protect_first_n: usize,
    /// Tail messages kept at least (clamped to 3..=8).
    pub protect_last_n: usize,
    /// Tail budget as a fraction of the threshold.
    pub tail_ratio: f64,
    /// How far past the tail budget a cut point may push the tail.
    pub tail_ceiling: f64,
    /// Summary target as a fraction of the tokens it replaces.
    pub summary_ratio: f64,
    /// Summary target at most this fraction of the window.
    pub summary_window_ratio: f64,
    /// Summary target at most this many tokens.
    pub summary_max_tokens: usize,
    /// The summary's state record (its ledger of asks, files, commands,
    /// errors) may grow the summary past its target, when it needs to, up
    /// to this fraction of the window (and `summary_max_tokens`): its
    /// literal entries are what the agent needs after a compaction, and
    /// what does not fit collapses into counts only recallable from the
    /// archive.
    pub summary_ledger_window_ratio: f64,
    /// The provider rules the output must keep.
    pub profile: Profile,
    /// The digest applied to the summarizer's input and to request views.
    pub digest: DigestOptions,
    /// The proactive prune behind
    /// [`prune_tool_results_only`](ContextEngine::prune_tool_results_only);
    /// off until `proactive_prune_tokens` is set, because every prune costs
    /// the provider's cached prefix.
    pub prune: PruneOptions,
    /// When the digest advances and a prune commits: only when the saving
    /// pays for the prompt cache it breaks (see [`crate::schedule`]).
    pub schedule: ScheduleOptions,
    /// Per-model threshold overrides (see
    /// [`resolve_model_threshold`](crate::engine::resolve_model_threshold)).
    pub model_thresholds: BTreeMap<String, f64>,
}

impl Default for CompressorOptions {
    fn default() -> CompressorOptions {
        CompressorOptions {
            threshold_percent: DEFAULT_THRESHOLD_PERCENT,
            max_tokens: None,
            protect_first_n: DEFAULT_PROTECT_FIRST_N,
            protect_last_n: DEFAULT_PROTECT_LAST_N,
            tail_ratio: crate::config::DEFAULT_TAIL_RATIO,
            tail_ceiling: 1.5,
            summary_ratio: 0.20,
            summary_window_ratio: 0.05,
            summary_max_tokens: 12_000,
            summary_ledger_window_ratio: 0.10,
            profile: Profile::OpenAi,
            digest: DigestOptions::default(),
            prune: PruneOptions::default(),
            schedule: ScheduleOptions::default(),
            model_thresholds: BTreeMap::new(),
        }
    }
}

impl CompressorOptions {
    /// The engine state these options give for a `context_length` window:
    /// threshold percent, reply reserve, protections and per-model
    /// overrides (the built-in engines and the plugin host start from it).
    pub fn engine_state(&self, context_length: u64) -> EngineState {
        EngineState::new(context_length, self.threshold_percent, self.max_tokens)
            .with_protection(self.protect_first_n, self.protect_last_n)
            .with_model_thresholds(self.model_thresholds.clone())
    }

    /// Which user messages are a text-action agent's tool output: the
    /// setting the digest options carry (`context.text_actions`).
    pub fn text_actions(&self) -> &crate::validate::TextActions {
        &self.digest.text_actions
    }

    /// Sets the text-action setting of the digest and of the prune's
    /// digest (one setting: [`text_actions`](Self::text_actions)).
    pub fn with_text_actions(mut self, actions: crate::validate::TextActions) -> CompressorOptions {
        self.prune.digest.text_actions = actions.clone();
        self.digest.text_actions = actions;
        self
    }

    /// Sets [`profile`](Self::profile).
    pub fn with_profile(mut self, profile: Profile) -> CompressorOptions {
        self.profile = profile;
        self
    }

    /// Sets [`max_tokens`](Self::max_tokens).
    pub fn with_max_tokens(mut self, tokens: u64) -> CompressorOptions {
        self.max_tokens = Some(tokens);
        self
    }

    /// Sets [`threshold_percent`](Self::threshold_percent).
    pub fn with_threshold_percent(mut self, percent: f64) -> CompressorOptions {
        self.threshold_percent = percent;
        self
    }

    /// Sets [`protect_first_n`](Self::protect_first_n).
    pub fn with_protect_first_n(mut self, n: usize) -> CompressorOptions {
        self.protect_first_n = n;
        self
    }

    /// Sets [`protect_last_n`](Self::protect_last_n).
    pub fn with_protect_last_n(mut self, n: usize) -> CompressorOptions {
        self.protect_last_n = n;
        self
    }

    /// Sets [`digest`](Self::digest).
    pub fn with_digest(mut self, digest: DigestOptions) -> CompressorOptions {
        self.digest = digest;
        self
    }

    /// Sets [`schedule`](Self::schedule).
    pub fn with_schedule(mut self, schedule: ScheduleOptions) -> CompressorOptions {
        self.schedule = schedule;
        self
    }
}
