#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `ctx replay` predicts `ctx serve` from one config file: a file setting
//! `context.context_length` and `context.text_actions` (a pattern for the
//! observations of a text-action session, a shape no built-in knows), and
//! in the second test `context.engine` naming a plugin (the example
//! `last-turns`, in Python). `ctx replay --json --config F` reports the
//! session; `ctx serve --config F` (the real binary, the window and the
//! text actions from the file only) is driven with the same session by a
//! client sending the full history on every call, against an upstream
//! scripted in the test that answers each call with the recorded turn and
//! the usage the replay fed its engine. Call by call, the upstream
//! receives the request the report describes (its tokens, its messages)
//! and the proxy compacts on the calls the report compacts on.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::TempDir;
use common::serve;
use context_engine::message::Message;
use context_engine::tokens::TokenCounter;
use context_engine_testkit::counter;
use context_engine_testkit::upstream::{Reply, Script, completion, start_upstream};
use serde_json::{Value, json};

const CLIENT_KEY: &str = "Bearer sk-test-replay-serve";

/// A text-action agent's session: each assistant turn a THOUGHT and one
/// shell block, each output sent back as a user message opening with
/// `EXIT CODE: N` (a shape only the config's pattern makes an
/// observation), the last turn the agent's submission.
fn text_action_session(turns: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent. Reply with a THOUGHT and exactly one ```bash block; its output comes back as EXIT CODE then the output."}),
        json!({"role": "user", "content": "Fix the bug in src/parse.py: header names lose their case."}),
    ];
    for i in 0..turns {
        m.push(json!({"role": "assistant",
            "content": format!("THOUGHT: read part {i} of the parser.\n\n```bash\ncat src/part_{i}.py\n```")}));
        let body: String = (0..12)
            .map(|j| format!("{j:3}  def header_{i}_{j}(name, value):  return name.strip().lower() + ':' + value  # part {i} line {j}\n"))
            .collect();
        m.push(json!({"role": "user", "content": format!("EXIT CODE: 0\n{body}")}));
    }
    m.push(json!({"role": "assistant",
        "content": "THOUGHT: the fix is in part 3.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"}));
    m
}

/// The config file: the window and the text actions, then `extra`.
fn config_yaml(extra: &str) -> String {
    format!(
        "context:\n  context_length: 3000\n  text_actions: [\"^EXIT CODE: \\\\d+\\\\n\"]\n{extra}"
    )
}

/// `ctx replay SESSION --json --config CONFIG ARGS`, parsed.
fn replay(session: &Path, config: &Path, args: &[&str]) -> Value {
    let out = common::ctx(
        &[
            &[
                "replay",
                session.to_str().unwrap(),
                "--json",
                "--config",
                config.to_str().unwrap(),
            ][..],
            args,
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Writes the session and the config (`extra` added) in `dir`, replays
/// (with `replay_args`), then drives the session through
/// `ctx serve --config` and compares call by call; returns the report.
async fn serve_sends_what_replay_reports(dir: &Path, extra: &str, replay_args: &[&str]) -> Value {
    let session = text_action_session(14);
    let session_file = dir.join("session.json");
    std::fs::write(&session_file, serde_json::to_vec(&session).unwrap()).unwrap();
    let config = dir.join("config.yaml");
    std::fs::write(&config, config_yaml(extra)).unwrap();
    let report = replay(&session_file, &config, replay_args);
    assert_eq!(
        u(&report["context_length"]),
        3000,
        "the window from the file"
    );
    let calls = report["calls"].as_array().unwrap();

    let script = Arc::new(Script::default());
    let upstream = start_upstream(Arc::clone(&script)).await;
    let serve = serve::start(
        dir,
        &[
            "--upstream",
            &upstream,
            "--config",
            config.to_str().unwrap(),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let counter = counter();
    let mut compactions = 0;
    for (k, call) in calls.iter().enumerate() {
        let index = u(&call["message_index"]) as usize;
        // The usage the replay fed its engine: the recorded prompt tokens
        // scaled to its request, else its request's own count.
        let with_engine = u(&call["tokens_with_engine"]);
        let prompt = match call["recorded_prompt_tokens"].as_u64() {
            Some(r) if u(&call["tokens_without_engine"]) > 0 => (r as f64 * with_engine as f64
                / u(&call["tokens_without_engine"]) as f64)
                .round() as u64,
            _ => with_engine,
        };
        script.push(Reply::Json(completion(
            session[index].clone(),
            prompt,
            u(&call["completion_tokens"]),
        )));
        let body = json!({"model": "scripted", "messages": &session[..index]});
        let resp = client
            .post(format!("http://{}/v1/chat/completions", serve.addr))
            .header("authorization", CLIENT_KEY)
            .header("x-ctx-session", "replayed")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "call {k}: {}", serve.stderr());
        let sent: Value = serde_json::from_slice(&script.received().last().unwrap().body).unwrap();
        let sent: Vec<Message> = serde_json::from_value(sent["messages"].clone()).unwrap();
        assert_eq!(
            counter.count_messages(&sent) as u64,
            with_engine,
            "call {k}: the upstream request is not the one the replay reports"
        );
        assert_eq!(
            sent.len() as u64,
            u(&call["messages_with_engine"]),
            "call {k}"
        );
        compactions += u64::from(!call["compaction"].is_null());
        let status: Value = serde_json::from_slice(
            &client
                .get(format!("http://{}/ctx/sessions/replayed", serve.addr))
                .header("authorization", CLIENT_KEY)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            status["stats"]["compactions"], compactions,
            "call {k}: the proxy compacts where the replay does"
        );
        assert_eq!(status["stats"]["fallbacks"], 0, "call {k}: {status}");
    }
    assert!(
        compactions > 0,
        "the window should make the session compact"
    );
    report
}

/// `store.path` in the config file: `ctx serve` keeps its sessions
/// there, `ctx replay` archives in memory as it does by default (it never
/// writes to the configured store): the summaries name the same handles.
fn store_yaml(dir: &Path) -> String {
    format!(
        "store:\n  path: {}\n",
        serde_json::to_string(&dir.join("store.db").display().to_string()).unwrap()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_config_file_gives_serve_the_requests_replay_reports() {
    let dir = TempDir::new("serve-replay", "builtin");
    let report = serve_sends_what_replay_reports(&dir.0, &store_yaml(&dir.0), &[]).await;
    assert_eq!(report["engine"], "compressor");
    // The file's text actions decide something here: read as user turns,
    // the same session replays differently.
    let off = replay(
        &dir.0.join("session.json"),
        &dir.0.join("config.yaml"),
        &["--set", "context.text_actions=off"],
    );
    let sizes = |r: &Value| -> Vec<u64> {
        r["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| u(&c["tokens_with_engine"]))
            .collect()
    };
    assert_ne!(sizes(&report), sizes(&off));
}

/// A config without a store: `ctx serve` keeps sessions in its memory
/// and archives nothing, which `ctx replay --no-store` predicts (a
/// replay that archives names a handle in each summary that this proxy
/// cannot name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_serve_sends_the_requests_replay_no_store_reports() {
    let dir = TempDir::new("serve-replay", "no-store");
    serve_sends_what_replay_reports(&dir.0, "", &["--no-store"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_plugin_engine_serve_sends_the_requests_replay_reports() {
    if !common::python() {
        return;
    }
    let dir = TempDir::new("serve-replay", "plugin");
    let plugins = common::root().join("plugins");
    let extra = format!(
        "  engine: last-turns\nplugins:\n  dirs: [{}]\nengines:\n  last-turns:\n    keep_turns: 3\n{}",
        serde_json::to_string(&plugins.display().to_string()).unwrap(),
        store_yaml(&dir.0)
    );
    let report = serve_sends_what_replay_reports(&dir.0, &extra, &[]).await;
    assert_eq!(report["engine"], "last-turns");
}

/// Observe mode shows what replay reports: the same session through
/// `ctx serve --observe --config F`, each call answered with the usage the
/// provider reports for the client's own request. Every request goes
/// upstream byte for byte; the engine's would-be requests, beside the
/// traffic, add up to the replay's tokens with the engine (within 1%) and
/// compact where it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_shows_the_requests_replay_reports() {
    let dir = TempDir::new("serve-replay", "observe");
    let session = text_action_session(14);
    let session_file = dir.0.join("session.json");
    std::fs::write(&session_file, serde_json::to_vec(&session).unwrap()).unwrap();
    let config = dir.0.join("config.yaml");
    std::fs::write(&config, config_yaml("")).unwrap();
    let report = replay(&session_file, &config, &["--no-store"]);
    let calls = report["calls"].as_array().unwrap();
    let script = Arc::new(Script::default());
    let upstream = start_upstream(Arc::clone(&script)).await;
    let serve = serve::start(
        &dir.0,
        &[
            "--upstream",
            &upstream,
            "--config",
            config.to_str().unwrap(),
            "--observe",
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let metrics = || async {
        client
            .get(format!("http://{}/metrics", serve.addr))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    for (k, call) in calls.iter().enumerate() {
        let index = u(&call["message_index"]) as usize;
        script.push(Reply::Json(completion(
            session[index].clone(),
            u(&call["tokens_without_engine"]),
            u(&call["completion_tokens"]),
        )));
        let body = json!({"model": "scripted", "messages": &session[..index]}).to_string();
        let resp = client
            .post(format!("http://{}/v1/chat/completions", serve.addr))
            .header("authorization", CLIENT_KEY)
            .header("x-ctx-session", "observed")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "call {k}: {}", serve.stderr());
        resp.bytes().await.unwrap();
        assert_eq!(
            script.received().last().unwrap().body,
            body.as_bytes(),
            "call {k}: the body as the client sent it"
        );
        // The observation runs once the answer has ended: wait for it
        // (bounded, short polls) before the next call.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while context_engine_testkit::upstream::metric(
            &metrics().await,
            "ctx_observed_requests_total",
        ) < k as u64 + 1
        {
            assert!(
                std::time::Instant::now() < deadline,
                "call {k} never observed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    let text = metrics().await;
    let observed =
        context_engine_testkit::upstream::metric(&text, "ctx_managed_prompt_tokens_total") as f64;
    let replayed: u64 = calls.iter().map(|c| u(&c["tokens_with_engine"])).sum();
    let replayed = replayed as f64;
    eprintln!("observed with the engine: {observed} tokens; ctx replay: {replayed}");
    assert!(
        (observed - replayed).abs() <= replayed * 0.01,
        "observed {observed} tokens with the engine, replay {replayed}"
    );
    let compactions = calls.iter().filter(|c| !c["compaction"].is_null()).count() as u64;
    assert!(compactions > 0);
    assert_eq!(
        context_engine_testkit::upstream::metric(&text, "ctx_compactions_total"),
        compactions,
        "{text}"
    );
    assert_eq!(
        context_engine_testkit::upstream::metric(&text, "ctx_observe_errors_total"),
        0,
        "{text}"
    );
}
