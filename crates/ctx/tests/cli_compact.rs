#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of `ctx compact`: the compacted transcript on stdout or
//! in `-o`, in the input's format; the report on stderr.

use serde_json::Value;

mod common;
use common::*;

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ctx-compact-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn compact_writes_a_smaller_valid_transcript_and_a_json_report() {
    let o = ctx(&[
        "compact",
        "examples/bugfix-session.json",
        "--context-length",
        "4000",
        "--report",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let original: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/bugfix-session.json")).unwrap(),
    )
    .unwrap();
    assert!(out.len() < original.len());
    assert_eq!(out.last(), original.last());
    let report: Value = serde_json::from_str(&stderr(&o)).unwrap();
    assert_eq!(report["outcome"], "compacted");
    assert_eq!(report["summarizer"], "extractive");
    assert_eq!(report["violations_after"], 0);
    assert!(report["tokens_after"].as_u64() < report["tokens_before"].as_u64());
    assert_eq!(report["head"]["start"], 0);
    assert!(out.iter().any(|m| {
        m["content"]
            .as_str()
            .is_some_and(|c| c.contains("[CONTEXT SUMMARY"))
    }));
    // The compacted transcript passes `ctx validate`.
    let path = temp("bugfix-compacted.json");
    std::fs::write(&path, &o.stdout).unwrap();
    let v = ctx(&["validate", path.to_str().unwrap()]);
    assert_eq!(
        v.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&v.stdout)
    );
}

#[test]
fn text_report_names_what_was_kept_and_the_summarizer() {
    let o = ctx(&[
        "compact",
        "examples/bugfix-session.json",
        "--context-length",
        "4000",
        "--focus",
        "the failing test",
        "--profile",
        "strict",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report = stderr(&o);
    assert!(report.contains(": compacted"), "{report}");
    assert!(report.contains("kept      head 0.."), "{report}");
    assert!(report.contains("summary   extractive"), "{report}");
    assert!(report.contains("strict: 0 violations after"), "{report}");
}

#[test]
fn output_file_keeps_the_input_envelope() {
    let Some(dir) = corpus() else { return };
    let corpus = dir.join("sweagent_pydicom.traj");
    if !corpus.exists() {
        skip(&format!("{} is absent", corpus.display()));
        return;
    }
    let out = temp("pydicom.traj");
    let o = ctx(&[
        "compact",
        corpus.to_str().unwrap(),
        "--context-length",
        "7000",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let original: Value = serde_json::from_str(&std::fs::read_to_string(&corpus).unwrap()).unwrap();
    assert!(
        written["history"].as_array().unwrap().len()
            < original["history"].as_array().unwrap().len()
    );
    assert_eq!(written["info"], original["info"]);
}

#[test]
fn too_short_is_written_back_unchanged_with_the_reason() {
    let path = temp("short.json");
    let text = r#"[{"role":"system","content":"s"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]"#;
    std::fs::write(&path, text).unwrap();
    let o = ctx(&["compact", path.to_str().unwrap(), "--context-length", "100"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out, serde_json::from_str::<Value>(text).unwrap());
    assert!(stderr(&o).contains("nothing to compress"), "{}", stderr(&o));
}

/// `ctx compact` of the bugfix session with an OpenAI summarizer nobody
/// listens for, its model named by `model_flag`.
fn unreachable_summarizer_args(model_flag: &str) -> Vec<&str> {
    vec![
        "compact",
        "examples/bugfix-session.json",
        "--context-length",
        "4000",
        "--summarizer",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        model_flag,
        "m",
        "--api-key-env",
        "CTX_TEST_SUMMARY_KEY",
    ]
}

#[test]
fn openai_summarizer_network_failure_aborts_and_keeps_the_transcript() {
    // Nothing listens on the discard port: a network failure, which aborts.
    let args = unreachable_summarizer_args("--summarizer-model");
    let o = ctx_env(&args, Some(("CTX_TEST_SUMMARY_KEY", "test-key-not-real")));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!stderr(&o).contains("deprecated"), "{}", stderr(&o));
    // Said once, as the report's reason (not also as a separate error line).
    assert_eq!(
        stderr(&o).matches("cannot reach the summarizer").count(),
        1,
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("aborted, transcript unchanged"));
    // The transcript comes back unchanged.
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let original: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/bugfix-session.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(out, original);
    // Without the key the summarizer is not configured: an error, exit 2.
    let o = command()
        .args(args)
        .env_remove("CTX_TEST_SUMMARY_KEY")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("CTX_TEST_SUMMARY_KEY"),
        "{}",
        stderr(&o)
    );
    let o = ctx(&[
        "compact",
        "examples/bugfix-session.json",
        "--context-length",
        "4000",
        "--summarizer",
        "openai",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--base-url"));
}

/// The threshold `ctx compact --report json` reports for `extra` flags.
fn threshold_tokens(extra: &[&str]) -> u64 {
    let mut args = vec![
        "compact",
        "examples/bugfix-session.json",
        "--context-length",
        "10000",
        "--report",
        "json",
    ];
    args.extend_from_slice(extra);
    let o = ctx(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report: Value = serde_json::from_str(&stderr(&o)).unwrap();
    report["threshold_tokens"].as_u64().unwrap()
}

#[test]
fn compact_reads_the_config_file_and_set_overrides() {
    let config = temp("threshold-config.yaml");
    std::fs::write(&config, "context:\n  threshold_percent: 0.5\n").unwrap();
    let default = threshold_tokens(&[]);
    let from_file = threshold_tokens(&["--config", config.to_str().unwrap()]);
    let from_set = threshold_tokens(&["--set", "context.threshold_percent=0.6"]);
    assert_ne!(default, from_file);
    assert!(from_file <= 5000, "{from_file}");
    assert!(
        from_file < from_set && from_set <= 6000,
        "{from_file} {from_set}"
    );
    // The window comes from the file when no flag gives it.
    std::fs::write(&config, "context:\n  context_length: 3000\n").unwrap();
    let o = ctx(&[
        "compact",
        "examples/bugfix-session.json",
        "--config",
        config.to_str().unwrap(),
        "--report",
        "json",
    ]);
    let report: Value = serde_json::from_str(&stderr(&o)).unwrap();
    assert_eq!(report["context_length"], 3000);
    assert_eq!(report["engine"], "compressor");
}

#[test]
fn model_names_the_tokenizer_and_the_old_summary_model_spelling_warns() {
    // `--model` picks the tokenizer: a model of another vendor is counted
    // with a safety factor, so the same transcript costs more tokens.
    let tokens = |model: &str| {
        let o = ctx(&[
            "compact",
            "examples/bugfix-session.json",
            "--context-length",
            "4000",
            "--model",
            model,
            "--report",
            "json",
        ]);
        let report: Value = serde_json::from_str(&stderr(&o)).unwrap();
        report["tokens_before"].as_u64().unwrap()
    };
    assert!(tokens("some-local-model") > tokens("gpt-4.1"));
    // The old spelling, `--model` as the summary model, still works but
    // says so.
    let args = unreachable_summarizer_args("--model");
    let o = ctx_env(&args, Some(("CTX_TEST_SUMMARY_KEY", "test-key-not-real")));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("deprecated: pass --summarizer-model m"),
        "{}",
        stderr(&o)
    );
}
