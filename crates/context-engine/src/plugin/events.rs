//! What happened to a plugin process, kept so hosts and tests can see why
//! a hook answered its fail-open default.

use std::fmt;

use serde::Serialize;

/// How a plugin failed a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The process could not be started or did not complete `initialize`.
    Startup,
    /// The process exited or closed its stdout.
    Crash,
    /// No answer within the deadline; the process was killed.
    Timeout,
    /// A line that is not a JSON-RPC 2.0 object.
    Malformed,
    /// An answer to another request.
    WrongId,
    /// A well-formed answer the host cannot accept (wrong shape, a
    /// transcript that breaks a provider rule or is not smaller).
    InvalidResult,
}

impl FailureKind {
    /// The snake-case name used in logs and status.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Startup => "startup",
            FailureKind::Crash => "crash",
            FailureKind::Timeout => "timeout",
            FailureKind::Malformed => "malformed",
            FailureKind::WrongId => "wrong_id",
            FailureKind::InvalidResult => "invalid_result",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a [`PluginEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "failure")]
pub enum EventKind {
    /// A process was started and answered `initialize`.
    Started,
    /// A call failed; the input was kept.
    Failure(FailureKind),
    /// The plugin answered a JSON-RPC error (it is healthy, the hook failed).
    RemoteError,
    /// A line the plugin wrote to stderr (redacted).
    Stderr,
    /// A `log` notification from the plugin (redacted).
    Log,
    /// Too many consecutive failures: the built-in compressor took over.
    Fallback,
    /// The process was shut down.
    Stopped,
}

/// One thing that happened to the plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PluginEvent {
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
    /// The hook being served, when there was one.
    pub method: Option<String>,
    /// Details for a human.
    pub detail: String,
}

impl fmt::Display for PluginEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            EventKind::Started => "started",
            EventKind::Failure(k) => k.as_str(),
            EventKind::RemoteError => "error",
            EventKind::Stderr => "stderr",
            EventKind::Log => "log",
            EventKind::Fallback => "fallback",
            EventKind::Stopped => "stopped",
        };
        match &self.method {
            Some(m) => write!(f, "{kind} in {m}: {}", self.detail),
            None => write!(f, "{kind}: {}", self.detail),
        }
    }
}
