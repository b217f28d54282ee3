//! [`ProcessEngine`]: a [`ContextEngine`] whose policy runs in another
//! process, in any language, behind the protocol of `docs/plugin-protocol.md`.
//!
//! The host keeps everything it must answer without I/O (the token state,
//! the tool schemas, the declared hooks) and treats the plugin as untrusted:
//! every answer is checked, and any failure leaves the input unchanged.

use std::borrow::Cow;
use std::cell::{OnceCell, RefCell};
use std::collections::{BTreeSet, VecDeque};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::events::{EventKind, FailureKind, PluginEvent};
use super::manifest::PluginManifest;
use super::rpc::{CallError, Connection};
use super::{EngineContext, PluginError};
use crate::compressor::{Compressor, CompressorOptions};
use crate::engine::{
    BlockReason, Compaction, CompressDecision, CompressRequest, ContextEngine, EngineError,
    EngineState, EngineStatus, ModelInfo, PromptTokens, SelectRequest, SessionInfo,
    ToolCallContext, TurnInfo, Usage, sanitize_memory_context, unknown_tool,
};
use crate::message::{Content, ContentPart, Message};
use crate::redact::{RedactOptions, redact};
use crate::summarize::Summarizer;
use crate::tokens::TokenCounter;
use crate::validate::{Profile, introduced_violation};

/// The protocol version this host speaks (sent in `initialize`; a plugin
/// answering another one is refused).
pub const PROTOCOL_VERSION: u64 = 1;

/// JSON-RPC error code a plugin answers `compress` with when there is
/// nothing to compress.
pub const ERROR_NOTHING_TO_COMPRESS: i64 = 1;
/// JSON-RPC error code a plugin answers `compress` with when it declines an
/// unforced compaction.
pub const ERROR_BLOCKED: i64 = 2;

/// Every optional hook a plugin may declare in `capabilities`.
pub const HOOKS: &[&str] = &[
    "update_from_response",
    "should_compress",
    "should_compress_info",
    "compress",
    "select_context",
    "prune_tool_results_only",
    "on_turn_complete",
    "should_compress_preflight",
    "should_defer_preflight_to_real_usage",
    "has_content_to_compress",
    "on_session_start",
    "on_session_end",
    "on_session_reset",
    "handle_tool_call",
    "get_status",
    "update_model",
];

/// Events kept; older ones are dropped.
const MAX_EVENTS: usize = 1000;

/// Standard status fields a plugin's `get_status` answer cannot override.
const STATUS_FIELDS: &[&str] = &[
    "last_prompt_tokens",
    "threshold_tokens",
    "context_length",
    "usage_percent",
    "compression_count",
    "awaiting_real_usage",
];

/// What the built-in fallback is made of, kept until it is needed.
struct FallbackParts {
    options: CompressorOptions,
    summarizer: Option<Box<dyn Summarizer>>,
    context_length: u64,
}

/// Why a call produced no usable answer.
enum Skip {
    /// No process (restart backoff, or the plugin was given up on).
    Unavailable(String),
    /// The process failed; it was killed and the failure recorded.
    Failed(String),
    /// The plugin answered a JSON-RPC error.
    Remote { code: i64, message: String },
}

impl Skip {
    fn reason(&self) -> String {
        match self {
            Skip::Unavailable(r) | Skip::Failed(r) => r.clone(),
            Skip::Remote { code, message } => format!("error {code}: {message}"),
        }
    }
}

/// Everything that changes through `&self` hooks (`should_compress` and
/// friends talk to the process too).
#[derive(Default)]
struct Inner {
    conn: Option<Connection>,
    capabilities: BTreeSet<String>,
    tools: Vec<Value>,
    remote_name: Option<String>,
    failures: u32,
    total_failures: u64,
    restart_at: Option<Instant>,
    events: VecDeque<PluginEvent>,
    pending_warnings: Vec<String>,
    warnings: Vec<String>,
    session_start: Option<Value>,
    starts: u64,
}

impl Inner {
    fn push(&mut self, kind: EventKind, method: Option<&str>, detail: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(PluginEvent {
            kind,
            method: method.map(str::to_owned),
            detail,
        });
    }

    fn warn(&mut self, text: String) {
        self.pending_warnings.push(text.clone());
        self.warnings.push(text);
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
            self.push(EventKind::Stderr, None, redact_text(&line));
        }
        for line in logs {
            self.push(EventKind::Log, None, redact_text(&line));
        }
    }
}

/// A context engine served by a plugin process (see the module docs).
///
/// Created by [`select_engine`](super::select_engine), or with
/// [`new`](Self::new) then [`start`](Self::start).
pub struct ProcessEngine {
    manifest: PluginManifest,
    section: Value,
    model: Option<String>,
    redact: bool,
    profile: Profile,
    counter: Arc<dyn TokenCounter>,
    state: EngineState,
    inner: RefCell<Inner>,
    parts: RefCell<Option<FallbackParts>>,
    fallback: OnceCell<Compressor>,
}

impl std::fmt::Debug for ProcessEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessEngine")
            .field("name", &self.manifest.name)
            .field("manifest", &self.manifest.path)
            .field("state", &self.state)
            .field("fallback", &self.fallback.get().is_some())
            .finish_non_exhaustive()
    }
}

impl ProcessEngine {
    /// An engine for the plugin of `manifest`; no process runs until
    /// [`start`](Self::start).
    pub fn new(manifest: PluginManifest, ctx: EngineContext) -> ProcessEngine {
        let options = ctx.compressor_options;
        let state = options.engine_state(ctx.context_length);
        ProcessEngine {
            manifest,
            section: ctx.section,
            model: ctx.model,
            redact: ctx.redact,
            profile: options.profile,
            counter: ctx.counter,
            state,
            inner: RefCell::new(Inner::default()),
            parts: RefCell::new(Some(FallbackParts {
                options,
                summarizer: ctx.summarizer,
                context_length: ctx.context_length,
            })),
            fallback: OnceCell::new(),
        }
    }

    /// Starts the process and runs `initialize`.
    pub fn start(&mut self) -> Result<(), PluginError> {
        let inner = self.inner.get_mut();
        if let Some(mut conn) = inner.conn.take() {
            conn.kill();
        }
        let mut inner = self.inner.borrow_mut();
        self.connect(&mut inner).map_err(|(kind, reason)| {
            inner.drain_output();
            if let Some(mut conn) = inner.conn.take() {
                conn.kill();
            }
            inner.push(
                EventKind::Failure(kind),
                Some("initialize"),
                redact_text(&reason),
            );
            PluginError::Start {
                engine: self.manifest.name.clone(),
                manifest: self.manifest.path.clone(),
                reason,
            }
        })
    }

    /// The plugin's manifest.
    pub fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    /// The hooks the plugin declared in `initialize`.
    pub fn capabilities(&self) -> Vec<String> {
        self.inner.borrow().capabilities.iter().cloned().collect()
    }

    /// The running process's id, if one runs.
    pub fn pid(&self) -> Option<u32> {
        self.inner.borrow().conn.as_ref().map(Connection::pid)
    }

    /// Failures since the last successful call.
    pub fn consecutive_failures(&self) -> u32 {
        self.inner.borrow().failures
    }

    /// Whether the built-in compressor has taken over for the session.
    pub fn is_fallback(&self) -> bool {
        self.fallback.get().is_some()
    }

    /// What happened so far (starts, failures with their reasons, the
    /// plugin's stderr and log lines), oldest first; at most the last 1000.
    pub fn events(&self) -> Vec<PluginEvent> {
        let mut inner = self.inner.borrow_mut();
        inner.drain_output();
        inner.events.iter().cloned().collect()
    }

    /// Warnings for the user (e.g. the switch to the built-in compressor)
    /// not yet taken; each is returned once.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.inner.get_mut().pending_warnings)
    }

    /// Stops the process politely (`shutdown`, `exit`) within the call
    /// timeout, killing it past that. The exit status when it left by
    /// itself; `None` when it had to be killed or was not running.
    pub fn shutdown(&mut self) -> Option<ExitStatus> {
        let inner = self.inner.get_mut();
        inner.drain_output();
        let conn = inner.conn.take()?;
        let status = conn.shutdown(self.manifest.timeouts.call());
        let detail = match status {
            Some(s) => format!("exited ({s})"),
            None => "killed".to_owned(),
        };
        inner.push(EventKind::Stopped, Some("shutdown"), detail);
        status
    }

    /// The built-in compressor made of this engine's context (used when the
    /// plugin cannot start at all).
    pub(crate) fn take_builtin(&mut self) -> Compressor {
        let parts = self.parts.get_mut().take();
        build_compressor(Arc::clone(&self.counter), parts, &self.manifest)
    }

    // -- plumbing ---------------------------------------------------------

    fn declares(&self, hook: &str) -> bool {
        self.fallback.get().is_none() && self.inner.borrow().capabilities.contains(hook)
    }

    fn messages_value(&self, messages: &[Message]) -> Value {
        Value::Array(
            messages
                .iter()
                .map(|m| {
                    if self.redact {
                        redact_message(m).to_value()
                    } else {
                        m.to_value()
                    }
                })
                .collect(),
        )
    }

    fn message_value(&self, message: &Message) -> Value {
        if self.redact {
            redact_message(message).to_value()
        } else {
            message.to_value()
        }
    }

    fn state_value(&self) -> Value {
        let s = &self.state;
        json!({
            "last_prompt_tokens": s.last_prompt_tokens.known(),
            "last_completion_tokens": s.last_completion_tokens,
            "last_total_tokens": s.last_total_tokens,
            "threshold_tokens": s.threshold_tokens,
            "context_length": s.context_length,
            "compression_count": s.compression_count,
            "threshold_percent": s.threshold_percent,
            "protect_first_n": s.protect_first_n,
            "protect_last_n": s.protect_last_n,
        })
    }

    /// Spawns the process and runs `initialize` (and replays
    /// `on_session_start` after a restart).
    fn connect(&self, inner: &mut Inner) -> Result<(), (FailureKind, String)> {
        let startup = |e: String| (FailureKind::Startup, e);
        let mut conn = Connection::spawn(&self.manifest).map_err(startup)?;
        let params = json!({
            "protocol_version": PROTOCOL_VERSION,
            "engine": self.manifest.name,
            "config": self.section,
            "context_length": self.state.context_length,
            "model": self.model,
            "state": self.state_value(),
        });
        let answer = conn.call("initialize", params, self.manifest.timeouts.startup());
        inner.conn = Some(conn);
        inner.drain_output();
        let result = match answer {
            Ok(v) => v,
            Err(CallError::Failure(kind, detail)) => {
                return Err((kind, format!("initialize: {detail}")));
            }
            Err(CallError::Remote { code, message }) => {
                return Err(startup(format!(
                    "initialize answered error {code}: {message}"
                )));
            }
        };
        let init = parse_initialize(&result).map_err(|e| (FailureKind::InvalidResult, e))?;
        inner.capabilities = init.capabilities;
        inner.tools = init.tools;
        inner.remote_name = init.name;
        inner.starts += 1;
        let pid = inner.conn.as_ref().map(Connection::pid).unwrap_or(0);
        inner.push(
            EventKind::Started,
            Some("initialize"),
            format!("pid {pid}, capabilities: {:?}", inner.capabilities),
        );
        if let Some(unknown) = init.unknown_hooks.first() {
            inner.push(
                EventKind::Log,
                Some("initialize"),
                format!("ignoring unknown capability `{unknown}`"),
            );
        }
        if inner.starts > 1
            && inner.capabilities.contains("on_session_start")
            && let Some(params) = inner.session_start.clone()
            && let Some(conn) = inner.conn.as_mut()
        {
            match conn.call("on_session_start", params, self.manifest.timeouts.call()) {
                Ok(_) | Err(CallError::Remote { .. }) => {}
                Err(CallError::Failure(kind, detail)) => {
                    return Err((kind, format!("on_session_start replay: {detail}")));
                }
            }
        }
        Ok(())
    }

    /// One request: (re)starts the process when due, records failures,
    /// and falls back to the built-in compressor after too many in a row.
    fn call(&self, method: &str, params: Value, timeout: Duration) -> Result<Value, Skip> {
        if self.fallback.get().is_some() {
            return Err(Skip::Unavailable("the plugin was given up on".to_owned()));
        }
        let (result, give_up) = {
            let mut guard = self.inner.borrow_mut();
            let inner = &mut *guard;
            if inner.conn.is_none() {
                if let Some(at) = inner.restart_at
                    && Instant::now() < at
                {
                    return Err(Skip::Unavailable(
                        "waiting to restart the plugin process".to_owned(),
                    ));
                }
                if let Err((kind, detail)) = self.connect(inner) {
                    let give_up = self.record_failure(inner, method, kind, &detail);
                    (Err(Skip::Failed(detail)), give_up)
                } else {
                    self.exchange(inner, method, params, timeout)
                }
            } else {
                self.exchange(inner, method, params, timeout)
            }
        };
        if give_up {
            self.activate_fallback();
        }
        result
    }

    fn exchange(
        &self,
        inner: &mut Inner,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> (Result<Value, Skip>, bool) {
        let Some(conn) = inner.conn.as_mut() else {
            return (Err(Skip::Unavailable("no process".to_owned())), false);
        };
        let answer = conn.call(method, params, timeout);
        inner.drain_output();
        match answer {
            Ok(v) => {
                inner.failures = 0;
                inner.restart_at = None;
                (Ok(v), false)
            }
            Err(CallError::Remote { code, message }) => {
                inner.failures = 0;
                inner.push(
                    EventKind::RemoteError,
                    Some(method),
                    format!("error {code}: {}", redact_text(&message)),
                );
                (Err(Skip::Remote { code, message }), false)
            }
            Err(CallError::Failure(kind, detail)) => {
                let give_up = self.record_failure(inner, method, kind, &detail);
                (Err(Skip::Failed(format!("{kind}: {detail}"))), give_up)
            }
        }
    }

    /// Kills the process, counts the failure and schedules the restart.
    /// `true` when the plugin should now be given up on.
    fn record_failure(
        &self,
        inner: &mut Inner,
        method: &str,
        kind: FailureKind,
        detail: &str,
    ) -> bool {
        inner.drain_output();
        if let Some(mut conn) = inner.conn.take() {
            conn.kill();
        }
        inner.failures = inner.failures.saturating_add(1);
        inner.total_failures = inner.total_failures.saturating_add(1);
        inner.restart_at = Some(Instant::now() + self.manifest.timeouts.backoff(inner.failures));
        inner.push(EventKind::Failure(kind), Some(method), redact_text(detail));
        inner.failures >= self.manifest.max_failures
    }

    /// A well-formed answer that cannot be accepted: same treatment as a
    /// crash (kill, restart later, count towards the fallback).
    fn reject(&self, method: &str, reason: &str) {
        let give_up = {
            let mut inner = self.inner.borrow_mut();
            self.record_failure(&mut inner, method, FailureKind::InvalidResult, reason)
        };
        if give_up {
            self.activate_fallback();
        }
    }

    /// Hands the session to the built-in compressor.
    fn activate_fallback(&self) {
        if self.fallback.get().is_some() {
            return;
        }
        let parts = self.parts.borrow_mut().take();
        let mut compressor = build_compressor(Arc::clone(&self.counter), parts, &self.manifest);
        let state = compressor.state_mut();
        state.last_prompt_tokens = self.state.last_prompt_tokens;
        state.last_completion_tokens = self.state.last_completion_tokens;
        state.last_total_tokens = self.state.last_total_tokens;
        state.compression_count = self.state.compression_count;
        let _ = self.fallback.set(compressor);
        let mut inner = self.inner.borrow_mut();
        if let Some(mut conn) = inner.conn.take() {
            conn.kill();
        }
        let last = inner
            .events
            .iter()
            .rev()
            .find(|e| matches!(e.kind, EventKind::Failure(_)))
            .map(|e| e.to_string())
            .unwrap_or_default();
        let warning = format!(
            "context engine plugin `{}` failed {} times in a row (last: {last}); using the built-in compressor for the rest of the session",
            self.manifest.name, inner.failures
        );
        inner.push(EventKind::Fallback, None, warning.clone());
        inner.warn(warning);
    }

    /// A boolean hook: the plugin's answer, or `default` on any failure.
    fn ask_bool(&self, hook: &str, params: Value, default: bool) -> bool {
        match self.call(hook, params, self.manifest.timeouts.call()) {
            Ok(Value::Bool(b)) => b,
            Ok(other) => {
                self.reject(
                    hook,
                    &format!("expected true or false, got {}", clip_json(&other)),
                );
                default
            }
            Err(_) => default,
        }
    }

    /// A hook whose answer only matters for its optional `state`.
    fn notify_hook(&mut self, hook: &str, params: Value) {
        if let Ok(v) = self.call(hook, params, self.manifest.timeouts.call()) {
            apply_state(&mut self.state, &v);
        }
    }

    fn plugin_error(&self, operation: &str, reason: String) -> EngineError {
        EngineError::Plugin {
            engine: self.manifest.name.clone(),
            operation: operation.to_owned(),
            reason,
            source: None,
        }
    }

    /// Parses and checks a transcript answered for `input`; `Err` is the
    /// reason it is refused.
    fn accept_transcript(&self, input: &[Message], value: &Value) -> Result<Vec<Message>, String> {
        let out = parse_messages(value)?;
        if !input.is_empty() && out.is_empty() {
            return Err("the result is empty".to_owned());
        }
        if let Some(v) = introduced_violation(input, &out, self.profile) {
            return Err(format!(
                "the result breaks a provider rule at message {}: {}: {}",
                v.index,
                v.rule.name(),
                v.detail
            ));
        }
        Ok(out)
    }
}

impl Drop for ProcessEngine {
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        if let Some(conn) = inner.conn.take() {
            let _ = conn.shutdown(self.manifest.timeouts.call().min(Duration::from_secs(2)));
        }
    }
}

fn build_compressor(
    counter: Arc<dyn TokenCounter>,
    parts: Option<FallbackParts>,
    manifest: &PluginManifest,
) -> Compressor {
    let _ = manifest;
    match parts {
        Some(p) => {
            let c = Compressor::with_options(counter, p.context_length, p.options);
            match p.summarizer {
                Some(s) => c.with_summarizer(s),
                None => c,
            }
        }
        None => Compressor::new(counter, 0),
    }
}

struct Init {
    name: Option<String>,
    capabilities: BTreeSet<String>,
    unknown_hooks: Vec<String>,
    tools: Vec<Value>,
}

/// Checks the `initialize` answer.
fn parse_initialize(result: &Value) -> Result<Init, String> {
    let Value::Object(o) = result else {
        return Err(format!(
            "initialize must answer an object, got {}",
            clip_json(result)
        ));
    };
    let version = o.get("protocol_version").and_then(Value::as_u64);
    if version != Some(PROTOCOL_VERSION) {
        return Err(format!(
            "the plugin speaks protocol version {}, this host speaks {PROTOCOL_VERSION}",
            o.get("protocol_version")
                .map(clip_json)
                .unwrap_or_else(|| "none".to_owned())
        ));
    }
    let mut capabilities = BTreeSet::new();
    let mut unknown_hooks = Vec::new();
    match o.get("capabilities") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                let Some(hook) = item.as_str() else {
                    return Err(format!("capabilities: not a string: {item}"));
                };
                if HOOKS.contains(&hook) {
                    capabilities.insert(hook.to_owned());
                } else {
                    unknown_hooks.push(hook.to_owned());
                }
            }
        }
        Some(other) => {
            return Err(format!(
                "capabilities must be a list, got {}",
                clip_json(other)
            ));
        }
    }
    let tools = match o.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) if items.iter().all(Value::is_object) => items.clone(),
        Some(other) => {
            return Err(format!(
                "tools must be a list of JSON schemas, got {}",
                clip_json(other)
            ));
        }
    };
    Ok(Init {
        name: o.get("name").and_then(Value::as_str).map(str::to_owned),
        capabilities,
        unknown_hooks,
        tools,
    })
}

/// The `messages` list of an answer.
fn parse_messages(value: &Value) -> Result<Vec<Message>, String> {
    let Some(items) = value.as_array() else {
        return Err(format!(
            "`messages` must be a list, got {}",
            clip_json(value)
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, m)| Message::from_value(m.clone()).map_err(|e| format!("messages[{i}]: {e}")))
        .collect()
}

/// Applies the optional `state` object of an answer to the host's state.
fn apply_state(state: &mut EngineState, answer: &Value) {
    let Some(Value::Object(patch)) = answer.get("state") else {
        return;
    };
    let u = |key: &str| patch.get(key).and_then(Value::as_u64);
    if let Some(v) = patch.get("last_prompt_tokens") {
        match v {
            Value::Null => state.last_prompt_tokens = PromptTokens::AwaitingRealUsage,
            v => {
                if let Some(n) = v.as_u64() {
                    state.last_prompt_tokens = PromptTokens::Known(n);
                }
            }
        }
    }
    if let Some(n) = u("threshold_tokens") {
        state.threshold_tokens = n;
    }
    if let Some(n) = u("context_length") {
        state.context_length = n;
    }
    if let Some(n) = u("compression_count") {
        state.compression_count = n;
    }
    if let Some(p) = patch.get("threshold_percent").and_then(Value::as_f64) {
        state.threshold_percent = p;
    }
    if let Some(n) = u("protect_first_n") {
        state.protect_first_n = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = u("protect_last_n") {
        state.protect_last_n = usize::try_from(n).unwrap_or(usize::MAX);
    }
}

/// Text leaving the process (to a plugin) or reaching a log is redacted,
/// whatever the user's opt-out.
fn leaving() -> RedactOptions {
    RedactOptions {
        force: true,
        url_credentials: true,
        ..RedactOptions::default()
    }
}

fn redact_text(text: &str) -> String {
    redact(text, &leaving()).into_owned()
}

/// A copy of `message` with its content, tool-call arguments and reasoning
/// redacted.
fn redact_message(message: &Message) -> Message {
    let mut out = message.clone();
    let opts = leaving();
    match &mut out.content {
        Content::Text(text) => {
            if let Cow::Owned(r) = redact(text, &opts) {
                *text = r;
            }
        }
        Content::Parts(parts) => {
            for part in parts.iter_mut() {
                if let Some(text) = part.text()
                    && let Cow::Owned(r) = redact(text, &opts)
                {
                    *part = ContentPart::new_text(r);
                }
            }
        }
        Content::Absent | Content::Null => {}
    }
    for call in out.tool_calls.iter_mut().flatten() {
        if let Some(function) = &mut call.function
            && let Cow::Owned(r) = redact(&function.arguments, &opts)
        {
            function.arguments = r;
        }
    }
    if let Some(reasoning) = &mut out.reasoning_content
        && let Cow::Owned(r) = redact(reasoning, &opts)
    {
        *reasoning = r;
    }
    out
}

fn clip_json(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

impl ContextEngine for ProcessEngine {
    fn name(&self) -> &str {
        &self.manifest.name
    }

    fn state(&self) -> &EngineState {
        match self.fallback.get() {
            Some(c) => c.state(),
            None => &self.state,
        }
    }

    fn state_mut(&mut self) -> &mut EngineState {
        match self.fallback.get_mut() {
            Some(c) => c.state_mut(),
            None => &mut self.state,
        }
    }

    fn update_from_response(&mut self, usage: &Usage) {
        if let Some(c) = self.fallback.get_mut() {
            return c.update_from_response(usage);
        }
        self.state.record_usage(usage);
        if self.declares("update_from_response") {
            let params = json!({"usage": usage, "state": self.state_value()});
            self.notify_hook("update_from_response", params);
        }
    }

    fn should_compress(&self, prompt_tokens: Option<u64>) -> bool {
        if let Some(c) = self.fallback.get() {
            return c.should_compress(prompt_tokens);
        }
        let default = self.state.exceeds_threshold(prompt_tokens);
        if !self.declares("should_compress") {
            return default;
        }
        let tokens = prompt_tokens.or(self.state.last_prompt_tokens.known());
        let params = json!({"prompt_tokens": tokens, "state": self.state_value()});
        self.ask_bool("should_compress", params, default)
    }

    fn should_compress_info(&self, prompt_tokens: Option<u64>) -> CompressDecision {
        if let Some(c) = self.fallback.get() {
            return c.should_compress_info(prompt_tokens);
        }
        if !self.declares("should_compress_info") {
            return CompressDecision::plain(self.should_compress(prompt_tokens));
        }
        let tokens = prompt_tokens.or(self.state.last_prompt_tokens.known());
        let params = json!({"prompt_tokens": tokens, "state": self.state_value()});
        let hook = "should_compress_info";
        match self.call(hook, params, self.manifest.timeouts.call()) {
            Ok(v) => match serde_json::from_value::<CompressDecision>(v.clone()) {
                Ok(d) => d,
                Err(e) => {
                    self.reject(hook, &format!("{e}: {}", clip_json(&v)));
                    CompressDecision::plain(self.state().exceeds_threshold(prompt_tokens))
                }
            },
            Err(_) => CompressDecision::plain(self.state().exceeds_threshold(prompt_tokens)),
        }
    }

    fn compress(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Result<Compaction, EngineError> {
        if let Some(c) = self.fallback.get_mut() {
            return c.compress(messages, request);
        }
        let hook = "compress";
        if !self.declares(hook) {
            return Err(EngineError::NothingToCompress {
                engine: self.manifest.name.clone(),
                reason: "the plugin does not implement compress".to_owned(),
            });
        }
        let params = json!({
            "messages": self.messages_value(messages),
            "current_tokens": request.current_tokens,
            "focus_topic": request.focus_topic,
            "force": request.force,
            "memory_context": sanitize_memory_context(&request.memory_context),
            "state": self.state_value(),
        });
        let answer = match self.call(hook, params, self.manifest.timeouts.compress()) {
            Ok(v) => v,
            Err(Skip::Remote { code, message }) if code == ERROR_NOTHING_TO_COMPRESS => {
                return Err(EngineError::NothingToCompress {
                    engine: self.manifest.name.clone(),
                    reason: message,
                });
            }
            Err(Skip::Remote { code, message }) if code == ERROR_BLOCKED => {
                return Err(EngineError::Blocked {
                    engine: self.manifest.name.clone(),
                    reason: BlockReason::Other { message },
                });
            }
            Err(skip) => return Err(self.plugin_error(hook, skip.reason())),
        };
        let Some(value) = answer.get("messages") else {
            let reason = format!("the answer has no `messages`: {}", clip_json(&answer));
            self.reject(hook, &reason);
            return Err(self.plugin_error(hook, reason));
        };
        let out = match self.accept_transcript(messages, value) {
            Ok(out) => out,
            Err(reason) => {
                self.reject(hook, &reason);
                return Err(self.plugin_error(hook, reason));
            }
        };
        let threshold = self.state.threshold_tokens;
        let compaction = Compaction::from_diff(messages, out, self.counter.as_ref(), threshold);
        let (before, after) = (
            compaction.report.tokens_before,
            compaction.report.tokens_after,
        );
        if after >= before {
            let reason = format!("the result is not smaller ({after} tokens, input {before})");
            self.reject(hook, &reason);
            return Err(self.plugin_error(hook, reason));
        }
        self.state.record_compression();
        apply_state(&mut self.state, &answer);
        Ok(compaction)
    }

    fn prune_tool_results_only<'a>(
        &mut self,
        messages: &'a [Message],
        current_tokens: Option<u64>,
    ) -> (Cow<'a, [Message]>, usize) {
        if let Some(c) = self.fallback.get_mut() {
            return c.prune_tool_results_only(messages, current_tokens);
        }
        let hook = "prune_tool_results_only";
        if !self.declares(hook) {
            return (Cow::Borrowed(messages), 0);
        }
        let params = json!({
            "messages": self.messages_value(messages),
            "current_tokens": current_tokens,
            "state": self.state_value(),
        });
        let Ok(answer) = self.call(hook, params, self.manifest.timeouts.call()) else {
            return (Cow::Borrowed(messages), 0);
        };
        let value = answer.get("messages").unwrap_or(&Value::Null);
        if value.is_null() {
            return (Cow::Borrowed(messages), 0);
        }
        let checked = self.accept_transcript(messages, value).and_then(|out| {
            if out.len() != messages.len() {
                return Err(format!(
                    "a prune keeps every message ({} in, {} out)",
                    messages.len(),
                    out.len()
                ));
            }
            let before = self.counter.count_messages(messages);
            let after = self.counter.count_messages(&out);
            if after > before {
                return Err(format!(
                    "the result is larger ({after} tokens, input {before})"
                ));
            }
            Ok(out)
        });
        match checked {
            Ok(out) => {
                let pruned = answer
                    .get("pruned")
                    .and_then(Value::as_u64)
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or_else(|| messages.iter().zip(&out).filter(|(a, b)| a != b).count());
                (Cow::Owned(out), pruned)
            }
            Err(reason) => {
                self.reject(hook, &reason);
                (Cow::Borrowed(messages), 0)
            }
        }
    }

    fn select_context(&mut self, request: &SelectRequest<'_>) -> Option<Vec<Message>> {
        if let Some(c) = self.fallback.get_mut() {
            return c.select_context(request);
        }
        let hook = "select_context";
        if !self.declares(hook) {
            return None;
        }
        let params = json!({
            "request_messages": self.messages_value(request.request_messages),
            "conversation_messages": self.messages_value(request.conversation_messages),
            "incoming_message": request.incoming_message.map(|m| self.message_value(m)),
            "budget_tokens": request.budget_tokens,
            "state": self.state_value(),
        });
        let answer = self
            .call(hook, params, self.manifest.timeouts.call())
            .ok()?;
        let value = match &answer {
            Value::Null => return None,
            Value::Object(o) => o.get("messages").unwrap_or(&Value::Null),
            other => other,
        };
        if value.is_null() {
            return None;
        }
        match self.accept_transcript(request.request_messages, value) {
            Ok(out) => Some(out),
            Err(reason) => {
                self.reject(hook, &reason);
                None
            }
        }
    }

    fn on_turn_complete(&mut self, messages: &[Message], usage: Option<&Usage>, turn: &TurnInfo) {
        if let Some(c) = self.fallback.get_mut() {
            return c.on_turn_complete(messages, usage, turn);
        }
        if self.declares("on_turn_complete") {
            let params = json!({
                "messages": self.messages_value(messages),
                "usage": usage,
                "turn": {
                    "turn_id": turn.turn_id,
                    "task_id": turn.task_id,
                    "api_call_count": turn.api_call_count,
                    "interrupted": turn.interrupted,
                    "failed": turn.failed,
                    "exit_reason": turn.exit_reason,
                },
            });
            self.notify_hook("on_turn_complete", params);
        }
    }

    fn should_compress_preflight(&self, messages: &[Message]) -> bool {
        if let Some(c) = self.fallback.get() {
            return c.should_compress_preflight(messages);
        }
        let hook = "should_compress_preflight";
        if !self.declares(hook) {
            return false;
        }
        let params =
            json!({"messages": self.messages_value(messages), "state": self.state_value()});
        self.ask_bool(hook, params, false)
    }

    fn should_defer_preflight_to_real_usage(&self, rough_tokens: u64) -> bool {
        if let Some(c) = self.fallback.get() {
            return c.should_defer_preflight_to_real_usage(rough_tokens);
        }
        let hook = "should_defer_preflight_to_real_usage";
        if !self.declares(hook) {
            return false;
        }
        let params = json!({"rough_tokens": rough_tokens, "state": self.state_value()});
        self.ask_bool(hook, params, false)
    }

    fn has_content_to_compress(&self, messages: &[Message]) -> bool {
        if let Some(c) = self.fallback.get() {
            return c.has_content_to_compress(messages);
        }
        let hook = "has_content_to_compress";
        if !self.declares(hook) {
            return true;
        }
        let params =
            json!({"messages": self.messages_value(messages), "state": self.state_value()});
        self.ask_bool(hook, params, true)
    }

    fn on_session_start(&mut self, session_id: &str, info: &SessionInfo) {
        if let Some(c) = self.fallback.get_mut() {
            return c.on_session_start(session_id, info);
        }
        let params = json!({
            "session_id": session_id,
            "home_dir": info.home_dir.as_ref().map(|p| p.to_string_lossy().into_owned()),
            "platform": info.platform,
            "model": info.model,
        });
        self.inner.get_mut().session_start = Some(params.clone());
        if self.declares("on_session_start") {
            self.notify_hook("on_session_start", params);
        }
    }

    fn on_session_end(&mut self, session_id: &str, messages: &[Message]) {
        if let Some(c) = self.fallback.get_mut() {
            return c.on_session_end(session_id, messages);
        }
        if self.declares("on_session_end") {
            let params =
                json!({"session_id": session_id, "messages": self.messages_value(messages)});
            self.notify_hook("on_session_end", params);
        }
    }

    fn on_session_reset(&mut self) {
        if let Some(c) = self.fallback.get_mut() {
            return c.on_session_reset();
        }
        self.state.reset_counters();
        if self.declares("on_session_reset") {
            let params = json!({"state": self.state_value()});
            self.notify_hook("on_session_reset", params);
        }
    }

    fn tool_schemas(&self) -> Vec<Value> {
        match self.fallback.get() {
            Some(c) => c.tool_schemas(),
            None => self.inner.borrow().tools.clone(),
        }
    }

    fn handle_tool_call(&mut self, name: &str, args: &Value, ctx: &ToolCallContext<'_>) -> String {
        if let Some(c) = self.fallback.get_mut() {
            return c.handle_tool_call(name, args, ctx);
        }
        let hook = "handle_tool_call";
        if !self.declares(hook) {
            return unknown_tool(name);
        }
        let params = json!({
            "name": name,
            "arguments": args,
            "messages": ctx.messages.map(|m| self.messages_value(m)),
        });
        match self.call(hook, params, self.manifest.timeouts.call()) {
            Ok(Value::String(s)) => s,
            Ok(other) => other.to_string(),
            Err(skip) => json!({
                "error": format!(
                    "context engine plugin `{}` failed: {}",
                    self.manifest.name,
                    skip.reason()
                )
            })
            .to_string(),
        }
    }

    fn status(&self) -> EngineStatus {
        let mut status = match self.fallback.get() {
            Some(c) => c.status(),
            None => self.state.status(),
        };
        if self.declares("get_status") {
            let params = json!({"state": self.state_value()});
            match self.call("get_status", params, self.manifest.timeouts.call()) {
                Ok(Value::Object(extra)) => {
                    for (k, v) in extra {
                        if !STATUS_FIELDS.contains(&k.as_str()) {
                            status.extra.insert(k, v);
                        }
                    }
                }
                Ok(Value::Null) | Err(_) => {}
                Ok(other) => {
                    self.reject(
                        "get_status",
                        &format!("expected an object, got {}", clip_json(&other)),
                    );
                }
            }
        }
        let inner = self.inner.borrow();
        let mut plugin = Map::new();
        plugin.insert("name".into(), json!(self.manifest.name));
        plugin.insert("version".into(), json!(self.manifest.version));
        plugin.insert(
            "manifest".into(),
            json!(self.manifest.path.to_string_lossy()),
        );
        plugin.insert("engine_name".into(), json!(inner.remote_name));
        plugin.insert("running".into(), json!(inner.conn.is_some()));
        plugin.insert("consecutive_failures".into(), json!(inner.failures));
        plugin.insert("total_failures".into(), json!(inner.total_failures));
        plugin.insert("fallback".into(), json!(self.fallback.get().is_some()));
        plugin.insert("warnings".into(), json!(inner.warnings));
        status.extra.insert("plugin".into(), Value::Object(plugin));
        status
    }

    fn update_model(&mut self, model: &ModelInfo) {
        self.model = Some(model.model.clone());
        if let Some(c) = self.fallback.get_mut() {
            return c.update_model(model);
        }
        self.state.apply_model(model);
        if let Some(parts) = self.parts.get_mut() {
            parts.context_length = model.context_length;
        }
        if self.declares("update_model") {
            // Never the API key: the plugin gets what it needs to count.
            let params = json!({
                "model": model.model,
                "context_length": model.context_length,
                "provider": model.provider,
                "base_url": model.base_url,
                "api_mode": model.api_mode,
                "state": self.state_value(),
            });
            self.notify_hook("update_model", params);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initialize_answer_is_checked() {
        let ok = parse_initialize(&json!({
            "name": "x", "protocol_version": 1,
            "capabilities": ["compress", "get_status", "telepathy"],
            "tools": [{"type": "function"}],
        }))
        .unwrap();
        assert!(ok.capabilities.contains("compress"));
        assert!(!ok.capabilities.contains("telepathy"));
        assert_eq!(ok.unknown_hooks, vec!["telepathy"]);
        assert_eq!(ok.tools.len(), 1);
        assert!(parse_initialize(&json!({"protocol_version": 2})).is_err());
        assert!(
            parse_initialize(&json!({"protocol_version": 1, "capabilities": "compress"})).is_err()
        );
        assert!(parse_initialize(&json!([1])).is_err());
    }

    #[test]
    fn state_patch_updates_known_fields_only() {
        let mut state = EngineState::default();
        apply_state(
            &mut state,
            &json!({"state": {"threshold_tokens": 900, "last_prompt_tokens": null, "bogus": 1}}),
        );
        assert_eq!(state.threshold_tokens, 900);
        assert_eq!(state.last_prompt_tokens, PromptTokens::AwaitingRealUsage);
        apply_state(&mut state, &json!({"state": {"last_prompt_tokens": 12}}));
        assert_eq!(state.last_prompt_tokens, PromptTokens::Known(12));
        apply_state(&mut state, &json!(true));
        assert_eq!(state.threshold_tokens, 900);
    }

    #[test]
    fn messages_to_plugins_are_redacted() {
        let secret = "sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF1234567890abcd";
        let m = Message::user(format!("my key is {secret}"));
        let out = redact_message(&m);
        assert!(!out.text().contains(secret), "{}", out.text());
    }
}
