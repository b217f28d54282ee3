#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `ctx serve`'s page at `/ui`, in headless Chromium: the real binary with
//! a session store in memory and a scripted upstream; two identities drive
//! a session each (one long enough to compact). The page shows what
//! `/metrics` reports and the bill it makes, one chart point per call, the
//! compaction's summary beside the messages it replaced, the last call's
//! request message by message; each identity sees only its own sessions,
//! the operator's token all; no console error.

#[path = "common/browser.rs"]
mod browser;
mod common;

use std::sync::Arc;
use std::time::Instant;

use browser::Browser;
use common::TempDir;
use context_engine_testkit::serve::{Serve, Spawn};
use context_engine_testkit::upstream::{Script, start_upstream};
use serde_json::{Value, json};

const OPERATOR: &str = "operator-secret-7";

/// Starts `ctx serve` in front of `upstream` with a store in memory and
/// the operator token from the environment; waits until it is healthy.
async fn spawn(dir: &std::path::Path, upstream: &str) -> Serve {
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "serve:\n  upstream:\n    url: {upstream}\n  ui:\n    operator_token_env: CTX_E2E_OPERATOR\n"
        ),
    )
    .unwrap();
    Spawn::new(env!("CARGO_BIN_EXE_ctx"))
        .args(["--context-length", "2000"])
        .args(["--store", ":memory:", "--config"])
        .arg(&config)
        .env("CTX_LOG", "warn")
        .env("CTX_E2E_OPERATOR", OPERATOR)
        .start()
        .await
}

/// One chat call of session `session` as the holder of `key`.
async fn call(instance: &Serve, key: &str, session: &str, messages: &[Value]) {
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", instance.addr))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .header("x-ctx-session", session)
        .body(json!({"model": "m", "messages": messages}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
}

/// The sum of `name`'s samples in the metrics text whose labels contain
/// `label` (all: "").
fn metric(text: &str, name: &str, label: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A figure as the page shows it ("1,234" → 1234).
fn shown(v: &Value) -> u64 {
    let text = v.as_str().unwrap_or_else(|| panic!("no figure: {v}"));
    text.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("not a whole number: {text:?}"))
}

const READ_PAGE: &str = r#"
    const figures = {};
    for (const e of document.querySelectorAll('#overview [data-figure]')) figures[e.dataset.figure] = e.textContent;
    return {
      figures,
      sessions: [...document.querySelectorAll('table.sessions tbody tr')].map(r => r.dataset.id),
      points: document.querySelectorAll('#session svg.chart circle.point').length,
      marks: document.querySelectorAll('#session svg.chart .mark-compaction').length,
      compactions: [...document.querySelectorAll('#session section.compaction')].map(s => ({
        summary: [...s.querySelectorAll('.summary pre')].map(p => p.textContent).join('\n'),
        replaced: s.querySelectorAll('.replaced .message').length,
      })),
      status: document.getElementById('status').textContent,
    };"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_metrics_each_call_and_what_a_compaction_replaced_to_its_own_identity() {
    // reqwest is built without a TLS provider (the test speaks plain HTTP).
    context_engine_testkit::tls_provider();
    let dir = TempDir::new("browser", "ui");
    let script = Arc::new(Script::default());
    let upstream = start_upstream(Arc::clone(&script)).await;
    let instance = spawn(&dir.0, &upstream).await;

    // Alice's agent works through a recorded session, each request the
    // last one and its new tool calls and results, past the 2,000-token
    // window (it compacts); Bob's stays small.
    let full = context_engine_testkit::upstream::long_history(24);
    let mut alice_calls = 0;
    for turns in (0..=24).step_by(2) {
        call(&instance, "sk-alice", "alice-run", &full[..2 + 2 * turns]).await;
        alice_calls += 1;
    }
    let bob = [
        json!({"role": "system", "content": "You are Bob's agent."}),
        json!({"role": "user", "content": "list the files"}),
    ];
    call(&instance, "sk-bob", "bob-run", &bob).await;
    let metrics = reqwest::get(format!("http://{}/metrics", instance.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let compactions = metric(&metrics, "ctx_compactions_total", "");
    assert!(compactions >= 1, "alice's session compacts:\n{metrics}");

    let Some(browser) = Browser::start("ui").await else {
        return;
    };
    let base = format!("http://{}/ui", instance.addr);
    // The fragment carries the key to the page and never leaves the
    // browser.
    browser
        .open(
            &format!("{base}#key=sk-alice"),
            "document.querySelectorAll('#session section.compaction').length > 0 \
             && document.querySelectorAll('#session svg.chart circle.point').length > 0",
        )
        .await;
    let seen = browser.eval(READ_PAGE).await;
    let f = &seen["figures"];
    // The overview is what /metrics reports.
    assert_eq!(
        shown(&f["requests"]),
        metric(&metrics, "ctx_requests_total", "route=\"/v1/")
    );
    for (figure, name) in [
        ("client_prompt_tokens", "ctx_client_prompt_tokens_total"),
        ("managed_prompt_tokens", "ctx_managed_prompt_tokens_total"),
        ("prompt_tokens", "ctx_prompt_tokens_total"),
        ("compactions", "ctx_compactions_total"),
        ("fallbacks", "ctx_fallbacks_total"),
    ] {
        assert_eq!(shown(&f[figure]), metric(&metrics, name, ""), "{figure}");
    }
    assert!(
        shown(&f["managed_prompt_tokens"]) < shown(&f["client_prompt_tokens"]),
        "the engine sent less than the agents"
    );
    // Alice sees her session only, one point per call, the compaction
    // marked and shown: its summary beside the messages it replaced.
    assert_eq!(seen["sessions"], json!(["alice-run"]));
    assert_eq!(seen["points"].as_u64().unwrap(), alice_calls);
    assert!(seen["marks"].as_u64().unwrap() >= 1);
    let shown_compactions = seen["compactions"].as_array().unwrap();
    assert!(!shown_compactions.is_empty());
    for c in shown_compactions {
        let summary = c["summary"].as_str().unwrap();
        assert!(summary.contains("[CONTEXT SUMMARY"), "{summary}");
        assert!(c["replaced"].as_u64().unwrap() > 0, "{c}");
    }
    // The archive, searched from the page: the hits show the lines that
    // matched, the query's word marked.
    browser
        .eval(
            "const f = document.querySelector('#search form'); \
             f.querySelector('input').value = 'compute'; f.requestSubmit(); return true;",
        )
        .await;
    browser
        .wait_for("document.querySelectorAll('#search table.hits tbody tr').length > 0")
        .await;
    let snippets = browser
        .eval(
            "return [...document.querySelectorAll('#search table.hits pre mark')].map(p => p.textContent);",
        )
        .await;
    assert!(
        snippets
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s.as_str().unwrap().eq_ignore_ascii_case("compute")),
        "{snippets}"
    );
    // The last call's request, message by message: the agent's 50
    // messages, the compacted ones summarized, the summary upstream.
    browser
        .eval(
            "const b = [...document.querySelectorAll('#request-calls button')].pop(); \
             b.click(); return b.dataset.call;",
        )
        .await;
    browser
        .wait_for("document.querySelectorAll('#request details.view-message').length > 0")
        .await;
    let request = browser
        .eval(
            "const tags = side => [...document.querySelectorAll(`#request .sides > div:nth-child(${side}) details`)] \
               .map(d => d.dataset.tag); \
             return {client: tags(1), upstream: tags(2), title: document.querySelector('#request h3').textContent};",
        )
        .await;
    let tags =
        |side: &str| -> Vec<String> { serde_json::from_value(request[side].clone()).unwrap() };
    assert_eq!(tags("client").len(), full.len(), "{request}");
    assert!(
        tags("client").iter().any(|t| t == "summarized"),
        "{request}"
    );
    assert_eq!(
        tags("client").last().map(String::as_str),
        Some("kept"),
        "{request}"
    );
    assert!(
        tags("upstream").iter().any(|t| t == "summarized"),
        "the summary: {request}"
    );
    assert!(
        request["title"]
            .as_str()
            .unwrap()
            .starts_with(&format!("Call {alice_calls}:")),
        "{request}"
    );
    // The bill, estimated at the configured prices (the openai preset).
    let cost = f["cost"].as_str().unwrap_or_default();
    assert!(cost.starts_with('$') && cost.contains(" / $"), "{cost}");
    browser.assert_no_console_errors().await;
    browser.screenshot("alice").await;

    // Bob sees his own session, not Alice's; the operator sees both.
    browser
        .open(
            &format!("{base}?as=bob#key=sk-bob"),
            "document.querySelectorAll('table.sessions tbody tr').length > 0",
        )
        .await;
    let seen = browser.eval(READ_PAGE).await;
    assert_eq!(seen["sessions"], json!(["bob-run"]));
    browser.assert_no_console_errors().await;
    browser
        .open(
            &format!("{base}?as=operator#key=&operator={OPERATOR}"),
            "document.querySelectorAll('table.sessions tbody tr').length > 1",
        )
        .await;
    let seen = browser.eval(READ_PAGE).await;
    let mut all: Vec<String> = serde_json::from_value(seen["sessions"].clone()).unwrap();
    all.sort();
    assert_eq!(all, ["alice-run", "bob-run"]);
    // Ordered by savings, Alice's (which compacted) comes first.
    let order = browser
        .eval(
            "document.querySelector('#sort button[data-sort=savings]').click(); \
             return [...document.querySelectorAll('table.sessions tbody tr')].map(r => r.dataset.id);",
        )
        .await;
    assert_eq!(order[0], "alice-run", "{order}");
    browser.assert_no_console_errors().await;
    browser.screenshot("operator").await;
    browser.finish().await;

    // Bob asking for Alice's session by name gets nothing; nobody without
    // an identity lists any.
    let client = reqwest::Client::new();
    let alice_scope = {
        let text = client
            .get(format!("http://{}/ui/api/sessions", instance.addr))
            .header("authorization", "Bearer sk-alice")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let r: Value = serde_json::from_str(&text).unwrap();
        r["sessions"][0]["scope"].as_str().unwrap().to_owned()
    };
    let as_bob = client
        .get(format!(
            "http://{}/ui/api/sessions/{alice_scope}/alice-run/compactions",
            instance.addr
        ))
        .header("authorization", "Bearer sk-bob")
        .send()
        .await
        .unwrap();
    assert_eq!(as_bob.status(), 404);
    let anonymous = client
        .get(format!("http://{}/ui/api/sessions", instance.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 403);
}

/// The page's weight and its first render for a session of 500 calls
/// (`cargo test -p ctx --test browser_ui -- --ignored --nocapture`): a
/// measurement for docs/benchmarks.md, printed, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it with --ignored --nocapture"]
async fn measure_the_page_weight_and_first_render_of_500_calls() {
    context_engine_testkit::tls_provider();
    let dir = TempDir::new("browser", "ui-500");
    let script = Arc::new(Script::default());
    let upstream = start_upstream(Arc::clone(&script)).await;
    let instance = spawn(&dir.0, &upstream).await;
    let mut history = context_engine_testkit::upstream::long_history(1);
    let started = Instant::now();
    for i in 0..500 {
        call(&instance, "sk-alice", "long-run", &history).await;
        history.push(json!({"role": "assistant", "content": format!("step {i} done")}));
        history.push(json!({"role": "user", "content": format!("next step {i}")}));
    }
    let driven = started.elapsed();
    let page = reqwest::get(format!("http://{}/ui", instance.addr))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let Some(browser) = Browser::start("ui-500").await else {
        return;
    };
    let mut renders = Vec::new();
    for round in 0..5 {
        browser
            .open(
                &format!("http://{}/ui?round={round}#key=sk-alice", instance.addr),
                "document.getElementById('app').dataset.firstRenderMs",
            )
            .await;
        let points = browser
            .eval("return document.querySelectorAll('#session svg.chart circle.point').length;")
            .await;
        assert_eq!(points, json!(500));
        let ms = browser
            .eval("return Number(document.getElementById('app').dataset.firstRenderMs);")
            .await;
        renders.push(ms.as_f64().unwrap());
    }
    browser.assert_no_console_errors().await;
    browser.finish().await;
    renders.sort_by(f64::total_cmp);
    println!(
        "page weight {} bytes; 500 calls driven in {:.1} s; first render of the 500-call session \
         (navigation start to the chart drawn), 5 loads: median {:.0} ms, min {:.0}, max {:.0}",
        page.len(),
        driven.as_secs_f64(),
        renders[2],
        renders[0],
        renders[4]
    );
}
