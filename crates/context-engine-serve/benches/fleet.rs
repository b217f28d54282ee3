//! Fleet load generator: 200 concurrent sessions for `FLEET_SECONDS`
//! (default 60) across two proxy instances sharing one session store,
//! against an upstream that answers at once; the same load straight to the
//! upstream first, for the added latency. Stores compared in one run: none
//! (each instance keeps its own sessions; the no-store baseline), SQLite
//! (a file) and Postgres (`CTX_TEST_POSTGRES`, default
//! `postgres://postgres@127.0.0.1:5432/test`; a database of its own,
//! dropped after).
//!
//! Sessions grow like an agent's (a tool call and a ~600-byte result per
//! call) in a 12k window, so they compact; after the run every compaction
//! the proxies counted must be in the store with every archived message
//! (no lost archive row). Prints client latency p50/p99, added latency
//! (through the proxy minus direct, same percentile), throughput, errors
//! by kind, the store's own time per call, and CPU time per request: this
//! process (generator, upstream and both proxies; minus `direct`'s, the
//! proxies' own) and the Postgres backends serving the bench's database
//! (from `/proc`, by process title).
//!
//! `FLEET_THINK_MS` (default 0) is each session's pause between its
//! calls. At 0 the load is closed-loop: 200 sessions keep the machine
//! saturated and latency is mostly queueing (Little's law: 200 in flight /
//! throughput), which a 2-core machine shows as hundreds of milliseconds
//! whatever the store. An agent waits for its model between calls, so a
//! pause (e.g. 500 ms: 400 requests/s from 200 sessions) measures what
//! a request costs at a rate the machine sustains.
//!
//! `FLEET_STICKY=1` keeps each session on one instance (a load balancer
//! with affinity: the cached copy stays current, no reload) instead of
//! alternating on every call.
//!
//! `FLEET_CALLS=N` first profiles each store's calls one at a time, N of
//! each, without load (a request's store calls by themselves; for
//! Postgres also the same read on a plain client, no pool and no hop to
//! the store's runtime, and the backends' CPU per call).
//!
//! `FLEET_JITTER=1` makes sessions differ as agents do: each pause drawn
//! from 0.5–1.5 times `FLEET_THINK_MS` (a fixed sequence per session) and
//! each session's tool results 6–18 lines long (12 without). Without it the sessions, which start
//! within one pause and grow alike, stay in step and all compact within
//! the same second or two: a burst of 200 compactions that is the whole
//! tail of every mode. Agents' calls do not keep in step like that.
//!
//! Every mode prints where the proxies' time went (`phase` lines: the
//! session driver's and the Postgres store's `ctx_timing` trace events,
//! a compaction's own time, p50/p99/max in µs) and which requests are in
//! its tail (at or above its p99: how many overlap a compaction of their
//! session, reloaded or archived, and when in the run they fell, beside
//! the compactions per second).
//!
//! `FLEET_DURABLE=1` makes Postgres record writes wait for the disk flush
//! (`store.durable_records`; off by default).
//!
//! `cargo bench -p context-engine-serve --bench fleet` (`FLEET_SECONDS`,
//! `FLEET_SESSIONS`, `FLEET_THINK_MS`, `FLEET_STICKY`, `FLEET_JITTER`, `FLEET_CALLS`,
//! `FLEET_DURABLE`,
//! `FLEET_MODES=direct,none,sqlite,postgres`). Run it on a quiet machine.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use context_engine::engine::ContextEngine;
use context_engine::host::HostOptions;
use context_engine::plugin::EngineContext;
use context_engine::store::{
    Batch, CompactionRecord, Entry, HistoryWrite, SearchHit, SessionStore, Since, StoreError,
    Versioned,
};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine_postgres::{PgOptions, PgStore};
use context_engine_serve::{AppState, ServeOptions, SessionContext, UpstreamOptions};
use context_engine_sqlite::SqliteStore;
use serde_json::{Value, json};
use tokio::net::TcpListener;

const REPLY: &str = r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9000,"completion_tokens":1,"total_tokens":9001}}"#;

/// A store that times every call.
struct Timed {
    inner: Arc<dyn SessionStore>,
    times: Mutex<Vec<f64>>,
}

impl Timed {
    fn time<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        self.times
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ms);
        out
    }
}

impl SessionStore for Timed {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn commit(&self, s: &str, b: &Batch) -> Result<(), StoreError> {
        self.time(|| self.inner.commit(s, b))
    }
    fn load_state(&self, s: &str) -> Result<Option<Value>, StoreError> {
        self.time(|| self.inner.load_state(s))
    }
    fn resolve(&self, s: Option<&str>, h: &str) -> Result<Option<Entry>, StoreError> {
        self.inner.resolve(s, h)
    }
    fn search(&self, s: Option<&str>, q: &str, n: usize) -> Result<Vec<SearchHit>, StoreError> {
        self.inner.search(s, q, n)
    }
    fn compactions(&self, s: &str) -> Result<Vec<CompactionRecord>, StoreError> {
        self.inner.compactions(s)
    }
    fn handles(&self, s: &str) -> Result<Vec<String>, StoreError> {
        self.inner.handles(s)
    }
    fn delete_session(&self, s: &str) -> Result<(), StoreError> {
        self.inner.delete_session(s)
    }
    fn version(&self, s: &str) -> Result<Option<u64>, StoreError> {
        self.time(|| self.inner.version(s))
    }
    fn load_versioned(&self, s: &str) -> Result<Option<Versioned>, StoreError> {
        self.time(|| self.inner.load_versioned(s))
    }
    fn commit_versioned(
        &self,
        s: &str,
        v: u64,
        b: &[Batch],
        st: &Value,
        h: Option<HistoryWrite<'_>>,
    ) -> Result<u64, StoreError> {
        self.time(|| self.inner.commit_versioned(s, v, b, st, h))
    }
    fn load_versioned_since(&self, s: &str, known: u64) -> Result<Since, StoreError> {
        self.time(|| self.inner.load_versioned_since(s, known))
    }
    fn load_versioned_after(&self, s: &str, known: u64, held: usize) -> Result<Since, StoreError> {
        self.time(|| self.inner.load_versioned_after(s, known, held))
    }
    fn try_claim(
        &self,
        s: &str,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.time(|| self.inner.try_claim(s, job, owner, ttl))
    }
    fn release(&self, s: &str, job: &str, owner: &str) -> Result<(), StoreError> {
        self.time(|| self.inner.release(s, job, owner))
    }
}

/// One traced event: when (since the bench started), its kind (target
/// and message) and its fields.
#[derive(Clone, Debug)]
struct Traced {
    at: Duration,
    kind: String,
    session: Option<String>,
    fields: Vec<(&'static str, u64)>,
}

/// A tracing subscriber that keeps the proxies' timing events
/// (`ctx_timing::*`, trace level) and their `compacted` info events, for
/// the per-phase breakdown and the tail analysis.
struct Recorder {
    epoch: Instant,
    events: Mutex<Vec<Traced>>,
}

struct Visit<'a>(&'a mut Traced);

impl tracing::field::Visit for Visit<'_> {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.fields.push((field.name(), value));
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.fields.push((field.name(), value.max(0) as u64));
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        // Milliseconds kept as microseconds.
        self.0
            .fields
            .push((field.name(), (value * 1e3).max(0.0) as u64));
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.fields.push((field.name(), u64::from(value)));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "session" {
            self.0.session = Some(value.to_owned());
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.0.kind.push_str(&format!(" {value:?}")),
            "session" => self.0.session = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.is_event()
            && (m.target().starts_with("ctx_timing")
                || (m.target().starts_with("context_engine_serve::handlers")
                    && *m.level() <= tracing::Level::INFO))
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        let mut t = Traced {
            at: self.epoch.elapsed(),
            kind: e.metadata().target().to_owned(),
            session: None,
            fields: Vec::new(),
        };
        e.record(&mut Visit(&mut t));
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// p50 / p99 / max of each field of each kind of event in `events`.
fn phase_report(events: &[Traced]) {
    let mut by: std::collections::BTreeMap<(String, &'static str), Vec<f64>> = Default::default();
    for e in events {
        // A step that archived (a compaction) apart from the others.
        let kind = if e.fields.iter().any(|(k, v)| *k == "archived" && *v == 1) {
            format!("{} (archived)", e.kind)
        } else {
            e.kind.clone()
        };
        for (name, v) in &e.fields {
            if name.ends_with("_us") || name.ends_with("_ms") {
                by.entry((kind.clone(), name)).or_default().push(*v as f64);
            }
        }
    }
    for ((kind, name), mut v) in by {
        v.sort_by(f64::total_cmp);
        let unit = if name.ends_with("_ms") {
            "µs (from ms)"
        } else {
            "µs"
        };
        println!(
            "           phase {kind} {name}: n {}, p50 {:.0}, p99 {:.0}, max {:.0} {unit}",
            v.len(),
            pct(&v, 0.5),
            pct(&v, 0.99),
            v.last().copied().unwrap_or(0.0)
        );
    }
}

/// Which requests are in the tail (at or above the mode's p99): how many
/// overlap a compaction or a reload of their session, how their store
/// phases add up, and when in the run they fell (tail requests per second,
/// beside compactions per second: a burst of compactions shows as both).
fn tail_report(requests: &[(usize, Duration, f64)], events: &[Traced], tag: &str) {
    let mut lat: Vec<f64> = requests.iter().map(|r| r.2).collect();
    lat.sort_by(f64::total_cmp);
    let p99 = pct(&lat, 0.99);
    // Events by session (the bench's number), in time order.
    let mut by: std::collections::HashMap<usize, Vec<&Traced>> = Default::default();
    for e in events {
        let Some(s) = e.session.as_deref() else {
            continue;
        };
        let s = s.trim_matches('"');
        let s = s.rsplit_once(':').map_or(s, |(_, id)| id);
        if let Some(n) = s.strip_prefix(tag).and_then(|n| n.parse().ok()) {
            by.entry(n).or_default().push(e);
        }
    }
    let field = |e: &Traced, name: &str| e.fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let (mut tail, mut compacting, mut reloading, mut archiving) = (0, 0, 0, 0);
    let (mut store_us, mut phases_us) = (0u64, 0u64);
    let secs = requests.iter().map(|r| r.1.as_secs()).max().unwrap_or(0) as usize + 1;
    let first = requests.iter().map(|r| r.1.as_secs()).min().unwrap_or(0) as usize;
    let mut tail_at = vec![0usize; secs];
    let mut compacted_at = vec![0usize; secs];
    for e in events.iter().filter(|e| e.kind.contains("compacted")) {
        if let Some(c) = compacted_at.get_mut(e.at.as_secs() as usize) {
            *c += 1;
        }
    }
    for (s, at, ms) in requests {
        if *ms < p99 {
            continue;
        }
        tail += 1;
        tail_at[at.as_secs() as usize] += 1;
        let end = *at + Duration::from_secs_f64(ms / 1e3);
        let during: Vec<&&Traced> = by
            .get(s)
            .map(|v| v.iter().filter(|e| e.at >= *at && e.at <= end).collect())
            .unwrap_or_default();
        if during.iter().any(|e| e.kind.contains("compacted")) {
            compacting += 1;
        }
        for e in &during {
            if field(e, "reloaded") == Some(1) {
                reloading += 1;
            }
            if field(e, "archived") == Some(1) {
                archiving += 1;
            }
            store_us += field(e, "load_us").unwrap_or(0) + field(e, "commit_us").unwrap_or(0);
            phases_us += ["load_us", "rebuild_us", "step_us", "record_us", "commit_us"]
                .iter()
                .filter_map(|k| field(e, k))
                .sum::<u64>();
        }
    }
    let tail_ms: f64 = requests.iter().filter(|r| r.2 >= p99).map(|r| r.2).sum();
    println!(
        "           tail (>= p99 {p99:.1} ms): {tail} requests, {compacting} overlap a compaction of their session, {reloading} reloaded, {archiving} archived; of their {:.0} ms in all, store calls {:.0} ms, all traced phases {:.0} ms",
        tail_ms,
        store_us as f64 / 1e3,
        phases_us as f64 / 1e3
    );
    let show = |v: &[usize]| {
        v[first.min(v.len())..]
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("           tail requests per second:  {}", show(&tail_at));
    println!(
        "           compactions per second:    {}",
        show(&compacted_at)
    );
}

async fn upstream() -> String {
    let app = Router::new().route(
        "/v1/chat/completions",
        // The body is read to the end before answering, as a real
        // provider does: a server that answers first closes the connection
        // while the client still sends, and the client sees a broken pipe
        // or a connection closed before the answer (the "unexplained"
        // errors of earlier runs).
        post(|body: Bytes| async move {
            drop(body);
            Response::builder()
                .header("content-type", "application/json")
                .body(Body::from(REPLY))
                .unwrap_or_default()
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

async fn proxy(url: &str, store: Option<Arc<dyn SessionStore>>) -> (String, AppState) {
    let counter: Arc<dyn TokenCounter> =
        Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
    let c = Arc::clone(&counter);
    let factory =
        move |_: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
            Ok(Box::new(
                EngineContext::new(Arc::clone(&c), 12_000).into_compressor(),
            ))
        };
    let ctx = SessionContext {
        factory: Arc::new(factory),
        counter,
        host: HostOptions::default(),
        blocking: false,
    };
    let options = ServeOptions::new(UpstreamOptions::new(url))
        .with_sessions(100_000, Duration::from_secs(3600))
        .with_store(store);
    let state = AppState::new(options, ctx).unwrap_or_else(|e| panic!("{e}"));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let s = state.clone();
    tokio::spawn(
        async move { context_engine_serve::serve(listener, s, std::future::pending()).await },
    );
    (format!("http://{addr}/v1"), state)
}

/// The agent's history after `calls` calls of session `salt`.
fn grow(h: &mut Vec<Value>, i: usize, salt: usize, lines: usize) {
    h.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"), "type": "function",
        "function": {"name": "bash", "arguments": format!("{{\"command\":\"sed -n {i},{}p src/parser.py\"}}", i + 20)}}]}));
    let out: String = (0..lines)
        .map(|j| {
            format!(
                "{:>4}     token = self.lexer.next_token({j})  # {salt}\n",
                i * 12 + j
            )
        })
        .collect();
    h.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": out}));
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// What went wrong with one request, as a kind to count (a status and
/// the start of its body, or the transport error's class and cause).
fn error_kind(e: &reqwest::Error) -> String {
    let class = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else if e.is_request() {
        "request"
    } else {
        "other"
    };
    let mut cause = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    format!("{class}: {cause}")
}

/// One mode's load: sorted latencies (ms), requests per second, errors by
/// kind.
struct Outcome {
    latencies: Vec<f64>,
    /// Each request: session, when it started (since `epoch`), latency ms.
    requests: Vec<(usize, Duration, f64)>,
    rps: f64,
    errors: std::collections::BTreeMap<String, usize>,
}

/// The load's shape (see the module docs for the knobs).
#[derive(Clone, Copy)]
struct Shape {
    sessions: usize,
    secs: u64,
    think: Duration,
    sticky: bool,
    jitter: bool,
}

/// Runs the load against `urls` (sessions alternate between them), each
/// session pausing `think` between its calls.
async fn load(urls: &[String], shape: Shape, tag: &str, epoch: Instant) -> Outcome {
    let Shape {
        sessions,
        secs,
        think,
        sticky,
        jitter,
    } = shape;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(sessions)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let end = started + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for s in 0..sessions {
        let (client, urls, tag) = (client.clone(), urls.to_vec(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            // Spread the sessions' first calls over one pause.
            tokio::time::sleep(think.mul_f64(s as f64 / sessions as f64)).await;
            let mut h = vec![
                json!({"role": "system", "content": "You are a careful coding agent."}),
                json!({"role": "user", "content": format!("Session {s}: fix the failing test in tests/test_parser.py")}),
            ];
            let mut lat = Vec::new();
            let mut errors: Vec<String> = Vec::new();
            // With jitter, sessions' results differ in size too (6–18
            // lines, 12 on average), so they reach the window at different
            // calls.
            let lines = if jitter { 6 + (s * 7919) % 13 } else { 12 };
            let mut i = 0;
            while Instant::now() < end {
                // Alternating instances on every call (the worst case:
                // every call reloads), or a session per instance.
                let url = if sticky { &urls[s % urls.len()] } else { &urls[i % urls.len()] };
                let body = serde_json::to_vec(&json!({"model": "m", "messages": &h})).unwrap_or_default();
                let t = Instant::now();
                let outcome = match client
                    .post(format!("{url}/chat/completions"))
                    .header("content-type", "application/json")
                    .header("x-ctx-session", format!("{tag}-{s}"))
                    .body(Bytes::from(body))
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => match r.bytes().await {
                        Ok(_) => None,
                        Err(e) => Some(error_kind(&e)),
                    },
                    Ok(r) => {
                        let status = r.status();
                        let text = r.text().await.unwrap_or_default();
                        Some(format!("status {status}: {}", text.chars().take(120).collect::<String>()))
                    }
                    Err(e) => Some(error_kind(&e)),
                };
                lat.push((t.duration_since(epoch), t.elapsed().as_secs_f64() * 1e3));
                if let Some(why) = outcome {
                    errors.push(format!("{why} (request {i})"));
                }
                grow(&mut h, i, s, lines);
                i += 1;
                if !think.is_zero() {
                    // With jitter, each pause is drawn from 0.5–1.5 times
                    // the pause (a fixed sequence per session), so the
                    // sessions drift apart instead of compacting in step.
                    let pause = if jitter {
                        let mut x = (s as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                        x ^= x >> 31;
                        x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
                        x ^= x >> 29;
                        think.mul_f64(0.5 + (x % 1000) as f64 / 1000.0)
                    } else {
                        think
                    };
                    tokio::time::sleep(pause).await;
                }
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut requests = Vec::new();
    let mut errors = std::collections::BTreeMap::new();
    for (s, t) in tasks.into_iter().enumerate() {
        let (lat, e) = t.await.unwrap_or_default();
        all.extend(lat.iter().map(|(_, ms)| *ms));
        requests.extend(lat.into_iter().map(|(at, ms)| (s, at, ms)));
        for why in e {
            // The kind without the request number.
            let kind = why
                .rsplit_once(" (request")
                .map_or(why.as_str(), |(k, _)| k)
                .to_owned();
            *errors.entry(kind).or_insert(0) += 1;
        }
    }
    let rps = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    Outcome {
        latencies: all,
        requests,
        rps,
        errors,
    }
}

/// CPU seconds (user + system, clock ticks of 10 ms) in a `/proc/<pid>/stat`.
fn stat_seconds(stat: &str) -> f64 {
    // Fields after the command's closing parenthesis: state is the first,
    // utime the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (n(11) + n(12)) / 100.0
}

/// CPU seconds of this process.
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat").map_or(0.0, |s| stat_seconds(&s))
}

/// CPU seconds per process of the Postgres backends serving database `db`
/// (their process title names it), by pid.
fn backend_seconds(db: &str) -> std::collections::HashMap<String, f64> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(db))
        })
        .filter_map(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                stat_seconds(&stat),
            ))
        })
        .collect()
}

/// Per-call profile of a store, one call at a time (no load): what a
/// request's store calls cost by themselves. p50 in µs of each kind, and
/// the backends' CPU per call when `db` names a Postgres database.
fn profile(store: &dyn SessionStore, n: usize, db: Option<&str>) {
    let sid = "profile";
    let segment = format!("{{\"keep\":{{}},\"pad\":\"{}\"}}", "x".repeat(600));
    let version = store
        .commit_versioned(
            sid,
            0,
            &[],
            &json!({"n": 0}),
            Some(HistoryWrite::replace(std::slice::from_ref(&segment))),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let segments = 1usize;
    type Step<'a> = (&'static str, Box<dyn FnMut() + 'a>);
    let version_cell = std::cell::Cell::new(version);
    let segments_cell = std::cell::Cell::new(segments);
    let archive_cell = std::cell::Cell::new(0u64);
    let append = [segment];
    // One segment more, the history kept bounded as the server does.
    let write_at = |keep: usize| {
        if keep >= 64 {
            HistoryWrite::replace(&append)
        } else {
            HistoryWrite {
                keep,
                append: &append,
            }
        }
    };
    let mut steps: Vec<Step<'_>> = vec![
        (
            "version",
            Box::new(|| {
                let _ = store.version(sid);
            }),
        ),
        (
            "load_versioned_since (unchanged)",
            Box::new(|| {
                let _ = store.load_versioned_since(sid, version_cell.get());
            }),
        ),
        (
            "commit_versioned + 1 segment",
            Box::new(|| {
                let keep = segments_cell.get();
                let write = write_at(keep);
                let v = store
                    .commit_versioned(sid, version_cell.get(), &[], &json!({"n": 1}), Some(write))
                    .unwrap_or_else(|e| panic!("{e}"));
                version_cell.set(v);
                segments_cell.set(if keep >= 64 { 1 } else { keep + 1 });
            }),
        ),
        (
            "commit_versioned + 1 segment + an archive of 30 messages (a compaction)",
            Box::new(|| {
                let keep = segments_cell.get();
                let write = write_at(keep);
                let n = archive_cell.get();
                archive_cell.set(n + 1);
                let span: Vec<context_engine::Message> = (0..30)
                    .map(|j| {
                        context_engine::Message::user(format!(
                            "archived {n}.{j}: {}",
                            "token = self.lexer.next_token() ".repeat(20)
                        ))
                    })
                    .collect();
                let mut batch = Batch::new();
                let summary = [context_engine::Message::user(format!("summary {n}"))];
                batch.compaction(
                    &span,
                    &summary,
                    &context_engine::store::CompactionInfo::new(n + 1, "preflight", "bench"),
                );
                let v = store
                    .commit_versioned(
                        sid,
                        version_cell.get(),
                        &[batch],
                        &json!({"n": 3}),
                        Some(write),
                    )
                    .unwrap_or_else(|e| panic!("{e}"));
                version_cell.set(v);
                segments_cell.set(if keep >= 64 { 1 } else { keep + 1 });
            }),
        ),
        (
            "commit_versioned, no history (usage)",
            Box::new(|| {
                let v = store
                    .commit_versioned(sid, version_cell.get(), &[], &json!({"n": 2}), None)
                    .unwrap_or_else(|e| panic!("{e}"));
                version_cell.set(v);
            }),
        ),
    ];
    for (name, step) in &mut steps {
        let pg0 = db.map(backend_seconds).unwrap_or_default();
        let mut times: Vec<f64> = (0..n)
            .map(|_| {
                let t = Instant::now();
                step();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        let pg: f64 = db
            .map(|d| {
                backend_seconds(d)
                    .iter()
                    .map(|(pid, t)| t - pg0.get(pid).copied().unwrap_or(0.0))
                    .sum()
            })
            .unwrap_or(0.0);
        times.sort_by(f64::total_cmp);
        println!(
            "           call {name}: p50 {:.0} µs, p99 {:.0} µs{}",
            pct(&times, 0.5),
            pct(&times, 0.99),
            if db.is_some() {
                format!(", backend cpu {:.0} µs", pg / n as f64 * 1e6)
            } else {
                String::new()
            }
        );
    }
    let _ = store.delete_session(sid);
}

/// The same one-row read as `version`, on a plain client of this runtime
/// (no pool, no hop to the store's runtime): the round trip alone.
async fn raw_round_trip(url: &str, n: usize) {
    let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await else {
        return;
    };
    tokio::spawn(conn);
    let Ok(stmt) = client
        .prepare("SELECT version FROM ctx_state WHERE session = $1")
        .await
    else {
        return;
    };
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let _ = client.query_opt(&stmt, &[&"profile"]).await;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "           call raw round trip (same read, plain client, no pool or runtime hop): p50 {:.0} µs, p99 {:.0} µs",
        pct(&times, 0.5),
        pct(&times, 0.99)
    );
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn main() {
    let secs: u64 = std::env::var("FLEET_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let sessions: usize = std::env::var("FLEET_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let think = Duration::from_millis(
        std::env::var("FLEET_THINK_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let sticky = std::env::var("FLEET_STICKY").is_ok_and(|v| v == "1");
    let jitter = std::env::var("FLEET_JITTER").is_ok_and(|v| v == "1");
    let calls: usize = std::env::var("FLEET_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let modes =
        std::env::var("FLEET_MODES").unwrap_or_else(|_| "direct,none,sqlite,postgres".into());
    let recorder = Arc::new(Recorder {
        epoch: Instant::now(),
        events: Mutex::new(Vec::new()),
    });
    let _ = tracing::subscriber::set_global_default(Arc::clone(&recorder));
    let epoch = recorder.epoch;
    // The clients use reqwest's rustls without a built-in provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(64)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async move {
        let up = upstream().await;
        let mut direct: Option<(Vec<f64>, f64)> = None;
        println!(
            "{sessions} sessions, {secs} s per mode, pause {} ms between a session's calls, two instances per store, {}",
            think.as_millis(),
            if sticky { "each session on one instance" } else { "each session alternating between them" }
        );
        if jitter {
            println!("sessions differ (FLEET_JITTER=1): pauses 0.5-1.5 times the pause, results of 6-18 lines");
        }
        for mode in modes.split(',').map(str::to_owned) {
            let mode = mode.as_str();
            let dir = std::env::temp_dir().join(format!("ctx-fleet-bench-{}", std::process::id()));
            let mut pg_db = None;
            let store: Option<Arc<dyn SessionStore>> = match mode {
                "direct" | "none" => None,
                "sqlite" => {
                    std::fs::create_dir_all(&dir).unwrap_or_default();
                    Some(Arc::new(SqliteStore::open(&dir.join("store.db")).unwrap_or_else(|e| panic!("{e}"))))
                }
                "postgres" => {
                    let admin = std::env::var("CTX_TEST_POSTGRES")
                        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
                    let name = format!("ctx_bench_{}", std::process::id());
                    let base = admin.rsplit_once('/').map_or(admin.clone(), |(b, _)| b.to_owned());
                    let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
                        .await
                        .unwrap_or_else(|e| panic!("no PostgreSQL at {admin}: {e}"));
                    tokio::spawn(conn);
                    let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).await;
                    client.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap_or_else(|e| panic!("{e}"));
                    pg_db = Some((client, name.clone()));
                    let opts = PgOptions::new(format!("{base}/{name}"))
                        .with_pool_size(32)
                        .with_durable_records(std::env::var("FLEET_DURABLE").is_ok_and(|v| v == "1"));
                    // As `ctx serve` starts: connected, and the pool warmed.
                    let store = tokio::task::spawn_blocking(move || {
                        let store = PgStore::connect(&opts)?;
                        store.warm().map(|_| store)
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .unwrap_or_else(|e| panic!("{e}"));
                    Some(Arc::new(store))
                }
                other => panic!("unknown mode {other}"),
            };
            if calls > 0
                && let Some(store) = store.clone()
            {
                println!("{mode:>9}: store calls one at a time ({calls} each, no load)");
                let db = pg_db.as_ref().map(|(_, n)| n.clone());
                let d = db.clone();
                tokio::task::spawn_blocking(move || profile(store.as_ref(), calls, d.as_deref()))
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                if let Some(name) = db {
                    let admin = std::env::var("CTX_TEST_POSTGRES")
                        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
                    let base = admin.rsplit_once('/').map_or(admin.clone(), |(b, _)| b.to_owned());
                    raw_round_trip(&format!("{base}/{name}"), calls).await;
                }
            }
            let timed = store.map(|s| Arc::new(Timed { inner: s, times: Mutex::new(Vec::new()) }));
            let (urls, states) = if mode == "direct" {
                (vec![up.clone()], Vec::new())
            } else {
                let as_store = || timed.clone().map(|t| t as Arc<dyn SessionStore>);
                let a = proxy(&up, as_store()).await;
                let b = proxy(&up, as_store()).await;
                (vec![a.0.clone(), b.0.clone()], vec![a.1, b.1])
            };
            // With no shared store the instances cannot share sessions:
            // each session stays on one.
            let urls_for = if mode == "none" { vec![urls[0].clone()] } else { urls.clone() };
            let db_name = pg_db.as_ref().map(|(_, n): &(tokio_postgres::Client, String)| n.clone()).unwrap_or_else(|| "-".into());
            let (cpu0, pg0) = (cpu_seconds(), backend_seconds(&db_name));
            recorder.events.lock().unwrap_or_else(|e| e.into_inner()).clear();
            let Outcome { latencies: lat, requests, rps, errors } = load(&urls_for, Shape { sessions, secs, think, sticky, jitter }, mode, epoch).await;
            let events = std::mem::take(&mut *recorder.events.lock().unwrap_or_else(|e| e.into_inner()));
            let cpu = cpu_seconds() - cpu0;
            let pg: f64 = if pg_db.is_some() {
                backend_seconds(&db_name)
                    .iter()
                    .map(|(pid, t)| t - pg0.get(pid).copied().unwrap_or(0.0))
                    .sum()
            } else {
                0.0
            };
            let n = lat.len().max(1) as f64;
            let (p50, p99) = (pct(&lat, 0.5), pct(&lat, 0.99));
            let added = direct
                .as_ref()
                .map(|(d, _)| format!("added p50 {:.2} ms, p99 {:.2} ms", p50 - pct(d, 0.5), p99 - pct(d, 0.99)))
                .unwrap_or_default();
            let error_count: usize = errors.values().sum();
            println!(
                "{mode:>9}: {} requests, {rps:.0} req/s, errors {error_count}, p50 {p50:.2} ms, p99 {p99:.2} ms {added}",
                lat.len()
            );
            for (kind, count) in &errors {
                println!("           error x{count}: {kind}");
            }
            let own = direct
                .as_ref()
                .map(|(_, d)| format!(" (proxies' own ~{:.0} µs)", (cpu / n - d) * 1e6))
                .unwrap_or_default();
            println!(
                "           cpu per request: this process {:.0} µs{own}, postgres backends {:.0} µs",
                cpu / n * 1e6,
                pg / n * 1e6
            );
            if mode == "direct" {
                direct = Some((lat, cpu / n));
                continue;
            }
            phase_report(&events);
            tail_report(&requests, &events, &format!("{mode}-"));
            let (mut compactions, mut fallbacks) = (0, 0);
            for s in &states {
                let text = s.metrics().encode();
                compactions += metric(&text, "ctx_compactions_total");
                fallbacks += metric(&text, "ctx_fallbacks_total");
            }
            println!("           compactions {compactions}, fallbacks {fallbacks}");
            if let Some(t) = &timed {
                let mut times = t.times.lock().unwrap_or_else(|e| e.into_inner()).clone();
                times.sort_by(f64::total_cmp);
                println!(
                    "           store: {:.1} calls per request, per call p50 {:.3} ms, p99 {:.3} ms; per request ~{:.2} ms",
                    times.len() as f64 / lat.len().max(1) as f64,
                    pct(&times, 0.5),
                    pct(&times, 0.99),
                    times.iter().sum::<f64>() / lat.len().max(1) as f64,
                );
                // No lost archive row: every compaction counted is recorded,
                // and every record's messages are there.
                let store = Arc::clone(&t.inner);
                let tag = mode.to_owned();
                let (records, missing, sizes) = tokio::task::spawn_blocking(move || {
                    let (mut records, mut missing) = (0u64, 0u64);
                    // State bytes, history bytes, segments, summed.
                    let mut sizes = (0usize, 0usize, 0usize);
                    for s in 0..sessions {
                        let sid = format!("-:{tag}-{s}");
                        if let Ok(Some(v)) = store.load_versioned(&sid) {
                            sizes.0 += v.state.to_string().len();
                            sizes.1 += v.history.iter().map(String::len).sum::<usize>();
                            sizes.2 += v.history.len();
                        }
                        for r in store.compactions(&sid).unwrap_or_default() {
                            records += 1;
                            // Every message of the span, counted against
                            // the span the compaction recorded (less the
                            // pinned ask the summary kept, if in it).
                            let span = r.end - r.start;
                            match store.resolve(Some(&sid), &r.handle) {
                                Ok(Some(e)) if e.messages.len() == span || e.messages.len() + 1 == span => {}
                                _ => missing += 1,
                            }
                        }
                    }
                    (records, missing, sizes)
                })
                .await
                .unwrap_or_default();
                let per = |n: usize| n / sessions.max(1);
                println!(
                    "           record per session at the end: state {} B, history {} B in {} segments",
                    per(sizes.0),
                    per(sizes.1),
                    per(sizes.2)
                );
                println!("           archive: {records} compaction records for {compactions} compactions, {missing} spans missing or short");
                assert_eq!(records, compactions, "a compaction was lost");
                assert_eq!(missing, 0, "an archived span was lost");
                assert_eq!(error_count, 0, "errors");
            }
            drop(states);
            if let Some((client, name)) = pg_db {
                drop(timed);
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    });
}
