#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One table row per rule family: a synthetic secret (never a real one) in the
//! surroundings where agents leak it, the masked output we expect, and what
//! must stay.

use context_engine::redact::{RedactOptions, Redactor, mask, redact};

fn forced() -> RedactOptions {
    RedactOptions {
        force: true,
        ..RedactOptions::default()
    }
}

fn with_urls() -> RedactOptions {
    RedactOptions {
        force: true,
        url_credentials: true,
        ..RedactOptions::default()
    }
}

struct Case {
    name: &'static str,
    input: String,
    /// Substrings that must be gone.
    secrets: Vec<&'static str>,
    /// Substrings that must still be there.
    kept: Vec<String>,
}

fn case(
    name: &'static str,
    input: impl Into<String>,
    secrets: &[&'static str],
    kept: &[&str],
) -> Case {
    Case {
        name,
        input: input.into(),
        secrets: secrets.to_vec(),
        kept: kept.iter().map(|s| (*s).to_owned()).collect(),
    }
}

const GHP: &str = "ghp_R4nd0mT0k3nF0rT3st1ngOnlyAbCdEf123456";
const OPENAI: &str = "sk-proj-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1JkLmNbVcXz";
const ANTHROPIC: &str = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKlMnOpQrSAA";
const AWS_ID: &str = "AKIAQ3EXAMPLE7TESTID";
const AWS_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKY";
const JWT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IlRlc3QifQ.c2lnbmF0dXJlX2Zvcl90ZXN0c19vbmx5XzEyMzQ1";

fn cases() -> Vec<Case> {
    vec![
        case(
            ".env file",
            format!(
                "# app settings\nDEBUG=true\nDATABASE_URL=postgres://app:Sup3rS3cretPw@db.internal:5432/app\nOPENAI_API_KEY={OPENAI}\nexport GITHUB_TOKEN={GHP}\nSECRET_KEY=django-insecure-9f8e7d6c5b4a\nPASSWORD=hunter2x\nLOG_LEVEL=info\n"
            ),
            &[
                "Sup3rS3cretPw",
                "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1",
                "R4nd0mT0k3nF0rT3st1ng",
                "django-insecure-9f8e7d6c5b4a",
                "hunter2x",
            ],
            &[
                "DEBUG=true",
                "LOG_LEVEL=info",
                "DATABASE_URL=postgres://app:",
                "@db.internal:5432/app",
                "OPENAI_API_KEY=sk-pro",
                "export GITHUB_TOKEN=ghp_R4",
            ],
        ),
        case(
            "curl with bearer header",
            format!(
                "curl -s -H \"Authorization: Bearer {OPENAI}\" https://api.example.com/v1/models"
            ),
            &["Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1"],
            &[
                "Authorization: Bearer ",
                "https://api.example.com/v1/models",
            ],
        ),
        case(
            "basic auth header keeps scheme",
            "Proxy-Authorization: Basic dXNlcjpwYXNzd29yZDEyMw==\nAccept: */*",
            &["dXNlcjpwYXNzd29yZDEyMw=="],
            &["Proxy-Authorization: Basic ", "Accept: */*"],
        ),
        case(
            "x-api-key header",
            format!(
                "curl https://api.example.com -H 'x-api-key: {ANTHROPIC}' -H 'content-type: application/json'"
            ),
            &["AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"],
            &["x-api-key: ", "content-type: application/json"],
        ),
        case(
            "JSON config inside a tool result (escaped)",
            format!(
                "{{\"role\": \"tool\", \"content\": \"{{\\n  \\\"api_key\\\": \\\"{}\\\",\\n  \\\"password\\\": \\\"correct-horse-42\\\",\\n  \\\"timeout\\\": 30\\n}}\"}}",
                "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW"
            ),
            &[
                "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW",
                "correct-horse-42",
            ],
            &["\\\"timeout\\\": 30", "\\\"api_key\\\": \\\"AIzaSy"],
        ),
        case(
            "plain JSON config",
            "{\"client_secret\": \"0a1b2c3d4e5f60718293a4b5\", \"client_id\": \"my-app\", \"token\": \"tkn-5f4e3d2c1b\"}",
            &["0a1b2c3d4e5f60718293a4b5", "tkn-5f4e3d2c1b"],
            &["\"client_id\": \"my-app\""],
        ),
        case(
            "python traceback printing a DSN",
            "Traceback (most recent call last):\n  File \"/app/db.py\", line 12, in connect\n    engine = create_engine(url)\nsqlalchemy.exc.OperationalError: (psycopg2.OperationalError) connection to server failed\n(Background: postgresql+psycopg2://admin:pg_P4ssw0rd_9x@10.0.0.5:5432/prod)",
            &["pg_P4ssw0rd_9x"],
            &[
                "postgresql+psycopg2://admin:",
                "@10.0.0.5:5432/prod",
                "File \"/app/db.py\", line 12",
            ],
        ),
        case(
            "other DSNs",
            "mongodb+srv://svc:M0ng0Pw7@cluster0.x.mongodb.net/db redis://:r3disPw99@cache:6379/0 amqp://guest:Rabb1tPw@mq:5672/ mysql://root:My5qlPw@localhost/db",
            &["M0ng0Pw7", "r3disPw99", "Rabb1tPw", "My5qlPw"],
            &[
                "mongodb+srv://svc:",
                "@cluster0.x.mongodb.net/db",
                "redis://:",
                "@cache:6379/0",
            ],
        ),
        case(
            "git remote -v with a token in the URL",
            format!(
                "origin\thttps://x-access-token:{GHP}@github.com/acme/app.git (fetch)\norigin\thttps://oauth2:glpat-Xy9z8W7v6U5t4S3r2Q1p@gitlab.com/acme/app.git (push)"
            ),
            &["R4nd0mT0k3nF0rT3st1ng", "glpat-Xy9z8W7v6U5t4S3r2Q1p"],
            &[
                "origin\thttps://x-access-token:",
                "@github.com/acme/app.git (fetch)",
                "@gitlab.com/acme/app.git (push)",
            ],
        ),
        case(
            "PEM block inside a file read",
            "$ cat deploy/id_rsa\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgwMbRvI0MBZhpF\nAbCdEfGhIjKlMnOpQrStUvWxYz0123456789+/AbCdEfGhIjKlMnOpQrStUvWxYz\n-----END RSA PRIVATE KEY-----\n$ ls\n",
            &[
                "MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn",
                "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789+/",
            ],
            &["$ cat deploy/id_rsa\n[REDACTED PRIVATE KEY]\n$ ls\n"],
        ),
        case(
            "PEM block JSON-escaped in a service-account file",
            "{\"type\": \"service_account\", \"private_key\": \"-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\\nAbCdEfGhIjKlMnOpQrSt\\n-----END PRIVATE KEY-----\\n\", \"client_email\": \"svc@proj.iam.gserviceaccount.com\"}",
            &["MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"],
            &[
                "[REDACTED PRIVATE KEY]",
                "\"client_email\": \"svc@proj.iam.gserviceaccount.com\"",
            ],
        ),
        case(
            "AWS credentials file",
            format!(
                "[default]\naws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}\nregion = us-east-1\n"
            ),
            &[
                "AKIAQ3EXAMPLE7TESTID",
                "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKY",
            ],
            &["region = us-east-1", "[default]"],
        ),
        case(
            "JWT in a log line",
            format!("INFO auth ok session={JWT} user=42"),
            &[
                "c2lnbmF0dXJlX2Zvcl90ZXN0c19vbmx5XzEyMzQ1",
                "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IlRlc3QifQ",
            ],
            &["INFO auth ok", "user=42"],
        ),
        case(
            "vendor prefixes",
            "slack=xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx\nstripe: sk_live_51AbCdEfGhIjKlMnOpQrStUv\nsendgrid SG.AbCdEfGhIjKlMnOpQrStUv.AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdEfG\nhf hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh\nreplicate r8_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789a\nnpm npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789\npypi pypi-AgEIcHlwaS5vcmcCJDAbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKlMnOpQrSt\ndo dop_v1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\ngroq gsk_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKl\nxai xai-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCd\npplx pplx-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKl\ntavily tvly-dev-AbCdEfGhIjKlMnOpQrStUvWxYz012345\ngoogle AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW\nslackapp xapp-1-A0123456789-1234567890123-abcdef0123456789abcdef\ngitlab glrt-AbCdEfGhIjKlMnOpQrSt0123 gldt-AbCdEfGhIjKlMnOpQrSt0123\n",
            &[
                "1234567890-0987654321-AbCdEfGhIj",
                "51AbCdEfGhIjKlMnOpQrStUv",
                "AbCdEfGhIjKlMnOpQrStUv.AbCdEfGh",
                "hf_AbCdEfGhIjKlMnOpQrStUvWxYz",
                "r8_AbCdEfGhIjKlMnOpQrStUvWxYz",
                "npm_AbCdEfGhIjKlMnOpQrStUvWxYz",
                "AgEIcHlwaS5vcmcCJDAbCdEfGhIj",
                "0123456789abcdef0123456789abcdef01234567",
                "gsk_AbCdEfGhIjKlMnOpQrStUvWxYz",
                "xai-AbCdEfGhIjKlMnOpQrStUvWxYz",
                "pplx-AbCdEfGhIjKlMnOpQrStUvWxYz",
                "tvly-dev-AbCdEfGhIjKlMnOpQrSt",
                "A1b2C3d4E5f6G7h8I9j0",
                "A0123456789-1234567890123-abcdef",
                "glrt-AbCdEfGhIjKlMnOpQrSt0123",
                "gldt-AbCdEfGhIjKlMnOpQrSt0123",
            ],
            &["slack=", "stripe: ", "sendgrid ", "\ngitlab "],
        ),
        case(
            "YAML and TOML config",
            "database:\n  host: db\n  password: Pa55w0rd-yaml\nsecret: y4ml-s3cret-v4lue\n[server]\napi_key = \"toml-k3y-0123456789\"\nport = 8080\n",
            &["Pa55w0rd-yaml", "y4ml-s3cret-v4lue", "toml-k3y-0123456789"],
            &["host: db", "port = 8080", "database:\n"],
        ),
        case(
            "python settings",
            "SECRET_KEY = 'dj-s3cr3t-k3y-abcdef'\nAPI_TOKEN = \"tok_9f8e7d6c5b4a\"\nDEBUG = False\n",
            &["dj-s3cr3t-k3y-abcdef", "tok_9f8e7d6c5b4a"],
            &["DEBUG = False"],
        ),
        case(
            "references are not secrets",
            "API_KEY=$OPENAI_API_KEY\ntoken = os.getenv(\"GITHUB_TOKEN\")\nconst key = process.env.API_KEY;\npassword: ${DB_PASSWORD}\nsecret = settings.SECRET\n-H \"Authorization: Bearer $TOKEN\"\napi_key = \"{api_key}\"\n",
            &[],
            &[
                "API_KEY=$OPENAI_API_KEY",
                "os.getenv(\"GITHUB_TOKEN\")",
                "process.env.API_KEY",
                "${DB_PASSWORD}",
                "settings.SECRET",
                "Bearer $TOKEN",
                "\"{api_key}\"",
            ],
        ),
        case(
            "prose and code with secret-ish words",
            "The Secretary asked about the tokenizer. Set max_tokens: 4096 and passwords must rotate.\ntoken = tokens[0]\nfor token in tokenize(line):\n    if token == \"(\":\n        pass\npassword_hash = hash_password(pw)\n",
            &[],
            &[
                "Secretary",
                "tokenizer",
                "max_tokens: 4096",
                "token = tokens[0]",
                "if token == \"(\":",
                "pass\n",
                "password_hash = hash_password(pw)",
            ],
        ),
        case(
            "token split by zero-width space",
            format!("leaked: {}\u{200B}{}\nnext", &GHP[..20], &GHP[20..]),
            &["R4nd0mT0k3nF0rT3st1ng", "ngOnlyAbCdEf12"],
            &["leaked: ghp_R4...3456\nnext"],
        ),
        case(
            "token split by a control character",
            format!("key {}\u{7}{} end", &OPENAI[..15], &OPENAI[15..]),
            &["Er7Ty6Ui5Op4As3Df2Gh1"],
            &["key sk-pro...VcXz end"],
        ),
    ]
}

#[test]
fn every_family_masks_its_secrets_in_context() {
    let mut failures = Vec::new();
    for c in cases() {
        let out = redact(&c.input, &forced());
        for s in &c.secrets {
            if out.contains(s) {
                failures.push(format!(
                    "[{}] secret survived: {s}\n--- output:\n{out}",
                    c.name
                ));
            }
        }
        for k in &c.kept {
            if !out.contains(k.as_str()) {
                failures.push(format!(
                    "[{}] lost ordinary text: {k:?}\n--- output:\n{out}",
                    c.name
                ));
            }
        }
        if c.secrets.is_empty() {
            assert_eq!(out, c.input, "[{}] nothing should change", c.name);
        }
        let again = redact(&out, &forced());
        if again != out {
            failures.push(format!(
                "[{}] not idempotent:\n{out}\n--- second pass:\n{again}",
                c.name
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn masks_keep_six_and_four() {
    let text = format!("t={GHP}");
    let out = redact(&text, &forced());
    assert_eq!(out, format!("t={}", mask(GHP)));
    assert_eq!(mask(GHP), "ghp_R4...3456");
    let out = redact("PASSWORD=hunter2x", &forced());
    assert_eq!(out, "PASSWORD=***");
}

#[test]
fn unchanged_text_is_borrowed() {
    let text = "nothing secret here, just code: fn main() {}";
    assert!(matches!(
        redact(text, &forced()),
        std::borrow::Cow::Borrowed(_)
    ));
}

#[test]
fn url_credentials_option() {
    let text = "GET https://api.example.com/cb?code=4/0AbCdEf123&state=xyz&access_token=ya28tok3n9 and https://deploy@host.example.com/x\nhttps://cdn.example.com/f?X-Amz-Signature=abcdef0123456789&X-Amz-Date=20240101";
    let plain = redact(text, &forced());
    // `access_token=` is a secret-named assignment and goes anyway; the
    // other parameters and the user name only with `url_credentials`.
    for k in [
        "code=4/0AbCdEf123",
        "X-Amz-Signature=abcdef0123456789",
        "https://deploy@host",
    ] {
        assert!(
            plain.contains(k),
            "{k} lost without url_credentials: {plain}"
        );
    }
    let out = redact(text, &with_urls());
    for s in ["4/0AbCdEf123", "ya28tok3n9", "abcdef0123456789", "deploy@"] {
        assert!(!out.contains(s), "{s} survived: {out}");
    }
    for k in [
        "state=xyz",
        "X-Amz-Date=20240101",
        "https://api.example.com/cb?code=***",
        "@host.example.com/x",
    ] {
        assert!(out.contains(k), "{k} lost: {out}");
    }
    assert_eq!(redact(&out, &with_urls()), out);
}

#[test]
fn url_password_is_always_masked() {
    let out = redact(
        "pip install --index-url https://user:Pyp1Passw0rd@pypi.internal/simple pkg",
        &forced(),
    );
    assert!(!out.contains("Pyp1Passw0rd"), "{out}");
    assert!(
        out.contains("https://user:***@pypi.internal/simple"),
        "{out}"
    );
}

#[test]
fn code_file_skips_generic_assignments_only() {
    let text = format!("password = \"hunter2x\"\ntoken = \"{GHP}\"\n");
    let opts = RedactOptions {
        force: true,
        code_file: true,
        ..RedactOptions::default()
    };
    let out = redact(&text, &opts);
    assert!(out.contains("password = \"hunter2x\""), "{out}");
    assert!(!out.contains(GHP), "{out}");
}

#[test]
fn user_patterns_and_tables() {
    let r = Redactor::builder()
        .pattern(r"ACME-[0-9]{6}")
        .rule_table(
            "extra",
            "[[rules]]\nid = \"internal\"\nregex = '''\\b(int_[a-z0-9]{12})\\b'''\nkeywords = [\"int_\"]\n",
        )
        .build()
        .unwrap();
    let out = r.redact("id ACME-123456 and int_abc123def456 ok", &forced());
    assert_eq!(out, "id *** and *** ok");
    let report = r.redact_report("a\nb ACME-654321\n", &forced());
    assert_eq!(report.findings.len(), 1);
    assert_eq!(report.findings[0].line, 2);
    assert_eq!(report.findings[0].rule, "user-pattern-0");
    assert_eq!(report.findings[0].masked, "***");
}

#[test]
fn bad_patterns_are_typed_errors() {
    let err = Redactor::builder()
        .pattern("(unclosed")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("user pattern #0"), "{err}");
    let err = Redactor::builder()
        .rule_table("broken", "[[rules]]\nid = \"x\"\nregex = 'a'\n")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("no keyword"), "{err}");
}

#[test]
fn jwt_is_recognised_by_its_header_whatever_the_payload() {
    // Header `{"alg":"HS256","typ":"JWT"}`; payload and signature are random
    // base64url, not JSON.
    let token = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.Zk9vQmFyQmF6cXV4MTIzNDU2Nzg.aGVsbG8td29ybGQtc2lnbmF0dXJlLTEyMzQ";
    let out = redact(&format!("jwt = {token}"), &forced()).into_owned();
    assert!(!out.contains("Zk9vQmFyQmF6cXV4MTIzNDU2Nzg"), "{out}");
    assert!(!out.contains(token), "{out}");
    assert!(out.starts_with("jwt = "), "{out}");
    // Not an assignment: found by the header alone.
    let out = redact(&format!("the token {token} expired"), &forced()).into_owned();
    assert!(!out.contains(token), "{out}");
    assert_eq!(redact(&out, &forced()), out);
    // `{"kid":"x"}` and `{"a":1}` are not JWT headers: base64 JSON that is
    // not a token stays (here in prose, no secret-named key).
    let not_header = "eyJhIjoxLCJiIjoyLCJjIjozfQ.Zk9vQmFyQmF6cXV4MTIz.aGVsbG8td29ybGQ";
    let out = redact(&format!("fixture {not_header} ok"), &forced()).into_owned();
    assert!(out.contains(not_header), "{out}");
}

#[test]
fn url_with_credentials_keeps_host_and_path() {
    let token = "ghs_16C7e42F292c6912E7710c838347Ae178B4a";
    let text = format!("git clone https://x-access-token:{token}@github.com/acme/app.git");
    for opts in [forced(), with_urls()] {
        let out = redact(&text, &opts);
        assert!(!out.contains(token), "{out}");
        assert!(out.contains("https://x-access-token:"), "{out}");
        assert!(out.contains("@github.com/acme/app.git"), "{out}");
        assert_eq!(redact(&out, &opts), out);
    }
    // A password that is not a known token shape: only it goes.
    let out = redact(
        "remote: https://deploy:Zq8vT2mW9pLx4R@git.example.com:8443/team/repo.git",
        &with_urls(),
    );
    assert_eq!(
        out,
        "remote: https://deploy:***@git.example.com:8443/team/repo.git"
    );
}
