//! Request handlers: thin; they parse, call the session driver, and
//! forward through [`upstream`](crate::upstream).

pub mod chat;
pub(crate) mod front;
pub mod messages;
pub mod ops;
pub mod passthrough;
pub mod responses;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use context_engine::engine::Usage;
use tokio::sync::OwnedMutexGuard;

use crate::AppState;
use crate::session::{Managed, persist};
use crate::upstream::response_headers;

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

/// A session, locked for the whole of one request.
pub(crate) type Guard = OwnedMutexGuard<Option<Managed>>;

/// Settles a served request and releases its session: feeds the
/// response's usage (`None`: the call failed or reported none) to the
/// session. With a session store the state is written on the blocking
/// pool, off the client's path (the session stays locked until it is; see
/// [`persist`]), else in place.
pub(crate) fn release_with_usage(state: &AppState, guard: Option<Guard>, usage: Option<Usage>) {
    let Some(mut guard) = guard else { return };
    match state.sessions().store().cloned() {
        Some(store) => {
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                return;
            };
            rt.spawn_blocking(move || {
                persist::after_response_stored(&mut guard, usage.as_ref(), &store);
            });
        }
        None => {
            if let (Some(m), Some(usage)) = (guard.as_mut(), usage) {
                m.after_response(&usage);
            }
        }
    }
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
