//! Prices for the replay's cost estimate.

use serde::{Deserialize, Serialize};

/// Prices per million tokens. Cached input is what a provider bills for the
/// part of a prompt its prompt cache served.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PriceModel {
    /// What the prices are for (a model name, or "custom").
    pub name: String,
    /// Uncached input, per million tokens.
    pub input_per_million: f64,
    /// Cached input, per million tokens.
    pub cached_input_per_million: f64,
    /// Output, per million tokens.
    pub output_per_million: f64,
}

/// OpenAI's published list prices for gpt-4.1 (USD): a widely used model
/// with prompt caching, so that the default estimate is a realistic one.
impl Default for PriceModel {
    fn default() -> PriceModel {
        PriceModel::new("gpt-4.1", 2.00, 0.50, 8.00)
    }
}

impl PriceModel {
    /// Prices named `name`, per million tokens.
    pub fn new(name: impl Into<String>, input: f64, cached_input: f64, output: f64) -> PriceModel {
        PriceModel {
            name: name.into(),
            input_per_million: input,
            cached_input_per_million: cached_input,
            output_per_million: output,
        }
    }

    /// The cost of one call: `prompt` tokens of which `cached` were served
    /// from the cache, and `output` completion tokens.
    pub fn cost(&self, prompt: u64, cached: u64, output: u64) -> f64 {
        let cached = cached.min(prompt);
        ((prompt - cached) as f64 * self.input_per_million
            + cached as f64 * self.cached_input_per_million
            + output as f64 * self.output_per_million)
            / 1_000_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_are_billed_at_the_cached_price() {
        let p = PriceModel::new("t", 2.0, 0.5, 8.0);
        assert_eq!(p.cost(1_000_000, 0, 0), 2.0);
        assert_eq!(p.cost(1_000_000, 1_000_000, 0), 0.5);
        assert_eq!(p.cost(1_000_000, 500_000, 1_000_000), 1.0 + 0.25 + 8.0);
        // A cache hit larger than the prompt is clamped, never negative.
        assert_eq!(p.cost(10, 20, 0), 10.0 * 0.5 / 1_000_000.0);
    }
}
