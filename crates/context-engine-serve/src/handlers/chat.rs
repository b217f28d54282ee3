//! `POST /v1/chat/completions`: the managed path.
//!
//! Per request: read the body's fields raw, once ([`ChatBody`]); find the
//! session and lock it; let the session driver turn the client's full
//! history into the managed request ([`Managed::prepare`]); send it
//! upstream with every other field untouched, relayed
//! ([`relay`](super::relay)) or read whole; feed the answer's usage back.
//! An engine failure (or a managed request that would break a provider
//! rule) sends the client's request unmanaged instead; an upstream error
//! goes back with its status and body.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use crate::body::{ChatBody, with_include_usage};
use crate::error::ServeError;
use crate::handlers::relay::{self, Stream};
use crate::handlers::{account_plan, answer_collected, engine_step, keep_request, respond};
use crate::identity::Identity;
use crate::session::key::session_key;
use crate::session::requests::Wire;
use crate::session::{
    Managed, Plan, SessionContext, SessionError, SessionKey, SharedStore, persist,
};
use crate::sse::ChatReader;
use crate::state::AppState;
use crate::tools::{self, ChatRounds, StreamTools};

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    route: MatchedPath,
    identity: Identity,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let route = route.as_str();
    let out_headers = state.upstream().headers(&headers, true);
    let url = state.upstream().url("chat/completions", None);
    let parsed = match ChatBody::parse(&body) {
        Ok(parsed) => parsed,
        Err(e @ ServeError::DuplicateKey { .. }) => return e.into_response(),
        Err(why) => {
            // Not ours to judge: the provider answers it with its own error.
            tracing::warn!(reason = %why, "unreadable chat request forwarded unmanaged");
            state.metrics().fallback();
            return forward_raw(&state, &url, out_headers, body).await;
        }
    };

    // The session, and the engine's view of the client's history.
    let (key, source) = session_key(&identity, &headers, &parsed);
    let slot = state.sessions().slot(&key);
    let mut guard = Arc::clone(&slot.state).lock_owned().await;
    let ctx = Arc::clone(state.sessions().context());
    let store = state.sessions().store();
    let mut plan = engine_step(ctx.blocking || store.is_some(), || {
        prepare(&mut guard, &ctx, &key, &parsed, store)
    });
    let managed = account_plan(
        &state,
        &mut guard,
        &key,
        plan.as_mut()
            .map_err(|w| w as &(dyn std::error::Error + 'static)),
        None,
    );

    // The request that goes upstream: the managed messages, the usage
    // chunk asked for, the engine's tools offered.
    let stream = parsed.stream();
    let mut overrides: Vec<(&str, String)> = Vec::new();
    if let Ok(plan) = &mut plan {
        overrides.push(("messages", std::mem::take(&mut plan.messages_json)));
    }
    let strip_usage_chunk = stream && !parsed.include_usage();
    if strip_usage_chunk {
        overrides.push((
            "stream_options",
            with_include_usage(parsed.field("stream_options")),
        ));
    }
    let engine_tools = match identity.reader() {
        Some(reader) if state.options().engine_tools && managed => guard
            .as_ref()
            .and_then(|m| tools::schemas(reader, m, &parsed)),
        _ => None,
    };
    if let Some(t) = &engine_tools {
        overrides.push(("tools", t.tools_json.clone()));
    }
    tracing::debug!(session = %key.id, source = ?source, managed, stream, "chat request");
    let upstream_body = if overrides.is_empty() {
        body.clone()
    } else {
        let borrowed: Vec<(&str, &str)> = overrides.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Bytes::from(parsed.write(&borrowed))
    };
    if managed {
        keep_request(&state, &slot, &key, Wire::Chat, (&body, &upstream_body));
    }

    if stream {
        state
            .metrics()
            .ttfb_overhead(route, started.elapsed().as_secs_f64());
        let rounds = state.options().max_tool_rounds;
        let rounds = engine_tools.map(|t| {
            let tools = StreamTools::new(t, body.clone(), overrides, rounds);
            Box::new(ChatRounds::new(tools)) as Box<dyn tools::Rounds>
        });
        let stream = Stream {
            route: route.to_owned(),
            reader: Box::new(ChatReader::new(strip_usage_chunk)),
            rounds,
            guard: Some(guard),
            started,
        };
        return relay::relay(state, stream, out_headers, &url, upstream_body).await;
    }
    let up_started = Instant::now();
    let result = match &engine_tools {
        Some(t) => {
            tools::resolve(
                &state,
                &mut guard,
                &parsed,
                &overrides,
                t,
                out_headers,
                &url,
            )
            .await
        }
        None => {
            state
                .upstream()
                .collect(&url, out_headers, upstream_body)
                .await
        }
    };
    answer_collected(&state, route, Some(guard), (started, up_started), result)
}

/// Builds the session on first use and prepares the managed request; a
/// panic in the engine resets the session and fails open like an error.
fn prepare(
    slot: &mut Option<Managed>,
    ctx: &Arc<SessionContext>,
    key: &SessionKey,
    body: &ChatBody<'_>,
    store: Option<&SharedStore>,
) -> Result<Plan, SessionError> {
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        if let Some(store) = store {
            return persist::prepare_stored(slot, ctx, key, body.messages(), store);
        }
        if slot.is_none() {
            *slot = Some(Managed::new(Arc::clone(ctx), &key.id)?);
        }
        match slot.as_mut() {
            Some(m) => {
                m.use_model(body.model());
                m.prepare_json(body.messages())
            }
            None => Err(SessionError::NoSession),
        }
    }));
    result.unwrap_or_else(|_| {
        *slot = None;
        Err(SessionError::Panicked)
    })
}

/// The client's body as it came, for a request the proxy cannot read.
async fn forward_raw(state: &AppState, url: &str, headers: HeaderMap, body: Bytes) -> Response {
    match state.upstream().collect(url, headers, body).await {
        Ok((status, headers, bytes)) => respond(status, headers, Body::from(bytes)),
        Err(e) => e.into_response(),
    }
}
