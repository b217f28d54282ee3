//! Per-model compaction threshold overrides.

use std::collections::BTreeMap;

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
    let model = model.to_ascii_lowercase();
    let provider = provider.to_ascii_lowercase();
    // (scoped, substring length) ranks a candidate; higher wins.
    let mut best: Option<((bool, usize), f64)> = None;
    for (key, &percent) in overrides {
        if !(percent.is_finite() && percent > 0.0) {
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
        if best.is_none_or(|(best_rank, _)| rank > best_rank) {
            best = Some((rank, percent));
        }
    }
    best.map_or(default, |(_, percent)| percent)
}
