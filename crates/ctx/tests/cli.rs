#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of the `ctx` binary: exit codes, tables, JSON, errors.

mod common;
use common::*;

#[test]
fn inspect_example_breaks_tokens_down() {
    let o = ctx(&["inspect", "examples/bugfix-session.json", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(r["messages"], 15);
    assert_eq!(r["format"], "array");
    let total = r["tokens"].as_u64().unwrap();
    let by_role: u64 = r["by_role"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["tokens"].as_u64().unwrap())
        .sum();
    // The request adds a few priming tokens on top of the messages.
    assert!(
        total > by_role && total - by_role < 10,
        "{total} vs {by_role}"
    );
    let tool = r["tool_output"]["tokens"].as_u64().unwrap();
    let tool_row = r["by_role"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["role"] == "tool")
        .unwrap();
    assert_eq!(tool, tool_row["tokens"].as_u64().unwrap());
    assert!(r["tool_output"]["share"].as_f64().unwrap() > 0.5);
    // Largest first, ten of them, tool results named after their call.
    let largest = r["largest"].as_array().unwrap();
    assert_eq!(largest.len(), 10);
    let sizes: Vec<u64> = largest
        .iter()
        .map(|l| l["tokens"].as_u64().unwrap())
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]));
    assert_eq!(largest[0]["role"], "tool");
    assert_eq!(largest[0]["tool"], "bash");
    assert_eq!(r["pairing"]["tool_calls"], 6);
    assert_eq!(r["pairing"]["tool_results"], 6);
    assert_eq!(r["pairing"]["unanswered_calls"], 0);
    assert!(r["calibration"].is_null());
}

#[test]
fn inspect_table_is_readable() {
    let o = ctx(&["inspect", "examples/bugfix-session.json"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    for needle in [
        "by role",
        "largest messages",
        "tool output",
        "o200k_base",
        "tool calls",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
}

#[test]
fn estimate_and_exact_counts_differ_but_agree_roughly() {
    let count = |enc: &str| {
        let o = ctx(&[
            "inspect",
            "examples/bugfix-session.json",
            "--json",
            "--encoding",
            enc,
        ]);
        let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        r["tokens"].as_u64().unwrap() as f64
    };
    let (exact, cl, rough) = (count("o200k"), count("cl100k"), count("estimate"));
    assert!((rough / exact - 1.0).abs() < 0.5, "{rough} vs {exact}");
    assert!((cl / exact - 1.0).abs() < 0.2, "{cl} vs {exact}");
}

#[test]
fn validate_valid_file_exits_zero() {
    let o = ctx(&["validate", "examples/bugfix-session.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("valid"));
}

#[test]
fn validate_lists_every_violation_and_exits_one() {
    let f = fixture("broken-pairing.json");
    let o = ctx(&["validate", f.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(r["valid"], false);
    let found: Vec<(u64, String)> = r["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["index"].as_u64().unwrap(),
                v["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        found.contains(&(4, "orphan-tool-result".into())),
        "{found:?}"
    );
    assert!(
        found.contains(&(2, "unanswered-tool-call".into())),
        "{found:?}"
    );
    // Human form names index and rule too.
    let o = ctx(&["validate", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("orphan-tool-result"));
}

#[test]
fn strict_profile_is_stricter() {
    let f = root().join("examples/bugfix-session.json");
    let o = ctx(&["validate", f.to_str().unwrap(), "--profile", "strict"]);
    // The example has a user message right after tool results: fine for
    // OpenAI, two user turns in a row for an Anthropic-like provider.
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("consecutive-same-role"));
}

#[test]
fn syntax_errors_name_file_line_and_column() {
    let f = fixture("syntax-error.json");
    let o = ctx(&["inspect", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("syntax-error.json"), "{err}");
    assert!(err.contains("line 4"), "{err}");
    assert!(err.contains("column 3"), "{err}");
}

#[test]
fn shape_errors_name_message_index_and_field() {
    let f = fixture("missing-role.json");
    let o = ctx(&["validate", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("message 2"), "{err}");
    assert!(err.contains("role"), "{err}");
}

#[test]
fn missing_file_and_bad_flags_exit_two() {
    let o = ctx(&["inspect", "no/such/file.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no/such/file.json"));
    let o = ctx(&[
        "validate",
        "examples/bugfix-session.json",
        "--profile",
        "gemini",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn every_command_has_help_with_an_example() {
    for cmd in ["inspect", "validate"] {
        let o = ctx(&[cmd, "--help"]);
        assert_eq!(o.status.code(), Some(0));
        assert!(stdout(&o).contains("Example:"), "{cmd}");
    }
    assert!(stdout(&ctx(&["--help"])).contains("Example:"));
}

#[test]
fn inspect_reports_calibration_on_recorded_usage() {
    let Some(dir) = corpus() else { return };
    let f = dir.join("mini_astropy12907.traj.json");
    let o = ctx(&["inspect", f.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(r["format"], "mini-swe-agent");
    let cal = &r["calibration"];
    assert!(cal["calls"].as_u64().unwrap() > 10);
    // Our count must land in the provider's ballpark once the constant
    // (tool schema, template) is taken out.
    assert!(
        cal["mean_abs_pct_error_after_offset"].as_f64().unwrap() < 15.0,
        "{cal}"
    );
}

#[test]
fn every_corpus_file_inspects_and_validates_without_error() {
    let Some(dir) = corpus() else { return };
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        let p = path.to_str().unwrap();
        let o = ctx(&["inspect", p, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{p}: {}", stderr(&o));
        let o = ctx(&["validate", p]);
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{p}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn text_action_observations_are_tool_output() {
    // A mini-swe-agent text-mode session: the commands are fenced blocks,
    // their output comes back as user messages.
    let file = fixture("text-actions.json");
    let o = ctx(&["inspect", file.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(r["tool_output"]["messages"], 12);
    assert!(r["tool_output"]["share"].as_f64().unwrap() > 0.9);
    assert_eq!(r["pairing"]["text_actions"], 12);
    assert_eq!(r["largest"][0]["tool"], "text: nl");
    // The digest works on them; `context.text_actions: off` turns that off.
    let ratio = |extra: &[&str]| {
        let mut args = vec!["replay", file.to_str().unwrap(), "--json"];
        args.extend_from_slice(extra);
        let o = ctx(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        r["totals"]["token_ratio"].as_f64().unwrap()
    };
    assert!(ratio(&[]) < 0.85);
    assert_eq!(ratio(&["--set", "context.text_actions=off"]), 1.0);
    // A pattern that is not a regular expression is an error naming it.
    let o = ctx(&[
        "replay",
        file.to_str().unwrap(),
        "--set",
        "context.text_actions=[\"(unclosed\"]",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("context.text_actions[0]"),
        "{}",
        stderr(&o)
    );
}
