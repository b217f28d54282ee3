//! Peer proxies side by side: `ctx serve` beside other proxies (LiteLLM's,
//! Headroom's) in front of one scripted upstream, measured in one run with
//! interleaved rounds (round-robin over the targets, so the machine's noise
//! hits all alike). `scripts/peer-bench.sh` installs the peers, starts
//! everything and runs this; by hand it is two processes:
//!
//! ```sh
//! cargo bench -p context-engine-serve --bench peer -- upstream --listen 127.0.0.1:9100
//! # start the proxies against http://127.0.0.1:9100/v1, then:
//! cargo bench -p context-engine-serve --bench peer -- run --upstream http://127.0.0.1:9100/v1 \
//!     --target ctx=http://127.0.0.1:8787/v1@PID --target litellm=http://127.0.0.1:4000/v1@PID \
//!     --target headroom='!why it is not there' --json result.json
//! ```
//!
//! `upstream` answers `POST /v1/chat/completions` at once (a JSON
//! completion, or a stream when the request says `"stream": true`; both
//! with `usage`, the prompt's tokens estimated as its bytes / 4), with the
//! assistant message last set by `POST /bench/reply` (`"ok"` without one),
//! and counts the requests and bytes it receives (`GET /bench/take` returns
//! and resets them). `run` measures each target and the upstream directly:
//!
//! 1. a bare request (one short user message), sequential, plain and
//!    streamed: latency p50/p99 and what each target adds over direct;
//! 2. real sessions: every corpus transcript (`--corpus`, else
//!    `$CTX_CORPUS_DIR`, else `../shared/corpus`) sent call by call as its
//!    agent did (the whole history before each assistant message, the
//!    recorded assistant message as the upstream's reply, `x-ctx-session`
//!    naming the session): the added latency paired call by call with the
//!    direct call, the bytes the upstream received over the bytes the
//!    client sent, and whether the reply reached the client unchanged
//!    (role, content, tool calls);
//! 3. `--clients` (100) concurrent clients, each replaying a corpus
//!    session in a loop for `--seconds` (5) per target and round:
//!    requests/s, latency p50/p99, errors;
//! 4. each target's CPU time per request (the process given by `@PID` and
//!    its descendants, `/proc/PID/stat`) and its memory (`VmRSS` and
//!    `VmHWM` summed over the same processes) after each phase.
//!
//! Prints one table (rows: measurements; columns: direct, then the
//! targets) and writes the same figures as JSON (`--json`). A target given
//! as `NAME=!REASON` (it could not be installed or started), or one that
//! never answers the warm-up, stays in the table as unavailable with the
//! reason. Exit status 2 when the target named `ctx` failed (unavailable,
//! an error, or a reply changed), 1 when nothing could be measured (no
//! corpus); other targets' failures are reported, not fatal. Without `upstream` or `run` (as `cargo bench` runs every
//! bench), it prints how to run it and exits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use context_engine::message::Role;
use context_engine::transcript::Transcript;
use serde_json::{Value, json};

#[path = "peer/report.rs"]
mod report;
#[path = "peer/upstream.rs"]
mod upstream;

use upstream::{Received, has_tool_calls};

// -------------------------------------------------------------- processes

/// `(CPU ns, VmRSS kB, VmHWM kB)` of `pid` and its descendants (a peer's
/// workers count as the peer); the CPU time of every live thread, from
/// `schedstat` (ns, where `stat`'s ticks are 10 ms).
fn process_tree(pid: u32) -> (u64, u64, u64) {
    let mut parent: HashMap<u32, u32> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command's closing parenthesis: state, then ppid.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, t)| t.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(pp) = ppid {
            parent.insert(p, pp);
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent.iter().filter(|(_, pp)| **pp == p).map(|(c, _)| *c));
        i += 1;
    }
    let (mut cpu, mut rss, mut hwm) = (0, 0, 0);
    for p in tree {
        for task in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            cpu += std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0);
        }
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        for line in status.lines() {
            let kb = || {
                line.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("VmRSS:") {
                rss += kb();
            } else if line.starts_with("VmHWM:") {
                hwm += kb();
            }
        }
    }
    (cpu, rss, hwm)
}

// ----------------------------------------------------------------- targets

/// The key every request carries (`Authorization: Bearer`): LiteLLM's
/// proxy will not start without a master key, and `peer-bench.sh` gives it
/// this one. The upstream takes any key.
const KEY: &str = "sk-peer-bench-5b0d7c1e9a3f4e6d8c2b1a0f9e8d7c6b";

#[derive(Default)]
struct Target {
    name: String,
    url: String,
    pid: Option<u32>,
    /// Why it is not measured, when it is not.
    down: Option<String>,
    /// Why it stopped being measured mid-run (errors in a row), if it did.
    stopped: Option<String>,
    /// Sequential calls that failed in a row.
    streak: u32,
    bare: Vec<f64>,
    bare_stream: Vec<f64>,
    bare_errors: u64,
    bare_cpu_ns: u64,
    /// One latency per session call, in the same order for every target
    /// (NaN where the call failed), to pair with direct's.
    session: Vec<f64>,
    session_errors: u64,
    session_cpu_ns: u64,
    client_bytes: u64,
    upstream_bytes: u64,
    upstream_requests: u64,
    replies: u64,
    changed: u64,
    first_change: Option<String>,
    first_error: Option<String>,
    other_paths: Vec<String>,
    load: Vec<f64>,
    load_done: u64,
    load_errors: u64,
    /// Sessions the clients began (each restart of a transcript is one).
    load_sessions: u64,
    load_seconds: f64,
    load_cpu_ns: u64,
    /// `(phase, VmRSS kB, VmHWM kB)`.
    memory: Vec<(String, u64, u64)>,
}

impl Target {
    fn up(&self) -> bool {
        self.down.is_none() && self.stopped.is_none()
    }

    /// Counts a sequential call's outcome; ten failures in a row stop the
    /// target (a peer that broke would otherwise time out every call).
    fn outcome(&mut self, failed: bool) {
        self.streak = if failed { self.streak + 1 } else { 0 };
        if self.streak >= 10 && self.stopped.is_none() {
            self.stopped = Some(format!(
                "stopped after 10 failures in a row: {}",
                self.first_error.as_deref().unwrap_or("")
            ));
        }
    }

    fn cpu_ns(&self) -> u64 {
        self.pid.map_or(0, |p| process_tree(p).0)
    }

    fn error(&mut self, e: String) {
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }
}

/// `NAME=URL[@PID]`, or `NAME=!REASON` for a peer that is not there.
fn parse_target(spec: &str) -> Target {
    let (name, rest) = spec.split_once('=').unwrap_or((spec, ""));
    let mut t = Target {
        name: name.to_owned(),
        ..Target::default()
    };
    if let Some(reason) = rest.strip_prefix('!') {
        t.down = Some(reason.to_owned());
    } else if let Some((url, pid)) = rest.rsplit_once('@') {
        t.url = url.trim_end_matches('/').to_owned();
        t.pid = pid.parse().ok();
    } else {
        t.url = rest.trim_end_matches('/').to_owned();
    }
    if t.up() && t.url.is_empty() {
        t.down = Some(format!("no URL in --target {spec}"));
    }
    t
}

/// One chat completion; its latency in ms and the reply's body.
async fn call(
    client: &reqwest::Client,
    url: &str,
    session: &str,
    body: Bytes,
) -> Result<(f64, Bytes), String> {
    let t = Instant::now();
    let r = client
        .post(format!("{url}/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {KEY}"))
        .header("x-ctx-session", session)
        .body(body)
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = r.status();
    let reply = r.bytes().await.map_err(|e| format!("read: {e}"))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&reply[..reply.len().min(300)]).into_owned();
        return Err(format!("HTTP {status}: {text}"));
    }
    Ok((ms, reply))
}

async fn take(client: &reqwest::Client, upstream: &str) -> Received {
    let base = upstream.trim_end_matches("/v1");
    let Ok(r) = client.get(format!("{base}/bench/take")).send().await else {
        return Received::default();
    };
    let v: Value = r
        .bytes()
        .await
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    Received {
        requests: v["requests"].as_u64().unwrap_or(0),
        bytes: v["bytes"].as_u64().unwrap_or(0),
        other: v["other"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

async fn set_reply(client: &reqwest::Client, upstream: &str, message: Option<&Value>) {
    let base = upstream.trim_end_matches("/v1");
    let body = message.map_or_else(String::new, Value::to_string);
    let _ = client
        .post(format!("{base}/bench/reply"))
        .body(body)
        .send()
        .await;
}

/// The parts of an assistant message a client acts on: role, text, and
/// each tool call's id, name and arguments (`null` and `""` content alike).
fn essence(message: &Value) -> Value {
    let content = match &message["content"] {
        Value::Null => Value::String(String::new()),
        c => c.clone(),
    };
    let calls: Vec<Value> = message["tool_calls"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| json!([c["id"], c["function"]["name"], c["function"]["arguments"]]))
                .collect()
        })
        .unwrap_or_default();
    json!({"role": message["role"], "content": content, "tool_calls": calls})
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    s
}

// ------------------------------------------------------------------ corpus

/// A corpus session: each call's request body and the assistant message
/// that answered it.
struct Session {
    name: String,
    calls: Vec<(Bytes, Value)>,
}

fn corpus(dir: &PathBuf) -> Vec<Session> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "json" || e == "traj" || e == "jsonl")
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let t = match Transcript::load(&file) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("peer: {} skipped: {e}", file.display());
                continue;
            }
        };
        let m = &t.messages;
        let calls: Vec<(Bytes, Value)> = m
            .iter()
            .enumerate()
            .filter(|(i, x)| x.role == Role::Assistant && *i > 0)
            .map(|(i, x)| {
                let body = json!({"model": "m", "messages": &m[..i]});
                let full = serde_json::to_value(x).unwrap_or_default();
                let mut reply = json!({"role": "assistant", "content": full["content"]});
                if has_tool_calls(&full) {
                    reply["tool_calls"] = full["tool_calls"].clone();
                }
                (Bytes::from(body.to_string()), reply)
            })
            .collect();
        if !calls.is_empty() {
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.push(Session { name, calls });
        }
    }
    out
}

// ------------------------------------------------------------------ phases

struct Options {
    upstream: String,
    rounds: usize,
    bare: usize,
    clients: usize,
    seconds: f64,
    corpus: PathBuf,
    json: Option<PathBuf>,
}

fn client(idle: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(idle)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A bare request until the first success (up to 60 s: a peer may still
/// be starting), then a few more to warm connections; else the target is
/// down with the last error.
async fn warm(client: &reqwest::Client, t: &mut Target, bare: &Bytes) {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(60) {
        match call(client, &t.url, "peer-warm", bare.clone()).await {
            Ok(_) => {
                for _ in 0..20 {
                    let _ = call(client, &t.url, "peer-warm", bare.clone()).await;
                }
                return;
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    t.down = Some(format!("no answer to a bare request: {last}"));
}

fn memory(targets: &mut [Target], phase: &str) {
    for t in targets.iter_mut().filter(|t| t.up()) {
        if let Some(pid) = t.pid {
            let (_, rss, hwm) = process_tree(pid);
            t.memory.push((phase.to_owned(), rss, hwm));
        }
    }
}

async fn bare_phase(client: &reqwest::Client, o: &Options, targets: &mut [Target]) {
    let plain = Bytes::from(
        json!({"model": "m", "messages": [{"role": "user", "content": "Say ok."}]}).to_string(),
    );
    let stream = Bytes::from(
        json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Say ok."}]})
        .to_string(),
    );
    for round in 0..o.rounds {
        for t in targets.iter_mut().filter(|t| t.up()) {
            let cpu0 = t.cpu_ns();
            let session = format!("peer-bare-{round}");
            for _ in 0..o.bare {
                if !t.up() {
                    break;
                }
                match call(client, &t.url, &session, plain.clone()).await {
                    Ok((ms, _)) => {
                        t.bare.push(ms);
                        t.outcome(false);
                    }
                    Err(e) => {
                        t.bare_errors += 1;
                        t.error(e);
                        t.outcome(true);
                    }
                }
            }
            t.bare_cpu_ns += t.cpu_ns().saturating_sub(cpu0);
            for _ in 0..o.bare / 2 {
                if !t.up() {
                    break;
                }
                match call(client, &t.url, &session, stream.clone()).await {
                    Ok((ms, _)) => {
                        t.bare_stream.push(ms);
                        t.outcome(false);
                    }
                    Err(e) => {
                        t.bare_errors += 1;
                        t.error(e);
                        t.outcome(true);
                    }
                }
            }
        }
    }
}

/// Every corpus session call by call, each call sent to every target in
/// turn (the same upstream reply for all), bytes taken from the upstream's
/// record after each.
async fn session_phase(
    client: &reqwest::Client,
    o: &Options,
    sessions: &[Session],
    targets: &mut [Target],
) {
    take(client, &o.upstream).await;
    for round in 0..o.rounds {
        for s in sessions {
            for (body, reply) in &s.calls {
                set_reply(client, &o.upstream, Some(reply)).await;
                let expected = essence(reply);
                for t in targets.iter_mut() {
                    if !t.up() {
                        continue;
                    }
                    let id = format!("peer-{}-{}-{round}", s.name, t.name);
                    let cpu0 = t.cpu_ns();
                    let r = call(client, &t.url, &id, body.clone()).await;
                    t.session_cpu_ns += t.cpu_ns().saturating_sub(cpu0);
                    let got = take(client, &o.upstream).await;
                    t.upstream_bytes += got.bytes;
                    t.upstream_requests += got.requests;
                    for p in got.other {
                        if !t.other_paths.contains(&p) {
                            t.other_paths.push(p);
                        }
                    }
                    match r {
                        Ok((ms, bytes)) => {
                            t.outcome(false);
                            t.session.push(ms);
                            t.client_bytes += body.len() as u64;
                            t.replies += 1;
                            let v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
                            let seen = essence(&v["choices"][0]["message"]);
                            if seen != expected {
                                t.changed += 1;
                                if t.first_change.is_none() {
                                    t.first_change =
                                        Some(format!("{}: sent {expected}, got {seen}", s.name));
                                }
                            }
                        }
                        Err(e) => {
                            t.session.push(f64::NAN);
                            t.session_errors += 1;
                            t.error(format!("{}: {e}", s.name));
                            t.outcome(true);
                        }
                    }
                }
            }
        }
    }
    set_reply(client, &o.upstream, None).await;
}

/// `clients` clients, each replaying a corpus session in a loop (a fresh
/// session id at each restart) until the deadline; in-flight calls finish.
async fn load_round(
    o: &Options,
    sessions: &Arc<Vec<Session>>,
    t: &mut Target,
    round: usize,
) -> (Vec<f64>, u64, f64) {
    let client = client(o.clients);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(o.seconds);
    let mut tasks = Vec::new();
    for c in 0..o.clients {
        let (client, sessions, url, name) = (
            client.clone(),
            Arc::clone(sessions),
            t.url.clone(),
            t.name.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let s = &sessions[c % sessions.len()];
            let mut at = (c / sessions.len() * 7) % s.calls.len();
            let (mut lat, mut errors, mut first, mut cycle) = (Vec::new(), 0u64, None, 0);
            while Instant::now() < deadline {
                let id = format!("peer-load-{name}-{round}-{c}-{cycle}");
                match call(&client, &url, &id, s.calls[at].0.clone()).await {
                    Ok((ms, _)) => lat.push(ms),
                    Err(e) => {
                        errors += 1;
                        first.get_or_insert(e);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                at += 1;
                if at == s.calls.len() {
                    at = 0;
                    cycle += 1;
                }
            }
            (lat, errors, first, cycle + 1)
        }));
    }
    let (mut lat, mut errors) = (Vec::new(), 0);
    for task in tasks {
        if let Ok((l, e, first, sessions)) = task.await {
            lat.extend(l);
            errors += e;
            t.load_sessions += sessions;
            if let Some(f) = first {
                t.error(f);
            }
        }
    }
    (lat, errors, started.elapsed().as_secs_f64())
}

async fn load_phase(o: &Options, sessions: &Arc<Vec<Session>>, targets: &mut [Target]) {
    for round in 0..o.rounds {
        for t in targets.iter_mut().filter(|t| t.up()) {
            eprintln!("peer: {} clients, {} round {round}", o.clients, t.name);
            let cpu0 = t.cpu_ns();
            let (lat, errors, seconds) = load_round(o, sessions, t, round).await;
            t.load_cpu_ns += t.cpu_ns().saturating_sub(cpu0);
            t.load_done += lat.len() as u64;
            t.load.extend(lat);
            t.load_errors += errors;
            t.load_seconds += seconds;
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

async fn run(o: Options, mut targets: Vec<Target>) -> bool {
    let load_before = loadavg();
    let sessions = Arc::new(corpus(&o.corpus));
    if sessions.is_empty() {
        // Nothing measured: the bench's failure, not ctx's.
        eprintln!("peer: no corpus transcripts at {}", o.corpus.display());
        std::process::exit(1);
    }
    let calls: usize = sessions.iter().map(|s| s.calls.len()).sum();
    eprintln!(
        "peer: {} sessions, {calls} calls each round; {} rounds",
        sessions.len(),
        o.rounds
    );
    let client = client(4);
    let bare = Bytes::from(
        json!({"model": "m", "messages": [{"role": "user", "content": "Say ok."}]}).to_string(),
    );
    for t in targets.iter_mut().filter(|t| t.up()) {
        warm(&client, t, &bare).await;
        if let Some(why) = &t.down {
            eprintln!("peer: {} is down: {why}", t.name);
        }
    }
    take(&client, &o.upstream).await;
    memory(&mut targets, report::PHASES[0]);
    eprintln!("peer: bare requests");
    bare_phase(&client, &o, &mut targets).await;
    memory(&mut targets, report::PHASES[1]);
    eprintln!("peer: corpus sessions");
    session_phase(&client, &o, &sessions, &mut targets).await;
    memory(&mut targets, report::PHASES[2]);
    eprintln!("peer: concurrent clients");
    load_phase(&o, &sessions, &mut targets).await;
    memory(&mut targets, report::PHASES[3]);

    let direct = &targets[0];
    let columns: Vec<Value> = targets.iter().map(|t| report::figures(t, direct)).collect();
    let load_after = loadavg();
    println!(
        "peer proxies: {} cores, load average {load_before} before, {load_after} after; {} rounds: {} bare requests each, {} corpus sessions ({calls} calls), {} clients for {} s",
        std::thread::available_parallelism().map_or(0, usize::from),
        o.rounds,
        o.bare,
        sessions.len(),
        o.clients,
        o.seconds
    );
    report::print_table(&columns);
    for c in &columns {
        for key in ["first_error", "other_upstream_paths"] {
            if !c[key].is_null() && c[key] != json!([]) {
                println!("{}: {key}: {}", c["name"].as_str().unwrap_or(""), c[key]);
            }
        }
        if let Some(change) = c["sessions"]["first_change"].as_str() {
            let short: String = change.chars().take(400).collect();
            println!(
                "{}: first changed reply: {short}",
                c["name"].as_str().unwrap_or("")
            );
        }
    }
    let report = json!({
        "machine": {"cores": std::thread::available_parallelism().map_or(0, usize::from),
            "loadavg_before": load_before, "loadavg_after": load_after},
        "options": {"rounds": o.rounds, "bare": o.bare, "clients": o.clients, "seconds": o.seconds,
            "corpus": o.corpus, "sessions": sessions.iter().map(|s| json!({"name": s.name, "calls": s.calls.len()})).collect::<Vec<_>>()},
        "targets": columns,
    });
    if let Some(path) = &o.json {
        match std::fs::write(path, serde_json::to_vec_pretty(&report).unwrap_or_default()) {
            Ok(()) => println!("JSON: {}", path.display()),
            Err(e) => eprintln!("peer: writing {}: {e}", path.display()),
        }
    }
    // `ctx` must be there, answer everything and change no reply.
    targets
        .iter()
        .filter(|t| t.name == "ctx")
        .all(|t| t.up() && t.bare_errors + t.session_errors + t.load_errors + t.changed == 0)
}

const USAGE: &str = "peer: `-- upstream --listen HOST:PORT`, or `-- run --upstream URL --target NAME=URL[@PID]|NAME=!REASON ... [--rounds 3] [--bare 200] [--clients 100] [--seconds 5] [--corpus DIR] [--json PATH]` (see scripts/peer-bench.sh)";

fn main() {
    // `cargo bench` adds `--bench`.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    // reqwest is built without a default crypto provider (the proxy picks
    // ring); the bench speaks plain HTTP but the client wants one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    match args.first().map(String::as_str) {
        Some("upstream") => {
            let listen = value("--listen").unwrap_or_else(|| "127.0.0.1:9100".to_owned());
            rt.block_on(upstream::serve_upstream(&listen));
        }
        Some("run") => {
            let num = |flag: &str, default: f64| {
                value(flag)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(default)
            };
            let Some(upstream) = value("--upstream") else {
                eprintln!("{USAGE}");
                std::process::exit(1);
            };
            let corpus = value("--corpus")
                .or_else(|| std::env::var("CTX_CORPUS_DIR").ok())
                .map_or_else(
                    || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"),
                    PathBuf::from,
                );
            let o = Options {
                upstream: upstream.trim_end_matches('/').to_owned(),
                rounds: num("--rounds", 3.0).max(1.0) as usize,
                bare: num("--bare", 200.0).max(1.0) as usize,
                clients: num("--clients", 100.0).max(1.0) as usize,
                seconds: num("--seconds", 5.0).max(0.5),
                corpus,
                json: value("--json").map(PathBuf::from),
            };
            let mut targets = vec![Target {
                name: "direct".to_owned(),
                url: o.upstream.clone(),
                ..Target::default()
            }];
            targets.extend(
                args.iter()
                    .zip(args.iter().skip(1))
                    .filter(|(f, _)| *f == "--target")
                    .map(|(_, spec)| parse_target(spec)),
            );
            if !rt.block_on(run(o, targets)) {
                std::process::exit(2);
            }
        }
        _ => eprintln!("{USAGE}"),
    }
}
