#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Postgres goes away and comes back: the proxy keeps serving (unmanaged,
//! `/healthz` 503 degraded with a reason naming no host, no password anywhere) and recovers
//! by itself. The database is reached through a TCP relay the test
//! controls, so "down" is the relay refusing and cutting connections.

mod common;
use context_engine_testkit::postgres as pg;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use context_engine_postgres::{PgOptions, PgStore};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use common::{
    Script, compressor_context, counter, eventually, metric, options, start_proxy, start_upstream,
};

/// Relays `addr` to the Postgres server while it runs.
async fn relay(addr: SocketAddr, to: SocketAddr) -> JoinSet<()> {
    let listener = TcpListener::bind(addr).await.unwrap();
    let mut set = JoinSet::new();
    set.spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                break;
            };
            conns.spawn(async move {
                if let Ok(mut out) = TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_fails_open_and_recovers() {
    let Some(db) = pg::TestDb::create() else {
        return;
    };
    let server: SocketAddr = "127.0.0.1:5432".parse().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let dbname = db.url.rsplit('/').next().unwrap().to_owned();
    let mut up = relay(addr, server).await;
    let url = format!("postgres://postgres@127.0.0.1:{port}/{dbname}");
    let opts = PgOptions::new(url)
        .with_password(Some("not-a-real-secret-9f8e7d".into()))
        .with_timeout(Duration::from_secs(2));
    let store = tokio::task::spawn_blocking(move || PgStore::connect(&opts))
        .await
        .unwrap()
        .unwrap();

    let script = Arc::new(Script::default());
    let upstream = start_upstream(Arc::clone(&script)).await;
    let (proxy, state) = start_proxy(
        options(&upstream).with_store(Some(Arc::new(store))),
        compressor_context(counter(), 128_000),
    )
    .await;
    let client = reqwest::Client::new();
    let send = |text: &'static str| {
        let client = client.clone();
        async move {
            let body = serde_json::json!({"model": "m", "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": text}
            ]});
            let r = client
                .post(format!("http://{proxy}/v1/chat/completions"))
                .header("x-ctx-session", "outage")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).unwrap())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "the proxy keeps answering");
        }
    };
    let healthz = || {
        let client = client.clone();
        async move {
            client
                .get(format!("http://{proxy}/healthz"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let fallbacks = || metric(&state.metrics().encode(), "ctx_fallbacks_total");

    send("first").await;
    assert_eq!(fallbacks(), 0);
    // Every store call is timed (version check and commits of the step
    // and of the usage; the usage is written just after the response).
    let timed = || metric(&state.metrics().encode(), "ctx_store_seconds_count");
    for _ in 0..200 {
        if timed() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(timed() >= 3, "{} store calls timed", timed());
    assert_eq!(healthz().await, "ok\n");

    // The database goes away: served unmanaged, health degraded.
    up.shutdown().await;
    send("second").await;
    assert_eq!(fallbacks(), 1, "the request went unmanaged");
    let health = healthz().await;
    assert!(
        health.starts_with("degraded: session store unavailable"),
        "{health}"
    );
    assert!(
        !health.contains("127.0.0.1"),
        "no host in the reason: {health}"
    );
    let status = client
        .get(format!("http://{proxy}/healthz"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 503, "degraded answers 503");
    assert!(!health.contains("not-a-real-secret"), "{health}");

    // It comes back: a health probe sees it, and requests are managed again.
    let _up = relay(addr, server).await;
    let recovered = eventually(Duration::from_secs(5), || async {
        (healthz().await == "ok\n").then_some(())
    })
    .await;
    assert!(
        recovered.is_some(),
        "healthz recovers by itself: {}",
        healthz().await
    );
    send("first").await; // the client re-sends its history, unchanged
    assert_eq!(fallbacks(), 1, "managed again");
    drop(db);
}
