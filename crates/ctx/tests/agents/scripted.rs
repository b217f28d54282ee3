//! The scripted upstream of the real-client tests: an Anthropic Messages
//! and OpenAI Responses server whose replies make the agent read the test's
//! files one by one with its real shell tool, then finish.
//!
//! Stateless: the step is read from the request itself (the newest tool
//! result names the file it showed, `FILE k`), so a compacted history
//! (whose older turns are gone) gets the same answer as the full one.
//! Every request is recorded (path, headers, body) for the test to check.
//! When the proxy offers its `context_recall` tool, the script calls it
//! once, at step [`RECALL_AT`], on the call that read `file_1.txt`, and
//! records the answer; the proxy resolves that call, so the agent never
//! sees it.
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
    /// What the proxy answered the one `context_recall` call the script
    /// makes when the proxy offers its tools: at step [`RECALL_AT`], of the
    /// output of `cat file_1.txt`.
    pub recalled: Mutex<Option<String>>,
}

impl Script {
    pub fn new(files: usize) -> Script {
        Script {
            files,
            seen: Mutex::new(Vec::new()),
            recalled: Mutex::new(None),
        }
    }

    /// Whether to call `context_recall` now: offered, at the step, not
    /// done yet.
    fn recall_now(&self, offered: bool, step: usize) -> bool {
        offered && step == RECALL_AT && self.recalled.lock().unwrap().is_none()
    }
}

/// The step at which the script asks the proxy's `context_recall` for the
/// output of the call that read `file_1.txt`.
pub const RECALL_AT: usize = 5;
/// The id of that call (the proxy answers it; the client never sees it).
pub const RECALL_ID: &str = "ctx_recall_1";

/// Whether a request offers the proxy's `context_recall`.
fn offers_recall(request: &Value) -> bool {
    request["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == "context_recall"))
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
    let results: Vec<&Value> = request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result")
        .collect();
    if let Some(r) = results.iter().find(|b| b["tool_use_id"] == RECALL_ID) {
        *script.recalled.lock().unwrap() = Some(text_of(&r["content"]));
    }
    // The newest result of the agent's own tool (the client may put other
    // messages after it).
    let last_result = results
        .iter()
        .rev()
        .find(|b| b["tool_use_id"] != RECALL_ID)
        .map(|b| text_of(&b["content"]));
    let uses_bash = request["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == "Bash"));
    let k = next_file(last_result.as_deref());
    let file_1_call = request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .find(|b| b["type"] == "tool_use" && b["input"]["command"] == "cat file_1.txt")
        .map(|b| b["id"].clone());
    let blocks = match file_1_call {
        Some(id) if script.recall_now(offers_recall(&request), k) => vec![
            json!({"type": "text", "text": "Let me look at file 1 again."}),
            json!({"type": "tool_use", "id": RECALL_ID, "name": "context_recall",
                   "input": {"handle": id}}),
        ],
        _ if uses_bash && k < script.files => vec![
            json!({"type": "tool_use", "id": format!("toolu_{n:04}"), "name": "Bash",
                   "input": {"command": format!("cat file_{k}.txt"), "description": format!("Read file {k}")}}),
        ],
        _ => {
            vec![json!({"type": "text", "text": format!("Read all {} files. DONE", script.files)})]
        }
    };
    let stop = if blocks.iter().any(|b| b["type"] == "tool_use") {
        "tool_use"
    } else {
        "end_turn"
    };
    let usage = json!({"input_tokens": input - cached, "cache_read_input_tokens": cached,
                       "cache_creation_input_tokens": 0, "output_tokens": 20});
    if request["stream"] != json!(true) {
        return json_response(&json!({"id": id, "type": "message", "role": "assistant",
            "model": request["model"], "content": blocks, "stop_reason": stop,
            "stop_sequence": null, "usage": usage}));
    }
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": {"id": id, "type": "message",
        "role": "assistant", "model": request["model"], "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": {"input_tokens": input - cached,
        "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
    )];
    for (index, block) in blocks.iter().enumerate() {
        let (start_block, delta) = if block["type"] == "tool_use" {
            (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
            )
        } else {
            (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": block["text"]}),
            )
        };
        events.extend([
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": start_block}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ),
        ]);
    }
    events.extend([
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": 20}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]);
    sse(&events)
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
    let outputs: Vec<&Value> = request["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "function_call_output")
        .collect();
    if let Some(r) = outputs.iter().find(|i| i["call_id"] == RECALL_ID) {
        *script.recalled.lock().unwrap() = Some(text_of(&r["output"]));
    }
    let last_output = outputs
        .iter()
        .rev()
        .find(|i| i["call_id"] != RECALL_ID)
        .map(|i| text_of(&i["output"]));
    let k = next_file(last_output.as_deref());
    let file_1_call = request["input"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| {
            i["type"] == "function_call"
                && i["arguments"]
                    .as_str()
                    .is_some_and(|a| a.contains("cat file_1.txt"))
        })
        .map(|i| i["call_id"].clone());
    let items = match file_1_call {
        Some(id) if script.recall_now(offers_recall(&request), k) => vec![
            json!({"type": "reasoning", "id": format!("rs_{n:04}"), "summary": [], "encrypted_content": "gAAAA"}),
            json!({"type": "function_call", "id": format!("fc_{n:04}"), "status": "completed",
                   "call_id": RECALL_ID, "name": "context_recall",
                   "arguments": json!({"handle": id}).to_string()}),
        ],
        _ if k < script.files => vec![
            json!({"type": "function_call", "id": format!("fc_{n:04}"), "status": "completed",
                   "call_id": format!("call_{n:04}"), "name": "exec_command",
                   "arguments": json!({"cmd": format!("cat file_{k}.txt")}).to_string()}),
        ],
        _ => vec![
            json!({"type": "message", "id": format!("msg_{n:04}"), "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": format!("Read all {} files. DONE", script.files), "annotations": []}]}),
        ],
    };
    let response = json!({"id": format!("resp_{n:04}"), "object": "response", "created_at": 1,
        "status": "completed", "model": request["model"], "output": items,
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
    let mut events = vec![(
        "response.created",
        json!({"type": "response.created", "response": created}),
    )];
    for (index, item) in items.iter().enumerate() {
        events.extend([
            (
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": index, "item": item}),
            ),
            (
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": index, "item": item}),
            ),
        ]);
    }
    events.push((
        "response.completed",
        json!({"type": "response.completed", "response": response}),
    ));
    sse(&events)
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
