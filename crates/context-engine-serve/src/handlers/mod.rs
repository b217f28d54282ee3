//! Request handlers: thin; they parse, call the session driver, and
//! forward through [`upstream`](crate::upstream).

pub mod chat;
pub(crate) mod count_tokens;
pub(crate) mod managed;
pub mod messages;
pub mod observe;
pub mod ops;
pub mod passthrough;
pub(crate) mod relay;
pub mod responses;
pub mod ui;
pub(crate) mod view;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use std::time::Instant;

use context_engine::front::FrontKind;
use context_engine::summarize::model::ReplyShape;

use crate::error::ServeError;
use crate::session::calls::{CallPoint, CompactionMark, Marks};
use crate::session::requests::{KeptCall, Wire};
use crate::session::{Guard, Plan, SessionKey, background};
use crate::state::AppState;
use crate::summarizer::Target;
use crate::upstream::response_headers;
pub(crate) use crate::usage::{settle, usage_of};

/// Logs what the engine did for a managed request (notices, a compaction,
/// a new lineage) and counts it in the metrics. `front`: the client
/// format and whether a compaction's summary got a cache breakpoint, for
/// the Anthropic and Responses fronts.
pub(crate) fn report_plan(
    state: &AppState,
    session: &str,
    plan: &crate::session::Plan,
    front: Option<(context_engine::front::FrontKind, bool)>,
) {
    for n in &plan.notices {
        tracing::info!(session = %session, notice = %n.text, "engine");
    }
    state.metrics().engine_warnings(&plan.notices);
    if let Some(c) = &plan.compaction {
        state.metrics().compaction();
        let (front, prefix_breakpoint) = front.unzip();
        let front = front.map(|k| k.to_string());
        tracing::info!(
            session = %session, front = ?front, tokens_before = c.tokens_before,
            tokens_after = c.tokens_after, messages_before = c.messages_before,
            messages_after = c.messages_after, prefix_breakpoint = ?prefix_breakpoint,
            elapsed_ms = c.elapsed.as_secs_f64() * 1e3, "compacted"
        );
    }
    if plan.diverged {
        state.metrics().lineage();
        tracing::info!(session = %session, "client history diverged: new lineage");
    }
    state
        .metrics()
        .prompt(plan.messages_json.len(), plan.reused_bytes);
}

/// Where a request goes upstream: its URL and the headers it carries
/// there (what a background summary it starts asks with).
#[derive(Clone, Copy)]
pub(crate) struct SentTo<'a> {
    pub url: &'a str,
    pub headers: &'a HeaderMap,
}

/// The engine's plan for a managed request, accounted: a summary due in
/// the background starts now (off the request path), the plan is logged
/// and counted ([`report_plan`]) or, when the engine failed, the fallback
/// is counted and the reason kept in the session's stats. Whether the
/// request is managed.
pub(crate) fn account_plan(
    state: &AppState,
    guard: &mut Guard,
    (key, to): (&SessionKey, SentTo<'_>),
    plan: Result<&mut Plan, &(dyn std::error::Error + 'static)>,
    front: Option<(FrontKind, bool)>,
) -> bool {
    match plan {
        Ok(plan) => {
            if let (Some(job), Some(m)) = (plan.summary_job.take(), guard.as_mut()) {
                let api = match front {
                    None => ReplyShape::Chat,
                    Some((FrontKind::Anthropic, _)) => ReplyShape::Messages,
                    Some((FrontKind::Responses, _)) => ReplyShape::Responses,
                };
                let window = m.host().engine().state().context_length;
                let target = Target::of(
                    api,
                    to.url,
                    to.headers,
                    m.model().map(str::to_owned),
                    window,
                );
                let meter = state.metrics().summaries();
                let claims = state.sessions().summary_claims();
                background::spawn(m, &key.id, job, claims, (target, meter));
            }
            report_plan(state, &key.id, plan, front);
            state
                .metrics()
                .managed_tokens(plan.client_tokens, plan.request_tokens);
            if let Some(m) = guard.as_mut() {
                m.stats.managed += 1;
                if let Some(last) = plan.compaction.as_ref().and_then(|c| c.reports.last()) {
                    m.stats.last_summarizer.clone_from(&last.summarizer);
                    m.stats.last_summary_fallback.clone_from(&last.reason);
                }
                log_call(state, key, m, plan);
            }
            true
        }
        Err(why) => {
            let why = context_engine::error_chain(why);
            state.metrics().fallback_because(&why);
            if let Some(m) = guard.as_mut() {
                m.stats.fallbacks += 1;
                m.stats.last_fallback = Some(why.clone());
            }
            let front = front.map(|(k, _)| k.to_string());
            tracing::warn!(session = %key.id, front = ?front, reason = %why, "request sent unmanaged");
            false
        }
    }
}

/// Keeps the call for the page at `/ui` (when it is on): what the client
/// sent, what went upstream, the engine's marks.
fn log_call(state: &AppState, key: &SessionKey, m: &crate::session::Managed, plan: &Plan) {
    let capacity = state.sessions().call_log();
    if capacity == 0 {
        return;
    }
    let Some(slot) = state.sessions().get(key) else {
        return;
    };
    let marks = Marks {
        compaction: plan.compaction.is_some(),
        digest: plan.selected,
        prune: plan.pruned > 0,
        diverged: plan.diverged,
    };
    let compaction = plan.compaction.as_ref().map(|c| CompactionMark {
        call: 0,
        last_record: m.host().records_numbered(),
        passes: c.passes,
        request_tokens_before: c.request_tokens_before,
        request_tokens_after: c.request_tokens_after,
        messages_before: c.messages_before,
        messages_after: c.messages_after,
    });
    let point = CallPoint::new(plan.client_tokens, plan.request_tokens, marks);
    slot.calls
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(point, compaction, capacity);
}

/// Keeps a managed call's bodies for the page's view of a call's request
/// (when it is on): the client's as it came, the upstream's as it goes; two
/// reference counts, nothing copied.
pub(crate) fn keep_request(
    state: &AppState,
    slot: &crate::session::Slot,
    key: &SessionKey,
    wire: Wire,
    (client, upstream): (&Bytes, &Bytes),
) {
    let log = state.sessions().requests();
    // Calls are named by their number in the call log: none without it.
    if !log.is_on() || state.sessions().call_log() == 0 {
        return;
    }
    let call = slot
        .calls
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .total();
    log.keep(KeptCall {
        key: key.clone(),
        call,
        wire,
        client: client.clone(),
        upstream: upstream.clone(),
    });
}

/// Runs an engine step that may block (an engine that blocks on I/O, a
/// session store) off the async workers when `blocking`: in place on the
/// blocking side of a multi-threaded runtime (its other tasks move to
/// another worker meanwhile), so the step borrows the request as parsed.
pub(crate) fn engine_step<T>(blocking: bool, step: impl FnOnce() -> T) -> T {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if blocking && multi {
        tokio::task::block_in_place(step)
    } else {
        step()
    }
}

/// A non-streamed call's answer, read whole (`result`), settled: its
/// usage to the metrics and the session (`guard`, released), its latency
/// under `route`; the answer for the client.
pub(crate) fn answer_collected(
    state: &AppState,
    route: &str,
    guard: Option<Guard>,
    (started, up_started): (Instant, Instant),
    result: Result<(StatusCode, HeaderMap, Bytes), ServeError>,
) -> Response {
    let up = up_started.elapsed();
    let (status, resp_headers, bytes) = match result {
        Ok(r) => r,
        Err(e) => {
            state.sessions().release(guard, None);
            return e.into_response();
        }
    };
    let usage = status.is_success().then(|| usage_of(&bytes)).flatten();
    if let Some(usage) = &usage {
        settle(state, usage);
    }
    state.sessions().release(guard, usage);
    let total = started.elapsed();
    state.metrics().latency(
        route,
        up.as_secs_f64(),
        total.saturating_sub(up).as_secs_f64(),
    );
    respond(status, resp_headers, Body::from(bytes))
}

/// A response from parts (status, upstream headers already filtered).
pub(crate) fn respond(status: StatusCode, headers: axum::http::HeaderMap, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// Opens a streamed upstream call: its status, filtered headers and the
/// response to relay when it succeeded; otherwise the answer the client
/// gets (a transport error, or the error status with its body, whole).
pub(crate) async fn open_stream(
    state: &AppState,
    url: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, HeaderMap, reqwest::Response), Response> {
    let resp = state
        .upstream()
        .send(Method::POST, url, headers, body, true)
        .await
        .map_err(IntoResponse::into_response)?;
    let status = resp.status();
    let resp_headers = response_headers(resp.headers());
    if !status.is_success() {
        let bytes = resp.bytes().await.unwrap_or_default();
        return Err(respond(status, resp_headers, Body::from(bytes)));
    }
    Ok((status, resp_headers, resp))
}
