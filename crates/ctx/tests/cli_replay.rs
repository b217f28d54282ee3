#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `ctx replay` end to end: the shipped example and every corpus transcript
//! replay with figures that hold together, and bad input says why.

mod common;

use common::ctx;
use serde_json::Value;

const EXAMPLE: &str = "examples/coding-session.json";
const EXAMPLE_WINDOW: &str = "16000";

fn replay_json(file: &str, window: &str) -> Value {
    let out = ctx(&["replay", file, "--context-length", window, "--json"]);
    assert!(
        out.status.success(),
        "{file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

/// The report's figures agree with each other.
fn assert_consistent(r: &Value) {
    let calls = r["calls"].as_array().unwrap();
    assert!(!calls.is_empty());
    let (mut with, mut without) = (0, 0);
    for c in calls {
        assert!(
            u(&c["tokens_with_engine"]) <= u(&c["tokens_without_engine"]),
            "{c}"
        );
        assert_eq!(u(&c["violations_introduced"]), 0, "{c}");
        with += u(&c["tokens_with_engine"]);
        without += u(&c["tokens_without_engine"]);
    }
    let t = &r["totals"];
    assert_eq!(u(&t["prompt_tokens_with_engine"]), with);
    assert_eq!(u(&t["prompt_tokens_without_engine"]), without);
    assert!(u(&t["cache_hit_tokens"]) <= with);
    // The unmanaged bill is a baseline only where its requests fit the
    // window (a provider rejects the rest; requests under the cache's
    // minimum prefix are never cached, which a tiny window forces), and
    // where no request was fitted (clipping breaks the prompt cache).
    if u(&t["largest_request_without_engine"]) <= u(&r["context_length"])
        && u(&t["fitted"]) == 0
        && t["unfittable_calls"].as_array().unwrap().is_empty()
    {
        assert!(
            t["estimated_cost_with_engine"].as_f64().unwrap()
                <= t["estimated_cost_without_engine"].as_f64().unwrap(),
            "{t}"
        );
    }
    // The scheduled engine costs no more than digesting on every call
    // (where the session fits the window; past it, compaction timing
    // decides the bill and the cache model hardly matters).
    if let Some(costs) = r
        .get("costs")
        .filter(|_| u(&t["largest_request_without_engine"]) <= u(&r["context_length"]))
    {
        assert!(
            costs["scheduled"]["estimated_cost"].as_f64().unwrap()
                <= costs["every_call_digest"]["estimated_cost"]
                    .as_f64()
                    .unwrap()
                    * (1.0 + 1e-9),
            "{costs}"
        );
    }
}

#[test]
fn the_example_replays_with_a_compaction_and_consistent_figures() {
    let r = replay_json(EXAMPLE, EXAMPLE_WINDOW);
    assert_consistent(&r);
    assert!(u(&r["totals"]["compactions"]) >= 1);
    assert_eq!(r["engine"], "compressor");
    let compactions = r["compactions"].as_array().unwrap();
    assert_eq!(compactions.len() as u64, u(&r["totals"]["compactions"]));
    for ret in std::iter::once(&r["retention"]).chain(compactions.iter().map(|c| &c["retention"])) {
        let sum =
            u(&ret["verbatim"]) + u(&ret["in_summary"]) + u(&ret["recallable"]) + u(&ret["lost"]);
        assert_eq!(sum, u(&ret["probes"]), "{ret}");
        assert!(u(&ret["probes"]) > 0);
    }
}

#[test]
fn the_table_explains_itself() {
    let out = ctx(&["replay", EXAMPLE, "--context-length", EXAMPLE_WINDOW]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "model calls replayed through engine `compressor`",
        "without engine",
        "with engine",
        "prompt tokens sent",
        "prompt-cache hits",
        "estimated cost",
        "compactions  1",
        "engine time per call",
        "retention",
        "re-sent after breaks",
        "cache breaks cost",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    // The schedule against the every-call digest, in words.
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("schedule "))
        .unwrap_or_else(|| panic!("no schedule line in:\n{text}"));
    assert!(
        line.contains("against digesting on every call")
            || line.contains("the same bill as digesting on every call"),
        "{line}"
    );
}

#[test]
fn the_json_report_is_stable_apart_from_timings() {
    let r = replay_json(EXAMPLE, EXAMPLE_WINDOW);
    insta::assert_json_snapshot!("replay_example", r, {
        ".totals.engine_time.*" => "[ms]",
        ".calls[].engine_time_ms" => "[ms]",
        ".calls[].compaction.elapsed_ms" => "[ms]",
        ".compactions[].elapsed_ms" => "[ms]",
        // The texts a compaction wrote and replaced are the HTML report's
        // (tests/browser_replay.rs); their count and shape stay here.
        ".compactions[].summary[].content" => "[summary]",
        ".compactions[].archived[].summary[].content" => "[summary]",
        ".compactions[].archived[].replaced[]" => "[message]",
    });
}

/// The corpus transcripts, sorted, as paths `ctx` takes; `None` (skipped,
/// or a failure under `CI=true`) without the corpus.
/// The corpus transcripts and the two shipped examples.
fn corpus_and_examples() -> Option<Vec<String>> {
    let mut files = corpus_files()?;
    files.extend([
        EXAMPLE.to_owned(),
        "examples/bugfix-session.json".to_owned(),
    ]);
    Some(files)
}

fn corpus_files() -> Option<Vec<String>> {
    let files = common::corpus_files()?;
    Some(files.iter().map(|p| p.display().to_string()).collect())
}

#[test]
fn every_corpus_transcript_replays_at_half_its_peak() {
    let Some(files) = corpus_files() else {
        return;
    };
    for file in files {
        let full = replay_json(&file, "10000000");
        let peak = u(&full["totals"]["largest_request_without_engine"]);
        let out = ctx(&[
            "replay",
            &file,
            "--context-length",
            &(peak / 2).to_string(),
            "--json",
        ]);
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_consistent(&r);
        // Never over the window; exit 1 only for calls that cannot fit
        // at all (system prompt + latest ask over the window).
        assert_eq!(u(&r["totals"]["over_window"]["requests"]), 0, "{file}");
        let unfittable = r["totals"]["unfittable_calls"].as_array().unwrap();
        assert_eq!(
            out.status.code(),
            Some(if unfittable.is_empty() { 0 } else { 1 }),
            "{file}"
        );
        let ret = &r["retention"];
        let sum =
            u(&ret["verbatim"]) + u(&ret["in_summary"]) + u(&ret["recallable"]) + u(&ret["lost"]);
        assert_eq!(sum, u(&ret["probes"]), "{file}: {ret}");
        if file.contains(TEXT_ACTIONS_LOSING) {
            // Its agent has no tool to recall with: nothing is recallable,
            // what the request does not show is lost.
            assert_eq!(u(&ret["recallable"]), 0, "{file}: {ret}");
        } else {
            assert_nothing_lost(&file, &r);
        }
    }
}

/// Issue 38: replayed at a half, a quarter and a sixth of its peak window,
/// no session loses a fact (user asks, files, commands, errors: each in
/// the last request verbatim, in a summary, or recallable by an agent that
/// can call the engine's tools), however often it compacts, unless the
/// window cannot hold the system prompt, the latest exchange and the state
/// record: then the replay says so on that call (a warning that starts with
/// `LEDGER_CUT`, or the call cannot fit at all), never silently. And no two
/// compactions fewer than three calls apart without the thrash warning.
#[test]
fn nothing_is_lost_at_a_half_a_quarter_and_a_sixth_of_the_peak() {
    let Some(files) = corpus_and_examples() else {
        return;
    };
    let said = |c: &Value, prefix: &str| {
        c["notices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["text"].as_str().unwrap().starts_with(prefix))
    };
    let mut checked = 0;
    for file in &files {
        let full = replay_json(file, "10000000");
        let peak = u(&full["totals"]["largest_request_without_engine"]);
        for divisor in [2, 4, 6] {
            let window = (peak / divisor).to_string();
            let out = ctx(&[
                "replay",
                file,
                "--context-length",
                &window,
                "--json",
                "--no-baseline",
            ]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            if out.status.code() == Some(2) && stderr.contains("too small for the system prompt") {
                // The replay says so: no request can be made at all.
                continue;
            }
            let r: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{file} at {window}: {e}: {stderr}"));
            let at = format!("{file} at 1/{divisor} of its peak ({window} tokens)");
            let calls = r["calls"].as_array().unwrap();
            let last = calls.last().unwrap();
            let ret = &r["retention"];
            let excused =
                said(last, context_engine::host::LEDGER_CUT) || !last["unfittable"].is_null();
            assert!(
                u(&ret["lost"]) == 0 || excused,
                "{at}: lost silently {}",
                ret["lost_probes"]
            );
            let compacted: Vec<u64> = calls
                .iter()
                .filter(|c| !c["compaction"].is_null())
                .map(|c| u(&c["call"]))
                .collect();
            for pair in compacted.windows(2) {
                let later = &calls[pair[1] as usize];
                assert!(
                    pair[1] - pair[0] >= u64::from(context_engine::engine::THRASH_CALLS)
                        || said(later, context_engine::host::THRASH),
                    "{at}: compactions before calls {} and {} without a thrash warning",
                    pair[0],
                    pair[1]
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 3 * 2, "only {checked} replays ran");
}

/// The corpus session whose half peak leaves messages out of the request
/// (see [`PRESENT_SHARE_UNMET`]): a text-action agent's, which cannot call
/// the engine's tools, so what they held is lost to it, not recallable.
const TEXT_ACTIONS_LOSING: &str = "mini_github_issue";

/// With the (default, in-memory) store nothing is lost: every fact is in
/// the last request, in a summary, or reachable through a handle it names;
/// and every user ask is present (verbatim or in a summary).
fn assert_nothing_lost(file: &str, r: &Value) {
    let ret = &r["retention"];
    assert_eq!(u(&ret["lost"]), 0, "{file}: lost {}", ret["lost_probes"]);
    let asks = &ret["asks"];
    assert!(u(&asks["probes"]) > 0, "{file}: no ask");
    assert_eq!(
        u(&asks["verbatim"]) + u(&asks["in_summary"]),
        u(&asks["probes"]),
        "{file}: asks not present: {}",
        asks["not_present"]
    );
}

#[test]
fn the_examples_lose_nothing_at_half_their_peak_and_below() {
    for file in [EXAMPLE, "examples/bugfix-session.json"] {
        let full = replay_json(file, "10000000");
        let peak = u(&full["totals"]["largest_request_without_engine"]);
        for window in [peak / 2, peak / 4] {
            let r = replay_json(file, &window.to_string());
            assert_consistent(&r);
            assert_nothing_lost(&format!("{file} at {window}"), &r);
        }
    }
}

/// Sessions whose facts are not nine in ten present at half their peak,
/// with the floor they keep (present facts of all): mini_github_issue's
/// half peak is a 1,024-token window that the system prompt, the task and
/// the last action nearly fill, so no summary fits beside them, and the
/// request is fitted under the threshold with a note saying what was left
/// out (its agent writes text actions and has no tool to read them back:
/// the note names none, and they are lost to it).
const PRESENT_SHARE_UNMET: &[(&str, u64, u64)] = &[("mini_github_issue", 3, 13)];

/// Issue 13's retention goal: at half the peak, at least nine in ten of
/// the session's facts (asks, files, commands, error lines) are in the
/// last request verbatim or in a summary, not merely recallable, over the
/// corpus and the two examples together, and in each session but the
/// known ones (which keep their floor).
#[test]
fn nine_in_ten_facts_stay_present_at_half_the_peak() {
    let Some(files) = corpus_and_examples() else {
        return;
    };
    let (mut present, mut probes) = (0, 0);
    let mut per_session = Vec::new();
    for file in &files {
        let full = replay_json(file, "10000000");
        let peak = u(&full["totals"]["largest_request_without_engine"]);
        let out = ctx(&[
            "replay",
            file,
            "--context-length",
            &(peak / 2).to_string(),
            "--json",
        ]);
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        let ret = &r["retention"];
        let (p, n) = (
            u(&ret["verbatim"]) + u(&ret["in_summary"]),
            u(&ret["probes"]),
        );
        present += p;
        probes += n;
        per_session.push(format!("{file}: {p} of {n}"));
        match PRESENT_SHARE_UNMET
            .iter()
            .find(|(name, _, _)| file.contains(name))
        {
            Some(&(_, floor, of)) => {
                assert_eq!(n, of, "{file}: {ret}");
                assert!(
                    p >= floor,
                    "{file}: {p} of {n} present, floor {floor}: {ret}"
                );
            }
            None => assert!(10 * p >= 9 * n, "{file}: {p} of {n} present: {ret}"),
        }
    }
    assert!(
        10 * present >= 9 * probes,
        "{present} of {probes} present: {per_session:#?}"
    );
}

#[test]
fn the_plot_is_an_svg_with_both_series() {
    let dir = std::env::temp_dir().join(format!("ctx-replay-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("replay.svg");
    let out = ctx(&[
        "replay",
        EXAMPLE,
        "--context-length",
        EXAMPLE_WINDOW,
        "--plot",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"));
    for label in ["without engine", "with engine", "compaction", "threshold"] {
        assert!(svg.contains(label), "missing {label}");
    }
}

#[test]
fn a_transcript_without_model_calls_is_refused_with_a_reason() {
    let dir = std::env::temp_dir().join(format!("ctx-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("no-calls.json");
    std::fs::write(&path, r#"[{"role":"user","content":"hi"}]"#).unwrap();
    let out = ctx(&["replay", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("no assistant message"), "{err}");

    std::fs::write(
        &path,
        r#"[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"x","content":"?"},{"role":"assistant","content":"ok"}]"#,
    )
    .unwrap();
    let out = ctx(&["replay", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("message 1: orphan-tool-result"), "{err}");
    assert!(err.contains("ctx validate"), "{err}");
}

#[test]
fn a_plugin_that_refuses_every_compaction_is_reported_as_such() {
    if !common::python() {
        return;
    }
    // The test plugin answers every compaction with an invalid transcript.
    let dir = std::env::temp_dir().join(format!("ctx-replay-refuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.yaml");
    let plugins = common::root().join("crates/context-engine-plugin-host/tests/plugins");
    std::fs::write(
        &config,
        format!(
            "context:\n  engine: misbehave\nplugins:\n  dirs: [{}]\nengines:\n  misbehave:\n    mode: invalid\n",
            serde_json::to_string(&plugins.display().to_string()).unwrap()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let args = [
        "replay",
        "examples/bugfix-session.json",
        "--context-length",
        "3000",
    ];
    let out = ctx(&[&args[..], &["--config", config, "--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &r["totals"];
    assert_eq!(u(&t["compactions"]), 0, "{t}");
    let attempts = u(&t["compactions_failed"]) + u(&t["compactions_refused"]);
    assert!(attempts >= 1, "{t}");
    let first = t["first_compaction_failure"].as_str().unwrap();
    assert!(
        first.contains("misbehave") && first.contains("orphan"),
        "{first}"
    );
    let missed = r["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            ["failed", "refused"].contains(&c["missed_compaction"]["kind"].as_str().unwrap_or(""))
        })
        .count() as u64;
    assert_eq!(missed, attempts);
    // The table says so, never "never reached the threshold".
    let out = ctx(&[&args[..], &["--config", config]].concat());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(!table.contains("never reached"), "{table}");
    assert!(table.contains("attempted"), "{table}");
    assert!(
        table.contains(&format!("attempted {attempts} time(s), all ")),
        "{table}"
    );
    assert!(table.contains("(first reason: "), "{table}");
    // And an engine that compacts reports no failures.
    let r = replay_json(EXAMPLE, EXAMPLE_WINDOW);
    assert_eq!(u(&r["totals"]["compactions_refused"]), 0);
    assert!(r["totals"]["first_compaction_failure"].is_null());
}

#[test]
fn a_window_that_cannot_hold_a_request_is_refused_or_reported() {
    // At the flag: 0, or no room for the system prompt.
    for window in ["0", "5"] {
        let out = ctx(&["replay", EXAMPLE, "--context-length", window]);
        assert_eq!(out.status.code(), Some(2), "{window}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains("--context-length"), "{err}");
    }
    let out = ctx(&["compact", EXAMPLE, "--context-length", "0"]);
    assert_eq!(out.status.code(), Some(2));

    // Room for the system prompt but not for the latest ask: those calls
    // are reported as unfittable, none goes out over the window, exit 1.
    let full = replay_json(EXAMPLE, "10000000");
    let first = u(&full["calls"][0]["tokens_without_engine"]);
    let out = ctx(&[
        "replay",
        EXAMPLE,
        "--context-length",
        &(first - 5).to_string(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(u(&r["totals"]["over_window"]["requests"]), 0);
    assert!(
        !r["totals"]["unfittable_calls"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("could not fit the window"), "{err}");
    assert!(err.contains("system prompt "), "{err}");
}

const SESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../context-engine/tests/fixtures/sessions"
);

/// Claude Code's and Codex's session logs, and an Anthropic request file,
/// are read by `replay`, `inspect` and `validate`.
#[test]
fn agent_session_logs_and_anthropic_requests_are_read() {
    let dir = std::env::temp_dir().join(format!("ctx-replay-anthropic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let anthropic = dir.join("anthropic.json");
    std::fs::write(
        &anthropic,
        r#"{"system":"You are helpful.","messages":[{"role":"user","content":"list files"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"bash","input":{"cmd":"ls"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a.py"}]}]}"#,
    )
    .unwrap();
    let claude = format!("{SESSIONS}/claude-code-session.jsonl");
    let codex = format!("{SESSIONS}/rollout-2026-01-01T10-00-00-0199a1b2.jsonl");
    for (path, format, calls) in [
        (anthropic.to_str().unwrap(), "anthropic", 1),
        (claude.as_str(), "claude-code", 4),
        (codex.as_str(), "codex", 4),
    ] {
        let r = replay_json(path, "8000");
        assert_consistent(&r);
        assert_eq!(r["calls"].as_array().unwrap().len(), calls, "{path}");
        let out = ctx(&["validate", path, "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(out.status.success(), "{path}: {v}");
        let rules = if format == "codex" {
            "responses"
        } else {
            "anthropic"
        };
        assert_eq!(v["profile"], rules, "{path}: {v}");
        let out = ctx(&["validate", path, "--profile", "openai"]);
        assert!(out.status.success(), "{path}");
        let out = ctx(&["inspect", path, "--json"]);
        assert!(
            out.status.success(),
            "{path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["format"], format, "{path}: {v}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A recorded tool-using session, 20 s between messages and 10 minutes
/// before message `gap_at`: 30 file reads of ~850 tokens.
fn timed_session(gap_at: usize) -> Value {
    let mut t = 1_750_000_000.0;
    let mut at = |i: usize| {
        t += 20.0 + if i == gap_at { 600.0 } else { 0.0 };
        t
    };
    let mut m = vec![
        serde_json::json!({"role": "system", "content": "You are a coding agent.", "timestamp": at(0)}),
        serde_json::json!({"role": "user", "content": "Make the test suite pass.", "timestamp": at(1)}),
    ];
    for k in 0..30 {
        let id = format!("c{k}");
        let i = m.len();
        m.push(
            serde_json::json!({"role": "assistant", "content": null, "timestamp": at(i),
            "tool_calls": [{"id": id, "type": "function", "function": {"name": "bash",
            "arguments": format!("{{\"command\":\"cat src/mod_{k}.py\"}}")}}]}),
        );
        let body = format!("def f_{k}(x):\n    return x * {k}  # compute\n").repeat(60);
        m.push(serde_json::json!({"role": "tool", "tool_call_id": id, "content": body, "timestamp": at(i + 1)}));
    }
    let i = m.len();
    m.push(
        serde_json::json!({"role": "assistant", "content": "All tests pass.", "timestamp": at(i)}),
    );
    Value::Array(m)
}

#[test]
fn a_recorded_idle_gap_compacts_on_the_expired_cache_and_says_so() {
    let dir = std::env::temp_dir().join(format!("ctx-replay-cold-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("paused.json");
    // The gap before the seventh read's result: the call after it carries
    // about 70% of the threshold of a 12K window.
    std::fs::write(&path, serde_json::to_vec(&timed_session(15)).unwrap()).unwrap();
    let file = path.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["replay", file, "--context-length", "12000"];
        args.extend_from_slice(extra);
        let out = ctx(&args);
        assert!(out.status.success(), "{}", common::stderr(&out));
        common::stdout(&out)
    };
    let cold = run(&[]);
    assert!(cold.contains("before call 8, cache expired:"), "{cold}");
    let off = run(&["--set", "context.schedule.cold_compaction_from=1"]);
    assert!(!off.contains("cache expired"), "{off}");
    let r: Value = serde_json::from_str(&run(&["--json"])).unwrap();
    assert_consistent(&r);
    let expired: Vec<&Value> = r["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["cache_expired"] == true)
        .collect();
    assert_eq!(expired.len(), 1);
    assert!(expired[0]["compaction"].is_object(), "{}", expired[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A SWE-agent session at a window its system prompt and task fit, with
/// little to spare: no call is unfittable (the check is against the
/// window, not the compaction threshold) and none goes out over the window.
/// It used to report every call unfittable against the threshold ("> window
/// 1,650" at a 2,200-token window).
#[test]
fn a_window_the_system_prompt_and_ask_fit_is_never_unfittable() {
    let Some(files) = corpus_files() else {
        return;
    };
    let Some(file) = files.iter().find(|f| f.ends_with("sweagent_pydicom.traj")) else {
        return common::skip("no sweagent_pydicom.traj in the corpus");
    };
    // Just over the system prompt nothing fits, and the report says how
    // big the system prompt and the ask are.
    let out = ctx(&["replay", file, "--context-length", "1", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    let system: u64 = err
        .split("system prompt alone (")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no system prompt size in: {err}"));
    let out = ctx(&[
        "replay",
        file,
        "--context-length",
        &(system + 1).to_string(),
        "--json",
    ]);
    let tiny: Value = serde_json::from_slice(&out.stdout).unwrap();
    let core = tiny["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| {
            let e = c.get("unfittable").filter(|e| !e.is_null())?;
            Some(u(&e["system_tokens"]) + u(&e["ask_tokens"]))
        })
        .max()
        .expect("unfittable just over the system prompt");
    let window = core + 30;
    let out = ctx(&[
        "replay",
        file,
        "--context-length",
        &window.to_string(),
        "--json",
    ]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &r["totals"];
    assert_eq!(
        t["unfittable_calls"].as_array().unwrap().len(),
        0,
        "window {window} (system prompt + ask {core}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(u(&t["over_window"]["requests"]), 0, "window {window}");
    assert!(
        u(&r["threshold_tokens"]) < core,
        "the threshold is under the ask"
    );
    assert_eq!(out.status.code(), Some(0), "window {window}");
}
