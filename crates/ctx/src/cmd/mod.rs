//! One module per `ctx` command. Each exposes its `clap::Args` and a `run`
//! that returns the process exit code.

pub mod compact;
pub mod config;
pub mod demo;
pub mod digest;
pub mod engine;
pub mod inspect;
pub mod prune;
pub mod recall;
pub mod redact;
pub mod replay;
pub mod search;
pub mod serve;
pub mod validate;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use context_engine::config::ConfigLoader;
use context_engine::store::SessionStore;
use context_engine::tokens::{TokenCounter, counter_for};
use context_engine::transcript::{Format, Transcript};
use context_engine_sqlite::SqliteStore;

/// The agent's model, shared by every command that counts tokens: it picks
/// the tokenizer (through the library's one choice, [`counter_for`]) and,
/// for engines, the per-model threshold. Never the summary model: that is
/// `--summarizer-model`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ModelArg {
    /// The agent's model (e.g. gpt-4.1): picks the tokenizer; exact o200k
    /// when absent.
    #[arg(long)]
    pub model: Option<String>,
}

impl ModelArg {
    /// The token counter for the model.
    pub fn counter(&self) -> Arc<dyn TokenCounter> {
        counter_for(self.model.as_deref())
    }
}

/// The configuration of a command that runs no engine but reads
/// transcripts as the engine does (`digest`, `prune`, `inspect`): the same
/// layers, so `context.text_actions` and `context.digest` mean here what
/// they mean to the engine.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConfigArgs {
    /// Configuration file (else $CTX_CONFIG, ./config.yaml, the user config dir).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Override one configuration key, e.g. `--set context.text_actions=off`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ConfigArgs {
    /// The configuration layers; warnings printed once.
    pub fn load(&self) -> anyhow::Result<context_engine::config::Config> {
        let loaded = ConfigLoader::new()
            .with_file(self.config.clone())
            .with_environment(&engine::process_env())
            .with_overrides(self.set.iter().cloned())
            .load()?;
        for w in &loaded.warnings {
            eprintln!("ctx: warning: {w}");
        }
        Ok(loaded.config)
    }
}

/// The transcript a command reads, shared by every command that reads one.
#[derive(Debug, clap::Args)]
pub struct Input {
    /// Transcript file: JSON array, mini-swe-agent, SWE-agent .traj or JSON Lines.
    pub file: PathBuf,
    /// Read the file as this format instead of detecting it
    /// (array, mini-swe-agent, swe-agent, jsonl, anthropic, responses,
    /// claude-code, codex).
    #[arg(long)]
    pub format: Option<Format>,
}

impl Input {
    /// Loads the file (see [`load`]).
    pub fn load(&self) -> anyhow::Result<Transcript> {
        load(&self.file, self.format)
    }
}

/// Loads a transcript, auto-detected unless `format` is given, and reports
/// loader warnings on stderr.
pub fn load(path: &Path, format: Option<Format>) -> anyhow::Result<Transcript> {
    let transcript = match format {
        Some(f) => Transcript::load_as(path, f),
        None => Transcript::load(path),
    }
    .with_context(|| format!("cannot load transcript {}", path.display()))?;
    for warning in transcript.warnings() {
        eprintln!("ctx: warning: {}: {warning}", path.display());
    }
    Ok(transcript)
}

/// Where `ctx recall` and `ctx search` read the archive.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// The session store file (default: `store.path` from the configuration,
    /// else store.db in the user data folder).
    #[arg(long, value_name = "DB")]
    pub store: Option<PathBuf>,
}

impl StoreArgs {
    /// The store file: the flag, else the configuration's `store.path`,
    /// else the default in the user data folder.
    fn path_in(&self, config: &context_engine::config::Config) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.store {
            return Ok(p.clone());
        }
        config
            .store
            .resolved_path(&engine::process_env())
            .context("no store given: pass --store DB or set store.path")
    }

    /// The store, opened for reading (nothing is created or migrated),
    /// with the configuration's [`AtRest`](context_engine::store::AtRest)
    /// (whose key opens an encrypted store, whose redaction masks what is
    /// printed).
    pub fn open_read_only(
        &self,
    ) -> anyhow::Result<(
        Arc<dyn SessionStore>,
        PathBuf,
        context_engine::store::AtRest,
    )> {
        let env = engine::process_env();
        let config = ConfigLoader::new().with_environment(&env).load()?.config;
        let path = self.path_in(&config)?;
        let at_rest = config.at_rest(&env)?;
        let store = at_rest.wrap(Arc::new(SqliteStore::open_read_only(&path)?));
        Ok((store, path, at_rest))
    }
}

/// The store file at `path`, opened for writing as the configuration of
/// `engine` says it keeps texts at rest (redacted unless `store.verbatim`,
/// see [`context_engine::store::AtRest`]); a verbatim store without a key
/// is announced loudly.
pub fn open_store(
    path: &std::path::Path,
    engine: &engine::EngineArgs,
) -> anyhow::Result<Arc<dyn SessionStore>> {
    let config = engine.load_config()?.config;
    let at_rest = config.at_rest(&engine::process_env())?;
    if let Some(warning) = at_rest.warning() {
        eprintln!("ctx: WARNING: {warning}");
    }
    Ok(context_engine_sqlite::open_at_rest(path, &at_rest)?)
}
