#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Properties: redaction never panics on arbitrary UTF-8 and is idempotent,
//! also on texts stitched from secrets, keywords, separators and noise.

use context_engine::redact::{RedactOptions, redact};
use proptest::prelude::*;

fn all_options() -> impl Strategy<Value = RedactOptions> {
    (any::<bool>(), any::<bool>()).prop_map(|(url_credentials, code_file)| RedactOptions {
        force: true,
        url_credentials,
        code_file,
    })
}

const PIECES: &[&str] = &[
    "ghp_R4nd0mT0k3nF0rT3st1ngOnlyAbCdEf123456",
    "sk-proj-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1JkLmNbVcXz",
    "AKIAQ3EXAMPLE7TESTID",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlXzEyMzQ1Njc4",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
    "postgres://u:pw@h/db",
    "https://user:p4ss@host.example/x?token=abc123&sig=zz9",
    "Authorization: Bearer ",
    "x-api-key: ",
    "PASSWORD=",
    "\"password\": \"",
    "\\\"secret\\\": \\\"",
    "api_key = '",
    "token: ",
    "secret",
    "key",
    "=",
    ":",
    "\"",
    "'",
    "\\",
    "...",
    "***",
    "*",
    "@",
    " ",
    "\n",
    "\u{200B}",
    "\u{7}",
    "é",
    "hunter2x",
    "abcdef0123456789abcdef",
    "$VAR",
];

fn stitched() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(PIECES).prop_map(str::to_owned),
            1 => "[a-zA-Z0-9_./+=-]{1,24}",
            1 => any::<String>(),
        ],
        0..24,
    )
    // Tokens in real text are delimited; gluing two secrets into one word
    // makes a different (and unrealistic) token.
    .prop_map(|parts| parts.join(" "))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_and_is_idempotent_on_any_utf8(text in any::<String>(), opts in all_options()) {
        let once = redact(&text, &opts).into_owned();
        let twice = redact(&once, &opts);
        prop_assert_eq!(twice.as_ref(), once.as_str());
    }

    #[test]
    fn idempotent_on_stitched_secrets(text in stitched(), opts in all_options()) {
        let once = redact(&text, &opts).into_owned();
        let twice = redact(&once, &opts);
        prop_assert_eq!(twice.as_ref(), once.as_str(), "input: {:?}", text);
    }
}
