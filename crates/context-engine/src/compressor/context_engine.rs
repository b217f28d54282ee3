//! [`ContextEngine`] for the [`Compressor`], and its state in a snapshot.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::control::{self, COMPACT_TOOL, CompactionAsk, CompactionNote, STATUS_TOOL};
use crate::digest::stable_len;
use crate::engine::{
    Compaction, CompressDecision, CompressRequest, ContextEngine, EngineError, EngineState,
    EngineStatus, ModelInfo, PreparedSummary, PromptTokens, SelectRequest, SummaryJob,
    ToolCallContext, Usage, prefix_key, unknown_tool,
};
use crate::message::Message;
use crate::prune::prune;
use crate::recall::{RECALL_TOOL, handle_recall_call, recall_tool_schema};
use crate::schedule::{ScheduleState, schedule_prune, scheduled_digest};
use crate::summarize::{SummarizeError, Summarizer};
use crate::tokens::TokenCounter;

use super::{Compressor, NAME, Ready, preflight_slack};

/// The compressor's own state in a snapshot (see
/// [`ContextEngine::snapshot`]); the cooldown as time left, so it survives
/// a restart on another clock.
#[derive(serde::Serialize, serde::Deserialize)]
struct Persisted {
    cooldown_left_ms: Option<u64>,
    transient_failures: usize,
    fallback_streak: u32,
    ineffective_streak: u32,
    last_savings_percent: f64,
    awaiting_effect: Option<u64>,
    seen_real_usage: bool,
    /// Provider responses since the last compaction (thrash detection).
    #[serde(default)]
    calls_since_compaction: Option<u32>,
    /// The cache-aware schedule's state (digest frontier, last request,
    /// growth per call): a restarted host decides as the first one would.
    #[serde(default)]
    schedule: ScheduleState,
    /// A compaction the agent asked for and no request made yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    asked: Option<CompactionAsk>,
    /// The newest compactions, for `context_status`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    notes: Vec<CompactionNote>,
}

impl ContextEngine for Compressor {
    fn name(&self) -> &str {
        NAME
    }

    fn state(&self) -> &EngineState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut EngineState {
        &mut self.state
    }

    /// Records usage; the first real count after a compaction decides
    /// whether it was effective (still at or over the threshold: not).
    fn update_from_response(&mut self, usage: &Usage) {
        self.state.record_usage(usage);
        self.seen_real_usage = true;
        self.calls_since_compaction = self.calls_since_compaction.map(|n| n.saturating_add(1));
        if let Some(before) = self.awaiting_effect.take() {
            let after = usage.prompt_tokens;
            self.last_savings_percent = if before == 0 {
                0.0
            } else {
                (before as f64 - after as f64) / before as f64 * 100.0
            };
            if self.state.threshold_tokens > 0 && after >= self.state.threshold_tokens {
                self.ineffective_streak = self.ineffective_streak.saturating_add(1);
            } else {
                self.ineffective_streak = 0;
            }
        }
    }

    fn should_compress(&self, prompt_tokens: Option<u64>) -> bool {
        self.should_compress_info(prompt_tokens).should_compress
    }

    fn should_compress_info(&self, prompt_tokens: Option<u64>) -> CompressDecision {
        if self.asked.is_some() {
            return CompressDecision::plain(true);
        }
        if !self.state.exceeds_threshold(prompt_tokens) {
            return CompressDecision::plain(false);
        }
        match self.block_reason() {
            Some(reason) => CompressDecision::blocked(reason),
            None => CompressDecision::plain(true),
        }
    }

    fn compress(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Result<Compaction, EngineError> {
        self.compress_inner(messages, request)
    }

    /// The summary of the span a compaction would replace now, for a host
    /// to prepare in the background; `None` during a cooldown, when
    /// nothing can be summarized, or while one prepared earlier is held.
    fn prepare_summary(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Option<SummaryJob> {
        if self.block_reason().is_some() {
            return None;
        }
        // One held is checked when it is used (hashing the prefix on every
        // request would cost the request path); a stale one is dropped
        // then, and the next request prepares again.
        if self.prepared.is_some() {
            return None;
        }
        let plan = self.plan(messages).ok()?;
        let key = prefix_key(&messages[..plan.tail_start], self.state.compression_count);
        let asked = self.asked_request(request);
        let inputs = self.span_inputs(messages, &plan, asked.as_ref().unwrap_or(request));
        let summarizer = Arc::clone(&self.primary);
        let count = plan.middle().count();
        Some(SummaryJob::new(key, count, move || {
            let result = match summarizer.summarize(&inputs.request()) {
                Ok(text) if text.trim().is_empty() => Err(SummarizeError::Empty),
                other => other,
            };
            Box::new(Ready {
                key,
                plan,
                result,
                summarizer: summarizer.name().to_owned(),
                inputs,
            })
        }))
    }

    fn adopt_summary(&mut self, summary: PreparedSummary) {
        if let Some(ready) = summary.into_payload::<Ready>() {
            self.prepared = Some(*ready);
        }
    }

    fn compaction_requested(&self) -> bool {
        self.asked.is_some()
    }

    fn prune_tool_results_only<'a>(
        &mut self,
        messages: &'a [Message],
        current_tokens: Option<u64>,
    ) -> (Cow<'a, [Message]>, usize) {
        let outcome = prune(
            messages,
            current_tokens,
            &self.options.prune,
            self.counter.as_ref(),
        );
        if let Cow::Owned(after) = &outcome.messages {
            let verdict = schedule_prune(
                &self.scheduler,
                messages,
                after,
                self.counter.as_ref(),
                self.state.threshold_tokens,
                self.now_secs(),
            );
            if !verdict.applies() {
                return (Cow::Borrowed(messages), 0);
            }
        }
        (outcome.messages, outcome.pruned)
    }

    fn select_context(&mut self, request: &SelectRequest<'_>) -> Option<Vec<Message>> {
        self.select_context_view(request)
            .map(|v| v.into_iter().map(Cow::into_owned).collect())
    }

    fn select_context_view<'a>(
        &mut self,
        request: &SelectRequest<'a>,
    ) -> Option<Vec<Cow<'a, Message>>> {
        let now = self.now_secs();
        self.cold_call = self.scheduler.is_cold(now);
        let digest = scheduled_digest(
            &mut self.scheduler,
            request.request_messages,
            &self.options.digest,
            self.counter.as_ref(),
            self.state.threshold_tokens,
            now,
        );
        let report = digest.report;
        let changed =
            report.results_digested + report.envelopes_digested + report.binary_parts_dropped > 0;
        changed.then_some(digest.view)
    }

    /// Under the schedule, the digest's [`stable_len`]: the next request
    /// digests the newest batch's bulky results, so the cache is best
    /// marked before them. With the schedule off, the whole request (the
    /// engine's behaviour before cache-aware scheduling).
    fn stable_prefix(&self, request: &[Message]) -> usize {
        if self.scheduler.options().enabled {
            stable_len(request, &self.options.digest)
        } else {
            request.len()
        }
    }

    /// At the threshold (unless deferred to real usage), or before it when
    /// the cost model says an early compaction pays (see
    /// [`Scheduler::compaction_pays`]); never while blocked.
    fn should_compress_preflight(&self, messages: &[Message]) -> bool {
        let rough = self.counter.count_messages(messages) as u64;
        self.should_compress_preflight_counted(messages, rough)
    }

    fn should_compress_preflight_counted(&self, messages: &[Message], rough: u64) -> bool {
        if self.asked.is_some() {
            return true;
        }
        let due = self.state.exceeds_threshold(Some(rough))
            && !self.should_defer_preflight_to_real_usage(rough);
        (due || self.early_compaction_pays(messages, rough)) && self.block_reason().is_none()
    }

    /// Defer while awaiting real usage, and while the last real count was
    /// under the threshold and the estimate grew by at most max(4096, 5% of
    /// the threshold) since.
    fn should_defer_preflight_to_real_usage(&self, rough_tokens: u64) -> bool {
        if self.asked.is_some() {
            return false;
        }
        match self.state.last_prompt_tokens {
            PromptTokens::AwaitingRealUsage => true,
            PromptTokens::Known(last) => {
                let threshold = self.state.threshold_tokens;
                let slack = preflight_slack(threshold);
                self.seen_real_usage
                    && last < threshold
                    && rough_tokens <= last.saturating_add(slack)
            }
        }
    }

    fn last_report(&self) -> Option<&crate::engine::CompactionReport> {
        self.last_report.as_ref()
    }

    fn has_content_to_compress(&self, messages: &[Message]) -> bool {
        self.plan(messages).is_ok()
    }

    fn on_session_reset(&mut self) {
        self.state.reset_counters();
        self.cooldown_until = None;
        self.transient_failures = 0;
        self.fallback_streak = 0;
        self.ineffective_streak = 0;
        self.last_savings_percent = 0.0;
        self.awaiting_effect = None;
        self.calls_since_compaction = None;
        self.seen_real_usage = false;
        self.last_report = None;
        self.prepared = None;
        self.scheduler.reset();
        self.asked = None;
        self.notes.clear();
    }

    fn tool_schemas(&self) -> Vec<Value> {
        let mut tools = vec![recall_tool_schema()];
        tools.extend(control::tool_schemas());
        tools
    }

    fn handle_tool_call(&mut self, name: &str, args: &Value, ctx: &ToolCallContext<'_>) -> String {
        match name {
            STATUS_TOOL => return self.status_answer(ctx),
            COMPACT_TOOL => return self.ask_compaction(args),
            RECALL_TOOL => {}
            _ => return unknown_tool(name),
        }
        match ctx.messages {
            Some(messages) => handle_recall_call(messages, args),
            None => {
                json!({ "error": "context_recall needs the conversation; the host passed none" })
                    .to_string()
            }
        }
    }

    /// The [`EngineState`] and the compressor's own: cooldown (as time
    /// left), failure and ineffectiveness streaks, the pending effect check,
    /// the schedule's state.
    fn snapshot(&self) -> Value {
        let own = Persisted {
            cooldown_left_ms: self
                .cooldown_until
                .map(|until| until.saturating_sub(self.clock.now()).as_millis() as u64),
            transient_failures: self.transient_failures,
            fallback_streak: self.fallback_streak,
            ineffective_streak: self.ineffective_streak,
            last_savings_percent: self.last_savings_percent,
            awaiting_effect: self.awaiting_effect,
            seen_real_usage: self.seen_real_usage,
            calls_since_compaction: self.calls_since_compaction,
            schedule: self.scheduler.state().clone(),
            asked: self.asked.clone(),
            notes: self.notes.clone(),
        };
        json!({ "state": self.state, "compressor": own })
    }

    fn restore(&mut self, snapshot: &Value) -> Result<(), EngineError> {
        #[derive(serde::Deserialize)]
        struct Snapshot {
            state: EngineState,
            compressor: Persisted,
        }
        let s: Snapshot =
            serde::Deserialize::deserialize(snapshot).map_err(|e| EngineError::Restore {
                engine: NAME.to_owned(),
                reason: e.to_string(),
            })?;
        self.state = s.state;
        let own = s.compressor;
        self.cooldown_until = own
            .cooldown_left_ms
            .map(|ms| self.clock.now() + Duration::from_millis(ms));
        self.transient_failures = own.transient_failures;
        self.fallback_streak = own.fallback_streak;
        self.ineffective_streak = own.ineffective_streak;
        self.last_savings_percent = own.last_savings_percent;
        self.awaiting_effect = own.awaiting_effect;
        self.seen_real_usage = own.seen_real_usage;
        self.calls_since_compaction = own.calls_since_compaction;
        self.scheduler.restore(own.schedule);
        self.asked = own.asked;
        self.notes = own.notes;
        Ok(())
    }

    fn status(&self) -> EngineStatus {
        let mut status = self.state.status();
        status
            .extra
            .insert("summarizer".into(), json!(self.primary.name()));
        status.extra.insert(
            "cooldown_seconds_left".into(),
            json!(self.cooldown_seconds_left()),
        );
        status
            .extra
            .insert("fallback_streak".into(), json!(self.fallback_streak));
        status
            .extra
            .insert("ineffective_streak".into(), json!(self.ineffective_streak));
        if let Some(ask) = &self.asked {
            status.extra.insert("compaction_asked".into(), json!(ask));
        }
        status
            .extra
            .insert("schedule".into(), json!(self.scheduler.state()));
        status
    }

    fn update_model(&mut self, model: &ModelInfo) {
        self.state.apply_model(model);
    }

    fn set_call_time(&mut self, at: Option<f64>) {
        self.call_time = at;
    }
}

impl Compressor {
    /// `context_status`: the budget as this engine sees it; the request's
    /// tokens are the host's count of the request it prepared when it
    /// passes one, else the provider's count of the last call.
    fn status_answer(&self, ctx: &ToolCallContext<'_>) -> String {
        let request_tokens =
            ctx.request_tokens
                .map(|t| (t, "request"))
                .or(match self.state.last_prompt_tokens {
                    PromptTokens::Known(t) if self.seen_real_usage => Some((t, "provider usage")),
                    _ => None,
                });
        control::status_answer(&control::Budget {
            context_length: self.state.context_length,
            threshold_tokens: self.state.threshold_tokens,
            request_tokens,
            compactions: self.state.compression_count,
            notes: &self.notes,
            pending: self.asked.as_ref(),
            blocked: self.block_reason().map(|r| r.to_string()),
            tool_rules: json!([]),
        })
    }

    /// `context_compact`: records the ask, its focus redacted; the next
    /// preflight compacts.
    fn ask_compaction(&mut self, args: &Value) -> String {
        if self.calls_since_compaction == Some(0) {
            // The request the model is answering was just compacted: an
            // ask now (a loop, or an instruction planted in a tool result)
            // would compact again before anything new arrived.
            return json!({
                "error": format!(
                    "{COMPACT_TOOL}: the context was compacted for this very request; ask again \
                     after the next turn if it is still needed"
                )
            })
            .to_string();
        }
        match control::compact_ask(args) {
            Ok(mut ask) => {
                // Kept in the engine's state (and so in a store): redacted
                // now, as the summarizer would receive it.
                ask.focus = ask.focus.map(|f| self.egress.string(&f));
                let answer = control::compact_answer(&ask);
                self.asked = Some(ask);
                answer
            }
            Err(e) => json!({ "error": e.to_string() }).to_string(),
        }
    }

    /// `request` with the agent's ask applied (forced, its focus unless
    /// the host named one), when there is an ask.
    pub(super) fn asked_request(&self, request: &CompressRequest) -> Option<CompressRequest> {
        let ask = self.asked.as_ref()?;
        let mut asked = request.clone().with_force(true);
        if asked.focus_topic.is_none()
            && let Some(focus) = &ask.focus
        {
            asked = asked.with_focus_topic(focus);
        }
        Some(asked)
    }
}
