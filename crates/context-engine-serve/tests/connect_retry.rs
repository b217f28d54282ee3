#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The upstream connect retry: a connection refused before any byte of
//! the request was sent is retried (bounded, with backoff) and the request
//! goes through once the upstream accepts; a connection that was
//! established and then reset, and an answer that never comes, are not
//! retried (the request may have reached the model): the upstream sees
//! each such request once.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::net::TcpListener;

use common::raw_upstream::{Raw, RawReply, serve};
use common::{compressor_context, counter, metric, options, start_proxy};

fn retries(state: &context_engine_serve::AppState) -> u64 {
    metric(
        &state.metrics().encode(),
        "ctx_upstream_connect_retries_total",
    )
}

async fn chat(addr: SocketAddr, stream: bool) -> (u16, String) {
    let body =
        json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

/// A loopback port nothing listens on (yet).
async fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test]
async fn a_refused_connection_is_retried_until_the_upstream_accepts() {
    let upstream = free_port().await;
    let mut opts = options(&format!("http://{upstream}/v1"));
    // Waits of 100–200 ms, 200–400 ms, 400–800 ms: room for the listener
    // to come up after the first refusal, even on a busy machine.
    opts.upstream.connect_backoff = Duration::from_millis(200);
    let (addr, state) = start_proxy(opts, compressor_context(counter(), 128_000)).await;

    let request = tokio::spawn(chat(addr, true));
    // The upstream comes up once a connection was refused.
    let started = Instant::now();
    while retries(&state) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no connection was refused"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let raw = Raw::new([]);
    serve(
        TcpListener::bind(upstream).await.unwrap(),
        std::sync::Arc::clone(&raw),
    );
    let (status, text) = request.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(
        raw.bodies().len(),
        1,
        "the request reached the upstream once"
    );
    assert!((1..=3).contains(&retries(&state)));
}

#[tokio::test]
async fn retries_are_bounded_and_can_be_turned_off() {
    let upstream = free_port().await;
    let mut opts = options(&format!("http://{upstream}/v1"));
    opts.upstream.connect_backoff = Duration::from_millis(1);
    let (addr, state) = start_proxy(opts.clone(), compressor_context(counter(), 128_000)).await;
    let (status, text) = chat(addr, false).await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("cannot connect"), "{text}");
    assert_eq!(retries(&state), 3);

    opts.upstream.connect_retries = 0;
    let (addr, state) = start_proxy(opts, compressor_context(counter(), 128_000)).await;
    assert_eq!(chat(addr, false).await.0, 502);
    assert_eq!(retries(&state), 0);
}

#[tokio::test]
async fn a_request_that_may_have_reached_the_model_is_never_retried() {
    // Accepted, read, then reset; accepted, read, then no answer.
    let raw = Raw::new([RawReply::Reset, RawReply::Reset, RawReply::Silent]);
    let url = common::raw_upstream::start(std::sync::Arc::clone(&raw)).await;
    let mut opts = options(&url);
    opts.upstream.connect_backoff = Duration::from_millis(1);
    opts.upstream.timeout = Duration::from_millis(300);
    let (addr, state) = start_proxy(opts, compressor_context(counter(), 128_000)).await;

    for (n, stream) in [(1, false), (2, true)] {
        let (status, text) = chat(addr, stream).await;
        assert_eq!(status, 502, "{text}");
        assert_eq!(raw.bodies().len(), n, "seen once");
        assert_eq!(raw.accepted(), n, "no second connection");
    }
    let (status, _) = chat(addr, false).await;
    assert_eq!(status, 504);
    assert_eq!(raw.bodies().len(), 3);
    assert_eq!(raw.accepted(), 3);
    assert_eq!(retries(&state), 0);
}
