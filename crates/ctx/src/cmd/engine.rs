//! The engine a command runs, as `config.yaml` and the flags select it:
//! configuration layers (defaults < file < `CTX_…` environment < `--set`),
//! then the engine registry (built-in or plugin, with fallback), then the
//! summarizer (extractive, or an OpenAI-compatible endpoint).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use context_engine::config::{Config, ConfigLoader, SummarizerKind as ConfigSummarizer};
use context_engine::engine::ContextEngine;
use context_engine::plugin::{EngineContext, EngineSource, select_engine};
use context_engine::summarize::Summarizer;
use context_engine::tokens::TokenCounter;
use context_engine::validate::Profile;

use super::compact::{SummarizerKind, openai_client, openai_config};

/// Flags that choose and configure the engine.
#[derive(Clone, Debug, clap::Args)]
pub struct EngineArgs {
    /// Configuration file (else $CTX_CONFIG, ./config.yaml, the user config dir).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Override one configuration key, e.g. `--set context.threshold_percent=0.6`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Engine by name: built-in `compressor`, or a plugin under
    /// `plugins/context_engine/<name>/` (overrides `context.engine`).
    #[arg(long)]
    pub engine: Option<String>,
    /// Who writes compaction summaries (overrides `summarizer.kind`).
    #[arg(long, value_enum)]
    pub summarizer: Option<SummarizerKind>,
    /// Base URL of the OpenAI-compatible summarizer endpoint.
    #[arg(long)]
    pub base_url: Option<String>,
    /// Model name for the summarizer.
    #[arg(long)]
    pub summarizer_model: Option<String>,
    /// Environment variable holding the summarizer's API key.
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// The summary model's own window, in tokens: its input is bounded to
    /// fit (overrides `summarizer.context_length`).
    #[arg(long)]
    pub summarizer_context_length: Option<u64>,
    /// Longest summary reply, in tokens (overrides `summarizer.max_output_tokens`).
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
    /// Seconds one summarizer call may take (overrides `summarizer.timeout_seconds`).
    #[arg(long)]
    pub summarizer_timeout: Option<u64>,
}

/// The engine, ready to run, and what the user should know about it.
pub struct Built {
    pub engine: Box<dyn ContextEngine>,
    pub warnings: Vec<String>,
}

impl EngineArgs {
    /// Loads the configuration layers.
    pub fn load_config(&self) -> anyhow::Result<(Config, Vec<String>, Option<PathBuf>)> {
        let loaded = ConfigLoader::new()
            .with_file(self.config.clone())
            .with_process_env()
            .with_overrides(self.set.iter().cloned())
            .load()?;
        let warnings = loaded.warnings.iter().map(ToString::to_string).collect();
        Ok((loaded.config, warnings, loaded.file))
    }

    /// Builds the engine for a model window of `context_length` tokens.
    pub fn build(
        &self,
        config: Config,
        config_file: Option<PathBuf>,
        counter: Arc<dyn TokenCounter>,
        context_length: u64,
        profile: Profile,
    ) -> anyhow::Result<Built> {
        let name = self
            .engine
            .clone()
            .unwrap_or_else(|| config.context.engine.clone());
        let mut ctx = EngineContext::new(counter, context_length)
            .with_compressor_options(config.compressor_options().with_profile(profile))
            .with_section(config.engine_section(&name))
            .with_redact(config.security.redact_secrets)
            .with_redactor(Arc::new(
                config
                    .redactor()
                    .context("invalid security.redact_patterns")?,
            ));
        if let Some(summarizer) = self.summarizer(&config)? {
            ctx = ctx.with_summarizer(summarizer);
        }
        // Plugins: the configured folders, then next to the config file,
        // then the working directory (where `plugins/` of a project sits).
        let mut dirs = config.plugins.dirs.clone();
        if let Some(dir) = config_file.as_deref().and_then(|f| f.parent()) {
            dirs.push(dir.to_path_buf());
        }
        dirs.push(PathBuf::from("."));
        let selected = select_engine(&name, ctx, &dirs, config.context.engine_required)
            .with_context(|| format!("cannot start engine `{name}`"))?;
        let mut warnings = selected.warnings;
        if let EngineSource::Plugin { manifest } = &selected.source {
            warnings.push(format!(
                "engine `{name}` runs as a plugin process ({})",
                manifest.display()
            ));
        }
        Ok(Built {
            engine: selected.engine,
            warnings,
        })
    }

    /// The summarizer the flags or the configuration ask for; `None` keeps
    /// the engine's offline extractive one.
    fn summarizer(&self, config: &Config) -> anyhow::Result<Option<Box<dyn Summarizer>>> {
        let kind = match self.summarizer {
            Some(SummarizerKind::Openai) => ConfigSummarizer::Openai,
            Some(SummarizerKind::Extractive) => ConfigSummarizer::Extractive,
            None => config.summarizer.kind,
        };
        if kind != ConfigSummarizer::Openai {
            return Ok(None);
        }
        let s = &config.summarizer;
        let base_url = self
            .base_url
            .as_deref()
            .or(s.base_url.as_deref())
            .context("the openai summarizer needs --base-url (or summarizer.base_url)")?;
        let model = self
            .summarizer_model
            .as_deref()
            .or(s.model.as_deref())
            .context("the openai summarizer needs --summarizer-model (or summarizer.model)")?;
        let key_env = self.api_key_env.as_deref().unwrap_or(&s.api_key_env);
        let cfg = openai_config(
            base_url,
            model,
            key_env,
            self.summarizer_context_length.or(s.context_length),
            self.max_output_tokens.or(s.max_output_tokens),
        )
        .with_timeout(Duration::from_secs(
            self.summarizer_timeout.unwrap_or(s.timeout_seconds),
        ));
        Ok(Some(Box::new(openai_client(cfg)?)))
    }
}
