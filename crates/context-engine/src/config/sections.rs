//! The `context.digest`, `context.prune` and `context.schedule` sections
//! and the defaults the engine shares with them: the schema only. The engine
//! modules turn each into their options (`DigestOptions::from_config`,
//! `PruneOptions::from_config`, `ScheduleOptions::from_config`), so the
//! configuration imports none of them.

use serde::{Deserialize, Serialize};

/// Default fraction of the context window at which compaction fires.
pub const DEFAULT_THRESHOLD_PERCENT: f64 = 0.75;
/// Default number of non-system head messages kept verbatim.
pub const DEFAULT_PROTECT_FIRST_N: usize = 3;
/// Default number of tail messages kept verbatim.
pub const DEFAULT_PROTECT_LAST_N: usize = 6;

/// The price presets `pricing.provider` may name (what
/// `PriceModel::preset` knows).
pub const PRICE_PRESETS: &[&str] = &["openai", "anthropic", "anthropic-1h", "deepseek", "none"];

/// `context.digest`: digest switches and thresholds. `Default` is the
/// documented behaviour; a layer fills the fields in (missing fields take
/// their default).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DigestConfig {
    /// Off means every body is sent.
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
}

impl Default for DigestConfig {
    fn default() -> DigestConfig {
        DigestConfig {
            enabled: true,
            keep_batches: 1,
            min_bytes: 4096,
            writ_max_bytes: 240,
            error_max_bytes: 200,
            note_max_bytes: 1024,
        }
    }
}

/// `context.prune`: the proactive prune (off until
/// `proactive_prune_tokens` is set).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PruneConfig {
    /// Run only when the prompt is above this many tokens; 0 turns the pass
    /// off.
    pub proactive_prune_tokens: u64,
    /// Commit only when at least this many tokens are freed.
    pub min_reclaim_tokens: u64,
    /// The last this-many messages are never touched.
    pub protect_last_n: usize,
    /// Tool-call arguments longer than this (in characters) get their long
    /// string leaves clipped.
    pub args_max_chars: usize,
    /// What a clipped string leaf keeps, in characters.
    pub args_leaf_chars: usize,
    /// How large results are digested (`keep_batches` is ignored).
    pub digest: DigestConfig,
}

impl Default for PruneConfig {
    fn default() -> PruneConfig {
        PruneConfig {
            proactive_prune_tokens: 0,
            min_reclaim_tokens: 4096,
            protect_last_n: 6,
            args_max_chars: 500,
            args_leaf_chars: 200,
            digest: DigestConfig::default(),
        }
    }
}

/// `context.schedule`: the cache-aware schedule (its prices come from
/// `pricing`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScheduleConfig {
    /// Off applies every edit at once (one digest step per call).
    pub enabled: bool,
    /// The most calls a saving is counted over.
    pub max_horizon_calls: u32,
    /// An edit is forced when the request without it would reach this
    /// fraction of the compaction threshold by the next call.
    pub size_margin: f64,
    /// Compaction before the threshold when the cost model says it pays,
    /// from this fraction of the threshold; 1 (or more) is off.
    pub early_compaction_from: f64,
    /// Compaction before the threshold on a call whose prompt cache has
    /// expired, from this fraction of the threshold; 1 (or more) is off.
    pub cold_compaction_from: f64,
}

impl Default for ScheduleConfig {
    fn default() -> ScheduleConfig {
        ScheduleConfig {
            enabled: true,
            max_horizon_calls: 24,
            size_margin: 0.9,
            early_compaction_from: 1.0,
            cold_compaction_from: 0.5,
        }
    }
}
