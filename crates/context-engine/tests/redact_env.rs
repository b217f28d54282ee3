#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The library reads no process environment: with `CTX_REDACT_SECRETS=0`
//! set (in a child process: setting it here would race with other tests),
//! the built-in redaction still masks. The opt-out reaches a redactor only
//! through the configuration (`security.redact_secrets`, which the loader
//! sets from the variable; see `digest_env.rs`).

use context_engine::redact::{RedactOptions, redact};

use context_engine_testkit as common;

const TEXT: &str = "export GITHUB_TOKEN=ghp_R4nd0mT0k3nF0rT3st1ngOnlyAbCdEf123456";

#[test]
fn the_library_ignores_the_process_opt_out() {
    common::run_child_with_env("child_with_opt_out", "CTX_REDACT_SECRETS", "0");
}

#[test]
#[ignore = "run by the_library_ignores_the_process_opt_out, with CTX_REDACT_SECRETS=0"]
fn child_with_opt_out() {
    assert_eq!(std::env::var("CTX_REDACT_SECRETS").as_deref(), Ok("0"));
    assert_eq!(
        redact(TEXT, &RedactOptions::default()),
        "export GITHUB_TOKEN=ghp_R4...3456"
    );
}
