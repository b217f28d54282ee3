//! Reading a plugin's answers: each one decoded into its shape
//! ([`super::wire`]) and judged; what cannot be accepted is a typed
//! [`Refusal`] naming the method and, for a malformed answer, the path of
//! the field that is wrong (`messages[3]`, `state.threshold_tokens`).
//!
//! The adapter ([`super::ProcessEngine`]) treats every refusal as an
//! `invalid_result` failure: the input is kept, the failure recorded and
//! counted towards the fallback.

use serde::de::{DeserializeOwned, Unexpected};
use serde_json::Value;
use thiserror::Error;

use super::start::clip_json;
use super::wire::{SelectAnswer, StatePatch};
use crate::engine::{EngineState, PromptTokens};
use crate::message::Message;
use crate::validate::Violation;

/// Why a plugin's answer to a method was refused (the call counts as an
/// `invalid_result` failure and the host keeps its input).
#[derive(Debug, Error)]
#[error("`{method}` answer: {reason}")]
pub struct Refusal {
    /// The method answered (`compress`, `initialize`, ...).
    pub method: &'static str,
    /// What is wrong with the answer.
    pub reason: RefusalReason,
}

/// What is wrong with a refused answer ([`Refusal`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RefusalReason {
    /// The answer does not have the method's shape.
    #[error("{}{source}{}", at(path), got(answer))]
    Shape {
        /// Where in the answer (`messages[3]`, `state.threshold_tokens`);
        /// empty for the answer itself.
        path: String,
        /// What the field should have been.
        source: serde_json::Error,
        /// The answer, clipped, when the error is about the answer itself
        /// (a missing field, the wrong type).
        answer: Option<String>,
    },
    /// A transcript that breaks a provider rule its input kept.
    #[error("the result breaks a provider rule at {0}")]
    Violation(Violation),
    /// No messages for a non-empty input.
    #[error("the result is empty")]
    Empty,
    /// A compaction that saves nothing.
    #[error("the result is not smaller ({after} tokens, input {before})")]
    NotSmaller {
        /// Tokens of the input.
        before: u64,
        /// Tokens of the result.
        after: u64,
    },
    /// A prune that drops or adds messages.
    #[error("a prune keeps every message ({input} in, {output} out)")]
    PruneCount {
        /// Messages in.
        input: usize,
        /// Messages out.
        output: usize,
    },
    /// A prune that costs more tokens.
    #[error("the result is larger ({after} tokens, input {before})")]
    Larger {
        /// Tokens of the input.
        before: usize,
        /// Tokens of the result.
        after: usize,
    },
    /// `initialize` answered another protocol version.
    #[error(
        "the plugin speaks protocol version {}, this host speaks {}",
        found.map_or_else(|| "none".to_owned(), |v| v.to_string()),
        super::wire::PROTOCOL_VERSION
    )]
    Version {
        /// The version it answered, if any.
        found: Option<u64>,
    },
}

fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("at `{path}`: ")
    }
}

fn got(answer: &Option<String>) -> String {
    answer
        .as_ref()
        .map(|a| format!(" (got {a})"))
        .unwrap_or_default()
}

impl Refusal {
    /// A refusal of `method`'s answer for `reason`.
    pub fn new(method: &'static str, reason: RefusalReason) -> Refusal {
        Refusal { method, reason }
    }

    /// The broken provider rule, when that is the reason.
    pub fn violation(&self) -> Option<&Violation> {
        match &self.reason {
            RefusalReason::Violation(v) => Some(v),
            _ => None,
        }
    }

    /// The path of the malformed field (empty: the answer itself), when
    /// the answer did not have its shape.
    pub fn path(&self) -> Option<&str> {
        match &self.reason {
            RefusalReason::Shape { path, .. } => Some(path),
            _ => None,
        }
    }
}

/// `answer` read as `method`'s answer shape `T`.
pub fn decode<T: DeserializeOwned>(method: &'static str, answer: &Value) -> Result<T, Refusal> {
    serde_path_to_error::deserialize(answer).map_err(|e| {
        let root = e.path().iter().next().is_none();
        let path = if root {
            String::new()
        } else {
            e.path().to_string()
        };
        shape(method, path, e.into_inner(), answer)
    })
}

/// [`decode`] for an answer that is an object (or `null`, where `T` is an
/// `Option`): a list is refused, where serde would read it as the
/// object's fields in order.
pub fn decode_object<T: DeserializeOwned>(
    method: &'static str,
    answer: &Value,
) -> Result<T, Refusal> {
    if answer.is_array() {
        let source = serde::de::Error::invalid_type(Unexpected::Seq, &"an object");
        return Err(shape(method, String::new(), source, answer));
    }
    decode(method, answer)
}

fn shape(method: &'static str, path: String, source: serde_json::Error, answer: &Value) -> Refusal {
    let answer = path.is_empty().then(|| clip_json(answer));
    Refusal::new(
        method,
        RefusalReason::Shape {
            path,
            source,
            answer,
        },
    )
}

/// The `select_context` answer: `None` keeps the request; otherwise the
/// messages to send instead (`null`, `{"messages": null}`, a list or
/// `{"messages": [...]}`).
pub fn select_messages(
    method: &'static str,
    answer: &Value,
) -> Result<Option<Vec<Message>>, Refusal> {
    if answer.is_array() {
        return decode::<Vec<Message>>(method, answer).map(Some);
    }
    Ok(decode_object::<Option<SelectAnswer>>(method, answer)?.and_then(|a| a.messages))
}

/// Adopts the keys `patch` gives (see [`StatePatch`]).
pub fn apply_state(state: &mut EngineState, patch: &StatePatch) {
    match patch.last_prompt_tokens {
        Some(None) => state.last_prompt_tokens = PromptTokens::AwaitingRealUsage,
        Some(Some(n)) => state.last_prompt_tokens = PromptTokens::Known(n),
        None => {}
    }
    if let Some(n) = patch.threshold_tokens {
        state.threshold_tokens = n;
    }
    if let Some(n) = patch.context_length {
        state.context_length = n;
    }
    if let Some(n) = patch.compression_count {
        state.compression_count = n;
    }
    if let Some(p) = patch.threshold_percent {
        state.threshold_percent = p;
    }
    if let Some(n) = patch.protect_first_n {
        state.protect_first_n = n;
    }
    if let Some(n) = patch.protect_last_n {
        state.protect_last_n = n;
    }
}

#[cfg(test)]
mod tests;
