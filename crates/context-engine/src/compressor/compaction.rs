//! The compaction: the plan, the summarizer's input for the span, the
//! summary (primary, extractive fallback) and the assembled transcript.

use std::borrow::Cow;
use std::time::Duration;

use crate::control::CompactionNote;
use crate::digest::{ToolChannel, summarizer_input};
use crate::engine::{
    Compaction, CompressRequest, EngineError, SummarySource, ledger_ceiling, prefix_key,
    sanitize_memory_context,
};
use crate::message::{Content, Message};
use crate::schedule::CompactionEstimate;
use crate::summarize::{FailureAction, SummarizeError, Summarizer, SummaryRequest};
use crate::tokens::TokenCounter;
use crate::validate::{
    CutPoints, Profile, Rule, Violation, introduced_adjacency, introduced_violation,
};

use super::{
    COOLDOWN_MALFORMED, COOLDOWN_NOT_CONFIGURED, COOLDOWN_OTHER, COOLDOWN_TRANSIENT,
    CompactionReport, Compressor, CompressorOptions, FitStep, FitStepKind, NAME, NothingToCut,
    Outcome, Placement, Plan, Span, THRASH_CALLS, fit, insert, is_summary, ledger_kept, plan,
    wrap_summary,
};

impl Compressor {
    /// Where the next compaction would cut `messages`, or why it cannot.
    pub fn plan(&self, messages: &[Message]) -> Result<Plan, NothingToCut> {
        self.plan_with(messages, plan::Tail::Normal)
    }

    /// [`plan`](Self::plan), with the tail `tail` asks for (deeper on
    /// thrash, the last group in the escalation's second step).
    fn plan_with(&self, messages: &[Message], tail: plan::Tail) -> Result<Plan, NothingToCut> {
        self.plan_against(messages, tail, self.state.threshold_tokens)
    }

    /// [`plan_with`](Self::plan_with) with the tail's budget a share of
    /// `basis` tokens instead of the threshold's.
    fn plan_against(
        &self,
        messages: &[Message],
        tail: plan::Tail,
        basis: u64,
    ) -> Result<Plan, NothingToCut> {
        // The state's protections win: hosts adjust them there.
        let options = CompressorOptions {
            protect_first_n: self.state.protect_first_n,
            protect_last_n: self.state.protect_last_n,
            ..self.options.clone()
        };
        plan::plan(
            messages,
            &options,
            basis,
            self.state.compression_count,
            self.counter.as_ref(),
            tail,
        )
    }

    /// Tokens of what `plan` keeps verbatim plus the summary's target: the
    /// compacted size before any escalation (per-message counts, cached).
    fn kept_estimate(&self, messages: &[Message], plan: &Plan) -> u64 {
        let c = self.counter.as_ref();
        let kept: usize = messages[..plan.head_end]
            .iter()
            .chain(plan.pinned.map(|u| &messages[u]))
            .chain(&messages[plan.tail_start..])
            .map(|m| c.count_message(m))
            .sum();
        let target = self.target_tokens(self.span_estimate(messages, plan));
        (kept + target + c.request_overhead()) as u64
    }

    /// Tokens of the messages `plan` summarises.
    fn span_estimate(&self, messages: &[Message], plan: &Plan) -> usize {
        plan.middle()
            .map(|i| self.counter.count_message(&messages[i]))
            .sum()
    }

    /// The size the summary aims for: a fifth of what it replaces, at most
    /// 5% of the window and 12k tokens.
    fn target_tokens(&self, span_tokens: usize) -> usize {
        let mut target = (span_tokens as f64 * self.options.summary_ratio) as usize;
        if self.state.context_length > 0 {
            let window =
                (self.state.context_length as f64 * self.options.summary_window_ratio) as usize;
            target = target.min(window);
        }
        target.min(self.options.summary_max_tokens).max(64)
    }

    /// The room the summary's ledger may take when it needs more than the
    /// target leaves it: `summary_ledger_window_ratio` of the window, at
    /// most `summary_max_tokens` (0 without a window).
    fn ledger_tokens(&self) -> usize {
        if self.state.context_length == 0 {
            return 0;
        }
        let room = self.state.context_length as f64 * self.options.summary_ledger_window_ratio;
        (room as usize).min(self.options.summary_max_tokens)
    }

    /// The plan for `messages`, with the tail shrunk to the last group
    /// when what it keeps and the summary's target would exceed the budget
    /// even with the tail's large results digested (decided before the
    /// summarizer runs: one call; the step goes to `escalation`).
    ///
    /// A forced compaction (manual, or asked by the agent) of a history
    /// under the threshold keeps the tail's share of the history there
    /// (`tail_ratio` of `tokens`), not of the threshold, which would keep
    /// all of it.
    fn plan_for(
        &self,
        messages: &[Message],
        tokens: u64,
        forced: bool,
        escalation: &mut Vec<FitStep>,
    ) -> Result<Plan, NothingToCut> {
        let threshold = self.state.threshold_tokens;
        let mut plan = if forced && tokens < threshold {
            self.plan_against(messages, plan::Tail::Normal, tokens)?
        } else {
            self.plan(messages)?
        };
        // Thrash (compacting again within a few calls): aim deeper, half
        // the tail's budget, so the next calls have room.
        if self.thrash().is_some() {
            self.shrink_tail(messages, &mut plan, plan::Tail::Deep, escalation);
        }
        if threshold > 0 && self.kept_estimate(messages, &plan) > threshold {
            let profile = self.options.profile;
            let system_note = !self.options.schedule.enabled;
            let mut provisional = assemble(
                messages,
                &plan,
                &wrap_summary(""),
                profile,
                self.options.text_actions(),
                system_note,
            )
            .0;
            let target = self.target_tokens(self.span_estimate(messages, &plan)) as u64;
            let room = threshold.saturating_sub(target);
            let counter = self.counter.as_ref();
            fit::run_step(
                &mut provisional,
                FitStepKind::DigestResults,
                room,
                counter,
                profile,
                self.options.text_actions(),
            );
            if counter.count_messages(&provisional) as u64 > room {
                self.shrink_tail(messages, &mut plan, plan::Tail::Minimal, escalation);
            }
        }
        Ok(plan)
    }

    /// `plan` with the tail `tail` asks for, when that keeps less (the
    /// step goes to `escalation`).
    fn shrink_tail(
        &self,
        messages: &[Message],
        plan: &mut Plan,
        tail: plan::Tail,
        escalation: &mut Vec<FitStep>,
    ) {
        if let Ok(shorter) = self.plan_with(messages, tail)
            && shorter.tail_start > plan.tail_start
        {
            escalation.push(FitStep {
                step: FitStepKind::ShrinkTail,
                messages: shorter.tail_start - plan.tail_start,
                tokens_after: 0,
            });
            *plan = shorter;
        }
    }

    /// The calls since the previous compaction when a compaction now would
    /// be thrash (fewer than [`THRASH_CALLS`], at least one: the passes of
    /// one compaction are not).
    fn thrash(&self) -> Option<u32> {
        self.calls_since_compaction
            .filter(|&n| n > 0 && n < THRASH_CALLS)
    }

    /// What the summarizer is given for `plan`'s span: the turns digested
    /// and redacted (without the previous summary's own text), the previous
    /// summary, focus and memory redacted, and the target size.
    pub(super) fn span_inputs(
        &self,
        messages: &[Message],
        plan: &Plan,
        request: &CompressRequest,
    ) -> SpanInputs {
        // Every summary in the span, wherever it stands (its own message,
        // merged into a user, assistant or observation message): its body
        // is the previous summary (several, oldest first, when a fit or a
        // client left more than one), never the agent's own words.
        // The pinned ask may hold one too: it stays, without it.
        let mut held: Vec<usize> = plan
            .middle()
            .chain(plan.pinned)
            .filter(|&i| is_summary(&messages[i]))
            .collect();
        held.sort_unstable();
        let bodies: Vec<String> = held
            .iter()
            .filter_map(|&i| insert::summary_body(&messages[i].text()).map(str::to_owned))
            .filter(|b| !b.is_empty())
            .collect();
        let previous = match (bodies.is_empty(), &plan.previous) {
            (false, _) => Some(bodies.join("\n\n")),
            (true, Some((_, body))) => Some(body.clone()),
            (true, None) => None,
        };
        // Borrowed when the span is one run of the input (the common case:
        // no copy of 1 MB).
        let contiguous = held.is_empty()
            && plan
                .pinned
                .is_none_or(|u| u < plan.head_end || u >= plan.tail_start);
        let span: Cow<'_, [Message]> = if contiguous {
            Cow::Borrowed(&messages[plan.head_end..plan.tail_start])
        } else {
            Cow::Owned(
                plan.middle()
                    .filter_map(|i| {
                        let m = &messages[i];
                        if held.contains(&i) {
                            // The holder's own words and tool calls stay in
                            // the span (a summary merged into a tool-call turn
                            // must not take the calls with it).
                            let own = insert::without_summary(&m.text());
                            return (!own.is_empty() || m.has_tool_calls())
                                .then(|| with_text(m, own));
                        }
                        Some(m.clone())
                    })
                    .collect(),
            )
        };
        let target = self.target_tokens(self.counter.count_messages(&span));
        let egress = &self.egress;
        // The handle the summary's note will name (archived by the host):
        // what the ledger collapses points there.
        let handle = request.archive.then(|| {
            let replaced: Vec<Message> = plan.middle().map(|i| messages[i].clone()).collect();
            crate::store::span_handle(&replaced)
        });
        SpanInputs {
            handle,
            turns: egress.messages(&summarizer_input(&span, &self.options.digest).messages),
            previous: previous.map(|p| egress.string(&p)),
            focus: request.focus_topic.as_deref().map(|f| egress.string(f)),
            memory: Some(egress.string(&sanitize_memory_context(&request.memory_context)))
                .filter(|m| !m.is_empty()),
            target,
            ledger: self.ledger_tokens(),
            tool_channel: ToolChannel::of(messages, self.options.text_actions()),
            text_actions: self.options.text_actions().clone(),
        }
    }

    /// The summary prepared in the background, if it belongs to a prefix
    /// of `messages` (same messages up to its cut, no compaction since)
    /// whose cut is still safe; a stale one is dropped.
    /// One written without the request's focus (or with another) is
    /// stale too.
    fn take_prepared(&mut self, messages: &[Message], request: &CompressRequest) -> Option<Ready> {
        let ready = self.prepared.take()?;
        let focus = request
            .focus_topic
            .as_deref()
            .map(|f| self.egress.string(f));
        if ready.inputs.focus != focus {
            return None;
        }
        let (head_end, tail_start) = (ready.plan.head_end, ready.plan.tail_start);
        if tail_start >= messages.len()
            || prefix_key(&messages[..tail_start], self.state.compression_count) != ready.key
        {
            return None;
        }
        let cuts =
            CutPoints::with_profile(messages, self.options.profile, self.options.text_actions());
        (cuts.is_safe(head_end) && cuts.is_safe(tail_start)).then_some(ready)
    }

    /// Whether compacting the request `messages` (`tokens` long) now,
    /// before the threshold, pays for itself (see
    /// [`Scheduler::compaction_pays`]). The extractive summarizer runs
    /// locally and costs nothing; any other is priced as a call to the
    /// session's provider.
    pub(super) fn early_compaction_pays(&self, messages: &[Message], tokens: u64) -> bool {
        let threshold = self.state.threshold_tokens;
        let from = self.scheduler.compaction_floor(self.cold_call);
        if threshold == 0
            || tokens >= threshold
            || from >= 1.0
            || (tokens as f64) < from * threshold as f64
            || self.scheduler.state().growth_per_call == 0
        {
            return false;
        }
        let Ok(plan) = self.plan(messages) else {
            return false;
        };
        let c = self.counter.as_ref();
        let head: usize = messages[..plan.head_end]
            .iter()
            .chain(plan.pinned.map(|u| &messages[u]))
            .map(|m| c.count_message(m))
            .sum();
        let span = self.span_estimate(messages, &plan);
        let summary = self.target_tokens(span) as u64;
        let billed = self.primary.name() != self.fallback.name();
        let estimate = CompactionEstimate {
            request_tokens: tokens,
            head_tokens: (head + c.request_overhead()) as u64,
            after_tokens: self.kept_estimate(messages, &plan),
            summary_tokens: summary,
            summarizer_input_tokens: if billed { span as u64 } else { 0 },
            summarizer_output_tokens: if billed { summary } else { 0 },
        };
        self.scheduler
            .compaction_pays(&estimate, threshold, self.cold_call)
    }

    fn start_cooldown(&mut self, error: &SummarizeError) -> Duration {
        let length = match error {
            SummarizeError::NotConfigured(_) => COOLDOWN_NOT_CONFIGURED,
            SummarizeError::Timeout(_)
            | SummarizeError::RateLimited { .. }
            | SummarizeError::Server { .. } => {
                let i = self.transient_failures.min(COOLDOWN_TRANSIENT.len() - 1);
                self.transient_failures += 1;
                COOLDOWN_TRANSIENT[i]
            }
            SummarizeError::Malformed(_) | SummarizeError::Empty => COOLDOWN_MALFORMED,
            _ => COOLDOWN_OTHER,
        };
        self.cooldown_until = Some(self.clock.now() + length);
        length
    }

    fn finish(&mut self, report: CompactionReport) {
        self.last_report = Some(report);
    }

    /// One compaction, with the agent's ask applied when there is one
    /// (forced, its focus): the ask ends with the attempt (a compaction or
    /// its failure), unless the summary is still being prepared; each
    /// compaction is noted for
    /// `context_status`.
    pub(super) fn compress_inner(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Result<Compaction, EngineError> {
        let asked = self.asked_request(request);
        let by_agent = asked.is_some();
        let request = asked.as_ref().unwrap_or(request);
        let result = self.compress_once(messages, request);
        match &result {
            Ok(compaction) => {
                self.asked = None;
                let report = &compaction.report;
                let archived = report.summarized.filter(|_| request.archive).map(|span| {
                    let replaced: Vec<Message> = (span.start..span.end)
                        .filter(|&i| Some(i) != report.pinned)
                        .filter_map(|i| messages.get(i).cloned())
                        .collect();
                    crate::store::span_handle(&replaced)
                });
                let note = CompactionNote {
                    number: self.state.compression_count,
                    messages_summarized: report.summarized_messages,
                    tokens_before: report.tokens_before,
                    tokens_after: report.tokens_after,
                    summarizer: report.summarizer.clone(),
                    focus: request
                        .focus_topic
                        .as_deref()
                        .map(|f| self.egress.string(f)),
                    archived,
                    asked_by_agent: by_agent,
                };
                self.note_compaction(note);
            }
            // Waiting for a summary prepared in the background: the ask
            // stands. Any other failure ends it (said in the report), so a
            // compaction that cannot succeed is not retried on every call.
            Err(EngineError::SummaryNotReady { .. }) => {}
            Err(_) => self.asked = None,
        }
        result
    }

    fn compress_once(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Result<Compaction, EngineError> {
        let tokens_before = self.counter.count_messages(messages) as u64;
        let threshold = self.state.threshold_tokens;
        let unchanged = |outcome| {
            CompactionReport::unchanged(outcome, messages.len(), tokens_before, threshold)
        };
        if !request.force
            && let Some(reason) = self.block_reason()
        {
            self.finish(CompactionReport {
                reason: Some(reason.to_string()),
                ..unchanged(Outcome::Blocked)
            });
            return Err(EngineError::Blocked {
                engine: NAME.to_owned(),
                reason,
            });
        }
        // A summary prepared in the background for a prefix of this
        // history: its cut stands, everything after it stays verbatim.
        let ready = self.take_prepared(messages, request);
        if ready.is_none() && request.summary == SummarySource::Prepared {
            self.finish(CompactionReport {
                reason: Some("the background summary is not ready".into()),
                ..unchanged(Outcome::Deferred)
            });
            return Err(EngineError::SummaryNotReady {
                engine: NAME.to_owned(),
            });
        }
        let mut escalation: Vec<FitStep> = Vec::new();
        let plan = match &ready {
            Some(r) => r.plan.clone(),
            None => match self.plan_for(messages, tokens_before, request.force, &mut escalation) {
                Ok(plan) => plan,
                Err(why) => {
                    let why = why.to_string();
                    self.finish(CompactionReport {
                        reason: Some(why.clone()),
                        ..unchanged(Outcome::NothingToCompress)
                    });
                    return Err(EngineError::NothingToCompress {
                        engine: NAME.to_owned(),
                        reason: why,
                    });
                }
            },
        };

        let Written {
            body,
            outcome,
            summarizer,
            reason,
            cooldown,
            target,
        } = self.write_summary(messages, &plan, request, ready, tokens_before)?;
        let mut body = self.egress.string(&body);
        if request.archive {
            let replaced: Vec<Message> = plan.middle().map(|i| messages[i].clone()).collect();
            let handle = crate::store::span_handle(&replaced);
            let channel = ToolChannel::of(messages, self.options.text_actions());
            body =
                insert::with_archive_note(&body, plan.head_end, plan.tail_start, &handle, channel);
        }
        let wrapped = wrap_summary(&body);

        // Under the cache-aware schedule the head stays byte for byte what
        // the provider has cached: the summary's own prefix says what the
        // system note would, so the system prompt is not edited.
        let system_note = !self.options.schedule.enabled;
        let (mut out, placement) = assemble(
            messages,
            &plan,
            &wrapped,
            self.options.profile,
            self.options.text_actions(),
            system_note,
        );
        let mut tokens_after = self.counter.count_messages(&out) as u64;
        // The rest of the ladder on the compacted transcript.
        let mut unfittable = None;
        // Thrash aims deeper, and so does a compaction close behind the
        // previous one: room for THRASH_CALLS calls of the session's growth
        // under the threshold (at most two fifths of it), so the next
        // compaction is that many calls away.
        let thrash = self.thrash();
        let deep = match self.calls_since_compaction {
            Some(n) if n > 0 && n < 2 * THRASH_CALLS => {
                let growth = self.scheduler.state().growth_per_call.max(threshold / 10);
                let room = (u64::from(THRASH_CALLS) * growth).min(threshold * 2 / 5);
                threshold - room
            }
            _ => threshold,
        };
        if deep > 0 && tokens_after > deep {
            let result = self.fit_ladder(&out, deep, threshold);
            match result {
                Ok(fitted) => {
                    if let Some(shrink) = escalation.first_mut() {
                        shrink.tokens_after = tokens_after;
                    }
                    escalation.extend(fitted.steps);
                    out = fitted.messages;
                    tokens_after = fitted.tokens_after;
                }
                Err(e) => unfittable = Some(e),
            }
        } else if let Some(shrink) = escalation.first_mut() {
            shrink.tokens_after = tokens_after;
        }
        let report = CompactionReport {
            outcome,
            messages_before: messages.len(),
            messages_after: out.len(),
            tokens_before,
            tokens_after,
            threshold_tokens: threshold,
            head: Some(Span::new(0, plan.head_end)),
            pinned: plan.pinned,
            tail: Some(Span::new(plan.tail_start, messages.len())),
            summarized: Some(Span::new(plan.head_end, plan.tail_start)),
            summarized_messages: plan.middle().count(),
            summarizer: Some(summarizer),
            placement: Some(placement),
            target_tokens: target,
            summary_tokens: self.counter.count_text(&wrapped),
            iterative: plan.previous.is_some(),
            reason,
            cooldown_seconds: cooldown,
            within_budget: tokens_after <= threshold,
            escalation,
            unfittable,
            thrash,
        };
        self.check_compacted(messages, &out, tokens_before, tokens_after, &report)?;
        self.finish(report.clone());
        self.calls_since_compaction = Some(0);
        self.state.record_compression();
        self.awaiting_effect = Some(tokens_before);
        Ok(Compaction::with_report(out, report))
    }

    /// The summary of `plan`'s middle: the one prepared in the background
    /// (`ready`), else the primary summarizer's, else (a fallback, or no
    /// model asked) the deterministic one; an aborting failure is the
    /// compaction's error.
    fn write_summary(
        &mut self,
        messages: &[Message],
        plan: &Plan,
        request: &CompressRequest,
        ready: Option<Ready>,
        tokens_before: u64,
    ) -> Result<Written, EngineError> {
        let threshold = self.state.threshold_tokens;
        let unchanged = |outcome| {
            CompactionReport::unchanged(outcome, messages.len(), tokens_before, threshold)
        };
        let (result, primary_name, inputs, stand_in) = match ready {
            Some(r) => (r.result, r.summarizer, r.inputs, false),
            None => {
                let inputs = self.span_inputs(messages, plan, request);
                let result = if request.summary == SummarySource::Deterministic {
                    None
                } else {
                    Some(match self.primary.summarize(&inputs.request()) {
                        Ok(text) if text.trim().is_empty() => Err(SummarizeError::Empty),
                        other => other,
                    })
                };
                let name = self.primary.name().to_owned();
                match result {
                    Some(result) => (result, name, inputs, false),
                    None => {
                        // Not the summary model's failure: no cooldown and
                        // no streak, the deterministic summary stands in.
                        let text = self.fallback.summarize_span(&inputs.request());
                        (Ok(text), self.fallback.name().to_owned(), inputs, true)
                    }
                }
            }
        };
        let (body, outcome, summarizer, reason, cooldown) = match result {
            Ok(text) if stand_in => (
                text,
                Outcome::Fallback,
                primary_name,
                Some("the background summary was not ready".to_owned()),
                None,
            ),
            Ok(text) => {
                self.cooldown_until = None;
                self.transient_failures = 0;
                self.fallback_streak = 0;
                (text, Outcome::Compacted, primary_name, None, None)
            }
            Err(error) => {
                let cooldown = self.start_cooldown(&error);
                if error.action() == FailureAction::Abort {
                    self.finish(CompactionReport {
                        summarizer: Some(primary_name),
                        reason: Some(error.to_string()),
                        cooldown_seconds: Some(cooldown.as_secs()),
                        ..unchanged(Outcome::Aborted)
                    });
                    return Err(EngineError::Summarizer {
                        engine: NAME.to_owned(),
                        reason: error.to_string(),
                        cooldown_seconds: Some(cooldown.as_secs()),
                        source: Some(Box::new(error)),
                    });
                }
                self.fallback_streak = self.fallback_streak.saturating_add(1);
                let text = self.fallback.summarize_span(&inputs.request());
                (
                    text,
                    Outcome::Fallback,
                    self.fallback.name().to_owned(),
                    Some(error.to_string()),
                    Some(cooldown.as_secs()),
                )
            }
        };
        Ok(Written {
            body,
            outcome,
            summarizer,
            reason,
            cooldown,
            target: inputs.target,
        })
    }

    /// The history fit of a compacted `out` over `deep` (the threshold, or
    /// a deeper one after a recent compaction): under it, else above it up
    /// to the ledger's ceiling, else the window; the first budget whose fit
    /// keeps the state record whole and needs no truncation, else the first
    /// that keeps the record, else the first fit.
    fn fit_ladder(
        &self,
        out: &[Message],
        deep: u64,
        threshold: u64,
    ) -> Result<fit::Fitted, crate::engine::Unfittable> {
        let counter = self.counter.as_ref();
        let fit_to = |budget| {
            fit::fit_history(
                out,
                budget,
                counter,
                self.options.profile,
                self.options.text_actions(),
            )
        };
        // Under the (deeper) threshold, else above it up to the
        // ledger's ceiling, else the window: the first budget whose fit
        // keeps the state record whole and needs no truncation (which
        // leaves turns out), else the first fit. A stored history never
        // cuts its state record to fit; a request that cannot hold it
        // says so.
        let ceiling = ledger_ceiling(
            self.state.context_length,
            threshold,
            self.state.reply_reserve,
        );
        let whole = |f: &fit::Fitted| {
            ledger_kept(out, &f.messages) && f.steps.iter().all(|s| s.step != FitStepKind::Truncate)
        };
        let mut budgets = vec![deep, threshold, ceiling, self.state.context_length];
        budgets.dedup();
        // Else the first that keeps the record, else the first fit.
        let mut result = None;
        let (mut first_kept, mut first_ok) = (None, None);
        for budget in budgets {
            match fit_to(budget) {
                Ok(f) if whole(&f) => {
                    result = Some(Ok(f));
                    break;
                }
                Ok(f) if first_kept.is_none() && ledger_kept(out, &f.messages) => {
                    first_kept = Some(f);
                }
                Ok(f) => {
                    first_ok.get_or_insert(f);
                }
                Err(e) if budget == threshold => result = Some(Err(e)),
                Err(_) => {}
            }
        }
        match (result, first_kept.or(first_ok)) {
            (Some(Ok(f)), _) => Ok(f),
            (_, Some(f)) => Ok(f),
            (Some(Err(e)), None) => Err(e),
            (None, None) => fit_to(threshold),
        }
    }

    /// Refuses a compaction that is not smaller than its input, or whose
    /// output adds a same-role pair or a violation its input did not have
    /// (the input then stays, and the report says why).
    fn check_compacted(
        &mut self,
        messages: &[Message],
        out: &[Message],
        tokens_before: u64,
        tokens_after: u64,
        report: &CompactionReport,
    ) -> Result<(), EngineError> {
        let threshold = self.state.threshold_tokens;
        let unchanged = |outcome| {
            CompactionReport::unchanged(outcome, messages.len(), tokens_before, threshold)
        };
        if tokens_after >= tokens_before {
            let why = format!(
                "the summary would not be smaller than the {} messages it replaces",
                report.summarized_messages
            );
            self.finish(CompactionReport {
                reason: Some(why.clone()),
                ..unchanged(Outcome::NothingToCompress)
            });
            return Err(EngineError::NothingToCompress {
                engine: NAME.to_owned(),
                reason: why,
            });
        }
        if let Some(i) = introduced_adjacency(messages, out, self.options.profile) {
            let why = format!(
                "message {i}: the summary's placement would put two `{}` turns in a row",
                out[i].role
            );
            self.finish(CompactionReport {
                reason: Some(why.clone()),
                ..unchanged(Outcome::InvalidOutput)
            });
            return Err(EngineError::InvalidOutput {
                engine: NAME.to_owned(),
                violation: Violation::new(i, Rule::ConsecutiveSameRole, why),
            });
        }
        if let Some(v) = introduced_violation(messages, out, self.options.profile) {
            self.finish(CompactionReport {
                reason: Some(v.to_string()),
                ..unchanged(Outcome::InvalidOutput)
            });
            return Err(EngineError::InvalidOutput {
                engine: NAME.to_owned(),
                violation: v,
            });
        }
        Ok(())
    }
}

/// A compaction's summary as [`Compressor::write_summary`] wrote it.
struct Written {
    body: String,
    outcome: Outcome,
    summarizer: String,
    reason: Option<String>,
    cooldown: Option<u64>,
    target: usize,
}

/// The summarizer's input for one span, owned so a background job can
/// take it to another thread.
pub(super) struct SpanInputs {
    pub(super) handle: Option<String>,
    pub(super) turns: Vec<Message>,
    pub(super) previous: Option<String>,
    pub(super) focus: Option<String>,
    pub(super) memory: Option<String>,
    pub(super) target: usize,
    pub(super) ledger: usize,
    pub(super) tool_channel: ToolChannel,
    pub(super) text_actions: crate::validate::TextActions,
}

impl SpanInputs {
    pub(super) fn request(&self) -> SummaryRequest<'_> {
        let mut r = SummaryRequest::new(&self.turns, self.target)
            .with_ledger_tokens(self.ledger)
            .with_tool_channel(self.tool_channel)
            .with_text_actions(&self.text_actions);
        if let Some(p) = &self.previous {
            r = r.with_previous_summary(p);
        }
        if let Some(f) = &self.focus {
            r = r.with_focus_topic(f);
        }
        if let Some(m) = &self.memory {
            r = r.with_memory_context(m);
        }
        if let Some(h) = &self.handle {
            r = r.with_archive_handle(h);
        }
        r
    }
}

/// A summary prepared in the background: the cut it was made for, the
/// key of the history prefix up to that cut, the summarizer's answer (a
/// failure falls back to the extractive summary of the same inputs, as
/// inline).
pub(super) struct Ready {
    pub(super) key: u128,
    pub(super) plan: Plan,
    pub(super) result: Result<String, SummarizeError>,
    pub(super) summarizer: String,
    pub(super) inputs: SpanInputs,
}

/// How far the rough estimate may grow past the last real count before
/// preflight stops trusting it: 5% of the threshold, at least 4096 tokens
/// (one large tool result) but never more than 10% of the threshold, so a
/// small window cannot go out over its threshold on the strength of a stale
/// count.
pub(super) fn preflight_slack(threshold: u64) -> u64 {
    (threshold / 20).max(4096.min(threshold / 10))
}

/// `message` with its content replaced by `text`.
fn with_text(message: &Message, text: String) -> Message {
    let mut out = message.clone();
    out.content = Content::Text(text);
    out
}

/// The compacted transcript: head (system note added when `system_note`),
/// pinned user message, summary, tail.
fn assemble(
    messages: &[Message],
    plan: &Plan,
    wrapped: &str,
    profile: Profile,
    actions: &crate::validate::TextActions,
    system_note: bool,
) -> (Vec<Message>, Placement) {
    let mut out: Vec<Message> = Vec::with_capacity(plan.kept() + 1);
    let system = messages[..plan.head_end]
        .iter()
        .position(|m| m.role == crate::message::Role::System);
    for (i, m) in messages[..plan.head_end].iter().enumerate() {
        out.push(if Some(i) == system && system_note {
            insert::with_system_note(m)
        } else {
            m.clone()
        });
    }
    // A summary merged into the pinned ask is carried by the new one.
    let pinned = plan.pinned.map(|u| {
        let m = &messages[u];
        match is_summary(m) {
            true => with_text(m, insert::without_summary(&m.text())),
            false => m.clone(),
        }
    });
    let tail = &messages[plan.tail_start..];
    // Also where the summary would be merged into the tail's first
    // message (both roles collide between the pinned ask and the tail):
    // before the ask it stands on its own and the tail stays verbatim.
    let before_ask = |ask: &Message| {
        let mut with_ask = out.clone();
        with_ask.push(ask.clone());
        // Never the conversation's opening turn: every front's first
        // message is the user's (Anthropic requires it).
        !tail.is_empty()
            && out.iter().any(|m| !m.role.is_instruction())
            && insert::choose_placement(&with_ask, tail, true, profile) == Placement::Merged
            && crate::validate::may_place(
                &out,
                &crate::message::Role::Assistant,
                std::slice::from_ref(ask),
                profile,
            )
    };
    if let Some(ask) = pinned.clone()
        && (plan.summary_first || before_ask(&ask))
    {
        // Head, the summary as the assistant's turn, the ask, the tail:
        // the order strict alternation allows without growing the head.
        out.push(Message::assistant(wrapped));
        out.push(ask);
        out.extend(tail.iter().cloned());
        return (out, Placement::Assistant);
    }
    if let Some(ask) = pinned {
        out.push(ask);
    }
    let asks_in = |part: &[Message]| {
        (0..part.len())
            .any(|i| crate::validate::is_real_user_turn(part, i, actions) && !is_summary(&part[i]))
    };
    let user_survives = asks_in(&out) || asks_in(tail);
    let placement = insert::choose_placement(&out, tail, user_survives, profile);
    match placement {
        Placement::User => out.push(Message::user(wrapped)),
        Placement::Assistant => out.push(Message::assistant(wrapped)),
        Placement::Merged => {}
    }
    for (k, m) in tail.iter().enumerate() {
        if k == 0 && placement == Placement::Merged {
            out.push(insert::prepend_text(m, wrapped));
        } else {
            out.push(m.clone());
        }
    }
    (out, placement)
}
