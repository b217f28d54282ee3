#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Streams that break off before their end, on all three fronts: a body
//! without length or chunking that closes before its last event, a chunked
//! body cut mid-event, a silence past the read timeout, and cuts during
//! engine-tool rounds (while a round is held, and in a resolved round's
//! continuation). The client gets the whole events that came, then an
//! error event in its own API's format; the cut is counted by route and
//! reason; its usage is not fed to the session. A complete stream is
//! relayed byte for byte.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use common::raw_upstream::{Raw, RawReply, start};
use common::{
    compressor_context, counter, eventually, metric, options, server_connections_closed,
    start_proxy,
};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const RESPONSES: &str = "/v1/responses";

/// The client's key (which goes upstream and never into a log).
const CLIENT_KEY: &str = "Bearer sk-client-key-77";

/// Posts `body` to `path` in session `id`; the status and the whole answer.
async fn post(addr: SocketAddr, path: &str, body: &Value, id: &str) -> (u16, String) {
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .header("x-ctx-session", id)
        .header("authorization", CLIENT_KEY)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

/// The session's prompt tokens fed back so far.
async fn fed_prompt_tokens(addr: SocketAddr, id: &str) -> u64 {
    let text = reqwest::Client::new()
        .get(format!("http://{addr}/ctx/sessions/{id}"))
        .header("authorization", CLIENT_KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["stats"]["prompt_tokens"].as_u64().unwrap()
}

/// The events of a stream's text, each as its `(event name, data)`.
fn events(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = None;
            let mut data = String::new();
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            (name, data)
        })
        .collect()
}

/// The number of cuts counted on `route` for `reason`.
fn cuts(state: &context_engine_serve::AppState, route: &str, reason: &str) -> u64 {
    metric(
        &state.metrics().encode(),
        &format!("ctx_stream_cuts_total{{route=\"{route}\",reason=\"{reason}\"}}"),
    )
}

fn chat_chunk(delta: Value, finish: Option<&str>) -> String {
    let c = json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

const CHAT_USAGE: &str = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":3,\"total_tokens\":23}}\n\n";

fn chat_body(stream_usage: bool) -> Value {
    let mut b =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    if stream_usage {
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

async fn proxy_to(raw: &std::sync::Arc<Raw>) -> (SocketAddr, context_engine_serve::AppState) {
    let url = start(std::sync::Arc::clone(raw)).await;
    start_proxy(options(&url), compressor_context(counter(), 128_000)).await
}

#[tokio::test]
async fn chat_a_stream_closed_before_done_ends_with_an_error_the_sdk_raises_on() {
    let whole = format!(
        "{}{}{}{CHAT_USAGE}",
        chat_chunk(json!({"role": "assistant", "content": "Hel"}), None),
        chat_chunk(json!({"content": "lo"}), None),
        chat_chunk(json!({}), Some("stop")),
    );
    let complete = format!("{whole}data: [DONE]\n\n");
    let raw = Raw::new([
        // Cut inside the next event: its part never reaches the client.
        RawReply::Unframed(format!("{whole}data: {{\"id\":\"c\",\"cho")),
        RawReply::Unframed(complete.clone()),
    ]);
    let (addr, state) = proxy_to(&raw).await;

    let (status, text) = post(addr, CHAT, &chat_body(true), "cut").await;
    assert_eq!(status, 200);
    let (head, tail) = text.split_at(whole.len());
    assert_eq!(head, whole, "the whole events, as they came");
    let ev = events(tail);
    assert_eq!(ev.len(), 1, "{tail}");
    let error: Value = serde_json::from_str(&ev[0].1).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("broke off")
    );
    assert_eq!(cuts(&state, CHAT, "closed"), 1);
    assert_eq!(
        fed_prompt_tokens(addr, "cut").await,
        0,
        "a cut stream's usage is not fed to the session"
    );

    // A complete stream: byte for byte, nothing counted, its usage fed.
    let (status, text) = post(addr, CHAT, &chat_body(true), "whole").await;
    assert_eq!((status, text.as_str()), (200, complete.as_str()));
    assert_eq!(cuts(&state, CHAT, "closed"), 1);
    assert_eq!(fed_prompt_tokens(addr, "whole").await, 20);
}

#[tokio::test]
async fn chat_a_clean_close_after_a_finish_reason_is_an_end_not_a_cut() {
    // Some OpenAI-compatible servers end a stream without `[DONE]`: a
    // clean close after a choice's `finish_reason` is the end (the agent
    // keeps working); one with part of an event left is still a cut.
    let whole = format!(
        "{}{}{CHAT_USAGE}",
        chat_chunk(json!({"role": "assistant", "content": "Hello"}), None),
        chat_chunk(json!({}), Some("stop")),
    );
    let no_finish = chat_chunk(json!({"role": "assistant", "content": "Hel"}), None);
    let raw = Raw::new([
        RawReply::Unframed(whole.clone()),
        RawReply::Unframed(format!("{whole}data: {{\"id\":\"c\",\"cho")),
        RawReply::Unframed(no_finish.clone()),
    ]);
    let (addr, state) = proxy_to(&raw).await;

    let (status, text) = post(addr, CHAT, &chat_body(true), "no-done").await;
    assert_eq!((status, text.as_str()), (200, whole.as_str()), "as it came");
    assert_eq!(cuts(&state, CHAT, "closed"), 0);
    assert_eq!(fed_prompt_tokens(addr, "no-done").await, 20, "usage fed");

    let (_, text) = post(addr, CHAT, &chat_body(true), "partial").await;
    assert!(text.contains("broke off"), "{text}");
    let (_, text) = post(addr, CHAT, &chat_body(true), "unfinished").await;
    assert!(text.contains("broke off"), "{text}");
    assert_eq!(cuts(&state, CHAT, "closed"), 2);
}

#[tokio::test]
async fn chat_a_chunked_body_cut_mid_event_and_a_silence_end_with_an_error() {
    let first = chat_chunk(json!({"role": "assistant", "content": "Hel"}), None);
    let raw = Raw::new([
        RawReply::ChunkedCut(vec![first.clone(), "data: {\"id\":\"c\",\"ch".into()]),
        RawReply::Stall(first.clone()),
    ]);
    let url = start(std::sync::Arc::clone(&raw)).await;
    let mut opts = options(&url);
    opts.upstream.timeout = Duration::from_millis(400);
    let (addr, state) = start_proxy(opts, compressor_context(counter(), 128_000)).await;

    let (status, text) = post(addr, CHAT, &chat_body(false), "chunked").await;
    assert_eq!(status, 200);
    assert!(text.starts_with(&first), "{text}");
    let ev = events(&text[first.len()..]);
    assert_eq!(ev.len(), 1, "{text}");
    let error: Value = serde_json::from_str(&ev[0].1).unwrap();
    assert!(error["error"]["message"].is_string());
    assert_eq!(cuts(&state, CHAT, "read_error"), 1);

    let (status, text) = post(addr, CHAT, &chat_body(false), "stall").await;
    assert_eq!(status, 200);
    let ev = events(&text[first.len()..]);
    let error: Value = serde_json::from_str(&ev[0].1).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timeout"),
        "{text}"
    );
    assert_eq!(cuts(&state, CHAT, "read_error"), 2);
}

const ANTHROPIC_HEAD: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":40,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":12}}\n\n";

const ANTHROPIC_STOP: &str = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

fn anthropic_body() -> Value {
    json!({"model": "claude", "max_tokens": 64, "stream": true,
           "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn anthropic_a_stream_closed_before_message_stop_ends_with_an_error_event() {
    let complete = format!("{ANTHROPIC_HEAD}{ANTHROPIC_STOP}");
    let raw = Raw::new([
        RawReply::Unframed(format!("{ANTHROPIC_HEAD}event: message_st")),
        RawReply::Unframed(complete.clone()),
    ]);
    let (addr, state) = proxy_to(&raw).await;

    let (status, text) = post(addr, MESSAGES, &anthropic_body(), "cut").await;
    assert_eq!(status, 200);
    let (head, tail) = text.split_at(ANTHROPIC_HEAD.len());
    assert_eq!(head, ANTHROPIC_HEAD);
    let ev = events(tail);
    assert_eq!(ev.len(), 1, "{tail}");
    assert_eq!(ev[0].0.as_deref(), Some("error"));
    let error: Value = serde_json::from_str(&ev[0].1).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(error["error"]["message"].is_string());
    assert_eq!(cuts(&state, MESSAGES, "closed"), 1);
    assert_eq!(fed_prompt_tokens(addr, "cut").await, 0);

    let (status, text) = post(addr, MESSAGES, &anthropic_body(), "whole").await;
    assert_eq!((status, text.as_str()), (200, complete.as_str()));
    assert_eq!(cuts(&state, MESSAGES, "closed"), 1);
    assert_eq!(fed_prompt_tokens(addr, "whole").await, 40);
}

/// Responses events with their sequence numbers from 0.
fn responses_sse(events: &[Value]) -> String {
    events
        .iter()
        .enumerate()
        .map(|(n, e)| {
            let mut e = e.clone();
            e["sequence_number"] = json!(n);
            format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())
        })
        .collect()
}

fn responses_body() -> Value {
    json!({"model": "gpt", "stream": true,
           "input": [{"type": "message", "role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn responses_a_stream_cut_before_completed_ends_failed_and_numbered_on() {
    let item = json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": "ok", "annotations": []}]});
    let head = responses_sse(&[
        json!({"type": "response.created", "response": {"id": "resp_1", "output": [], "usage": null}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "item_id": "msg_1", "delta": "ok"}),
    ]);
    let complete = responses_sse(&[
        json!({"type": "response.created", "response": {"id": "resp_1", "output": [], "usage": null}}),
        json!({"type": "response.completed", "response": {"id": "resp_1", "output": [],
               "usage": {"input_tokens": 700, "output_tokens": 9, "total_tokens": 709}}}),
    ]);
    let raw = Raw::new([
        RawReply::Unframed(format!("{head}event: response.output_item.done\ndata: {{")),
        RawReply::ChunkedCut(vec![head.clone(), "event: response.comp".into()]),
        RawReply::Unframed(complete.clone()),
    ]);
    let (addr, state) = proxy_to(&raw).await;

    for (id, reason) in [("closed", "closed"), ("chunked", "read_error")] {
        let (status, text) = post(addr, RESPONSES, &responses_body(), id).await;
        assert_eq!(status, 200);
        let (got, tail) = text.split_at(head.len());
        assert_eq!(got, head);
        let ev = events(tail);
        assert_eq!(ev.len(), 2, "{tail}");
        let error: Value = serde_json::from_str(&ev[0].1).unwrap();
        let failed: Value = serde_json::from_str(&ev[1].1).unwrap();
        assert_eq!(ev[0].0.as_deref(), Some("error"));
        // Flat as documented, nested as the API sends it (the SDK raises).
        assert!(error["message"].is_string() && error["error"]["message"].is_string());
        assert_eq!(error["sequence_number"], 3);
        // What Codex reads as a failed turn.
        assert_eq!(ev[1].0.as_deref(), Some("response.failed"));
        assert_eq!(failed["sequence_number"], 4);
        assert_eq!(failed["response"]["id"], "resp_1");
        assert_eq!(failed["response"]["status"], "failed");
        assert!(failed["response"]["error"]["message"].is_string());
        assert_eq!(cuts(&state, RESPONSES, reason), 1);
    }

    let (status, text) = post(addr, RESPONSES, &responses_body(), "whole").await;
    assert_eq!((status, text.as_str()), (200, complete.as_str()));
    assert_eq!(fed_prompt_tokens(addr, "whole").await, 700);
    assert_eq!(fed_prompt_tokens(addr, "closed").await, 0);
}

// Engine-tool rounds.

fn call_delta(id: Option<&str>, name: Option<&str>, args: &str) -> Value {
    let mut f = json!({"arguments": args});
    if let Some(n) = name {
        f["name"] = json!(n);
    }
    let mut c = json!({"index": 0, "function": f});
    if let Some(id) = id {
        c["id"] = json!(id);
        c["type"] = json!("function");
    }
    json!({"tool_calls": [c]})
}

async fn tools_proxy(raw: &std::sync::Arc<Raw>) -> (SocketAddr, context_engine_serve::AppState) {
    let url = start(std::sync::Arc::clone(raw)).await;
    start_proxy(
        options(&url).with_engine_tools(true),
        compressor_context(counter(), 128_000),
    )
    .await
}

fn chat_tools_body() -> Value {
    let mut messages = common::long_history(1);
    messages.push(json!({"role": "user", "content": "what did file0 say?"}));
    json!({"model": "m", "stream": true, "messages": messages,
           "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]})
}

#[tokio::test]
async fn chat_a_cut_in_a_held_round_or_in_its_continuation_ends_with_an_error() {
    let text_part = chat_chunk(
        json!({"role": "assistant", "content": "Let me check. "}),
        None,
    );
    let engine_call = format!(
        "{}{}",
        chat_chunk(call_delta(Some("r1"), Some("context_recall"), ""), None),
        chat_chunk(call_delta(None, None, "{\"handle\":\"call_0\"}"), None),
    );
    let round = format!(
        "{text_part}{engine_call}{}{CHAT_USAGE}data: [DONE]\n\n",
        chat_chunk(json!({}), Some("tool_calls"))
    );
    let continuation = chat_chunk(json!({"role": "assistant", "content": "file0 has"}), None);
    let raw = Raw::new([
        // Held from the engine call on, then cut.
        RawReply::Unframed(format!("{text_part}{engine_call}")),
        // Resolved; its continuation cut.
        RawReply::Unframed(round),
        RawReply::Unframed(format!("{continuation}data: {{\"choi")),
    ]);
    let (addr, state) = tools_proxy(&raw).await;

    let (status, text) = post(addr, CHAT, &chat_tools_body(), "held").await;
    assert_eq!(status, 200);
    assert!(
        !text.contains("context_recall"),
        "a held engine call never reaches the client: {text}"
    );
    let (head, tail) = text.split_at(text_part.len());
    assert_eq!(head, text_part);
    let ev = events(tail);
    assert_eq!(ev.len(), 1, "{tail}");
    assert!(serde_json::from_str::<Value>(&ev[0].1).unwrap()["error"]["message"].is_string());
    assert_eq!(raw.bodies().len(), 1, "a cut round is not resolved");

    let (status, text) = post(addr, CHAT, &chat_tools_body(), "continued").await;
    assert_eq!(status, 200);
    assert_eq!(raw.bodies().len(), 3, "the round was resolved and re-sent");
    assert!(!text.contains("context_recall"), "{text}");
    let rest = text.strip_prefix(text_part.as_str()).unwrap();
    let rest = rest.strip_prefix(continuation.as_str()).unwrap();
    let ev = events(rest);
    assert_eq!(ev.len(), 1, "{rest}");
    assert!(serde_json::from_str::<Value>(&ev[0].1).unwrap()["error"]["message"].is_string());
    assert_eq!(cuts(&state, CHAT, "closed"), 2);
    // Only the resolved round is billed (its usage, 20); the cut
    // continuation reports none.
    assert_eq!(fed_prompt_tokens(addr, "continued").await, 20);
}

fn anthropic_tools_body() -> Value {
    json!({"model": "claude", "max_tokens": 64, "stream": true,
           "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
           "messages": [{"role": "user", "content": "read a.txt"}]})
}

fn anthropic_sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect()
}

#[tokio::test]
async fn anthropic_a_cut_in_a_held_round_drops_the_engine_call_and_ends_with_an_error() {
    let shown = anthropic_sse(&[
        json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 40, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me look back."}}),
        json!({"type": "content_block_stop", "index": 0}),
    ]);
    let held = anthropic_sse(&[
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_r", "name": "context_recall", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"handle\":"}}),
    ]);
    let raw = Raw::new([RawReply::Unframed(format!("{shown}{held}"))]);
    let (addr, state) = tools_proxy(&raw).await;
    let (status, text) = post(addr, MESSAGES, &anthropic_tools_body(), "held").await;
    assert_eq!(status, 200);
    assert!(!text.contains("context_recall"), "{text}");
    let (head, tail) = text.split_at(shown.len());
    assert_eq!(head, shown);
    let ev = events(tail);
    assert_eq!(ev.len(), 1, "{tail}");
    assert_eq!(ev[0].0.as_deref(), Some("error"));
    assert_eq!(
        serde_json::from_str::<Value>(&ev[0].1).unwrap()["error"]["type"],
        "api_error"
    );
    assert_eq!(cuts(&state, MESSAGES, "closed"), 1);
}

fn responses_tools_body() -> Value {
    json!({"model": "gpt", "stream": true,
           "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
           "input": [{"type": "message", "role": "user", "content": "read a.txt"}]})
}

#[tokio::test]
async fn responses_a_cut_continuation_ends_failed_in_the_clients_numbering() {
    let call = json!({"type": "function_call", "id": "fc_r", "call_id": "call_recall", "status": "completed",
                      "name": "context_recall", "arguments": "{\"handle\":\"call_0\"}"});
    let first = responses_sse(&[
        json!({"type": "response.created", "response": {"id": "resp_1", "output": [], "usage": null}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": call}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": call}),
        json!({"type": "response.completed", "response": {"id": "resp_1", "output": [call],
               "usage": {"input_tokens": 700, "output_tokens": 9, "total_tokens": 709}}}),
    ]);
    let item = json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []});
    let continuation = responses_sse(&[
        json!({"type": "response.created", "response": {"id": "resp_2", "output": [], "usage": null}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
    ]);
    let raw = Raw::new([
        RawReply::Unframed(first),
        RawReply::Unframed(format!("{continuation}event: response.output_te")),
    ]);
    let (addr, state) = tools_proxy(&raw).await;
    let (status, text) = post(addr, RESPONSES, &responses_tools_body(), "cont").await;
    assert_eq!(status, 200);
    assert_eq!(raw.bodies().len(), 2, "the round was resolved and re-sent");
    assert!(!text.contains("context_recall"), "{text}");
    let ev = events(&text);
    let kinds: Vec<&str> = ev.iter().map(|e| e.0.as_deref().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.output_item.added",
            "error",
            "response.failed"
        ]
    );
    let seqs: Vec<u64> = ev
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(&e.1).unwrap()["sequence_number"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [0, 1, 2, 3], "numbered on from what the client saw");
    let failed: Value = serde_json::from_str(&ev[3].1).unwrap();
    assert_eq!(failed["response"]["id"], "resp_1", "the client's response");
    assert_eq!(failed["response"]["status"], "failed");
    assert_eq!(cuts(&state, RESPONSES, "closed"), 1);
    // Only the resolved round is billed (its usage, 700); the cut
    // continuation reports none.
    assert_eq!(fed_prompt_tokens(addr, "cont").await, 700);
}

/// A writer into a shared buffer, for the log.
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_cut_is_logged_with_its_route_and_reason_never_a_body() {
    // The whole binary's log (the other tests' cuts are in it too).
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let engine_call = format!(
        "{}{}{CHAT_USAGE}data: [DONE]\n\n",
        chat_chunk(call_delta(Some("r1"), Some("context_recall"), "{}"), None),
        chat_chunk(json!({}), Some("tool_calls")),
    );
    let secret = "sk-body-secret-4242";
    let raw = Raw::new([
        // The continuation is refused with a body that must stay out of
        // the log; then a stream that says the same and is cut.
        RawReply::Unframed(engine_call),
        RawReply::Status(429, format!("{{\"error\":{{\"message\":\"{secret}\"}}}}")),
        RawReply::Unframed(chat_chunk(json!({"content": secret}), None)),
    ]);
    let (addr, state) = tools_proxy(&raw).await;
    let (status, text) = post(addr, CHAT, &chat_tools_body(), "refused").await;
    assert_eq!(status, 200);
    let ev = events(&text);
    let error: Value = serde_json::from_str(&ev.last().unwrap().1).unwrap();
    assert!(
        error["error"]["message"].as_str().unwrap().contains("429"),
        "{text}"
    );
    assert_eq!(cuts(&state, CHAT, "continuation_refused"), 1);
    let (status, _) = post(addr, CHAT, &chat_body(false), "said").await;
    assert_eq!(status, 200);
    assert_eq!(cuts(&state, CHAT, "closed"), 1);

    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("broke off")).collect();
    assert!(lines.iter().all(|l| l.contains("WARN")), "{log}");
    let refused: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("continuation_refused"))
        .collect();
    assert_eq!(refused.len(), 1, "{log}");
    assert!(
        refused[0].contains("429") && refused[0].contains(CHAT),
        "{log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("reason=\"closed\"") && l.contains(CHAT)),
        "{log}"
    );
    assert!(!log.contains(secret), "no body in the log: {log}");
    assert!(!log.contains("sk-client-key"), "no key in the log: {log}");
}

#[tokio::test]
async fn responses_a_stream_passed_through_unmanaged_is_cut_the_same_way() {
    // On server-side state: no session, but the same relay.
    let head = responses_sse(&[
        json!({"type": "response.created", "response": {"id": "resp_9", "output": [], "usage": null}}),
    ]);
    let complete = responses_sse(&[
        json!({"type": "response.created", "response": {"id": "resp_9", "output": [], "usage": null}}),
        json!({"type": "response.completed", "response": {"id": "resp_9", "output": [],
               "usage": {"input_tokens": 7, "output_tokens": 1, "total_tokens": 8}}}),
    ]);
    let raw = Raw::new([
        RawReply::Unframed(format!("{head}event: resp")),
        RawReply::Unframed(complete.clone()),
    ]);
    let (addr, state) = proxy_to(&raw).await;
    let mut body = responses_body();
    body["previous_response_id"] = json!("resp_8");
    let (status, text) = post(addr, RESPONSES, &body, "state").await;
    assert_eq!(status, 200);
    let ev = events(&text);
    let kinds: Vec<&str> = ev.iter().map(|e| e.0.as_deref().unwrap()).collect();
    assert_eq!(kinds, ["response.created", "error", "response.failed"]);
    let failed: Value = serde_json::from_str(&ev[2].1).unwrap();
    assert_eq!(failed["response"]["id"], "resp_9");
    assert_eq!(cuts(&state, RESPONSES, "closed"), 1);

    let (status, text) = post(addr, RESPONSES, &body, "state").await;
    assert_eq!((status, text.as_str()), (200, complete.as_str()));
    let metrics = state.metrics().encode();
    assert_eq!(metric(&metrics, "ctx_unmanaged_total"), 2);
    assert_eq!(
        metric(&metrics, "ctx_prompt_tokens_total"),
        0,
        "an unmanaged call's usage is not counted, streamed or not"
    );
}

#[tokio::test]
async fn a_client_that_goes_away_mid_stream_does_not_drop_the_upstream_call() {
    let first = chat_chunk(json!({"role": "assistant", "content": "Hel"}), None);
    let rest = format!(
        "{}{}{CHAT_USAGE}data: [DONE]\n\n",
        chat_chunk(json!({"content": "lo"}), None),
        chat_chunk(json!({}), Some("stop")),
    );
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let raw = Raw::new([RawReply::Gated(
        first.clone(),
        std::sync::Arc::clone(&gate),
        rest,
    )]);
    let (addr, state) = proxy_to(&raw).await;

    // The client reads the first event, then goes away.
    let mut resp = reqwest::Client::new()
        .post(format!("http://{addr}{CHAT}"))
        .header("x-ctx-session", "gone")
        .header("authorization", CLIENT_KEY)
        .header("content-type", "application/json")
        .body(chat_body(false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let chunk = resp.chunk().await.unwrap().unwrap();
    assert_eq!(&chunk[..], first.as_bytes());
    drop(resp);
    // The proxy sees the client's connection close (and drops it) before
    // the rest of the stream (its usage) comes.
    assert!(
        server_connections_closed(addr.port(), Duration::from_secs(5)).await,
        "the proxy dropped the client's connection"
    );
    gate.notify_one();

    // The upstream's answer is read to its end all the same: its usage is
    // counted and fed to the session.
    let fed = eventually(Duration::from_secs(5), || async {
        let fed = fed_prompt_tokens(addr, "gone").await;
        (fed > 0).then_some(fed)
    })
    .await;
    assert_eq!(fed, Some(20), "the call's usage is fed to the session");
    let metrics = state.metrics().encode();
    assert_eq!(metric(&metrics, "ctx_prompt_tokens_total"), 20);
    assert_eq!(cuts(&state, CHAT, "closed"), 0);
}
