//! The one stream relay of the managed routes (chat completions,
//! Anthropic Messages, Responses): an error status comes back whole; a
//! stream is relayed event by event as its API's reader lets it through
//! ([`StreamReader`]), holding the session (none for a request passed
//! through unmanaged) until its last event, whose usage goes to the
//! metrics and the session then. With engine tools offered ([`Rounds`]),
//! a stream that calls one is held from that call, resolved and re-sent,
//! and its continuation relayed in the same response. A stream that breaks
//! off before its last event ends with error events in the client's
//! format instead ([`crate::cut`]).
//!
//! A client that goes away does not drop the upstream call: the relay runs
//! in a task of its own, and once nobody reads it, it reads the upstream's
//! answer to its end (for at most the upstream timeout) so that its usage
//! is still recorded and the session settled.

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use context_engine::engine::Usage;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;

use crate::cut::Cut;
use crate::error::ServeError;
use crate::handlers::{open_stream, respond, settle};
use crate::session::Guard;
use crate::sse::{Reading, StreamReader, as_it_came};
use crate::state::AppState;
use crate::tools::Rounds;

/// What one streamed call relays.
pub(crate) struct Stream {
    /// The route label (metrics).
    pub route: String,
    /// The API's reader of the upstream stream.
    pub reader: Box<dyn StreamReader>,
    /// The engine-tool rounds, when engine tools are offered.
    pub rounds: Option<Box<dyn Rounds>>,
    /// The session, held to the stream's end (`None`: unmanaged).
    pub guard: Option<Guard>,
    /// When the request arrived.
    pub started: Instant,
}

/// Opens the streamed call of `body` to `url` and relays it (see the
/// module docs).
pub(crate) async fn relay(
    state: AppState,
    stream: Stream,
    headers: HeaderMap,
    url: &str,
    body: Bytes,
) -> Response {
    let resend = stream
        .rounds
        .as_ref()
        .map(|_| (headers.clone(), url.to_owned()));
    let up_started = Instant::now();
    let (status, resp_headers, resp) = match open_stream(&state, url, headers, body).await {
        Ok(opened) => opened,
        Err(answer) => {
            state.sessions().release(stream.guard, None);
            return answer;
        }
    };
    let drain_limit = state.upstream().timeout();
    let relaying = Relaying {
        upstream: resp.bytes_stream().boxed(),
        reading: Reading::new(stream.reader),
        guard: stream.guard,
        state,
        route: stream.route,
        started: stream.started,
        up_started,
        ended: false,
        rounds: stream.rounds,
        resend,
    };
    let events = futures_util::stream::unfold(relaying, |mut r| async move {
        r.next()
            .await
            .map(|out| (Ok::<Bytes, std::io::Error>(out), r))
    });
    respond(status, resp_headers, detached(events.boxed(), drain_limit))
}

/// A relay in progress.
struct Relaying {
    upstream: BoxStream<'static, reqwest::Result<Bytes>>,
    reading: Reading<dyn StreamReader>,
    guard: Option<Guard>,
    state: AppState,
    route: String,
    started: Instant,
    up_started: Instant,
    ended: bool,
    rounds: Option<Box<dyn Rounds>>,
    resend: Option<(HeaderMap, String)>,
}

impl Relaying {
    /// The next bytes for the client; `None` at the end.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.ended {
                return None;
            }
            match self.upstream.next().await {
                Some(Ok(chunk)) => {
                    let mut out = self.pass(chunk);
                    let round_over = self
                        .rounds
                        .as_ref()
                        .map_or(self.reading.reader.done(), |t| t.ended());
                    if round_over && self.holding() {
                        match self.settle_held().await {
                            // The continuation is relayed next.
                            Ok(None) => {
                                if !out.is_empty() {
                                    return Some(out);
                                }
                                continue;
                            }
                            Ok(Some(rest)) => out = [out, rest].concat().into(),
                            Err(cut) => out = [out, self.fail(cut)].concat().into(),
                        }
                    }
                    if self.reading.reader.done() {
                        // Usage and the session are settled before the
                        // client sees the last event: a client that reads
                        // the session right after its stream sees this
                        // call.
                        let usage = self.reading.reader.usage();
                        self.end(usage);
                    }
                    if !out.is_empty() {
                        return Some(out);
                    }
                }
                Some(Err(e)) => return Some(self.fail(Cut::Broken(ServeError::from_reqwest(&e)))),
                None => {
                    let tail = match self.rounds.as_mut() {
                        Some(r) => self.reading.end_of_body(|e, out| r.event(e, out)),
                        None => self.reading.end_of_body(as_it_came),
                    };
                    let Some(tail) = tail else {
                        return Some(self.fail(Cut::Closed));
                    };
                    let mut rest = tail.to_vec();
                    if self.holding() {
                        match self.settle_held().await {
                            Ok(None) => continue,
                            Ok(Some(held)) => rest.extend_from_slice(&held),
                            Err(cut) => rest.extend_from_slice(&self.fail(cut)),
                        }
                    }
                    let usage = self.reading.reader.usage();
                    self.end(usage);
                    return (!rest.is_empty()).then(|| rest.into());
                }
            }
        }
    }

    /// What the client gets of `chunk` now: its whole events (with engine
    /// tools, what the rounds let through).
    fn pass(&mut self, chunk: Bytes) -> Bytes {
        match self.rounds.as_mut() {
            Some(r) => self.reading.push_through(chunk, |e, out| r.event(e, out)),
            None => self.reading.push(chunk),
        }
    }

    fn holding(&self) -> bool {
        self.rounds.as_ref().is_some_and(|r| r.holding())
    }

    /// The stream has ended: its usage (none for a stream cut short) goes
    /// to the metrics and the session, which is released.
    fn end(&mut self, usage: Option<Usage>) {
        if self.ended {
            return;
        }
        self.ended = true;
        // An unmanaged stream (no session) counts no usage, as when it is
        // not streamed.
        if let Some(usage) = usage.as_ref().filter(|_| self.guard.is_some()) {
            settle(&self.state, usage);
        }
        self.state.sessions().release(self.guard.take(), usage);
        let up = self.up_started.elapsed();
        let total = self.started.elapsed();
        self.state.metrics().latency(
            &self.route,
            up.as_secs_f64(),
            total.saturating_sub(up).as_secs_f64(),
        );
    }

    /// The stream broke off: what a round held is dropped, the cut logged
    /// and counted, the session released without usage; the client's
    /// error events, in its format and numbering.
    fn fail(&mut self, cut: Cut) -> Bytes {
        cut.report(self.state.metrics(), &self.route);
        let message = cut.message();
        let out = match self.rounds.as_mut() {
            Some(r) => Bytes::from(r.fail(&message)),
            None => self.reading.reader.failure(&message),
        };
        self.end(None);
        out
    }

    /// The round ended holding an engine call: resolves it and switches to
    /// the continuation (`Ok(None)`), or returns what the client gets
    /// instead (the held events, engine calls removed), or why the
    /// continuation could not be had.
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
        // The round resolved here is billed like any call: its usage to
        // the metrics and the session's stats (the engine learns the
        // prompt size from the last round's, when the stream ends).
        if let Some(usage) = self.reading.reader.usage() {
            settle(&self.state, &usage);
            if let Some(m) = self.guard.as_deref_mut().and_then(Option::as_mut) {
                m.bill(&usage);
            }
        }
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
                self.reading.restart();
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
}

// A relay dropped before its end (past the drain limit) still settles its
// session.
impl Drop for Relaying {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            self.state.sessions().release(Some(guard), None);
        }
    }
}

/// The body of a relayed stream, run in a task of its own so that a
/// client that goes away does not cut the upstream call: the task reads
/// `events` to their end, for at most `drain_limit` once nobody reads them.
fn detached(
    events: BoxStream<'static, Result<Bytes, std::io::Error>>,
    drain_limit: std::time::Duration,
) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return Body::from_stream(events);
    };
    rt.spawn(async move {
        let mut events = events;
        while let Some(item) = events.next().await {
            if tx.send(item).await.is_err() {
                tracing::debug!("client gone: reading the upstream stream to its end");
                let rest = async { while events.next().await.is_some() {} };
                if tokio::time::timeout(drain_limit, rest).await.is_err() {
                    tracing::warn!(
                        "upstream stream still open past the timeout after the client left: dropped"
                    );
                }
                return;
            }
        }
    });
    Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}
