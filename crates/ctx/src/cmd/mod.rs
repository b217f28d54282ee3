//! One module per `ctx` command. Each exposes its `clap::Args` and a `run`
//! that returns the process exit code.

pub mod compact;
pub mod digest;
pub mod inspect;
pub mod prune;
pub mod redact;
pub mod validate;

use std::path::Path;

use anyhow::Context;
use context_engine::transcript::{Format, Transcript};

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
