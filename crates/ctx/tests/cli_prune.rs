#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of `ctx prune`: the pruned transcript on stdout, the
//! report on stderr, both gates.

use serde_json::Value;

mod common;
use common::*;

const FILE: &str = "examples/bugfix-session.json";

fn original() -> Vec<Value> {
    serde_json::from_str(&std::fs::read_to_string(root().join(FILE)).unwrap()).unwrap()
}

#[test]
fn prune_prints_the_transcript_and_a_report() {
    let o = ctx(&["prune", FILE, "--min-reclaim", "0", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let orig = original();
    assert_eq!(out.len(), orig.len());
    for (a, b) in out.iter().zip(&orig) {
        assert_eq!(a["role"], b["role"]);
        assert_eq!(a["tool_call_id"], b["tool_call_id"]);
    }
    let r: Value = serde_json::from_str(&stderr(&o)).unwrap();
    let pruned = r["pruned"].as_u64().unwrap();
    assert!(pruned > 0, "{r}");
    let changed = out.iter().zip(&orig).filter(|(a, b)| a != b).count() as u64;
    assert_eq!(changed, pruned);
    assert!(r["tokens_after"].as_u64().unwrap() < r["tokens_before"].as_u64().unwrap());
    assert_eq!(r["skipped"], Value::Null);
    // The last six messages are protected.
    assert_eq!(out[out.len() - 6..], orig[orig.len() - 6..]);

    let text = ctx(&["prune", FILE, "--min-reclaim", "0"]);
    let report = stderr(&text);
    assert!(report.contains(&format!("{pruned} pruned")), "{report}");
    assert!(report.contains("tokens"), "{report}");
}

#[test]
fn gates_leave_the_transcript_unchanged_and_say_why() {
    let below = ctx(&[
        "prune",
        FILE,
        "--current-tokens",
        "500",
        "--threshold",
        "1000",
    ]);
    assert_eq!(below.status.code(), Some(0));
    let out: Vec<Value> = serde_json::from_slice(&below.stdout).unwrap();
    assert_eq!(out, original());
    assert!(stderr(&below).contains("not run"), "{}", stderr(&below));

    let little = ctx(&["prune", FILE, "--min-reclaim", "1000000"]);
    assert_eq!(little.status.code(), Some(0));
    let out: Vec<Value> = serde_json::from_slice(&little.stdout).unwrap();
    assert_eq!(out, original());
    assert!(
        stderr(&little).contains("not committed: would free"),
        "{}",
        stderr(&little)
    );

    let missing = ctx(&["prune", "no/such/file.json"]);
    assert_eq!(missing.status.code(), Some(2));
}
