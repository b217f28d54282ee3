#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `CTX_TOOL_DIGEST_DISABLED=1`, checked in a child process (setting the
//! variable in this process would race with other tests).

use context_engine::digest::{DISABLE_ENV, DigestOptions, digest};
use context_engine::{Message, ToolCall};

mod common;

#[test]
fn env_switch_disables_the_digest() {
    common::run_child_with_env("child_with_digest_disabled", DISABLE_ENV, "1");
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
