//! What the configuration schema (`config`, a leaf that imports no engine
//! module) means to the engine: each section converted into the options,
//! redactor, store policy and client settings it configures. Methods on
//! [`Config`] so that callers write `config.compressor_options()`.

use std::time::Duration;

use super::BuildError;
use crate::compressor::CompressorOptions;
use crate::config::{Config, Env, PricingConfig, SummarizerKind};
use crate::digest::DigestOptions;
use crate::pricing::PriceModel;
use crate::prune::PruneOptions;
use crate::redact::{RedactError, Redactor};
use crate::schedule::ScheduleOptions;
use crate::summarize::openai::OpenAiConfig;
use crate::validate::TextActions;

impl PricingConfig {
    /// The preset with the overrides applied; named `custom` when a price
    /// was overridden.
    pub fn price_model(&self) -> PriceModel {
        let mut p = PriceModel::preset(&self.provider).unwrap_or_default();
        let prices = [
            (self.input, &mut p.input_per_million),
            (self.cached_input, &mut p.cached_input_per_million),
            (self.cache_write, &mut p.cache_write_per_million),
            (self.output, &mut p.output_per_million),
        ];
        let mut custom = false;
        for (value, field) in prices {
            if let Some(v) = value {
                *field = v;
                custom = true;
            }
        }
        if custom {
            p.name = format!("{} (custom)", self.provider);
        }
        let cache = [
            (self.cache_min_prefix_tokens, &mut p.cache.min_prefix_tokens),
            (
                self.cache_granularity_tokens,
                &mut p.cache.granularity_tokens,
            ),
            (self.cache_lifetime_secs, &mut p.cache.lifetime_secs),
        ];
        for (value, field) in cache {
            if let Some(v) = value {
                *field = v;
            }
        }
        p
    }
}

impl Config {
    /// `context.text_actions` compiled; the default (`auto`) for a
    /// configuration built by hand with a pattern that does not compile
    /// (the loader refuses one, naming it).
    fn compiled_text_actions(&self) -> TextActions {
        self.text_actions().unwrap_or_default()
    }

    /// The digest options `context.digest` and `context.text_actions` set
    /// (`ctx digest`).
    pub fn digest_options(&self) -> DigestOptions {
        DigestOptions::from_config(&self.context.digest, self.compiled_text_actions())
    }

    /// The prune options `context.prune` and `context.text_actions` set
    /// (`ctx prune`).
    pub fn prune_options(&self) -> PruneOptions {
        PruneOptions::from_config(&self.context.prune, self.compiled_text_actions())
    }

    /// Options of the built-in `compressor` engine: threshold, protections,
    /// tail ratio, per-model thresholds, digest and prune from `context`;
    /// everything else at its default.
    pub fn compressor_options(&self) -> CompressorOptions {
        let c = &self.context;
        let actions = self.compiled_text_actions();
        CompressorOptions {
            threshold_percent: c.threshold_percent,
            protect_first_n: c.protect_first_n,
            protect_last_n: c.protect_last_n,
            tail_ratio: c.tail_ratio,
            model_thresholds: c.model_thresholds.clone(),
            digest: DigestOptions::from_config(&c.digest, actions.clone()),
            prune: PruneOptions::from_config(&c.prune, actions),
            schedule: ScheduleOptions::from_config(&c.schedule, self.pricing.price_model()),
            ..CompressorOptions::default()
        }
    }

    /// A redactor with `security.redact_secrets` and the user's
    /// `security.redact_patterns` (already checked by the loader, so this
    /// fails only for a `Config` built by hand).
    pub fn redactor(&self) -> Result<Redactor, RedactError> {
        Redactor::builder()
            .enabled(self.security.redact_secrets)
            .patterns(self.security.redact_patterns.iter().cloned())
            .build()
    }

    /// What the session store keeps ([`AtRest`](crate::store::AtRest)):
    /// texts redacted with the user's redactor (forced, as egress), unless
    /// `store.verbatim`; then encrypted with the key in the variable
    /// `store.encryption_key_env` names, when one is named. An error names
    /// a named variable that is unset or holds no 32-byte key.
    pub fn at_rest(&self, env: &Env) -> Result<crate::store::AtRest, BuildError> {
        let egress = crate::redact::Egress::new(Some(std::sync::Arc::new(self.redactor()?)));
        if !self.store.verbatim {
            return Ok(crate::store::AtRest::redacted(egress));
        }
        let seal = match self.store.encryption_key_env.as_deref() {
            Some(name) if !name.is_empty() => {
                Some(crate::store::Seal::from_var(name, env.get(name))?)
            }
            _ => None,
        };
        Ok(crate::store::AtRest::verbatim(egress, seal))
    }

    /// Settings of the OpenAI-compatible summarizer (endpoint, model, key
    /// variable, timeout, the summary model's window and reply cap), or `None` when `summarizer.kind` is not `openai`
    /// or `base_url` or `model` is missing.
    pub fn openai_config(&self) -> Option<OpenAiConfig> {
        let s = &self.summarizer;
        if s.kind != SummarizerKind::Openai {
            return None;
        }
        let (base_url, model) = (s.base_url.as_deref()?, s.model.as_deref()?);
        let mut config = OpenAiConfig::new(base_url, model)
            .with_api_key_env(s.api_key_env.clone())
            .with_timeout(Duration::from_secs(s.timeout_seconds));
        if let Some(n) = s.context_length {
            config = config.with_context_length(n);
        }
        if let Some(n) = s.max_output_tokens {
            config = config.with_max_output_tokens(n);
        }
        Some(config)
    }

    /// Settings of the upstream summarizer (`summarizer.kind: upstream`:
    /// `ctx serve` asks its own upstream): the model (empty: the
    /// request's), timeout, the summary model's window (unset: the
    /// session's) and reply cap; `None` for another kind. No window is
    /// asked of the server: the session's is known.
    pub fn upstream_summary_config(&self) -> Option<OpenAiConfig> {
        let s = &self.summarizer;
        if s.kind != SummarizerKind::Upstream {
            return None;
        }
        let mut config = OpenAiConfig::new("", s.model.clone().unwrap_or_default())
            .with_timeout(Duration::from_secs(s.timeout_seconds))
            .with_discover_window(false);
        if let Some(n) = s.context_length {
            config = config.with_context_length(n);
        }
        if let Some(n) = s.max_output_tokens {
            config = config.with_max_output_tokens(n);
        }
        Some(config)
    }
}
