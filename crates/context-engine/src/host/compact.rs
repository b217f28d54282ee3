//! Compaction passes and selection, each result checked against the
//! provider rules before it is accepted.

use std::time::Instant;

use crate::engine::{
    CompactionPhase, CompactionStatusContext, CompressRequest, EngineError, SelectRequest,
    automatic_compaction_status_message,
};
use crate::message::Message;
use crate::store::{Batch, CompactionInfo, StoreError};
use crate::tokens::TokenCounter;
use crate::validate::{Violation, introduced_violation};

use super::{Compaction, Missed, MissedKind, Notice, NoticeKind, Session, Trigger, Update};

impl Session {
    /// Runs up to `max_passes` compaction passes on `history`, accepting
    /// each valid result; records everything in `update`.
    pub(super) fn compact(
        &mut self,
        history: &[Message],
        tokens: u64,
        trigger: Trigger,
        request: CompressRequest,
        update: &mut Update,
    ) {
        let trigger = if trigger != Trigger::Manual && self.engine.compaction_requested() {
            Trigger::Agent
        } else {
            trigger
        };
        let started = Instant::now();
        let mut current: Option<Vec<Message>> = None;
        let mut current_tokens = tokens;
        let mut passes = 0;
        let mut reports = Vec::new();
        // With a store: what each pass removed, committed with the state
        // once the compaction is accepted, before the caller sees it.
        let archiving = self.store.is_some();
        let before = archiving.then(|| self.engine.snapshot());
        let mut batch = Batch::new();
        while passes < self.options.max_passes.max(1) {
            let input = current.as_deref().unwrap_or(history);
            let request = request
                .clone()
                .with_current_tokens(current_tokens)
                .with_archive(archiving);
            let out = match self.engine.compress(input, &request) {
                Ok(compaction) => {
                    reports.push(compaction.report);
                    compaction.messages
                }
                Err(EngineError::SummaryNotReady { .. }) if passes == 0 => {
                    update.missed = Some(Missed {
                        trigger,
                        kind: MissedKind::Deferred,
                        reason: "the summary prepared in the background is not ready".into(),
                    });
                    break;
                }
                Err(EngineError::SummaryNotReady { .. }) => break,
                Err(err) => {
                    if passes == 0 || !matches!(err, EngineError::NothingToCompress { .. }) {
                        update.notices.push(error_notice(&err, trigger));
                    }
                    if passes == 0 {
                        update.missed = Some(Missed {
                            trigger,
                            kind: MissedKind::of(&err),
                            reason: err.to_string(),
                        });
                    }
                    break;
                }
            };
            if let Err(why) = self.check_output(input, &out) {
                reports.pop();
                let reason = format!(
                    "engine `{}`: compaction result rejected, history unchanged: {why}",
                    self.engine.name()
                );
                update.notices.push(Notice::warning(reason.clone()));
                if passes == 0 {
                    update.missed = Some(Missed {
                        trigger,
                        kind: MissedKind::Refused,
                        reason,
                    });
                }
                break;
            }
            let after = self.counter.count_messages(&out) as u64;
            if archiving {
                let report = reports.last();
                let mut info = CompactionInfo::new(
                    self.recorded + u64::from(passes) + 1,
                    trigger_name(trigger),
                    self.engine.name(),
                )
                .with_summarizer(report.and_then(|r| r.summarizer.clone()))
                .with_tokens(current_tokens, after);
                if let Some(span) = report.and_then(|r| r.summarized) {
                    info = info.with_span(span.start, span.end, report.and_then(|r| r.pinned));
                }
                batch.compaction(input, &out, &info);
            }
            passes += 1;
            let saved = current_tokens.saturating_sub(after) as f64 / current_tokens.max(1) as f64;
            current = Some(out);
            current_tokens = after;
            if trigger == Trigger::Manual
                || saved < self.options.min_pass_savings
                || !self.engine.should_compress(Some(after))
            {
                break;
            }
        }
        let Some(out) = current else { return };
        // A compaction never makes the request bigger: compare the request
        // that would have gone out with the one that will.
        let request_before = self.request_tokens(history);
        let request_after = self.request_tokens(&out);
        if request_after >= request_before {
            update.notices.push(Notice::warning(format!(
                "engine `{}`: compaction rejected, history unchanged: the request would not be smaller ({request_before} -> {request_after} tokens)",
                self.engine.name()
            )));
            return;
        }
        if let Some(calls) = reports.iter().find_map(|r| r.thrash) {
            update.notices.push(Notice::warning(format!(
                "{THRASH}: compacted again {calls} call(s) after the previous compaction (the \
                 window barely holds the system prompt and the tail), so this one kept only \
                 the last exchange"
            )));
        }
        let history_tokens = self.counter.count_messages(history) as u64;
        if archiving && let Err(e) = self.commit_compaction(batch, passes, before.as_ref()) {
            update.notices.push(Notice::warning(format!(
                "compaction not applied, history unchanged: the session store cannot archive it: {e}"
            )));
            return;
        }
        let compaction = Compaction {
            trigger,
            passes,
            tokens_before: history_tokens,
            tokens_after: current_tokens,
            request_tokens_before: request_before,
            request_tokens_after: request_after,
            messages_before: history.len(),
            messages_after: out.len(),
            elapsed: started.elapsed(),
            reports,
        };
        self.awaiting_usage = true;
        let text = format!(
            "Compacted the conversation: {} → {} tokens, {} → {} messages.",
            history_tokens,
            current_tokens,
            history.len(),
            out.len()
        );
        let notice = self.compaction_notice(trigger, tokens, text);
        update.notices.extend(notice);
        update.new_history = Some(out);
        update.compaction = Some(compaction);
    }

    /// Commits what the compaction's `passes` archived with the state
    /// after it; on failure the engine forgets the compaction (`before`).
    fn commit_compaction(
        &mut self,
        batch: Batch,
        passes: u32,
        before: Option<&serde_json::Value>,
    ) -> Result<(), StoreError> {
        let recorded = self.recorded;
        self.recorded += u64::from(passes);
        let awaiting = self.awaiting_usage;
        self.awaiting_usage = true;
        if let Err(e) = self.commit(batch) {
            // Nothing may be lost: without its archive the compaction is
            // not accepted, and the engine forgets it happened.
            self.recorded = recorded;
            self.awaiting_usage = awaiting;
            if let Some(before) = before {
                let _ = self.engine.restore(before);
            }
            return Err(e);
        }
        Ok(())
    }

    /// What the user is told of an accepted compaction (`text`, or the
    /// engine's status message for an automatic one).
    fn compaction_notice(&self, trigger: Trigger, tokens: u64, text: String) -> Option<Notice> {
        match trigger {
            Trigger::Manual => Some(Notice {
                kind: NoticeKind::Manual,
                text,
            }),
            Trigger::Preflight | Trigger::PostTool | Trigger::Agent => {
                let phase = if trigger == Trigger::PostTool {
                    CompactionPhase::Compress
                } else {
                    CompactionPhase::Preflight
                };
                let mut context = CompactionStatusContext::default().with_approx_tokens(tokens);
                let threshold = self.engine.state().threshold_tokens;
                if threshold > 0 {
                    context = context.with_threshold_tokens(threshold);
                }
                automatic_compaction_status_message(self.engine.as_ref(), phase, &text, &context)
                    .map(|text| Notice {
                        kind: NoticeKind::Status,
                        text,
                    })
            }
        }
    }

    /// `select_context` for `base`, failing open on an empty or invalid view.
    pub(super) fn select(
        &mut self,
        base: &[Message],
        notices: &mut Vec<Notice>,
    ) -> (Option<Vec<Message>>, bool) {
        let budget = self.engine.state().context_length;
        let mut request = SelectRequest::new(base, base);
        if budget > 0 {
            request = request.with_budget_tokens(budget);
        }
        match self.engine.select_context(&request) {
            None => (None, false),
            Some(view) => self.checked(base, view, notices),
        }
    }

    /// An engine's request view of `base`, kept when acceptable
    /// ([`check_output`](Self::check_output)), else dropped with a notice.
    pub(super) fn checked(
        &self,
        base: &[Message],
        view: Vec<Message>,
        notices: &mut Vec<Notice>,
    ) -> (Option<Vec<Message>>, bool) {
        match self.check_output(base, &view) {
            Ok(()) => (Some(view), true),
            Err(why) => {
                notices.push(Notice::warning(format!(
                    "engine `{}`: context selection ignored, sending the history as is: {why}",
                    self.engine.name()
                )));
                (None, false)
            }
        }
    }

    /// An engine output is acceptable when it is not empty (for a
    /// non-empty input) and adds no provider-rule violation.
    pub(super) fn check_output(
        &self,
        input: &[Message],
        output: &[Message],
    ) -> Result<(), Rejected> {
        if output.is_empty() && !input.is_empty() {
            return Err(Rejected::Empty);
        }
        match introduced_violation(input, output, self.options.profile) {
            Some(v) => Err(Rejected::Violation(v)),
            None => Ok(()),
        }
    }
}

/// Why the driver did not accept an engine's output.
#[derive(Debug, thiserror::Error)]
pub(super) enum Rejected {
    /// No messages for a non-empty input.
    #[error("the engine returned no messages")]
    Empty,
    /// A provider rule the input kept is broken.
    #[error("{0}")]
    Violation(Violation),
    /// The session store could not archive what the output left out.
    #[error("session store cannot archive it: {0}")]
    Archive(StoreError),
}

/// How a compaction record names its trigger.
fn trigger_name(trigger: Trigger) -> &'static str {
    match trigger {
        Trigger::Preflight => "preflight",
        Trigger::PostTool => "post_tool",
        Trigger::Manual => "manual",
        Trigger::Agent => "agent",
    }
}

/// The context is over the threshold but the engine holds compaction back.
/// How the warning about compaction thrash starts (what `ctx replay`, the
/// page and `/metrics` count).
pub const THRASH: &str = "compaction thrash";

pub(super) fn held_back(update: &mut Update, trigger: Trigger, reason: &impl std::fmt::Display) {
    update.notices.push(Notice::warning(format!(
        "context is over the compaction threshold, but compaction is held back: {reason}"
    )));
    update.missed = Some(Missed {
        trigger,
        kind: MissedKind::Blocked,
        reason: reason.to_string(),
    });
}

pub(super) fn error_notice(err: &EngineError, trigger: Trigger) -> Notice {
    match err {
        EngineError::NothingToCompress { .. } if trigger == Trigger::Manual => Notice {
            kind: NoticeKind::Manual,
            text: format!("Nothing to compress: {err}"),
        },
        _ => Notice::warning(format!("compaction failed, history unchanged: {err}")),
    }
}
