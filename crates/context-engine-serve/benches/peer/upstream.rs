//! The peer bench's scripted upstream: an OpenAI-compatible chat
//! completions endpoint that answers at once and counts what it receives.

use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Uri;
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};

/// What the scripted upstream has received since the last take, and the
/// assistant message it answers with.
#[derive(Default)]
struct Upstream {
    received: Mutex<Received>,
    reply: Mutex<Option<Arc<Value>>>,
}

#[derive(Default, Clone, serde::Serialize)]
pub struct Received {
    pub requests: u64,
    pub bytes: u64,
    /// Requests to paths other than chat completions (a peer calling
    /// something the upstream does not script).
    pub other: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a JSON request body sets `"stream": true` (at any depth; bench
/// requests carry it at the top), whatever the serializer's spacing.
fn streamed(body: &[u8]) -> bool {
    memchr::memmem::find_iter(body, b"\"stream\"").any(|at| {
        let rest = body[at + 8..].trim_ascii_start();
        rest.strip_prefix(b":")
            .is_some_and(|r| r.trim_ascii_start().starts_with(b"true"))
    })
}

pub fn has_tool_calls(message: &Value) -> bool {
    message["tool_calls"]
        .as_array()
        .is_some_and(|a| !a.is_empty())
}

fn usage(prompt: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1})
}

fn completion(message: &Value, prompt: u64) -> String {
    let finish = if has_tool_calls(message) {
        "tool_calls"
    } else {
        "stop"
    };
    json!({"id": "chatcmpl-peer", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage(prompt)})
    .to_string()
}

/// The same reply as server-sent events: the message in one delta, then
/// the finish reason, then the usage, then `[DONE]`.
fn chunks(message: &Value, prompt: u64) -> String {
    let mut delta = json!({"role": "assistant", "content": message["content"]});
    if let Some(calls) = message["tool_calls"].as_array() {
        let indexed: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut c = c.clone();
                c["index"] = json!(i);
                c
            })
            .collect();
        delta["tool_calls"] = json!(indexed);
    }
    let finish = if has_tool_calls(message) {
        "tool_calls"
    } else {
        "stop"
    };
    let frame = |v: Value| format!("data: {v}\n\n");
    let base = |choices: Value| json!({"id": "chatcmpl-peer", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices});
    let mut out = frame(base(
        json!([{"index": 0, "delta": delta, "finish_reason": null}]),
    ));
    out += &frame(base(
        json!([{"index": 0, "delta": {}, "finish_reason": finish}]),
    ));
    let mut last = base(json!([]));
    last["usage"] = usage(prompt);
    out += &frame(last);
    out + "data: [DONE]\n\n"
}

fn default_message() -> Arc<Value> {
    Arc::new(json!({"role": "assistant", "content": "ok"}))
}

async fn chat(State(up): State<Arc<Upstream>>, body: Bytes) -> Response {
    {
        let mut r = lock(&up.received);
        r.requests += 1;
        r.bytes += body.len() as u64;
    }
    let message = lock(&up.reply).clone().unwrap_or_else(default_message);
    let prompt = body.len() as u64 / 4;
    let (kind, text) = if streamed(&body) {
        ("text/event-stream", chunks(&message, prompt))
    } else {
        ("application/json", completion(&message, prompt))
    };
    Response::builder()
        .header("content-type", kind)
        .body(Body::from(text))
        .unwrap_or_default()
}

pub async fn serve_upstream(listen: &str) {
    let up = Arc::new(Upstream::default());
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route(
            "/bench/reply",
            post(|State(up): State<Arc<Upstream>>, body: Bytes| async move {
                *lock(&up.reply) = serde_json::from_slice::<Value>(&body).ok().map(Arc::new);
            }),
        )
        .route(
            "/bench/take",
            get(|State(up): State<Arc<Upstream>>| async move {
                let taken = std::mem::take(&mut *lock(&up.received));
                axum::Json(taken)
            }),
        )
        .fallback(|State(up): State<Arc<Upstream>>, uri: Uri| async move {
            lock(&up.received).other.push(uri.path().to_owned());
            Response::builder()
                .status(404)
                .header("content-type", "application/json")
                .body(Body::from(r#"{"error":{"message":"not scripted"}}"#))
                .unwrap_or_default()
        })
        .with_state(up);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .unwrap_or_else(|e| panic!("bind {listen}: {e}"));
    eprintln!("peer upstream: listening on http://{listen}/v1");
    axum::serve(listener, app)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}
