#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of `ctx digest`: the request view on stdout, the report
//! on stderr, the environment switch.

use serde_json::Value;

mod common;
use common::*;

fn digested(view: &[Value]) -> Vec<&Value> {
    view.iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("[digested]"))
        })
        .collect()
}

#[test]
fn digest_prints_the_view_and_a_report() {
    let o = ctx_env(
        &[
            "digest",
            "examples/bugfix-session.json",
            "--min-bytes",
            "1024",
            "--json",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let view: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let original: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/bugfix-session.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(view.len(), original.len());
    let d = digested(&view);
    assert!(!d.is_empty());
    // The pytest run failed: the digest says so with its first error line.
    assert!(
        d.iter().any(|m| m["content"]
            .as_str()
            .unwrap()
            .contains("failed — FAILED tests/")),
        "{d:?}"
    );
    // The newest tool result is whole.
    let last = view.iter().rposition(|m| m["role"] == "tool").unwrap();
    assert_eq!(view[last], original[last]);
    let r: Value = serde_json::from_str(&stderr(&o)).unwrap();
    assert_eq!(r["results_digested"].as_u64().unwrap(), d.len() as u64);
    assert!(r["tokens_after"].as_u64().unwrap() < r["tokens_before"].as_u64().unwrap());
    assert!(
        r["request_bytes_after"].as_u64().unwrap() < r["request_bytes_before"].as_u64().unwrap()
    );
}

#[test]
fn thresholds_and_env_switch() {
    let file = "examples/bugfix-session.json";
    let keep_all = ctx_env(
        &["digest", file, "--keep-batches", "100", "--min-bytes", "1"],
        None,
    );
    assert_eq!(keep_all.status.code(), Some(0));
    let view: Vec<Value> = serde_json::from_slice(&keep_all.stdout).unwrap();
    assert!(digested(&view).is_empty());
    assert!(stderr(&keep_all).contains("0 tool results and 0 envelopes digested"));

    let off = ctx_env(
        &["digest", file, "--min-bytes", "1"],
        Some(("CTX_TOOL_DIGEST_DISABLED", "1")),
    );
    assert_eq!(off.status.code(), Some(0));
    let view: Vec<Value> = serde_json::from_slice(&off.stdout).unwrap();
    assert!(digested(&view).is_empty());
    assert!(stderr(&off).contains("disabled"), "{}", stderr(&off));

    // The configuration's keys mean here what they mean to the engine.
    let config = ctx_env(
        &[
            "digest",
            file,
            "--set",
            "context.digest.keep_batches=100",
            "--set",
            "context.digest.min_bytes=1",
        ],
        None,
    );
    assert_eq!(config.status.code(), Some(0), "{}", stderr(&config));
    let view: Vec<Value> = serde_json::from_slice(&config.stdout).unwrap();
    assert!(digested(&view).is_empty());
    let bad = ctx_env(
        &["digest", file, "--set", "context.text_actions=[\"(\"]"],
        None,
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("context.text_actions"),
        "{}",
        stderr(&bad)
    );

    let missing = ctx_env(&["digest", "no/such/file.json"], None);
    assert_eq!(missing.status.code(), Some(2));
}
