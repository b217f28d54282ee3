//! The threshold policy, one home for every engine: the prompt size at which
//! compaction fires ([`compaction_threshold`]), the per-model overrides
//! of its percent ([`resolve_model_threshold`]) and the per-model windows
//! ([`resolve_model_window`]).

use std::collections::BTreeMap;

/// Fraction of the window used as the threshold when the configured one
/// would reach the window itself (small windows, big reply reserves).
pub const SMALL_WINDOW_PERCENT: f64 = 0.85;

/// The prompt size at which compaction fires: `percent` of the window less
/// the reply reserve, but never at or above the window itself (85% of it
/// then), so that small windows still compact before they overflow. 0 when
/// the window is unknown (0).
///
/// Every engine gets its threshold from here: the compressor, the plugin
/// host and the trait's default [`update_model`](super::ContextEngine::update_model)
/// (through [`EngineState::apply_model`](super::EngineState::apply_model)).
pub fn compaction_threshold(context_length: u64, percent: f64, reserve: Option<u64>) -> u64 {
    let reserve = reserve.unwrap_or(0);
    let usable = context_length.saturating_sub(reserve);
    let t = threshold_tokens(usable, percent);
    if context_length > 0 && (t >= context_length || usable == 0) {
        threshold_tokens(context_length, SMALL_WINDOW_PERCENT)
    } else {
        t
    }
}

/// The largest compacted history the compressor accepts when fitting under
/// `threshold` would cut the summary's state record (the facts a later
/// turn needs): halfway between the threshold and the usable window (the
/// window less the reply reserve), so the reply still has room. `threshold`
/// itself when the window is unknown.
pub fn ledger_ceiling(context_length: u64, threshold: u64, reserve: Option<u64>) -> u64 {
    let usable = context_length.saturating_sub(reserve.unwrap_or(0));
    if context_length == 0 || usable <= threshold {
        return threshold;
    }
    threshold + (usable - threshold) / 2
}

/// `floor(context_length * percent)`; a negative or non-finite percent gives 0.
pub fn threshold_tokens(context_length: u64, percent: f64) -> u64 {
    // `as` saturates: NaN and negatives become 0, huge values u64::MAX.
    (context_length as f64 * percent).floor() as u64
}

/// The threshold percent for `model` served by `provider`.
///
/// Models differ in how well they use a full window, so users configure
/// overrides keyed by a model-name substring (`"gpt-4o"`) or, to target one
/// provider's deployment, `"provider:substring"` (`"openrouter:claude"`).
/// Matching ignores ASCII case. Any provider-scoped match beats any bare
/// match; within a kind the longest substring wins (ties go to the key that
/// sorts first, so the result is deterministic). A key whose text before the
/// first `:` is not `provider` is read as a bare substring, because model
/// names themselves contain colons (`qwen2.5:7b`). Overrides that are not
/// finite and positive are ignored as misconfiguration. With no match the
/// result is `default`.
pub fn resolve_model_threshold(
    model: &str,
    provider: &str,
    overrides: &BTreeMap<String, f64>,
    default: f64,
) -> f64 {
    best_match(model, provider, overrides, |p| p.is_finite() && p > 0.0).unwrap_or(default)
}

/// The context window of `model` served by `provider`, from `windows`
/// (keys matched as in [`resolve_model_threshold`]: `"substring"` or
/// `"provider:substring"`, any case, the provider-scoped and then the
/// longest match winning); `None` when no key matches (the host's default
/// window stands). A window of 0 is ignored as misconfiguration.
pub fn resolve_model_window(
    model: &str,
    provider: &str,
    windows: &BTreeMap<String, u64>,
) -> Option<u64> {
    best_match(model, provider, windows, |w| w > 0)
}

/// The value of the best key of `map` for `model`/`provider` among those
/// whose value is `usable`.
fn best_match<T: Copy>(
    model: &str,
    provider: &str,
    map: &BTreeMap<String, T>,
    usable: impl Fn(T) -> bool,
) -> Option<T> {
    let model = model.to_ascii_lowercase();
    let provider = provider.to_ascii_lowercase();
    // (scoped, substring length) ranks a candidate; higher wins.
    let mut best: Option<((bool, usize), T)> = None;
    for (key, &value) in map {
        if !usable(value) {
            continue;
        }
        let key = key.to_ascii_lowercase();
        let (scoped, needle) = match key.split_once(':') {
            Some((scope, rest)) if !provider.is_empty() && scope == provider => (true, rest),
            _ => (false, key.as_str()),
        };
        if needle.is_empty() || !model.contains(needle) {
            continue;
        }
        let rank = (scoped, needle.len());
        if best.as_ref().is_none_or(|(best_rank, _)| rank > *best_rank) {
            best = Some((rank, value));
        }
    }
    best.map(|(_, value)| value)
}
