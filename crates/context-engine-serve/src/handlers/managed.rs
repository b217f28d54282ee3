//! The one managed-request pipeline: chat completions, Anthropic Messages
//! and Responses alike.
//!
//! Per request ([`handle`]): split the body into its top-level fields as
//! raw text ([`ChatBody`]), once; find the session and lock it (waiting at
//! most [`ServeOptions::session_wait`](crate::ServeOptions::session_wait)
//! behind a call still being drained: past it the request goes upstream
//! unmanaged, said and counted); read the client's history in the chat
//! view and run the one session step ([`view::prepare`], whichever API and
//! store); write the managed fields over the client's body, every other
//! field as it came; offer the engine's tools ([`ApiTools`]); send it,
//! relayed ([`relay`](super::relay)) or read whole, resolving engine-tool
//! rounds; feed the usage back.
//!
//! The whole pipeline runs as a task of its own ([`spawn`]): a client that
//! hangs up does not cancel it, so every upstream call, streamed or not,
//! tool round or not, runs to its end and its usage is recorded.
//!
//! A request the proxy cannot read, one on server-side state
//! (`previous_response_id`), an engine failure or a managed request that
//! would break its API's rules goes upstream as the client sent it (fail
//! open; the reason is logged and counted); an upstream error goes back
//! with its status and body.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};

use crate::body::{ChatBody, with_include_usage};
use crate::error::ServeError;
use crate::handlers::relay::{self, Stream};
use crate::handlers::{
    SentTo, account_plan, answer_collected, engine_step, keep_request, passthrough,
};
use crate::identity::Identity;
use crate::session::key::{front_session_key, session_key};
use crate::session::requests::Wire;
use crate::session::step::Keep;
use crate::session::{Guard, KeySource, SessionKey, Slot};
use crate::sse::{ChatReader, WireReader};
use crate::state::AppState;
use crate::tools::ApiTools;

use super::view::{View, ViewError};
use super::{observe, view};
use crate::options::ServeMode;

/// What one managed request needs to know about itself.
pub(crate) struct Call {
    /// Its API.
    pub api: Wire,
    /// The route label (metrics).
    pub route: String,
}

/// Runs [`handle`] as a task of its own: the client hanging up drops only
/// the wait for its answer, never the upstream call or its accounting.
pub(crate) async fn spawn(
    state: AppState,
    call: Call,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if state.options().mode == ServeMode::Observe {
        return observe::handle(state, call, identity, uri, headers, body).await;
    }
    let task = tokio::spawn(handle(state, call, identity, uri, headers, body));
    match task.await {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %e, "managed request task failed");
            ServeError::Internal("the request's task failed".into()).into_response()
        }
    }
}

/// The upstream URL of a `/v1/...` path: `{upstream}/...` with the query.
pub(crate) fn upstream_url(state: &AppState, uri: &Uri) -> String {
    let rest = uri.path().strip_prefix("/v1").unwrap_or(uri.path());
    state.upstream().url(rest, uri.query())
}

/// The managed path (see the module docs).
pub(crate) async fn handle(
    state: AppState,
    call: Call,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let out_headers = state.upstream().headers(&headers, true);
    let url = upstream_url(&state, &uri);
    let split = match parse(call.api, &body) {
        Ok(split) => split,
        Err(e @ ServeError::DuplicateKey { .. }) => return e.into_response(),
        Err(why) => {
            // Not ours to judge: the provider answers it with its own error.
            tracing::warn!(api = %call.api, reason = %why, "unreadable request forwarded unmanaged");
            state.metrics().fallback();
            return forward(&state, &url, out_headers, body).await;
        }
    };
    if let Some(reason) = unmanaged(call.api, &split) {
        tracing::debug!(api = %call.api, reason, "request passed through unmanaged");
        state.metrics().unmanaged(&call.route, reason);
        let stream = split.stream();
        drop(split);
        return unmanaged_send(state, call, (started, &url), out_headers, stream, body).await;
    }

    // The session, and the engine's view of the client's history.
    let (key, source) = key_of(call.api, &identity, &headers, &split);
    let slot = state.sessions().slot(&key);
    let wait = state.options().session_wait;
    let mut guard = match tokio::time::timeout(wait, Arc::clone(&slot.state).lock_owned()).await {
        Ok(guard) => guard,
        Err(_) => {
            let why = format!(
                "session busy: a call of this session still held it after {} ms",
                wait.as_millis()
            );
            tracing::warn!(session = %key.id, api = %call.api, reason = %why, "request sent unmanaged");
            state.metrics().fallback_because(&why);
            state.metrics().unmanaged(&call.route, "session_busy");
            let stream = split.stream();
            drop(split);
            return unmanaged_send(state, call, (started, &url), out_headers, stream, body).await;
        }
    };
    let to = SentTo {
        url: &url,
        headers: &out_headers,
    };
    let (outcome, managed) = step(&state, call.api, &mut guard, (&slot, &key, to), &split);

    // The request that goes upstream: the managed fields, the usage chunk
    // asked for (chat), the engine's tools offered.
    let stream = split.stream();
    let mut fields = match outcome {
        Ok(v) => v.into_fields(),
        Err(_) => Vec::new(),
    };
    let strip_usage_chunk = call.api == Wire::Chat && stream && !split.include_usage();
    if strip_usage_chunk {
        fields.push((
            "stream_options",
            with_include_usage(split.field("stream_options")),
        ));
    }
    let engine_tools = match identity.reader() {
        Some(reader) if state.options().engine_tools && managed => guard
            .as_ref()
            .and_then(|m| ApiTools::offer(reader, call.api, m, &split)),
        _ => None,
    };
    if let Some(t) = &engine_tools {
        fields.push(("tools", t.tools_json().to_owned()));
    }
    tracing::debug!(session = %key.id, source = ?source, api = %call.api, managed, stream, "managed request");
    let upstream_body = if fields.is_empty() {
        body.clone()
    } else {
        let borrowed: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Bytes::from(split.write(&borrowed))
    };
    if managed {
        keep_request(&state, &slot, &key, call.api, (&body, &upstream_body));
    }

    if stream {
        state
            .metrics()
            .ttfb_overhead(&call.route, started.elapsed().as_secs_f64());
        let rounds = state.options().max_tool_rounds;
        let stream = Stream {
            route: call.route,
            reader: reader(call.api, strip_usage_chunk),
            rounds: engine_tools.map(|t| t.stream(body.clone(), fields, rounds)),
            guard: Some(guard),
            started,
        };
        return relay::relay(state, stream, out_headers, &url, upstream_body).await;
    }
    let up_started = Instant::now();
    let result = match &engine_tools {
        Some(t) => {
            t.resolve(&state, &mut guard, &split, &fields, out_headers, &url)
                .await
        }
        None => {
            state
                .upstream()
                .collect(&url, out_headers, upstream_body)
                .await
        }
    };
    answer_collected(
        &state,
        &call.route,
        Some(guard),
        (started, up_started),
        result,
    )
}

/// The session a request of `api` belongs to.
pub(crate) fn key_of(
    api: Wire,
    identity: &Identity,
    headers: &HeaderMap,
    split: &ChatBody<'_>,
) -> (SessionKey, KeySource) {
    match api {
        Wire::Chat => session_key(identity, headers, split),
        Wire::Front(kind) => front_session_key(identity, headers, kind, split),
    }
}

/// The one session step of a request of `api` on its locked session,
/// accounted ([`account_plan`]): the engine's view, and whether the
/// request is managed. `to`: where the request goes upstream (a
/// background summary it starts asks there).
pub(crate) fn step(
    state: &AppState,
    api: Wire,
    guard: &mut Guard,
    (slot, key, to): (&Slot, &SessionKey, SentTo<'_>),
    split: &ChatBody<'_>,
) -> (Result<View, ViewError>, bool) {
    let ctx = Arc::clone(state.sessions().context());
    let keep = Keep::of(state.sessions().store());
    let mut outcome = engine_step(ctx.blocking || keep.blocks(), || {
        view::prepare(api, guard, &slot.front, (&ctx, key, keep), split)
    });
    let front = match api {
        Wire::Chat => None,
        Wire::Front(kind) => Some((kind, outcome.as_ref().is_ok_and(|v| v.marked_prefix))),
    };
    let plan = outcome
        .as_mut()
        .map(|v| &mut v.plan)
        .map_err(|why| why as &(dyn std::error::Error + 'static));
    let managed = account_plan(state, guard, (key, to), plan, front);
    (outcome, managed)
}

/// The body's top-level fields; a chat request must carry `messages`.
pub(crate) fn parse(api: Wire, body: &[u8]) -> Result<ChatBody<'_>, ServeError> {
    match api {
        Wire::Chat => ChatBody::parse(body),
        Wire::Front(_) => ChatBody::parse_object(body),
    }
}

/// Why a readable request must still go upstream without the engine.
pub(crate) fn unmanaged(api: Wire, split: &ChatBody<'_>) -> Option<&'static str> {
    let Wire::Front(kind) = api else {
        return None;
    };
    let field = |name: &str| serde_json::from_str(split.field(name)?.get()).ok();
    context_engine::front::unmanaged(kind, field).map(|reason| reason.name())
}

/// The reader of an API's stream.
pub(crate) fn reader(api: Wire, strip_usage_chunk: bool) -> Box<dyn crate::sse::StreamReader> {
    match api {
        Wire::Chat => Box::new(ChatReader::new(strip_usage_chunk)),
        Wire::Front(kind) => Box::new(WireReader::new(kind)),
    }
}

/// Sends the client's request as it came, with no session: a stream is
/// relayed like a managed one (a cut still ends in an error event), an
/// answer passed back as it comes.
async fn unmanaged_send(
    state: AppState,
    call: Call,
    (started, url): (Instant, &str),
    out_headers: HeaderMap,
    stream: bool,
    body: Bytes,
) -> Response {
    if stream {
        let stream = Stream {
            route: call.route,
            reader: reader(call.api, false),
            rounds: None,
            guard: None,
            started,
        };
        return relay::relay(state, stream, out_headers, url, body).await;
    }
    // With no session, nothing is accounted: the answer streams back as
    // it comes.
    forward(&state, url, out_headers, body).await
}

/// The client's body as it came (or as given), the answer streamed back as
/// it comes.
pub(crate) async fn forward(
    state: &AppState,
    url: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    passthrough::forward(state, Method::POST, url, headers, body).await
}
