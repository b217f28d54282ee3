//! Background summaries: where a session's [`SummaryJob`] runs.
//!
//! When a request's prompt reaches the summary watermark, the session's
//! plan carries a job ([`Plan::summary_job`](super::Plan::summary_job)).
//! [`spawn`] runs it on tokio's blocking pool (bounded; a summary model
//! call blocks on HTTP) without the session's lock, so the session's
//! requests go on meanwhile; the result travels back on a oneshot channel
//! that the session's next request polls without waiting
//! ([`Managed::await_summary`]). At most one job per session is in
//! flight; an idle session has none. A job whose session started a new
//! lineage (its receiver dropped) is skipped if it has not started, and
//! its result ignored if it has; a result that no longer matches the
//! history is dropped by the engine when it would use it.
//!
//! The job runs in the [`summarizer::in_scope`] of the request that
//! started it: an upstream summarizer (`summarizer.kind: upstream`) asks
//! that request's upstream, in its API, with its credential; what the call
//! spent is counted (`ctx_summary_*`) and travels back with the summary
//! to the session's figures.
//!
//! [`SummaryClaims`] is the seam for a fleet sharing a store: before a job
//! runs, the claim for its key is asked for, so two servers do not compute
//! the same summary.

use std::sync::Arc;

use context_engine::engine::SummaryJob;
use tokio::sync::oneshot;

use super::{Background, Managed};
use crate::metrics::SummaryMeter;
use crate::summarizer::{self, Target};

/// Who computes a background summary when several servers share sessions.
pub trait SummaryClaims: Send + Sync {
    /// Whether this server should compute the summary keyed `key`
    /// ([`SummaryJob::key`]: the history prefix it summarizes) of session
    /// `session`; `false` when another server holds the claim. Called on
    /// the blocking pool, so it may do I/O.
    fn claim(&self, session: &str, key: u128) -> bool;
}

/// Runs `job` for `session` off the request path and lets `managed` adopt
/// its result on a later request. `target` is the request that started
/// it (what an upstream summarizer asks, with which credential and
/// model); `meter` counts a model call's outcome and tokens.
pub fn spawn(
    managed: &mut Managed,
    session: &str,
    job: SummaryJob,
    claims: Option<Arc<dyn SummaryClaims>>,
    (target, meter): (Target, SummaryMeter),
) {
    let (tx, rx) = oneshot::channel();
    managed.await_summary(rx);
    let session = session.to_owned();
    tokio::task::spawn_blocking(move || {
        if tx.is_closed() {
            return;
        }
        if let Some(claims) = &claims
            && !claims.claim(&session, job.key())
        {
            tracing::debug!(session = %session, "background summary claimed elsewhere");
            return;
        }
        let messages = job.messages();
        let (done, spent) = summarizer::in_scope(target, || job.run());
        if let Some(spent) = &spent {
            meter.call(spent.failure.is_none(), &spent.stats);
            if let Some(why) = &spent.failure {
                tracing::warn!(
                    session = %session, reason = %why,
                    "summary call failed: the extractive summary stands in"
                );
            }
        }
        tracing::info!(
            session = %session, messages,
            elapsed_ms = done.elapsed().as_secs_f64() * 1e3,
            prompt_tokens = spent.as_ref().and_then(|s| s.stats.prompt_tokens),
            completion_tokens = spent.as_ref().and_then(|s| s.stats.completion_tokens),
            "background summary ready"
        );
        // The session may have moved on to a new lineage: then nobody
        // listens, and the summary is dropped.
        let _ = tx.send(Background {
            summary: done,
            spent,
        });
    });
}
