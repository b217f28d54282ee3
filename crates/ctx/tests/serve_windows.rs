#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The window of the model a request names, on every API and store.
//!
//! `ctx serve --config F` (the real binary), where F sets a large
//! `context.context_length` and a `context.model_windows` entry far
//! smaller for one model: a long session naming that model is compacted
//! against the model's window, and the same session naming another model
//! is not, on chat completions, Anthropic Messages and Responses, with
//! sessions in memory and in a SQLite store.

mod common;

use std::sync::Arc;

use common::TempDir;
use common::serve::{self, Serve};
use context_engine_testkit::upstream::{Script, start_upstream};
use serde_json::{Value, json};

const CLIENT_KEY: &str = "Bearer sk-test-windows";
const SMALL: u64 = 3_000;
const CONFIGURED: u64 = 200_000;

/// `turns` long exchanges (about 150 tokens each): far over `SMALL`,
/// far under `CONFIGURED`.
fn turns(turns: usize) -> Vec<(String, String)> {
    (0..turns)
        .map(|i| {
            let ask: String = (0..12)
                .map(|j| format!("step {i}.{j}: check the parser's header case on input {j}. "))
                .collect();
            (ask, format!("Checked step {i}: the header case holds."))
        })
        .collect()
}

/// The session as a body of `api` naming `model`.
fn body(api: &str, model: &str, turns: &[(String, String)]) -> Value {
    let mut items = Vec::new();
    for (ask, answer) in turns {
        items.push(json!({"role": "user", "content": ask}));
        items.push(json!({"role": "assistant", "content": answer}));
    }
    items.push(json!({"role": "user", "content": "What did the last step find?"}));
    match api {
        "chat/completions" => json!({"model": model, "messages": items}),
        "messages" => json!({"model": model, "max_tokens": 64, "messages": items}),
        _ => json!({"model": model, "input": items}),
    }
}

/// The number of items the upstream got for `api`'s request `sent`.
fn items(api: &str, sent: &Value) -> usize {
    let key = if api == "responses" {
        "input"
    } else {
        "messages"
    };
    sent[key].as_array().map_or(0, Vec::len)
}

async fn session_status(serve: &Serve, id: &str) -> Value {
    let r = reqwest::Client::new()
        .get(format!("http://{}/ctx/sessions/{id}", serve.addr))
        .header("authorization", CLIENT_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "status of {id}");
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

async fn drive(store: Option<&str>) {
    let tag = store.map_or("memory", |_| "sqlite");
    let dir = TempDir::new("serve-windows", tag);
    let config = dir.0.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "context:\n  context_length: {CONFIGURED}\n  model_windows:\n    tiny-model: {SMALL}\n"
        ),
    )
    .unwrap();
    let script = Arc::new(Script::default());
    let upstream = start_upstream(Arc::clone(&script)).await;
    let db = dir.0.join("sessions.db");
    let mut args = vec![
        "--upstream",
        upstream.as_str(),
        "--config",
        config.to_str().unwrap(),
    ];
    if store.is_some() {
        args.extend(["--store", db.to_str().unwrap()]);
    }
    let serve = serve::start(&dir.0, &args).await;
    let session = turns(40);
    let client = reqwest::Client::new();
    for api in ["chat/completions", "messages", "responses"] {
        for (model, window) in [("tiny-model-1", SMALL), ("other-model", CONFIGURED)] {
            let id = format!("{tag}-{}-{model}", api.replace('/', "-"));
            let sent = body(api, model, &session);
            let before = script.received().len();
            let r = client
                .post(format!("http://{}/v1/{api}", serve.addr))
                .header("authorization", CLIENT_KEY)
                .header("x-ctx-session", &id)
                .header("content-type", "application/json")
                .body(sent.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{api} {model}: {}", serve.stderr());
            r.bytes().await.unwrap();
            let received = script.received();
            assert_eq!(
                received.len(),
                before + 1,
                "{api} {model}: one upstream call"
            );
            let upstream_got: Value = serde_json::from_slice(&received[before].body).unwrap();
            let status = session_status(&serve, &id).await;
            assert_eq!(
                status["status"]["context_length"], window,
                "{api} {model} ({tag}): the window managed against: {status}"
            );
            let (client_items, got) = (items(api, &sent), items(api, &upstream_got));
            if window == SMALL {
                assert!(
                    got < client_items,
                    "{api} {model} ({tag}): compacted against the model's window ({got} of {client_items} items went up): {}",
                    serve.stderr()
                );
                assert!(
                    status["stats"]["compactions"].as_u64().unwrap() >= 1,
                    "{api} {model} ({tag}): {status}"
                );
            } else {
                assert_eq!(
                    got, client_items,
                    "{api} {model} ({tag}): the configured window needs no compaction"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_managed_against_the_window_of_the_model_it_names_in_memory() {
    drive(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_managed_against_the_window_of_the_model_it_names_with_a_store() {
    drive(Some("sqlite")).await;
}
