#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Real agents through `ctx serve`: Claude Code (Anthropic Messages) and
//! Codex (OpenAI Responses), their native binaries from the pinned npm
//! packages (`scripts/clients/package.json`, installed by
//! `scripts/e2e-agents.sh` into `.cache/npm-clients`, or `CTX_AGENT_CLIENTS`
//! naming another `node_modules`), offline against the scripted upstream
//! (`agents/scripted.rs`). The upstream makes each agent read
//! [`FILES`] files with its real shell tool, one per step, at a window
//! small enough that the proxy compacts, then finish.
//!
//! Checked: the agent finishes; every upstream request is valid for its
//! API; after a compaction the task and a file read before it are still
//! named; the agent's own session log on disk holds every file it read
//! (the proxy changes what goes upstream, never the agent's transcript);
//! `ctx validate` and `ctx replay` read that log. Every eighth file is
//! over the digest's 4 KB: Claude Code's breakpoint on its result moves to
//! the call before it, and each request carries the previous one's marked
//! prefix whole (Anthropic's cache reads it). The proxy offers its
//! engine tools (`--engine-tools`): the script calls `context_recall` once,
//! on the output of an earlier call, and the proxy resolves it in the
//! client's own format (in a stream, as the rest of the same message), so
//! the agent never sees that call and carries on. A missing binary fails
//! under `CI=true` and is skipped with the reason elsewhere.

mod common;
#[path = "agents/scripted.rs"]
mod scripted;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use context_engine::anthropic::cache::without_cache_control;
use context_engine::compressor::SUMMARY_PREFIX;
use context_engine_testkit::serve::{Serve, Spawn};
use serde_json::Value;

use common::{ctx, skip, stderr, stdout};
use scripted::{Script, Seen};

/// Files each agent reads, one per step.
const FILES: usize = 32;
/// The window `ctx serve` manages, in tokens: small enough that the files
/// overflow it.
const WINDOW: &str = "24000";
const TASK: &str =
    "Read every file_N.txt in this directory with cat, one per command, then say DONE";

fn clients_dir() -> PathBuf {
    std::env::var_os("CTX_AGENT_CLIENTS").map_or_else(
        || common::root().join(".cache/npm-clients/node_modules"),
        PathBuf::from,
    )
}

/// The native binary of a client package, or a skip.
fn binary(relative: &str, what: &str) -> Option<PathBuf> {
    let path = clients_dir().join(relative);
    if path.is_file() {
        return Some(path);
    }
    skip(&format!(
        "{what} is not installed at {} (run scripts/e2e-agents.sh, which installs the pinned clients)",
        path.display()
    ));
    None
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ctx-agents-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(dump) = std::env::var_os("CTX_AGENTS_DUMP") {
            let _ = std::fs::copy(self.0.join("serve.log"), Path::new(&dump).join("serve.log"));
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The line that ends file `k`: unique, so the session log can be searched
/// for it.
fn last_line(k: usize) -> String {
    format!(
        "end of file {k}: checksum {:016x}",
        (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    )
}

/// Files the digest shortens once the agent has read the next one (over
/// its 4 KB): every eighth, from `file_3.txt`.
fn is_big(k: usize) -> bool {
    k % 8 == 3
}

/// Writes `file_0.txt`..: each starts with `FILE k` and holds about 2 KB,
/// the [big](is_big) ones about 6 KB.
fn write_files(dir: &Path) {
    for k in 0..FILES {
        let mut text = format!("FILE {k}\n");
        let lines = if is_big(k) { 160 } else { 40 };
        for j in 0..lines {
            text.push_str(&format!(
                "file {k} line {j}: value {:08x}\n",
                (k * 131 + j * 7919) as u32 ^ 0x5bd1_e995
            ));
        }
        text.push_str(&last_line(k));
        text.push('\n');
        std::fs::write(dir.join(format!("file_{k}.txt")), text).unwrap();
    }
}

/// Starts `ctx serve` in front of `upstream` on a free port (the test
/// kit's spawner, its standard error in `log`); its base URL (without
/// `/v1`) and the process.
fn serve(upstream: &str, log: &Path) -> (String, Serve) {
    let serve = Spawn::new(env!("CARGO_BIN_EXE_ctx"))
        .log(log)
        .args(["--upstream", upstream, "--context-length", WINDOW])
        .arg("--engine-tools")
        .env("CTX_LOG", "info")
        .start_blocking();
    (serve.url(), serve)
}

/// One agent's run: its scratch directories (`home`, `work` with the
/// files), the scripted upstream and `ctx serve` in front of it.
struct Run {
    _serve: Serve,
    _rt: tokio::runtime::Runtime,
    script: Arc<Script>,
    proxy: String,
    serve_log: PathBuf,
    home: PathBuf,
    work: PathBuf,
    _scratch: Scratch,
}

impl Run {
    fn start(name: &str) -> Run {
        let scratch = Scratch::new(name);
        let (home, work) = (scratch.0.join("home"), scratch.0.join("work"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        write_files(&work);
        let rt = runtime();
        let script = Arc::new(Script::new(FILES));
        let upstream = scripted::start(&rt, Arc::clone(&script));
        let serve_log = scratch.0.join("serve.log");
        let (proxy, serve) = serve(&upstream, &serve_log);
        Run {
            _serve: serve,
            _rt: rt,
            script,
            proxy,
            serve_log,
            home,
            work,
            _scratch: scratch,
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A request's whole text (every string in it, joined).
fn all_text(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|i| all_text(i, out)),
        Value::Object(map) => map.values().for_each(|i| all_text(i, out)),
        _ => {}
    }
}

/// The checks on what the upstream received, common to both agents: at
/// least one compaction; after the first, every request names the task,
/// the first file read and a file of the summarized span (the summary's
/// state record), and that file's content has left the request.
fn check_compaction(seen: &[Seen], conversation: &[Value]) {
    let texts: Vec<String> = conversation
        .iter()
        .map(|b| {
            let mut t = String::new();
            all_text(b, &mut t);
            t
        })
        .collect();
    let Some(first) = texts.iter().position(|t| t.contains(SUMMARY_PREFIX)) else {
        panic!(
            "the proxy never compacted over {} requests ({} seen)",
            conversation.len(),
            seen.len()
        );
    };
    // A file read before the compaction whose content it summarized.
    let before = &texts[first - 1];
    let gone = (1..FILES)
        .find(|&k| before.contains(&last_line(k)) && !texts[first].contains(&last_line(k)))
        .expect("the compaction summarized some file's content");
    for (i, t) in texts.iter().enumerate().skip(first) {
        assert!(t.contains(SUMMARY_PREFIX), "request {i} keeps the summary");
        assert!(t.contains(TASK), "request {i} names the task");
        assert!(t.contains("file_0.txt"), "request {i} names file_0.txt");
        assert!(
            t.contains(&format!("file_{gone}.txt")),
            "request {i} names file_{gone}.txt, read before the compaction"
        );
        assert!(
            !t.contains(&last_line(gone)),
            "file {gone}'s content stays out of request {i}"
        );
    }
}

/// Prompt caching: between compactions each request's `field` array starts
/// with the previous request's but for its newest message (item), which
/// the digest shortens once the next batch arrives when it is over 4 KB
/// and which Claude Code re-encodes: the managed prefix stays, byte for
/// byte for Codex, for Claude Code but for the breakpoints it moves.
/// Returns how many times the prefix broke, which must not exceed the
/// compactions.
fn prefix_breaks(conversation: &[Value], field: &str, ignore_cache_control: bool) -> usize {
    let arrays: Vec<Vec<Value>> = conversation
        .iter()
        .map(|b| {
            let v = if ignore_cache_control {
                without_cache_control(&b[field])
            } else {
                b[field].clone()
            };
            v.as_array().cloned().unwrap_or_default()
        })
        .collect();
    arrays
        .windows(2)
        .filter(|w| {
            let (a, b) = (&w[0], &w[1]);
            let stable = a.len().saturating_sub(1);
            b.len() < stable || a[..stable] != b[..stable]
        })
        .count()
}

/// An Anthropic message with string content as the one text block the API
/// reads it as (Claude Code writes its newest message as blocks, to mark
/// it, and as a string once the mark has moved on).
fn as_blocks(message: &Value) -> Value {
    let mut m = message.clone();
    if let Some(text) = m["content"].as_str() {
        m["content"] = serde_json::json!([{"type": "text", "text": text}]);
    }
    m
}

/// The index of the last message of an Anthropic request with a
/// breakpoint.
fn last_marked(request: &Value) -> Option<usize> {
    let request = context_engine::anthropic::Request::from_value(request.clone()).ok()?;
    request
        .messages
        .iter()
        .rposition(|m| context_engine::anthropic::cache::message_breakpoints(m) > 0)
}

/// Anthropic's cache stores a prefix only at a breakpoint and reads it only
/// for a request that carries it whole. Claude Code marks its system
/// prompt and its newest message; the proxy moves that mark off tool
/// results the next request digests (the [big](is_big) files) onto the
/// call before them. So, between compactions, every request carries the
/// previous one's prefix through its last breakpoint (breakpoints aside),
/// and the move happened.
fn check_breakpoints(conversation: &[Value], serve_text: &str) {
    let compactions = serve_text.matches(" compacted ").count();
    let messages = |r: &Value| r["messages"].as_array().cloned().unwrap_or_default();
    let mut unread = 0;
    for pair in conversation.windows(2) {
        let Some(m) = last_marked(&pair[0]) else {
            continue;
        };
        let (a, b) = (messages(&pair[0]), messages(&pair[1]));
        let prefix = |v: &[Value]| {
            Value::Array(
                v[..=m]
                    .iter()
                    .map(|m| without_cache_control(&as_blocks(m)))
                    .collect(),
            )
        };
        if b.len() <= m || prefix(&a) != prefix(&b) {
            unread += 1;
        }
    }
    assert!(
        unread <= compactions,
        "{unread} requests did not carry the previous one's marked prefix, over {compactions} compactions"
    );
    let moved = conversation
        .iter()
        .filter(|r| {
            let m = messages(r);
            m.len() >= 2 && last_marked(r) == Some(m.len() - 2)
        })
        .count();
    assert!(
        moved >= 2,
        "the breakpoint moved off the results of the big files: {moved} requests"
    );
}

/// The agent ran more than [`FILES`] steps, the proxy compacted
/// ([`check_compaction`]), and the prefix held between compactions
/// ([`prefix_breaks`]).
fn check_conversation(
    seen: &[Seen],
    conversation: &[Value],
    serve_text: &str,
    field: &str,
    ignore_cache_control: bool,
) {
    assert!(
        conversation.len() > FILES,
        "{} agent steps",
        conversation.len()
    );
    check_compaction(seen, conversation);
    let compactions = serve_text.matches(" compacted ").count();
    assert!(compactions > 0, "{serve_text}");
    let breaks = prefix_breaks(conversation, field, ignore_cache_control);
    assert!(
        breaks <= compactions,
        "the managed prefix broke {breaks} times over {compactions} compactions"
    );
}

/// The agent's own log: every file's content is in it, and `ctx validate`
/// and `ctx replay` read it.
fn check_session_log(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap();
    for k in 0..FILES {
        assert!(
            text.contains(&last_line(k)),
            "the agent's session log holds file {k} (the proxy never changes it)"
        );
    }
    let path = log.to_str().unwrap();
    let out = ctx(&["validate", path]);
    assert!(
        out.status.success(),
        "ctx validate: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = ctx(&["replay", path, "--context-length", WINDOW, "--json"]);
    assert!(out.status.success(), "ctx replay: {}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report.is_object());
}

/// The proxy answered the script's `context_recall` with the whole output
/// of the call that read `file_1.txt`, and the agent never saw that call
/// (its session log has no trace of it).
fn check_recall(script: &Script, log: &Path) {
    let recalled = script.recalled.lock().unwrap().clone();
    let recalled = recalled.expect("the script called context_recall and got an answer");
    assert!(
        recalled.contains("FILE 1") && recalled.contains(&last_line(1)),
        "the recall brought file 1 back whole: {recalled}"
    );
    let text = std::fs::read_to_string(log).unwrap();
    assert!(
        !text.contains("context_recall") && !text.contains(scripted::RECALL_ID),
        "the agent never saw the engine's call"
    );
}

/// Whether a request is the proxy's continuation after resolving the
/// script's `context_recall` (not a request of the agent's).
fn is_recall_round(body: &Value) -> bool {
    body.to_string().contains(scripted::RECALL_ID)
}

fn find_file(dir: &Path, pred: &dyn Fn(&Path) -> bool) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let p = entry.path();
        if p.is_dir() {
            if let Some(found) = find_file(&p, pred) {
                return Some(found);
            }
        } else if pred(&p) {
            return Some(p);
        }
    }
    None
}

#[test]
fn claude_code_through_ctx_serve() {
    let Some(claude) = binary("@anthropic-ai/claude-code-linux-x64/claude", "Claude Code") else {
        return;
    };
    let run = Run::start("claude");
    let (home, work, proxy, script) = (&run.home, &run.work, &run.proxy, &run.script);

    let out = Command::new(&claude)
        .args([
            "-p",
            TASK,
            "--output-format",
            "json",
            "--allowedTools",
            "Bash",
        ])
        .current_dir(work)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("ANTHROPIC_BASE_URL", proxy)
        .env("ANTHROPIC_API_KEY", "sk-ant-scripted")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let serve_text = std::fs::read_to_string(&run.serve_log).unwrap_or_default();
    assert!(
        out.status.success(),
        "claude failed: {}\n{}\nserve log:\n{serve_text}",
        stdout(&out),
        stderr(&out)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["is_error"], false, "{result}");
    assert!(
        result["result"]
            .as_str()
            .is_some_and(|r| r.contains("DONE")),
        "the agent finished: {result}"
    );

    let seen = script.seen.lock().unwrap().clone();
    let mut conversation = Vec::new();
    for s in &seen {
        assert!(s.path.starts_with("/v1/messages"), "{}", s.path);
        assert_eq!(s.headers["x-api-key"], "sk-ant-scripted");
        assert!(s.headers.contains_key("anthropic-version"));
        if s.path.contains("count_tokens") {
            continue;
        }
        let request = context_engine::anthropic::Request::from_value(s.body.clone())
            .unwrap_or_else(|e| panic!("upstream request is not Anthropic: {e}"));
        let violations = context_engine::validate::anthropic::validate(&request);
        assert!(
            violations.is_empty(),
            "invalid upstream request: {violations:?}"
        );
        assert!(
            context_engine::anthropic::cache::breakpoints(&request)
                <= context_engine::anthropic::cache::MAX_BREAKPOINTS
        );
        if s.body["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "Bash"))
            && !is_recall_round(&s.body)
        {
            conversation.push(s.body.clone());
        }
    }
    check_conversation(&seen, &conversation, &serve_text, "messages", true);
    check_breakpoints(&conversation, &serve_text);

    let session = result["session_id"].as_str().unwrap().to_owned();
    let log = find_file(&home.join(".claude"), &|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == format!("{session}.jsonl"))
    })
    .expect("Claude Code wrote its session log");
    check_session_log(&log);
    check_recall(script, &log);
}

#[test]
fn codex_through_ctx_serve() {
    let Some(codex) = binary(
        "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
        "Codex",
    ) else {
        return;
    };
    let run = Run::start("codex");
    let (home, work, proxy, script) = (&run.home, &run.work, &run.proxy, &run.script);
    let codex_home = run.home.join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model = \"gpt-5-codex\"\nmodel_provider = \"scripted\"\n\n\
             [model_providers.scripted]\nname = \"scripted\"\nbase_url = \"{proxy}/v1\"\n\
             env_key = \"SCRIPTED_API_KEY\"\nwire_api = \"responses\"\n\n\
             [analytics]\nenabled = false\n\n[feedback]\nenabled = false\n\n\
             [features]\nplugins = false\n"
        ),
    )
    .unwrap();

    let out = Command::new(&codex)
        .args([
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--json",
            TASK,
        ])
        .current_dir(work)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("CODEX_HOME", &codex_home)
        .env("SCRIPTED_API_KEY", "sk-scripted")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let serve_text = std::fs::read_to_string(&run.serve_log).unwrap_or_default();
    let events = stdout(&out);
    assert!(
        out.status.success(),
        "codex failed: {events}\n{}\nserve log:\n{serve_text}",
        stderr(&out)
    );
    assert!(
        events
            .lines()
            .any(|l| l.contains("agent_message") && l.contains("DONE")),
        "the agent finished: {events}"
    );

    let seen = script.seen.lock().unwrap().clone();
    let mut conversation = Vec::new();
    for s in &seen {
        assert_eq!(s.path, "/v1/responses");
        assert_eq!(s.headers["authorization"], "Bearer sk-scripted");
        let request = context_engine::responses::Request::from_value(s.body.clone())
            .unwrap_or_else(|e| panic!("upstream request is not a Responses request: {e}"));
        let violations = context_engine::validate::responses::validate(&request);
        assert!(
            violations.is_empty(),
            "invalid upstream request: {violations:?}"
        );
        if !is_recall_round(&s.body) {
            conversation.push(s.body.clone());
        }
    }
    check_conversation(&seen, &conversation, &serve_text, "input", false);
    assert!(
        !serve_text.contains("diverged"),
        "Codex's input is append-only: one lineage"
    );

    let log = find_file(&codex_home.join("sessions"), &|p| {
        p.extension().is_some_and(|e| e == "jsonl")
    })
    .expect("Codex wrote its rollout");
    check_session_log(&log);
    check_recall(script, &log);
}
