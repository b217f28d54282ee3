//! Operations endpoints: liveness, metrics, one session's status.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::ServeError;
use crate::identity::Identity;
use crate::session::key::SessionKey;
use crate::state::AppState;

/// `GET /healthz`: 200 `ok`, or 503 `degraded: …` while the session store
/// does not answer (the proxy keeps serving, unmanaged, but a balancer
/// should prefer a healthy instance). The reason names no URL, host or
/// credential (the store's error, which may, is in the logs only). A
/// degraded check starts the store's probe when one is due (in the
/// background, one at a time: see [`crate::session::breaker`]), so
/// recovery shows without traffic; it never waits for the store.
pub async fn healthz(State(state): State<AppState>) -> Response {
    let Some(store) = state.sessions().store().cloned() else {
        return "ok\n".into_response();
    };
    if store.health.degraded().is_some() {
        store.available();
    }
    match store.health.degraded() {
        None => "ok\n".into_response(),
        Some((_, since)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "degraded: session store unavailable for {} s, requests go unmanaged\n",
                since.as_secs()
            ),
        )
            .into_response(),
    }
}

/// Why a request without an identity gets no session status.
const NO_IDENTITY: &str = "session status needs an identity: send your own provider key \
     (Authorization, api-key or x-api-key), or, behind the proxy's access token, the \
     identity header the operator configured (serve.identity_header)";

/// `GET /metrics`: Prometheus (OpenMetrics) text.
pub async fn metrics(State(state): State<AppState>) -> Response {
    state.metrics().set_sessions(state.sessions().len());
    state.metrics().set_inflight_bytes(state.inflight().used());
    let mut response = state.metrics().encode().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// `GET /ctx/sessions/{id}`: the engine's status and the session's
/// figures, for a session of the caller's own identity; refused (403) to
/// a request without one, whose sessions any other anonymous client
/// shares.
pub async fn session_status(
    State(state): State<AppState>,
    Path(id): Path<String>,
    identity: Identity,
) -> Result<Json<serde_json::Value>, ServeError> {
    if identity.reader().is_none() {
        return Err(ServeError::NoIdentity(NO_IDENTITY.to_owned()));
    }
    let key = SessionKey {
        scope: identity.scope(),
        id: id.clone(),
    };
    let slot = state
        .sessions()
        .get(&key)
        .ok_or_else(|| ServeError::SessionNotFound(id.clone()))?;
    // A request in flight holds the session; wait for it a little.
    let guard = tokio::time::timeout(Duration::from_secs(5), slot.state.lock())
        .await
        .map_err(|_| ServeError::BadRequest("the session is busy, try again".into()))?;
    let Some(managed) = guard.as_ref() else {
        if state.sessions().store().is_some() {
            // Asleep (or dropped after a store error): the store holds it
            // and its next request loads it.
            return Ok(Json(serde_json::json!({
                "id": id,
                "asleep": true,
                "in_store": true,
            })));
        }
        return Err(ServeError::SessionNotFound(id));
    };
    // In observe mode the figures are what the engine would have sent.
    let mode = match state.options().mode {
        crate::options::ServeMode::Observe => "observe",
        crate::options::ServeMode::Managed => "managed",
    };
    Ok(Json(serde_json::json!({
        "id": id,
        "mode": mode,
        "engine": managed.host().engine().name(),
        "status": managed.host().status(),
        "stats": managed.stats,
        "managed_messages": managed.managed_messages(),
        "heap_bytes": managed.heap_bytes(),
        "asleep": managed.is_asleep(),
    })))
}
