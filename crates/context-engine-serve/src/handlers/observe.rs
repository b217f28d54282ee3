//! Observe mode (`serve.mode: observe`, `ctx serve --observe`): every
//! managed-API request goes upstream exactly as the client sent it and
//! every reply comes back untouched, streamed or not; beside the traffic
//! the engine runs on the same sessions as if it managed them.
//!
//! Per request ([`handle`]): the client's body is sent upstream at once;
//! its answer is relayed chunk by chunk as it came, each chunk also handed
//! (a reference count, no copy) to the observation. The observation is a
//! task of its own ([`observe`]): once the answer has ended (its usage
//! read from the chunks), it reads the request, runs the one session step
//! ([`view::prepare`], with the session's store), accounts what the engine
//! would have sent (the page's calls and their requests, `/metrics`,
//! `/ctx/sessions/{id}`), and feeds the session the provider's count
//! scaled to the request the engine made, as `ctx replay` does, so the
//! next step sees what the provider would have reported for it. Nothing the engine does
//! can delay, alter or fail the request: an unreadable body, an engine or
//! store failure is counted (`ctx_observe_errors_total`) and shown; a
//! reply the client stops reading is an observation without usage. No
//! engine tool is offered.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use context_engine::engine::Usage;
use futures_util::Stream;
use tokio::sync::mpsc;

use crate::handlers::SentTo;
use crate::handlers::managed::{self, Call, upstream_url};
use crate::handlers::{keep_request, respond, settle, usage_of};
use crate::identity::Identity;
use crate::session::requests::Wire;
use crate::sse::Reading;
use crate::state::AppState;
use crate::upstream::response_headers;

/// Requests seen in observe mode, numbered in order of arrival.
static ARRIVALS: AtomicU64 = AtomicU64::new(0);

/// What the relay hands the observation of one answer.
enum Tapped {
    /// The answer's head: whether it is a stream of events, and whether
    /// it succeeded.
    Head { stream: bool, success: bool },
    /// A chunk, as the client gets it.
    Chunk(Bytes),
    /// The answer ended whole.
    End,
}

/// Observe mode's path for a managed API's request (see the module docs).
pub(crate) async fn handle(
    state: AppState,
    call: Call,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let out_headers = state.upstream().headers(&headers, true);
    let url = upstream_url(&state, &uri);
    let (tap, answer) = mpsc::unbounded_channel();
    // Arrival order: a session's observations run in it.
    let arrival = ARRIVALS.fetch_add(1, Ordering::Relaxed) + 1;
    tokio::spawn(observe(
        state.clone(),
        (call, arrival, url.clone()),
        identity,
        headers,
        body.clone(),
        answer,
    ));
    match state
        .upstream()
        .send(Method::POST, &url, out_headers, body, true)
        .await
    {
        Ok(resp) => {
            let status = resp.status();
            let resp_headers = response_headers(resp.headers());
            let stream = resp
                .headers()
                .get(axum::http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let _ = tap.send(Tapped::Head {
                stream,
                success: status.is_success(),
            });
            let body = Body::from_stream(Tap {
                inner: Box::pin(resp.bytes_stream()),
                tap,
            });
            respond(status, resp_headers, body)
        }
        // The observation sees the channel close without an answer.
        Err(e) => e.into_response(),
    }
}

/// The upstream's answer as it came, each chunk also sent to the
/// observation; dropped before its end (the client stopped reading), the
/// observation sees no [`Tapped::End`].
struct Tap {
    inner: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    tap: mpsc::UnboundedSender<Tapped>,
}

impl Stream for Tap {
    type Item = reqwest::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.inner.as_mut().poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(chunk))) => {
                let _ = self.tap.send(Tapped::Chunk(chunk.clone()));
            }
            Poll::Ready(None) => {
                let _ = self.tap.send(Tapped::End);
            }
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        next
    }
}

/// Runs the engine on the request `body` as if it managed it, then feeds
/// the session the answer's usage scaled to the request it would have
/// sent.
async fn observe(
    state: AppState,
    (call, arrival, url): (Call, u64, String),
    identity: Identity,
    headers: HeaderMap,
    body: Bytes,
    mut answer: mpsc::UnboundedReceiver<Tapped>,
) {
    let route = call.route.as_str();
    // The answer first: until it has ended the engine spends no CPU the
    // request path could use, and the session then sees this call whole.
    let usage = read_usage(call.api, &mut answer).await;
    let split = match managed::parse(call.api, &body) {
        Ok(split) => split,
        Err(why) => {
            tracing::debug!(api = %call.api, reason = %why, "observe: unreadable request");
            state.metrics().observe_error(route, "unreadable");
            return;
        }
    };
    if let Some(reason) = managed::unmanaged(call.api, &split) {
        state.metrics().observed(route, reason);
        return;
    }
    let (key, _) = managed::key_of(call.api, &identity, &headers, &split);
    let slot = state.sessions().slot(&key);
    // Off the request path: waiting for another observation here delays
    // no client.
    let mut guard = Arc::clone(&slot.state).lock_owned().await;
    if slot.observed.fetch_max(arrival, Ordering::Relaxed) > arrival {
        // A later request of this session was observed first: this older
        // history would read as rewritten.
        state.metrics().observe_error(route, "out_of_order");
        return;
    }
    // Where it went: a background summary it starts asks there.
    let out_headers = state.upstream().headers(&headers, true);
    let to = SentTo {
        url: &url,
        headers: &out_headers,
    };
    let (outcome, managed) = managed::step(&state, call.api, &mut guard, (&slot, &key, to), &split);
    let Ok(view) = outcome else {
        state.metrics().observe_error(route, "engine");
        state.sessions().release(Some(guard), None);
        return;
    };
    state.metrics().observed(route, "managed");
    let tokens = (view.plan.client_tokens, view.plan.request_tokens);
    if managed {
        // The request it would have sent, for the page's view of the call.
        let fields = view.into_fields();
        let borrowed: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let would = Bytes::from(split.write(&borrowed));
        keep_request(&state, &slot, &key, call.api, (&body, &would));
    }
    drop(split);
    if let Some(usage) = &usage {
        // What the provider billed: the request as the client sent it.
        settle(&state, usage);
    }
    let scaled = usage.map(|u| scaled_to_request(&u, tokens));
    state.sessions().release(Some(guard), scaled);
}

/// The usage the answer reported: from the stream's events or the JSON
/// body; `None` for a failed or unfinished answer, or one without usage.
async fn read_usage(api: Wire, answer: &mut mpsc::UnboundedReceiver<Tapped>) -> Option<Usage> {
    let Some(Tapped::Head { stream, success }) = answer.recv().await else {
        return None;
    };
    if !success {
        return None;
    }
    if stream {
        let mut reading = Reading::new(managed::reader(api, false));
        while let Some(tapped) = answer.recv().await {
            match tapped {
                Tapped::Chunk(chunk) => {
                    reading.push(chunk);
                }
                Tapped::End => {
                    reading.end_of_body(crate::sse::as_it_came);
                    return reading.reader.usage();
                }
                Tapped::Head { .. } => return None,
            }
        }
        return None;
    }
    let mut whole = Vec::new();
    while let Some(tapped) = answer.recv().await {
        match tapped {
            Tapped::Chunk(chunk) => whole.extend_from_slice(&chunk),
            Tapped::End => return usage_of(&whole),
            Tapped::Head { .. } => return None,
        }
    }
    None
}

/// The provider's count for the client's request, scaled to the request
/// the engine would have sent (`ctx replay`'s rule): what the provider
/// would have reported for it.
fn scaled_to_request(usage: &Usage, (client, request): (u64, u64)) -> Usage {
    let prompt = if client > 0 {
        (usage.prompt_tokens as f64 * request as f64 / client as f64).round() as u64
    } else {
        request
    };
    Usage::new(prompt, usage.completion_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_providers_count_is_scaled_to_the_request_the_engine_made() {
        let u = scaled_to_request(&Usage::new(10_000, 50), (8_000, 2_000));
        assert_eq!((u.prompt_tokens, u.completion_tokens), (2_500, 50));
        let u = scaled_to_request(&Usage::new(10_000, 50), (0, 2_000));
        assert_eq!(u.prompt_tokens, 2_000);
    }
}
