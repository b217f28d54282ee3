#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Observe mode: every request goes upstream exactly as the client sent it
//! and every reply comes back untouched, streamed or not, while the engine
//! runs beside the traffic on the same sessions; `/ctx/sessions/{id}` and
//! `/metrics` show what it would have sent. A body the engine cannot read
//! still goes out as it came, counted. A session observed with a store
//! continues managed once the proxy runs managed.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use context_engine::message::Message;
use context_engine::store::SessionStore;
use context_engine_serve::ServeMode;
use context_engine_sqlite::SqliteStore;
use serde_json::{Value, json};

use common::{
    Reply, Script, completion, compressor_context, counter, long_history, metric, options,
    start_proxy, start_upstream,
};

const WINDOW: u64 = 2_500;

async fn post(addr: std::net::SocketAddr, path: &str, body: Vec<u8>, session: &str) -> Vec<u8> {
    let r = common::client()
        .post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .header("x-ctx-session", session)
        .body(body)
        .send()
        .await
        .unwrap();
    r.bytes().await.unwrap().to_vec()
}

async fn metrics(addr: std::net::SocketAddr) -> String {
    common::metrics_text(addr).await
}

/// Waits (bounded, short polls) until `n` requests were observed.
async fn observed(addr: std::net::SocketAddr, n: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics(addr).await;
        let seen = metric(&text, "ctx_observed_requests_total")
            + metric(&text, "ctx_observe_errors_total");
        if seen >= n {
            return text;
        }
        assert!(Instant::now() < deadline, "observed {seen} of {n}: {text}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn status(addr: std::net::SocketAddr, id: &str) -> Value {
    let r = common::client()
        .get(format!("http://{addr}/ctx/sessions/{id}"))
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_chat_request_goes_up_byte_for_byte_and_the_session_shows_what_the_engine_would_have_sent()
 {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(
        options(&url)
            .with_mode(ServeMode::Observe)
            .with_engine_tools(true),
        compressor_context(counter(), WINDOW),
    )
    .await;
    let tools = json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]);
    let calls = 14;
    for k in 0..calls {
        let stream = k % 3 == 2;
        let mut messages = long_history(k + 1);
        messages.push(user("go on"));
        // Spacing the client's own way: the bytes, not the JSON, must match.
        let body = format!(
            "{{ \"model\":\"m\",  \"stream\": {stream}, \"messages\": {}, \"tools\": {tools} }}",
            serde_json::to_string(&messages).unwrap()
        );
        script.push(Reply::Json(completion(
            json!({"role": "assistant", "content": format!("answer {k}")}),
            400 + 150 * k as u64,
            5,
        )));
        let answer = post(addr, "/v1/chat/completions", body.clone().into_bytes(), "o").await;
        let received = script.received();
        let last = received.last().unwrap();
        assert_eq!(
            last.body,
            body.as_bytes(),
            "call {k}: the body as the client sent it"
        );
        assert_eq!(
            answer, last.reply,
            "call {k}: the reply as the upstream sent it"
        );
        assert!(
            !String::from_utf8_lossy(&last.body).contains("context_recall"),
            "no engine tool is offered"
        );
    }
    let text = observed(addr, calls as u64).await;
    assert_eq!(metric(&text, "ctx_observe_errors_total"), 0, "{text}");
    let client = metric(&text, "ctx_client_prompt_tokens_total");
    let would = metric(&text, "ctx_managed_prompt_tokens_total");
    assert!(
        would < client,
        "the engine would have sent less: {would} of {client}"
    );
    let s = status(addr, "o").await;
    assert_eq!(s["mode"], "observe");
    assert!(
        s["stats"]["compactions"].as_u64().unwrap() >= 1,
        "it would have compacted at a {WINDOW}-token window: {s}"
    );
    // The engine was fed the provider's count scaled to its own request.
    let billed: u64 = (0..calls as u64).map(|k| 400 + 150 * k).sum();
    assert!(
        s["stats"]["prompt_tokens"].as_u64().unwrap() < billed,
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_responses_go_up_byte_for_byte_and_are_observed() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(
        options(&url).with_mode(ServeMode::Observe),
        compressor_context(counter(), WINDOW),
    )
    .await;
    let turn = |i: usize| {
        let text: String = (0..10)
            .map(|j| format!("step {i}.{j}: the header case holds on input {j}. "))
            .collect();
        text
    };
    let mut n = 0;
    for (path, items, id) in [
        ("/v1/messages", "messages", "m"),
        ("/v1/responses", "input", "r"),
    ] {
        let mut history: Vec<Value> = Vec::new();
        for k in 0..16 {
            history.push(user(&turn(k)));
            let mut body = json!({"model": "m"});
            body[items] = json!(history);
            if path == "/v1/messages" {
                body["max_tokens"] = json!(64);
            }
            let bytes = serde_json::to_vec(&body).unwrap();
            post(addr, path, bytes.clone(), id).await;
            n += 1;
            assert_eq!(
                script.received().last().unwrap().body,
                bytes,
                "{path} call {k}"
            );
            history.push(json!({"role": "assistant", "content": format!("checked {k}")}));
        }
        let text = observed(addr, n).await;
        assert_eq!(metric(&text, "ctx_observe_errors_total"), 0, "{text}");
        let s = status(addr, id).await;
        assert!(
            s["stats"]["compactions"].as_u64().unwrap() >= 1,
            "{path}: it would have compacted: {s}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_engine_cannot_read_goes_up_as_it_came_and_is_counted() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(
        options(&url).with_mode(ServeMode::Observe),
        compressor_context(counter(), WINDOW),
    )
    .await;
    let body = br#"{"model": "m", "messages": "not a list"}"#.to_vec();
    post(addr, "/v1/chat/completions", body.clone(), "bad").await;
    assert_eq!(script.received().last().unwrap().body, body);
    let text = observed(addr, 1).await;
    assert!(
        text.contains(
            r#"ctx_observe_errors_total{route="/v1/chat/completions",reason="unreadable"} 1"#
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_observed_with_a_store_continues_managed() {
    let dir = std::env::temp_dir().join(format!("ctx-observe-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sessions.db");
    let store: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&path).unwrap());
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (observing, _) = start_proxy(
        options(&url)
            .with_mode(ServeMode::Observe)
            .with_store(Some(Arc::clone(&store))),
        compressor_context(counter(), WINDOW),
    )
    .await;
    let mut messages = long_history(1);
    let calls = 12;
    for k in 0..calls {
        messages.push(user(&format!("go on {k}")));
        let body = serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap();
        post(observing, "/v1/chat/completions", body.clone(), "kept").await;
        assert_eq!(script.received().last().unwrap().body, body);
        messages.push(json!({"role": "assistant", "content": format!("answer {k}")}));
        for m in long_history(2).into_iter().skip(2) {
            messages.push(m);
        }
    }
    observed(observing, calls).await;
    let s = status(observing, "kept").await;
    assert!(s["stats"]["compactions"].as_u64().unwrap() >= 1, "{s}");

    // The same store, managed: the session goes on from what was observed
    // (its summary in the request), not from the client's full history.
    let (managed, _) = start_proxy(
        options(&url).with_store(Some(Arc::clone(&store))),
        compressor_context(counter(), WINDOW),
    )
    .await;
    messages.push(user("and now?"));
    let body = serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap();
    post(managed, "/v1/chat/completions", body, "kept").await;
    let sent: Value = serde_json::from_slice(&script.received().last().unwrap().body).unwrap();
    let sent: Vec<Message> = serde_json::from_value(sent["messages"].clone()).unwrap();
    assert!(
        sent.len() < messages.len(),
        "managed now: {} of {}",
        sent.len(),
        messages.len()
    );
    assert!(
        sent.iter().any(context_engine::compressor::is_summary),
        "the observed compaction's summary carries on"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
