//! Errors an engine reports instead of a compacted transcript.

use thiserror::Error;

use super::types::BlockReason;
use crate::validate::Violation;

/// A boxed underlying cause (HTTP client error, I/O error, ...).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why [`compress`](super::ContextEngine::compress) produced no transcript.
///
/// Each variant names the engine so a host running plugins can tell the
/// user which one failed; the host keeps the uncompacted transcript.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The summary model call failed or returned nothing usable.
    #[error("engine `{engine}`: summarizer failed: {reason}")]
    Summarizer {
        /// Name of the failing engine.
        engine: String,
        /// What went wrong, for the user.
        reason: String,
        /// The cooldown the failure started, if the engine keeps one.
        cooldown_seconds: Option<u64>,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The engine produced a transcript the provider would reject.
    #[error(
        "engine `{engine}` produced an invalid transcript at message {}: {}: {}",
        violation.index,
        violation.rule,
        violation.detail
    )]
    InvalidOutput {
        /// Name of the failing engine.
        engine: String,
        /// The first rule the output breaks that the input kept (its index
        /// is in the output).
        violation: Violation,
    },
    /// A plugin engine failed internally (state load, index, ...).
    #[error("context engine plugin `{engine}` failed during {operation}: {reason}")]
    Plugin {
        /// Name of the failing engine.
        engine: String,
        /// The hook or step that failed (e.g. "compress", "load state").
        operation: String,
        /// What went wrong.
        reason: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// Everything is protected or already compact: nothing to do.
    #[error("engine `{engine}`: nothing to compress ({reason})")]
    NothingToCompress {
        /// Name of the engine.
        engine: String,
        /// Why (e.g. "all 8 messages are protected").
        reason: String,
    },
    /// A persisted state snapshot could not be restored (written by
    /// another engine or version, or edited by hand).
    #[error("engine `{engine}`: cannot restore its saved state: {reason}")]
    Restore {
        /// Name of the engine.
        engine: String,
        /// What is wrong with the snapshot.
        reason: String,
    },
    /// The compaction asked for a summary prepared in the background
    /// ([`SummarySource::Prepared`](super::SummarySource::Prepared)) and
    /// none is ready for this history.
    #[error("engine `{engine}`: the background summary is not ready")]
    SummaryNotReady {
        /// Name of the engine.
        engine: String,
    },
    /// The engine declined an unforced compaction.
    #[error("engine `{engine}`: compression blocked: {reason}")]
    Blocked {
        /// Name of the engine.
        engine: String,
        /// Why it declined.
        reason: BlockReason,
    },
}

impl EngineError {
    /// The name of the engine that reported the error.
    pub fn engine(&self) -> &str {
        match self {
            EngineError::Summarizer { engine, .. }
            | EngineError::InvalidOutput { engine, .. }
            | EngineError::Plugin { engine, .. }
            | EngineError::Restore { engine, .. }
            | EngineError::NothingToCompress { engine, .. }
            | EngineError::Blocked { engine, .. }
            | EngineError::SummaryNotReady { engine } => engine,
        }
    }

    /// Why, without the engine's name (for reports that name it already).
    pub fn reason(&self) -> String {
        match self {
            EngineError::Summarizer { reason, .. }
            | EngineError::Restore { reason, .. }
            | EngineError::NothingToCompress { reason, .. } => reason.clone(),
            EngineError::InvalidOutput { violation, .. } => violation.to_string(),
            EngineError::Plugin {
                operation, reason, ..
            } => format!("{operation}: {reason}"),
            EngineError::Blocked { reason, .. } => reason.to_string(),
            EngineError::SummaryNotReady { .. } => "the background summary is not ready".into(),
        }
    }
}
