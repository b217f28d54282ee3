#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The proxy's edge, end to end: the real `ctx serve` binary, a config
//! file in a temporary directory, and an upstream in the test that records
//! the path and `Authorization` of every request reaching it.
//!
//! - a provider key without client auth: the proxy refuses to start;
//! - a request without the access token, a web page's request (text/plain,
//!   foreign `Origin`, foreign `Host`, `Sec-Fetch-Site`) and a path leaving
//!   `/v1` (`..`, `%2e%2e`, `%2f`, backslashes): refused, never upstream;
//! - 100 stalled connections (headers or body never finished): closed
//!   within the configured timeouts while a normal request is served;
//! - six concurrent 60 MB bodies under the default in-flight cap: the
//!   proxy's peak RSS stays under 1 GiB and each request gets its answer
//!   or 503 with `Retry-After`;
//! - a session store that does not answer: `/healthz` 503, naming no host,
//!   port or credential.
//!
//! `CTX_EDGE_TEST_INFLIGHT=n` runs the memory test with another cap, to
//! measure it (the test's own assertion of a refusal then may not hold).

mod common;
use context_engine_testkit::raw;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use common::{TempDir, free_port};
use context_engine_testkit::eventually;
use context_engine_testkit::serve::{Ready, Serve, Spawn};
use raw::{Recorder, closed_within, raw, request, start_recorder};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const TOKEN: &str = "client-token-1234";
const KEY: &str = "sk-provider-5678";
/// Where the big bodies go.
const ROUTE: &str = "/v1/chat/completions";
const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// A `ctx serve` of these tests (the test kit's spawner), killed on drop
/// with its directory removed.
struct Edge {
    serve: Serve,
    addr: SocketAddr,
    _dir: TempDir,
}

/// Writes `serve_yaml` (the `serve:` section's lines, indented by two) and
/// `extra` top-level YAML to a config file in a directory of its own; the
/// `ctx serve` with it, the provider key and the access token in the
/// environment, not started yet.
fn spawn(name: &str, serve_yaml: &str, extra: &str) -> (Spawn, TempDir) {
    let addr = format!("127.0.0.1:{}", free_port());
    let dir = TempDir::new("serve-edge", name);
    let config = dir.0.join("config.yaml");
    std::fs::write(
        &config,
        format!("serve:\n  listen: \"{addr}\"\n{serve_yaml}\n{extra}\n"),
    )
    .unwrap();
    let spawn = Spawn::listening(env!("CARGO_BIN_EXE_ctx"), &addr)
        .arg("--config")
        .arg(&config)
        .env("CTX_EDGE_TEST_KEY", KEY)
        .env("CTX_EDGE_TEST_TOKEN", TOKEN)
        .env("CTX_EDGE_TEST_PG_PASSWORD", "not-a-real-secret")
        // Whatever `/healthz` says (a store that is down answers 503).
        .ready(Ready::Answers);
    (spawn, dir)
}

impl Edge {
    /// [`spawn`], started: waits until `/healthz` answers.
    async fn start(name: &str, serve_yaml: &str, extra: &str) -> Edge {
        let (spawn, dir) = spawn(name, serve_yaml, extra);
        let serve = spawn.start().await;
        let addr = serve.socket_addr();
        Edge {
            serve,
            addr,
            _dir: dir,
        }
    }

    /// The peak resident set (`VmHWM`), in bytes.
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.serve.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb * 1024
    }
}

/// `upstream:` lines of the serve section for `url`, with the provider key.
fn upstream_yaml(url: &str) -> String {
    format!(
        "  upstream:\n    url: \"{url}\"\n    api_key_env: CTX_EDGE_TEST_KEY\n  auth_token_env: CTX_EDGE_TEST_TOKEN\n"
    )
}

#[tokio::test]
async fn a_provider_key_without_client_auth_refuses_to_start() {
    let (serve, _dir) = spawn(
        "keyonly",
        "  upstream:\n    url: \"http://127.0.0.1:9/v1\"\n    api_key_env: CTX_EDGE_TEST_KEY\n",
        "",
    );
    let (status, err) = serve
        .exit_within(Duration::from_secs(30))
        .await
        .expect("ctx serve started with a provider key and no client auth");
    assert!(!status.success());
    assert!(
        err.contains("serve.auth_token_env") && err.contains("serve.upstream.api_key_env"),
        "the error names the keys to set: {err}"
    );
    assert!(!err.contains(KEY), "the key is never printed: {err}");
}

#[tokio::test]
async fn foreign_requests_and_escaping_paths_never_reach_upstream() {
    let rec = Arc::new(Recorder::default());
    let url = start_recorder(Arc::clone(&rec)).await;
    let serve = Edge::start("site", &upstream_yaml(&url), "").await;
    let addr = serve.addr;
    let host = format!("Host: 127.0.0.1:{}", addr.port());
    let auth = format!("Authorization: Bearer {TOKEN}");
    let json = "Content-Type: application/json";
    let chat = "/v1/chat/completions";
    let refused: Vec<(&str, &str, Vec<&str>, u16)> = vec![
        // No credential: the provider key is not spent.
        ("POST", chat, vec![&host, json], 401),
        ("GET", "/v1/models", vec![&host], 401),
        // What a web page can send.
        (
            "POST",
            chat,
            vec![&host, &auth, "Content-Type: text/plain"],
            415,
        ),
        (
            "POST",
            chat,
            vec![&host, &auth, json, "Origin: https://evil.example"],
            403,
        ),
        ("POST", chat, vec!["Host: evil.example", &auth, json], 403),
        (
            "POST",
            chat,
            vec![&host, &auth, json, "Sec-Fetch-Site: cross-site"],
            403,
        ),
        (
            "POST",
            "/v1/embeddings",
            vec![&host, &auth, "Content-Type: text/plain"],
            415,
        ),
        // Paths leaving /v1.
        ("GET", "/v1/../secret-admin", vec![&host, &auth], 400),
        ("GET", "/v1/%2e%2e/secret-admin", vec![&host, &auth], 400),
        ("GET", "/v1/%2E%2e/secret-admin", vec![&host, &auth], 400),
        (
            "GET",
            "/v1/models%2f..%2f..%2fsecret-admin",
            vec![&host, &auth],
            400,
        ),
        ("GET", "/v1/..%5csecret-admin", vec![&host, &auth], 400),
        ("GET", "/v1/..\\secret-admin", vec![&host, &auth], 400),
    ];
    for (method, path, headers, status) in &refused {
        let body = if *method == "GET" { "" } else { CHAT };
        let r = raw(addr, &request(method, path, headers, body)).await;
        assert_eq!(r.status, *status, "{method} {path} {headers:?}: {}", r.text);
    }
    assert!(rec.seen().is_empty(), "reached upstream: {:?}", rec.seen());

    // A real client (the token, Host 127.0.0.1:PORT, no Origin, JSON).
    let r = raw(addr, &request("POST", chat, &[&host, &auth, json], CHAT)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = raw(addr, &request("GET", "/v1/models", &[&host, &auth], "")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let seen = rec.seen();
    assert_eq!(
        seen.iter().map(|s| s.path.as_str()).collect::<Vec<_>>(),
        ["/v1/chat/completions", "/v1/models"]
    );
    assert!(
        seen.iter()
            .all(|s| s.authorization.as_deref() == Some(&format!("Bearer {KEY}"))),
        "the provider key replaces the client's token: {seen:?}"
    );
}

#[tokio::test]
async fn stalled_connections_are_closed_while_others_are_served() {
    let rec = Arc::new(Recorder::default());
    let url = start_recorder(Arc::clone(&rec)).await;
    let serve_yaml = format!(
        "{}  header_read_timeout_seconds: 1\n  body_read_timeout_seconds: 1\n  keepalive_idle_seconds: 2\n",
        upstream_yaml(&url)
    );
    let serve = Edge::start("stall", &serve_yaml, "").await;
    let addr = serve.addr;
    let host = format!("Host: 127.0.0.1:{}", addr.port());
    let auth = format!("Authorization: Bearer {TOKEN}");
    let mut stalled = Vec::new();
    for i in 0..100 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let text = if i % 2 == 0 {
            format!("POST /v1/chat/completions HTTP/1.1\r\n{host}\r\n{auth}\r\n")
        } else {
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\n{host}\r\n{auth}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"model\":"
            )
        };
        s.write_all(text.as_bytes()).await.unwrap();
        stalled.push(s);
    }
    let started = Instant::now();
    let r = raw(
        addr,
        &request(
            "POST",
            "/v1/chat/completions",
            &[&host, &auth, "Content-Type: application/json"],
            CHAT,
        ),
    )
    .await;
    assert_eq!(
        r.status, 200,
        "served while 100 connections stall: {}",
        r.text
    );
    let served = started.elapsed();
    let mut slowest = Duration::ZERO;
    for (i, s) in stalled.iter_mut().enumerate() {
        let took = closed_within(s, Duration::from_secs(8))
            .await
            .unwrap_or_else(|| panic!("stalled connection {i} still open"));
        slowest = slowest.max(took);
    }
    println!(
        "a request served in {:.1} ms while 100 connections stalled; all closed {:.2} s after it",
        served.as_secs_f64() * 1e3,
        slowest.as_secs_f64()
    );
    assert_eq!(
        rec.seen().len(),
        1,
        "only the complete request went upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_concurrent_60_mb_bodies_stay_under_a_gib() {
    const MB: usize = 1_000_000;
    let rec = Arc::new(Recorder::default());
    let url = start_recorder(Arc::clone(&rec)).await;
    // The upstream holds every call until each body is either upstream
    // or refused: the bodies are all in flight at once.
    rec.hold();
    let cap = std::env::var("CTX_EDGE_TEST_INFLIGHT").map_or_else(
        |_| String::new(),
        |v| format!("  max_inflight_bytes: {v}\n"),
    );
    let serve = Edge::start("memory", &format!("{}{cap}", upstream_yaml(&url)), "").await;
    let addr = serve.addr;
    let before = serve.peak_rss();
    let body = {
        let mut b = br#"{"model":"m","messages":[{"role":"user","content":""#.to_vec();
        b.resize(60 * MB - 4, b'x');
        b.extend_from_slice(br#""}]}"#);
        Bytes::from(b)
    };
    let head = format!(
        "POST {ROUTE} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let started = Instant::now();
    // Six sessions: their engine steps run at once, not one after another.
    let sends = (0..6).map(|i| {
        let head = head.replacen("\r\n", &format!("\r\nx-ctx-session: big-{i}\r\n"), 1);
        let body = body.clone();
        tokio::spawn(async move { send_big(addr, head, body).await })
    });
    let sends: Vec<_> = sends.collect();
    let all_in = eventually(Duration::from_secs(60), || {
        let refused = sends.iter().filter(|s| s.is_finished()).count();
        let upstream = rec.seen().len();
        async move { (refused + upstream == 6).then_some(()) }
    })
    .await;
    rec.release();
    assert!(
        all_in.is_some(),
        "each body reached the upstream or was refused"
    );
    let mut answers = Vec::new();
    for s in sends {
        answers.push(s.await.unwrap());
    }
    let peak = serve.peak_rss();
    println!(
        "six concurrent 60 MB bodies to {ROUTE} in {:.2} s: statuses {:?}; peak RSS {} MiB (idle {} MiB)",
        started.elapsed().as_secs_f64(),
        answers.iter().map(|a| a.0).collect::<Vec<_>>(),
        peak >> 20,
        before >> 20
    );
    for (status, retry) in &answers {
        match status {
            200 => {}
            503 => assert_eq!(retry.as_deref(), Some("1"), "503 carries Retry-After"),
            other => panic!("neither an answer nor 503: {other}"),
        }
    }
    assert!(
        answers.iter().any(|a| a.0 == 200),
        "some bodies are admitted"
    );
    assert!(
        answers.iter().any(|a| a.0 == 503),
        "360 MB at once is past the default cap: some wait their turn"
    );
    assert!(peak < 1 << 30, "peak RSS {} MiB", peak >> 20);
}

/// Sends a request whose body may be refused before it is all written
/// (a write error then is no failure); its status and `Retry-After`.
async fn send_big(addr: SocketAddr, head: String, body: Bytes) -> (u16, Option<String>) {
    use tokio::io::AsyncReadExt;
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(head.as_bytes()).await;
        let _ = wr.write_all(&body).await;
        wr
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut out)).await;
    drop(writer.await);
    let r = raw::RawResponse {
        status: String::from_utf8_lossy(&out)
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        text: String::from_utf8_lossy(&out).into_owned(),
    };
    (r.status, r.header("retry-after"))
}

#[tokio::test]
async fn an_unanswering_store_makes_health_503_without_naming_it() {
    let rec = Arc::new(Recorder::default());
    let url = start_recorder(Arc::clone(&rec)).await;
    // Nothing listens on this port.
    let port = free_port();
    let store = format!(
        "store:\n  url: \"postgres://edgeuser@127.0.0.1:{port}/edgedb\"\n  password_env: CTX_EDGE_TEST_PG_PASSWORD\n  timeout_seconds: 1\n"
    );
    let serve = Edge::start("health", &upstream_yaml(&url), &store).await;
    let addr = serve.addr;
    let host = format!("Host: 127.0.0.1:{}", addr.port());
    let auth = format!("Authorization: Bearer {TOKEN}");
    // A request finds the store down (and is served unmanaged).
    let r = raw(
        addr,
        &request(
            "POST",
            "/v1/chat/completions",
            &[
                &host,
                &auth,
                "Content-Type: application/json",
                "x-ctx-session: s1",
            ],
            CHAT,
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let health = raw(addr, &request("GET", "/healthz", &[&host], "")).await;
    assert_eq!(health.status, 503, "{}", health.text);
    let body = health
        .text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    assert!(body.contains("degraded"), "{body}");
    for secret in [
        "127.0.0.1",
        &port.to_string(),
        "postgres",
        "edgeuser",
        "edgedb",
        "not-a-real-secret",
        KEY,
        TOKEN,
    ] {
        assert!(
            !health.text.contains(secret),
            "`{secret}` in {}",
            health.text
        );
    }
}
