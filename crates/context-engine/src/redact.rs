//! Masking secrets before text leaves for a third party.
//!
//! This is a deliberately **minimal** redactor: it fixes the interface
//! ([`RedactOptions`], [`redact`]) that engines call at egress boundaries,
//! and covers only the most common, unambiguous secret shapes:
//!
//! - OpenAI/Anthropic-style `sk-…` keys,
//! - GitHub tokens (`ghp_…`, and the `gho_`/`ghu_`/`ghs_`/`ghr_` family),
//! - AWS access key ids (`AKIA…`),
//! - `Authorization: Bearer …` headers (the scheme is kept),
//! - PEM private-key blocks (replaced by `[REDACTED PRIVATE KEY]`),
//! - with [`RedactOptions::url_credentials`], the password in
//!   `scheme://user:password@host`.
//!
//! A token is masked as `***` when shorter than 18 characters, else as its
//! first 6 and last 4 characters around `...`, so a human can still tell
//! which key was meant. A fuller rule set will replace the internals later.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::{Captures, Regex};

/// Environment variable that opts out of non-forced redaction when set to
/// `0`, `false`, `no` or `off`.
pub const REDACT_ENV_VAR: &str = "CTX_REDACT_SECRETS";

/// Tokens shorter than this are masked entirely.
const MASK_MIN_CHARS: usize = 18;

/// How [`redact`] behaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedactOptions {
    /// Redact even when the user opted out through [`REDACT_ENV_VAR`]: for
    /// egress boundaries where leaking is never acceptable.
    pub force: bool,
    /// Also mask passwords embedded in URLs (`scheme://user:pass@host`).
    pub url_credentials: bool,
    /// The text is a source file. Reserved for the full redactor, which skips
    /// rules that misfire on code (generic `KEY=value` assignments); the
    /// minimal rules are all safe on code, so it changes nothing yet.
    pub code_file: bool,
}

/// Whether the user left redaction on. Read once: a command run later in the
/// process (possibly by the agent itself) cannot switch it off.
static ENV_ENABLED: LazyLock<bool> =
    LazyLock::new(|| std::env::var(REDACT_ENV_VAR).map_or(true, |value| !is_opt_out(&value)));

fn is_opt_out(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "0" | "false" | "no" | "off"
    )
}

/// Compiles one of the fixed patterns below.
fn compile(pattern: &str) -> Regex {
    // The patterns are constants covered by tests; failing here is a bug in
    // this file, not in the input.
    #[allow(clippy::expect_used)]
    Regex::new(pattern).expect("built-in redaction pattern compiles")
}

static PRIVATE_KEY: LazyLock<Regex> = LazyLock::new(|| {
    compile(r"(?s)-----BEGIN[A-Z ]*PRIVATE KEY-----.*?-----END[A-Z ]*PRIVATE KEY-----")
});
static BEARER: LazyLock<Regex> = LazyLock::new(|| {
    compile(r#"(?i)(authorization["']?\s*[:=]\s*["']?bearer\s+)([A-Za-z0-9._~+/=-]+)"#)
});
static SK_KEY: LazyLock<Regex> = LazyLock::new(|| compile(r"\bsk-[A-Za-z0-9_-]{16,}"));
static GITHUB_TOKEN: LazyLock<Regex> = LazyLock::new(|| compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"));
static AWS_KEY_ID: LazyLock<Regex> = LazyLock::new(|| compile(r"\bAKIA[0-9A-Z]{16}\b"));
static URL_PASSWORD: LazyLock<Regex> =
    LazyLock::new(|| compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:)([^\s/@]+)(@)"));

/// Masks the secrets in `text` (see the module docs for what is covered).
///
/// Returns the input borrowed when nothing was masked, so callers can run it
/// on every message cheaply. Without `opts.force`, does nothing when the user
/// set [`REDACT_ENV_VAR`] to opt out (read once per process).
pub fn redact<'a>(text: &'a str, opts: &RedactOptions) -> Cow<'a, str> {
    redact_with(text, opts, *ENV_ENABLED)
}

/// [`redact`] with the environment setting passed in, so tests need not
/// mutate the process environment.
fn redact_with<'a>(text: &'a str, opts: &RedactOptions, env_enabled: bool) -> Cow<'a, str> {
    if !opts.force && !env_enabled {
        return Cow::Borrowed(text);
    }
    let mut out = Cow::Borrowed(text);
    out = replace(out, &PRIVATE_KEY, |_: &Captures<'_>| {
        "[REDACTED PRIVATE KEY]".to_owned()
    });
    out = replace(out, &BEARER, |caps: &Captures<'_>| {
        format!("{}{}", &caps[1], mask(&caps[2]))
    });
    out = replace(out, &SK_KEY, |caps: &Captures<'_>| mask(&caps[0]));
    out = replace(out, &GITHUB_TOKEN, |caps: &Captures<'_>| mask(&caps[0]));
    out = replace(out, &AWS_KEY_ID, |caps: &Captures<'_>| mask(&caps[0]));
    if opts.url_credentials {
        out = replace(out, &URL_PASSWORD, |caps: &Captures<'_>| {
            format!("{}***{}", &caps[1], &caps[3])
        });
    }
    out
}

/// Applies one rule, allocating only when it matched.
fn replace<'a>(
    text: Cow<'a, str>,
    re: &Regex,
    rep: impl FnMut(&Captures<'_>) -> String,
) -> Cow<'a, str> {
    match text {
        Cow::Borrowed(s) => re.replace_all(s, rep),
        Cow::Owned(s) => {
            let replaced = match re.replace_all(&s, rep) {
                Cow::Owned(new) => Some(new),
                Cow::Borrowed(_) => None,
            };
            Cow::Owned(replaced.unwrap_or(s))
        }
    }
}

/// `***` for short tokens, else first 6 + `...` + last 4 characters.
pub fn mask(token: &str) -> String {
    let chars = token.chars().count();
    if chars < MASK_MIN_CHARS {
        return "***".to_owned();
    }
    let head: String = token.chars().take(6).collect();
    let tail: String = token.chars().skip(chars - 4).collect();
    format!("{head}...{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(text: &str) -> Cow<'_, str> {
        redact_with(text, &RedactOptions::default(), true)
    }

    #[test]
    fn unchanged_text_is_borrowed() {
        let text = "nothing secret here: task-1234 skipped, ask-me";
        assert!(matches!(on(text), Cow::Borrowed(t) if t == text));
    }

    #[test]
    fn masks_sk_keys_keeping_head_and_tail() {
        let out = on("key=sk-proj-abcdefghijklmnop1234 end");
        assert_eq!(out, "key=sk-pro...1234 end");
    }

    #[test]
    fn short_tokens_are_fully_masked() {
        assert_eq!(mask("abcdefghijklmnopq"), "***"); // 17 chars
        assert_eq!(mask("abcdefghijklmnopqr"), "abcdef...opqr"); // 18 chars
        assert_eq!(
            on("Authorization: Bearer shorttoken"),
            "Authorization: Bearer ***"
        );
    }

    #[test]
    fn masks_github_and_aws_tokens() {
        let out = on("gh ghp_ABCDEFGHIJKLMNOPQRSTuvwxyz0123 aws AKIAIOSFODNN7EXAMPLE");
        assert_eq!(out, "gh ghp_AB...0123 aws AKIAIO...MPLE");
    }

    #[test]
    fn bearer_keeps_the_scheme_and_header() {
        let out = on(r#"{"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig"}"#);
        assert_eq!(out, r#"{"Authorization": "Bearer eyJhbG....sig"}"#);
        let out = on("authorization: bearer abcdefghijklmnopqrstuvwxyz");
        assert_eq!(out, "authorization: bearer abcdef...wxyz");
    }

    #[test]
    fn private_key_blocks_are_replaced_whole() {
        let text = "before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAK\n-----END RSA PRIVATE KEY-----\nafter";
        assert_eq!(on(text), "before\n[REDACTED PRIVATE KEY]\nafter");
        let text = "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----";
        assert_eq!(on(text), "[REDACTED PRIVATE KEY]");
    }

    #[test]
    fn url_credentials_only_when_asked() {
        let text = "postgres://admin:hunter2@db:5432/app";
        assert_eq!(on(text), text);
        let opts = RedactOptions {
            url_credentials: true,
            ..RedactOptions::default()
        };
        assert_eq!(
            redact_with(text, &opts, true),
            "postgres://admin:***@db:5432/app"
        );
        // A URL without credentials is untouched.
        let plain = "see https://example.org:8080/path";
        assert!(matches!(redact_with(plain, &opts, true), Cow::Borrowed(_)));
    }

    #[test]
    fn env_opt_out_is_honoured_unless_forced() {
        let text = "sk-abcdefghijklmnopqrstuvwx";
        let off = redact_with(text, &RedactOptions::default(), false);
        assert!(matches!(off, Cow::Borrowed(t) if t == text));
        let forced = RedactOptions {
            force: true,
            ..RedactOptions::default()
        };
        assert_eq!(redact_with(text, &forced, false), "sk-abc...uvwx");
    }

    #[test]
    fn opt_out_values() {
        for v in ["0", "false", "NO", " off "] {
            assert!(is_opt_out(v), "{v}");
        }
        for v in ["1", "true", "", "yes"] {
            assert!(!is_opt_out(v), "{v}");
        }
    }

    #[test]
    fn several_rules_in_one_text() {
        let text = "a sk-abcdefghijklmnopqrstuvwx b AKIAIOSFODNN7EXAMPLE c";
        assert_eq!(on(text), "a sk-abc...uvwx b AKIAIO...MPLE c");
    }

    #[test]
    fn mask_counts_characters_not_bytes() {
        let token = "ééééééééééééééééééé"; // 19 chars, 38 bytes
        assert_eq!(mask(token), "éééééé...éééé");
    }
}
