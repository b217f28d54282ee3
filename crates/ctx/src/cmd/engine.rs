//! The engine a command runs, as `config.yaml` and the flags select it:
//! configuration layers (defaults < file < `CTX_…` environment < `--set`),
//! then the tokenizer and window, then the engine registry (built-in or
//! plugin, with fallback), then the summarizer (extractive, or an
//! OpenAI-compatible endpoint). Every command that runs an engine
//! (`compact`, `replay`) flattens [`EngineArgs`], so a flag means the same
//! thing everywhere.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use context_engine::config::{Config, ConfigLoader, SummarizerKind as ConfigSummarizer};
use context_engine::engine::{ContextEngine, ModelInfo};
use context_engine::message::Message;
use context_engine::plugin::{EngineContext, EngineSource, select_engine};
use context_engine::redact::Redactor;
use context_engine::summarize::openai::{CallStats, OpenAiConfig, OpenAiSummarizer};
use context_engine::tokens::TokenCounter;
use context_engine::validate::Profile;

use crate::output::thousands;

/// Window used when neither `--context-length` nor `context.context_length`
/// gives one.
pub const DEFAULT_CONTEXT_LENGTH: u64 = 128_000;

/// Which summarizer writes compaction summaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SummarizerKind {
    /// Offline and deterministic, built from the messages themselves.
    Extractive,
    /// An OpenAI-compatible chat-completions endpoint (`--base-url`,
    /// `--summarizer-model`).
    Openai,
}

/// Flags that choose and configure the engine, shared by every command
/// that runs one.
#[derive(Clone, Debug, clap::Args)]
pub struct EngineArgs {
    /// The model's context window the engine manages, in tokens
    /// (default: `context.context_length`, else 128000; at least 1, and
    /// more than the system prompt).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub context_length: Option<u64>,
    #[command(flatten)]
    pub model: super::ModelArg,
    /// Configuration file (else $CTX_CONFIG, ./config.yaml, the user config dir).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Override one configuration key, e.g. `--set context.threshold_percent=0.6`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Engine by name: built-in `compressor`, or a plugin folder found in
    /// `plugins.dirs` (overrides `context.engine`).
    #[arg(long)]
    pub engine: Option<String>,
    /// Who writes compaction summaries (overrides `summarizer.kind`).
    #[arg(long, value_enum)]
    pub summarizer: Option<SummarizerKind>,
    /// Base URL of the OpenAI-compatible summarizer endpoint
    /// (e.g. http://127.0.0.1:8080/v1; overrides `summarizer.base_url`).
    #[arg(long)]
    pub base_url: Option<String>,
    /// The summary model's name (overrides `summarizer.model`).
    #[arg(long)]
    pub summarizer_model: Option<String>,
    /// Environment variable holding the summarizer's API key, sent as a
    /// Bearer token; the key itself is never a flag (overrides
    /// `summarizer.api_key_env`).
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// The summary model's own window, in tokens: its input is bounded to
    /// fit (overrides `summarizer.context_length`; asked of the server when
    /// neither is given).
    #[arg(long)]
    pub summarizer_context_length: Option<u64>,
    /// Longest summary reply, in tokens (overrides `summarizer.max_output_tokens`).
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
    /// Seconds one summarizer call may take (overrides `summarizer.timeout_seconds`).
    #[arg(long)]
    pub summarizer_timeout: Option<u64>,
}

/// Everything an engine is made of, before it is selected: the caller may
/// still take the built-in compressor by its concrete type.
pub struct Prepared {
    /// The engine name asked for (flag, else `context.engine`).
    pub name: String,
    /// What the engine is built from.
    pub context: EngineContext,
    /// Folders searched for plugins, in order.
    pub plugin_dirs: Vec<PathBuf>,
    /// `context.engine_required`: no fallback to the compressor.
    pub required: bool,
    /// The tokenizer shared by engine and host.
    pub counter: Arc<dyn TokenCounter>,
    /// The window the engine manages.
    pub context_length: u64,
    /// The agent's model, when named.
    pub model: Option<String>,
    /// The OpenAI-compatible client, when one writes summaries (kept to
    /// read its call stats after a compaction).
    pub client: Option<Arc<OpenAiSummarizer>>,
    /// Configuration and flag warnings, to print once.
    pub warnings: Vec<String>,
}

impl Prepared {
    /// Another `Prepared` for one more engine of the same configuration,
    /// without reading the configuration again: the token counter (and its
    /// cache), the redactor and the summarizer client are shared.
    pub fn again(&self) -> Prepared {
        let c = &self.context;
        let mut context = EngineContext::new(Arc::clone(&self.counter), self.context_length)
            .with_compressor_options(c.compressor_options.clone())
            .with_section(c.section.clone());
        if let Some(redactor) = &c.redactor {
            context = context.with_redactor(Arc::clone(redactor));
        }
        if let Some(model) = &c.model {
            context = context.with_model(model.clone());
        }
        if let Some(client) = &self.client {
            context = context.with_summarizer(Box::new(Arc::clone(client)));
        }
        Prepared {
            name: self.name.clone(),
            context,
            plugin_dirs: self.plugin_dirs.clone(),
            required: self.required,
            counter: Arc::clone(&self.counter),
            context_length: self.context_length,
            model: self.model.clone(),
            client: self.client.clone(),
            warnings: Vec::new(),
        }
    }

    /// Selects the engine (built-in or plugin, with fallback) and sets its
    /// model; warnings from the selection are added to [`warnings`](Self::warnings).
    pub fn select(mut self) -> anyhow::Result<(Box<dyn ContextEngine>, Prepared)> {
        let context = std::mem::replace(
            &mut self.context,
            EngineContext::new(Arc::clone(&self.counter), self.context_length),
        );
        let selected = select_engine(&self.name, context, &self.plugin_dirs, self.required)
            .with_context(|| format!("cannot start engine `{}`", self.name))?;
        self.warnings.extend(selected.warnings);
        if let EngineSource::Plugin { manifest } = &selected.source {
            self.warnings.push(format!(
                "engine `{}` runs as a plugin process ({})",
                self.name,
                manifest.display()
            ));
        }
        let mut engine = selected.engine;
        self.apply_model(engine.as_mut());
        Ok((engine, self))
    }

    /// Tells the engine the model and window, when they differ from what it
    /// was built with (per-model thresholds apply from here).
    pub fn apply_model(&self, engine: &mut dyn ContextEngine) {
        if self.model.is_some() || engine.state().context_length != self.context_length {
            engine.update_model(&ModelInfo::new(
                self.model.clone().unwrap_or_default(),
                self.context_length,
            ));
        }
    }
}

impl EngineArgs {
    /// Loads the configuration layers; returns the config, its warnings and
    /// the file it came from.
    pub fn load_config(&self) -> anyhow::Result<(Config, Vec<String>, Option<PathBuf>)> {
        let loaded = ConfigLoader::new()
            .with_file(self.config.clone())
            .with_process_env()
            .with_overrides(self.set.iter().cloned())
            .load()?;
        let warnings = loaded.warnings.iter().map(ToString::to_string).collect();
        // How text-action observations are recognised holds for the process.
        context_engine::validate::set_text_actions(loaded.config.text_actions()?);
        Ok((loaded.config, warnings, loaded.file))
    }

    /// The engine for `messages`: [`prepare`](Self::prepare), check that
    /// the window can hold the transcript's system prompt, select the
    /// engine, and print the configuration and selection warnings once.
    pub fn start(
        &self,
        profile: Profile,
        messages: &[Message],
    ) -> anyhow::Result<(Box<dyn ContextEngine>, Prepared)> {
        let prepared = self.prepare(profile)?;
        super::check_window(messages, prepared.context_length, prepared.counter.as_ref())?;
        let (engine, prepared) = prepared.select()?;
        for w in &prepared.warnings {
            eprintln!("ctx: warning: {w}");
        }
        Ok((engine, prepared))
    }

    /// Reads the configuration and the flags into everything an engine is
    /// made of, for the provider rules of `profile`.
    pub fn prepare(&self, profile: Profile) -> anyhow::Result<Prepared> {
        let (config, mut warnings, config_file) = self.load_config()?;
        let counter = self.model.counter();
        let context_length = self
            .context_length
            .or(config.context.context_length)
            .unwrap_or(DEFAULT_CONTEXT_LENGTH);
        let name = self
            .engine
            .clone()
            .unwrap_or_else(|| config.context.engine.clone());
        let redactor = Arc::new(
            config
                .redactor()
                .context("invalid security.redact_patterns")?,
        );
        let mut context = EngineContext::new(Arc::clone(&counter), context_length)
            .with_compressor_options(config.compressor_options().with_profile(profile))
            .with_section(config.engine_section(&name))
            .with_redactor(Arc::clone(&redactor));
        if let Some(model) = &self.model.model {
            context = context.with_model(model.clone());
        }
        let client = self.summarizer(&config, redactor, &mut warnings)?;
        if let Some(client) = &client {
            context = context.with_summarizer(Box::new(Arc::clone(client)));
        }
        // Plugins: the configured folders, then next to the config file,
        // then the working directory (where `plugins/` of a project sits).
        let mut plugin_dirs = config.plugins.dirs.clone();
        if let Some(dir) = config_file.as_deref().and_then(|f| f.parent()) {
            plugin_dirs.push(dir.to_path_buf());
        }
        plugin_dirs.push(PathBuf::from("."));
        Ok(Prepared {
            name,
            context,
            plugin_dirs,
            required: config.context.engine_required,
            counter,
            context_length,
            model: self.model.model.clone(),
            client,
            warnings,
        })
    }

    /// The OpenAI-compatible client the flags or the configuration ask
    /// for; `None` keeps the engine's offline extractive summarizer.
    fn summarizer(
        &self,
        config: &Config,
        redactor: Arc<Redactor>,
        warnings: &mut Vec<String>,
    ) -> anyhow::Result<Option<Arc<OpenAiSummarizer>>> {
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
        let model = match (self.summarizer_model.as_deref(), s.model.as_deref()) {
            (Some(m), _) | (None, Some(m)) => m,
            // The old spelling: `ctx compact --model M` named the summary
            // model. Still honoured, once more, with a warning.
            (None, None) => {
                let m = self.model.model.as_deref().context(
                    "the openai summarizer needs --summarizer-model (or summarizer.model)",
                )?;
                warnings.push(format!(
                    "--model names the agent's model (the tokenizer); using `{m}` as the \
                     summary model too is deprecated: pass --summarizer-model {m}"
                ));
                m
            }
        };
        let key_env = self.api_key_env.as_deref().unwrap_or(&s.api_key_env);
        let mut cfg = OpenAiConfig::new(base_url, model)
            .with_api_key_env(key_env)
            .with_timeout(Duration::from_secs(
                self.summarizer_timeout.unwrap_or(s.timeout_seconds),
            ));
        if let Some(n) = self.summarizer_context_length.or(s.context_length) {
            cfg = cfg.with_context_length(n);
        }
        if let Some(n) = self.max_output_tokens.or(s.max_output_tokens) {
            cfg = cfg.with_max_output_tokens(n);
        }
        let summarizer = OpenAiSummarizer::new(cfg)
            .with_context(|| format!("cannot set up the summarizer at {base_url}"))?
            .with_redactor(redactor);
        Ok(Some(Arc::new(summarizer)))
    }
}

/// One summarizer call ([`CallStats`]: latency and tokens, as counted here
/// and as the server reported them) as one line of the text report.
pub fn call_line(call: &CallStats) -> String {
    let server = |n: Option<u64>| n.map_or_else(|| "?".to_owned(), thousands);
    format!(
        "{:.0} ms, {} attempt(s); prompt {} tokens (server), {} counted with margin; \
         reply {} tokens (server){}; window {} ({})",
        call.elapsed.as_secs_f64() * 1000.0,
        call.attempts,
        server(call.prompt_tokens),
        thousands(call.counted_prompt_tokens as u64),
        server(call.completion_tokens),
        call.max_tokens
            .map(|m| format!(", max {m}"))
            .unwrap_or_default(),
        call.window_tokens
            .map_or_else(|| "unbounded".to_owned(), thousands),
        call.window_source.describe(),
    )
}
