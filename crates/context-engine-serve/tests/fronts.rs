#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Anthropic Messages and Responses fronts against a scripted upstream:
//! bytes, headers and paths forwarded as they came, usage from JSON answers
//! and from both event formats, compaction in the client's own format
//! (valid, unknown blocks kept, breakpoints within the limit),
//! `count_tokens` on the managed request, `previous_response_id` passed
//! through and counted, an unreadable body forwarded unchanged, a pause
//! past the cache's lifetime compacting the next turn.

mod common;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::routing::post as route_post;
use context_engine::anthropic::cache::without_cache_control;
use context_engine::compressor::SUMMARY_PREFIX;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use common::{compressor_context, counter, options, short_cache_context, start_proxy, wall_clock};

#[derive(Clone, Debug)]
struct Seen {
    uri: String,
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Default)]
struct Upstream {
    seen: Mutex<Vec<Seen>>,
}

const ANTHROPIC_SSE: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":40,\"cache_read_input_tokens\":900,\"cache_creation_input_tokens\":60,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":12}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

const RESPONSES_SSE: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"usage\":null}}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r1\",\"output\":[],\"usage\":{\"input_tokens\":700,\"input_tokens_details\":{\"cached_tokens\":512},\"output_tokens\":9,\"total_tokens\":709}}}\n\n";

async fn answer(
    State(up): State<Arc<Upstream>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    up.seen.lock().unwrap().push(Seen {
        uri: uri.to_string(),
        headers,
        body,
    });
    let stream = request["stream"] == json!(true);
    let (content_type, text) = if uri.path().ends_with("count_tokens") {
        ("application/json", json!({"input_tokens": 123}).to_string())
    } else if uri.path().ends_with("/messages") {
        if stream {
            ("text/event-stream", ANTHROPIC_SSE.to_owned())
        } else {
            (
                "application/json",
                json!({"id": "m1", "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 40, "cache_read_input_tokens": 900,
                          "cache_creation_input_tokens": 60, "output_tokens": 12}})
                .to_string(),
            )
        }
    } else if stream {
        ("text/event-stream", RESPONSES_SSE.to_owned())
    } else {
        (
            "application/json",
            json!({"id": "r1", "object": "response", "output": [],
            "usage": {"input_tokens": 700, "input_tokens_details": {"cached_tokens": 512},
                      "output_tokens": 9, "total_tokens": 709}})
            .to_string(),
        )
    };
    Response::builder()
        .header("content-type", content_type)
        .body(Body::from(text))
        .unwrap()
}

async fn start_upstream(up: Arc<Upstream>) -> String {
    let app = Router::new()
        .route("/v1/messages", route_post(answer))
        .route("/v1/messages/count_tokens", route_post(answer))
        .route("/v1/responses", route_post(answer))
        .with_state(up);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

async fn post(
    addr: std::net::SocketAddr,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut req = common::client()
        .post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

/// `/ctx/sessions/{id}` with `headers`: with an `x-api-key`, that key
/// alone, as an Anthropic client sends it (a Messages request is named by
/// its `x-api-key`, the status by the first credential of any header).
async fn status(addr: std::net::SocketAddr, id: &str, headers: &[(&str, &str)]) -> Value {
    let client = if headers.iter().any(|(k, _)| *k == "x-api-key") {
        reqwest::Client::new()
    } else {
        common::client()
    };
    let mut req = client.get(format!("http://{addr}/ctx/sessions/{id}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    serde_json::from_slice(&req.send().await.unwrap().bytes().await.unwrap()).unwrap()
}

async fn metrics(addr: std::net::SocketAddr) -> String {
    common::metrics_text(addr).await
}

/// A Claude Code-like request: system blocks with a breakpoint, a
/// `system` entry, thinking, tool use, a result, a block type nobody knows
/// next to it, the breakpoint on the newest message.
fn claude_request(turns: usize, stream: bool) -> String {
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "Find the bug in the parser."}]})];
    for t in 0..turns {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": format!("step {t}"), "signature": format!("sig{t}")},
            {"type": "tool_use", "id": format!("toolu_{t:03}"), "name": "Bash",
             "input": {"command": format!("cat src/part_{t}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{t:03}"),
             "content": format!("// part {t}\n{}", "fn parse() { let x = 1; }\n".repeat(60))},
            {"type": "future_block", "payload": {"n": t}}]}));
    }
    if let Some(last) = messages.last_mut()
        && let Some(blocks) = last["content"].as_array_mut()
    {
        blocks[0]["cache_control"] = json!({"type": "ephemeral"});
    }
    json!({"model": "claude-x", "max_tokens": 1024,
           "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
           "messages": messages, "stream": stream,
           "metadata": {"user_id": "{\"session_id\":\"cc-1\"}"}})
    .to_string()
}

#[tokio::test]
async fn anthropic_unchanged_request_goes_upstream_byte_for_byte_with_its_headers() {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let (addr, _state) = start_proxy(options(&url), compressor_context(counter(), 200_000)).await;
    let body = claude_request(2, false);
    let headers = [
        ("x-api-key", "sk-ant-test"),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "interleaved-thinking-2025-05-14"),
        ("x-claude-code-session-id", "cc-1"),
    ];
    let (code, text) = post(addr, "/v1/messages?beta=true", &body, &headers).await;
    assert_eq!(code, 200, "{text}");
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].uri, "/v1/messages?beta=true");
    assert_eq!(
        seen[0].body,
        body.as_bytes(),
        "nothing to change: the same bytes"
    );
    for (k, v) in headers {
        assert_eq!(seen[0].headers[k], v, "{k} goes upstream as it came");
    }
    let s = status(addr, "cc-1", &[("x-api-key", "sk-ant-test")]).await;
    assert_eq!(s["stats"]["managed"], 1);
    // Anthropic's input excludes the cached part: 40 + 900 + 60.
    assert_eq!(s["stats"]["prompt_tokens"], 1000);
    let m = metrics(addr).await;
    assert!(m.contains("ctx_cache_read_tokens_total 900"), "{m}");
    assert!(m.contains("ctx_cache_write_tokens_total 60"), "{m}");
}

#[tokio::test]
async fn anthropic_stream_is_relayed_unchanged_and_its_usage_read() {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let (addr, _state) = start_proxy(options(&url), compressor_context(counter(), 200_000)).await;
    let body = claude_request(1, true);
    let (code, text) = post(addr, "/v1/messages", &body, &[("x-api-key", "k")]).await;
    assert_eq!(code, 200);
    assert_eq!(text, ANTHROPIC_SSE);
    // The session is keyed by metadata.user_id's session_id.
    let s = status(addr, "cc-1", &[("x-api-key", "k")]).await;
    assert_eq!(s["stats"]["prompt_tokens"], 1000);
    assert_eq!(s["stats"]["completion_tokens"], 12);
}

#[tokio::test]
async fn anthropic_compaction_is_valid_keeps_unknown_blocks_and_breakpoints() {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let (addr, _state) = start_proxy(options(&url), compressor_context(counter(), 6_000)).await;
    let headers = [("x-api-key", "k"), ("x-claude-code-session-id", "big")];
    let mut compacted = None;
    for turns in 1..=30 {
        let body = claude_request(turns, false);
        let (code, _) = post(addr, "/v1/messages", &body, &headers).await;
        assert_eq!(code, 200);
        let seen = up.seen.lock().unwrap().last().cloned().unwrap();
        let sent: Value = serde_json::from_slice(&seen.body).unwrap();
        let request = context_engine::anthropic::Request::from_value(sent.clone()).unwrap();
        assert!(
            context_engine::validate::anthropic::validate(&request).is_empty(),
            "turn {turns}: {:?}",
            context_engine::validate::anthropic::validate(&request)
        );
        assert!(context_engine::anthropic::cache::breakpoints(&request) <= 4);
        let text = sent.to_string();
        if text.contains(SUMMARY_PREFIX) {
            compacted.get_or_insert(turns);
            // Every tool result still has its unknown neighbour.
            for m in sent["messages"].as_array().unwrap() {
                let blocks = m["content"].as_array().cloned().unwrap_or_default();
                if blocks.iter().any(|b| b["type"] == "tool_result") {
                    assert!(blocks.iter().any(|b| b["type"] == "future_block"), "{m}");
                }
            }
            // The client's breakpoint on the newest message stays; the
            // system prompt keeps its own.
            let last = sent["messages"].as_array().unwrap().last().unwrap();
            assert_eq!(last["content"][0]["cache_control"]["type"], "ephemeral");
            assert_eq!(sent["system"][0]["cache_control"]["type"], "ephemeral");
            assert!(
                text.contains("Find the bug in the parser."),
                "the task stays"
            );
        }
    }
    let turns = compacted.expect("the proxy compacted at a 6000-token window");

    // count_tokens for the history seen plus nothing new: counted on the
    // managed request (the summary), not the client's whole history.
    let body = claude_request(30, false);
    let (code, text) = post(addr, "/v1/messages/count_tokens", &body, &headers).await;
    assert_eq!((code, text.as_str()), (200, r#"{"input_tokens":123}"#));
    let seen = up.seen.lock().unwrap().last().cloned().unwrap();
    assert!(seen.uri.ends_with("/messages/count_tokens"));
    let counted = String::from_utf8(seen.body.to_vec()).unwrap();
    assert!(
        counted.contains(SUMMARY_PREFIX),
        "compacted after turn {turns}"
    );
    assert!(counted.len() < body.len());
}

/// The index of the last message of `request` with a breakpoint.
fn last_marked(request: &Value) -> Option<usize> {
    let request = context_engine::anthropic::Request::from_value(request.clone()).ok()?;
    request
        .messages
        .iter()
        .rposition(|m| context_engine::anthropic::cache::message_breakpoints(m) > 0)
}

/// Anthropic's cache stores a prefix only at a breakpoint and reads it
/// only for a request that carries that prefix whole. The digest shortens
/// the newest tool results once a newer batch arrives, so the client's
/// breakpoint on them would write an entry no request reads: the proxy
/// moves it to the tool call before them, which every later request
/// carries as it is.
#[tokio::test]
async fn anthropic_breakpoints_move_off_results_the_next_request_digests() {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let (addr, _state) = start_proxy(options(&url), compressor_context(counter(), 200_000)).await;
    let headers = [("x-api-key", "k"), ("x-claude-code-session-id", "moves")];
    // Results of 5.4 KB: over the digest's 4 KB, so each is digested once
    // the next batch arrives.
    let request = |turns: usize| {
        let mut v: Value = serde_json::from_str(&claude_request(turns, false)).unwrap();
        for m in v["messages"].as_array_mut().unwrap() {
            if let Some(blocks) = m["content"].as_array_mut()
                && blocks[0]["type"] == "tool_result"
            {
                let text = blocks[0]["content"].as_str().unwrap().to_owned();
                blocks[0]["content"] = json!(text.repeat(4));
            }
        }
        v.to_string()
    };
    let mut sent = Vec::new();
    for turns in 1..=6 {
        let (code, text) = post(addr, "/v1/messages", &request(turns), &headers).await;
        assert_eq!(code, 200, "{text}");
        let seen = up.seen.lock().unwrap().last().cloned().unwrap();
        sent.push(serde_json::from_slice::<Value>(&seen.body).unwrap());
    }
    for (k, r) in sent.iter().enumerate() {
        let messages = r["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        assert!(
            !last.to_string().contains("cache_control"),
            "request {k}: no breakpoint on the results the next request digests"
        );
        let call = &messages[messages.len() - 2];
        assert_eq!(call["role"], "assistant");
        assert_eq!(
            call["content"][1]["cache_control"],
            json!({"type": "ephemeral"}),
            "request {k}: the breakpoint moved to the tool call: {call}"
        );
        assert!(
            call["content"][0].get("cache_control").is_none(),
            "never on thinking"
        );
        assert_eq!(r["system"][0]["cache_control"]["type"], "ephemeral");
        let request = context_engine::anthropic::Request::from_value(r.clone()).unwrap();
        assert!(context_engine::validate::anthropic::validate(&request).is_empty());
        assert_eq!(context_engine::anthropic::cache::breakpoints(&request), 2);
    }
    // Each request carries the previous one's marked prefix whole: the
    // cache reads all of it.
    for (k, pair) in sent.windows(2).enumerate() {
        let m = last_marked(&pair[0]).unwrap();
        assert_eq!(m, pair[0]["messages"].as_array().unwrap().len() - 2);
        let prefix =
            |r: &Value| without_cache_control(&json!(r["messages"].as_array().unwrap()[..=m]));
        assert_eq!(
            prefix(&pair[0]),
            prefix(&pair[1]),
            "request {} reads request {k}'s entry",
            k + 1
        );
    }
    // The newest result of each request is digested in the next one.
    let digested = sent[1]["messages"][2]["content"][0]["content"].to_string();
    assert!(digested.contains("[digested]"), "{digested}");

    // Small results stay whole, and so does the client's breakpoint.
    let headers = [("x-api-key", "k"), ("x-claude-code-session-id", "small")];
    for turns in 1..=3 {
        let body = claude_request(turns, false);
        let (code, _) = post(addr, "/v1/messages", &body, &headers).await;
        assert_eq!(code, 200);
        let seen = up.seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(
            seen.body,
            body.as_bytes(),
            "nothing to change: the same bytes"
        );
    }
}

/// Claude Code through the Anthropic front, with a three-second cache on a
/// clock the test moves (a warm session's calls come at one instant): the
/// turn before the one where a warm session first
/// compacts (past half the threshold, short of it) compacts when the
/// client paused longer than the cache lives; the request goes out valid.
#[tokio::test]
async fn anthropic_a_pause_past_the_cache_lifetime_compacts_the_next_turn() {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let wall = wall_clock();
    let (addr, _state) = start_proxy(options(&url), short_cache_context(6_000, 3, &wall)).await;
    let send = |session: &'static str, turns: usize| {
        let up = Arc::clone(&up);
        async move {
            let headers = [("x-api-key", "k"), ("x-claude-code-session-id", session)];
            let (code, _) = post(
                addr,
                "/v1/messages",
                &claude_request(turns, false),
                &headers,
            )
            .await;
            assert_eq!(code, 200);
            let seen = up.seen.lock().unwrap().last().cloned().unwrap();
            serde_json::from_slice::<Value>(&seen.body).unwrap()
        }
    };
    let mut first = None;
    for turns in 1..=30 {
        if send("warm", turns)
            .await
            .to_string()
            .contains(SUMMARY_PREFIX)
        {
            first = Some(turns);
            break;
        }
    }
    let first = first.expect("a warm session compacts at the threshold");
    assert!(
        first > 3,
        "room for a turn past half the threshold: {first}"
    );
    let turn = first - 1;
    for turns in 1..turn {
        let sent = send("paused", turns).await;
        assert!(!sent.to_string().contains(SUMMARY_PREFIX), "turn {turns}");
    }
    // The pause: longer than the cache lives.
    wall.advance(std::time::Duration::from_millis(3_500));
    let sent = send("paused", turn).await;
    assert!(
        sent.to_string().contains(SUMMARY_PREFIX),
        "turn {turn} after the pause compacts (a warm one first did at {first})"
    );
    let request = context_engine::anthropic::Request::from_value(sent).unwrap();
    assert!(context_engine::validate::anthropic::validate(&request).is_empty());
}

/// The session's cache of the previous request (only new messages are
/// parsed) never serves other bytes: a client that re-encodes an old
/// message, edits one or cuts its history back gets the same managed
/// request upstream as a proxy that reads every request whole (a top-level
/// field that changes on every call defeats its cache), compacted or not.
#[tokio::test]
async fn a_client_rewriting_its_history_gets_what_a_whole_read_gives() {
    let with = |turns: usize, edit: &dyn Fn(&mut Value)| {
        let mut v: Value = serde_json::from_str(&claude_request(turns, false)).unwrap();
        edit(&mut v);
        serde_json::to_string(&v).unwrap()
    };
    // An old message re-encoded (indented, keys reordered) by the client.
    let mut reencoded = claude_request(4, false);
    let v: Value = serde_json::from_str(&reencoded).unwrap();
    let compact = serde_json::to_string(&v["messages"][1]).unwrap();
    let mut reordered = serde_json::Map::new();
    reordered.insert("content".into(), v["messages"][1]["content"].clone());
    reordered.insert("role".into(), v["messages"][1]["role"].clone());
    let indented = serde_json::to_string_pretty(&Value::Object(reordered)).unwrap();
    reencoded = reencoded.replacen(&compact, &indented, 1);
    let bodies = [
        claude_request(3, false),
        claude_request(4, false),
        reencoded,
        with(4, &|v| {
            v["messages"][2]["content"][0]["content"] = json!("edited result of part 0");
        }),
        with(5, &|v| {
            v["messages"][2]["content"][0]["content"] = json!("edited result of part 0");
        }),
        claude_request(2, false),
        claude_request(5, false),
        claude_request(6, false),
    ];
    for window in [200_000, 2_500] {
        let ups = [Arc::new(Upstream::default()), Arc::new(Upstream::default())];
        let mut addrs = Vec::new();
        for up in &ups {
            let url = start_upstream(Arc::clone(up)).await;
            let ctx = compressor_context(counter(), window);
            addrs.push(start_proxy(options(&url), ctx).await.0);
        }
        let headers = [("x-api-key", "k"), ("x-claude-code-session-id", "edits")];
        for (n, body) in bodies.iter().enumerate() {
            let whole = body.replacen('{', &format!(r#"{{"n":{n},"#), 1);
            assert_eq!(post(addrs[0], "/v1/messages", body, &headers).await.0, 200);
            assert_eq!(
                post(addrs[1], "/v1/messages", &whole, &headers).await.0,
                200
            );
            let sent = |up: &Upstream| -> Value {
                let seen = up.seen.lock().unwrap().last().cloned().unwrap();
                serde_json::from_slice(&seen.body).expect("valid JSON upstream")
            };
            let (cached, read_whole) = (sent(&ups[0]), sent(&ups[1]));
            assert_eq!(
                cached["messages"], read_whole["messages"],
                "window {window}, body {n}"
            );
            assert_eq!(
                cached["system"], read_whole["system"],
                "window {window}, body {n}"
            );
            let request = context_engine::anthropic::Request::from_value(cached).unwrap();
            assert!(context_engine::validate::anthropic::validate(&request).is_empty());
            let raw = String::from_utf8(ups[0].seen.lock().unwrap().last().unwrap().body.to_vec())
                .unwrap();
            if n == 3 {
                assert!(
                    !raw.contains("// part 0"),
                    "window {window}: no stale message"
                );
            }
            if window == 200_000 {
                // Nothing due: the client's own bytes.
                assert_eq!(raw, *body, "body {n}");
            }
        }
    }
}

/// A Codex-like request: instructions, messages, reasoning with encrypted
/// content, function calls and their outputs, an item type nobody knows.
fn codex_request(turns: usize, extra: &str) -> String {
    let mut input = vec![json!({"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Fix the failing test."}]})];
    for t in 0..turns {
        input.push(
            json!({"type": "reasoning", "id": format!("rs_{t}"), "summary": [],
                          "encrypted_content": format!("gAAAA{t}")}),
        );
        input.push(json!({"type": "function_call", "id": format!("fc_{t}"), "call_id": format!("call_{t}"),
                          "name": "exec_command", "arguments": format!("{{\"cmd\":\"cat t{t}.py\"}}")}));
        input.push(
            json!({"type": "function_call_output", "call_id": format!("call_{t}"),
                          "output": format!("# t{t}\n{}", "assert parse('x') == 1\n".repeat(60))}),
        );
        input.push(json!({"type": "future_item", "n": t}));
    }
    let mut v = json!({"model": "gpt-x", "instructions": "You are Codex.", "input": input,
                       "stream": false, "store": false, "prompt_cache_key": "codex-1"});
    if !extra.is_empty() {
        v[extra] = json!("resp_prev");
    }
    v.to_string()
}

#[tokio::test]
async fn responses_compaction_is_valid_and_the_prefix_stays_byte_identical() {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let (addr, _state) = start_proxy(options(&url), compressor_context(counter(), 6_000)).await;
    let headers = [
        ("authorization", "Bearer sk-test"),
        ("session-id", "codex-1"),
    ];
    let mut sent_inputs: Vec<String> = Vec::new();
    let mut compacted = false;
    for turns in 1..=30 {
        let body = codex_request(turns, "");
        let (code, _) = post(addr, "/v1/responses", &body, &headers).await;
        assert_eq!(code, 200);
        let seen = up.seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(seen.headers["authorization"], "Bearer sk-test");
        let sent: Value = serde_json::from_slice(&seen.body).unwrap();
        let request = context_engine::responses::Request::from_value(sent.clone()).unwrap();
        assert!(context_engine::validate::responses::validate(&request).is_empty());
        let text = String::from_utf8(seen.body.to_vec()).unwrap();
        compacted |= text.contains(SUMMARY_PREFIX);
        // Encrypted reasoning is never rewritten.
        for item in sent["input"].as_array().unwrap() {
            if item["type"] == "reasoning" {
                assert!(
                    item["encrypted_content"]
                        .as_str()
                        .unwrap()
                        .starts_with("gAAAA")
                );
            }
        }
        sent_inputs.push(text);
    }
    assert!(compacted, "the proxy compacted at a 6000-token window");
    let s = status(addr, "codex-1", &[("authorization", "Bearer sk-test")]).await;
    // Between compactions each input starts with the previous one's items,
    // byte for byte.
    let raw_inputs: Vec<Vec<String>> = sent_inputs
        .iter()
        .map(|t| {
            #[derive(serde::Deserialize)]
            struct Input<'a> {
                #[serde(borrow)]
                input: Vec<&'a serde_json::value::RawValue>,
            }
            let i: Input<'_> = serde_json::from_str(t).unwrap();
            i.input.iter().map(|r| r.get().to_owned()).collect()
        })
        .collect();
    let breaks = raw_inputs
        .windows(2)
        .filter(|w| w[1].len() < w[0].len() || w[1][..w[0].len()] != w[0][..])
        .count();
    let compactions = s["stats"]["compactions"].as_u64().unwrap();
    assert!(compactions > 0);
    assert!(
        breaks as u64 <= compactions,
        "{breaks} breaks, {compactions} compactions"
    );
    assert_eq!(s["stats"]["prompt_tokens"], 700 * 30);
    assert_eq!(s["stats"]["new_lineages"], 0, "append-only: one lineage");
}

#[tokio::test]
async fn responses_on_server_state_pass_through_and_are_counted() {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let (addr, _state) = start_proxy(options(&url), compressor_context(counter(), 200_000)).await;
    let body = codex_request(2, "previous_response_id");
    let (code, _) = post(addr, "/v1/responses", &body, &[("session-id", "s")]).await;
    assert_eq!(code, 200);
    assert_eq!(up.seen.lock().unwrap()[0].body, body.as_bytes());
    let m = metrics(addr).await;
    assert!(
        m.contains(r#"ctx_unmanaged_total{route="/v1/responses",reason="previous_response_id"} 1"#),
        "{m}"
    );
    // Streamed: relayed unchanged, usage from response.completed.
    let body = codex_request(1, "").replace("\"stream\":false", "\"stream\":true");
    let (code, text) = post(addr, "/v1/responses", &body, &[("session-id", "t")]).await;
    assert_eq!((code, text.as_str()), (200, RESPONSES_SSE));
    let s = status(addr, "t", &[]).await;
    assert_eq!(s["stats"]["prompt_tokens"], 700);
}

#[tokio::test]
async fn an_unreadable_body_goes_upstream_unchanged() {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let (addr, _state) = start_proxy(options(&url), compressor_context(counter(), 200_000)).await;
    for (path, body) in [
        ("/v1/messages", r#"{"model":"m","messages":3}"#),
        ("/v1/responses", r#"{"model":"m","input":[1]}"#),
    ] {
        let (code, _) = post(addr, path, body, &[]).await;
        assert_eq!(code, 200);
        let seen = up.seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(seen.body, body.as_bytes());
    }
    assert!(metrics(addr).await.contains("ctx_fallbacks_total 2"));
}

/// The Codex requests of a 30-turn session sent through `instances`
/// proxies in turn, all sharing `store`; what the upstream received.
async fn codex_through(
    instances: usize,
    store: Arc<dyn context_engine::store::SessionStore>,
) -> Vec<Bytes> {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let mut proxies = Vec::new();
    for _ in 0..instances {
        let opts = options(&url).with_store(Some(Arc::clone(&store)));
        proxies.push(
            start_proxy(opts, compressor_context(counter(), 6_000))
                .await
                .0,
        );
    }
    for turns in 1..=30 {
        let addr = proxies[turns % instances];
        let (code, _) = post(
            addr,
            "/v1/responses",
            &codex_request(turns, ""),
            &[("session-id", "codex-fleet")],
        )
        .await;
        assert_eq!(code, 200);
    }
    let seen = up.seen.lock().unwrap();
    seen.iter().map(|s| s.body.clone()).collect()
}

#[tokio::test]
async fn responses_sessions_kept_in_a_store_move_between_instances() {
    use context_engine::store::{MemoryStore, SessionStore};
    let alone: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let reference = codex_through(1, Arc::clone(&alone)).await;
    let shared: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let fleet = codex_through(2, Arc::clone(&shared)).await;
    assert_eq!(reference.len(), fleet.len());
    for (i, (a, b)) in reference.iter().zip(&fleet).enumerate() {
        assert!(a == b, "request {i} differs between one instance and two");
    }
    // Compacted once per compaction, archived in the shared store.
    let records = shared
        .compactions(&common::store_id("codex-fleet"))
        .unwrap();
    assert!(!records.is_empty(), "the session compacted at 6000 tokens");
    let handles = |rs: &[context_engine::store::CompactionRecord]| {
        rs.iter().map(|r| r.handle.clone()).collect::<Vec<_>>()
    };
    let single = alone.compactions(&common::store_id("codex-fleet")).unwrap();
    assert_eq!(
        handles(&records),
        handles(&single),
        "the same compactions, once each"
    );
    for r in &records {
        assert!(
            shared
                .resolve(Some(&common::store_id("codex-fleet")), &r.handle)
                .unwrap()
                .is_some()
        );
    }
}

/// An upstream that calls `context_recall` on `toolu_000` until the request
/// carries the proxy's answer, then answers with text; streamed or not, as
/// asked.
async fn recalling(
    State(up): State<Arc<Upstream>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    up.seen.lock().unwrap().push(Seen {
        uri: uri.to_string(),
        headers,
        body,
    });
    let answered = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .is_some_and(|m| m["content"][0]["tool_use_id"] == "toolu_recall");
    let (content, stop) = if answered {
        (
            json!([{"type": "text", "text": "part 0 defines parse."}]),
            "end_turn",
        )
    } else {
        (
            json!([{"type": "text", "text": "Let me look back."},
                   {"type": "tool_use", "id": "toolu_recall", "name": "context_recall",
                    "input": {"handle": "toolu_000"}}]),
            "tool_use",
        )
    };
    let usage = json!({"input_tokens": 40, "output_tokens": 12});
    let text = if request["stream"] == json!(true) {
        let mut events = vec![
            json!({"type": "message_start", "message": {"id": "m", "type": "message",
            "role": "assistant", "content": [], "usage": usage}}),
        ];
        for (i, block) in content.as_array().unwrap().iter().enumerate() {
            let mut start = block.clone();
            let delta = if block["type"] == "text" {
                start["text"] = json!("");
                json!({"type": "text_delta", "text": block["text"]})
            } else {
                start["input"] = json!({});
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()})
            };
            events.push(json!({"type": "content_block_start", "index": i, "content_block": start}));
            events.push(json!({"type": "content_block_delta", "index": i, "delta": delta}));
            events.push(json!({"type": "content_block_stop", "index": i}));
        }
        events.push(json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 12}}));
        events.push(json!({"type": "message_stop"}));
        events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect::<String>()
    } else {
        json!({"id": "m", "type": "message", "role": "assistant", "content": content,
               "stop_reason": stop, "usage": usage})
        .to_string()
    };
    let content_type = if request["stream"] == json!(true) {
        "text/event-stream"
    } else {
        "application/json"
    };
    Response::builder()
        .header("content-type", content_type)
        .body(Body::from(text))
        .unwrap()
}

/// A proxy with engine tools in front of an upstream answering `route`
/// with `handler` (one of the recalling upstreams): the upstream's record,
/// the proxy's address and state.
async fn proxy_to_recalling<H, T>(
    route: &str,
    handler: H,
) -> (
    Arc<Upstream>,
    std::net::SocketAddr,
    context_engine_serve::AppState,
)
where
    H: axum::handler::Handler<T, Arc<Upstream>>,
    T: 'static,
{
    let up = Arc::new(Upstream::default());
    let app = Router::new()
        .route(route, route_post(handler))
        .with_state(Arc::clone(&up));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (addr, state) = start_proxy(
        options(&url).with_engine_tools(true),
        compressor_context(counter(), 200_000),
    )
    .await;
    (up, addr, state)
}

#[tokio::test]
async fn anthropic_engine_tools_are_offered_and_resolved_in_the_proxy() {
    for stream in [false, true] {
        let (up, addr, state) = proxy_to_recalling("/v1/messages", recalling).await;
        let mut body: Value = serde_json::from_str(&claude_request(2, stream)).unwrap();
        body["tools"] = json!([{"name": "Bash", "input_schema": {"type": "object"}}]);
        let (code, text) = post(
            addr,
            "/v1/messages",
            &body.to_string(),
            &[("x-api-key", "k")],
        )
        .await;
        assert_eq!(code, 200, "{text}");

        // The client sees one message: the text of both rounds, no call.
        let (texts, kinds) = if stream {
            let events: Vec<Value> = text
                .split("\n\n")
                .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
                .map(|d| serde_json::from_str(d).unwrap())
                .collect();
            assert_eq!(
                events
                    .iter()
                    .filter(|e| e["type"] == "message_start")
                    .count(),
                1
            );
            assert_eq!(events.last().unwrap()["type"], "message_stop");
            let starts: Vec<u64> = events
                .iter()
                .filter(|e| e["type"] == "content_block_start")
                .map(|e| e["index"].as_u64().unwrap())
                .collect();
            assert_eq!(starts, [0, 1], "block indices follow on");
            let texts: Vec<String> = events
                .iter()
                .filter_map(|e| e["delta"]["text"].as_str().map(str::to_owned))
                .collect();
            let kinds: Vec<String> = events
                .iter()
                .filter_map(|e| e["content_block"]["type"].as_str().map(str::to_owned))
                .collect();
            (texts, kinds)
        } else {
            let answer: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(answer["stop_reason"], "end_turn");
            let blocks = answer["content"].as_array().unwrap();
            (
                blocks
                    .iter()
                    .filter_map(|b| b["text"].as_str().map(str::to_owned))
                    .collect(),
                blocks
                    .iter()
                    .map(|b| b["type"].as_str().unwrap().to_owned())
                    .collect(),
            )
        };
        // Streamed or not, the client gets the same: the first round's
        // text before the answer's.
        assert_eq!(
            texts,
            ["Let me look back.", "part 0 defines parse."],
            "stream: {stream}"
        );
        assert!(kinds.iter().all(|k| k == "text"), "{kinds:?}");

        let seen = up.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        let first: Value = serde_json::from_slice(&seen[0].body).unwrap();
        let offered: Vec<&str> = first["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(offered[0], "Bash");
        assert!(offered.contains(&"context_recall"), "{offered:?}");
        assert!(first["tools"][1]["input_schema"].is_object());
        // The second request carries the exchange: the model's turn and
        // the recalled output as a tool result.
        let second: Value = serde_json::from_slice(&seen[1].body).unwrap();
        let messages = second["messages"].as_array().unwrap();
        let n = messages.len();
        assert_eq!(messages[n - 2]["content"][1]["name"], "context_recall");
        assert_eq!(
            messages[n - 2]["content"][1]["input"],
            json!({"handle": "toolu_000"})
        );
        let result = &messages[n - 1]["content"][0];
        assert_eq!(result["type"], "tool_result");
        assert!(
            result["content"].as_str().unwrap().contains("// part 0"),
            "{result}"
        );
        assert!(
            state
                .metrics()
                .encode()
                .contains("ctx_engine_tool_rounds_total 1")
        );

        // The client's next turn (without the exchange) is managed as usual.
        let s = status(addr, "cc-1", &[("x-api-key", "k")]).await;
        assert_eq!(s["stats"]["managed"], 1);
        // Both upstream calls are billed: the resolved round's and the
        // answer's (12 each).
        assert_eq!(s["stats"]["completion_tokens"], 24);
    }
}

#[tokio::test]
async fn anthropic_engine_tools_stay_off_a_pinned_tool_choice_a_toolless_client_and_when_off() {
    let up = Arc::new(Upstream::default());
    let url = start_upstream(Arc::clone(&up)).await;
    let (addr, _state) = start_proxy(options(&url), compressor_context(counter(), 200_000)).await;
    let mut body: Value = serde_json::from_str(&claude_request(1, false)).unwrap();
    // No tools of its own (as from a text-action agent): nothing offered.
    let (code, _) = post(
        addr,
        "/v1/messages",
        &body.to_string(),
        &[("x-api-key", "k")],
    )
    .await;
    assert_eq!(code, 200);
    body["tools"] = json!([{"name": "Bash", "input_schema": {"type": "object"}}]);
    body["tool_choice"] = json!({"type": "tool", "name": "Bash"});
    let (code, _) = post(
        addr,
        "/v1/messages",
        &body.to_string(),
        &[("x-api-key", "k")],
    )
    .await;
    assert_eq!(code, 200);

    let off = options(&url).with_engine_tools(false);
    let (addr, _state) = start_proxy(off, compressor_context(counter(), 200_000)).await;
    body.as_object_mut().unwrap().remove("tool_choice");
    let (code, _) = post(
        addr,
        "/v1/messages",
        &body.to_string(),
        &[("x-api-key", "k")],
    )
    .await;
    assert_eq!(code, 200);
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        let sent: Value = serde_json::from_slice(&s.body).unwrap();
        let names: Vec<&str> = sent["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(!names.contains(&"context_recall"), "{names:?}");
    }
    assert_eq!(seen[2].body, body.to_string().as_bytes(), "off: as it came");
}

/// A Responses upstream that calls `context_recall` on `call_0` until the
/// input carries the proxy's output for it, then answers with a message.
async fn recalling_responses(
    State(up): State<Arc<Upstream>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    up.seen.lock().unwrap().push(Seen {
        uri: uri.to_string(),
        headers,
        body,
    });
    let answered = request["input"]
        .as_array()
        .and_then(|i| i.last())
        .is_some_and(|i| i["call_id"] == "call_recall" && i["type"] == "function_call_output");
    let (id, output) = if answered {
        (
            "resp_2",
            json!([{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "t0 asserts parse.", "annotations": []}]}]),
        )
    } else {
        (
            "resp_1",
            json!([{"type": "reasoning", "id": "rs_r", "summary": [], "encrypted_content": "gAAAAr"},
                   {"type": "function_call", "id": "fc_r", "call_id": "call_recall", "status": "completed",
                    "name": "context_recall", "arguments": "{\"handle\":\"call_0\"}"}]),
        )
    };
    let usage = json!({"input_tokens": 700, "output_tokens": 9, "total_tokens": 709});
    let stream = request["stream"] == json!(true);
    let text = if stream {
        let mut events = vec![
            json!({"type": "response.created", "response": {"id": id, "output": [], "usage": null}}),
            json!({"type": "response.in_progress", "response": {"id": id, "output": [], "usage": null}}),
        ];
        for (i, item) in output.as_array().unwrap().iter().enumerate() {
            events.push(
                json!({"type": "response.output_item.added", "output_index": i, "item": item}),
            );
            if item["type"] == "message" {
                events.push(json!({"type": "response.output_text.delta", "output_index": i, "content_index": 0,
                                   "item_id": item["id"], "delta": item["content"][0]["text"]}));
            }
            events.push(
                json!({"type": "response.output_item.done", "output_index": i, "item": item}),
            );
        }
        events.push(json!({"type": "response.completed", "response": {"id": id, "output": output, "usage": usage}}));
        events
            .iter()
            .enumerate()
            .map(|(n, e)| {
                let mut e = e.clone();
                e["sequence_number"] = json!(n);
                format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())
            })
            .collect::<String>()
    } else {
        json!({"id": id, "object": "response", "output": output, "usage": usage}).to_string()
    };
    Response::builder()
        .header(
            "content-type",
            if stream {
                "text/event-stream"
            } else {
                "application/json"
            },
        )
        .body(Body::from(text))
        .unwrap()
}

#[tokio::test]
async fn responses_engine_tools_are_offered_and_resolved_in_the_proxy() {
    for stream in [false, true] {
        let (up, addr, state) = proxy_to_recalling("/v1/responses", recalling_responses).await;
        let mut body: Value = serde_json::from_str(&codex_request(2, "")).unwrap();
        body["stream"] = json!(stream);
        body["tools"] = json!([{"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
                               {"type": "custom", "name": "apply_patch"}]);
        let (code, text) = post(addr, "/v1/responses", &body.to_string(), &[]).await;
        assert_eq!(code, 200, "{text}");

        let response = if stream {
            let events: Vec<Value> = text
                .split("\n\n")
                .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
                .map(|d| serde_json::from_str(d).unwrap())
                .collect();
            assert_eq!(
                events
                    .iter()
                    .filter(|e| e["type"] == "response.created")
                    .count(),
                1
            );
            let seqs: Vec<u64> = events
                .iter()
                .map(|e| e["sequence_number"].as_u64().unwrap())
                .collect();
            assert_eq!(
                seqs,
                (0..seqs.len() as u64).collect::<Vec<_>>(),
                "sequence numbers follow on"
            );
            let added: Vec<(u64, String)> = events
                .iter()
                .filter(|e| e["type"] == "response.output_item.added")
                .map(|e| {
                    (
                        e["output_index"].as_u64().unwrap(),
                        e["item"]["type"].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            // The reasoning before the engine's call is held with it (the
            // API refuses a reasoning item sent back without the item
            // that followed it): the continuation's message is the
            // client's first item; the engine's call never reaches it.
            assert_eq!(added, [(0, "message".to_owned())]);
            events.last().unwrap()["response"].clone()
        } else {
            serde_json::from_str(&text).unwrap()
        };
        let output = response["output"].as_array().unwrap();
        let texts: Vec<&str> = output
            .iter()
            .filter_map(|i| i["content"][0]["text"].as_str())
            .collect();
        assert_eq!(texts, ["t0 asserts parse."], "{response}");
        assert!(
            output.iter().all(|i| i["type"] != "function_call"),
            "{response}"
        );
        if stream {
            assert_eq!(response["id"], "resp_1", "one response for the client");
        }

        let seen = up.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        let first: Value = serde_json::from_slice(&seen[0].body).unwrap();
        let offered: Vec<&str> = first["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(offered[..2], ["exec_command", "apply_patch"]);
        assert!(offered.contains(&"context_recall"), "{offered:?}");
        let second: Value = serde_json::from_slice(&seen[1].body).unwrap();
        let input = second["input"].as_array().unwrap();
        let n = input.len();
        assert_eq!(
            input[n - 3]["encrypted_content"],
            "gAAAAr",
            "reasoning goes back"
        );
        assert_eq!(input[n - 2]["name"], "context_recall");
        assert_eq!(input[n - 1]["type"], "function_call_output");
        assert!(
            input[n - 1]["output"].as_str().unwrap().contains("# t0"),
            "{}",
            input[n - 1]
        );
        assert!(
            state
                .metrics()
                .encode()
                .contains("ctx_engine_tool_rounds_total 1")
        );
    }
}

/// A front request without an identity (no key of its own) is managed but
/// offered no engine tool: the model's call to one reaches the client
/// unresolved, streamed or not. With a key, the same request is offered
/// them (the positive control).
#[tokio::test]
async fn anonymous_front_requests_are_offered_no_engine_tools() {
    for stream in [false, true] {
        for route in ["/v1/messages", "/v1/responses"] {
            let anthropic = route == "/v1/messages";
            let (up, addr, _) = if anthropic {
                proxy_to_recalling(route, recalling).await
            } else {
                proxy_to_recalling(route, recalling_responses).await
            };
            let mut body: Value = if anthropic {
                let mut b: Value = serde_json::from_str(&claude_request(2, stream)).unwrap();
                b["tools"] = json!([{"name": "Bash", "input_schema": {"type": "object"}}]);
                b
            } else {
                let mut b: Value = serde_json::from_str(&codex_request(2, "")).unwrap();
                b["tools"] = json!([{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]);
                b
            };
            body["stream"] = json!(stream);
            for (credential, offered) in [(None, false), (Some("Bearer sk-own"), true)] {
                up.seen.lock().unwrap().clear();
                let mut req = reqwest::Client::new()
                    .post(format!("http://{addr}{route}"))
                    .header("content-type", "application/json")
                    .header("session-id", "anon")
                    .body(body.to_string());
                if let Some(c) = credential {
                    req = req.header("authorization", c);
                }
                let resp = req.send().await.unwrap();
                assert_eq!(resp.status(), 200);
                let text = resp.text().await.unwrap();
                let seen = up.seen.lock().unwrap().clone();
                let sent: Value = serde_json::from_slice(&seen[0].body).unwrap();
                assert_eq!(
                    sent["tools"].to_string().contains("context_recall"),
                    offered,
                    "{route} stream {stream} credential {credential:?}"
                );
                if !offered {
                    assert_eq!(seen.len(), 1, "the model's call was not resolved");
                    assert!(text.contains("context_recall"), "the client got the call");
                } else {
                    assert_eq!(seen.len(), 2, "the engine's call was resolved");
                }
            }
        }
    }
}
