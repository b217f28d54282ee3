#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `CTX_TOOL_DIGEST_DISABLED=1` and `CTX_REDACT_SECRETS=0`: the library
//! reads no process environment, so these switches reach the engine as
//! the configuration keys they stand for, through the loader's
//! environment layer; an explicit key still wins over them.

use context_engine::config::{ConfigLoader, Env, Source};
use context_engine::digest::{DISABLE_ENV, digest};
use context_engine::redact::{OPT_OUT_ENV, RedactOptions};
use context_engine::{Message, ToolCall};

fn load(env: &Env, overrides: &[&str]) -> context_engine::config::Loaded {
    ConfigLoader::new()
        .with_search(false)
        .with_environment(env)
        .with_overrides(overrides.iter().copied())
        .load()
        .unwrap()
}

#[test]
fn env_switch_disables_the_digest() {
    let mut m = vec![Message::user("go")];
    for id in ["a", "b"] {
        m.push(Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(id, "bash", "{}")],
        ));
        m.push(Message::tool_result(id, "x".repeat(10_000)));
    }
    let loaded = load(&Env::from_pairs([(DISABLE_ENV, "1")]), &[]);
    let opts = &loaded.config.digest_options();
    assert!(!opts.enabled);
    assert_eq!(
        loaded.source("context.digest.enabled"),
        Source::Env {
            var: DISABLE_ENV.to_owned()
        }
    );
    assert_eq!(digest(&m, opts), m);
    // "0" and an unset variable leave the digest on.
    for env in [Env::from_pairs([(DISABLE_ENV, "0")]), Env::empty()] {
        let on = load(&env, &[]).config.digest_options();
        assert!(on.enabled);
        assert_ne!(digest(&m, &on), m);
    }
    // An explicit key wins over the switch.
    let flag = load(
        &Env::from_pairs([(DISABLE_ENV, "1")]),
        &["context.digest.enabled=true"],
    );
    assert!(flag.config.context.digest.enabled);
}

#[test]
fn env_switch_opts_out_of_redaction_but_never_of_forced_redaction() {
    let secret = "key: ghp_0123456789abcdefghijklmnopqrstuvwxyzAB";
    let loaded = load(&Env::from_pairs([(OPT_OUT_ENV, "0")]), &[]);
    assert!(!loaded.config.security.redact_secrets);
    let redactor = loaded.config.redactor().unwrap();
    assert_eq!(redactor.redact(secret, &RedactOptions::default()), secret);
    let forced = RedactOptions {
        force: true,
        ..RedactOptions::default()
    };
    assert_ne!(redactor.redact(secret, &forced), secret);
    // Any other value keeps redaction on.
    let on = load(&Env::from_pairs([(OPT_OUT_ENV, "1")]), &[]);
    assert!(on.config.security.redact_secrets);
}
