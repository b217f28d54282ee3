#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The proxy's behaviour against a scripted upstream: streams, usage,
//! pass-through, auth, divergence, fail-open, engine tools.

mod common;

use std::sync::Arc;

use context_engine::engine::{
    CompressRequest, ContextEngine, EngineError, EngineState, SelectRequest, Usage,
};
use context_engine::host::HostOptions;
use context_engine::message::Message;
use context_engine_serve::{SessionContext, StartError};
use serde_json::{Value, json};

use common::{
    Reply, Script, completion, compressor_context, counter, long_history, options, start_proxy,
    start_upstream,
};

async fn post(
    addr: std::net::SocketAddr,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = common::client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

async fn json_of(resp: reqwest::Response) -> Value {
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

#[tokio::test]
async fn stream_relays_to_done_and_strips_the_usage_chunk_it_added() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, state) = start_proxy(options(&url), compressor_context(counter(), 128_000)).await;
    let reply = completion(
        json!({"role": "assistant", "content": "hello there world"}),
        21,
        3,
    );
    script.push(Reply::Json(reply.clone()));
    let body = json!({"model": "m", "stream": true, "messages": [user("hi")]});
    let resp = post(addr, &body, &[("x-ctx-session", "s")]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    // The upstream was asked for usage; the client did not ask, so the
    // usage-only chunk is gone and everything else is byte for byte.
    let sent = script.last_body();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let upstream_text =
        String::from_utf8(script.received().last().unwrap().reply.to_vec()).unwrap();
    let usage_event = upstream_text
        .split_inclusive("\n\n")
        .find(|e| e.contains("\"choices\":[]"))
        .unwrap();
    assert_eq!(text, upstream_text.replace(usage_event, ""));
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert!(text.contains("hello ") && !text.contains("prompt_tokens"));
    // The usage reached the engine and the metrics.
    let status = common::client()
        .get(format!("http://{addr}/ctx/sessions/s"))
        .send()
        .await
        .unwrap();
    let status = json_of(status).await;
    assert_eq!(status["stats"]["prompt_tokens"], 21);
    assert_eq!(status["status"]["last_prompt_tokens"], 21);
    assert!(
        state
            .metrics()
            .encode()
            .contains("ctx_prompt_tokens_total 21")
    );

    // A client that asked for usage gets the chunk, untouched.
    script.push(Reply::Json(reply));
    let body = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
                      "messages": [user("hi"), {"role": "assistant", "content": "hello there world"}, user("again")]});
    let text = post(addr, &body, &[("x-ctx-session", "s")])
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(
        text,
        String::from_utf8(script.received().last().unwrap().reply.to_vec()).unwrap()
    );
    assert!(text.contains("\"prompt_tokens\":21"));
}

#[tokio::test]
async fn a_stream_settles_its_usage_by_done_even_if_the_upstream_holds_the_connection() {
    use futures_util::StreamExt;
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _state) = start_proxy(options(&url), compressor_context(counter(), 128_000)).await;
    script.push(Reply::StreamThenHold(completion(
        json!({"role": "assistant", "content": "one two three"}),
        17,
        3,
    )));
    let body = json!({"model": "m", "stream": true, "messages": [user("count")]});
    let resp = post(addr, &body, &[("x-ctx-session", "held")]).await;
    // Read as an SDK does: up to `[DONE]`, then stop (the upstream never
    // closes, so waiting for the end of the body would hang).
    let mut chunks = resp.bytes_stream();
    let mut text = String::new();
    while !text.contains("data: [DONE]") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), chunks.next())
            .await
            .expect("the stream reaches [DONE]")
            .expect("the stream is not over before [DONE]")
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(
        !text.contains("prompt_tokens"),
        "the added usage chunk is stripped"
    );
    // The session reflects the call as soon as the client has seen [DONE].
    let status = json_of(
        common::client()
            .get(format!("http://{addr}/ctx/sessions/held"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status["stats"]["prompt_tokens"], 17);
    assert_eq!(status["stats"]["completion_tokens"], 3);
}

#[tokio::test]
async fn upstream_errors_pass_back_with_status_and_body() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(options(&url), compressor_context(counter(), 128_000)).await;
    let err = r#"{"error":{"message":"rate limited","type":"rate_limit"}}"#;
    script.push(Reply::Raw(429, err.into()));
    let resp = post(addr, &json!({"model": "m", "messages": [user("hi")]}), &[]).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.text().await.unwrap(), err);
    script.push(Reply::Raw(400, err.into()));
    let resp = post(
        addr,
        &json!({"model": "m", "stream": true, "messages": [user("hi")]}),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.text().await.unwrap(), err);
    // An unreachable upstream is a 502 in OpenAI's error shape.
    let (dead, _) = start_proxy(
        options("http://127.0.0.1:9/v1"),
        compressor_context(counter(), 128_000),
    )
    .await;
    let resp = post(dead, &json!({"model": "m", "messages": [user("hi")]}), &[]).await;
    assert_eq!(resp.status(), 502);
    assert!(
        json_of(resp).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("upstream")
    );
}

#[tokio::test]
async fn other_paths_pass_through_and_headers_are_filtered() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(options(&url), compressor_context(counter(), 128_000)).await;
    let models = common::client()
        .get(format!("http://{addr}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    assert_eq!(json_of(models).await["data"][0]["id"], "scripted");
    let missing = common::client()
        .get(format!("http://{addr}/v1/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404, "the upstream's own status");

    let body = json!({"model": "m", "messages": [user("hi")], "vendor_field": {"keep": [1, 2]}});
    post(
        addr,
        &body,
        &[
            ("authorization", "Bearer sk-client"),
            ("x-ctx-session", "a"),
            ("x-ctx-other", "b"),
        ],
    )
    .await;
    let r = script.received();
    let last = r.last().unwrap();
    assert_eq!(last.headers["authorization"], "Bearer sk-client");
    assert!(
        last.headers
            .keys()
            .all(|k| !k.as_str().starts_with("x-ctx-"))
    );
    assert_eq!(script.last_body()["vendor_field"], json!({"keep": [1, 2]}));

    let healthz = common::client()
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(healthz.status(), 200);
    let metrics = common::metrics_text(addr).await;
    assert!(
        metrics.contains("ctx_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1")
    );
    assert!(metrics.contains("ctx_overhead_seconds_bucket"));
}

#[tokio::test]
async fn off_loopback_needs_a_token_compared_in_full() {
    let ctx = || compressor_context(counter(), 128_000);
    let open = options("http://127.0.0.1:9/v1").with_listen("0.0.0.0:0".parse().unwrap());
    assert!(matches!(
        context_engine_serve::AppState::new(open.clone(), ctx()),
        Err(StartError::NeedsToken { .. })
    ));
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(
        options(&url).with_auth_token(Some("s3cret-token".into())),
        ctx(),
    )
    .await;
    let body = json!({"model": "m", "messages": [user("hi")]});
    assert_eq!(post(addr, &body, &[]).await.status(), 401);
    assert_eq!(
        post(addr, &body, &[("authorization", "Bearer s3cret-toke")])
            .await
            .status(),
        401
    );
    assert_eq!(
        post(addr, &body, &[("authorization", "Bearer s3cret-token!")])
            .await
            .status(),
        401
    );
    let denied = post(addr, &body, &[("x-ctx-token", "wrong")]).await;
    assert_eq!(json_of(denied).await["error"]["code"], "invalid_api_key");
    assert_eq!(script.received().len(), 0, "nothing reached the upstream");
    // The token in Authorization is the proxy's: not forwarded.
    assert_eq!(
        post(addr, &body, &[("authorization", "Bearer s3cret-token")])
            .await
            .status(),
        200
    );
    assert!(
        script
            .received()
            .last()
            .unwrap()
            .headers
            .get("authorization")
            .is_none()
    );
    // In x-ctx-token, the client's own Authorization still goes upstream.
    let ok = post(
        addr,
        &body,
        &[
            ("x-ctx-token", "s3cret-token"),
            ("authorization", "Bearer sk-up"),
        ],
    )
    .await;
    assert_eq!(ok.status(), 200);
    assert_eq!(
        script.received().last().unwrap().headers["authorization"],
        "Bearer sk-up"
    );
    // Liveness needs no token; metrics do.
    assert_eq!(
        common::client()
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        common::client()
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
}

#[tokio::test]
async fn divergence_starts_a_new_lineage_and_never_mixes() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let counter = counter();
    let (addr, _) = start_proxy(
        options(&url),
        compressor_context(Arc::clone(&counter), 8_000),
    )
    .await;
    let history = long_history(40);
    let big = |req: &Value| req["messages"].as_array().unwrap().len() as u64 * 150;
    let mut compacted_at = None;
    // Grow the conversation call by call until the proxy compacts.
    for n in (3..=history.len()).step_by(2) {
        let f = Arc::new(big);
        script.push(Reply::With(Arc::new(move |req: &Value| {
            completion(json!({"role": "assistant", "content": "ok"}), f(req), 1)
        })));
        post(
            addr,
            &json!({"model": "m", "messages": &history[..n]}),
            &[("x-ctx-session", "d")],
        )
        .await;
        let sent = script.last_body();
        if sent["messages"].as_array().unwrap().len() < n {
            compacted_at = Some(n);
            break;
        }
    }
    let status = json_of(
        common::client()
            .get(format!("http://{addr}/ctx/sessions/d"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let n = compacted_at.unwrap_or_else(|| panic!("the small window compacts: {status}"));
    let managed = script.last_body()["messages"].clone();
    // The client continues: the compacted prefix is sent again, unchanged.
    let mut next: Vec<Value> = history[..n].to_vec();
    next.push(json!({"role": "assistant", "content": "ok"}));
    next.push(user("and now the tests"));
    post(
        addr,
        &json!({"model": "m", "messages": &next}),
        &[("x-ctx-session", "d")],
    )
    .await;
    let sent = script.last_body()["messages"].as_array().unwrap().clone();
    let managed = managed.as_array().unwrap();
    assert_eq!(&sent[..managed.len()], &managed[..], "frozen prefix");

    // The client branches from message 2 (inside the compacted span): the
    // proxy must send that branch, with nothing of the old summary.
    let mut branch: Vec<Value> = history[..2].to_vec();
    branch.push(user("actually, start over with the lexer"));
    post(
        addr,
        &json!({"model": "m", "messages": &branch}),
        &[("x-ctx-session", "d")],
    )
    .await;
    assert_eq!(
        script.last_body()["messages"],
        json!(branch),
        "the branch alone, unmanaged-equal"
    );
    let status = json_of(
        common::client()
            .get(format!("http://{addr}/ctx/sessions/d"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status["stats"]["new_lineages"], 1);
}

/// An engine that panics when asked to select context.
struct Panicky(EngineState);

impl ContextEngine for Panicky {
    fn name(&self) -> &str {
        "panicky"
    }
    fn state(&self) -> &EngineState {
        &self.0
    }
    fn state_mut(&mut self) -> &mut EngineState {
        &mut self.0
    }
    fn update_from_response(&mut self, _: &Usage) {}
    fn should_compress(&self, _: Option<u64>) -> bool {
        false
    }
    fn compress(
        &mut self,
        _: &[Message],
        _: &CompressRequest,
    ) -> Result<context_engine::engine::Compaction, EngineError> {
        panic!("never asked: should_compress is false")
    }
    fn select_context(&mut self, _: &SelectRequest<'_>) -> Option<Vec<Message>> {
        panic!("engine bug")
    }
}

/// A request even the system prompt and the latest ask of which exceed
/// the window: the proxy sends the managed request (it drops no call) and
/// says so; the log never claims it was not sent.
#[tokio::test]
async fn a_request_that_cannot_fit_the_window_is_sent_and_the_log_says_so() {
    use context_engine_serve::session::Managed;
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let messages = json!([
        {"role": "system", "content": "rules ".repeat(3000)},
        user("Fix the failing test."),
    ]);
    let (addr, state) = start_proxy(options(&url), compressor_context(counter(), 1000)).await;
    let resp = post(addr, &json!({"model": "m", "messages": messages}), &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(script.received().len(), 1, "the request went upstream");
    assert_eq!(
        script.last_body()["messages"],
        messages,
        "as managed (nothing to fit it with)"
    );
    assert!(!state.metrics().encode().contains("ctx_fallbacks_total 1"));
    // What the proxy logs of it.
    let mut m = Managed::new(Arc::new(compressor_context(counter(), 1000)), "s").unwrap();
    let raw: Vec<Box<serde_json::value::RawValue>> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|v| serde_json::value::RawValue::from_string(v.to_string()).unwrap())
        .collect();
    let refs: Vec<&serde_json::value::RawValue> = raw.iter().map(AsRef::as_ref).collect();
    let plan = m.prepare(&refs).unwrap();
    let logged: Vec<&str> = plan.notices.iter().map(|n| n.text.as_str()).collect();
    assert!(
        logged.iter().all(|n| !n.contains("not sending")),
        "{logged:?}"
    );
    assert!(
        logged
            .iter()
            .any(|n| n.contains("sent over the window") && n.contains("> window 1,000")),
        "{logged:?}"
    );
}

#[tokio::test]
async fn engine_failures_fail_open() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let c = counter();
    let factory = |_: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
        Ok(Box::new(Panicky(EngineState::default())))
    };
    // `blocking`: the engine step runs on the blocking pool, and a panic
    // there fails open just the same.
    let ctx = SessionContext {
        factory: Arc::new(factory),
        counter: Arc::clone(&c),
        host: HostOptions::default(),
        blocking: true,
    };
    let (addr, state) = start_proxy(options(&url), ctx).await;
    let raw = r#"{"model":"m","messages":[ {"role": "user", "content": "hi"} ],"x":1}"#;
    let resp = common::client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        script.received().last().unwrap().body,
        raw.as_bytes(),
        "the client's request, unchanged"
    );
    assert!(state.metrics().encode().contains("ctx_fallbacks_total 1"));

    // No engine at all (the factory fails): the same.
    let factory = |_: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
        Err("plugin missing".into())
    };
    let ctx = SessionContext {
        factory: Arc::new(factory),
        counter: c,
        host: HostOptions::default(),
        blocking: false,
    };
    let (addr, _) = start_proxy(options(&url), ctx).await;
    let resp = post(addr, &json!({"model": "m", "messages": [user("hi")]}), &[]).await;
    assert_eq!(resp.status(), 200);
    // A body that is not a chat request goes upstream as it came.
    let resp = common::client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the scripted upstream answers anything");
    assert_eq!(
        script.received().last().unwrap().body,
        "not json".as_bytes()
    );
}

#[tokio::test]
async fn engine_tools_are_resolved_in_the_proxy() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, state) = start_proxy(
        options(&url).with_engine_tools(true),
        compressor_context(counter(), 128_000),
    )
    .await;
    let call = |id: &str, name: &str, args: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
    let tool_reply = |calls: Vec<Value>| {
        let mut r = completion(
            json!({"role": "assistant", "content": null, "tool_calls": calls}),
            10,
            2,
        );
        r["choices"][0]["finish_reason"] = json!("tool_calls");
        r
    };
    // Round 1: text and only an engine call, resolved here; round 2: the
    // answer.
    let mut first_round = tool_reply(vec![call(
        "r1",
        "context_recall",
        "{\"handle\":\"call_0\"}",
    )]);
    first_round["choices"][0]["message"]["content"] = json!("Let me check. ");
    script.push(Reply::Json(first_round));
    script.push(Reply::Json(completion(
        json!({"role": "assistant", "content": "done"}),
        12,
        1,
    )));
    let client_tools = json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]);
    let mut messages = long_history(1);
    messages.push(user("what did file0 say?"));
    let body = json!({"model": "m", "messages": messages, "tools": client_tools});
    let answer = json_of(post(addr, &body, &[("x-ctx-session", "t")]).await).await;
    // As a stream shows it: the first round's text, then the answer's.
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "Let me check. done"
    );
    assert!(answer["choices"][0]["message"].get("tool_calls").is_none());
    let received = script.received();
    let first: Value = serde_json::from_slice(&received[received.len() - 2].body).unwrap();
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "bash",
            "context_recall",
            "context_status",
            "context_compact"
        ],
        "the client's tools first, then the engine's"
    );
    let second = script.last_body();
    let msgs = second["messages"].as_array().unwrap();
    assert_eq!(msgs[msgs.len() - 1]["role"], "tool");
    assert_eq!(msgs[msgs.len() - 1]["tool_call_id"], "r1");
    assert!(
        state
            .metrics()
            .encode()
            .contains("ctx_engine_tool_rounds_total 1")
    );

    // Mixed: the client gets its own call only.
    script.push(Reply::Json(tool_reply(vec![
        call("r2", "context_recall", "{}"),
        call("b1", "bash", "{\"cmd\":\"ls\"}"),
    ])));
    let answer = json_of(post(addr, &body, &[("x-ctx-session", "t2")]).await).await;
    let calls = answer["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "bash");
}

/// One streamed chunk of choice 0 with `delta` (and a finish reason).
fn chunk(delta: Value, finish: Option<&str>) -> String {
    let c = json!({"id": "s", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

fn call_delta(index: u64, id: Option<&str>, name: Option<&str>, args: &str) -> Value {
    let mut f = json!({"arguments": args});
    if let Some(n) = name {
        f["name"] = json!(n);
    }
    let mut c = json!({"index": index, "function": f});
    if let Some(id) = id {
        c["id"] = json!(id);
        c["type"] = json!("function");
    }
    json!({"tool_calls": [c]})
}

const USAGE_DONE: &str = "data: {\"id\":\"s\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":3,\"total_tokens\":23}}\n\ndata: [DONE]\n\n";

/// Posts a streamed request in session `id`; the whole stream's text.
async fn stream_text(addr: std::net::SocketAddr, body: &Value, id: &str) -> String {
    post(addr, body, &[("x-ctx-session", id)])
        .await
        .text()
        .await
        .unwrap()
}

/// The client's view of a stream: its text, its tool calls' (index, name)
/// and finish reasons.
fn read_stream(text: &str) -> (String, Vec<(u64, String)>, Vec<String>) {
    let (mut content, mut calls, mut finish) = (String::new(), Vec::new(), Vec::new());
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        let Some(choice) = v["choices"].get(0) else {
            continue;
        };
        if let Some(t) = choice["delta"]["content"].as_str() {
            content.push_str(t);
        }
        for c in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(n) = c["function"]["name"].as_str() {
                calls.push((c["index"].as_u64().unwrap(), n.to_owned()));
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish.push(f.to_owned());
        }
    }
    (content, calls, finish)
}

#[tokio::test]
async fn engine_tools_in_streams_are_held_from_the_call_and_resolved() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, state) = start_proxy(
        options(&url).with_engine_tools(true),
        compressor_context(counter(), 128_000),
    )
    .await;
    let client_tools = json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]);
    let mut messages = long_history(1);
    messages.push(user("what did file0 say?"));
    let body = json!({"model": "m", "stream": true, "messages": messages, "tools": client_tools});

    // Text, then an engine call (name and arguments in separate deltas):
    // resolved in the proxy, the continuation relayed in the same stream.
    script.push(Reply::Sse(format!(
        "{}{}{}{}{USAGE_DONE}",
        chunk(
            json!({"role": "assistant", "content": "Let me check. "}),
            None
        ),
        chunk(call_delta(0, Some("r1"), Some("context_recall"), ""), None),
        chunk(call_delta(0, None, None, "{\"handle\":\"call_0\"}"), None),
        chunk(json!({}), Some("tool_calls")),
    )));
    script.push(Reply::Sse(format!(
        "{}{}{USAGE_DONE}",
        chunk(
            json!({"role": "assistant", "content": "file0 has eight lines."}),
            None
        ),
        chunk(json!({}), Some("stop")),
    )));
    let text = stream_text(addr, &body, "st1").await;
    let (content, calls, finish) = read_stream(&text);
    assert_eq!(content, "Let me check. file0 has eight lines.");
    assert!(calls.is_empty(), "the client never sees an engine call");
    assert_eq!(finish, ["stop"]);
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert_eq!(text.matches("[DONE]").count(), 1);
    let received = script.received();
    let first: Value = serde_json::from_slice(&received[received.len() - 2].body).unwrap();
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        offered,
        [
            "bash",
            "context_recall",
            "context_status",
            "context_compact"
        ]
    );
    let second = script.last_body();
    assert_eq!(second["stream"], true);
    let msgs = second["messages"].as_array().unwrap();
    let n = msgs.len();
    assert_eq!(msgs[n - 2]["role"], "assistant");
    assert_eq!(msgs[n - 2]["content"], "Let me check. ");
    assert_eq!(
        msgs[n - 2]["tool_calls"][0]["function"]["name"],
        "context_recall"
    );
    assert_eq!(
        msgs[n - 2]["tool_calls"][0]["function"]["arguments"],
        "{\"handle\":\"call_0\"}"
    );
    assert_eq!(msgs[n - 1]["role"], "tool");
    assert_eq!(msgs[n - 1]["tool_call_id"], "r1");
    assert!(
        msgs[n - 1]["content"]
            .as_str()
            .unwrap()
            .contains("line 0 of file 0")
    );
    assert!(
        state
            .metrics()
            .encode()
            .contains("ctx_engine_tool_rounds_total 1")
    );

    // Mixed, the engine call first: the client gets its own call only,
    // renumbered from 0, and the stream is not re-sent.
    let before = script.received().len();
    script.push(Reply::Sse(format!(
        "{}{}{}{}{USAGE_DONE}",
        chunk(json!({"role": "assistant", "content": null}), None),
        chunk(
            call_delta(0, Some("r2"), Some("context_recall"), "{}"),
            None
        ),
        chunk(
            call_delta(1, Some("b1"), Some("bash"), "{\"cmd\":\"ls\"}"),
            None
        ),
        chunk(json!({}), Some("tool_calls")),
    )));
    let text = stream_text(addr, &body, "st2").await;
    let (_, calls, finish) = read_stream(&text);
    assert_eq!(calls, [(0, "bash".to_owned())]);
    assert_eq!(finish, ["tool_calls"]);
    assert!(!text.contains("context_recall"));
    assert_eq!(script.received().len(), before + 1);

    // Mixed, the client's call first: it passed through before the engine
    // call was seen; the engine call is still removed.
    script.push(Reply::Sse(format!(
        "{}{}{}{USAGE_DONE}",
        chunk(call_delta(0, Some("b2"), Some("bash"), "{}"), None),
        chunk(
            call_delta(1, Some("r3"), Some("context_recall"), "{}"),
            None
        ),
        chunk(json!({}), Some("tool_calls")),
    )));
    let text = stream_text(addr, &body, "st3").await;
    let (_, calls, finish) = read_stream(&text);
    assert_eq!(calls, [(0, "bash".to_owned())]);
    assert_eq!(finish, ["tool_calls"]);
    assert!(!text.contains("context_recall"));

    // Engine calls on every round: after `max_tool_rounds` (3) the last
    // answer goes out without them, ending as `stop`.
    for _ in 0..4 {
        script.push(Reply::Sse(format!(
            "{}{}{USAGE_DONE}",
            chunk(
                call_delta(0, Some("rx"), Some("context_recall"), "{}"),
                None
            ),
            chunk(json!({}), Some("tool_calls")),
        )));
    }
    let before = script.received().len();
    let text = stream_text(addr, &body, "st4").await;
    let (_, calls, finish) = read_stream(&text);
    assert!(calls.is_empty());
    assert_eq!(finish, ["stop"]);
    assert_eq!(script.received().len(), before + 4);
    assert_eq!(
        script.last_body()["tools"],
        client_tools,
        "the last round offers the client's only"
    );
}

#[tokio::test]
async fn each_request_gets_the_window_of_the_model_it_names() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let mut ctx = compressor_context(counter(), 8_000);
    ctx.host = HostOptions::default()
        .with_model_windows([("big-model".to_owned(), 1_000_000)].into_iter().collect());
    let (addr, _) = start_proxy(options(&url), ctx).await;
    let window = |v: Value| v["status"]["context_length"].as_u64().unwrap();
    let status = || async {
        json_of(
            common::client()
                .get(format!("http://{addr}/ctx/sessions/w"))
                .send()
                .await
                .unwrap(),
        )
        .await
    };
    let mut messages = vec![user("hi")];
    post(
        addr,
        &json!({"model": "big-model-2", "messages": messages}),
        &[("x-ctx-session", "w")],
    )
    .await;
    assert_eq!(window(status().await), 1_000_000);
    messages.push(json!({"role": "assistant", "content": "ok"}));
    messages.push(user("again"));
    post(
        addr,
        &json!({"model": "m", "messages": messages}),
        &[("x-ctx-session", "w")],
    )
    .await;
    assert_eq!(
        window(status().await),
        8_000,
        "an unknown model: --context-length"
    );
}
