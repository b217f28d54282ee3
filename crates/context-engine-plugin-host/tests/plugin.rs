#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Engine registry and process plugins, through the real protocol: the
//! shipped Python example (`plugins/context_engine/last-turns`), a
//! test plugin that misbehaves on demand (`tests/plugins/.../misbehave`)
//! and one that answers canned results (`tests/plugins/.../canned`, a
//! shell script).
//! Skipped, with the reason printed, where `python3` is missing.

use context_engine_testkit as common;

use std::path::PathBuf;
use std::sync::Arc;

use context_engine::engine::{
    CompressRequest, ContextEngine, EngineError, ModelInfo, SelectRequest, SessionInfo,
    ToolCallContext, TurnInfo, Usage,
};
use context_engine::message::{Message, Role, ToolCall};
use context_engine::plugin::{
    EngineContext, EngineSource, EventKind, FailureKind, PluginError, PluginManifest, Refusal,
    find_plugin, select_engine,
};
use context_engine::tokens::{CountOptions, EstimateCounter, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::validate::{Profile, validate};
use context_engine_plugin_host::{Host, ProcessEngine};
use serde_json::{Value, json};

use common::python;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The repository root: holds `plugins/context_engine/last-turns`.
fn repo_root() -> PathBuf {
    manifest_dir().join("../..")
}

/// Holds `context_engine/misbehave`.
fn test_plugins() -> PathBuf {
    manifest_dir().join("tests/plugins")
}

fn counter() -> Arc<dyn TokenCounter> {
    Arc::new(EstimateCounter::new(CountOptions::default()))
}

/// A fresh scratch folder for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ce-plugin-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Requests the misbehave plugin saw, in order.
fn requests(log: &PathBuf) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A system prompt and `turns` user turns, each with a tool call, its
/// result and an answer.
fn session(turns: usize) -> Vec<Message> {
    let mut out = vec![Message::system("You are a careful coding agent.")];
    for t in 0..turns {
        let id = format!("call_{t}");
        out.push(Message::user(format!(
            "Task {t}: look at file_{t}.py and fix it."
        )));
        out.push(Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                id.clone(),
                "bash",
                format!("{{\"command\": \"cat file_{t}.py\"}}"),
            )],
        ));
        out.push(Message::tool_result(
            id,
            format!("def f_{t}():\n    return {t}\n").repeat(20),
        ));
        out.push(Message::assistant(format!("Fixed file_{t}.py.")));
    }
    out
}

/// What the misbehave plugin's `compress` shortens validly.
fn short_session() -> Vec<Message> {
    vec![
        Message::system("system prompt"),
        Message::user("first question ".repeat(30)),
        Message::assistant("first answer ".repeat(30)),
        Message::user("second question"),
    ]
}

fn misbehave(section: Value) -> ProcessEngine {
    let path = find_plugin("misbehave", &[test_plugins()]).unwrap();
    let manifest = PluginManifest::load(&path).unwrap();
    let ctx = EngineContext::new(counter(), 10_000).with_section(section);
    let mut engine = ProcessEngine::new(manifest, ctx);
    engine.start().unwrap();
    engine
}

fn failures(engine: &ProcessEngine) -> Vec<(FailureKind, String)> {
    engine
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Failure(k) => Some((k, e.detail)),
            _ => None,
        })
        .collect()
}

#[test]
fn builtin_compressor_is_selected_by_name() {
    let selected = select_engine(
        "compressor",
        EngineContext::new(counter(), 1000),
        &[],
        true,
        Some(&Host),
    )
    .unwrap();
    assert_eq!(selected.engine.name(), "compressor");
    assert_eq!(selected.source, EngineSource::Builtin);
    assert!(selected.warnings.is_empty());
}

#[test]
fn unknown_name_falls_back_to_the_compressor_with_a_warning() {
    let dirs = vec![PathBuf::from("/nonexistent/one"), test_plugins()];
    let selected = select_engine(
        "no-such-engine",
        EngineContext::new(counter(), 1000),
        &dirs,
        false,
        Some(&Host),
    )
    .unwrap();
    assert_eq!(selected.engine.name(), "compressor");
    assert_eq!(
        selected.source,
        EngineSource::Fallback {
            requested: "no-such-engine".into()
        }
    );
    assert_eq!(selected.warnings.len(), 1);
    let warning = &selected.warnings[0];
    assert!(warning.contains("`no-such-engine` not found"), "{warning}");
    assert!(
        warning.contains("/nonexistent/one/context_engine/no-such-engine"),
        "{warning}"
    );
    assert!(warning.contains("built-in compressor"), "{warning}");
}

#[test]
fn unknown_required_engine_is_an_error_naming_the_searched_folders() {
    let dirs = vec![
        PathBuf::from("/nonexistent/a"),
        PathBuf::from("/nonexistent/b"),
    ];
    let err = select_engine(
        "lcm",
        EngineContext::new(counter(), 1000),
        &dirs,
        true,
        Some(&Host),
    )
    .unwrap_err();
    let PluginError::NotFound { name, searched } = &err else {
        panic!("expected NotFound, got {err}");
    };
    assert_eq!(name, "lcm");
    assert_eq!(searched.len(), 6);
    let text = err.to_string();
    assert!(text.contains("/nonexistent/a/lcm"), "{text}");
    assert!(text.contains("/nonexistent/a/context_engine/lcm"), "{text}");
    assert!(
        text.contains("/nonexistent/b/plugins/context_engine/lcm"),
        "{text}"
    );
}

#[test]
fn broken_manifest_is_reported_with_file_and_line() {
    let dir = scratch("broken");
    let folder = dir.join("context_engine/broken");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("plugin.yaml"),
        "name: broken\nversion: '1'\ncommand: [python3]\ntimeouts:\n  call_seconds: 3\n",
    )
    .unwrap();
    let dirs = vec![dir.clone()];
    let err = select_engine(
        "broken",
        EngineContext::new(counter(), 1000),
        &dirs,
        true,
        Some(&Host),
    )
    .unwrap_err();
    assert!(
        matches!(err, PluginError::Manifest { line: 5, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("plugin.yaml:5"), "{err}");
    let selected = select_engine(
        "broken",
        EngineContext::new(counter(), 1000),
        &dirs,
        false,
        Some(&Host),
    )
    .unwrap();
    assert_eq!(selected.engine.name(), "compressor");
    assert!(
        selected.warnings[0].contains("plugin.yaml:5"),
        "{:?}",
        selected.warnings
    );
}

#[test]
fn plugin_that_cannot_start_falls_back_or_errors_when_required() {
    let dir = scratch("nostart");
    let folder = dir.join("plugins/context_engine/nostart");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("plugin.yaml"),
        "name: nostart\nversion: '1'\ncommand: [./does-not-exist]\n",
    )
    .unwrap();
    let dirs = vec![dir.clone()];
    let err = select_engine(
        "nostart",
        EngineContext::new(counter(), 1000),
        &dirs,
        true,
        Some(&Host),
    )
    .unwrap_err();
    assert!(matches!(err, PluginError::Start { .. }), "{err}");
    assert!(err.to_string().contains("does-not-exist"), "{err}");
    let selected = select_engine(
        "nostart",
        EngineContext::new(counter(), 1000),
        &dirs,
        false,
        Some(&Host),
    )
    .unwrap();
    assert_eq!(selected.engine.name(), "compressor");
    assert!(matches!(selected.source, EngineSource::Fallback { .. }));
}

#[test]
fn example_plugin_is_selected_from_the_repository_root() {
    if !python() {
        return;
    }
    let selected = select_engine(
        "last-turns",
        EngineContext::new(counter(), 1000),
        &[repo_root()],
        true,
        Some(&Host),
    )
    .unwrap();
    assert_eq!(selected.engine.name(), "last-turns");
    assert!(matches!(selected.source, EngineSource::Plugin { .. }));
    assert!(selected.warnings.is_empty(), "{:?}", selected.warnings);
}

#[test]
fn example_plugin_end_to_end() {
    if !python() {
        return;
    }
    let path = find_plugin("last-turns", &[repo_root()]).unwrap();
    let manifest = PluginManifest::load(&path).unwrap();
    let ctx = EngineContext::new(counter(), 2000).with_section(json!({"keep_turns": 2}));
    let mut engine = ProcessEngine::new(manifest, ctx);
    engine.start().unwrap();
    assert!(engine.capabilities().contains(&"compress".to_owned()));
    let pid = engine.pid().unwrap();

    // should_compress by threshold (75% of 2000 = 1500).
    assert!(engine.should_compress(Some(1600)));
    assert!(!engine.should_compress(Some(100)));
    engine.update_from_response(&Usage::new(1700, 20));
    assert!(engine.should_compress(None));

    let messages = session(5);
    assert!(engine.has_content_to_compress(&messages));
    let out = engine
        .compress(&messages, &CompressRequest::new())
        .unwrap()
        .messages;
    assert!(validate(&out, Profile::OpenAi).is_empty(), "{out:?}");
    assert!(out.len() < messages.len());
    let json = |m: &[Message]| m.iter().map(Message::to_value).collect::<Vec<_>>();
    assert_eq!(json(&out[..1]), json(&messages[..1]));
    assert_eq!(out[1].role, Role::User);
    assert_eq!(out[1].text(), "Task 3: look at file_3.py and fix it.");
    assert_eq!(json(&out[1..]), json(&messages[messages.len() - 8..]));
    assert_eq!(engine.state().compression_count, 1);
    assert!(engine.state().last_prompt_tokens.known().is_none());

    // Two turns only: nothing left to drop, reported as such.
    assert!(!engine.has_content_to_compress(&out));
    let err = engine.compress(&out, &CompressRequest::new()).unwrap_err();
    assert!(
        matches!(err, EngineError::NothingToCompress { .. }),
        "{err}"
    );

    let status = engine.status();
    assert_eq!(status.compression_count, 1);
    assert_eq!(status.extra["keep_turns"], json!(2));
    assert_eq!(status.extra["compressions"], json!(1));
    assert_eq!(status.extra["plugin"]["fallback"], json!(false));
    assert_eq!(engine.consecutive_failures(), 0);
    assert!(
        engine
            .events()
            .iter()
            .any(|e| e.kind == EventKind::Stderr && e.detail.contains("keeping the last 2")),
        "stderr is captured: {:?}",
        engine.events()
    );

    let exit = engine.shutdown().expect("the plugin exits by itself");
    assert!(exit.success(), "{exit}");
    assert!(engine.pid().is_none());
    assert!(!PathBuf::from(format!("/proc/{pid}")).exists() || !cfg!(target_os = "linux"));
}

#[test]
fn undeclared_hooks_cost_no_round_trip() {
    if !python() {
        return;
    }
    let dir = scratch("undeclared");
    let log = dir.join("requests.log");
    let mut engine = misbehave(json!({"mode": "ok", "log": log, "capabilities": ["compress"]}));
    let messages = short_session();
    engine.on_session_start("s1", &SessionInfo::default());
    engine.update_from_response(&Usage::new(10, 1));
    let _ = engine.should_compress(Some(10));
    let _ = engine.should_compress_info(Some(10));
    let _ = engine.should_compress_preflight(&messages);
    let _ = engine.should_defer_preflight_to_real_usage(10);
    let _ = engine.has_content_to_compress(&messages);
    assert!(
        engine
            .select_context(&SelectRequest::new(&messages, &messages))
            .is_none()
    );
    let (pruned, n) = engine.prune_tool_results_only(&messages, Some(10));
    assert_eq!((pruned.len(), n), (messages.len(), 0));
    engine.on_turn_complete(&messages, None, &TurnInfo::default());
    let tool = engine.handle_tool_call("noop", &json!({}), &ToolCallContext::default());
    assert!(tool.contains("Unknown context engine tool"), "{tool}");
    let _ = engine.status();
    engine.update_model(&ModelInfo::new("gpt-4o", 128_000));
    engine.on_session_reset();
    engine.on_session_end("s1", &messages);
    assert_eq!(requests(&log), vec!["initialize"]);
    assert_eq!(engine.state().context_length, 128_000);
    assert_eq!(engine.state().threshold_tokens, 96_000);

    let out = engine
        .compress(&messages, &CompressRequest::new())
        .unwrap()
        .messages;
    assert_eq!(out.len(), 2);
    assert_eq!(requests(&log), vec!["initialize", "compress"]);
}

/// One fail-open case: `mode` on `compress` leaves the input and records
/// `kind`.
fn compress_fails_open(mode: &str, kind: FailureKind) {
    if !python() {
        return;
    }
    let dir = scratch(mode);
    let log = dir.join("requests.log");
    let mut engine = misbehave(json!({"mode": mode, "log": log}));
    let threshold_before = engine.state().threshold_tokens;
    let messages = short_session();
    let err = engine
        .compress(&messages, &CompressRequest::new())
        .expect_err(mode);
    assert!(
        matches!(
            err,
            EngineError::Plugin { .. } | EngineError::InvalidOutput { .. }
        ),
        "{mode}: {err}"
    );
    // The host-side state did not count a compaction or adopt a result.
    assert_eq!(engine.state().threshold_tokens, threshold_before, "{mode}");
    let seen = failures(&engine);
    assert_eq!(seen.len(), 1, "{mode}: {seen:?}");
    assert_eq!(seen[0].0, kind, "{mode}: {seen:?}");
    assert_eq!(engine.consecutive_failures(), 1);
    assert!(engine.pid().is_none(), "{mode}: the process was stopped");
    assert!(!engine.is_fallback());
    assert_eq!(engine.state().compression_count, 0);
}

#[test]
fn crash_fails_open() {
    compress_fails_open("crash", FailureKind::Crash);
}

#[test]
fn hang_past_the_timeout_fails_open() {
    compress_fails_open("hang", FailureKind::Timeout);
}

#[test]
fn garbage_fails_open() {
    compress_fails_open("garbage", FailureKind::Malformed);
}

#[test]
fn wrong_id_fails_open() {
    compress_fails_open("wrong_id", FailureKind::WrongId);
}

#[test]
fn invalid_transcript_fails_open() {
    compress_fails_open("invalid", FailureKind::InvalidResult);
    if !python() {
        return;
    }
    // The broken rule stays typed in the error.
    let mut engine = misbehave(json!({"mode": "invalid"}));
    match engine.compress(&short_session(), &CompressRequest::new()) {
        Err(EngineError::InvalidOutput { violation, .. }) => {
            assert_eq!(
                violation.rule,
                context_engine::validate::Rule::OrphanToolResult
            );
        }
        other => panic!("expected InvalidOutput, got {other:?}"),
    }
}

#[test]
fn result_that_is_not_smaller_fails_open() {
    compress_fails_open("bigger", FailureKind::InvalidResult);
}

#[test]
fn invalid_select_context_is_ignored() {
    if !python() {
        return;
    }
    let mut engine = misbehave(json!({"mode": "invalid", "on": "select_context"}));
    let messages = short_session();
    assert!(
        engine
            .select_context(&SelectRequest::new(&messages, &messages))
            .is_none()
    );
    let seen = failures(&engine);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, FailureKind::InvalidResult);
    assert!(seen[0].1.contains("provider rule"), "{seen:?}");
}

/// Every hook's malformed answer (a field of the wrong type, missing
/// messages, a bad state patch) is refused as an `invalid_result` failure
/// whose reason names the method and the field; the hook answers as if the
/// plugin were not there and the host's state is untouched. (The `canned`
/// plugin is a shell script: each refusal restarts it, in milliseconds.)
#[cfg(unix)]
#[test]
fn malformed_answers_are_refused_naming_the_hook_and_the_field() {
    // method -> (answer, what the refusal names)
    let cases = [
        (
            "on_session_start",
            json!({"state": {"context_length": 1.5}}),
            "at `state.context_length`",
        ),
        (
            "should_compress",
            json!("yes"),
            "expected a boolean (got \"yes\")",
        ),
        (
            "should_compress_info",
            json!({"should_compress": 1}),
            "at `should_compress`",
        ),
        (
            "compress",
            json!({"result": []}),
            "missing field `messages`",
        ),
        (
            "select_context",
            json!({"messages": "all"}),
            "at `messages`",
        ),
        (
            "prune_tool_results_only",
            json!({"messages": [{"role": "user"}], "pruned": "1"}),
            "at `pruned`",
        ),
        (
            "should_compress_preflight",
            json!(null),
            "expected a boolean",
        ),
        (
            "should_defer_preflight_to_real_usage",
            json!(1),
            "expected a boolean",
        ),
        (
            "has_content_to_compress",
            json!([true]),
            "expected a boolean",
        ),
        (
            "update_from_response",
            json!({"state": {"threshold_tokens": "big"}}),
            "at `state.threshold_tokens`",
        ),
        ("on_turn_complete", json!({"state": "reset"}), "at `state`"),
        (
            "update_model",
            json!({"state": {"protect_last_n": -1}}),
            "at `state.protect_last_n`",
        ),
        ("get_status", json!(["x"]), "expected an object"),
        (
            "on_session_reset",
            json!({"state": {"last_prompt_tokens": "none"}}),
            "at `state.last_prompt_tokens`",
        ),
        ("on_session_end", json!(true), "expected null or an object"),
    ];
    let hooks: Vec<&str> = cases.iter().map(|(m, _, _)| *m).collect();
    let init = json!({"name": "canned", "protocol_version": 1, "capabilities": hooks});
    let mut table = format!("initialize\t{init}\n");
    for (method, answer, _) in &cases {
        table.push_str(&format!("{method}\t{answer}\n"));
    }
    let answers = scratch("canned").join("answers.tsv");
    std::fs::write(&answers, table).unwrap();
    let path = find_plugin("canned", &[test_plugins()]).unwrap();
    let mut manifest = PluginManifest::load(&path).unwrap();
    manifest
        .env
        .insert("CANNED_ANSWERS".into(), answers.display().to_string());
    let mut engine = ProcessEngine::new(manifest, EngineContext::new(counter(), 10_000));
    engine.start().unwrap();
    let state = engine.state().clone();
    let messages = short_session();

    engine.on_session_start("s1", &SessionInfo::default());
    assert!(
        engine.should_compress(Some(9_000)),
        "the host-side threshold"
    );
    assert!(engine.should_compress_info(Some(10)).block_reason.is_none());
    let err = engine
        .compress(&messages, &CompressRequest::new())
        .unwrap_err();
    let refusal = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<Refusal>())
        .expect("the refusal is the error's source");
    assert_eq!((refusal.method, refusal.path()), ("compress", Some("")));
    assert!(
        engine
            .select_context(&SelectRequest::new(&messages, &messages))
            .is_none()
    );
    let (pruned, n) = engine.prune_tool_results_only(&messages, Some(10));
    assert_eq!((pruned.len(), n), (messages.len(), 0));
    assert!(!engine.should_compress_preflight(&messages));
    assert!(!engine.should_defer_preflight_to_real_usage(10));
    assert!(engine.has_content_to_compress(&messages));
    engine.update_from_response(&Usage::new(10, 1));
    engine.on_turn_complete(&messages, None, &TurnInfo::default());
    engine.update_model(&ModelInfo::new("gpt-4o", 10_000));
    let status = engine.status();
    assert_eq!(status.extra.keys().collect::<Vec<_>>(), ["plugin"]);
    engine.on_session_reset();
    engine.on_session_end("s1", &messages);

    assert_eq!(engine.state().threshold_tokens, state.threshold_tokens);
    assert_eq!(engine.state().protect_last_n, state.protect_last_n);
    assert_eq!(engine.state().compression_count, 0);
    let seen = engine
        .events()
        .into_iter()
        .filter(|e| e.kind == EventKind::Failure(FailureKind::InvalidResult))
        .map(|e| (e.method.unwrap_or_default(), e.detail))
        .collect::<Vec<_>>();
    assert_eq!(seen.len(), cases.len(), "{seen:#?}");
    for ((method, detail), (want, _, names)) in seen.iter().zip(&cases) {
        assert_eq!(method, want);
        assert!(
            detail.starts_with(&format!("`{method}` answer: ")),
            "{method}: {detail}"
        );
        assert!(detail.contains(names), "{method}: {detail}");
    }
    assert!(!engine.is_fallback(), "max_failures: 100");
}

#[test]
fn a_crashed_plugin_is_restarted_on_next_use() {
    if !python() {
        return;
    }
    let dir = scratch("restart");
    let log = dir.join("requests.log");
    let mut engine = misbehave(json!({"mode": "crash_once", "log": log}));
    let messages = short_session();
    engine.on_session_start("s1", &SessionInfo::default());
    assert!(engine.compress(&messages, &CompressRequest::new()).is_err());
    assert_eq!(engine.consecutive_failures(), 1);
    let out = engine
        .compress(&messages, &CompressRequest::new())
        .unwrap()
        .messages;
    assert_eq!(out.len(), 2);
    assert_eq!(engine.consecutive_failures(), 0);
    assert_eq!(
        requests(&log),
        vec!["initialize", "compress", "initialize", "compress"]
    );
}

#[test]
fn repeated_failures_fall_back_to_the_builtin_compressor() {
    if !python() {
        return;
    }
    let dir = scratch("fallback");
    let log = dir.join("requests.log");
    let mut engine = misbehave(json!({"mode": "crash", "log": log}));
    let messages = short_session();
    for attempt in 1..=3 {
        assert!(engine.compress(&messages, &CompressRequest::new()).is_err());
        assert_eq!(engine.is_fallback(), attempt == 3, "attempt {attempt}");
    }
    let warnings = engine.take_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("built-in compressor"), "{warnings:?}");
    assert!(warnings[0].contains("3 times"), "{warnings:?}");
    assert!(
        engine.take_warnings().is_empty(),
        "each warning is taken once"
    );
    let status = engine.status();
    assert_eq!(status.extra["plugin"]["fallback"], json!(true));
    assert_eq!(
        status.extra["plugin"]["warnings"].as_array().unwrap().len(),
        1
    );
    assert!(
        engine
            .events()
            .iter()
            .any(|e| e.kind == EventKind::Fallback)
    );

    // From now on the compressor answers, with no round trip.
    let seen = requests(&log).len();
    let big = session(12);
    let out = engine
        .compress(&big, &CompressRequest::new().with_force(true))
        .unwrap()
        .messages;
    assert!(out.len() < big.len());
    assert!(validate(&out, Profile::OpenAi).is_empty());
    assert!(engine.should_compress(Some(9_000)));
    assert_eq!(requests(&log).len(), seen);
}

#[test]
fn stderr_noise_never_reaches_the_protocol() {
    if !python() {
        return;
    }
    let mut engine = misbehave(json!({"mode": "stderr_noise"}));
    let messages = short_session();
    let out = engine
        .compress(&messages, &CompressRequest::new())
        .unwrap()
        .messages;
    assert_eq!(out.len(), 2);
    let stderr = engine
        .events()
        .iter()
        .filter(|e| e.kind == EventKind::Stderr)
        .count();
    assert!(stderr > 0);
    assert!(failures(&engine).is_empty());
}

#[test]
fn log_notifications_are_recorded() {
    if !python() {
        return;
    }
    let mut engine = misbehave(json!({"mode": "log_note", "on": "should_compress"}));
    assert!(engine.should_compress(Some(1)));
    assert!(
        engine
            .events()
            .iter()
            .any(|e| e.kind == EventKind::Log && e.detail.contains("a note from the plugin"))
    );
    assert_eq!(engine.tool_schemas().len(), 1);
    let answer = engine.handle_tool_call("noop", &json!({}), &ToolCallContext::default());
    assert_eq!(answer, r#"{"ok": "noop"}"#);
}

#[test]
fn within_the_restart_pause_hooks_answer_their_default_without_a_round_trip() {
    if !python() {
        return;
    }
    let dir = scratch("backoff");
    let folder = dir.join("context_engine/slow-restart");
    std::fs::create_dir_all(&folder).unwrap();
    let script = test_plugins().join("context_engine/misbehave/engine.py");
    std::fs::write(
        folder.join("plugin.yaml"),
        format!(
            "name: slow-restart\nversion: '1'\ncommand: [python3, {}]\ntimeouts:\n  restart_backoff_ms: 60000\n",
            script.display()
        ),
    )
    .unwrap();
    let log = dir.join("requests.log");
    let manifest =
        PluginManifest::load(&find_plugin("slow-restart", std::slice::from_ref(&dir)).unwrap())
            .unwrap();
    let ctx =
        EngineContext::new(counter(), 10_000).with_section(json!({"mode": "crash", "log": log}));
    let mut engine = ProcessEngine::new(manifest, ctx);
    engine.start().unwrap();
    let messages = short_session();
    assert!(engine.compress(&messages, &CompressRequest::new()).is_err());
    let err = engine
        .compress(&messages, &CompressRequest::new())
        .unwrap_err();
    assert!(err.to_string().contains("waiting to restart"), "{err}");
    // The threshold default answers, with no process behind it.
    assert!(engine.should_compress(Some(9_000)));
    assert_eq!(requests(&log), vec!["initialize", "compress"]);
    assert_eq!(engine.consecutive_failures(), 1);
    assert!(engine.pid().is_none());
}

#[test]
fn a_plugin_that_hangs_in_initialize_is_abandoned_at_the_startup_deadline() {
    if !python() {
        return;
    }
    let dir = scratch("slow-start");
    let folder = dir.join("context_engine/slow-start");
    std::fs::create_dir_all(&folder).unwrap();
    let script = test_plugins().join("context_engine/misbehave/engine.py");
    std::fs::write(
        folder.join("plugin.yaml"),
        format!(
            "name: slow-start\nversion: '1'\ncommand: [python3, {}]\ntimeouts:\n  startup_ms: 700\n",
            script.display()
        ),
    )
    .unwrap();
    let section = json!({"mode": "hang", "on": "initialize"});
    let dirs = vec![dir.clone()];
    let ctx = || EngineContext::new(counter(), 1000).with_section(section.clone());
    let err = select_engine("slow-start", ctx(), &dirs, true, Some(&Host)).unwrap_err();
    assert!(matches!(err, PluginError::Start { .. }), "{err}");
    assert!(err.to_string().contains("no answer within 700 ms"), "{err}");
    let selected = select_engine("slow-start", ctx(), &dirs, false, Some(&Host)).unwrap();
    assert_eq!(selected.engine.name(), "compressor");
    assert!(
        selected.warnings[0].contains("failed to start"),
        "{:?}",
        selected.warnings
    );
}

#[test]
fn example_plugin_compacts_the_corpus_validly() {
    if !python() {
        return;
    }
    let Some(files) = common::corpus_files() else {
        return;
    };
    let path = find_plugin("last-turns", &[repo_root()]).unwrap();
    let manifest = PluginManifest::load(&path).unwrap();
    let ctx = EngineContext::new(counter(), 128_000).with_section(json!({"keep_turns": 2}));
    let mut engine = ProcessEngine::new(manifest, ctx);
    engine.start().unwrap();
    let mut compacted = 0;
    for file in &files {
        let transcript = Transcript::load(file).unwrap();
        let messages = transcript.messages;
        match engine.compress(&messages, &CompressRequest::new()) {
            Ok(compaction) => {
                let out = compaction.messages;
                compacted += 1;
                assert!(out.len() < messages.len(), "{}", common::name(file));
                assert!(
                    validate(&out, Profile::OpenAi).len()
                        <= validate(&messages, Profile::OpenAi).len(),
                    "{}",
                    common::name(file)
                );
            }
            Err(EngineError::NothingToCompress { .. }) => {}
            Err(e) => panic!("{}: {e}", common::name(file)),
        }
    }
    assert!(
        compacted > 0,
        "no corpus transcript had more than 2 user turns"
    );
    assert!(failures(&engine).is_empty(), "{:?}", failures(&engine));
    assert_eq!(engine.status().extra["compressions"], json!(compacted));
}

#[test]
fn a_dir_that_directly_holds_plugin_folders_is_searched() {
    if !python() {
        return;
    }
    // `plugins.dirs: [<tests/plugins/context_engine>]`: the folder that
    // holds `misbehave/plugin.yaml` itself, not a parent of `context_engine`.
    let direct = test_plugins().join("context_engine");
    let path = find_plugin("misbehave", std::slice::from_ref(&direct)).unwrap();
    assert_eq!(path, direct.join("misbehave").join("plugin.yaml"));
    let selected = select_engine(
        "misbehave",
        EngineContext::new(counter(), 10_000),
        &[direct],
        true,
        Some(&Host),
    )
    .unwrap();
    assert_eq!(selected.engine.name(), "misbehave");
    assert!(matches!(selected.source, EngineSource::Plugin { .. }));
}

/// Records what the fallback compressor's summarizer was handed.
struct Spy(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl context_engine::summarize::Summarizer for Spy {
    fn name(&self) -> &str {
        "spy"
    }
    fn summarize(
        &self,
        request: &context_engine::summarize::SummaryRequest<'_>,
    ) -> Result<String, context_engine::summarize::SummarizeError> {
        let mut seen = self.0.lock().unwrap();
        for m in request.turns {
            seen.push(m.to_value().to_string());
        }
        seen.extend(request.focus_topic.map(str::to_owned));
        seen.extend(request.memory_context.map(str::to_owned));
        Ok("short summary".to_owned())
    }
}

/// Nothing leaves the process unredacted, with the user's patterns,
/// whichever engine runs: a plugin recording its stdin never sees a planted
/// token or a `redact_patterns` match, in any hook, and neither does the
/// summarizer of the compressor the session falls back to.
#[test]
fn plugins_and_their_fallback_never_see_secrets_or_user_patterns() {
    if !python() {
        return;
    }
    const TOKEN: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
    const INTERNAL: &str = "ACME-731946";
    let dir = scratch("egress");
    let stdin_log = dir.join("stdin.log");
    let redactor = context_engine::redact::Redactor::builder()
        // The user's opt-out governs local output only, never egress.
        .enabled(false)
        .pattern("ACME-[0-9]{6}")
        .build()
        .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let path = find_plugin("misbehave", &[test_plugins()]).unwrap();
    let manifest = PluginManifest::load(&path).unwrap();
    let capabilities = [
        "compress",
        "select_context",
        "handle_tool_call",
        "on_session_start",
        "on_turn_complete",
        "prune_tool_results_only",
        "should_compress_preflight",
    ];
    let ctx = EngineContext::new(counter(), 10_000)
        .with_section(json!({"stdin_log": stdin_log, "capabilities": capabilities}))
        .with_redactor(std::sync::Arc::new(redactor))
        .with_summarizer(Box::new(Spy(std::sync::Arc::clone(&seen))));
    let mut engine = ProcessEngine::new(manifest, ctx);
    engine.start().unwrap();

    let mut messages = short_session();
    messages.insert(
        1,
        Message::user(format!("my token is {TOKEN}, ticket {INTERNAL}")),
    );
    messages.insert(
        2,
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "c1",
                "bash",
                format!("{{\"command\": \"gh auth login --with-token {TOKEN} # {INTERNAL}\"}}"),
            )],
        ),
    );
    messages.insert(3, Message::tool_result("c1", format!("ok {INTERNAL}")));
    engine.on_session_start("s1", &SessionInfo::default());
    let request = CompressRequest::new()
        .with_focus_topic(format!("keep {INTERNAL}"))
        .with_memory_context(format!("remember {TOKEN} and {INTERNAL}"));
    let compaction = engine.compress(&messages, &request).unwrap();
    assert!(compaction.report.summarized.is_some());
    let _ = engine.select_context(&SelectRequest::new(&messages, &messages));
    let _ = engine.should_compress_preflight(&messages);
    let _ = engine.prune_tool_results_only(&messages, None);
    engine.on_turn_complete(&messages, None, &TurnInfo::default());
    let args = json!({"query": INTERNAL, "token": TOKEN});
    let _ = engine.handle_tool_call(
        "noop",
        &args,
        &ToolCallContext::default().with_messages(&messages),
    );
    let sent = std::fs::read_to_string(&stdin_log).unwrap();
    for method in ["compress", "select_context", "handle_tool_call"] {
        assert!(
            sent.contains(&format!("\"method\":\"{method}\"")),
            "{method} not sent"
        );
    }
    assert!(sent.contains("gh auth login"), "the messages did travel");
    assert!(!sent.contains(TOKEN), "a token reached the plugin");
    assert!(
        !sent.contains(INTERNAL),
        "a redact_patterns match reached the plugin"
    );

    // Crash it into the fallback: the built-in compressor keeps the user's
    // redactor (and summarizer).
    drop(engine);
    let path = find_plugin("misbehave", &[test_plugins()]).unwrap();
    let manifest = PluginManifest::load(&path).unwrap();
    let redactor = context_engine::redact::Redactor::builder()
        .pattern("ACME-[0-9]{6}")
        .build()
        .unwrap();
    let ctx = EngineContext::new(counter(), 10_000)
        .with_section(json!({"mode": "crash"}))
        .with_redactor(std::sync::Arc::new(redactor))
        .with_summarizer(Box::new(Spy(std::sync::Arc::clone(&seen))));
    let mut engine = ProcessEngine::new(manifest, ctx);
    engine.start().unwrap();
    let long = {
        let mut m = session(40);
        // In the middle, where the summary replaces it.
        m.insert(
            17,
            Message::user(format!("token {TOKEN}, ticket {INTERNAL}")),
        );
        m.insert(18, Message::assistant("noted"));
        m
    };
    while !engine.is_fallback() {
        assert!(engine.compress(&long, &request).is_err());
    }
    let out = engine
        .compress(&long, &request.clone().with_force(true))
        .unwrap();
    assert_eq!(out.report.summarizer.as_deref(), Some("spy"));
    let seen = seen.lock().unwrap().join("\n");
    assert!(
        seen.contains("ticket"),
        "the planted message reached the summarizer"
    );
    assert!(!seen.contains(TOKEN), "a token reached the summarizer");
    assert!(
        !seen.contains(INTERNAL),
        "a redact_patterns match reached the summarizer"
    );
}
