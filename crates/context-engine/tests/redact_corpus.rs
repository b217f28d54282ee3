#![allow(clippy::unwrap_used, clippy::expect_used)]
//! False positives: redacting real agent transcripts must leave ordinary code,
//! paths, hashes, UUIDs and base64 test data alone. Every mask found is
//! printed and must look like a secret.

use context_engine::redact::{Finding, RedactOptions, Redactor};

use context_engine_testkit as common;

fn redactor() -> Redactor {
    Redactor::builder().build().unwrap()
}

/// Shapes that are never secrets on their own.
fn ordinary_shape(s: &str) -> Option<&'static str> {
    let b = s.as_bytes();
    let hex = |c: &u8| c.is_ascii_hexdigit();
    if b.len() >= 7 && b.iter().all(hex) {
        return Some("hex digest / git SHA");
    }
    if b.len() == 36
        && b.iter().enumerate().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                *c == b'-'
            } else {
                hex(c)
            }
        })
    {
        return Some("UUID");
    }
    if s.starts_with('/') || s.starts_with("./") || s.starts_with("~/") {
        return Some("path");
    }
    if b.iter().all(|c| c.is_ascii_digit() || *c == b'.') {
        return Some("number");
    }
    if b.iter()
        .all(|c| c.is_ascii_alphabetic() || *c == b'_' || *c == b'.')
    {
        return Some("identifier");
    }
    None
}

/// A mask is plausible when the masked text is not an ordinary shape and
/// either a vendor rule recognised it or it mixes letters with digits or
/// symbols, as keys and passwords do.
fn assert_plausible(text: &str, f: &Finding, origin: &str) {
    let secret = &text[f.start..f.end];
    if let Some(shape) = ordinary_shape(secret) {
        panic!(
            "{origin}: rule {} masked an ordinary {shape} on line {}: {secret:?}",
            f.rule, f.line
        );
    }
    let mixed = secret
        .bytes()
        .any(|c| c.is_ascii_digit() || !c.is_ascii_alphanumeric())
        && secret.bytes().any(|c| c.is_ascii_alphabetic());
    assert!(
        mixed || f.masked.starts_with('['),
        "{origin}: rule {} masked an implausible secret on line {}: {secret:?}",
        f.rule,
        f.line
    );
}

#[test]
fn corpus_transcripts_have_no_false_positives() {
    let Some(dir) = common::corpus_dir() else {
        return;
    };
    let entries = std::fs::read_dir(&dir).unwrap();
    let r = redactor();
    let mut files = 0;
    let mut masks = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        files += 1;
        // The scanner must still see a secret buried deep in a large file.
        let half = (0..=text.len() / 2)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        let planted = format!(
            "{}\\nGITHUB_TOKEN=ghp_Pl4nt3dT0k3nF0rC0rpusT3st0123456789",
            &text[..half]
        );
        let out = r.redact(&planted, &RedactOptions::default());
        assert!(
            !out.contains("Pl4nt3dT0k3n"),
            "{}: planted token survived",
            path.display()
        );
        for opts in [
            RedactOptions::default(),
            RedactOptions {
                url_credentials: true,
                ..RedactOptions::default()
            },
        ] {
            let rep = r.redact_report(&text, &opts);
            for f in &rep.findings {
                masks += 1;
                eprintln!(
                    "{} (url_credentials={}): {} line {} -> {}",
                    path.display(),
                    opts.url_credentials,
                    f.rule,
                    f.line,
                    f.masked
                );
                assert_plausible(&text, f, &path.display().to_string());
            }
            // Whatever was masked, the JSON around it must still parse.
            if path.extension().is_some_and(|e| e == "json" || e == "traj") {
                serde_json::from_str::<serde_json::Value>(&rep.text)
                    .unwrap_or_else(|e| panic!("{}: redacted JSON broken: {e}", path.display()));
            }
        }
    }
    eprintln!("corpus: {files} files, {masks} masks");
    assert!(files > 0, "corpus directory {} is empty", dir.display());
}

const ORDINARY: &str = r#"$ git log --oneline -3
4748ae8 README, ARCHITECTURE, CI script
commit 4f433be0a1b2c3d4e5f60718293a4b5c6d7e8f90
Author: Dev <dev@example.com>
$ sha256sum dist/pkg.tar.gz
9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  dist/pkg.tar.gz
digest: sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
request_id = "123e4567-e89b-12d3-a456-426614174000"
session uuid: 550e8400-e29b-41d4-a716-446655440000
    def test_decode(self):
        data = base64.b64decode("SGVsbG8sIFdvcmxkISBUaGlzIGlzIHRlc3QgZGF0YS4=")
        blob = b"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
        assert tokenizer.tokenize("a b") == ["a", "b"]
        token = self._next_token()
        secret_santa = pick(names)
        password_field = form.fields["password"]
        api_key_header = "X-API-Key"
        key = cache_key(request)
/home/user/project/src/astropy/units/format/generic.py:123: in _parse
  File "/opt/conda/lib/python3.11/site-packages/numpy/core/fromnumeric.py", line 59
diff --git a/src/redact.rs b/src/redact.rs
index 3b18e51..a1b2c3d 100644
@@ -1,5 +1,7 @@
+    let token_count = tokens.len();
 numpy==1.26.4
 ghp-import==2.1.0
 sk-learn-helper==0.3.1
PYTHONPATH=/testbed:/usr/lib/python3
PWD=/testbed
OLDPWD=/root
TOKENIZERS_PARALLELISM=false
Pass: 12 tests, Secrets: none found
The Secretary passed the tokenizer test; max_tokens: 4096, "total_tokens": 1234.
"usage": {"prompt_tokens": 1200, "completion_tokens": 55, "cached_tokens": 0}
https://github.com/astropy/astropy/pull/12907#issuecomment-1012345678
https://pip.pypa.io/warnings/venv?utm_source=cli&utm_medium=pip
"#;

#[test]
fn ordinary_text_is_untouched() {
    let r = redactor();
    for url_credentials in [false, true] {
        let opts = RedactOptions {
            force: true,
            url_credentials,
            ..RedactOptions::default()
        };
        let rep = r.redact_report(ORDINARY, &opts);
        let found: Vec<String> = rep
            .findings
            .iter()
            .map(|f| {
                format!(
                    "{} line {}: {:?}",
                    f.rule,
                    f.line,
                    &ORDINARY[f.start..f.end]
                )
            })
            .collect();
        assert!(found.is_empty(), "false positives: {found:#?}");
    }
}
