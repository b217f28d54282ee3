#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `CTX_TOOL_DIGEST_DISABLED=1`, checked in a child process (setting the
//! variable in this process would race with other tests).

use std::process::Command;

use context_engine::digest::{DISABLE_ENV, DigestOptions, digest};
use context_engine::{Message, ToolCall};

#[test]
fn env_switch_disables_the_digest() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_with_digest_disabled", "--include-ignored"])
        .env(DISABLE_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "run by env_switch_disables_the_digest, with CTX_TOOL_DIGEST_DISABLED=1"]
fn child_with_digest_disabled() {
    assert_eq!(std::env::var(DISABLE_ENV).as_deref(), Ok("1"));
    let mut m = vec![Message::user("go")];
    for id in ["a", "b"] {
        m.push(Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(id, "bash", "{}")],
        ));
        m.push(Message::tool_result(id, "x".repeat(10_000)));
    }
    let opts = DigestOptions::from_env();
    assert!(!opts.enabled);
    assert_eq!(digest(&m, &opts), m);
    assert_ne!(digest(&m, &DigestOptions::default()), m);
}
