//! The managed path shared by the Anthropic Messages and Responses fronts
//! ([`messages`](super::messages), [`responses`](super::responses)).
//!
//! Per request: split the body into its top-level fields as raw text
//! ([`ChatBody`]), find and lock the session, read the request in its own
//! format ([`FrontRequest::parse_parts`], the library's lossless model and
//! bridge, reusing the session's [`FrontCache`] so only messages new since
//! the last call are parsed and bridged), hand the chat view of the
//! client's full history to the same session driver as chat completions
//! ([`Managed::prepare`]: lineage, frozen prefix, digest, prune,
//! compaction, guaranteed fit),
//! rebuild the managed request in the client's format (every message the
//! engine did not change as the client's own bytes), send it to
//! `{upstream}{path}` with every other field and header as it came, and
//! feed the usage back.
//! A request the proxy cannot read, one on server-side state
//! (`previous_response_id`), an engine failure or a rebuilt request that
//! would break its API's rules goes upstream as the client sent it (fail
//! open; the reason is logged and counted). With `serve.engine_tools`,
//! both fronts offer the engine's tools and resolve their calls in the
//! client's own format, streamed or not ([`FrontTools`]).

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use context_engine::front::{self as lib, FrontCache, FrontKind, FrontRequest, Rebuilt};
use serde_json::value::RawValue;

use crate::body::ChatBody;
use crate::error::ServeError;
use crate::handlers::relay::{self, Stream};
use crate::handlers::{account_plan, answer_collected, engine_step, keep_request, passthrough};
use crate::identity::Identity;
use crate::session::key::front_session_key;
use crate::session::requests::Wire;
use crate::session::{
    Managed, Plan, SessionContext, SessionError, SessionKey, SharedStore, persist,
};
use crate::sse::WireReader;
use crate::state::AppState;
use crate::tools::FrontTools;

/// What one request of a front needs to know about itself.
pub(crate) struct Call {
    pub kind: FrontKind,
    /// The route label (metrics).
    pub route: String,
}

/// The upstream URL of a `/v1/...` path: `{upstream}/...` with the query.
fn upstream_url(state: &AppState, uri: &Uri) -> String {
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
    let split = match ChatBody::parse_object(&body) {
        Ok(split) => split,
        Err(e @ ServeError::DuplicateKey { .. }) => return e.into_response(),
        Err(why) => {
            // Not ours to judge: the provider answers it with its own error.
            tracing::warn!(front = %call.kind, reason = %why, "unreadable request forwarded unmanaged");
            state.metrics().fallback();
            return forward(&state, &url, out_headers, body).await;
        }
    };
    let field = |name: &str| serde_json::from_str(split.field(name)?.get()).ok();
    if let Some(reason) = lib::unmanaged(call.kind, field) {
        tracing::debug!(front = %call.kind, reason = reason.name(), "request passed through unmanaged");
        state.metrics().unmanaged(&call.route, reason.name());
        if split.stream() {
            // Relayed like a managed stream (a cut still ends in an
            // error event), with no session to settle.
            let stream = Stream {
                route: call.route,
                reader: Box::new(WireReader::new(call.kind)),
                rounds: None,
                guard: None,
                started,
            };
            return relay::relay(state, stream, out_headers, &url, body).await;
        }
        return forward(&state, &url, out_headers, body).await;
    }

    // The session, and the engine's view of the client's history.
    let (key, source) = front_session_key(&identity, &headers, call.kind, &split);
    let slot = state.sessions().slot(&key);
    let mut guard = Arc::clone(&slot.state).lock_owned().await;
    let ctx = Arc::clone(state.sessions().context());
    let store = state.sessions().store();
    let step = Step {
        ctx: &ctx,
        key: &key,
        kind: call.kind,
        store,
    };
    let mut outcome = engine_step(ctx.blocking || store.is_some(), || {
        prepare(&mut guard, &slot.front, &step, &split)
    });
    let front = outcome
        .as_ref()
        .ok()
        .map(|(_, rebuilt)| (call.kind, rebuilt.marked_prefix))
        .or(Some((call.kind, false)));
    let plan = outcome
        .as_mut()
        .map(|(plan, _)| plan)
        .map_err(|why| why as &(dyn std::error::Error + 'static));
    let managed = account_plan(&state, &mut guard, &key, plan, front);

    // The request that goes upstream: the managed fields, the engine's
    // tools offered.
    let stream = split.stream();
    let mut fields: Vec<(&'static str, String)> = match outcome {
        Ok((_, rebuilt)) => rebuilt.fields,
        Err(_) => Vec::new(),
    };
    let engine_tools = match identity.reader() {
        Some(reader) if state.options().engine_tools && managed => guard
            .as_ref()
            .and_then(|m| FrontTools::offer(reader, call.kind, m, &split)),
        _ => None,
    };
    if let Some(t) = &engine_tools {
        fields.push(("tools", t.tools_json().to_owned()));
    }
    tracing::debug!(session = %key.id, source = ?source, front = %call.kind, stream, "front request");
    let upstream_body = if fields.is_empty() {
        body.clone()
    } else {
        let borrowed: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Bytes::from(split.write(&borrowed))
    };
    if managed {
        keep_request(
            &state,
            &slot,
            &key,
            Wire::Front(call.kind),
            (&body, &upstream_body),
        );
    }

    if stream {
        state
            .metrics()
            .ttfb_overhead(&call.route, started.elapsed().as_secs_f64());
        let rounds = state.options().max_tool_rounds;
        let stream = Stream {
            route: call.route,
            reader: Box::new(WireReader::new(call.kind)),
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

/// What one engine step of a front needs besides the session and body.
struct Step<'a> {
    ctx: &'a Arc<SessionContext>,
    key: &'a SessionKey,
    kind: FrontKind,
    store: Option<&'a SharedStore>,
}

/// Reads the request (reusing the session's `cache` of its previous one),
/// builds the session on first use, prepares the managed request and
/// rebuilds it in the client's format; a panic in the engine resets the
/// session and its cache and fails open like an error.
fn prepare(
    slot: &mut Option<Managed>,
    cache: &Mutex<FrontCache>,
    step: &Step<'_>,
    split: &ChatBody<'_>,
) -> Result<(Plan, Rebuilt), FrontError> {
    let fields = split.fields();
    let items = lib::split_items(step.kind, &fields);
    let mut kept = std::mem::take(&mut *cache.lock().unwrap_or_else(PoisonError::into_inner));
    let mut front = FrontRequest::parse_parts(step.kind, &fields, items.as_deref(), &mut kept)
        .map_err(|error| FrontError::Unreadable {
            kind: step.kind,
            error,
        })?;
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let refs: Vec<&RawValue> = front.chat_json().iter().map(AsRef::as_ref).collect();
        let plan = if let Some(store) = step.store {
            persist::prepare_stored(slot, step.ctx, step.key, &refs, store)?
        } else {
            if slot.is_none() {
                *slot = Some(Managed::new(Arc::clone(step.ctx), &step.key.id)?);
            }
            match slot.as_mut() {
                Some(m) => m.prepare(&refs)?,
                None => return Err(SessionError::NoSession.into()),
            }
        };
        drop(refs);
        // Only Anthropic's cache needs to know where to mark.
        let stable = match (step.kind, slot.as_ref()) {
            (FrontKind::Anthropic, Some(m)) => m.stable_prefix(&plan.request),
            _ => plan.request.len(),
        };
        let rebuilt = front
            .rebuild_with(&plan.request, items.as_deref(), stable)
            .map_err(|violation| FrontError::Rule {
                kind: front.kind(),
                violation,
            })?;
        Ok((plan, rebuilt))
    }));
    match result {
        Ok(outcome) => {
            kept.keep(front);
            *cache.lock().unwrap_or_else(PoisonError::into_inner) = kept;
            outcome
        }
        Err(_) => {
            *slot = None;
            Err(SessionError::Panicked.into())
        }
    }
}

/// Why a front's request goes unmanaged: the session step failed, or the
/// request cannot be read or rebuilt in its format.
#[derive(Debug, thiserror::Error)]
enum FrontError {
    /// The session step failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The request is not one of its format.
    #[error("unreadable {kind} request: {error}")]
    Unreadable {
        /// The format.
        kind: FrontKind,
        /// What is wrong with it.
        error: context_engine::anthropic::FormatError,
    },
    /// The managed request, rebuilt in the client's format, would break
    /// one of the format's rules.
    #[error("the managed {kind} request would break a rule: {violation}")]
    Rule {
        /// The format.
        kind: FrontKind,
        /// The rule broken.
        violation: context_engine::validate::Violation,
    },
}

/// `POST /v1/messages/count_tokens`: counted by the upstream on the
/// request the session would send now (its managed history and the
/// client's messages past it), without running the engine or recording
/// anything; the client's own request when the session has not seen its
/// history.
pub(crate) async fn count_tokens(
    state: AppState,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let out_headers = state.upstream().headers(&headers, false);
    let url = upstream_url(&state, &uri);
    let kind = FrontKind::Anthropic;
    let split = match ChatBody::parse_object(&body) {
        Ok(split) => split,
        Err(e @ ServeError::DuplicateKey { .. }) => return e.into_response(),
        Err(_) => return forward(&state, &url, out_headers, body).await,
    };
    let fields = split.fields();
    let items = lib::split_items(kind, &fields);
    let Ok(mut front) =
        FrontRequest::parse_parts(kind, &fields, items.as_deref(), &mut FrontCache::default())
    else {
        return forward(&state, &url, out_headers, body).await;
    };
    let (key, _) = front_session_key(&identity, &headers, kind, &split);
    let mut replace = Vec::new();
    if let Some(slot) = state.sessions().get(&key) {
        let guard = slot.state.lock().await;
        if let Some(m) = guard.as_ref() {
            let refs: Vec<&RawValue> = front.chat_json().iter().map(AsRef::as_ref).collect();
            if let Some(view) = m.peek(&refs) {
                match front.rebuild_with(&view, items.as_deref(), view.len()) {
                    Ok(r) => replace = r.fields,
                    Err(v) => {
                        tracing::debug!(violation = %v, "count_tokens on the client's request")
                    }
                }
            }
        }
    }
    let upstream_body = if replace.is_empty() {
        body.clone()
    } else {
        let borrowed: Vec<(&str, &str)> = replace.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Bytes::from(split.write(&borrowed))
    };
    forward(&state, &url, out_headers, upstream_body).await
}

/// The client's body as it came (or as given), the answer streamed back as
/// it comes.
async fn forward(state: &AppState, url: &str, headers: HeaderMap, body: Bytes) -> Response {
    passthrough::forward(state, Method::POST, url, headers, body).await
}
