//! Loopback load generator: the proxy against an upstream that answers at
//! once, compared with calling that upstream directly.
//!
//! `cargo bench -p context-engine-serve --bench load` prints: added latency
//! for a 100-message session with no compaction due (one client, p50/p99),
//! p50/p99 and throughput at 200 concurrent sessions, stream
//! time-to-first-byte overhead, memory per idle session (RSS over 10,000
//! sessions), and the added latency of 200 active sessions alone and among
//! 10,000 idle ones (`LOAD_ONLY=scale`). Everything (load generator,
//! proxy, upstream) shares this machine's cores, so the concurrent figures
//! include the generator's own cost; the CPU time per request of each phase (all threads, from
//! schedstat) separates the proxy's own cost from a busy machine's.
//! `LOAD_REQUESTS=n` sets the requests per concurrent session (default 20).
//! The same sequential session is also sent as Anthropic Messages
//! (`/v1/messages`) and Responses (`/v1/responses`), so the three fronts'
//! added latencies compare; `LOAD_FRONTS_ONLY=1` runs only that part.
//! `LOAD_ONLY=observe` compares observe mode with plain forwarding and the
//! managed path, interleaved in one run. `LOAD_ONLY=edge` compares the chat path with and without the edge (the
//! site rule, the body read under its limits and the in-flight budget,
//! the accept loop's timeouts and `TCP_NODELAY`) in one run, interleaved.
//! `LOAD_ONLY=page` measures what pages open at `/ui` add to the calls
//! ([`page`]); `LOAD_ONLY=search`, archive search among other identities'
//! archives and what twenty searches add to a chat call ([`search`]).

#[path = "load/page.rs"]
mod page;
#[path = "load/search.rs"]
mod search;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use context_engine::engine::ContextEngine;
use context_engine::host::HostOptions;
use context_engine::plugin::EngineContext;
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine_serve::{AppState, ServeMode, ServeOptions, SessionContext, UpstreamOptions};
use serde_json::{Value, json};
use tokio::net::TcpListener;

const REPLY: &str = r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9000,"completion_tokens":1,"total_tokens":9001}}"#;
const STREAM: &str = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"}}]}\n\ndata: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":9000,\"completion_tokens\":1,\"total_tokens\":9001}}\n\ndata: [DONE]\n\n";

const ANTHROPIC_REPLY: &str = r#"{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":100,"cache_read_input_tokens":8900,"cache_creation_input_tokens":0,"output_tokens":1}}"#;
const RESPONSES_REPLY: &str = r#"{"id":"r","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}],"usage":{"input_tokens":9000,"input_tokens_details":{"cached_tokens":8900},"output_tokens":1,"total_tokens":9001}}"#;

fn json_reply(text: &'static str) -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(text))
        .unwrap_or_default()
}

async fn upstream() -> String {
    let app = Router::new()
        .route(
            "/v1/messages",
            post(|| async { json_reply(ANTHROPIC_REPLY) }),
        )
        .route(
            "/v1/responses",
            post(|| async { json_reply(RESPONSES_REPLY) }),
        )
        .route(
            "/v1/plain/chat/completions",
            post(|| async { json_reply(REPLY) }),
        )
        .route(
            "/v1/chat/completions",
            post(|body: Bytes| async move {
                let stream = memchr::memmem::find(&body, b"\"stream\":true").is_some();
                let (ct, text) = if stream {
                    ("text/event-stream", STREAM)
                } else {
                    ("application/json", REPLY)
                };
                Response::builder()
                    .header("content-type", ct)
                    .body(Body::from(text))
                    .unwrap_or_default()
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

async fn proxy(url: &str) -> (String, AppState) {
    proxy_with(url, None).await
}

/// The sessions every phase's proxy runs: the compressor at a 128K window,
/// exact cached counts.
fn session_context() -> SessionContext {
    let counter: Arc<dyn TokenCounter> =
        Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
    let c = Arc::clone(&counter);
    let factory =
        move |_: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
            Ok(Box::new(
                EngineContext::new(Arc::clone(&c), 128_000).into_compressor(),
            ))
        };
    SessionContext {
        factory: Arc::new(factory),
        counter,
        host: HostOptions::default(),
        blocking: false,
    }
}

/// A proxy whose sessions sleep after `hibernate` idle, when set.
async fn proxy_with(url: &str, hibernate: Option<Duration>) -> (String, AppState) {
    proxy_in(url, hibernate, ServeMode::Managed).await
}

/// A proxy in `mode`.
async fn proxy_in(url: &str, hibernate: Option<Duration>, mode: ServeMode) -> (String, AppState) {
    let ctx = session_context();
    let options = ServeOptions::new(UpstreamOptions::new(url))
        .with_sessions(100_000, Duration::from_secs(3600))
        .with_hibernation(hibernate)
        .with_mode(mode);
    let state = AppState::new(options, ctx).unwrap_or_else(|e| panic!("{e}"));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let s = state.clone();
    tokio::spawn(
        async move { context_engine_serve::serve(listener, s, std::future::pending()).await },
    );
    (format!("http://{addr}/v1"), state)
}

/// A proxy served without the edge: `axum::serve` (no connection
/// timeouts, no `TCP_NODELAY`) on the router without the edge's layers.
async fn proxy_without_edge(url: &str) -> String {
    let (_, state) = proxy(url).await;
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let app = context_engine_serve::router::app_without_edge(state);
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

/// The chat path's latency with and without the edge, interleaved in
/// rounds so that both see the same machine load.
async fn edge_cost(direct: &str) {
    let (with, _) = proxy(direct).await;
    let without = proxy_without_edge(direct).await;
    let client = reqwest::Client::new();
    let rounds: usize = std::env::var("LOAD_EDGE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    // Warm-up.
    sequential(&client, &with, "edge-warm", 10).await;
    sequential(&client, &without, "bare-warm", 10).await;
    for r in 0..rounds {
        a.extend(sequential(&client, &with, &format!("edge-{r}"), 50).await);
        b.extend(sequential(&client, &without, &format!("bare-{r}"), 50).await);
    }
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    println!(
        "edge cost, chat ~100 messages, {} requests each, interleaved: with the edge p50 {:.3} ms p99 {:.3} ms; without p50 {:.3} ms p99 {:.3} ms; p50 difference {:+.3} ms",
        a.len(),
        pct(&a, 0.5),
        pct(&a, 0.99),
        pct(&b, 0.5),
        pct(&b, 0.99),
        pct(&a, 0.5) - pct(&b, 0.5)
    );
}

/// A coding-agent history of `n` messages: system, task, then tool calls
/// with ~600-byte results and short assistant notes.
fn history(n: usize, salt: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": "You are a careful coding agent. Use the tools to inspect and fix the repository."}),
        json!({"role": "user", "content": format!("Session {salt}: fix the failing test in tests/test_parser.py")}),
    ];
    let mut i = 0;
    while m.len() < n {
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"), "type": "function",
            "function": {"name": "bash", "arguments": format!("{{\"command\":\"sed -n {i},{}p src/parser.py\"}}", i + 20)}}]}));
        let out: String = (0..12)
            .map(|j| {
                format!(
                    "{:>4}     token = self.lexer.next_token({j})  # {salt}\n",
                    i * 12 + j
                )
            })
            .collect();
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": out}));
        i += 1;
    }
    m.truncate(n);
    m
}

fn body(messages: &[Value], stream: bool) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({"model": "m", "stream": stream, "messages": messages}))
            .unwrap_or_default(),
    )
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The client formats the bench sends the same session in.
#[derive(Clone, Copy, Debug)]
enum Front {
    Chat,
    Anthropic,
    Responses,
}

impl Front {
    fn path(self) -> &'static str {
        match self {
            Front::Chat => "chat/completions",
            Front::Anthropic => "messages",
            Front::Responses => "responses",
        }
    }

    /// The chat history `messages` as this front's request body.
    fn body(self, messages: &[Value]) -> Bytes {
        let text = |m: &Value| m["content"].as_str().unwrap_or("").to_owned();
        let v = match self {
            Front::Chat => return body(messages, false),
            Front::Anthropic => {
                let mut out: Vec<Value> = Vec::new();
                for m in &messages[1..] {
                    let role = m["role"].as_str().unwrap_or("user");
                    let block = match role {
                        "assistant" => match m["tool_calls"].as_array() {
                            Some(calls) => {
                                let c = &calls[0];
                                let input: Value = serde_json::from_str(
                                    c["function"]["arguments"].as_str().unwrap_or("{}"),
                                )
                                .unwrap_or_default();
                                json!({"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": input})
                            }
                            None => json!({"type": "text", "text": text(m)}),
                        },
                        "tool" => {
                            json!({"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": text(m)})
                        }
                        _ => json!({"type": "text", "text": text(m)}),
                    };
                    let role = if role == "tool" { "user" } else { role };
                    match out.last_mut() {
                        Some(last) if last["role"] == role => {
                            if let Some(b) = last["content"].as_array_mut() {
                                b.push(block);
                            }
                        }
                        _ => out.push(json!({"role": role, "content": [block]})),
                    }
                }
                json!({"model": "m", "max_tokens": 1024, "system": [{"type": "text", "text": text(&messages[0])}], "messages": out})
            }
            Front::Responses => {
                let mut input: Vec<Value> = Vec::new();
                for m in &messages[1..] {
                    match (m["role"].as_str().unwrap_or("user"), m["tool_calls"].as_array()) {
                        ("assistant", Some(calls)) => input.push(json!({"type": "function_call", "call_id": calls[0]["id"],
                            "name": calls[0]["function"]["name"], "arguments": calls[0]["function"]["arguments"]})),
                        ("tool", _) => input.push(json!({"type": "function_call_output", "call_id": m["tool_call_id"], "output": text(m)})),
                        ("assistant", None) => input.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text(m)}]})),
                        (role, _) => input.push(json!({"type": "message", "role": role, "content": [{"type": "input_text", "text": text(m)}]})),
                    }
                }
                json!({"model": "m", "instructions": text(&messages[0]), "input": input, "store": false})
            }
        };
        Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
    }
}

async fn one(client: &reqwest::Client, url: &str, session: &str, body: Bytes) -> f64 {
    one_at(client, url, Front::Chat, session, body).await
}

async fn one_at(
    client: &reqwest::Client,
    url: &str,
    front: Front,
    session: &str,
    body: Bytes,
) -> f64 {
    let t = Instant::now();
    let r = client
        .post(format!("{url}/{}", front.path()))
        .header("content-type", "application/json")
        .header("x-ctx-session", session)
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = r.bytes().await;
    t.elapsed().as_secs_f64() * 1e3
}

/// Sequential requests: sessions of ~100 messages (90 growing to 108 by a
/// reply and a user turn per call), ten calls each; latencies in ms.
async fn sequential(client: &reqwest::Client, url: &str, tag: &str, n: usize) -> Vec<f64> {
    sequential_at(client, url, Front::Chat, tag, n).await
}

async fn sequential_at(
    client: &reqwest::Client,
    url: &str,
    front: Front,
    tag: &str,
    n: usize,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    for s in 0..n.div_ceil(10) {
        let mut h = history(90, s);
        let session = format!("{tag}-{s}");
        for i in 0..10 {
            if i > 0 {
                h.push(json!({"role": "assistant", "content": "ok"}));
                h.push(json!({"role": "user", "content": format!("next step {i}")}));
            }
            let b = front.body(&h);
            out.push(one_at(client, url, front, &session, b).await);
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

/// `sessions` concurrent sessions sending `per` requests each at `rate`
/// requests per second in all (open loop, below saturation: each session
/// sends its next call when due, or as soon as its previous one came back
/// if that was late); latencies in ms. Unlike [`concurrent`], whose
/// clients always wait on a saturated machine (so latency there is queueing
/// behind 200 others), this measures what the proxy adds to each call.
async fn paced(url: &str, sessions: usize, per: usize, rate: f64) -> (Vec<f64>, f64) {
    paced_as(url, "paced", sessions, per, rate).await
}

/// [`paced`] with the sessions named `{tag}-{s}`.
async fn paced_as(url: &str, tag: &str, sessions: usize, per: usize, rate: f64) -> (Vec<f64>, f64) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(sessions)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let bodies: Vec<Vec<Bytes>> = (0..sessions)
        .map(|s| {
            let mut h = history(100, 50_000 + s);
            (0..per)
                .map(|i| {
                    if i > 0 {
                        h.push(json!({"role": "assistant", "content": "ok"}));
                        h.push(json!({"role": "user", "content": format!("next step {i}")}));
                    }
                    body(&h, false)
                })
                .collect()
        })
        .collect();
    let every = Duration::from_secs_f64(sessions as f64 / rate);
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::new();
    for (s, bodies) in bodies.into_iter().enumerate() {
        let (client, url) = (client.clone(), url.to_owned());
        let offset = every.mul_f64(s as f64 / sessions as f64);
        let session = format!("{tag}-{s}");
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for (i, b) in bodies.into_iter().enumerate() {
                tokio::time::sleep_until(start + offset + every.mul_f64(i as f64)).await;
                let ms = one(&client, &url, &session, b).await;
                // The first call of a session counts its history cold.
                if i > 0 {
                    lat.push(ms);
                }
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let achieved = (sessions * per) as f64 / start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    (all, achieved)
}

/// `sessions` concurrent sessions, `per` requests each; latencies (ms) and
/// requests per second.
async fn concurrent(url: &str, sessions: usize, per: usize) -> (Vec<f64>, f64) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(sessions)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let bodies: Vec<Vec<Bytes>> = (0..sessions)
        .map(|s| {
            let mut h = history(100, s);
            (0..per)
                .map(|i| {
                    if i > 0 {
                        h.push(json!({"role": "assistant", "content": "ok"}));
                        h.push(json!({"role": "user", "content": format!("next step {i}")}));
                    }
                    body(&h, false)
                })
                .collect()
        })
        .collect();
    eprintln!("load: {sessions} sessions start against {url}");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (s, bodies) in bodies.into_iter().enumerate() {
        let (client, url) = (client.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(bodies.len());
            let session = format!("load-{s}");
            for b in bodies {
                lat.push(one(&client, &url, &session, b).await);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let rps = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    (all, rps)
}

/// Time to the first body byte of a stream, ms.
async fn ttfb(client: &reqwest::Client, url: &str, session: &str, b: Bytes) -> f64 {
    let t = Instant::now();
    let mut r = client
        .post(format!("{url}/chat/completions"))
        .header("content-type", "application/json")
        .header("x-ctx-session", session)
        .body(b)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = r.chunk().await;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    while let Ok(Some(_)) = r.chunk().await {}
    ms
}

/// CPU time this process has used and time its threads waited for a CPU
/// (run queue), ns, every thread's, from schedstat: on a shared machine,
/// CPU per request is what compares, not wall time, and the wait says how
/// much the machine's other load held the run back.
fn cpu_ns() -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0, 0);
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .map(|s| {
            let mut f = s.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
            (f.next().unwrap_or(0), f.next().unwrap_or(0))
        })
        .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
}

fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<usize>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

/// One memory figure (`LOAD_MEMORY=awake|asleep,n,len`, run in a fresh
/// process by the `idle` phase): `n` sessions of `len` messages, one
/// request each; asleep, every session is put to sleep once idle (the
/// sweep runs after every 20 sessions), as `serve.hibernate_seconds` does.
async fn memory(spec: &str) {
    let parts: Vec<&str> = spec.split(',').collect();
    let (asleep, n, len) = match parts[..] {
        [mode, n, len] => (
            mode == "asleep",
            n.parse::<usize>().unwrap_or(1000),
            len.parse::<usize>().unwrap_or(100),
        ),
        _ => panic!("LOAD_MEMORY=awake|asleep,n,len"),
    };
    let direct = upstream().await;
    let (via, state) = proxy_with(&direct, asleep.then_some(Duration::from_secs(3600))).await;
    let client = reqwest::Client::new();
    // Warm: connections, the runtime's buffers.
    for s in 0..50 {
        one(
            &client,
            &via,
            &format!("warm-{s}"),
            body(&history(len, 900_000 + s), false),
        )
        .await;
    }
    state.sessions().hibernate_idle(Duration::ZERO);
    let rss0 = rss_bytes();
    let mut heap = 0;
    for s in 0..n {
        let b = body(&history(len, 100_000 + s), false);
        one(&client, &via, &format!("idle{len}-{s}"), b).await;
        if s == 0 {
            heap = heap_bytes(&via, format!("idle{len}-0")).await;
        }
        if asleep && s % 20 == 19 {
            state.sessions().hibernate_idle(Duration::ZERO);
        }
    }
    if asleep {
        state.sessions().hibernate_idle(Duration::ZERO);
        heap = heap_bytes(&via, format!("idle{len}-0")).await;
    }
    let rss1 = rss_bytes();
    let history_bytes = serde_json::to_vec(&history(len, 100_000)).map_or(0, |v| v.len());
    let per = rss1.saturating_sub(rss0) as f64 / n as f64 / 1024.0;
    println!(
        "  {n} sessions of {len} messages ({:.1} KB of JSON each), {}: RSS +{per:.1} KB per session ({:+.1} KB beyond its JSON); one session's managed history holds {:.1} KB",
        history_bytes as f64 / 1024.0,
        if asleep {
            "asleep"
        } else {
            "awake (just served)"
        },
        per - history_bytes as f64 / 1024.0,
        heap as f64 / 1024.0,
    );
}

/// A session's `heap_bytes` as `/ctx/sessions/{id}` reports it.
/// The scale figure (`LOAD_SCALE=n`, run in a fresh process by the `scale`
/// phase): 200 active sessions paced at `LOAD_RATE` with nothing else in
/// the proxy, then `n` more sessions of 100 messages (one request each,
/// asleep once idle, as `serve.hibernate_seconds` puts them), then 200
/// fresh active sessions paced at the same rate among them. Direct calls
/// at the same pace frame each run, so the added p50/p99 compare within
/// one process; RSS before and after the idle sessions gives their cost.
async fn scale(n: usize) {
    let rate: f64 = std::env::var("LOAD_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600.0);
    let per: usize = std::env::var("LOAD_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let direct = upstream().await;
    let (via, state) = proxy_with(&direct, Some(Duration::from_secs(3600))).await;
    let added = |d: &[f64], p: &[f64]| (pct(p, 0.5) - pct(d, 0.5), pct(p, 0.99) - pct(d, 0.99));
    let (d0, _) = paced_as(&direct, "alone", 200, per, rate).await;
    let (p0, _) = paced_as(&via, "alone", 200, per, rate).await;
    let (a50, a99) = added(&d0, &p0);
    state.sessions().hibernate_idle(Duration::ZERO);
    let rss0 = rss_bytes();
    // The idle sessions: 32 clients at a time, each session put to sleep
    // as it goes idle (the sweep runs every 500 sessions).
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(32)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut tasks = Vec::new();
        for lane in chunk.chunks(chunk.len().div_ceil(32)) {
            let (client, via, lane) = (client.clone(), via.clone(), lane.to_vec());
            tasks.push(tokio::spawn(async move {
                for s in lane {
                    let b = body(&history(100, 200_000 + s), false);
                    one(&client, &via, &format!("idle-{s}"), b).await;
                }
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
        state.sessions().hibernate_idle(Duration::ZERO);
    }
    let made = t.elapsed().as_secs_f64();
    let rss1 = rss_bytes();
    let (d1, _) = paced_as(&direct, "among", 200, per, rate).await;
    let (p1, _) = paced_as(&via, "among", 200, per, rate).await;
    let (b50, b99) = added(&d1, &p1);
    let rss2 = rss_bytes();
    let mb = |b: usize| b as f64 / (1024.0 * 1024.0);
    println!(
        "  {n} idle sessions of 100 messages (made in {made:.0} s, asleep): RSS {:.0} -> {:.0} MB, +{:.1} KB per idle session; {:.0} MB after 200 more active",
        mb(rss0),
        mb(rss1),
        rss1.saturating_sub(rss0) as f64 / n as f64 / 1024.0,
        mb(rss2),
    );
    println!(
        "  200 active sessions at {rate:.0} req/s, added p50 / p99: alone {a50:.3} / {a99:.3} ms, among {n} idle {b50:.3} / {b99:.3} ms (p99 ratio {:.2})",
        b99 / a99.max(1e-9)
    );
}

async fn heap_bytes(url: &str, session: String) -> usize {
    let base = url.trim_end_matches("/v1");
    let v: Value = reqwest::get(format!("{base}/ctx/sessions/{session}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .bytes()
        .await
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    v["heap_bytes"].as_u64().unwrap_or(0) as usize
}

/// The phases of a front's engine step, in ms (p50 over 200 calls).
fn front_phases(front: Front) {
    use context_engine::front::{FrontCache, FrontKind, FrontRequest, split_items};
    let kind = match front {
        Front::Anthropic => FrontKind::Anthropic,
        _ => FrontKind::Responses,
    };
    let counter: Arc<dyn TokenCounter> =
        Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
    let c = Arc::clone(&counter);
    let factory =
        move |_: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
            Ok(Box::new(
                EngineContext::new(Arc::clone(&c), 128_000).into_compressor(),
            ))
        };
    let ctx = Arc::new(SessionContext {
        factory: Arc::new(factory),
        counter,
        host: HostOptions::default(),
        blocking: false,
    });
    let mut m =
        context_engine_serve::session::Managed::new(ctx, "f").unwrap_or_else(|e| panic!("{e}"));
    let mut h = history(90, 5);
    let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let mut cache = FrontCache::default();
    for i in 0..200 {
        h.push(json!({"role": "assistant", "content": "ok"}));
        h.push(json!({"role": "user", "content": format!("next step {i}")}));
        if h.len() > 110 {
            h = history(90, 6 + i);
        }
        let b = front.body(&h);
        let t0 = Instant::now();
        let split = context_engine_serve::body::ChatBody::parse_object(&b)
            .unwrap_or_else(|e| panic!("{e}"));
        let fields = split.fields();
        let items = split_items(kind, &fields);
        let mut req = FrontRequest::parse_parts(kind, &fields, items.as_deref(), &mut cache)
            .unwrap_or_else(|e| panic!("{e}"));
        let t1 = Instant::now();
        let refs: Vec<&serde_json::value::RawValue> =
            req.chat_json().iter().map(AsRef::as_ref).collect();
        let t2 = Instant::now();
        let plan = m.prepare(&refs).unwrap_or_else(|e| panic!("{e}"));
        drop(refs);
        let t3 = Instant::now();
        // As the handler: only Anthropic's cache needs the stable prefix.
        let stable = if kind == FrontKind::Anthropic {
            m.stable_prefix(&plan.request)
        } else {
            plan.request.len()
        };
        let r = req.rebuild_with(&plan.request, items.as_deref(), stable);
        let t4 = Instant::now();
        std::hint::black_box(r.ok());
        cache.keep(req);
        for (k, d) in [t1 - t0, t2 - t1, t3 - t2, t4 - t3].iter().enumerate() {
            t[k].push(d.as_secs_f64() * 1e3);
        }
    }
    for v in &mut t {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "  {front:?} step p50: split + parse + bridge (new messages) {:.3} ms, chat view {:.3} ms, session prepare {:.3} ms, rebuild {:.3} ms",
        pct(&t[0], 0.5),
        pct(&t[1], 0.5),
        pct(&t[2], 0.5),
        pct(&t[3], 0.5)
    );
}

/// Observe mode's added latency over plain forwarding (the proxy's
/// passthrough path, no engine) and the managed path's, for the same
/// sequential chat session, interleaved in one run.
async fn observe() {
    let direct = upstream().await;
    let (managed, _) = proxy(&direct).await;
    let (observing, state) = proxy_in(&direct, None, ServeMode::Observe).await;
    let plain = format!("{managed}/plain");
    let client = reqwest::Client::new();
    let targets = [
        ("direct", format!("{direct}/plain")),
        ("forward", plain),
        ("observe", observing),
        ("managed", managed),
    ];
    for (tag, url) in &targets {
        sequential_at(&client, url, Front::Chat, &format!("warm-{tag}"), 50).await;
    }
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    for round in 0..4 {
        for (k, (tag, url)) in targets.iter().enumerate() {
            let t = sequential_at(&client, url, Front::Chat, &format!("{tag}-{round}"), 100).await;
            runs[k].extend(t);
        }
    }
    for r in &mut runs {
        r.sort_by(f64::total_cmp);
    }
    let p50: Vec<f64> = runs.iter().map(|r| pct(r, 0.5)).collect();
    println!("observe: one client, 100-message chat session, 400 requests each, interleaved:");
    for (k, (tag, _)) in targets.iter().enumerate() {
        println!(
            "  {tag:<8} p50 {:.3} ms  p99 {:.3} ms",
            p50[k],
            pct(&runs[k], 0.99)
        );
    }
    println!(
        "  observe over plain forwarding, p50: {:+.3} ms; managed over forwarding: {:+.3} ms",
        p50[2] - p50[1],
        p50[3] - p50[1]
    );
    for line in state.metrics().encode().lines() {
        if ["ctx_observed_requests_total", "ctx_observe_errors_total"]
            .iter()
            .any(|m| line.starts_with(m))
        {
            println!("  observing proxy metric: {line}");
        }
    }
}

/// Added latency of each front for the same sequential session.
async fn fronts() {
    front_phases(Front::Anthropic);
    front_phases(Front::Responses);
    let direct = upstream().await;
    let (via, state) = proxy(&direct).await;
    let client = reqwest::Client::new();
    println!("fronts: one client, 100-message session, no compaction due (400 requests each):");
    for front in [Front::Chat, Front::Anthropic, Front::Responses] {
        let tag = format!("{front:?}");
        sequential_at(&client, &direct, front, &format!("warm-{tag}"), 50).await;
        sequential_at(&client, &via, front, &format!("warm-{tag}"), 50).await;
        let d = sequential_at(&client, &direct, front, &format!("seq-{tag}"), 400).await;
        let p = sequential_at(&client, &via, front, &format!("seq-{tag}"), 400).await;
        println!(
            "  {tag:<9} direct p50 {:.3} ms  proxy p50 {:.3} ms  added p50 {:.3} ms  p99 {:.3} ms",
            pct(&d, 0.5),
            pct(&p, 0.5),
            pct(&p, 0.5) - pct(&d, 0.5),
            pct(&p, 0.99) - pct(&d, 0.99)
        );
    }
    for line in state.metrics().encode().lines() {
        if [
            "ctx_fallbacks_total",
            "ctx_lineages_total",
            "ctx_overhead_seconds_sum",
            "ctx_overhead_seconds_count",
        ]
        .iter()
        .any(|m| line.starts_with(m))
        {
            println!("  proxy metric: {line}");
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    if let Ok(spec) = std::env::var("LOAD_MEMORY") {
        rt.block_on(memory(&spec));
        return;
    }
    if let Ok(n) = std::env::var("LOAD_SCALE") {
        rt.block_on(scale(n.parse().unwrap_or(10_000)));
        return;
    }
    rt.block_on(async {
        let only = std::env::var("LOAD_ONLY").unwrap_or_default();
        let phase = |name: &str| only.is_empty() || only.split(',').any(|p| p == name);
        if phase("fronts") {
            fronts().await;
        }
        if phase("observe") {
            observe().await;
        }
        if std::env::var_os("LOAD_FRONTS_ONLY").is_some() {
            return;
        }
        if phase("step") {
            let counter: Arc<dyn TokenCounter> = Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
            let t = Instant::now();
            for _ in 0..50 {
                let e = EngineContext::new(Arc::clone(&counter), 128_000).into_compressor();
                std::hint::black_box(&e);
            }
            println!("engine construction: {:.3} ms each", t.elapsed().as_secs_f64() * 1e3 / 50.0);
            let h: Vec<context_engine::message::Message> = serde_json::from_value(json!(history(100, 99))).unwrap_or_default();
            let t = Instant::now();
            let n = counter.count_messages(&h);
            println!("cold count of 100 messages: {:.3} ms ({n} tokens)", t.elapsed().as_secs_f64() * 1e3);
            let h2: Vec<context_engine::message::Message> = serde_json::from_value(json!(history(100, 98))).unwrap_or_default();
            let t = Instant::now();
            let n = counter.count_messages(&h2);
            println!("cold count of 100 other messages: {:.3} ms ({n} tokens)", t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let parsed: Vec<context_engine::message::Message> = serde_json::from_slice(&serde_json::to_vec(&history(100, 97)).unwrap_or_default()).unwrap_or_default();
            println!("parse 100 messages: {:.3} ms ({})", t.elapsed().as_secs_f64() * 1e3, parsed.len());
            let t = Instant::now();
            let n = counter.count_messages(&h);
            println!("warm count of 100 messages: {:.3} ms ({n} tokens)", t.elapsed().as_secs_f64() * 1e3);
            // One reading of a body: the duplicate-key walk against the
            // parse the chat path does anyway, on the same ~100-message body.
            let b = body(&history(100, 96), false);
            let text = std::str::from_utf8(&b).unwrap_or_default();
            let (mut walk, mut parse, mut skip, mut quotes) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..3000 {
                let t = Instant::now();
                std::hint::black_box(context_engine_serve::unique::duplicate_key(std::hint::black_box(text)));
                walk.push(t.elapsed().as_secs_f64() * 1e3);
                let t = Instant::now();
                std::hint::black_box(context_engine_serve::body::ChatBody::parse(std::hint::black_box(&b)).is_ok());
                parse.push(t.elapsed().as_secs_f64() * 1e3);
                let t = Instant::now();
                std::hint::black_box(serde_json::from_str::<serde::de::IgnoredAny>(std::hint::black_box(text)).is_ok());
                skip.push(t.elapsed().as_secs_f64() * 1e3);
                let t = Instant::now();
                std::hint::black_box(memchr::memchr_iter(b'"', std::hint::black_box(text.as_bytes())).count());
                quotes.push(t.elapsed().as_secs_f64() * 1e3);
            }
            for v in [&mut walk, &mut parse, &mut skip, &mut quotes] {
                v.sort_by(f64::total_cmp);
            }
            println!("body read ({} KB), interleaved: ChatBody::parse p50 {:.4} ms (the duplicate-key scan included); the scan alone p50 {:.4} ms; serde_json skipping the body p50 {:.4} ms; finding its quotes {:.4} ms", b.len() / 1024, pct(&parse, 0.5), pct(&walk, 0.5), pct(&skip, 0.5), pct(&quotes, 0.5));
            let t = Instant::now();
            let v = context_engine::validate::validate(&h, context_engine::validate::Profile::OpenAi);
            println!("validate 100 messages: {:.3} ms ({} violations)", t.elapsed().as_secs_f64() * 1e3, v.len());
        }
        if phase("step") {
            // The engine step alone, warm: one session, +2 messages a call.
            let counter: Arc<dyn TokenCounter> = Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
            let c = Arc::clone(&counter);
            let factory = move |_: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
                Ok(Box::new(EngineContext::new(Arc::clone(&c), 128_000).into_compressor()))
            };
            let ctx = Arc::new(SessionContext { factory: Arc::new(factory), counter, host: HostOptions::default(), blocking: false });
            let mut m = context_engine_serve::session::Managed::new(ctx, "b").unwrap_or_else(|e| panic!("{e}"));
            let mut h = history(90, 5);
            let mut times = Vec::new();
            for i in 0..200 {
                h.push(json!({"role": "assistant", "content": "ok"}));
                h.push(json!({"role": "user", "content": format!("next step {i}")}));
                if h.len() > 110 {
                    h = history(90, 6 + i);
                }
                let b = body(&h, false);
                let parsed = context_engine_serve::body::ChatBody::parse(&b).unwrap_or_else(|e| panic!("{e}"));
                let t = Instant::now();
                let plan = m.prepare_json(parsed.messages());
                let out = parsed.write(&[("messages", plan.map(|p| p.messages_json).unwrap_or_default().as_str())]);
                times.push(t.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(out);
            }
            times.sort_by(f64::total_cmp);
            println!("engine step (prepare + body), ~100 messages: p50 {:.3} ms  p99 {:.3} ms", pct(&times, 0.5), pct(&times, 0.99));
            // The same step on a session that slept: inflate and parse first.
            let mut woken = Vec::new();
            for i in 0..50 {
                h.push(json!({"role": "assistant", "content": "ok"}));
                h.push(json!({"role": "user", "content": format!("after a pause {i}")}));
                let b = body(&h, false);
                let parsed = context_engine_serve::body::ChatBody::parse(&b).unwrap_or_else(|e| panic!("{e}"));
                m.hibernate();
                let t = Instant::now();
                let plan = m.prepare_json(parsed.messages());
                woken.push(t.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(plan.ok());
            }
            woken.sort_by(f64::total_cmp);
            println!("engine step after a sleep (wake: inflate + parse, then the step), {} messages: p50 {:.3} ms", h.len(), pct(&woken, 0.5));
        }
        if phase("edge") {
            let direct = upstream().await;
            edge_cost(&direct).await;
        }
        if phase("page") {
            let direct = upstream().await;
            page::page_cost(&direct).await;
        }
        if phase("search") {
            let direct = upstream().await;
            search::search_cost(&direct).await;
        }
        if only == "edge" || only == "page" || only == "search" {
            return;
        }
        let per: usize = std::env::var("LOAD_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
        let direct = upstream().await;
        let (via, state) = proxy(&direct).await;
        let client = reqwest::Client::new();

        // Warm up both paths (connections, token cache of the history).
        sequential(&client, &direct, "warm", 50).await;
        sequential(&client, &via, "warm", 50).await;
        if phase("sequential") {
        let d = sequential(&client, &direct, "seq", 400).await;
        let p = sequential(&client, &via, "seq", 400).await;
        println!("one client, 100-message session, no compaction due ({} requests):", d.len());
        println!("  direct  p50 {:.3} ms  p99 {:.3} ms", pct(&d, 0.5), pct(&d, 0.99));
        println!("  proxy   p50 {:.3} ms  p99 {:.3} ms", pct(&p, 0.5), pct(&p, 0.99));
        println!(
            "  added   p50 {:.3} ms  p99 {:.3} ms",
            pct(&p, 0.5) - pct(&d, 0.5),
            pct(&p, 0.99) - pct(&d, 0.99)
        );
        }

        if phase("concurrent") {
        let c0 = cpu_ns();
        let (d, drps) = concurrent(&direct, 200, per).await;
        let c1 = cpu_ns();
        let (p, prps) = concurrent(&via, 200, per).await;
        let c2 = cpu_ns();
        let n = (200 * per) as f64;
        let (dcpu, pcpu) = ((c1.0 - c0.0) as f64 / n / 1e3, (c2.0 - c1.0) as f64 / n / 1e3);
        let (dwait, pwait) = ((c1.1 - c0.1) as f64 / n / 1e3, (c2.1 - c1.1) as f64 / n / 1e3);
        println!("200 concurrent sessions x {per} requests (100+ messages each):");
        println!("  direct  p50 {:.3} ms  p99 {:.3} ms  {:.0} req/s", pct(&d, 0.5), pct(&d, 0.99), drps);
        println!("  proxy   p50 {:.3} ms  p99 {:.3} ms  {:.0} req/s", pct(&p, 0.5), pct(&p, 0.99), prps);
        println!(
            "  added   p50 {:.3} ms  p99 {:.3} ms",
            pct(&p, 0.5) - pct(&d, 0.5),
            pct(&p, 0.99) - pct(&d, 0.99)
        );
        println!(
            "  CPU per request (generator + upstream [+ proxy], all threads): direct {dcpu:.0} us, through the proxy {pcpu:.0} us: the proxy's own {:.0} us",
            pcpu - dcpu
        );
        println!(
            "  run-queue wait per request (threads ready, no CPU free): direct {dwait:.0} us, through the proxy {pwait:.0} us"
        );
        println!(
            "  throughput if the proxy alone had 2 cores: {:.0} req/s; proxy + generator + upstream on 2 idle cores: {:.0} req/s",
            2e6 / (pcpu - dcpu).max(1.0),
            2e6 / pcpu.max(1.0)
        );
        let rate: f64 = std::env::var("LOAD_RATE").ok().and_then(|v| v.parse().ok()).unwrap_or(600.0);
        let paced_per = per.max(10);
        let (d, d_rate) = paced(&direct, 200, paced_per, rate).await;
        let (p, p_rate) = paced(&via, 200, paced_per, rate).await;
        println!("200 concurrent sessions paced at {rate:.0} req/s in all (open loop; LOAD_RATE), {} calls each after the first:", paced_per - 1);
        if d_rate.min(p_rate) < rate * 0.95 {
            println!("  (the machine could not keep the pace: {d_rate:.0} req/s direct, {p_rate:.0} through the proxy; the latencies below include queueing for a CPU)");
        }
        println!("  direct  p50 {:.3} ms  p99 {:.3} ms", pct(&d, 0.5), pct(&d, 0.99));
        println!("  proxy   p50 {:.3} ms  p99 {:.3} ms", pct(&p, 0.5), pct(&p, 0.99));
        println!(
            "  added   p50 {:.3} ms  p99 {:.3} ms",
            pct(&p, 0.5) - pct(&d, 0.5),
            pct(&p, 0.99) - pct(&d, 0.99)
        );

        for line in state.metrics().encode().lines() {
            if ["ctx_fallbacks_total", "ctx_compactions_total", "ctx_lineages_total", "ctx_overhead_seconds_sum", "ctx_overhead_seconds_count", "ctx_upstream_latency_seconds_sum", "ctx_upstream_latency_seconds_count", "ctx_cache_hit_share_estimate "]
                .iter()
                .any(|m| line.starts_with(m))
            {
                println!("  proxy metric: {line}");
            }
        }
        }
        if phase("ttfb") {
        let h = history(100, 7);
        let mut td = Vec::new();
        let mut tp = Vec::new();
        for i in 0..200 {
            td.push(ttfb(&client, &direct, "ttfb", body(&h, true)).await);
            tp.push(ttfb(&client, &via, &format!("ttfb-{}", i % 4), body(&h, true)).await);
        }
        td.sort_by(f64::total_cmp);
        tp.sort_by(f64::total_cmp);
        println!("stream time to first byte, 100-message session:");
        println!(
            "  direct p50 {:.3} ms, proxy p50 {:.3} ms: overhead p50 {:.3} ms, p99 {:.3} ms",
            pct(&td, 0.5),
            pct(&tp, 0.5),
            pct(&tp, 0.5) - pct(&td, 0.5),
            pct(&tp, 0.99) - pct(&td, 0.99)
        );

        }
        if phase("scale") {
            // One instance holding 10,000 sessions, in a fresh process.
            println!("scale (a fresh process; LOAD_SCALE sessions):");
            let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
            let out = std::process::Command::new(exe)
                .env("LOAD_SCALE", "10000")
                .output()
                .unwrap_or_else(|e| panic!("{e}"));
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
        if phase("idle") {
            // Memory per session, each figure in a fresh process (freed
            // memory a process keeps would flatter a later figure): one
            // request each, then either left awake or put to sleep as it
            // goes idle (what `serve.hibernate_seconds` does).
            println!("memory per session (RSS growth over the sessions, each line a fresh process):");
            for (n, len) in [(10_000, 20), (1000, 100)] {
                for mode in ["awake", "asleep"] {
                    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
                    let out = std::process::Command::new(exe)
                        .env("LOAD_MEMORY", format!("{mode},{n},{len}"))
                        .output()
                        .unwrap_or_else(|e| panic!("{e}"));
                    print!("{}", String::from_utf8_lossy(&out.stdout));
                }
            }
        }
    });
}
