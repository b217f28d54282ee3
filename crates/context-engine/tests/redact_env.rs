#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `CTX_REDACT_SECRETS=0` opt-out, checked in a child process (setting
//! the variable in this process would race with other tests).

use context_engine::redact::{RedactOptions, redact};

mod common;

const TEXT: &str = "export GITHUB_TOKEN=ghp_R4nd0mT0k3nF0rT3st1ngOnlyAbCdEf123456";

#[test]
fn env_opt_out_is_honoured_unless_forced() {
    common::run_child_with_env("child_with_opt_out", "CTX_REDACT_SECRETS", "0");
}

#[test]
#[ignore = "run by env_opt_out_is_honoured_unless_forced, with CTX_REDACT_SECRETS=0"]
fn child_with_opt_out() {
    assert_eq!(std::env::var("CTX_REDACT_SECRETS").as_deref(), Ok("0"));
    assert_eq!(redact(TEXT, &RedactOptions::default()), TEXT);
    let forced = RedactOptions {
        force: true,
        ..RedactOptions::default()
    };
    assert_eq!(redact(TEXT, &forced), "export GITHUB_TOKEN=ghp_R4...3456");
}
