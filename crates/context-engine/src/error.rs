//! [`Error`]: one type for every error the library's public API returns,
//! for callers that handle them together (`?` converts each module's own
//! error into it). The module errors stay the precise types; this one keeps
//! them intact (matchable, with their typed fields such as a
//! [`Violation`]), never flattened to text.

use thiserror::Error;

use crate::validate::Violation;

/// Any error of the library (see the module docs).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A transcript could not be read or parsed ([`crate::transcript`]).
    #[error(transparent)]
    Load(#[from] crate::transcript::LoadError),
    /// A transcript could not be written.
    #[error(transparent)]
    Write(#[from] crate::transcript::WriteError),
    /// A message has the wrong shape ([`crate::message`]).
    #[error(transparent)]
    Shape(#[from] crate::message::ShapeError),
    /// The configuration could not be loaded ([`crate::config`]).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// An engine produced no transcript ([`crate::engine`]).
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
    /// A usage record is malformed.
    #[error(transparent)]
    Usage(#[from] crate::engine::UsageError),
    /// An engine could not be selected or a plugin read ([`crate::plugin`]).
    #[error(transparent)]
    Plugin(#[from] crate::plugin::PluginError),
    /// A redactor could not be built ([`crate::redact`]).
    #[error(transparent)]
    Redact(#[from] crate::redact::RedactError),
    /// A configuration could not become an engine ([`crate::builder`]).
    #[error(transparent)]
    Build(#[from] crate::builder::BuildError),
    /// A replay run failed ([`crate::builder::Engines::replay`]).
    #[error(transparent)]
    Run(#[from] crate::builder::RunError),
    /// A session store failed: not found, a conflict, a locked, corrupt or
    /// newer file ([`crate::store`]).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The key of an encrypted session store.
    #[error(transparent)]
    StoreKey(#[from] crate::store::KeyError),
    /// A client-format request (Anthropic Messages, Responses) is malformed
    /// ([`crate::front`]).
    #[error(transparent)]
    Format(#[from] crate::anthropic::FormatError),
    /// A transcript has nothing between its protected head and tail
    /// ([`crate::compressor::Compressor::plan`]).
    #[error(transparent)]
    NothingToCut(#[from] crate::compressor::NothingToCut),
    /// A summarizer failed ([`crate::summarize`]).
    #[error(transparent)]
    Summarize(#[from] crate::summarize::SummarizeError),
    /// A recording cannot be replayed ([`crate::replay`]).
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
    /// Token counts could not be calibrated ([`crate::tokens`]).
    #[error(transparent)]
    Calibration(#[from] crate::tokens::CalibrationError),
    /// A `context_recall` call is malformed ([`crate::digest`]).
    #[error(transparent)]
    Recall(#[from] crate::recall::RecallError),
    /// A profile name is unknown ([`crate::validate`]).
    #[error(transparent)]
    Profile(#[from] crate::validate::UnknownProfile),
    /// A `context.text_actions` pattern is not a regular expression
    /// ([`crate::validate::TextActions`]).
    #[error(transparent)]
    TextActions(#[from] crate::validate::TextActionsError),
}

impl Error {
    /// The provider-rule violation this error carries, if any (an engine
    /// output that would break a rule its input kept).
    pub fn violation(&self) -> Option<&Violation> {
        match self {
            Error::Engine(crate::engine::EngineError::InvalidOutput { violation, .. }) => {
                Some(violation)
            }
            _ => None,
        }
    }
}

/// A `Result` with the library's [`Error`](enum@Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::Rule;

    #[test]
    fn module_errors_convert_and_stay_typed() {
        fn engine() -> Result<()> {
            Err(crate::engine::EngineError::InvalidOutput {
                engine: "x".into(),
                violation: Violation::new(3, Rule::OrphanToolResult, "no call c1"),
            })?;
            Ok(())
        }
        let err = engine().unwrap_err();
        assert_eq!(
            err.violation().map(|v| (v.index, v.rule)),
            Some((3, Rule::OrphanToolResult))
        );
        assert!(
            err.to_string()
                .contains("message 3: orphan-tool-result: no call c1")
        );
        let err: Error = "nope"
            .parse::<crate::validate::Profile>()
            .unwrap_err()
            .into();
        assert!(err.violation().is_none());
        assert!(matches!(err, Error::Profile(_)));
        let err: Error = crate::store::StoreError::NotFound {
            what: "handle `h1`".into(),
        }
        .into();
        assert!(matches!(err, Error::Store(_)));
        assert_eq!(err.to_string(), "handle `h1` not found in the store");
    }

    #[test]
    fn chain_names_each_text_once() {
        let io = std::io::Error::other("disk on fire");
        let err = crate::plugin::PluginError::Io {
            path: "/p/plugin.yaml".into(),
            source: io,
        };
        let text = crate::error_chain(&err);
        assert_eq!(text.matches("disk on fire").count(), 1, "{text}");
        assert!(text.contains("/p/plugin.yaml"), "{text}");
    }
}
