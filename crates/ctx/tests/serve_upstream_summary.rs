#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `ctx serve --summarizer upstream` (the real binary): the background
//! summary goes to the proxy's own upstream with the client's credential
//! and model, and the compaction carries it; `ctx replay` with the same
//! setting, which has no upstream, says so and writes the extractive
//! summary.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TempDir;
use common::serve;
use context_engine_testkit::upstream::{Reply, Script, completion, start_upstream};
use serde_json::{Value, json};

const CLIENT_KEY: &str = "Bearer sk-test-upstream-summary";

fn is_summary_call(body: &Value) -> bool {
    body.pointer("/messages/0/content")
        .and_then(Value::as_str)
        .is_some_and(|s| s.starts_with("You write handoff summaries"))
}

fn history(turns: usize) -> Value {
    json!({"model": "agent-model", "messages": common::lexer_session(turns)})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctx_serve_asks_its_upstream_for_the_summary_with_the_clients_key() {
    let dir = TempDir::new("serve-upstream-summary", "chat");
    let script = Arc::new(Script::default());
    *script.otherwise.lock().unwrap() = Some(Reply::With(Arc::new(|body: &Value| {
        if is_summary_call(body) {
            let text =
                "MODEL SUMMARY: porting the lexer in src/lex.rs; token kinds checked so far match.";
            return completion(json!({"role": "assistant", "content": text}), 900, 40);
        }
        // About the size of the prompt, as a provider would report it.
        let tokens = body.to_string().len() as u64 / 4;
        completion(json!({"role": "assistant", "content": "ok"}), tokens, 1)
    })));
    let upstream = start_upstream(Arc::clone(&script)).await;
    let serve = serve::start(
        &dir.0,
        &[
            "--upstream",
            upstream.as_str(),
            "--summarizer",
            "upstream",
            "--context-length",
            "4000",
            "--set",
            "serve.summary_watermark=0.5",
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let mut carried = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    for turns in (2..80).step_by(2) {
        let r = client
            .post(format!("http://{}/v1/chat/completions", serve.addr))
            .header("authorization", CLIENT_KEY)
            .header("x-ctx-session", "lexer")
            .header("content-type", "application/json")
            .body(history(turns).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", serve.stderr());
        r.bytes().await.unwrap();
        let last: Value = serde_json::from_slice(
            &script
                .received()
                .iter()
                .rev()
                .find(|r| !is_summary_call(&serde_json::from_slice(&r.body).unwrap_or(Value::Null)))
                .unwrap()
                .body,
        )
        .unwrap();
        if last.to_string().contains("MODEL SUMMARY") {
            carried = Some(turns);
            break;
        }
        assert!(Instant::now() < deadline, "{}", serve.stderr());
    }
    assert!(
        carried.is_some(),
        "a compaction carried the model's summary: {}",
        serve.stderr()
    );
    let calls: Vec<_> = script
        .received()
        .into_iter()
        .filter(|r| is_summary_call(&serde_json::from_slice(&r.body).unwrap()))
        .collect();
    assert!(!calls.is_empty());
    assert_eq!(calls[0].headers["authorization"], CLIENT_KEY);
    let body: Value = serde_json::from_slice(&calls[0].body).unwrap();
    assert_eq!(body["model"], "agent-model");
    let metrics = context_engine_testkit::proxy::metrics_text(serve.socket_addr()).await;
    assert!(
        metrics.contains("ctx_summary_prompt_tokens_total 900")
            || metrics.contains(&format!(
                "ctx_summary_prompt_tokens_total {}",
                900 * calls.len()
            )),
        "{metrics}"
    );
}

#[test]
fn replay_has_no_upstream_and_says_the_extractive_summary_stands_in() {
    let out = common::command()
        .args([
            "replay",
            "examples/coding-session.json",
            "--context-length",
            "16000",
            "--summarizer",
            "upstream",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("summarizer.kind: upstream") && stderr.contains("extractive"),
        "{stderr}"
    );
}
