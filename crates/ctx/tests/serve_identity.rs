#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The isolation probe against the real `ctx serve` binary (config in a
//! temporary directory, a SQLite store, a scripted upstream on loopback).
//!
//! The probe: client A (no credential, `x-ctx-session: my-run`) has a
//! tool output with an AWS key, a GitHub token and an RSA private key
//! compacted into the store; client B, with only `x-ctx-session: my-run`,
//! gets a model reply calling `context_recall` on A's tool-call id
//! `call_1`. Before the fix B received A's secrets. Now B (and A) have no
//! identity: no engine tool is offered, the call is not resolved, the
//! session status is refused; with its own key B is offered the tools and
//! reads "not found". Behind a team token with `serve.identity_header`
//! configured, alice and bob are isolated by the header, and the token
//! alone reads nothing; the header without the token refuses to start.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::TempDir;
use context_engine_testkit::serve::{Serve, Spawn};
use context_engine_testkit::upstream::{Reply, Script, completion, start_upstream};
use serde_json::{Value, json};

/// Writes `serve_yaml` (the `serve:` section's extra keys) with the
/// upstream and a SQLite store in `dir`; the config's path.
fn config(dir: &Path, upstream: &str, serve_yaml: &str) -> PathBuf {
    let path = dir.join("config.yaml");
    let text = format!(
        "store:\n  path: {}\nserve:\n  upstream:\n    url: {upstream}\n{serve_yaml}",
        dir.join("store.db").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `ctx serve` with the config at `config`, a window of 2,000 tokens and
/// the team's access token in the environment.
fn serve_command(config: &Path) -> Spawn {
    Spawn::new(env!("CARGO_BIN_EXE_ctx"))
        .args(["--context-length", "2000", "--config"])
        .arg(config)
        .env("CTX_E2E_TEAM_TOKEN", "team-token")
}

/// Starts it (see [`serve_command`]) and waits until it is healthy.
async fn spawn(config: &Path) -> Serve {
    serve_command(config).start().await
}

fn secrets() -> [String; 4] {
    [
        format!("AKIA{}", "Z7Q3XK2M5N8P4R6T"),
        format!("ghp_{}", "R2d9Kx7LmQ4vTn8Wp3Yz6Bc1Fh5Js0Ga9Eu2"),
        format!(
            "MIIEowIBAAKCAQEA{}",
            "u1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0"
        ),
        "MARKER-A-7731".to_owned(),
    ]
}

/// A's conversation: 20 tool outputs over a 2000-token window, `call_1`'s
/// with the secrets.
fn history_of_a() -> Vec<Value> {
    let [aws, gh, key, marker] = secrets();
    let mut m = context_engine_testkit::upstream::long_history(20);
    let at = m
        .iter()
        .position(|x| x["tool_call_id"] == "call_1")
        .unwrap();
    m[at]["content"] = json!(format!(
        "{marker}\naws_access_key_id = {aws}\nGITHUB_TOKEN={gh}\n\
         -----BEGIN RSA PRIVATE KEY-----\n{key}\n-----END RSA PRIVATE KEY-----\n"
    ));
    m.push(json!({"role": "user", "content": "go on"}));
    m
}

fn b_conversation() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are B's agent."}),
        json!({"role": "user", "content": "what did call_1 print?"}),
    ]
}

/// The model the probe scripted: `context_recall` on `call_1`, then text
/// once the request carries the answer.
fn recall_call_1() -> Reply {
    Reply::With(Arc::new(|request: &Value| {
        let last = request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        if last["tool_call_id"] == "atk_1" {
            return completion(json!({"role": "assistant", "content": "done"}), 10, 1);
        }
        let mut r = completion(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "atk_1", "type": "function",
                "function": {"name": "context_recall", "arguments": "{\"handle\":\"call_1\"}"}}]}),
            10,
            2,
        );
        r["choices"][0]["finish_reason"] = json!("tool_calls");
        r
    }))
}

/// One request's outcome: the client's answer, the upstream requests it
/// caused, the engine's answer to the model's call when resolved.
struct Outcome {
    answer: String,
    upstream: Vec<Value>,
    engine_answer: Option<String>,
}

impl Outcome {
    fn offered_engine_tools(&self) -> bool {
        self.upstream[0]["tools"]
            .to_string()
            .contains("context_recall")
    }

    fn assert_leaks_nothing(&self) {
        let mut seen = self.answer.clone();
        for u in &self.upstream {
            seen.push_str(&u.to_string());
        }
        for s in secrets() {
            assert!(!seen.contains(&s), "{s} reached another client");
        }
    }
}

async fn send(
    instance: &Serve,
    script: &Script,
    headers: &[(&str, &str)],
    messages: &[Value],
    reply: Option<Reply>,
) -> Outcome {
    script.replies.lock().unwrap().clear();
    if let Some(r) = reply {
        script.push(r.clone());
        script.push(r);
    }
    let before = script.received().len();
    let tools = json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]);
    let mut req = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", instance.addr))
        .header("content-type", "application/json")
        .body(json!({"model": "m", "messages": messages, "tools": tools}).to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let answer = resp.text().await.unwrap();
    let upstream: Vec<Value> = script.received()[before..]
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    let engine_answer = upstream.iter().find_map(|u| {
        let last = u["messages"].as_array()?.last()?;
        (last["tool_call_id"] == "atk_1").then(|| last["content"].as_str().unwrap_or("").to_owned())
    });
    Outcome {
        answer,
        upstream,
        engine_answer,
    }
}

async fn status(instance: &Serve, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req =
        reqwest::Client::new().get(format!("http://{}/ctx/sessions/my-run", instance.addr));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// A's history went out compacted: the secrets are only in the archive.
fn assert_compacted(a: &Outcome) {
    let sent = a.upstream[0].to_string();
    assert!(sent.contains("archived verbatim"), "A's request compacted");
    assert!(!sent.contains(&secrets()[3]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_no_longer_reads_another_clients_archive() {
    context_engine_testkit::tls_provider();
    let script = Arc::new(Script::default());
    let upstream = start_upstream(Arc::clone(&script)).await;
    let dir = TempDir::new("serve-identity", "probe");
    let proxy = spawn(&config(&dir.0, &upstream, "")).await;
    let session = [("x-ctx-session", "my-run")];

    let a = send(&proxy, &script, &session, &history_of_a(), None).await;
    assert_compacted(&a);

    // The probe's exact attack.
    let b = send(
        &proxy,
        &script,
        &session,
        &b_conversation(),
        Some(recall_call_1()),
    )
    .await;
    assert!(
        !b.offered_engine_tools(),
        "no engine tool offered without an identity"
    );
    assert_eq!(b.upstream.len(), 1, "the model's call was not resolved");
    assert!(b.engine_answer.is_none());
    b.assert_leaks_nothing();
    let (code, body) = status(&proxy, &session).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("identity"), "{body}");

    // B with a key of its own: offered the tools, finds nothing of A's.
    let own = [
        ("authorization", "Bearer sk-b"),
        ("x-ctx-session", "my-run"),
    ];
    let b = send(
        &proxy,
        &script,
        &own,
        &b_conversation(),
        Some(recall_call_1()),
    )
    .await;
    assert!(b.offered_engine_tools());
    let answer = b.engine_answer.clone().expect("resolved for an identity");
    assert!(answer.contains("no tool result"), "{answer}");
    b.assert_leaks_nothing();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_team_token_users_are_told_apart_by_the_gateway_header() {
    context_engine_testkit::tls_provider();
    let script = Arc::new(Script::default());
    let upstream = start_upstream(Arc::clone(&script)).await;
    let dir = TempDir::new("serve-identity", "team");
    let serve = "  auth_token_env: CTX_E2E_TEAM_TOKEN\n  identity_header: x-user\n";
    let proxy = spawn(&config(&dir.0, &upstream, serve)).await;
    let alice = [
        ("authorization", "Bearer team-token"),
        ("x-user", "alice"),
        ("x-ctx-session", "my-run"),
    ];
    let a = send(&proxy, &script, &alice, &history_of_a(), None).await;
    assert_compacted(&a);
    // Alice reads her own archive back (the attack works where it should).
    let mut again = history_of_a();
    again.push(json!({"role": "assistant", "content": "ok"}));
    again.push(json!({"role": "user", "content": "recall call_1"}));
    let own = send(&proxy, &script, &alice, &again, Some(recall_call_1())).await;
    assert!(own.engine_answer.unwrap().contains(&secrets()[3]));
    assert_eq!(status(&proxy, &alice).await.0, 200);

    let bob = [
        ("authorization", "Bearer team-token"),
        ("x-user", "bob"),
        ("x-ctx-session", "my-run"),
    ];
    let b = send(
        &proxy,
        &script,
        &bob,
        &b_conversation(),
        Some(recall_call_1()),
    )
    .await;
    let answer = b.engine_answer.clone().expect("bob has an identity");
    assert!(answer.contains("no tool result"), "{answer}");
    b.assert_leaks_nothing();

    let token_only = [
        ("authorization", "Bearer team-token"),
        ("x-ctx-session", "my-run"),
    ];
    let t = send(
        &proxy,
        &script,
        &token_only,
        &b_conversation(),
        Some(recall_call_1()),
    )
    .await;
    assert!(!t.offered_engine_tools());
    assert!(t.engine_answer.is_none());
    t.assert_leaks_nothing();
    assert_eq!(status(&proxy, &token_only).await.0, 403);
}

#[test]
fn the_identity_header_without_the_access_token_refuses_to_start() {
    let dir = TempDir::new("serve-identity", "refuse");
    let config = config(
        &dir.0,
        "http://127.0.0.1:9/v1",
        "  identity_header: x-user\n",
    );
    let out = serve_command(&config).output();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("serve.identity_header") && stderr.contains("serve.auth_token_env"),
        "{stderr}"
    );
}
