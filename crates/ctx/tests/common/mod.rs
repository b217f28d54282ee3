//! Helpers shared by the `ctx` end-to-end tests: run the binary from the
//! repository root with a clean environment, read its output, find the
//! fixtures and the shared corpus, start `ctx serve` ([`serve::Serve`]).
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

/// What a test does when a prerequisite is missing (fail under `CI=true`,
/// else skip with the reason printed), and where the shared corpus is: one
/// implementation for both crates' tests.
#[path = "../../../context-engine/tests/common/mod.rs"]
mod prerequisites;
#[allow(unused_imports)]
pub use prerequisites::{corpus_dir, corpus_files, python, shared, skip};

/// The shared corpus, or `None` with the reason printed (a failure under
/// `CI=true`).
pub fn corpus() -> Option<PathBuf> {
    corpus_dir()
}

/// A free loopback port for a `ctx serve` a test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A temporary directory for one test (`ctx-{suite}-{tag}-{pid}`), removed
/// with it.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(suite: &str, tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("ctx-{suite}-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
