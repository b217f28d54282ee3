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

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use context_engine::engine::Usage;
use context_engine::front::{self as lib, FrontCache, FrontKind, FrontRequest, Rebuilt};
use futures_util::StreamExt;
use serde_json::value::RawValue;

use crate::AppState;
use crate::body::ChatBody;
use crate::cut::Cut;
use crate::error::ServeError;
use crate::handlers::chat::{send_collect, usage_of};
use crate::handlers::{Guard, open_stream, passthrough, release_with_usage, respond};
use crate::identity::Identity;
use crate::session::key::front_session_key;
use crate::session::{Managed, Plan, SessionContext, SessionKey, SharedStore, background, persist};
use crate::sse_wire::WireRelay;
use crate::tools::{FrontRounds, FrontTools};

/// What one request of a front needs to know about itself.
pub(crate) struct Call {
    pub kind: FrontKind,
    /// The route label (metrics).
    pub route: &'static str,
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
    consumed: bool,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let out_headers = state.upstream().headers(&headers, consumed, true);
    let url = upstream_url(&state, &uri);
    let split = match ChatBody::parse_object(&body) {
        Ok(split) => split,
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
        state.metrics().unmanaged(call.route, reason.name());
        if split.stream() {
            // Relayed like a managed stream (a cut still ends in an
            // error event), with no session to settle.
            return relay(state, call, out_headers, &url, body, None, started, None).await;
        }
        return forward(&state, &url, out_headers, body).await;
    }
    let stream = split.stream();
    let (key, source) = front_session_key(&identity, &headers, call.kind, &split);
    let slot = state.sessions().slot(&key);
    let guard = Arc::clone(&slot.state).lock_owned().await;
    let ctx = Arc::clone(state.sessions().context());
    let store = state.sessions().store().cloned();
    let kind = call.kind;
    let (mut guard, mut outcome) = if ctx.blocking || store.is_some() {
        // An engine that may block on I/O, or a session store, runs on the
        // blocking pool.
        let key = key.clone();
        let slot = Arc::clone(&slot);
        let body = body.clone();
        let job = tokio::task::spawn_blocking(move || {
            let mut guard = guard;
            let outcome = ChatBody::parse_object(&body)
                .map_err(|e| e.to_string())
                .and_then(|split| {
                    let step = Step {
                        ctx: &ctx,
                        key: &key,
                        kind,
                        store: store.as_ref(),
                    };
                    prepare(&mut guard, &slot.front, &step, &split)
                });
            (guard, outcome)
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
        let step = Step {
            ctx: &ctx,
            key: &key,
            kind,
            store: None,
        };
        let outcome = prepare(&mut guard, &slot.front, &step, &split);
        (guard, outcome)
    };

    // A summary due in the background starts now, off the request path.
    if let (Ok((p, _)), Some(m)) = (outcome.as_mut(), guard.as_mut())
        && let Some(job) = p.summary_job.take()
    {
        background::spawn(m, &key.id, job, state.sessions().summary_claims());
    }
    let mut fields: Vec<(&'static str, String)> = Vec::new();
    let managed = outcome.is_ok();
    match outcome {
        Ok((plan, rebuilt)) => {
            super::report_plan(
                &state,
                &key.id,
                &plan,
                Some((call.kind, rebuilt.marked_prefix)),
            );
            if let Some(m) = guard.as_mut() {
                m.stats.managed += 1;
            }
            fields = rebuilt.fields;
        }
        Err(why) => {
            state.metrics().fallback();
            if let Some(m) = guard.as_mut() {
                m.stats.fallbacks += 1;
                m.stats.last_fallback = Some(why.clone());
            }
            tracing::warn!(session = %key.id, front = %call.kind, reason = %why, "request sent unmanaged");
        }
    }
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
    if stream {
        state
            .metrics()
            .ttfb_overhead(call.route, started.elapsed().as_secs_f64());
        let rounds = state.options().max_tool_rounds;
        let tools = engine_tools.map(|t| t.stream(body.clone(), fields, rounds));
        return relay(
            state,
            call,
            out_headers,
            &url,
            upstream_body,
            Some(guard),
            started,
            tools,
        )
        .await;
    }
    let up_started = Instant::now();
    let result = match &engine_tools {
        Some(t) => {
            t.resolve(&state, &mut guard, &split, &fields, out_headers, &url)
                .await
        }
        None => send_collect(&state, out_headers, &url, upstream_body).await,
    };
    let (status, resp_headers, bytes) = match result {
        Ok(r) => r,
        Err(e) => {
            release_with_usage(&state, Some(guard), None);
            return e.into_response();
        }
    };
    let up = up_started.elapsed();
    let usage = status.is_success().then(|| usage_of(&bytes)).flatten();
    if let Some(usage) = &usage {
        settle(&state, None, usage);
    }
    release_with_usage(&state, Some(guard), usage);
    let total = started.elapsed();
    state.metrics().latency(
        call.route,
        up.as_secs_f64(),
        total.saturating_sub(up).as_secs_f64(),
    );
    respond(status, resp_headers, Body::from(bytes))
}

/// Feeds a call's usage to the metrics and the session.
fn settle(state: &AppState, session: Option<&mut Managed>, usage: &Usage) {
    state
        .metrics()
        .tokens(usage.prompt_tokens, usage.completion_tokens);
    state
        .metrics()
        .cache_tokens(usage.cache_read_tokens, usage.cache_write_tokens);
    if let Some(m) = session {
        m.after_response(usage);
    }
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
) -> Result<(Plan, Rebuilt), String> {
    let fields = split.fields();
    let items = lib::split_items(step.kind, &fields);
    let mut kept = std::mem::take(&mut *cache.lock().unwrap_or_else(PoisonError::into_inner));
    let mut front = FrontRequest::parse_parts(step.kind, &fields, items.as_deref(), &mut kept)
        .map_err(|e| format!("unreadable {} request: {e}", step.kind))?;
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
                None => return Err("no session".to_owned()),
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
            .map_err(|v| {
                format!(
                    "the managed {} request would break a rule: {v}",
                    front.kind()
                )
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
            Err("the engine panicked; the session starts over".to_owned())
        }
    }
}

/// `POST /v1/messages/count_tokens`: counted by the upstream on the
/// request the session would send now (its managed history and the
/// client's messages past it), without running the engine or recording
/// anything; the client's own request when the session has not seen its
/// history.
pub(crate) async fn count_tokens(
    state: AppState,
    consumed: bool,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let out_headers = state.upstream().headers(&headers, consumed, false);
    let url = upstream_url(&state, &uri);
    let kind = FrontKind::Anthropic;
    let Ok(split) = ChatBody::parse_object(&body) else {
        return forward(&state, &url, out_headers, body).await;
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

/// A streamed call: an error status comes back whole; a stream is relayed
/// chunk by chunk unchanged, holding the session (`guard`; none for a
/// request passed through unmanaged) until its last event (the usage is
/// fed to the engine then). With engine tools offered
/// (`rounds`), a stream that calls one is held from that call, resolved
/// and re-sent, and its continuation relayed in the same response (see
/// [`FrontRounds`]). A stream that breaks off before its last event ends
/// with error events in the client's format instead ([`crate::cut`]). A
/// client that goes away drops the relay, which drops the upstream call.
#[allow(clippy::too_many_arguments)]
async fn relay(
    state: AppState,
    call: Call,
    headers: HeaderMap,
    url: &str,
    body: Bytes,
    guard: Option<Guard>,
    started: Instant,
    rounds: Option<Box<dyn FrontRounds>>,
) -> Response {
    let resend = rounds.as_ref().map(|_| (headers.clone(), url.to_owned()));
    let up_started = Instant::now();
    let (status, resp_headers, resp) = match open_stream(&state, url, headers, body).await {
        Ok(opened) => opened,
        Err(answer) => {
            release_with_usage(&state, guard, None);
            return answer;
        }
    };
    struct Relaying {
        upstream: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
        reader: WireRelay,
        guard: Option<Guard>,
        state: AppState,
        route: &'static str,
        kind: FrontKind,
        started: Instant,
        up_started: Instant,
        ended: bool,
        rounds: Option<Box<dyn FrontRounds>>,
        resend: Option<(HeaderMap, String)>,
    }
    impl Relaying {
        /// The stream has ended: its usage (none for a stream cut short)
        /// goes to the metrics and the session, which is released.
        fn end(&mut self, usage: Option<Usage>) {
            if self.ended {
                return;
            }
            self.ended = true;
            // An unmanaged stream (no session) counts no usage, as when
            // it is not streamed.
            if let Some(usage) = usage.as_ref().filter(|_| self.guard.is_some()) {
                settle(&self.state, None, usage);
            }
            release_with_usage(&self.state, self.guard.take(), usage);
            let up = self.up_started.elapsed();
            let total = self.started.elapsed();
            self.state.metrics().latency(
                self.route,
                up.as_secs_f64(),
                total.saturating_sub(up).as_secs_f64(),
            );
        }

        /// The stream broke off: what a round held is dropped, the cut
        /// logged and counted, the session released without usage; the
        /// client's error events, in its format and numbering.
        fn fail(&mut self, cut: Cut) -> Bytes {
            cut.report(self.state.metrics(), self.route);
            let message = cut.message();
            let out = match self.rounds.as_mut() {
                Some(r) => Bytes::from(r.fail(&message)),
                None => self.reader.failure(&message),
            };
            self.end(None);
            out
        }

        /// What the client gets of `chunk` now: its whole events (with
        /// engine tools, what the rounds let through).
        fn pass(&mut self, chunk: Bytes) -> Bytes {
            match self.rounds.as_mut() {
                Some(r) => {
                    self.reader.push(chunk.clone());
                    Bytes::from(r.push(&chunk))
                }
                None => self.reader.push(chunk),
            }
        }

        /// The round ended holding an engine call: resolves it and
        /// switches to the continuation (`Ok(None)`), or returns what the
        /// client gets instead (the held events, engine calls removed), or
        /// why the continuation could not be had.
        async fn settle_held(&mut self) -> Result<Option<Bytes>, Cut> {
            let Some(r) = self.rounds.as_mut() else {
                return Ok(None);
            };
            if !r.resolvable() {
                return Ok(Some(Bytes::from(r.release_held())));
            }
            let Some((headers, url)) = self.resend.clone() else {
                return Ok(None);
            };
            let mut guard = self.guard.take();
            let next = r.next_request(guard.as_deref_mut().unwrap_or(&mut None));
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
                    self.reader = WireRelay::new(self.kind);
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

        fn holding(&self) -> bool {
            self.rounds.as_ref().is_some_and(|r| r.holding())
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
    let relaying = Relaying {
        upstream: resp.bytes_stream().boxed(),
        reader: WireRelay::new(call.kind),
        guard,
        state,
        route: call.route,
        kind: call.kind,
        started,
        up_started,
        ended: false,
        rounds,
        resend,
    };
    let body = futures_util::stream::unfold(relaying, |mut r| async move {
        loop {
            if r.ended {
                return None;
            }
            match r.upstream.next().await {
                Some(Ok(chunk)) => {
                    let mut out = r.pass(chunk);
                    let round_over = r.rounds.as_ref().map_or(r.reader.done(), |t| t.ended());
                    if round_over && r.holding() {
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
                    if r.reader.done() {
                        // Usage and the session are settled before the
                        // client sees the last event.
                        let usage = r.reader.usage();
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
                    let tail = r.reader.finish();
                    if !r.reader.done() {
                        let out = r.fail(Cut::Closed);
                        return Some((Ok(out), r));
                    }
                    let mut rest = match r.rounds.as_mut() {
                        Some(t) => t.finish(),
                        None => tail.to_vec(),
                    };
                    if r.holding() {
                        match r.settle_held().await {
                            Ok(None) => continue,
                            Ok(Some(held)) => rest.extend_from_slice(&held),
                            Err(cut) => rest.extend_from_slice(&r.fail(cut)),
                        }
                    }
                    let usage = r.reader.usage();
                    r.end(usage);
                    if rest.is_empty() {
                        return None;
                    }
                    return Some((Ok(rest.into()), r));
                }
            }
        }
    });
    respond(status, resp_headers, Body::from_stream(body))
}
