//! What a provider bills: prices per token and how its prompt cache works.
//!
//! One [`PriceModel`] holds both halves, because a cost estimate needs both:
//! the input, cached-input, cache-write and output prices, and the
//! [`CacheModel`] (minimum cached prefix, granularity, lifetime, whether the
//! cache is automatic or needs explicit breakpoints). [`PriceModel::preset`]
//! knows the common providers; the config (`pricing.*`) and `ctx replay`'s
//! `--provider` / `--price-*` flags start from a preset and override fields.
//!
//! The replay's cache simulation ([`PromptCache`]) and the
//! [scheduler](crate::schedule) both read this model; nothing else knows a
//! price.

mod cache;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use cache::{CacheLookup, LOOKBACK, PromptCache};

/// How a provider's prompt cache serves a request's leading tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct CacheModel {
    /// Shorter prompts are never cached (OpenAI: 1,024 tokens).
    pub min_prefix_tokens: u64,
    /// A cached prefix is a multiple of this many tokens (OpenAI: 128).
    pub granularity_tokens: u64,
    /// How long an entry lives without being used, in seconds.
    pub lifetime_secs: u64,
    /// `true` when the provider caches on its own (OpenAI, DeepSeek);
    /// `false` when the host marks breakpoints (Anthropic's
    /// `cache_control`): only a marked prefix is stored, and a request
    /// reads one only by carrying it whole (see [`PromptCache`]).
    pub automatic: bool,
}

impl Default for CacheModel {
    fn default() -> CacheModel {
        CacheModel {
            min_prefix_tokens: 1024,
            granularity_tokens: 128,
            lifetime_secs: 300,
            automatic: true,
        }
    }
}

impl CacheModel {
    /// The lifetime as a [`Duration`].
    pub fn lifetime(&self) -> Duration {
        Duration::from_secs(self.lifetime_secs)
    }

    /// What the cache serves of a common prefix of `tokens`: rounded down to
    /// the granularity, zero under the minimum.
    pub fn servable(&self, tokens: u64) -> u64 {
        if tokens < self.min_prefix_tokens {
            return 0;
        }
        let step = self.granularity_tokens.max(1);
        tokens / step * step
    }
}

/// A bill split by what its tokens were billed as (see
/// [`PriceModel::cost_parts`]), in the price model's currency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CostParts {
    /// Prompt tokens read from the cache.
    pub cached: f64,
    /// Uncached prompt tokens no earlier request had: new content.
    pub new: f64,
    /// Uncached prompt tokens an earlier request had, sent again because
    /// an edit before them broke the cache (compaction, digest step,
    /// prune).
    pub resent: f64,
    /// Completion tokens.
    pub output: f64,
}

impl CostParts {
    /// The whole bill.
    pub fn total(&self) -> f64 {
        self.cached + self.new + self.resent + self.output
    }

    /// Adds `other` to this bill.
    pub fn add(&mut self, other: &CostParts) {
        self.cached += other.cached;
        self.new += other.new;
        self.resent += other.resent;
        self.output += other.output;
    }
}

/// Prices per million tokens and the cache that goes with them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct PriceModel {
    /// What the prices are for (a preset or model name, or "custom").
    pub name: String,
    /// Uncached input, per million tokens.
    pub input_per_million: f64,
    /// Cached input (a cache read), per million tokens.
    pub cached_input_per_million: f64,
    /// Uncached input written to the cache, per million tokens: the input
    /// price where writing is free (OpenAI), 1.25x it for Anthropic's
    /// 5-minute cache, 2x for the 1-hour one.
    pub cache_write_per_million: f64,
    /// Output, per million tokens.
    pub output_per_million: f64,
    /// The prompt cache.
    pub cache: CacheModel,
}

/// The `openai` preset: gpt-4.1's list prices with OpenAI's automatic cache.
impl Default for PriceModel {
    fn default() -> PriceModel {
        PriceModel::new("openai", 2.00, 0.50, 8.00)
    }
}

/// The names [`PriceModel::preset`] knows (the configuration's list).
pub use crate::config::PRICE_PRESETS as PRESETS;

impl PriceModel {
    /// Prices named `name`, per million tokens, with cache writes at the
    /// input price and OpenAI's cache model.
    pub fn new(name: impl Into<String>, input: f64, cached_input: f64, output: f64) -> PriceModel {
        PriceModel {
            name: name.into(),
            input_per_million: input,
            cached_input_per_million: cached_input,
            cache_write_per_million: input,
            output_per_million: output,
            cache: CacheModel::default(),
        }
    }

    /// A provider preset by name (see [`PRESETS`]), list prices in USD:
    ///
    /// | preset | model | input | cached | write | output | cache |
    /// |---|---|---|---|---|---|---|
    /// | `openai` | gpt-4.1 | 2.00 | 0.50 | 2.00 | 8.00 | automatic, ≥1,024, 128-token steps, 5 min |
    /// | `anthropic` | Claude Sonnet 4 | 3.00 | 0.30 | 3.75 | 15.00 | breakpoints, ≥1,024, 5 min |
    /// | `anthropic-1h` | Claude Sonnet 4 | 3.00 | 0.30 | 6.00 | 15.00 | breakpoints, ≥1,024, 1 hour |
    /// | `deepseek` | deepseek-chat | 0.27 | 0.07 | 0.27 | 1.10 | automatic, 64-token units, hours |
    /// | `none` | no prompt cache | 2.00 | 2.00 | 2.00 | 8.00 | never cached |
    pub fn preset(name: &str) -> Option<PriceModel> {
        let base = PriceModel::default();
        let anthropic = |write: f64, lifetime_secs: u64| PriceModel {
            name: String::new(),
            input_per_million: 3.00,
            cached_input_per_million: 0.30,
            cache_write_per_million: write,
            output_per_million: 15.00,
            cache: CacheModel {
                min_prefix_tokens: 1024,
                granularity_tokens: 1,
                lifetime_secs,
                automatic: false,
            },
        };
        let mut model = match name {
            "openai" => base,
            "anthropic" => anthropic(3.75, 300),
            "anthropic-1h" => anthropic(6.00, 3600),
            "deepseek" => PriceModel {
                cache_write_per_million: 0.27,
                cache: CacheModel {
                    min_prefix_tokens: 64,
                    granularity_tokens: 64,
                    lifetime_secs: 3 * 3600,
                    automatic: true,
                },
                ..PriceModel::new("", 0.27, 0.07, 1.10)
            },
            "none" => PriceModel {
                cached_input_per_million: 2.00,
                cache: CacheModel {
                    min_prefix_tokens: u64::MAX,
                    ..CacheModel::default()
                },
                ..base
            },
            _ => return None,
        };
        name.clone_into(&mut model.name);
        Some(model)
    }

    /// The cost of one call: `prompt` tokens of which `cached` were served
    /// from the cache and `written` (of the rest) were written to it (see
    /// [`CacheLookup::written_tokens`]), and `output` completion tokens.
    /// Written tokens are billed at the cache-write price, the other
    /// uncached ones at the input price.
    pub fn cost(&self, prompt: u64, cached: u64, written: u64, output: u64) -> f64 {
        self.cost_parts(prompt, cached, written, 0, output).total()
    }

    /// [`cost`](Self::cost) split by what the tokens were billed as: of
    /// the `prompt - cached` uncached tokens, `resent` (at most all of
    /// them) are content an earlier request had cached and an edit before
    /// it made the provider read again (see
    /// [`CacheLookup::resent_tokens`]); the rest is new content. Re-sent
    /// content comes first, so it is the first written.
    pub fn cost_parts(
        &self,
        prompt: u64,
        cached: u64,
        written: u64,
        resent: u64,
        output: u64,
    ) -> CostParts {
        let cached = cached.min(prompt);
        let uncached = prompt - cached;
        let written = written.min(uncached);
        let resent = resent.min(uncached);
        let per = |tokens: u64, price: f64| tokens as f64 * price / 1_000_000.0;
        let bill = |written: u64, plain: u64| {
            per(written, self.cache_write_per_million) + per(plain, self.input_per_million)
        };
        // Re-sent content comes before new content, so it is written first.
        let resent_written = resent.min(written);
        CostParts {
            cached: per(cached, self.cached_input_per_million),
            new: bill(
                written - resent_written,
                uncached - written - (resent - resent_written),
            ),
            resent: bill(resent_written, resent - resent_written),
            output: per(output, self.output_per_million),
        }
    }

    /// What re-sending one cached token uncached costs more than reading
    /// it from the cache, per token: the price of a broken cache.
    pub fn miss_premium_per_token(&self) -> f64 {
        (self.cache_write_per_million - self.cached_input_per_million).max(0.0) / 1_000_000.0
    }

    /// What one token read from the cache costs, per token.
    pub fn cached_per_token(&self) -> f64 {
        self.cached_input_per_million / 1_000_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_are_billed_at_the_cached_price() {
        let p = PriceModel::new("t", 2.0, 0.5, 8.0);
        assert_eq!(p.cost(1_000_000, 0, 1_000_000, 0), 2.0);
        assert_eq!(p.cost(1_000_000, 1_000_000, 0, 0), 0.5);
        assert_eq!(
            p.cost(1_000_000, 500_000, 500_000, 1_000_000),
            1.0 + 0.25 + 8.0
        );
        // A cache hit larger than the prompt is clamped, never negative.
        assert_eq!(p.cost(10, 20, 0, 0), 10.0 * 0.5 / 1_000_000.0);
    }

    #[test]
    fn anthropic_writes_cost_a_premium_and_what_is_not_written_the_input_price() {
        let p = PriceModel::preset("anthropic").unwrap();
        assert_eq!(p.name, "anthropic");
        assert!((p.cost(1_000_000, 0, 1_000_000, 0) - 3.75).abs() < 1e-9);
        assert!((p.cost(1_000_000, 1_000_000, 0, 0) - 0.30).abs() < 1e-9);
        // Past the last breakpoint (or under the minimum prefix) nothing is
        // written: the input price.
        assert!((p.cost(1_000_000, 0, 0, 0) - 3.0).abs() < 1e-9);
        assert!((p.cost(1_000_000, 0, 500_000, 0) - 3.375).abs() < 1e-9);
        let parts = p.cost_parts(1_000_000, 0, 500_000, 250_000, 0);
        assert!((parts.resent - 0.25 * 3.75).abs() < 1e-9);
        assert!((parts.total() - 3.375).abs() < 1e-9);
        assert_eq!(
            PriceModel::preset("anthropic-1h")
                .unwrap()
                .cache
                .lifetime_secs,
            3600
        );
    }

    #[test]
    fn every_preset_resolves_and_unknown_names_do_not() {
        for name in PRESETS {
            assert_eq!(PriceModel::preset(name).unwrap().name, *name);
        }
        assert!(PriceModel::preset("gpt-9").is_none());
        assert_eq!(PriceModel::preset("openai").unwrap(), PriceModel::default());
    }

    #[test]
    fn the_cache_serves_whole_steps_above_the_minimum() {
        let c = CacheModel::default();
        assert_eq!(c.servable(1023), 0);
        assert_eq!(c.servable(1024), 1024);
        assert_eq!(c.servable(1300), 1280);
        let none = PriceModel::preset("none").unwrap();
        assert_eq!(none.cache.servable(1_000_000), 0);
    }
}
