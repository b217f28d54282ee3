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

use crate::supervisor::{Skip, Supervisor};
use context_engine::compressor::{Compressor, CompressorOptions};
use context_engine::engine::{
    BlockReason, Compaction, CompressDecision, CompressRequest, ContextEngine, EngineError,
    EngineState, EngineStatus, ModelInfo, SelectRequest, SessionInfo, ToolCallContext, TurnInfo,
    Usage, sanitize_memory_context, unknown_tool,
};
use context_engine::message::Message;
use context_engine::plugin::EngineContext;
use context_engine::plugin::Hook;
use context_engine::plugin::PluginError;
use context_engine::plugin::PluginManifest;
use context_engine::plugin::answer::{
    Refusal, RefusalReason, apply_state, decode, decode_object, select_messages,
};
use context_engine::plugin::wire::{
    CompressAnswer, CompressInfoAnswer, CompressParams, ERROR_BLOCKED, ERROR_NOTHING_TO_COMPRESS,
    InitializeParams, MessagesParams, NotifyAnswer, PROTOCOL_VERSION, PromptTokensParams,
    PruneAnswer, PruneParams, RoughTokensParams, SelectParams, SessionEndParams,
    SessionStartParams, StateParams, StateSnapshot, StatusAnswer, ToolCallAnswer, ToolCallParams,
    TurnCompleteParams, UpdateModelParams, UsageParams,
};
use context_engine::plugin::{EventKind, FailureKind, PluginEvent};
use context_engine::redact::{Egress, Redactor};
use context_engine::summarize::Summarizer;
use context_engine::tokens::TokenCounter;
use context_engine::validate::{Profile, introduced_violation};

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
            reason: Box::new(reason),
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
    fn reject(&self, refusal: &Refusal) {
        let exhausted = {
            let mut sup = self.supervisor.borrow_mut();
            let reason = refusal.to_string();
            sup.record_failure(refusal.method, FailureKind::InvalidResult, &reason);
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
        let Ok(answer) = self.call(hook, params) else {
            return default;
        };
        self.accept(decode::<bool>(hook.as_str(), &answer))
            .unwrap_or(default)
    }

    /// A hook whose answer only matters for its optional `state`.
    fn notify_hook<P: Serialize>(&mut self, hook: Hook, params: &P) {
        let Ok(answer) = self.call(hook, params) else {
            return;
        };
        let decoded = decode_object::<Option<NotifyAnswer>>(hook.as_str(), &answer);
        if let Some(patch) = self.accept(decoded).flatten().and_then(|a| a.state) {
            apply_state(&mut self.state, &patch);
        }
    }

    /// The value of an accepted answer; a refused one is
    /// [rejected](Self::reject) (`None`).
    fn accept<T>(&self, decoded: Result<T, Refusal>) -> Option<T> {
        match decoded {
            Ok(v) => Some(v),
            Err(refusal) => {
                self.reject(&refusal);
                None
            }
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

    /// The engine error of a refused answer (the refusal is its source).
    fn refused(&self, refusal: Refusal) -> EngineError {
        EngineError::Plugin {
            engine: self.name.clone(),
            operation: refusal.method.to_owned(),
            reason: refusal.to_string(),
            source: Some(Box::new(refusal)),
        }
    }

    /// Checks a transcript answered for `input`: not empty (for a
    /// non-empty input), no provider rule broken that `input` kept.
    fn check_transcript(
        &self,
        input: &[Message],
        out: Vec<Message>,
    ) -> Result<Vec<Message>, RefusalReason> {
        if !input.is_empty() && out.is_empty() {
            return Err(RefusalReason::Empty);
        }
        if let Some(v) = introduced_violation(input, &out, self.profile) {
            return Err(RefusalReason::Violation(v));
        }
        Ok(out)
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
        self.call(hook, &params)
            .ok()
            .and_then(|answer| {
                self.accept(decode_object::<CompressInfoAnswer>(hook.as_str(), &answer))
            })
            .map_or_else(
                || CompressDecision::plain(self.state().exceeds_threshold(prompt_tokens)),
                |a| CompressDecision {
                    should_compress: a.should_compress,
                    block_reason: a.block_reason,
                },
            )
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
        let method = hook.as_str();
        let refuse = |reason: RefusalReason| {
            let refusal = Refusal::new(method, reason);
            self.reject(&refusal);
            refusal
        };
        let CompressAnswer {
            messages: out,
            state,
        } = match decode_object(method, &answer) {
            Ok(a) => a,
            Err(refusal) => {
                self.reject(&refusal);
                return Err(self.refused(refusal));
            }
        };
        let out = match self.check_transcript(messages, out) {
            Ok(out) => out,
            Err(RefusalReason::Violation(violation)) => {
                refuse(RefusalReason::Violation(violation.clone()));
                return Err(EngineError::InvalidOutput {
                    engine: self.name.clone(),
                    violation,
                });
            }
            Err(reason) => return Err(self.refused(refuse(reason))),
        };
        let threshold = self.state.threshold_tokens;
        let compaction = Compaction::from_diff(messages, out, self.counter.as_ref(), threshold);
        let (before, after) = (
            compaction.report.tokens_before,
            compaction.report.tokens_after,
        );
        if after >= before {
            let refusal = refuse(RefusalReason::NotSmaller { before, after });
            return Err(self.refused(refusal));
        }
        self.state.record_compression();
        if let Some(patch) = &state {
            apply_state(&mut self.state, patch);
        }
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
        let Some(PruneAnswer {
            messages: Some(out),
            pruned,
        }) = self
            .accept(decode_object::<Option<PruneAnswer>>(hook.as_str(), &answer))
            .flatten()
        else {
            return (Cow::Borrowed(messages), 0);
        };
        let checked = self.check_transcript(messages, out).and_then(|out| {
            if out.len() != messages.len() {
                return Err(RefusalReason::PruneCount {
                    input: messages.len(),
                    output: out.len(),
                });
            }
            let before = self.counter.count_messages(messages);
            let after = self.counter.count_messages(&out);
            if after > before {
                return Err(RefusalReason::Larger { before, after });
            }
            Ok(out)
        });
        match checked {
            Ok(out) => {
                let pruned = pruned
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or_else(|| messages.iter().zip(&out).filter(|(a, b)| a != b).count());
                (Cow::Owned(out), pruned)
            }
            Err(reason) => {
                self.reject(&Refusal::new(hook.as_str(), reason));
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
        let out = self.accept(select_messages(hook.as_str(), &answer))??;
        match self.check_transcript(request.request_messages, out) {
            Ok(out) => Some(out),
            Err(reason) => {
                self.reject(&Refusal::new(hook.as_str(), reason));
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
        let answer = self
            .call(hook, &params)
            .map(|answer| decode::<ToolCallAnswer>(hook.as_str(), &answer));
        match answer {
            Ok(Ok(ToolCallAnswer::Text(s))) => s,
            Ok(Ok(ToolCallAnswer::Json(other))) => other.to_string(),
            // Every JSON value is a tool answer: never refused.
            Ok(Err(refusal)) => refusal.to_string(),
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
            let extra = self
                .call(hook, &params)
                .ok()
                .and_then(|answer| {
                    self.accept(decode_object::<Option<StatusAnswer>>(
                        hook.as_str(),
                        &answer,
                    ))
                })
                .flatten();
            for (k, v) in extra.map(|a| a.0).unwrap_or_default() {
                if !STATUS_FIELDS.contains(&k.as_str()) {
                    status.extra.insert(k, v);
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
}
