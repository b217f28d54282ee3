//! The page's cost on the request path (`LOAD_ONLY=page`): the same
//! sequential sessions through one proxy with no page open and with pages
//! open, interleaved in rounds so that both see the same machine. An open
//! page polls the overview, the caller's sessions and the session it shows;
//! the bench polls `LOAD_PAGE_VIEWERS` pages (default 4) every
//! `LOAD_PAGE_POLL_MS` (default 100 ms, 20 times the page's own 2 s), so a
//! cost the page has shows here magnified; `LOAD_PAGE_ROUNDS` (6) rounds of
//! `LOAD_PAGE_CALLS` (500) calls each way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use serde_json::{Value, json};

use super::{body, history, pct};

/// The provider key the bench's client sends: the page shows that
/// identity's sessions.
const KEY: &str = "Bearer sk-bench-page";

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One call with the bench's identity; latency in ms.
async fn call(client: &reqwest::Client, url: &str, session: &str, b: Bytes) -> f64 {
    let t = Instant::now();
    let r = client
        .post(format!("{url}/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", KEY)
        .header("x-ctx-session", session)
        .body(b)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.status().is_success(), "{}", r.status());
    let _ = r.bytes().await;
    t.elapsed().as_secs_f64() * 1e3
}

/// `n` calls: sessions of 100 messages growing by a turn a call, ten calls
/// each, named `{tag}-{s}`.
async fn calls(client: &reqwest::Client, url: &str, tag: &str, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    for s in 0..n.div_ceil(10) {
        let mut h = history(100, 70_000 + s);
        let session = format!("{tag}-{s}");
        for i in 0..10 {
            if i > 0 {
                h.push(json!({"role": "assistant", "content": "ok"}));
                h.push(json!({"role": "user", "content": format!("next step {i}")}));
            }
            out.push(call(client, url, &session, body(&h, false)).await);
        }
    }
    out
}

/// A page open on the proxy at `base`: what its script fetches on each
/// poll, until `stop`. Returns each poll's time in ms.
async fn viewer(base: String, every: Duration, stop: Arc<AtomicBool>) -> Vec<f64> {
    let client = reqwest::Client::new();
    let get = |path: String| {
        let client = client.clone();
        let url = format!("{base}{path}");
        async move {
            let r = client
                .get(url)
                .header("authorization", KEY)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(r.status().is_success(), "{}", r.status());
            let bytes = r.bytes().await.unwrap_or_default();
            serde_json::from_slice::<Value>(&bytes).unwrap_or_default()
        }
    };
    let mut polls = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        get("/ui/api/overview".into()).await;
        let listed = get("/ui/api/sessions".into()).await;
        if let Some(s) = listed["sessions"].as_array().and_then(|s| s.first()) {
            let (scope, id) = (
                s["scope"].as_str().unwrap_or(""),
                s["id"].as_str().unwrap_or(""),
            );
            get(format!("/ui/api/sessions/{scope}/{id}")).await;
        }
        polls.push(t.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(every).await;
    }
    polls
}

/// Prints the calls' latency with and without pages open, same run.
pub async fn page_cost(direct: &str) {
    let (via, _state) = super::proxy(direct).await;
    let base = via.trim_end_matches("/v1").to_owned();
    let client = reqwest::Client::new();
    let rounds = env("LOAD_PAGE_ROUNDS", 6) as usize;
    let per_round = env("LOAD_PAGE_CALLS", 500) as usize;
    let viewers = env("LOAD_PAGE_VIEWERS", 4) as usize;
    let every = Duration::from_millis(env("LOAD_PAGE_POLL_MS", 100));
    calls(&client, &via, "page-warm", 50).await;
    let (mut closed, mut open, mut polls) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        closed.extend(calls(&client, &via, &format!("closed-{r}"), per_round).await);
        let stop = Arc::new(AtomicBool::new(false));
        let pages: Vec<_> = (0..viewers)
            .map(|_| tokio::spawn(viewer(base.clone(), every, Arc::clone(&stop))))
            .collect();
        open.extend(calls(&client, &via, &format!("open-{r}"), per_round).await);
        stop.store(true, Ordering::Relaxed);
        for p in pages {
            polls.extend(p.await.unwrap_or_default());
        }
    }
    for v in [&mut closed, &mut open, &mut polls] {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "the page's cost on the request path ({} calls each way in {rounds} interleaved rounds; \
         {viewers} pages polling every {} ms):",
        closed.len(),
        every.as_millis()
    );
    println!(
        "  no page open   p50 {:.3} ms  p99 {:.3} ms",
        pct(&closed, 0.5),
        pct(&closed, 0.99)
    );
    println!(
        "  pages open     p50 {:.3} ms  p99 {:.3} ms",
        pct(&open, 0.5),
        pct(&open, 0.99)
    );
    println!(
        "  added by the pages: p50 {:+.3} ms ({:.2}x), p99 {:+.3} ms; {} polls, each p50 {:.3} ms",
        pct(&open, 0.5) - pct(&closed, 0.5),
        pct(&open, 0.5) / pct(&closed, 0.5).max(1e-9),
        pct(&open, 0.99) - pct(&closed, 0.99),
        polls.len(),
        pct(&polls, 0.5)
    );
}
