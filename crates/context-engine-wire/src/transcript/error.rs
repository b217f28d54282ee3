//! Errors of [`super::Transcript`] loading and writing.
//!
//! Every error names its source (file path or the name given to
//! [`super::Transcript::parse`]) and says where in it things went wrong, so
//! that a user can open the file at the right place.

use std::io;
use std::path::PathBuf;

use crate::message::ShapeError;

/// Why a transcript could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("{}: cannot read: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
    /// Nothing but whitespace.
    #[error("{source_name}: empty input (expected JSON or JSON Lines messages)")]
    Empty {
        /// File path or caller-given name.
        source_name: String,
    },
    /// The input is not UTF-8 (JSON must be): likely a binary or a
    /// differently encoded file.
    #[error("{source_name}: not UTF-8: invalid byte at offset {byte}")]
    NotUtf8 {
        /// File path or caller-given name.
        source_name: String,
        /// Offset of the first byte that is not valid UTF-8.
        byte: usize,
    },
    /// JSON syntax error, truncated input, or nesting deeper than
    /// serde_json's recursion limit.
    #[error("{source_name}: line {line}, column {column}: {message}")]
    Json {
        /// File path or caller-given name.
        source_name: String,
        /// 1-based line in the file (for JSON Lines too).
        line: usize,
        /// 1-based column within that line.
        column: usize,
        /// serde_json's description, without its position suffix.
        message: String,
        /// Whether the input ended in the middle of a value.
        truncated: bool,
    },
    /// A message is not a message object.
    #[error("{source_name}: message {index}{}: {error}", at_line(*line))]
    Shape {
        /// File path or caller-given name.
        source_name: String,
        /// 0-based index in the message list.
        index: usize,
        /// For JSON Lines, the 1-based line of the file.
        line: Option<usize>,
        /// What is wrong with it.
        error: ShapeError,
    },
    /// The top-level value is not what the (detected or requested) format
    /// needs.
    #[error("{source_name}: expected {expected}, found {found}")]
    UnexpectedTopLevel {
        /// File path or caller-given name.
        source_name: String,
        /// What the format needs.
        expected: &'static str,
        /// What was there (`keys a, b, c` for an object).
        found: String,
    },
    /// An Anthropic, Responses or agent-session-log input that is not
    /// what its format needs.
    #[error("{source_name}{}: {error}", at_line(*line))]
    Format {
        /// File path or caller-given name.
        source_name: String,
        /// For session logs, the 1-based line of the file.
        line: Option<usize>,
        /// What is wrong, and where in the request.
        error: crate::anthropic::FormatError,
    },
    /// The envelope's `messages`/`history` key holds something else than an
    /// array.
    #[error("{source_name}: field `{field}` must be an array of messages, found {found}")]
    NotAnArray {
        /// File path or caller-given name.
        source_name: String,
        /// `messages` or `history`.
        field: &'static str,
        /// The JSON type found.
        found: &'static str,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
}

impl LoadError {
    /// The index of the offending message, for shape errors.
    pub fn message_index(&self) -> Option<usize> {
        match self {
            LoadError::Shape { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// The offending field, when the error is about one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            LoadError::Shape { error, .. } => error.field(),
            LoadError::NotAnArray { field, .. } => Some(field),
            _ => None,
        }
    }

    /// The 1-based line of the file the error is on, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            LoadError::Json { line, .. } => Some(*line),
            LoadError::Shape { line, .. } => *line,
            _ => None,
        }
    }
}

/// Why a transcript could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot write: {error}", path.display())]
pub struct WriteError {
    /// The file.
    pub path: PathBuf,
    /// What the OS said.
    pub error: io::Error,
}

/// An unknown [`super::Format`] name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown transcript format `{0}` (expected one of: array, mini-swe-agent, swe-agent, jsonl, anthropic, responses, claude-code, codex)"
)]
pub struct ParseFormatError(pub String);
