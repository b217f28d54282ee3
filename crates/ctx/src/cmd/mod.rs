//! One module per `ctx` command. Each exposes its `clap::Args` and a `run`
//! that returns the process exit code.

pub mod compact;
pub mod config;
pub mod digest;
pub mod engine;
pub mod inspect;
pub mod prune;
pub mod redact;
pub mod replay;
pub mod serve;
pub mod validate;

use std::path::{Path, PathBuf};

use anyhow::Context;
use context_engine::transcript::{Format, Transcript};

/// The transcript a command reads, shared by every command that reads one.
#[derive(Debug, clap::Args)]
pub struct Input {
    /// Transcript file: JSON array, mini-swe-agent, SWE-agent .traj or JSON Lines.
    pub file: PathBuf,
    /// Read the file as this format instead of detecting it
    /// (array, mini-swe-agent, swe-agent, jsonl).
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
