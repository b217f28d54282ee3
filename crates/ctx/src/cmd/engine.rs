//! The engine a command runs, as `config.yaml` and the flags select it:
//! configuration layers (defaults < file < `CTX_…` environment < `--set`),
//! the flags that name keys over them, then the library's
//! [`EngineBuilder`] (the one place a configuration becomes an engine, for
//! `ctx`, `ctx serve` and Python alike). Every command that runs an engine
//! (`compact`, `replay`, `serve`) flattens [`EngineArgs`], so a flag means
//! the same thing everywhere.

use std::path::PathBuf;

use context_engine::builder::{BuildError, EngineBuilder, Engines};
use context_engine::config::{ConfigLoader, Env, Loaded, SummarizerKind as ConfigSummarizer};
use context_engine::engine::ContextEngine;
use context_engine::message::Message;
use context_engine::summarize::openai::CallStats;
use context_engine::validate::Profile;

use crate::output::thousands;

/// Which summarizer writes compaction summaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SummarizerKind {
    /// Offline and deterministic, built from the messages themselves.
    Extractive,
    /// An OpenAI-compatible chat-completions endpoint (`--base-url`,
    /// `--summarizer-model`).
    Openai,
    /// `ctx serve` only: its own upstream, in the client's API, with the
    /// request's credential and model (or `--summarizer-model`).
    Upstream,
}

/// Flags that choose and configure the engine, shared by every command
/// that runs one.
#[derive(Clone, Debug, clap::Args)]
pub struct EngineArgs {
    /// The model's context window the engine manages, in tokens
    /// (default: `context.context_length`, else 128000; at least 1, and
    /// more than the system prompt). Given, it is the window of every
    /// request: `ctx serve` no longer takes a request's model's window
    /// from `context.model_windows`.
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

/// The process environment, read once per command: the library reads
/// none itself ([`Env`]).
pub fn process_env() -> Env {
    // Read once: every later reader (config layers, the builder, the
    // proxy's keys and tokens, the store's password) sees one snapshot.
    static ENV: std::sync::OnceLock<Env> = std::sync::OnceLock::new();
    ENV.get_or_init(|| Env::from_os(std::env::vars_os()))
        .clone()
}

impl EngineArgs {
    /// Loads the configuration layers (defaults < file < `CTX_…`
    /// environment < `--set`), then applies the flags that name keys
    /// (`--summarizer`, `--base-url`, …) over them: a flag means what its
    /// key means.
    pub fn load_config(&self) -> anyhow::Result<Loaded> {
        let mut loaded = ConfigLoader::new()
            .with_file(self.config.clone())
            .with_environment(&process_env())
            .with_overrides(self.set.iter().cloned())
            .load()?;
        let s = &mut loaded.config.summarizer;
        match self.summarizer {
            Some(SummarizerKind::Openai) => s.kind = ConfigSummarizer::Openai,
            Some(SummarizerKind::Extractive) => s.kind = ConfigSummarizer::Extractive,
            Some(SummarizerKind::Upstream) => s.kind = ConfigSummarizer::Upstream,
            None => {}
        }
        if let Some(url) = &self.base_url {
            s.base_url = Some(url.clone());
        }
        if let Some(model) = &self.summarizer_model {
            s.model = Some(model.clone());
        }
        if let Some(name) = &self.api_key_env {
            s.api_key_env = name.clone();
        }
        if let Some(n) = self.summarizer_context_length {
            s.context_length = Some(n);
        }
        if let Some(n) = self.max_output_tokens {
            s.max_output_tokens = Some(n);
        }
        if let Some(secs) = self.summarizer_timeout {
            s.timeout_seconds = secs;
        }
        Ok(loaded)
    }

    /// The engines of the configuration and flags, for the provider rules
    /// of `profile` ([`EngineBuilder`], the one place config becomes an
    /// engine), and the configuration's warnings.
    pub fn engines(&self, profile: Profile) -> anyhow::Result<(Engines, Vec<String>)> {
        let (builder, warnings) = self.builder(profile)?;
        Ok((builder.build().map_err(flagged)?, warnings))
    }

    /// The builder [`engines`](Self::engines) builds, for a command that
    /// adds what only it has (`ctx serve`'s upstream summarizer).
    pub fn builder(&self, profile: Profile) -> anyhow::Result<(EngineBuilder, Vec<String>)> {
        let mut loaded = self.load_config()?;
        let mut warnings: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        let s = &mut loaded.config.summarizer;
        // The old spelling: `ctx compact --model M` named the summary
        // model. Still honoured, once more, with a warning.
        if s.kind == ConfigSummarizer::Openai
            && s.model.is_none()
            && let Some(m) = &self.model.model
        {
            warnings.push(format!(
                "--model names the agent's model (the tokenizer); using `{m}` as the \
                 summary model too is deprecated: pass --summarizer-model {m}"
            ));
            s.model = Some(m.clone());
        }
        let builder = context_engine_adapters::builder(loaded)
            .with_env(process_env())
            .with_profile(profile)
            .with_model(self.model.model.clone())
            .with_context_length(self.context_length)
            .with_engine(self.engine.clone());
        Ok((builder, warnings))
    }

    /// The engine for `messages`: [`engines`](Self::engines), check that
    /// the window can hold the transcript's system prompt, start the
    /// engine, and print the configuration and selection warnings once.
    pub fn start(
        &self,
        profile: Profile,
        messages: &[Message],
    ) -> anyhow::Result<(Box<dyn ContextEngine>, Engines)> {
        let (engines, mut warnings) = self.engines(profile)?;
        engines.check_window(messages).map_err(flagged)?;
        let started = engines.engine().map_err(flagged)?;
        warnings.extend(started.warnings);
        for w in &warnings {
            eprintln!("ctx: warning: {w}");
        }
        Ok((started.engine, engines))
    }
}

/// A build error, worded for the command line: the flag that sets the key
/// is named beside it.
pub(crate) fn flagged(e: BuildError) -> anyhow::Error {
    let flag = match &e {
        BuildError::SummarizerSetting { key } => match *key {
            "summarizer.base_url" => Some("--base-url"),
            "summarizer.model" => Some("--summarizer-model"),
            _ => None,
        },
        BuildError::WindowTooSmall { .. } => Some("--context-length"),
        _ => None,
    };
    match flag {
        Some(flag) => anyhow::Error::new(e).context(flag),
        None => anyhow::Error::new(e),
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
