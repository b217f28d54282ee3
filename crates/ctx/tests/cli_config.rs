#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `ctx config show` and `ctx config check` end to end.

mod common;

use std::path::PathBuf;

use common::{command, ctx, stderr, stdout};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ctx-cli-config-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `ctx` with no config-related variables from the developer's shell and a
/// HOME without a user config, run in `cwd`.
fn config_cmd(cwd: &std::path::Path) -> std::process::Command {
    let mut cmd = command();
    cmd.current_dir(cwd)
        .env("HOME", cwd)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CTX_CONFIG");
    for (k, _) in std::env::vars() {
        if k.starts_with("CTX_") && k.contains("__") {
            cmd.env_remove(k);
        }
    }
    cmd
}

#[test]
fn show_reports_each_source() {
    let dir = temp_dir("show");
    let file = dir.join("c.yaml");
    std::fs::write(
        &file,
        "context:\n  protect_first_n: 2\n  protect_last_n: 4\n",
    )
    .unwrap();
    let out = config_cmd(&dir)
        .args(["config", "show", "--config"])
        .arg(&file)
        .args(["--set", "context.protect_last_n=5", "--json"])
        .env("CTX_SUMMARIZER__KIND", "openai")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["config"]["context"]["protect_first_n"], 2);
    assert_eq!(v["config"]["context"]["protect_last_n"], 5);
    assert_eq!(v["config"]["summarizer"]["kind"], "openai");
    let source = |path: &str| {
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"] == path)
            .unwrap()["source"]
            .clone()
    };
    assert_eq!(source("context.protect_first_n")["kind"], "file");
    assert_eq!(source("context.protect_first_n")["line"], 2);
    assert_eq!(source("context.protect_last_n")["kind"], "flag");
    assert_eq!(source("summarizer.kind")["kind"], "env");
    assert_eq!(source("summarizer.kind")["var"], "CTX_SUMMARIZER__KIND");
    assert_eq!(source("context.engine")["kind"], "default");

    // The table names the same sources.
    let out = config_cmd(&dir)
        .args(["config", "show", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("context.protect_first_n"))
        .unwrap();
    assert!(line.contains("c.yaml:2"), "{line}");
    let line = text
        .lines()
        .find(|l| l.starts_with("context.engine "))
        .unwrap();
    assert!(
        line.contains("compressor") && line.ends_with("default"),
        "{line}"
    );
}

#[test]
fn show_finds_config_yaml_in_the_working_directory() {
    let dir = temp_dir("cwd");
    std::fs::write(dir.join("config.yaml"), "context:\n  engine: other\n").unwrap();
    let out = config_cmd(&dir)
        .args(["config", "show", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["config"]["context"]["engine"], "other");
    assert!(v["file"].as_str().unwrap().ends_with("config.yaml"));
}

#[test]
fn show_with_missing_explicit_file_fails() {
    let dir = temp_dir("missing");
    let out = config_cmd(&dir)
        .args(["config", "show", "--config", "nope.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("nope.yaml"), "{}", stderr(&out));
}

#[test]
fn check_example_is_valid() {
    let out = ctx(&["config", "check", "config.example.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("valid (0 warnings)"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn check_warns_on_unknown_keys_and_still_passes() {
    let dir = temp_dir("warn");
    let file = dir.join("c.yaml");
    std::fs::write(&file, "context:\n  enginee: x\n").unwrap();
    let out = config_cmd(&dir)
        .args(["config", "check"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("c.yaml:2:3"), "{err}");
    assert!(err.contains("context.enginee"), "{err}");
}

#[test]
fn check_invalid_file_exits_1_with_line() {
    let dir = temp_dir("invalid");
    let file = dir.join("c.yaml");
    std::fs::write(&file, "security:\n  redact_secrets: maybe\n").unwrap();
    let out = config_cmd(&dir)
        .args(["config", "check"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("c.yaml:2:"), "{err}");
    assert!(err.contains("security.redact_secrets"), "{err}");
    assert!(err.contains("bool"), "{err}");
}

#[test]
fn check_usage_errors_exit_2() {
    let out = ctx(&["config", "check"]);
    assert_eq!(out.status.code(), Some(2));
    let out = ctx(&["config", "check", "no/such/file.yaml"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn check_json_reports_error_and_warnings() {
    let dir = temp_dir("json");
    let file = dir.join("c.yaml");
    std::fs::write(&file, "extra: 1\ncontext:\n  tail_ratio: 2\n").unwrap();
    let out = config_cmd(&dir)
        .args(["config", "check", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["valid"], false);
    let error = v["error"].as_str().unwrap();
    assert!(error.contains("c.yaml:3:3: context.tail_ratio"), "{error}");

    std::fs::write(&file, "extra: 1\n").unwrap();
    let out = config_cmd(&dir)
        .args(["config", "check", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["warnings"][0]["path"], "extra");
    assert_eq!(v["warnings"][0]["source"]["line"], 1);
}

#[test]
fn show_refuses_an_invalid_override() {
    let dir = temp_dir("badset");
    let out = config_cmd(&dir)
        .args(["config", "show", "--set", "context.protect_first_n=many"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("context.protect_first_n"), "{err}");
    assert!(err.contains("flag"), "{err}");
}

/// `ctx redact` masks what the engine masks on egress: the built-in rules
/// and `security.redact_patterns` (from the file or `--set`), even with
/// `security.redact_secrets: false` (the user asked for redaction).
#[test]
fn redact_masks_the_configured_patterns() {
    let dir = temp_dir("redact");
    let input = dir.join("in.txt");
    std::fs::write(&input, "ticket ACME-12345 is open\n").unwrap();
    let run = |extra: &[&str]| {
        let out = config_cmd(&dir)
            .arg("redact")
            .arg(&input)
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    assert_eq!(run(&[]), "ticket ACME-12345 is open\n");
    let file = dir.join("c.yaml");
    std::fs::write(
        &file,
        "security:\n  redact_secrets: false\n  redact_patterns: ['ACME-\\d+']\n",
    )
    .unwrap();
    let masked = run(&["--config", file.to_str().unwrap()]);
    assert!(!masked.contains("ACME-12345"), "{masked}");
    assert!(
        masked.starts_with("ticket ") && masked.ends_with(" is open\n"),
        "{masked}"
    );
    let set = run(&["--set", "security.redact_patterns=[\"ACME-\\\\d+\"]"]);
    assert_eq!(set, masked);
}
