//! [`Supervisor`]: the life of a plugin process, apart from what the engine
//! does with its answers. It spawns and initializes the process, sends one
//! request at a time, records what happened ([`PluginEvent`]s, redacted),
//! and on a failure kills the process, counts the failure and schedules the
//! restart with backoff; after `max_failures` in a row it reports itself
//! [`exhausted`](Supervisor::exhausted) so the adapter fails over to the
//! built-in compressor.

use std::collections::VecDeque;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::rpc::{CallError, Connection};
use context_engine::plugin::Hook;
use context_engine::plugin::PluginManifest;
use context_engine::plugin::start::{Init, StartError, parse_initialize};
use context_engine::plugin::wire::{InitializeParams, SessionStartParams};
use context_engine::plugin::{EventKind, FailureKind, PluginEvent};
use context_engine::redact::Egress;

/// Events kept; older ones are dropped.
const MAX_EVENTS: usize = 1000;

/// Why a call produced no usable answer.
#[derive(Debug)]
pub(crate) enum Skip {
    /// No process (restart backoff, or the plugin was given up on).
    Unavailable(String),
    /// The process failed; it was killed and the failure recorded.
    Failed(String),
    /// The plugin answered a JSON-RPC error.
    Remote { code: i64, message: String },
}

impl Skip {
    pub(crate) fn reason(&self) -> String {
        match self {
            Skip::Unavailable(r) | Skip::Failed(r) => r.clone(),
            Skip::Remote { code, message } => format!("error {code}: {message}"),
        }
    }
}

/// The process and its record (see the module docs).
pub(crate) struct Supervisor {
    manifest: PluginManifest,
    egress: Egress,
    conn: Option<Connection>,
    init: Init,
    failures: u32,
    total_failures: u64,
    restart_at: Option<Instant>,
    events: VecDeque<PluginEvent>,
    pending_warnings: Vec<String>,
    warnings: Vec<String>,
    session_start: Option<SessionStartParams>,
    starts: u64,
}

impl Supervisor {
    /// A supervisor for `manifest`'s plugin; nothing runs yet. Log lines
    /// and failure details are redacted with `egress`.
    pub(crate) fn new(manifest: PluginManifest, egress: Egress) -> Supervisor {
        Supervisor {
            manifest,
            egress,
            conn: None,
            init: Init::default(),
            failures: 0,
            total_failures: 0,
            restart_at: None,
            events: VecDeque::new(),
            pending_warnings: Vec::new(),
            warnings: Vec::new(),
            session_start: None,
            starts: 0,
        }
    }

    pub(crate) fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    pub(crate) fn declares(&self, hook: Hook) -> bool {
        self.init.capabilities.contains(&hook)
    }

    pub(crate) fn capabilities(&self) -> impl Iterator<Item = Hook> + '_ {
        self.init.capabilities.iter().copied()
    }

    pub(crate) fn tools(&self) -> &[Value] {
        &self.init.tools
    }

    pub(crate) fn remote_name(&self) -> Option<&str> {
        self.init.name.as_deref()
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.conn.as_ref().map(Connection::pid)
    }

    pub(crate) fn running(&self) -> bool {
        self.conn.is_some()
    }

    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    pub(crate) fn total_failures(&self) -> u64 {
        self.total_failures
    }

    pub(crate) fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Whether failures in a row reached the manifest's `max_failures`.
    pub(crate) fn exhausted(&self) -> bool {
        self.failures >= self.manifest.max_failures
    }

    /// Remembers `on_session_start`'s params, replayed after a restart.
    pub(crate) fn remember_session_start(&mut self, params: SessionStartParams) {
        self.session_start = Some(params);
    }

    pub(crate) fn push(&mut self, kind: EventKind, method: Option<&str>, detail: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(PluginEvent {
            kind,
            method: method.map(str::to_owned),
            detail,
        });
    }

    /// A warning for the user, kept for status and handed out once.
    pub(crate) fn warn(&mut self, text: String) {
        self.pending_warnings.push(text.clone());
        self.warnings.push(text);
    }

    pub(crate) fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.pending_warnings)
    }

    /// Every event so far, oldest first (output drained first).
    pub(crate) fn events(&mut self) -> Vec<PluginEvent> {
        self.drain_output();
        self.events.iter().cloned().collect()
    }

    /// The latest failure event, for the fail-over warning.
    pub(crate) fn last_failure(&self) -> Option<&PluginEvent> {
        self.events
            .iter()
            .rev()
            .find(|e| matches!(e.kind, EventKind::Failure(_)))
    }

    /// Moves the process's stderr lines and `log` notifications into the
    /// events, redacted.
    fn drain_output(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let stderr = conn.drain_stderr();
        let logs = conn.drain_logs();
        for line in stderr {
            let line = self.egress.string(&line);
            self.push(EventKind::Stderr, None, line);
        }
        for line in logs {
            let line = self.egress.string(&line);
            self.push(EventKind::Log, None, line);
        }
    }

    /// Starts (or restarts) the process and runs `initialize`; on failure
    /// the process is killed, the failure recorded as an event, and the
    /// reason returned.
    pub(crate) fn start(&mut self, init: &InitializeParams<'_>) -> Result<(), StartError> {
        self.kill();
        self.connect(init).inspect_err(|error| {
            self.drain_output();
            self.kill();
            let detail = self.egress.string(&error.to_string());
            self.push(EventKind::Failure(error.kind()), Some("initialize"), detail);
        })
    }

    /// Spawns the process and runs `initialize` (and replays
    /// `on_session_start` after a restart).
    fn connect(&mut self, params: &InitializeParams<'_>) -> Result<(), StartError> {
        let mut conn = Connection::spawn(&self.manifest)?;
        let params = serde_json::to_value(params).map_err(StartError::Encode)?;
        let answer = conn.call("initialize", params, self.manifest.timeouts.startup());
        self.conn = Some(conn);
        self.drain_output();
        let result = match answer {
            Ok(v) => v,
            Err(CallError::Failure(kind, detail)) => {
                return Err(StartError::Call {
                    method: "initialize",
                    kind,
                    detail,
                });
            }
            Err(CallError::Remote { code, message }) => {
                return Err(StartError::Remote { code, message });
            }
        };
        let init = parse_initialize(&result)?;
        let unknown = init.unknown_hooks.first().cloned();
        self.init = init;
        self.starts += 1;
        let pid = self.pid().unwrap_or(0);
        let names: Vec<&str> = self.capabilities().map(Hook::as_str).collect();
        self.push(
            EventKind::Started,
            Some("initialize"),
            format!("pid {pid}, capabilities: {names:?}"),
        );
        if let Some(unknown) = unknown {
            self.push(
                EventKind::Log,
                Some("initialize"),
                format!("ignoring unknown capability `{unknown}`"),
            );
        }
        if self.starts > 1
            && self.declares(Hook::OnSessionStart)
            && let Some(params) = &self.session_start
            && let Ok(params) = serde_json::to_value(params)
            && let Some(conn) = self.conn.as_mut()
        {
            let hook = Hook::OnSessionStart.as_str();
            match conn.call(hook, params, self.manifest.timeouts.call()) {
                Ok(_) | Err(CallError::Remote { .. }) => {}
                Err(CallError::Failure(kind, detail)) => {
                    return Err(StartError::Call {
                        method: "on_session_start replay",
                        kind,
                        detail,
                    });
                }
            }
        }
        Ok(())
    }

    /// One request: (re)starts the process when due (with `init` as the
    /// `initialize` params), and records the failure.
    pub(crate) fn call<P: Serialize>(
        &mut self,
        hook: Hook,
        params: &P,
        timeout: Duration,
        init: &InitializeParams<'_>,
    ) -> Result<Value, Skip> {
        let method = hook.as_str();
        let params = serde_json::to_value(params)
            .map_err(|e| Skip::Failed(format!("cannot encode {method}: {e}")))?;
        if self.conn.is_none() {
            if let Some(at) = self.restart_at
                && Instant::now() < at
            {
                return Err(Skip::Unavailable(
                    "waiting to restart the plugin process".to_owned(),
                ));
            }
            if let Err(error) = self.connect(init) {
                let detail = error.to_string();
                self.record_failure(method, error.kind(), &detail);
                return Err(Skip::Failed(detail));
            }
        }
        self.exchange(method, params, timeout)
    }

    fn exchange(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, Skip> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(Skip::Unavailable("no process".to_owned()));
        };
        let answer = conn.call(method, params, timeout);
        self.drain_output();
        match answer {
            Ok(v) => {
                self.failures = 0;
                self.restart_at = None;
                Ok(v)
            }
            Err(CallError::Remote { code, message }) => {
                self.failures = 0;
                let detail = format!("error {code}: {}", self.egress.string(&message));
                self.push(EventKind::RemoteError, Some(method), detail);
                Err(Skip::Remote { code, message })
            }
            Err(CallError::Failure(kind, detail)) => {
                self.record_failure(method, kind, &detail);
                Err(Skip::Failed(format!("{kind}: {detail}")))
            }
        }
    }

    /// Kills the process, counts the failure and schedules the restart.
    pub(crate) fn record_failure(&mut self, method: &str, kind: FailureKind, detail: &str) {
        self.drain_output();
        self.kill();
        self.failures = self.failures.saturating_add(1);
        self.total_failures = self.total_failures.saturating_add(1);
        self.restart_at = Some(Instant::now() + self.manifest.timeouts.backoff(self.failures));
        let detail = self.egress.string(detail);
        self.push(EventKind::Failure(kind), Some(method), detail);
    }

    /// Kills the process, if one runs.
    pub(crate) fn kill(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.kill();
        }
    }

    /// Stops the process politely within `timeout`, killing it past that.
    /// The exit status when it left by itself.
    pub(crate) fn shutdown(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.drain_output();
        let conn = self.conn.take()?;
        let status = conn.shutdown(timeout);
        let detail = match status {
            Some(s) => format!("exited ({s})"),
            None => "killed".to_owned(),
        };
        self.push(EventKind::Stopped, Some("shutdown"), detail);
        status
    }

    /// Stops the process on drop, without recording it.
    pub(crate) fn stop_quietly(&mut self, timeout: Duration) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.shutdown(timeout);
        }
    }
}
