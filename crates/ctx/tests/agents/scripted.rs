//! The scripted upstream of the real-client tests: an Anthropic Messages
//! and OpenAI Responses server whose replies make the agent read the test's
//! files one by one with its real shell tool, then finish.
//!
//! Stateless: the step is read from the request itself (the newest tool
//! result names the file it showed, `FILE k`), so a compacted history
//! (whose older turns are gone) gets the same answer as the full one.
//! Every request is recorded (path, headers, body) for the test to check.
//! Usage is reported with input tokens of about a quarter of the body's
//! bytes, part of it as cache reads, so the proxy's usage path runs.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};

/// One request the upstream received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

/// The script: how many files, and what was received.
pub struct Script {
    pub files: usize,
    pub seen: Mutex<Vec<Seen>>,
}

impl Script {
    pub fn new(files: usize) -> Script {
        Script {
            files,
            seen: Mutex::new(Vec::new()),
        }
    }
}

/// The step a conversation is at: the file after the one the newest tool
/// result showed (`FILE k` → k + 1), 0 when no file was shown yet.
fn next_file(last_tool_output: Option<&str>) -> usize {
    let Some(text) = last_tool_output else {
        return 0;
    };
    text.split("FILE ")
        .nth(1)
        .and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        })
        .map_or(0, |k| k + 1)
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(|i| i.get("text").and_then(Value::as_str).or_else(|| i.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn usage_in(body_len: usize) -> (u64, u64) {
    let input = (body_len / 4) as u64;
    (input, input / 2)
}

fn sse(events: &[(&str, Value)]) -> Response {
    let mut out = String::new();
    for (name, data) in events {
        out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    }
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(out))
        .unwrap_or_default()
}

fn json_response(v: &Value) -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(v.to_string()))
        .unwrap_or_default()
}

/// Records a request (and, with `CTX_AGENTS_DUMP=DIR`, writes it there for
/// a human to read).
/// Returns the request's number.
fn record(script: &Script, uri: &Uri, headers: HeaderMap, body: &Value) -> usize {
    let mut seen = script.seen.lock().unwrap();
    if let Some(dir) = std::env::var_os("CTX_AGENTS_DUMP") {
        let path = std::path::Path::new(&dir).join(format!("{:03}.json", seen.len()));
        let _ = std::fs::write(path, body.to_string());
    }
    seen.push(Seen {
        path: uri.to_string(),
        headers,
        body: body.clone(),
    });
    seen.len() - 1
}

/// `POST /v1/messages`.
async fn messages(
    State(script): State<Arc<Script>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let n = record(&script, &uri, headers, &request);
    let id = format!("msg_{n:04}");
    let (input, cached) = usage_in(body.len());
    // The newest tool result (the client may put other messages after it).
    let last_result = request["messages"].as_array().and_then(|messages| {
        messages.iter().rev().find_map(|m| {
            m["content"].as_array().and_then(|blocks| {
                blocks
                    .iter()
                    .rev()
                    .find(|b| b["type"] == "tool_result")
                    .map(|b| text_of(&b["content"]))
            })
        })
    });
    let uses_bash = request["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == "Bash"));
    let k = next_file(last_result.as_deref());
    let block = if uses_bash && k < script.files {
        json!({"type": "tool_use", "id": format!("toolu_{n:04}"), "name": "Bash",
               "input": {"command": format!("cat file_{k}.txt"), "description": format!("Read file {k}")}})
    } else {
        json!({"type": "text", "text": format!("Read all {} files. DONE", script.files)})
    };
    let stop = if block["type"] == "tool_use" {
        "tool_use"
    } else {
        "end_turn"
    };
    let usage = json!({"input_tokens": input - cached, "cache_read_input_tokens": cached,
                       "cache_creation_input_tokens": 0, "output_tokens": 20});
    if request["stream"] != json!(true) {
        return json_response(&json!({"id": id, "type": "message", "role": "assistant",
            "model": request["model"], "content": [block], "stop_reason": stop,
            "stop_sequence": null, "usage": usage}));
    }
    let start_block = if block["type"] == "tool_use" {
        json!({"type": "tool_use", "id": block["id"], "name": "Bash", "input": {}})
    } else {
        json!({"type": "text", "text": ""})
    };
    let delta = if block["type"] == "tool_use" {
        json!({"type": "input_json_delta", "partial_json": block["input"].to_string()})
    } else {
        json!({"type": "text_delta", "text": block["text"]})
    };
    sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": id, "type": "message",
            "role": "assistant", "model": request["model"], "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": input - cached,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": start_block}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": 20}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ])
}

/// `POST /v1/responses`.
async fn responses(
    State(script): State<Arc<Script>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let n = record(&script, &uri, headers, &request);
    let (input, cached) = usage_in(body.len());
    let last_output = request["input"].as_array().and_then(|items| {
        items
            .iter()
            .rev()
            .find(|i| i["type"] == "function_call_output")
            .map(|i| text_of(&i["output"]))
    });
    let k = next_file(last_output.as_deref());
    let item = if k < script.files {
        json!({"type": "function_call", "id": format!("fc_{n:04}"), "status": "completed",
               "call_id": format!("call_{n:04}"), "name": "exec_command",
               "arguments": json!({"cmd": format!("cat file_{k}.txt")}).to_string()})
    } else {
        json!({"type": "message", "id": format!("msg_{n:04}"), "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": format!("Read all {} files. DONE", script.files), "annotations": []}]})
    };
    let response = json!({"id": format!("resp_{n:04}"), "object": "response", "created_at": 1,
        "status": "completed", "model": request["model"], "output": [item],
        "usage": {"input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
                  "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input + 20}});
    if request["stream"] != json!(true) {
        return json_response(&response);
    }
    let mut created = response.clone();
    created["status"] = json!("in_progress");
    created["output"] = json!([]);
    created["usage"] = Value::Null;
    sse(&[
        (
            "response.created",
            json!({"type": "response.created", "response": created}),
        ),
        (
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        ),
        (
            "response.output_item.done",
            json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        ),
        (
            "response.completed",
            json!({"type": "response.completed", "response": response}),
        ),
    ])
}

/// Starts the upstream on a free loopback port of `runtime`; returns its
/// `/v1` base URL.
pub fn start(runtime: &tokio::runtime::Runtime, script: Arc<Script>) -> String {
    let app = Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/responses", post(responses))
        .with_state(script);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}
