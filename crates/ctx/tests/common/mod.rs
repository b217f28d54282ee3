//! Helpers shared by the `ctx` end-to-end tests: run the binary from the
//! repository root with a clean environment, read its output, find the
//! fixtures and the shared corpus, start `ctx serve` ([`serve::start`]).
#![allow(dead_code)]

pub mod serve;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (commands run there, as in the README).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file of `crates/ctx/tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// `ctx` from the repository root, without the switches a developer's shell
/// might carry (digest and redaction opt-outs).
pub fn command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ctx"));
    cmd.current_dir(root())
        .env_remove("CTX_TOOL_DIGEST_DISABLED")
        .env_remove("CTX_REDACT_SECRETS");
    cmd
}

/// Runs `ctx ARGS`.
pub fn ctx(args: &[&str]) -> Output {
    command().args(args).output().unwrap()
}

/// Runs `ctx ARGS` with one extra environment variable.
pub fn ctx_env(args: &[&str], env: Option<(&str, &str)>) -> Output {
    let mut cmd = command();
    cmd.args(args);
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// The skip rule, the corpus, temporary directories and free ports: the
/// test kit's (`context-engine-testkit`).
#[allow(unused_imports)]
pub use context_engine_testkit::{
    TempDir, corpus_dir, corpus_files, free_port, python, shared, skip,
};

/// The shared corpus, or `None` with the reason printed (a failure under
/// `CI=true`).
pub fn corpus() -> Option<PathBuf> {
    corpus_dir()
}

/// A session of long user asks about one task (porting a lexer), as chat
/// messages: `turns` asks of about 130 tokens, each answered.
pub fn lexer_session(turns: usize) -> Vec<serde_json::Value> {
    use serde_json::json;
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Port the lexer in src/lex.rs to the new token type."}),
    ];
    for i in 0..turns {
        let ask: String = (0..10)
            .map(|j| format!("step {i}.{j}: check token kind {j} in src/lex.rs. "))
            .collect();
        m.push(json!({"role": "user", "content": ask}));
        m.push(json!({"role": "assistant", "content": format!("Checked step {i}: kinds match.")}));
    }
    m
}
