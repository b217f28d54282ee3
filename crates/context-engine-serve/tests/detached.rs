#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A client that hangs up never cancels an upstream call: the managed
//! pipeline runs as a task of its own, so a non-streamed call and an
//! engine-tool round run to their end after the client disconnects, and
//! their usage reaches `/metrics` and the session's stats. A request that
//! finds its session held by such a call waits at most
//! `session_wait`, then goes upstream unmanaged, logged and counted.
//!
//! The upstream holds its answer until the test releases it (a signal,
//! not a sleep): the client is gone before the answer exists.

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{
    Reply, Script, completion, compressor_context, counter, long_history, metric, options,
    start_proxy, start_upstream,
};

/// An upstream reply that says it has arrived, then waits for `release`.
struct Held {
    arrived: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
}

fn held(answer: Value) -> (Reply, Held) {
    let (arrived_tx, arrived) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let arrived_tx = Mutex::new(arrived_tx);
    let reply = Reply::With(Arc::new(move |_req: &Value| {
        let _ = arrived_tx.lock().unwrap().send(());
        let _ = release_rx
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(30));
        answer.clone()
    }));
    (reply, Held { arrived, release })
}

impl Held {
    /// Waits (on the blocking pool) until the upstream has the request.
    async fn wait_arrival(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.arrived.try_recv().is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "the upstream never got the call");
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Sends a non-streamed chat request in a task the test aborts (the
/// client hangs up).
fn send(addr: std::net::SocketAddr, body: Value, session: &str) -> tokio::task::JoinHandle<()> {
    let session = session.to_owned();
    tokio::spawn(async move {
        let _ = common::client()
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-ctx-session", session)
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await;
    })
}

/// Polls `/metrics` until `name` reaches `want` (bounded, short steps).
async fn metric_reaches(addr: std::net::SocketAddr, name: &str, want: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = common::metrics_text(addr).await;
        if metric(&text, name) >= want {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached {want}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn stats(addr: std::net::SocketAddr, id: &str) -> Value {
    let r = common::client()
        .get(format!("http://{addr}/ctx/sessions/{id}"))
        .send()
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    v["stats"].clone()
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streamed_call_whose_client_left_runs_to_its_end_and_is_accounted() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(options(&url), compressor_context(counter(), 128_000)).await;
    let (reply, hold) = held(completion(
        json!({"role": "assistant", "content": "late"}),
        1234,
        56,
    ));
    script.push(reply);
    let client = send(
        addr,
        json!({"model": "m", "messages": [user("hi")]}),
        "gone",
    );
    hold.wait_arrival().await;
    client.abort();
    let _ = client.await;
    hold.release.send(()).unwrap();
    let text = metric_reaches(addr, "ctx_prompt_tokens_total", 1234).await;
    assert_eq!(metric(&text, "ctx_completion_tokens_total"), 56, "{text}");
    // The session settled too: its lock is free and its stats carry the
    // usage.
    let s = stats(addr, "gone").await;
    assert_eq!(s["prompt_tokens"], 1234, "{s}");
    assert_eq!(s["completion_tokens"], 56, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_tool_round_whose_client_left_runs_to_its_end_and_is_accounted() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(
        options(&url).with_engine_tools(true),
        compressor_context(counter(), 128_000),
    )
    .await;
    // Round 1: only an engine call, resolved in the proxy; round 2 (held
    // until the client has gone): the answer.
    let call = json!({"id": "r1", "type": "function", "function": {"name": "context_recall", "arguments": "{\"handle\":\"call_0\"}"}});
    let mut first = completion(
        json!({"role": "assistant", "content": null, "tool_calls": [call]}),
        100,
        7,
    );
    first["choices"][0]["finish_reason"] = json!("tool_calls");
    script.push(Reply::Json(first));
    let (reply, hold) = held(completion(
        json!({"role": "assistant", "content": "done"}),
        200,
        9,
    ));
    script.push(reply);
    let tools = json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]);
    let mut messages = long_history(1);
    messages.push(user("what did file0 say?"));
    let client = send(
        addr,
        json!({"model": "m", "messages": messages, "tools": tools}),
        "rounds",
    );
    hold.wait_arrival().await;
    client.abort();
    let _ = client.await;
    hold.release.send(()).unwrap();
    let text = metric_reaches(addr, "ctx_completion_tokens_total", 16).await;
    assert_eq!(metric(&text, "ctx_prompt_tokens_total"), 300, "{text}");
    assert_eq!(script.received().len(), 2, "both rounds went upstream");
    let s = stats(addr, "rounds").await;
    assert_eq!(s["completion_tokens"], 16, "both rounds' usage: {s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_behind_a_held_session_waits_a_bounded_time_then_goes_unmanaged() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(
        options(&url).with_session_wait(Duration::from_millis(50)),
        compressor_context(counter(), 128_000),
    )
    .await;
    let (reply, hold) = held(completion(
        json!({"role": "assistant", "content": "slow"}),
        10,
        1,
    ));
    script.push(reply);
    let first = send(
        addr,
        json!({"model": "m", "messages": [user("hi")]}),
        "busy",
    );
    hold.wait_arrival().await;
    // The same session again while the first call holds it: answered by
    // the upstream (its default reply) without waiting for the first.
    let resent = json!({"model": "m", "messages": [user("hi"), {"role": "assistant", "content": "?"}, user("again")]});
    let r = common::client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-ctx-session", "busy")
        .body(serde_json::to_vec(&resent).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(got["choices"][0]["message"]["content"], "ok");
    // It went as the client sent it, and was said and counted.
    assert!(
        script.received().iter().any(|r| {
            let sent: Value = serde_json::from_slice(&r.body).unwrap();
            sent["messages"] == resent["messages"]
        }),
        "the resent request went upstream as the client sent it"
    );
    let text = common::metrics_text(addr).await;
    assert!(
        text.contains(
            r#"ctx_unmanaged_total{route="/v1/chat/completions",reason="session_busy"} 1"#
        ),
        "{text}"
    );
    hold.release.send(()).unwrap();
    first.await.unwrap();
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let c = json!({"id": "s", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_engine_tool_round_whose_client_left_bills_every_round() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(
        options(&url).with_engine_tools(true),
        compressor_context(counter(), 128_000),
    )
    .await;
    // Round 1, streamed: only an engine call (its usage 100 / 7); round 2,
    // held until the client has gone: the answer (200 / 9).
    let call = json!({"tool_calls": [{"index": 0, "id": "r1", "type": "function", "function": {"name": "context_recall", "arguments": "{\"handle\":\"call_0\"}"}}]});
    script.push(Reply::Sse(format!(
        "{}{}data: {{\"id\":\"s\",\"choices\":[],\"usage\":{{\"prompt_tokens\":100,\"completion_tokens\":7,\"total_tokens\":107}}}}\n\ndata: [DONE]\n\n",
        chunk(call, None),
        chunk(json!({}), Some("tool_calls")),
    )));
    let (reply, hold) = held(completion(
        json!({"role": "assistant", "content": "done"}),
        200,
        9,
    ));
    script.push(reply);
    let tools = json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]);
    let mut messages = long_history(1);
    messages.push(user("what did file0 say?"));
    let client = send(
        addr,
        json!({"model": "m", "stream": true, "messages": messages, "tools": tools}),
        "streamed",
    );
    hold.wait_arrival().await;
    client.abort();
    let _ = client.await;
    hold.release.send(()).unwrap();
    let text = metric_reaches(addr, "ctx_completion_tokens_total", 16).await;
    assert_eq!(metric(&text, "ctx_prompt_tokens_total"), 300, "{text}");
    let s = stats(addr, "streamed").await;
    assert_eq!(s["completion_tokens"], 16, "both rounds' usage: {s}");
}
