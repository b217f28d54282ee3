#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end against a real model: `ctx compact --summarizer openai` and
//! `ctx replay --summarizer openai` with an OpenAI-compatible server.
//!
//! Run by `scripts/e2e-local-llm.sh`, which installs and starts llama.cpp's
//! server with SmolLM2-135M-Instruct (8192-token window), sets
//! `CTX_E2E_BASE_URL` and runs these `#[ignore]`d tests with
//! `--include-ignored`. Without the variable a test fails under `CI=true`
//! and is skipped with the reason printed elsewhere. The figures of each
//! model call (latency, tokens) are printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::*;

/// The summary model's window (the server runs with `--ctx-size 8192`).
const SERVER_WINDOW: u64 = 8192;
/// The reply reserve asked of the summarizer.
const MAX_OUTPUT: u64 = 256;
/// Deadline of one summary request, in seconds: a busy shared CPU makes a
/// small model slow.
const TIMEOUT_SECS: &str = "900";
/// The variable the key is read from; the local server ignores the key.
const KEY_ENV: &str = "CTX_E2E_API_KEY";

/// Prefix and end marker of the engine's summary wrapper
/// (`compressor::insert::wrap_summary`).
const SUMMARY_PREFIX: &str = "[CONTEXT SUMMARY: reference only]";
const SUMMARY_END: &str = "[END CONTEXT SUMMARY]";
/// Heading of the sections the client extracts from the messages
/// (`summarize::state::STATE_RECORD_HEADING`).
const RECORD_HEADING: &str = "## State record";

/// The server's base URL, or `None` with the reason printed.
fn base_url() -> Option<String> {
    match std::env::var("CTX_E2E_BASE_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            skip(
                "CTX_E2E_BASE_URL is not set (run scripts/e2e-local-llm.sh for the \
                 end-to-end tests against a real model)",
            );
            None
        }
    }
}

fn model() -> String {
    std::env::var("CTX_E2E_MODEL").unwrap_or_else(|_| "smollm2".into())
}

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ctx-e2e-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `ctx compact FILE` with the real summarizer, strict profile, JSON report;
/// no `--summarizer-context-length`: the window is asked of the server.
fn compact_command(base_url: &str, file: &Path, context_length: u64, out: &Path) -> Command {
    let mut cmd = command();
    cmd.env(KEY_ENV, "local").args([
        "compact".as_ref(),
        file.as_os_str(),
        "--context-length".as_ref(),
        context_length.to_string().as_ref(),
        "--summarizer".as_ref(),
        "openai".as_ref(),
        "--base-url".as_ref(),
        base_url.as_ref(),
        "--summarizer-model".as_ref(),
        model().as_ref(),
        "--api-key-env".as_ref(),
        KEY_ENV.as_ref(),
        "--max-output-tokens".as_ref(),
        MAX_OUTPUT.to_string().as_ref(),
        "--summarizer-timeout".as_ref(),
        TIMEOUT_SECS.as_ref(),
        "--profile".as_ref(),
        "strict".as_ref(),
        "--report".as_ref(),
        "json".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    cmd
}

fn messages_of(path: &Path) -> Vec<Value> {
    let value: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    match value {
        Value::Array(m) => m,
        Value::Object(mut o) => match o.remove("messages").or_else(|| o.remove("history")) {
            Some(Value::Array(m)) => m,
            _ => panic!("{}: no messages", path.display()),
        },
        _ => panic!("{}: not a transcript", path.display()),
    }
}

fn text_of(m: &Value) -> String {
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The latest user message that is a real ask (not a tool re-entry).
fn latest_user_ask(messages: &[Value]) -> Value {
    messages
        .iter()
        .rev()
        .find(|m| {
            m["role"] == "user"
                && !text_of(m).trim().is_empty()
                && !text_of(m).contains("[END TOOL RESULTS]")
                && !text_of(m).contains(SUMMARY_PREFIX)
        })
        .cloned()
        .expect("a user ask")
}

/// Prints the figures of the model call and checks they are consistent.
fn check_call(label: &str, report: &Value) {
    let call = &report["summarizer_call"];
    eprintln!(
        "e2e figures [{label}]: latency {:.0} ms, attempts {}, prompt tokens (server) {}, \
         counted with margin {}, completion tokens {}, max_tokens {}; compaction {:.0} ms, \
         tokens {} -> {}",
        call["latency_ms"].as_f64().unwrap_or(-1.0),
        call["attempts"],
        call["prompt_tokens"],
        call["counted_prompt_tokens"],
        call["completion_tokens"],
        call["max_tokens"],
        report["elapsed_ms"].as_f64().unwrap_or(-1.0),
        report["tokens_before"],
        report["tokens_after"],
    );
    assert_eq!(call["attempts"], 1, "{call}");
    assert_eq!(call["max_tokens"], MAX_OUTPUT);
    // The window was learned from the server (llama.cpp's /props), or
    // given by the caller (replay passes it).
    assert_eq!(call["window_tokens"], SERVER_WINDOW, "{call}");
    assert!(
        ["server_props", "configured"].contains(&call["window_source"].as_str().unwrap_or("")),
        "{call}"
    );
    let prompt = call["prompt_tokens"].as_u64().expect("server usage");
    let completion = call["completion_tokens"].as_u64().expect("server usage");
    // The server's own count: the request fitted its window.
    assert!(prompt + MAX_OUTPUT <= SERVER_WINDOW, "{call}");
    assert!(completion > 0 && completion <= MAX_OUTPUT, "{call}");
    // The margin covered the server's tokenizer.
    assert!(
        call["counted_prompt_tokens"].as_u64().unwrap() >= prompt,
        "{call}"
    );
}

/// Compacts `file` with the real model and checks the result.
fn compact_and_check(label: &str, base_url: &str, file: &Path, context_length: u64) {
    let dir = temp_dir(label);
    let out = dir.join("compacted.json");
    let o = compact_command(base_url, file, context_length, &out)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let report: Value = serde_json::from_str(&err).unwrap();
    // The request reached the model and its reply came back (no context
    // overflow: the window was learned from the server). The model's text is
    // either the summary, or, when the 135M model loops or echoes the
    // transcript's tags, rejected as degenerate with the deterministic
    // extractive summary in its place (issue 13): both are checked, and the
    // outcome is printed so the run shows which one happened.
    let outcome = report["outcome"].as_str().unwrap_or("");
    let reason = report["reason"].as_str().unwrap_or("");
    eprintln!("e2e outcome [{label}]: {outcome} {reason}");
    match outcome {
        "compacted" => assert_eq!(report["summarizer"], format!("openai:{}", model())),
        "fallback" => assert!(
            reason.starts_with("degenerate summary rejected"),
            "a fallback other than a rejected degenerate summary: {report}"
        ),
        _ => panic!("not compacted: {report}"),
    }
    check_call(label, &report);

    // Valid under the strict profile as far as the input was: no finding
    // the input did not have (a recorded corpus session may end on an
    // unanswered call or an `exit` record, which stay).
    let rules = |path: &Path| -> Vec<String> {
        let v = ctx(&[
            "validate",
            path.to_str().unwrap(),
            "--profile",
            "strict",
            "--json",
        ]);
        let v: Value = serde_json::from_slice(&v.stdout).unwrap();
        v["violations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["rule"].as_str().unwrap().to_owned())
            .collect()
    };
    let (rules_before, rules_after) = (rules(file), rules(&out));
    assert!(
        rules_after.iter().all(|r| rules_before.contains(r)),
        "new findings: {rules_after:?} (input: {rules_before:?})"
    );
    assert_eq!(report["violations_after"], rules_after.len());

    let before = messages_of(file);
    let after = messages_of(&out);
    assert!(after.len() < before.len());
    // The latest user ask survives verbatim.
    let ask = latest_user_ask(&before);
    assert!(after.contains(&ask), "latest ask lost: {ask}");
    // The summary: the engine's wrapper around the model's prose, then the
    // sections extracted from the messages.
    let summary = after
        .iter()
        .map(text_of)
        .find(|t| t.contains(SUMMARY_PREFIX))
        .expect("a summary message");
    let start = summary.find(SUMMARY_PREFIX).unwrap();
    let end = summary.find(SUMMARY_END).expect("summary end marker");
    let body = &summary[start..end];
    let record = body.find(RECORD_HEADING).expect("extracted sections");
    let prose = body[..record]
        .split_once("\n\n")
        .map_or("", |(_, p)| p)
        .trim();
    eprintln!(
        "e2e model prose [{label}] ({} chars): {}",
        prose.len(),
        prose.chars().take(400).collect::<String>()
    );
    assert!(!prose.is_empty(), "the model wrote nothing: {body}");
    // The ledger: the commands the span ran always; empty sections are
    // left out, and a file a listed command names is not listed again.
    let ledger = &body[record..];
    assert!(ledger.contains("### Commands"), "no commands: {body}");
    for line in ledger.lines().filter(|l| l.starts_with("### ")) {
        assert!(
            [
                "### User asks",
                "### Files read or written",
                "### Commands",
                "### Failing tests",
                "### Errors",
                "### Next",
            ]
            .iter()
            .any(|s| line.starts_with(s)),
            "unknown section {line}: {body}"
        );
    }
    // The session's first ask is kept verbatim or named in the summary.
    let first = before
        .iter()
        .find(|m| m["role"] == "user")
        .map(text_of)
        .unwrap_or_default();
    let opening: String = first
        .split_whitespace()
        .take(8)
        .collect::<Vec<_>>()
        .join(" ");
    let flat: Vec<String> = after
        .iter()
        .map(|m| text_of(m).split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert!(
        flat.iter().any(|t| t.contains(&opening)),
        "the first ask is gone: {opening}"
    );
}

#[test]
#[ignore = "needs a model server: scripts/e2e-local-llm.sh runs it"]
fn compact_the_example_session_with_the_real_model() {
    let Some(url) = base_url() else { return };
    let file = root().join("examples/bugfix-session.json");
    compact_and_check("bugfix-session", &url, &file, 4000);
    let v = ctx(&[
        "validate",
        temp_dir("bugfix-session")
            .join("compacted.json")
            .to_str()
            .unwrap(),
        "--profile",
        "strict",
    ]);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
    // The facts a small model may leave out are in the extracted sections:
    // the file read and edited and the failing test run in the summarized
    // span; the first ask stays verbatim in the kept head.
    let out = temp_dir("bugfix-session").join("compacted.json");
    let after = messages_of(&out);
    let all: String = after.iter().map(text_of).collect();
    let record = &all[all.find(RECORD_HEADING).unwrap()..];
    assert!(record.contains("billing/invoice.py"), "{record}");
    let errors = &record[record.find("### Errors").unwrap()..];
    assert!(
        !errors.starts_with("### Errors (latest occurrence)\n- none"),
        "{record}"
    );
    assert!(after.contains(&messages_of(&file)[1]));
}

#[test]
#[ignore = "needs a model server: scripts/e2e-local-llm.sh runs it"]
fn compact_a_corpus_transcript_with_the_real_model() {
    let Some(url) = base_url() else { return };
    let Some(corpus) = corpus() else { return };
    let file = corpus.join("mini_astropy12907.traj.json");
    if !file.is_file() {
        skip(&format!("{} is absent", file.display()));
        return;
    }
    compact_and_check("astropy", &url, &file, 16_000);
}

/// A session large enough that the summary request takes the server many
/// seconds: one ask, 60 bulky tool rounds, a final ask.
fn large_session(path: &Path) {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Find why the exporter drops rows."}),
    ];
    for i in 0..60 {
        let id = format!("call_{i}");
        messages.push(
            json!({"role": "assistant", "content": format!("Reading part {i}."),
            "tool_calls": [{"id": id, "type": "function", "function": {"name": "bash",
            "arguments": json!({"command": format!("cat src/export_{i}.py")}).to_string()}}]}),
        );
        let body: String = (0..120)
            .map(|l| format!("def row_{i}_{l}(r):\n    return r.get('field_{l}') or default_{l}\n"))
            .collect();
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": body}));
    }
    messages.push(json!({"role": "user", "content": "Now fix it in src/export_59.py."}));
    messages.push(json!({"role": "assistant", "content": "Fixing src/export_59.py."}));
    std::fs::write(path, serde_json::to_string_pretty(&messages).unwrap()).unwrap();
}

/// `scripts/local-llm.sh CMD` with its own state file.
fn local_llm(cmd: &str, state: &Path) -> Output {
    Command::new("bash")
        .arg(root().join("scripts/local-llm.sh"))
        .arg(cmd)
        .env("LOCAL_LLM_STATE", state)
        .stderr(Stdio::inherit())
        .output()
        .unwrap()
}

#[test]
#[ignore = "needs a model server: scripts/e2e-local-llm.sh runs it"]
fn killing_the_server_mid_compaction_leaves_the_transcript_unchanged() {
    if base_url().is_none() {
        return;
    }
    let dir = temp_dir("kill");
    let input = dir.join("large.json");
    large_session(&input);
    // A second server, this test's own, so the shared one stays up.
    let state = dir.join("server.state");
    let started = local_llm("start", &state);
    assert!(started.status.success(), "second server did not start");
    let url = String::from_utf8(started.stdout).unwrap().trim().to_owned();
    let out = dir.join("out.json");
    let mut child = compact_command(&url, &input, 8000, &out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once its call to the model is in flight, the compaction must still
    // be waiting for the model.
    let port = url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next()?.parse::<u16>().ok())
        .expect("the server's URL names its port");
    let calling = context_engine_testkit::eventually_blocking(Duration::from_secs(60), || {
        context_engine_testkit::connected_to(port).then_some(())
    });
    assert!(calling.is_some(), "the compaction never called the model");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the compaction finished before the server was killed"
    );
    let killed_at = Instant::now();
    let stopped = local_llm("stop", &state);
    assert!(stopped.status.success());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    eprintln!(
        "e2e figures [kill]: ctx ended {:.0} ms after the kill",
        killed_at.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    let json_start = err.find('{').unwrap();
    let report: Value = serde_json::from_str(&err[json_start..]).unwrap();
    assert_eq!(report["outcome"], "aborted", "{report}");
    assert!(
        report["reason"]
            .as_str()
            .unwrap()
            .contains("cannot reach the summarizer"),
        "{report}"
    );
    assert_eq!(report["messages_after"], report["messages_before"]);
    assert_eq!(messages_of(&out), messages_of(&input));
}

#[test]
#[ignore = "needs a model server: scripts/e2e-local-llm.sh runs it"]
fn replay_with_the_real_summarizer_gives_a_consistent_report() {
    let Some(url) = base_url() else { return };
    let o = command()
        .env(KEY_ENV, "local")
        .args([
            "replay",
            // The digest keeps the short example's requests under any
            // window it could compact in; the long session compacts once.
            "examples/coding-session.json",
            "--context-length",
            "16000",
            "--summarizer",
            "openai",
            "--base-url",
            &url,
            "--summarizer-model",
            &model(),
            "--api-key-env",
            KEY_ENV,
            "--summarizer-context-length",
            &SERVER_WINDOW.to_string(),
            "--max-output-tokens",
            &MAX_OUTPUT.to_string(),
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let calls = report["calls"].as_array().unwrap();
    let totals = &report["totals"];
    assert_eq!(totals["calls"].as_u64().unwrap() as usize, calls.len());
    let (mut with, mut without, mut compactions) = (0, 0, 0);
    for call in calls {
        let w = call["tokens_with_engine"].as_u64().unwrap();
        let wo = call["tokens_without_engine"].as_u64().unwrap();
        assert!(w <= wo, "call {}: {w} > {wo}", call["call"]);
        assert_eq!(call["violations_introduced"], 0);
        with += w;
        without += wo;
        if let Some(c) = call["compaction"].as_object() {
            compactions += 1;
            assert!(c["tokens_after"].as_u64() < c["tokens_before"].as_u64());
            assert!(c["messages_after"].as_u64() < c["messages_before"].as_u64());
            eprintln!(
                "e2e figures [replay]: compaction at call {} took {} ms (summarizer call \
                 included), tokens {} -> {}",
                call["call"], c["elapsed_ms"], c["tokens_before"], c["tokens_after"]
            );
        }
    }
    assert_eq!(totals["prompt_tokens_with_engine"].as_u64().unwrap(), with);
    assert_eq!(
        totals["prompt_tokens_without_engine"].as_u64().unwrap(),
        without
    );
    assert_eq!(totals["compactions"].as_u64().unwrap(), compactions);
    assert!(compactions >= 1, "no compaction at this window: {totals}");
    eprintln!(
        "e2e figures [replay]: {} calls, prompt tokens {without} -> {with}, {compactions} \
         compaction(s)",
        calls.len()
    );
}

/// `ctx serve --summarizer upstream` in front of the real model: the
/// background summary is asked of the agent's own upstream (the model
/// answering its requests), the compaction carries it, and its tokens are
/// counted apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a model server: scripts/e2e-local-llm.sh runs it"]
async fn serve_summarizes_with_the_agents_own_model() {
    let Some(url) = base_url() else { return };
    let dir = temp_dir("serve-upstream");
    let serve = serve::start(
        &dir,
        &[
            "--upstream",
            &url,
            "--summarizer",
            "upstream",
            "--context-length",
            "4000",
            "--max-output-tokens",
            "200",
            "--summarizer-timeout",
            TIMEOUT_SECS,
            "--set",
            "serve.summary_watermark=0.5",
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let stats = |client: reqwest::Client, addr: String| async move {
        let r = client
            .get(format!("http://{addr}/ctx/sessions/lexer"))
            .header("authorization", "Bearer local")
            .send()
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        v["stats"].clone()
    };
    let mut waited = false;
    let mut last = Value::Null;
    for turns in (2..60).step_by(3) {
        let body = json!({"model": model(), "messages": lexer_session(turns), "max_tokens": 8});
        let r = client
            .post(format!("http://{}/v1/chat/completions", serve.addr))
            .header("authorization", "Bearer local")
            .header("x-ctx-session", "lexer")
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(Duration::from_secs(900))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", serve.stderr());
        r.bytes().await.unwrap();
        last = stats(client.clone(), serve.addr.clone()).await;
        if !waited && last["background_started"] == 1 {
            // The model writes the summary in the background: let it.
            let deadline = Instant::now() + Duration::from_secs(900);
            loop {
                let m = context_engine_testkit::proxy::metrics_text(serve.socket_addr()).await;
                if m.lines()
                    .any(|l| l.starts_with("ctx_summary_calls_total") && !l.ends_with(" 0"))
                {
                    break;
                }
                assert!(Instant::now() < deadline, "no summary: {}", serve.stderr());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            waited = true;
        }
        if last["compactions"].as_u64() > Some(0) {
            break;
        }
    }
    assert!(last["compactions"].as_u64() > Some(0), "compacted: {last}");
    // The model was asked and its tokens counted. Its text is the summary,
    // or, when the 135M model loops or continues the transcript, rejected
    // as degenerate with the extractive summary in its place and the
    // reason on the session (as `compact_and_check` accepts): both are
    // checked, and the outcome is printed.
    assert!(last["summary_calls"].as_u64() >= Some(1), "{last}");
    assert!(last["summary_prompt_tokens"].as_u64() > Some(0), "{last}");
    let fallback = last["last_summary_fallback"].as_str().unwrap_or("");
    eprintln!(
        "e2e outcome [serve upstream]: {} {fallback}",
        last["last_summarizer"]
    );
    match last["last_summarizer"].as_str() {
        Some("upstream") => assert_eq!(last["last_summary_fallback"], Value::Null, "{last}"),
        Some("extractive") => assert!(
            fallback.starts_with("degenerate summary rejected"),
            "a fallback other than a rejected degenerate summary: {last}\n{}",
            serve.stderr()
        ),
        _ => panic!("no summarizer named: {last}"),
    }
    eprintln!(
        "e2e figures [serve upstream]: {} summary call(s), {} prompt + {} completion tokens",
        last["summary_calls"], last["summary_prompt_tokens"], last["summary_completion_tokens"]
    );
}
