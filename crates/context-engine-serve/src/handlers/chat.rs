//! `POST /v1/chat/completions`: the managed path.
//!
//! Per request: read the body's fields raw ([`ChatBody`]), find the
//! session, lock it, let the session driver turn the client's full history
//! into the managed request ([`Managed::prepare`]), send it upstream with
//! every other field untouched, and feed the answer's usage back. An engine
//! failure (or a managed request that would break a provider rule) sends
//! the client's request unmanaged instead; an upstream error goes back with
//! its status and body.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use context_engine::engine::Usage;
use futures_util::StreamExt;
use serde::Deserialize;

use crate::AppState;
use crate::body::{ChatBody, with_include_usage};
use crate::cut::{self, Cut};
use crate::error::ServeError;
use crate::handlers::{Guard, open_stream, release_with_usage, report_plan, respond};
use crate::identity::Identity;
use crate::router::AuthorizationConsumed;
use crate::routes::CHAT_COMPLETIONS;
use crate::session::key::session_key;
use crate::session::{Managed, Plan, SessionContext, SessionKey, SharedStore, background, persist};
use crate::sse::Relay;
use crate::tools;
use crate::upstream::response_headers;

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    consumed: Option<Extension<AuthorizationConsumed>>,
    identity: Identity,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let out_headers = state.upstream().headers(&headers, consumed.is_some(), true);
    let url = state.upstream().url("chat/completions", None);
    let parsed = match ChatBody::parse(&body) {
        Ok(parsed) => parsed,
        Err(why) => {
            // Not ours to judge: the provider answers it with its own error.
            tracing::warn!(reason = %why, "unreadable chat request forwarded unmanaged");
            state.metrics().fallback();
            return forward_raw(&state, &url, out_headers, body).await;
        }
    };
    let stream = parsed.stream();
    let (key, source) = session_key(&identity, &headers, &parsed);
    let slot = state.sessions().slot(&key);
    let guard = Arc::clone(&slot.state).lock_owned().await;
    let ctx = Arc::clone(state.sessions().context());
    let store = state.sessions().store().cloned();
    let (mut guard, mut plan) = if ctx.blocking || store.is_some() {
        // An engine that may block on I/O, or a session store, runs on the
        // blocking pool, so the async workers keep serving other sessions
        // meanwhile.
        let (body, key) = (body.clone(), key.clone());
        let job = tokio::task::spawn_blocking(move || {
            let mut guard = guard;
            let plan = match ChatBody::parse(&body) {
                Ok(parsed) => prepare(&mut guard, &ctx, &key, &parsed, store.as_ref()),
                Err(e) => Err(e.to_string()),
            };
            (guard, plan)
        });
        match job.await {
            Ok(done) => done,
            Err(_) => {
                return ServeError::Internal("the engine task was cancelled".into())
                    .into_response();
            }
        }
    } else {
        let mut guard = guard;
        let plan = prepare(&mut guard, &ctx, &key, &parsed, None);
        (guard, plan)
    };

    // A summary due in the background starts now, off the request path.
    if let (Ok(p), Some(m)) = (plan.as_mut(), guard.as_mut())
        && let Some(job) = p.summary_job.take()
    {
        background::spawn(m, &key.id, job, state.sessions().summary_claims());
    }
    let offer_tools = state.options().engine_tools;
    let mut overrides: Vec<(&str, String)> = Vec::new();
    let managed = match &mut plan {
        Ok(plan) => {
            report_plan(&state, &key.id, plan, None);
            overrides.push(("messages", std::mem::take(&mut plan.messages_json)));
            true
        }
        Err(why) => {
            state.metrics().fallback();
            if let Some(m) = guard.as_mut() {
                m.stats.fallbacks += 1;
                m.stats.last_fallback = Some(why.clone());
            }
            tracing::warn!(session = %key.id, reason = %why, "request sent unmanaged");
            false
        }
    };
    if managed && let Some(m) = guard.as_mut() {
        m.stats.managed += 1;
    }
    let strip_usage_chunk = stream && !parsed.include_usage();
    if strip_usage_chunk {
        overrides.push((
            "stream_options",
            with_include_usage(parsed.field("stream_options")),
        ));
    }
    let engine_tools = match identity.reader() {
        Some(reader) if offer_tools && managed => guard
            .as_ref()
            .and_then(|m| tools::schemas(reader, m, &parsed)),
        _ => None,
    };
    if let Some(t) = &engine_tools {
        overrides.push(("tools", t.tools_json.clone()));
    }
    tracing::debug!(session = %key.id, source = ?source, managed, stream, "chat request");
    let borrowed: Vec<(&str, &str)> = overrides.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let upstream_body = if borrowed.is_empty() {
        body.clone()
    } else {
        Bytes::from(parsed.write(&borrowed))
    };
    let pre = started.elapsed();

    if stream {
        state
            .metrics()
            .ttfb_overhead(CHAT_COMPLETIONS, pre.as_secs_f64());
        let rounds = state.options().max_tool_rounds;
        let tools =
            engine_tools.map(|t| tools::StreamTools::new(t, body.clone(), overrides, rounds));
        return stream_response(
            state,
            out_headers,
            &url,
            upstream_body,
            guard,
            strip_usage_chunk,
            started,
            tools,
        )
        .await;
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
        None => send_collect(&state, out_headers, &url, upstream_body).await,
    };
    let up = up_started.elapsed();
    let (status, resp_headers, bytes) = match result {
        Ok(r) => r,
        Err(e) => {
            release_with_usage(&state, Some(guard), None);
            return e.into_response();
        }
    };
    let usage = status.is_success().then(|| usage_of(&bytes)).flatten();
    if let Some(usage) = &usage {
        state
            .metrics()
            .tokens(usage.prompt_tokens, usage.completion_tokens);
    }
    release_with_usage(&state, Some(guard), usage);
    let total = started.elapsed();
    state.metrics().latency(
        CHAT_COMPLETIONS,
        up.as_secs_f64(),
        total.saturating_sub(up).as_secs_f64(),
    );
    respond(status, resp_headers, Body::from(bytes))
}

/// Builds the session on first use and prepares the managed request; a
/// panic in the engine resets the session and fails open like an error.
fn prepare(
    slot: &mut Option<Managed>,
    ctx: &Arc<SessionContext>,
    key: &SessionKey,
    body: &ChatBody<'_>,
    store: Option<&SharedStore>,
) -> Result<Plan, String> {
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
            None => Err("no session".to_owned()),
        }
    }));
    result.unwrap_or_else(|_| {
        *slot = None;
        Err("the engine panicked; the session starts over".to_owned())
    })
}

/// A non-streamed upstream call, read to the end.
pub(crate) async fn send_collect(
    state: &AppState,
    headers: HeaderMap,
    url: &str,
    body: Bytes,
) -> Result<(StatusCode, HeaderMap, Bytes), ServeError> {
    let resp = state
        .upstream()
        .send(Method::POST, url, headers, body, false)
        .await?;
    let status = resp.status();
    let headers = response_headers(resp.headers());
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| ServeError::from_reqwest(&e))?;
    Ok((status, headers, bytes))
}

/// The client's body as it came, for a request the proxy cannot read.
async fn forward_raw(state: &AppState, url: &str, headers: HeaderMap, body: Bytes) -> Response {
    match send_collect(state, headers, url, body).await {
        Ok((status, headers, bytes)) => respond(status, headers, Body::from(bytes)),
        Err(e) => e.into_response(),
    }
}

/// The `usage` of a chat-completions JSON answer.
pub(crate) fn usage_of(bytes: &[u8]) -> Option<Usage> {
    #[derive(Deserialize)]
    struct UsageOnly {
        usage: Option<serde_json::Value>,
    }
    let u = serde_json::from_slice::<UsageOnly>(bytes).ok()?.usage?;
    Usage::from_openai(&u).ok()
}

/// A streamed call: an error status comes back whole; a stream is relayed
/// event by event, holding the session until it ends (its usage is fed to
/// the engine then). With engine tools offered, a stream that calls one is
/// held from that call, resolved and re-sent, its continuation relayed in
/// the same response (see [`tools`]). A stream that breaks off before
/// `[DONE]` ends with an error event instead ([`cut`]). A client that goes
/// away drops the relay, which drops the upstream call.
#[allow(clippy::too_many_arguments)]
async fn stream_response(
    state: AppState,
    headers: HeaderMap,
    url: &str,
    body: Bytes,
    guard: Guard,
    strip_usage_chunk: bool,
    started: Instant,
    tools: Option<tools::StreamTools>,
) -> Response {
    let resend_headers = tools.as_ref().map(|_| headers.clone());
    let up_started = Instant::now();
    let (status, resp_headers, resp) = match open_stream(&state, url, headers, body).await {
        Ok(opened) => opened,
        Err(answer) => {
            release_with_usage(&state, Some(guard), None);
            return answer;
        }
    };
    struct Relaying {
        upstream: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
        relay: Relay,
        guard: Option<Guard>,
        state: AppState,
        started: Instant,
        up_started: Instant,
        ended: bool,
        tools: Option<tools::StreamTools>,
        resend: Option<(HeaderMap, String)>,
        strip_usage_chunk: bool,
    }
    impl Relaying {
        fn new_relay(&self) -> Relay {
            let relay = Relay::new(self.strip_usage_chunk);
            match &self.tools {
                Some(t) => relay.watch(t.tools.names.clone()),
                None => relay,
            }
        }

        /// The stream ended while holding an engine call: resolves it and
        /// switches to the continuation (`Ok(None)`), or returns what the
        /// client gets instead (the held events, engine calls removed), or
        /// why the continuation could not be had.
        async fn settle_held(&mut self) -> Result<Option<Bytes>, Cut> {
            let Some(held) = self.relay.take_held() else {
                return Ok(None);
            };
            let Some(t) = self.tools.as_mut() else {
                return Ok(None);
            };
            if !(held.only_engine_calls(&t.tools.names) && t.may_resolve()) {
                return Ok(Some(held.for_client(&t.tools.names)));
            }
            let Some((headers, url)) = self.resend.clone() else {
                return Ok(None);
            };
            let mut guard = self.guard.take();
            let next = t.next_request(guard.as_deref_mut().unwrap_or(&mut None), &held);
            self.guard = guard;
            self.state.metrics().tool_round();
            let sent = self
                .state
                .upstream()
                .send(Method::POST, &url, headers, next, true)
                .await;
            match sent {
                Ok(resp) if resp.status().is_success() => {
                    self.upstream = resp.bytes_stream().boxed();
                    self.relay = self.new_relay();
                    Ok(None)
                }
                Ok(resp) => {
                    let status = resp.status();
                    let body = resp.text().await.unwrap_or_default();
                    Err(Cut::Refused { status, body })
                }
                Err(e) => Err(Cut::Unsent(e)),
            }
        }

        /// The stream has ended: its usage (none for a stream cut short)
        /// goes to the metrics and the session, which is released.
        fn end(&mut self, usage: Option<Usage>) {
            self.ended = true;
            if let Some(usage) = &usage {
                self.state
                    .metrics()
                    .tokens(usage.prompt_tokens, usage.completion_tokens);
            }
            release_with_usage(&self.state, self.guard.take(), usage);
            let up = self.up_started.elapsed();
            let total = self.started.elapsed();
            self.state.metrics().latency(
                CHAT_COMPLETIONS,
                up.as_secs_f64(),
                total.saturating_sub(up).as_secs_f64(),
            );
        }

        /// The stream broke off: what it held is dropped, the cut logged
        /// and counted, the session released without usage; the client's
        /// error event.
        fn fail(&mut self, cut: Cut) -> Bytes {
            cut.report(self.state.metrics(), CHAT_COMPLETIONS);
            drop(self.relay.take_held());
            self.end(None);
            cut::chat_event(&cut.message())
        }
    }
    // A stream dropped before its end (the client went away) still
    // settles its session.
    impl Drop for Relaying {
        fn drop(&mut self) {
            if let Some(guard) = self.guard.take() {
                release_with_usage(&self.state, Some(guard), None);
            }
        }
    }
    let mut relaying = Relaying {
        upstream: resp.bytes_stream().boxed(),
        relay: Relay::new(strip_usage_chunk),
        guard: Some(guard),
        state,
        started,
        up_started,
        ended: false,
        tools,
        resend: resend_headers.map(|h| (h, url.to_owned())),
        strip_usage_chunk,
    };
    relaying.relay = relaying.new_relay();
    let body = futures_util::stream::unfold(relaying, |mut r| async move {
        loop {
            if r.ended {
                return None;
            }
            match r.upstream.next().await {
                Some(Ok(chunk)) => {
                    let mut out = r.relay.push(&chunk);
                    if r.relay.done() && r.relay.holding() {
                        match r.settle_held().await {
                            // The continuation is relayed next.
                            Ok(None) => {
                                if !out.is_empty() {
                                    return Some((Ok(out), r));
                                }
                                continue;
                            }
                            Ok(Some(rest)) => out = [out, rest].concat().into(),
                            Err(cut) => out = [out, r.fail(cut)].concat().into(),
                        }
                    }
                    if r.relay.done() && !r.ended {
                        // Usage and the session are settled before the
                        // client sees `[DONE]`: a client that reads the
                        // session right after its stream sees this call.
                        let usage = r.relay.usage();
                        r.end(usage);
                    }
                    if !out.is_empty() {
                        return Some((Ok::<Bytes, std::io::Error>(out), r));
                    }
                }
                Some(Err(e)) => {
                    let out = r.fail(Cut::Broken(ServeError::from_reqwest(&e)));
                    return Some((Ok(out), r));
                }
                None => {
                    let may_end = r.relay.may_end();
                    let mut rest = r.relay.finish();
                    if !may_end {
                        let out = r.fail(Cut::Closed);
                        return Some((Ok(out), r));
                    }
                    if r.relay.holding() {
                        match r.settle_held().await {
                            Ok(None) => continue,
                            Ok(Some(held)) => rest = [rest, held].concat().into(),
                            Err(cut) => rest = [rest, r.fail(cut)].concat().into(),
                        }
                    }
                    if !r.ended {
                        let usage = r.relay.usage();
                        r.end(usage);
                    }
                    if rest.is_empty() {
                        return None;
                    }
                    return Some((Ok(rest), r));
                }
            }
        }
    });
    respond(status, resp_headers, Body::from_stream(body))
}
