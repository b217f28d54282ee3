//! Why a plugin process did not start, and the `initialize` answer it
//! gave when it did: the protocol's side of a start, shared by every host
//! (the process host is `context-engine-plugin-host`).

use std::collections::BTreeSet;

use serde_json::Value;

use super::answer::{Refusal, RefusalReason, decode_object};
use super::events::FailureKind;
use super::hook::Hook;
use super::wire::{InitializeResult, InitializeVersion, PROTOCOL_VERSION};

/// Why a plugin process could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The program could not be run.
    #[error("cannot start `{}`: {source}", program.display())]
    Program {
        /// The program, as resolved.
        program: std::path::PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The process came without the pipes it was given.
    #[error("the process has no piped stdio")]
    NoPipes,
}

/// Why a plugin process did not start (spawn, `initialize`, or the replay
/// of `on_session_start` after a restart).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The process could not be started.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The `initialize` params could not be encoded.
    #[error("cannot encode initialize: {0}")]
    Encode(serde_json::Error),
    /// The process failed the call (crashed, hung, wrote garbage).
    #[error("{method}: {detail}")]
    Call {
        /// `initialize` or the `on_session_start` replay.
        method: &'static str,
        /// How it failed.
        kind: FailureKind,
        /// What happened.
        detail: String,
    },
    /// `initialize` answered a JSON-RPC error.
    #[error("initialize answered error {code}: {message}")]
    Remote {
        /// The error code.
        code: i64,
        /// The plugin's message.
        message: String,
    },
    /// The `initialize` answer was refused.
    #[error(transparent)]
    Answer(#[from] Refusal),
}

impl StartError {
    /// How the start failed, as events and status name it.
    pub fn kind(&self) -> FailureKind {
        match self {
            StartError::Call { kind, .. } => *kind,
            StartError::Answer(_) => FailureKind::InvalidResult,
            StartError::Spawn(_) | StartError::Encode(_) | StartError::Remote { .. } => {
                FailureKind::Startup
            }
        }
    }
}

/// What `initialize` declared.
#[derive(Debug, Default)]
pub struct Init {
    /// The name the plugin gave itself.
    pub name: Option<String>,
    /// The hooks it declared that this host knows.
    pub capabilities: BTreeSet<Hook>,
    /// The hooks it declared that this host does not know.
    pub unknown_hooks: Vec<String>,
    /// The tool schemas it offers.
    pub tools: Vec<Value>,
}

/// Reads the `initialize` answer: the protocol version first (a plugin of
/// another version may shape the rest differently), then the rest.
pub fn parse_initialize(result: &Value) -> Result<Init, Refusal> {
    const METHOD: &str = "initialize";
    let version = decode_object::<InitializeVersion>(METHOD, result)?.protocol_version;
    if version != Some(PROTOCOL_VERSION) {
        return Err(Refusal::new(
            METHOD,
            RefusalReason::Version { found: version },
        ));
    }
    let answer: InitializeResult = decode_object(METHOD, result)?;
    let mut capabilities = BTreeSet::new();
    let mut unknown_hooks = Vec::new();
    for name in answer.capabilities.unwrap_or_default() {
        match name.parse::<Hook>() {
            Ok(hook) => {
                capabilities.insert(hook);
            }
            Err(_) => unknown_hooks.push(name),
        }
    }
    Ok(Init {
        name: answer.name,
        capabilities,
        unknown_hooks,
        tools: answer
            .tools
            .unwrap_or_default()
            .into_iter()
            .map(Value::Object)
            .collect(),
    })
}

/// `value` as JSON, clipped to 120 characters for messages.
pub fn clip_json(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn initialize_answer_is_checked() {
        let ok = parse_initialize(&json!({
            "name": "x", "protocol_version": 1,
            "capabilities": ["compress", "get_status", "telepathy"],
            "tools": [{"type": "function"}],
        }))
        .unwrap();
        assert!(ok.capabilities.contains(&Hook::Compress));
        assert_eq!(ok.unknown_hooks, vec!["telepathy"]);
        assert_eq!(ok.tools.len(), 1);
        assert_eq!(ok.name.as_deref(), Some("x"));
        let refused = |answer: Value| parse_initialize(&answer).unwrap_err().to_string();
        let text = refused(json!({"protocol_version": 2, "capabilities": [{"v2": true}]}));
        assert!(
            text.contains("speaks protocol version 2, this host speaks 1"),
            "{text}"
        );
        let text = refused(json!({"protocol_version": 1, "capabilities": "compress"}));
        assert!(
            text.contains("`initialize` answer: at `capabilities`"),
            "{text}"
        );
        let text = refused(json!({"protocol_version": 1, "capabilities": ["compress", 7]}));
        assert!(text.contains("at `capabilities[1]`"), "{text}");
        let text = refused(json!({"protocol_version": 1, "tools": [{"type": "function"}, "x"]}));
        assert!(text.contains("at `tools[1]`"), "{text}");
        let text = refused(json!({"protocol_version": 1, "name": 3}));
        assert!(text.contains("at `name`"), "{text}");
        let text = refused(json!({"protocol_version": "1"}));
        assert!(text.contains("at `protocol_version`"), "{text}");
        let text = refused(json!([1]));
        assert!(text.contains("`initialize` answer: "), "{text}");
        assert!(text.contains("(got [1])"), "{text}");
    }
}
