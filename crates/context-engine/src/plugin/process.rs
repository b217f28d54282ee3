//! [`ProcessEngine`]: a [`ContextEngine`] whose policy runs in another
//! process, in any language, behind the protocol of `docs/plugin-protocol.md`.
//!
//! This is the engine adapter: it keeps everything it must answer without
//! I/O (the token state, the tool schemas, the declared hooks), turns each
//! hook into a typed request ([`super::wire`]), and treats the plugin as
//! untrusted: every answer is checked, and any failure leaves the input
//! unchanged. The process itself (start, restart with backoff, failure
//! count) is the [`Supervisor`]'s; after too many failures in a row the
//! session fails over to the built-in compressor, built with the same
//! options, summarizer and redactor. Every text sent goes through
//! [`Egress`] with the user's redactor.

use std::borrow::Cow;
use std::cell::{OnceCell, RefCell};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::EngineContext;
use super::PluginError;
use super::events::{EventKind, FailureKind, PluginEvent};
use super::hook::Hook;
use super::manifest::PluginManifest;
use super::supervisor::{Skip, Supervisor, clip_json};
use super::wire::{
    CompressParams, ERROR_BLOCKED, ERROR_NOTHING_TO_COMPRESS, InitializeParams, MessagesParams,
    PROTOCOL_VERSION, PromptTokensParams, PruneParams, RoughTokensParams, SelectParams,
    SessionEndParams, SessionStartParams, StateParams, StateSnapshot, ToolCallParams,
    TurnCompleteParams, UpdateModelParams, UsageParams,
};
use crate::compressor::{Compressor, CompressorOptions};
use crate::engine::{
    BlockReason, Compaction, CompressDecision, CompressRequest, ContextEngine, EngineError,
    EngineState, EngineStatus, ModelInfo, PromptTokens, SelectRequest, SessionInfo,
    ToolCallContext, TurnInfo, Usage, sanitize_memory_context, unknown_tool,
};
use crate::message::Message;
use crate::redact::{Egress, Redactor};
use crate::summarize::Summarizer;
use crate::tokens::TokenCounter;
use crate::validate::{Profile, Violation, introduced_violation};

/// Every optional hook a plugin may declare in `capabilities`, by name.
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
    redactor: Option<Arc<Redactor>>,
    context_length: u64,
}

/// A context engine served by a plugin process (see the module docs).
///
/// Created by [`select_engine`](super::select_engine), or with
/// [`new`](Self::new) then [`start`](Self::start).
pub struct ProcessEngine {
    name: String,
    section: Value,
    model: Option<String>,
    egress: Egress,
    profile: Profile,
    counter: Arc<dyn TokenCounter>,
    state: EngineState,
    supervisor: RefCell<Supervisor>,
    parts: RefCell<Option<FallbackParts>>,
    fallback: OnceCell<Compressor>,
    /// The host's time for the coming call, handed to the fallback.
    call_time: Option<f64>,
}

impl std::fmt::Debug for ProcessEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessEngine")
            .field("name", &self.name)
            .field("manifest", &self.supervisor.borrow().manifest().path)
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
        let egress = Egress::new(ctx.redactor.clone());
        ProcessEngine {
            name: manifest.name.clone(),
            section: ctx.section,
            model: ctx.model,
            profile: options.profile,
            counter: ctx.counter,
            state,
            supervisor: RefCell::new(Supervisor::new(manifest, egress.clone())),
            egress,
            parts: RefCell::new(Some(FallbackParts {
                options,
                summarizer: ctx.summarizer,
                redactor: ctx.redactor,
                context_length: ctx.context_length,
            })),
            fallback: OnceCell::new(),
            call_time: None,
        }
    }

    /// Starts the process and runs `initialize`.
    pub fn start(&mut self) -> Result<(), PluginError> {
        let init = self.init_params();
        let mut sup = self.supervisor.borrow_mut();
        sup.start(&init).map_err(|reason| PluginError::Start {
            engine: self.name.clone(),
            manifest: sup.manifest().path.clone(),
            reason,
        })
    }

    /// The plugin's manifest.
    pub fn manifest(&self) -> PluginManifest {
        self.supervisor.borrow().manifest().clone()
    }

    /// The hooks the plugin declared in `initialize`.
    pub fn capabilities(&self) -> Vec<String> {
        let sup = self.supervisor.borrow();
        sup.capabilities().map(|h| h.as_str().to_owned()).collect()
    }

    /// The running process's id, if one runs.
    pub fn pid(&self) -> Option<u32> {
        self.supervisor.borrow().pid()
    }

    /// Failures since the last successful call.
    pub fn consecutive_failures(&self) -> u32 {
        self.supervisor.borrow().consecutive_failures()
    }

    /// Whether the built-in compressor has taken over for the session.
    pub fn is_fallback(&self) -> bool {
        self.fallback.get().is_some()
    }

    /// What happened so far (starts, failures with their reasons, the
    /// plugin's stderr and log lines), oldest first; at most the last 1000.
    pub fn events(&self) -> Vec<PluginEvent> {
        self.supervisor.borrow_mut().events()
    }

    /// Warnings for the user (e.g. the switch to the built-in compressor)
    /// not yet taken; each is returned once.
    pub fn take_warnings(&mut self) -> Vec<String> {
        self.supervisor.get_mut().take_warnings()
    }

    /// Stops the process politely (`shutdown`, `exit`) within the call
    /// timeout, killing it past that. The exit status when it left by
    /// itself; `None` when it had to be killed or was not running.
    pub fn shutdown(&mut self) -> Option<ExitStatus> {
        let sup = self.supervisor.get_mut();
        let timeout = sup.manifest().timeouts.call();
        sup.shutdown(timeout)
    }

    /// The built-in compressor made of this engine's context (used when the
    /// plugin cannot start at all).
    pub(crate) fn take_builtin(&mut self) -> Compressor {
        let parts = self.parts.get_mut().take();
        build_compressor(Arc::clone(&self.counter), parts)
    }

    // -- plumbing ---------------------------------------------------------

    fn declares(&self, hook: Hook) -> bool {
        self.fallback.get().is_none() && self.supervisor.borrow().declares(hook)
    }

    fn init_params(&self) -> InitializeParams<'_> {
        InitializeParams {
            protocol_version: PROTOCOL_VERSION,
            engine: &self.name,
            config: &self.section,
            context_length: self.state.context_length,
            model: self.model.as_deref(),
            state: self.snapshot(),
        }
    }

    fn snapshot(&self) -> StateSnapshot {
        StateSnapshot::from(&self.state)
    }

    /// `messages` as they may leave the process.
    fn outgoing(&self, messages: &[Message]) -> Vec<Message> {
        self.egress.messages(messages)
    }

    fn timeout(&self, hook: Hook) -> Duration {
        let sup = self.supervisor.borrow();
        let timeouts = &sup.manifest().timeouts;
        if hook == Hook::Compress {
            timeouts.compress()
        } else {
            timeouts.call()
        }
    }

    /// One request through the supervisor; fails over to the built-in
    /// compressor once failures in a row reach the limit.
    fn call<P: Serialize>(&self, hook: Hook, params: &P) -> Result<Value, Skip> {
        if self.fallback.get().is_some() {
            return Err(Skip::Unavailable("the plugin was given up on".to_owned()));
        }
        let timeout = self.timeout(hook);
        let init = self.init_params();
        let (result, exhausted) = {
            let mut sup = self.supervisor.borrow_mut();
            let result = sup.call(hook, params, timeout, &init);
            (result, sup.exhausted())
        };
        if exhausted && result.is_err() {
            self.activate_fallback();
        }
        result
    }

    /// A well-formed answer that cannot be accepted: same treatment as a
    /// crash (kill, restart later, count towards the fallback).
    fn reject(&self, hook: Hook, reason: &str) {
        let exhausted = {
            let mut sup = self.supervisor.borrow_mut();
            sup.record_failure(hook.as_str(), FailureKind::InvalidResult, reason);
            sup.exhausted()
        };
        if exhausted {
            self.activate_fallback();
        }
    }

    /// Hands the session to the built-in compressor.
    fn activate_fallback(&self) {
        if self.fallback.get().is_some() {
            return;
        }
        let parts = self.parts.borrow_mut().take();
        let mut compressor = build_compressor(Arc::clone(&self.counter), parts);
        let state = compressor.state_mut();
        state.last_prompt_tokens = self.state.last_prompt_tokens;
        state.last_completion_tokens = self.state.last_completion_tokens;
        state.last_total_tokens = self.state.last_total_tokens;
        state.compression_count = self.state.compression_count;
        compressor.set_call_time(self.call_time);
        let _ = self.fallback.set(compressor);
        let mut sup = self.supervisor.borrow_mut();
        sup.kill();
        let last = sup
            .last_failure()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let warning = format!(
            "context engine plugin `{}` failed {} times in a row (last: {last}); using the built-in compressor for the rest of the session",
            self.name,
            sup.consecutive_failures()
        );
        sup.push(EventKind::Fallback, None, warning.clone());
        sup.warn(warning);
    }

    /// A boolean hook: the plugin's answer, or `default` on any failure.
    fn ask_bool<P: Serialize>(&self, hook: Hook, params: &P, default: bool) -> bool {
        match self.call(hook, params) {
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
    fn notify_hook<P: Serialize>(&mut self, hook: Hook, params: &P) {
        if let Ok(v) = self.call(hook, params) {
            apply_state(&mut self.state, &v);
        }
    }

    fn plugin_error(&self, hook: Hook, reason: String) -> EngineError {
        EngineError::Plugin {
            engine: self.name.clone(),
            operation: hook.as_str().to_owned(),
            reason,
            source: None,
        }
    }

    /// Parses and checks a transcript answered for `input`; `Err` is the
    /// reason it is refused.
    fn accept_transcript(&self, input: &[Message], value: &Value) -> Result<Vec<Message>, String> {
        self.check_transcript(input, value)
            .map_err(|refusal| refusal.to_string())
    }

    /// [`accept_transcript`](Self::accept_transcript) with a broken
    /// provider rule kept typed.
    fn check_transcript(&self, input: &[Message], value: &Value) -> Result<Vec<Message>, Refusal> {
        let out = parse_messages(value).map_err(Refusal::Other)?;
        if !input.is_empty() && out.is_empty() {
            return Err(Refusal::Other("the result is empty".to_owned()));
        }
        if let Some(v) = introduced_violation(input, &out, self.profile) {
            return Err(Refusal::Violation(v));
        }
        Ok(out)
    }
}

/// Why a transcript answered by the plugin is refused.
enum Refusal {
    /// It breaks a provider rule its input kept.
    Violation(Violation),
    /// Anything else (not messages, empty).
    Other(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Violation(v) => write!(f, "the result breaks a provider rule at {v}"),
            Refusal::Other(reason) => f.write_str(reason),
        }
    }
}

impl Drop for ProcessEngine {
    fn drop(&mut self) {
        let sup = self.supervisor.get_mut();
        let timeout = sup.manifest().timeouts.call().min(Duration::from_secs(2));
        sup.stop_quietly(timeout);
    }
}

fn build_compressor(counter: Arc<dyn TokenCounter>, parts: Option<FallbackParts>) -> Compressor {
    let Some(p) = parts else {
        return Compressor::new(counter, 0);
    };
    let mut c = Compressor::with_options(counter, p.context_length, p.options);
    if let Some(r) = p.redactor {
        c = c.with_redactor(r);
    }
    match p.summarizer {
        Some(s) => c.with_summarizer(s),
        None => c,
    }
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

/// Applies the optional `state` object of an answer to the host's state
/// (known keys of the right type; anything else is ignored).
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

impl ContextEngine for ProcessEngine {
    fn name(&self) -> &str {
        &self.name
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
        let hook = Hook::UpdateFromResponse;
        if self.declares(hook) {
            let params = UsageParams {
                usage,
                state: self.snapshot(),
            };
            self.notify_hook(hook, &params);
        }
    }

    fn should_compress(&self, prompt_tokens: Option<u64>) -> bool {
        if let Some(c) = self.fallback.get() {
            return c.should_compress(prompt_tokens);
        }
        let default = self.state.exceeds_threshold(prompt_tokens);
        let hook = Hook::ShouldCompress;
        if !self.declares(hook) {
            return default;
        }
        let params = PromptTokensParams {
            prompt_tokens: prompt_tokens.or(self.state.last_prompt_tokens.known()),
            state: self.snapshot(),
        };
        self.ask_bool(hook, &params, default)
    }

    fn should_compress_info(&self, prompt_tokens: Option<u64>) -> CompressDecision {
        if let Some(c) = self.fallback.get() {
            return c.should_compress_info(prompt_tokens);
        }
        let hook = Hook::ShouldCompressInfo;
        if !self.declares(hook) {
            return CompressDecision::plain(self.should_compress(prompt_tokens));
        }
        let params = PromptTokensParams {
            prompt_tokens: prompt_tokens.or(self.state.last_prompt_tokens.known()),
            state: self.snapshot(),
        };
        match self.call(hook, &params) {
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
        let hook = Hook::Compress;
        if !self.declares(hook) {
            return Err(EngineError::NothingToCompress {
                engine: self.name.clone(),
                reason: "the plugin does not implement compress".to_owned(),
            });
        }
        let params = CompressParams {
            messages: self.outgoing(messages),
            current_tokens: request.current_tokens,
            focus_topic: request
                .focus_topic
                .as_deref()
                .map(|f| self.egress.string(f)),
            force: request.force,
            memory_context: self
                .egress
                .string(&sanitize_memory_context(&request.memory_context)),
            state: self.snapshot(),
        };
        let answer = match self.call(hook, &params) {
            Ok(v) => v,
            Err(Skip::Remote { code, message }) if code == ERROR_NOTHING_TO_COMPRESS => {
                return Err(EngineError::NothingToCompress {
                    engine: self.name.clone(),
                    reason: message,
                });
            }
            Err(Skip::Remote { code, message }) if code == ERROR_BLOCKED => {
                return Err(EngineError::Blocked {
                    engine: self.name.clone(),
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
        let out = match self.check_transcript(messages, value) {
            Ok(out) => out,
            Err(refusal) => {
                self.reject(hook, &refusal.to_string());
                return Err(match refusal {
                    Refusal::Violation(violation) => EngineError::InvalidOutput {
                        engine: self.name.clone(),
                        violation,
                    },
                    Refusal::Other(reason) => self.plugin_error(hook, reason),
                });
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
        let hook = Hook::PruneToolResultsOnly;
        if !self.declares(hook) {
            return (Cow::Borrowed(messages), 0);
        }
        let params = PruneParams {
            messages: self.outgoing(messages),
            current_tokens,
            state: self.snapshot(),
        };
        let Ok(answer) = self.call(hook, &params) else {
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

    fn select_context_view<'a>(
        &mut self,
        request: &SelectRequest<'a>,
    ) -> Option<Vec<Cow<'a, Message>>> {
        // After a failover the built-in compressor's view borrows what it
        // keeps; the process's answer is its own copy anyway.
        if let Some(c) = self.fallback.get_mut() {
            return c.select_context_view(request);
        }
        self.select_context(request)
            .map(|v| v.into_iter().map(Cow::Owned).collect())
    }

    fn select_context(&mut self, request: &SelectRequest<'_>) -> Option<Vec<Message>> {
        if let Some(c) = self.fallback.get_mut() {
            return c.select_context(request);
        }
        let hook = Hook::SelectContext;
        if !self.declares(hook) {
            return None;
        }
        let params = SelectParams {
            request_messages: self.outgoing(request.request_messages),
            conversation_messages: self.outgoing(request.conversation_messages),
            incoming_message: request.incoming_message.map(|m| self.egress.message(m)),
            budget_tokens: request.budget_tokens,
            state: self.snapshot(),
        };
        let answer = self.call(hook, &params).ok()?;
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
        let hook = Hook::OnTurnComplete;
        if self.declares(hook) {
            let params = TurnCompleteParams {
                messages: self.outgoing(messages),
                usage,
                turn,
            };
            self.notify_hook(hook, &params);
        }
    }

    fn should_compress_preflight_counted(&self, messages: &[Message], tokens: u64) -> bool {
        match self.fallback.get() {
            Some(c) => c.should_compress_preflight_counted(messages, tokens),
            None => self.should_compress_preflight(messages),
        }
    }

    fn should_compress_preflight(&self, messages: &[Message]) -> bool {
        if let Some(c) = self.fallback.get() {
            return c.should_compress_preflight(messages);
        }
        let hook = Hook::ShouldCompressPreflight;
        if !self.declares(hook) {
            return false;
        }
        let params = MessagesParams {
            messages: self.outgoing(messages),
            state: self.snapshot(),
        };
        self.ask_bool(hook, &params, false)
    }

    fn should_defer_preflight_to_real_usage(&self, rough_tokens: u64) -> bool {
        if let Some(c) = self.fallback.get() {
            return c.should_defer_preflight_to_real_usage(rough_tokens);
        }
        let hook = Hook::ShouldDeferPreflightToRealUsage;
        if !self.declares(hook) {
            return false;
        }
        let params = RoughTokensParams {
            rough_tokens,
            state: self.snapshot(),
        };
        self.ask_bool(hook, &params, false)
    }

    fn has_content_to_compress(&self, messages: &[Message]) -> bool {
        if let Some(c) = self.fallback.get() {
            return c.has_content_to_compress(messages);
        }
        let hook = Hook::HasContentToCompress;
        if !self.declares(hook) {
            return true;
        }
        let params = MessagesParams {
            messages: self.outgoing(messages),
            state: self.snapshot(),
        };
        self.ask_bool(hook, &params, true)
    }

    fn on_session_start(&mut self, session_id: &str, info: &SessionInfo) {
        if let Some(c) = self.fallback.get_mut() {
            return c.on_session_start(session_id, info);
        }
        let params = SessionStartParams::new(
            session_id,
            info.home_dir.as_ref(),
            info.platform.as_deref(),
            info.model.as_deref(),
        );
        self.supervisor
            .get_mut()
            .remember_session_start(params.clone());
        let hook = Hook::OnSessionStart;
        if self.declares(hook) {
            self.notify_hook(hook, &params);
        }
    }

    fn on_session_end(&mut self, session_id: &str, messages: &[Message]) {
        if let Some(c) = self.fallback.get_mut() {
            return c.on_session_end(session_id, messages);
        }
        let hook = Hook::OnSessionEnd;
        if self.declares(hook) {
            let params = SessionEndParams {
                session_id,
                messages: self.outgoing(messages),
            };
            self.notify_hook(hook, &params);
        }
    }

    fn on_session_reset(&mut self) {
        if let Some(c) = self.fallback.get_mut() {
            return c.on_session_reset();
        }
        self.state.reset_counters();
        let hook = Hook::OnSessionReset;
        if self.declares(hook) {
            let params = StateParams {
                state: self.snapshot(),
            };
            self.notify_hook(hook, &params);
        }
    }

    fn tool_schemas(&self) -> Vec<Value> {
        match self.fallback.get() {
            Some(c) => c.tool_schemas(),
            None => self.supervisor.borrow().tools().to_vec(),
        }
    }

    fn handle_tool_call(&mut self, name: &str, args: &Value, ctx: &ToolCallContext<'_>) -> String {
        if let Some(c) = self.fallback.get_mut() {
            return c.handle_tool_call(name, args, ctx);
        }
        let hook = Hook::HandleToolCall;
        if !self.declares(hook) {
            return unknown_tool(name);
        }
        let params = ToolCallParams {
            name,
            arguments: self.egress.value(args),
            messages: ctx.messages.map(|m| self.outgoing(m)),
        };
        match self.call(hook, &params) {
            Ok(Value::String(s)) => s,
            Ok(other) => other.to_string(),
            Err(skip) => json!({
                "error": format!(
                    "context engine plugin `{}` failed: {}",
                    self.name,
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
        let hook = Hook::GetStatus;
        if self.declares(hook) {
            let params = StateParams {
                state: self.snapshot(),
            };
            match self.call(hook, &params) {
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
                        hook,
                        &format!("expected an object, got {}", clip_json(&other)),
                    );
                }
            }
        }
        let sup = self.supervisor.borrow();
        let manifest = sup.manifest();
        let mut plugin = Map::new();
        plugin.insert("name".into(), json!(manifest.name));
        plugin.insert("version".into(), json!(manifest.version));
        plugin.insert("manifest".into(), json!(manifest.path.to_string_lossy()));
        plugin.insert("engine_name".into(), json!(sup.remote_name()));
        plugin.insert("running".into(), json!(sup.running()));
        plugin.insert(
            "consecutive_failures".into(),
            json!(sup.consecutive_failures()),
        );
        plugin.insert("total_failures".into(), json!(sup.total_failures()));
        plugin.insert("fallback".into(), json!(self.fallback.get().is_some()));
        plugin.insert("warnings".into(), json!(sup.warnings()));
        status.extra.insert("plugin".into(), Value::Object(plugin));
        status
    }

    /// Kept for the fallback; the plugin protocol has no hook for it.
    fn set_call_time(&mut self, at: Option<f64>) {
        self.call_time = at;
        if let Some(c) = self.fallback.get_mut() {
            c.set_call_time(at);
        }
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
        let hook = Hook::UpdateModel;
        if self.declares(hook) {
            let params = UpdateModelParams {
                model: &model.model,
                context_length: model.context_length,
                provider: model.provider.as_deref(),
                base_url: model.base_url.as_deref(),
                api_mode: model.api_mode.as_deref(),
                state: self.snapshot(),
            };
            self.notify_hook(hook, &params);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_names_are_the_typed_hooks() {
        let names: Vec<&str> = Hook::ALL.iter().map(|h| h.as_str()).collect();
        assert_eq!(names, HOOKS);
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
}
