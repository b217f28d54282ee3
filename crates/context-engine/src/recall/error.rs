//! [`RecallError`]: why a tool call gave no answer, in words that say what
//! to do (the tools answer `{"error": …}` with its text).

use super::SEARCH_TOOL;

/// Why a recall, search or expand call gave no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecallError {
    /// No tool result or envelope block in the history has this handle.
    #[error("no tool result with handle `{handle}` in the stored history")]
    UnknownHandle {
        /// The handle asked for.
        handle: String,
    },
    /// Neither the history nor the session's archive has this handle.
    #[error(
        "no tool result, message or span with handle `{handle}` in the conversation or its archive; \
         use {SEARCH_TOOL} to find a handle"
    )]
    NotArchived {
        /// The handle asked for.
        handle: String,
    },
    /// The history given holds only the digest (a request view was passed
    /// instead of the stored history).
    #[error(
        "tool result `{handle}` (message {index}) is itself a digest; recall needs the stored history"
    )]
    Digested {
        /// The handle asked for.
        handle: String,
        /// Index of the digested message.
        index: usize,
    },
    /// The line range is empty or starts past the last line.
    #[error("lines {start}..={end} are out of range for `{handle}`, which has {lines} line(s)")]
    BadRange {
        /// The handle asked for.
        handle: String,
        /// First line asked for.
        start: usize,
        /// Last line asked for (the last line when open).
        end: usize,
        /// Lines in the body.
        lines: usize,
    },
    /// A continuation (`handle#n`) past the end of what the handle names.
    #[error("`{asked}`: the {what} has only {total} {unit}(s)")]
    PastEnd {
        /// The continuation asked for.
        asked: String,
        /// `text` or `span`.
        what: &'static str,
        /// Lines or messages it has.
        total: usize,
        /// `line` or `message`.
        unit: &'static str,
    },
    /// The `handle` argument is missing, empty or not a string.
    #[error(
        "`handle` must be a non-empty string (the handle a digest line, summary or search hit names)"
    )]
    MissingHandle,
    /// A continuation's part after `#` is not a positive number.
    #[error("`{asked}`: the part after # must be a positive number")]
    BadContinuation {
        /// The handle as given.
        asked: String,
    },
    /// A number argument (`start_line`, `end_line`, `limit`) is not a
    /// positive integer.
    #[error("`{key}` must be a positive integer")]
    NotPositive {
        /// The argument.
        key: &'static str,
    },
    /// The `lines` argument is not a range.
    #[error("`lines` must be a range like \"120-180\" or \"120\", not {given}")]
    BadLines {
        /// The value given, as JSON.
        given: String,
    },
    /// The `query` argument is missing or not a string.
    #[error("`query` must be a string of words to find")]
    MissingQuery,
    /// The query holds no letter or digit.
    #[error("`query` has no words to search for (give a file name, an error text or a command)")]
    EmptyQuery,
    /// The session store failed.
    #[error("the archive is unavailable: {detail}")]
    Archive {
        /// The store's error.
        detail: String,
    },
    /// A call to a tool this module does not answer.
    #[error("Unknown context engine tool: {name}")]
    UnknownTool {
        /// The tool's name.
        name: String,
    },
}

impl From<crate::store::StoreError> for RecallError {
    fn from(e: crate::store::StoreError) -> RecallError {
        RecallError::Archive {
            detail: e.to_string(),
        }
    }
}
