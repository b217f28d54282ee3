//! A scripted upstream on 127.0.0.1:0 (chat completions, Anthropic
//! Messages, Responses, embeddings): it answers from a queue of replies
//! (JSON, raw status, streams, a computed reply) and records every request
//! it receives with the reply it gave. And what the tests send it and read
//! back: a completion, a long coding session, a metrics counter.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use futures_util::StreamExt;
use tokio::net::TcpListener;

/// A reply and its status, computed from the request body.
pub type StatusFn = dyn Fn(&serde_json::Value) -> (u16, serde_json::Value) + Send + Sync;

/// What the scripted upstream answers to one call.
#[derive(Clone)]
pub enum Reply {
    /// A JSON body with status 200 (or a streamed version of it when the
    /// request asks for a stream: `chunks` content deltas, then usage).
    Json(serde_json::Value),
    /// A raw status and body.
    Raw(u16, String),
    /// Streamed like `Json`, but the connection stays open after `[DONE]`
    /// (a server that is slow to close its stream).
    StreamThenHold(serde_json::Value),
    /// A stream given as its raw server-sent events.
    Sse(String),
    /// Compute the reply from the request body.
    With(Arc<dyn Fn(&serde_json::Value) -> serde_json::Value + Send + Sync>),
    /// Compute the reply and its status from the request body.
    WithStatus(Arc<StatusFn>),
}

/// One request the upstream received.
#[derive(Clone, Debug)]
pub struct Received {
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body, as received.
    pub body: Bytes,
    /// The reply's body as sent (non-streamed).
    pub reply: Bytes,
}

/// The scripted upstream's state.
#[derive(Default)]
pub struct Script {
    /// Replies, in order; when empty, [`Script::otherwise`]'s, else a
    /// fixed "ok" answer.
    pub replies: Mutex<VecDeque<Reply>>,
    /// What answers a request when no reply is queued (a test whose
    /// calls interleave with the proxy's own, such as summaries).
    pub otherwise: Mutex<Option<Reply>>,
    /// Requests received, in order.
    pub received: Mutex<Vec<Received>>,
}

impl Script {
    /// Queues a reply.
    pub fn push(&self, reply: Reply) {
        self.replies.lock().unwrap().push_back(reply);
    }

    /// The requests received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// The last request's body as JSON.
    pub fn last_body(&self) -> serde_json::Value {
        let r = self.received.lock().unwrap();
        serde_json::from_slice(&r.last().unwrap().body).unwrap()
    }
}

/// A plain chat completion carrying `message` and `usage`.
pub fn completion(message: serde_json::Value, prompt: u64, completion: u64) -> serde_json::Value {
    serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "scripted",
        "choices": [{ "index": 0, "message": message, "finish_reason": "stop" }],
        "usage": { "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion }
    })
}

/// Answers a chat call in a task of its own: a caller that goes away
/// (a killed proxy) does not cut the answer short, so every call that
/// arrived is in [`Script::received`].
async fn chat(State(script): State<Arc<Script>>, headers: HeaderMap, body: Bytes) -> Response {
    tokio::spawn(answer(script, headers, body)).await.unwrap()
}

async fn answer(script: Arc<Script>, headers: HeaderMap, body: Bytes) -> Response {
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let queued = script.replies.lock().unwrap().pop_front();
    let reply = queued.or_else(|| script.otherwise.lock().unwrap().clone());
    let value = match reply {
        Some(Reply::Raw(status, text)) => return raw_reply(&script, (headers, body), status, text),
        Some(Reply::Json(v)) => v,
        Some(Reply::Sse(text)) => return event_stream(&script, headers, body, text),
        Some(Reply::StreamThenHold(v)) => {
            let text = sse_of(&v, true);
            script.received.lock().unwrap().push(Received {
                headers,
                body,
                reply: Bytes::from(text.clone()),
            });
            let chunks = futures_util::stream::once(async move {
                Ok::<Bytes, std::io::Error>(Bytes::from(text))
            })
            .chain(futures_util::stream::pending());
            return Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(chunks))
                .unwrap();
        }
        // On the blocking pool: a reply that takes its time (a slow
        // upstream) must not hold one of the runtime's few workers.
        Some(Reply::With(f)) => {
            let request = request.clone();
            tokio::task::spawn_blocking(move || f(&request))
                .await
                .unwrap()
        }
        Some(Reply::WithStatus(f)) => {
            let request = request.clone();
            let (status, value) = tokio::task::spawn_blocking(move || f(&request))
                .await
                .unwrap();
            if status != 200 {
                return raw_reply(&script, (headers, body), status, value.to_string());
            }
            value
        }
        None => completion(
            serde_json::json!({"role": "assistant", "content": "ok"}),
            10,
            1,
        ),
    };
    if request.get("stream") == Some(&serde_json::Value::Bool(true)) {
        let text = sse_of(
            &value,
            request.pointer("/stream_options/include_usage")
                == Some(&serde_json::Value::Bool(true)),
        );
        return event_stream(&script, headers, body, text);
    }
    let text = serde_json::to_string(&value).unwrap();
    script.received.lock().unwrap().push(Received {
        headers,
        body,
        reply: Bytes::from(text.clone()),
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(text))
        .unwrap()
}

/// Records the request and answers `status` with the JSON `text`.
fn raw_reply(
    script: &Script,
    (headers, body): (HeaderMap, Bytes),
    status: u16,
    text: String,
) -> Response {
    script.received.lock().unwrap().push(Received {
        headers,
        body,
        reply: Bytes::from(text.clone()),
    });
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(text))
        .unwrap()
}

/// Records the request and answers with the server-sent events `text`.
fn event_stream(script: &Script, headers: HeaderMap, body: Bytes, text: String) -> Response {
    script.received.lock().unwrap().push(Received {
        headers,
        body,
        reply: Bytes::from(text.clone()),
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(text))
        .unwrap()
}

/// Messages of a coding session (big tool outputs, under the digest's
/// size floor, so only compaction can shrink them; ~150 tokens a turn)
/// that a small window must compact.
pub fn long_history(turns: usize) -> Vec<serde_json::Value> {
    use serde_json::json;
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Fix the parser bug in src/parse.rs"}),
    ];
    for i in 0..turns {
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"), "type": "function",
            "function": {"name": "bash", "arguments": format!("{{\"cmd\":\"cat src/file{i}.rs\"}}")}}]}));
        let body: String = (0..8)
            .map(|j| format!("line {j} of file {i}: let x{j} = compute({j});\n"))
            .collect();
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": body}));
    }
    m
}

/// A completion as OpenAI streams it: a role chunk, one chunk per word of
/// the content, a finish chunk, the usage chunk when asked for, `[DONE]`.
pub fn sse_of(value: &serde_json::Value, include_usage: bool) -> String {
    let content = value
        .pointer("/choices/0/message/content")
        .and_then(|c| c.as_str())
        .unwrap_or("");
    let usage_null = if include_usage { ",\"usage\":null" } else { "" };
    let mut out = format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}}}}]{usage_null}}}\n\n"
    );
    for word in content.split_inclusive(' ') {
        let delta = serde_json::json!({"content": word});
        out.push_str(&format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{delta}}}]{usage_null}}}\n\n"
        ));
    }
    out.push_str(&format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]{usage_null}}}\n\n"
    ));
    if include_usage {
        let usage = value.get("usage").cloned().unwrap_or_default();
        out.push_str(&format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{usage}}}\n\n"
        ));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

/// Starts the scripted upstream; returns its base URL (`…/v1`). Chat
/// completions, Anthropic Messages, Responses (and embeddings, a
/// passthrough path) calls are answered from
/// the same script (a reply in the call's format is the script's job).
pub async fn start_upstream(script: Arc<Script>) -> String {
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/messages", post(chat))
        .route("/v1/responses", post(chat))
        .route("/v1/embeddings", post(chat))
        .route("/v1/models", get(|| async { axum::Json(serde_json::json!({"object":"list","data":[{"id":"scripted","object":"model"}]})) }))
        .with_state(script);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

/// A counter's value in the metrics text (0 when absent).
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
