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
    let corpus = root().join("../shared/corpus/sweagent_pydicom.traj");
    if !corpus.exists() {
        eprintln!("skipped: no corpus at {}", corpus.display());
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

#[test]
fn openai_summarizer_network_failure_aborts_and_keeps_the_transcript() {
    // Nothing listens on the discard port: a network failure, which aborts.
    let args = [
        "compact",
        "examples/bugfix-session.json",
        "--context-length",
        "4000",
        "--summarizer",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--api-key-env",
        "CTX_TEST_SUMMARY_KEY",
    ];
    let o = ctx_env(&args, Some(("CTX_TEST_SUMMARY_KEY", "test-key-not-real")));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
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
