#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of the session store from the command line:
//! `ctx compact --store`, `ctx recall`, `ctx search`, `ctx replay --store`.

use std::collections::HashSet;

use serde_json::Value;

mod common;
use common::*;

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ctx-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

#[test]
fn compact_archives_what_it_removes_and_recall_gives_it_back_exactly() {
    let db = temp("compact.db");
    let db = db.to_str().unwrap();
    let o = ctx(&[
        "compact",
        "examples/coding-session.json",
        "--context-length",
        "16000",
        "--store",
        db,
        "--report",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let report: Value = serde_json::from_str(&stderr(&o)).unwrap();
    let archived = report["archived"].as_array().unwrap();
    assert_eq!(archived.len(), 1, "{report}");
    let handle = archived[0]["handle"].as_str().unwrap();
    let (start, end) = (
        archived[0]["start"].as_u64().unwrap() as usize,
        archived[0]["end"].as_u64().unwrap() as usize,
    );
    // The summary names the handle.
    let text = serde_json::to_string(&out).unwrap();
    assert!(
        text.contains(&format!("(handle {handle})")),
        "summary names it"
    );

    // Recall gives back exactly the input messages of the span that left.
    let original: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/coding-session.json")).unwrap(),
    )
    .unwrap();
    let kept: HashSet<String> = out.iter().map(|m| m.to_string()).collect();
    let expected: Vec<&Value> = original[start..end]
        .iter()
        .filter(|m| !kept.contains(&m.to_string()))
        .collect();
    let r = ctx(&["recall", "--store", db, handle, "--json"]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    let recalled: Value = serde_json::from_slice(&r.stdout).unwrap();
    let messages: Vec<&Value> = recalled["messages"].as_array().unwrap().iter().collect();
    assert_eq!(messages, expected);
    assert_eq!(recalled["kind"], "span");

    // Every removed message is archived, none is lost.
    let removed = original
        .iter()
        .filter(|m| !kept.contains(&m.to_string()))
        .count();
    assert_eq!(
        report["archived_messages"].as_u64().unwrap() as usize,
        removed
    );

    // Search finds archived text, with the span handle.
    let s = ctx(&["search", "--store", db, "RetryPolicy", "--json"]);
    assert_eq!(s.status.code(), Some(0), "{}", stderr(&s));
    let hits: Vec<Value> = serde_json::from_slice(&s.stdout).unwrap();
    assert!(!hits.is_empty());
    // (The summary itself is archived too, outside the span.)
    assert!(
        hits.iter()
            .any(|h| h["spans"].as_array().unwrap().iter().any(|x| x == handle))
    );
    // A tool result from the span by its digest handle, as text.
    let id = expected
        .iter()
        .find_map(|m| m["tool_call_id"].as_str())
        .unwrap();
    let r = ctx(&["recall", "--store", db, id]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));

    // Unknown handle: exit 1 and a clear message; nothing matches: exit 1.
    let r = ctx(&["recall", "--store", db, "s000000000000"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(
        stderr(&r).contains("no handle `s000000000000`"),
        "{}",
        stderr(&r)
    );
    let s = ctx(&["search", "--store", db, "zzyzx-not-there"]);
    assert_eq!(s.status.code(), Some(1));
    let s = ctx(&["search", "--store", db, "--", "--- ::"]);
    assert_eq!(s.status.code(), Some(2), "{}", stderr(&s));
}

/// The issue's example: a long pytest output archived with one failing
/// assertion among hundreds of PASSED lines. `ctx search` shows that line
/// (number and text) under the handle that recalls the whole output, and
/// `--json` carries the line with the ranges of the words in it.
#[test]
fn search_shows_the_line_that_matched() {
    use context_engine::store::{Batch, SessionStore};
    use context_engine::{Message, ToolCall};
    use context_engine_sqlite::SqliteStore;

    let db = temp("issue.db");
    let mut output = String::new();
    for i in 0..300 {
        output.push_str(&format!("tests/test_main.py::test_{i} PASSED in 0.01s\n"));
    }
    output.push_str("E   AssertionError: expected 38 got 136 in test_11_6\n");
    for i in 0..40 {
        output.push_str(&format!("tests/test_io.py::test_{i} PASSED\n"));
    }
    let span = [
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function("p1", "bash", r#"{"command": "pytest"}"#)],
        ),
        Message::tool_result("p1", output),
    ];
    let store = SqliteStore::open(&db).unwrap();
    let mut batch = Batch::new();
    let span_handle = batch.archive_span(&span, 1, 3);
    store.commit("s", &batch).unwrap();
    drop(store);
    let db = db.to_str().unwrap();
    let query = "expected 38 got 136 in test_11_6";
    let s = ctx(&["search", "--store", db, query]);
    assert_eq!(s.status.code(), Some(0), "{}", stderr(&s));
    assert_eq!(
        stdout(&s),
        format!(
            "p1  tool  span {span_handle}\n  301: E   AssertionError: expected 38 got 136 in test_11_6\n"
        )
    );
    let s = ctx(&["search", "--store", db, query, "--json"]);
    let hits: Vec<Value> = serde_json::from_slice(&s.stdout).unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0]["handle"], "p1");
    let line = &hits[0]["lines"][0];
    assert_eq!(line["line"], 301);
    let text = line["text"].as_str().unwrap();
    let marked: Vec<&str> = line["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &text[r[0].as_u64().unwrap() as usize..r[1].as_u64().unwrap() as usize])
        .collect();
    assert_eq!(marked, ["expected", "38", "got", "136", "in", "test_11_6"]);
}

#[test]
fn bad_store_files_are_clear_errors_and_left_alone() {
    let junk = temp("notes.txt");
    std::fs::write(&junk, "my notes, not a database\n".repeat(100)).unwrap();
    let before = std::fs::read(&junk).unwrap();
    let o = ctx(&[
        "compact",
        "examples/bugfix-session.json",
        "--context-length",
        "4000",
        "--store",
        junk.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("notes.txt") && err.contains("not a context-engine store"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "nothing written when the store is bad");
    assert_eq!(std::fs::read(&junk).unwrap(), before);
    // recall and search never create a store.
    let missing = temp("missing.db");
    let o = ctx(&[
        "recall",
        "--store",
        missing.to_str().unwrap(),
        "s000000000000",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("missing.db"), "{}", stderr(&o));
    assert!(!missing.exists());
}

#[test]
fn replay_with_a_store_makes_compacted_facts_recallable() {
    // At 8k the state record keeps every fact of the example in the
    // request or its summary; at 4k some leave it, and only the archive
    // has them.
    let db = temp("replay.db");
    let args = |store: &[&str]| {
        let mut a = vec![
            "replay",
            "examples/coding-session.json",
            "--context-length",
            "4000",
            "--json",
        ];
        a.extend_from_slice(store);
        let o = ctx(&a);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let without = args(&["--no-store"]);
    let memory = args(&[]);
    let sqlite = args(&["--store", db.to_str().unwrap()]);
    assert_eq!(without["retention"]["recallable"], 0);
    assert!(memory["retention"]["recallable"].as_u64().unwrap() > 0);
    assert!(
        memory["retention"]["lost"].as_u64().unwrap()
            < without["retention"]["lost"].as_u64().unwrap()
    );
    assert_eq!(memory["retention"], sqlite["retention"]);
    assert_eq!(
        memory["totals"]["prompt_tokens_with_engine"],
        sqlite["totals"]["prompt_tokens_with_engine"]
    );
    // Replaying again into the same file starts afresh: same figures.
    let again = args(&["--store", db.to_str().unwrap()]);
    assert_eq!(again["retention"], sqlite["retention"]);
}

use context_engine_testkit::secrets;

/// Runs `ctx ARGS` with `env` set.
fn ctx_with(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = command();
    cmd.args(args)
        .env_remove("CTX_STORE__VERBATIM")
        .env_remove("CTX_STORE__ENCRYPTION_KEY_ENV")
        .env_remove("CTX_TEST_STORE_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// `ctx search` and `ctx recall` never print what redaction masks unless
/// `--unmasked`: on the default store (which keeps the masked text), on a
/// verbatim store (the output is masked) and on an encrypted one (recall
/// needs the key; its index holds the masked text).
#[test]
fn search_and_recall_print_no_secret_unless_unmasked() {
    let mut session: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/coding-session.json")).unwrap(),
    )
    .unwrap();
    let planted = [3, 5, 13, 15];
    for i in planted {
        let text = secrets::planted(session[i]["content"].as_str().unwrap());
        session[i]["content"] = text.into();
    }
    let input = temp("leaky-session.json");
    std::fs::write(&input, serde_json::to_string(&session).unwrap()).unwrap();
    let key = "0f".repeat(32);
    // The user's pattern, and the store's keys per case, from a file.
    let config = |name: &str, store: &str| {
        let file = temp(&format!("leaky-{name}.yaml"));
        std::fs::write(
            &file,
            format!(
                "security:\n  redact_patterns: ['{}']\n{store}",
                secrets::USER_PATTERN
            ),
        )
        .unwrap();
        file.to_str().unwrap().to_owned()
    };
    let default_config = config("default", "");
    let verbatim_config = config("verbatim", "store:\n  verbatim: true\n");
    let sealed_config = config(
        "sealed",
        "store:\n  verbatim: true\n  encryption_key_env: CTX_TEST_STORE_KEY\n",
    );
    let default = [("CTX_CONFIG", default_config.as_str())];
    let verbatim = [("CTX_CONFIG", verbatim_config.as_str())];
    let sealed = [
        ("CTX_CONFIG", sealed_config.as_str()),
        ("CTX_TEST_STORE_KEY", key.as_str()),
    ];
    let cases: [(&str, &[(&str, &str)]); 3] = [
        ("default", &default),
        ("verbatim", &verbatim),
        ("sealed", &sealed),
    ];
    for (name, env) in cases {
        let db = temp(&format!("leaky-{name}.db"));
        let db = db.to_str().unwrap();
        let o = ctx_with(
            &[
                "compact",
                input.to_str().unwrap(),
                "--context-length",
                "16000",
                "--store",
                db,
            ],
            env,
        );
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        assert_eq!(
            stderr(&o).contains("WARNING") && stderr(&o).contains("in the clear"),
            name == "verbatim",
            "{name}: the warning of a verbatim store without a key: {}",
            stderr(&o)
        );
        // The planted outputs that were archived.
        let archived: Vec<String> = planted
            .iter()
            .map(|&i| session[i]["tool_call_id"].as_str().unwrap().to_owned())
            .filter(|id| ctx_with(&["recall", "--store", db, id], env).status.code() == Some(0))
            .collect();
        assert!(!archived.is_empty(), "{name}: nothing planted was archived");
        for id in &archived {
            for json in [false, true] {
                let mut args = vec!["recall", "--store", db, id.as_str()];
                if json {
                    args.push("--json");
                }
                let r = ctx_with(&args, env);
                assert_eq!(r.status.code(), Some(0), "{name}: {}", stderr(&r));
                assert!(
                    secrets::found(&r.stdout).is_empty(),
                    "{name}: {}",
                    stdout(&r)
                );
                assert!(stdout(&r).contains("[REDACTED PRIVATE KEY]"), "{name}");
            }
            args_unmasked(name, db, id, env);
        }
        let s = ctx_with(
            &["search", "--store", db, "aws_access_key_id", "--json"],
            env,
        );
        assert_eq!(s.status.code(), Some(0), "{name}: {}", stderr(&s));
        assert!(
            secrets::found(&s.stdout).is_empty(),
            "{name}: {}",
            stdout(&s)
        );
        let s = ctx_with(
            &[
                "search",
                "--store",
                db,
                "aws_access_key_id",
                "--json",
                "--unmasked",
            ],
            env,
        );
        assert_eq!(
            !secrets::found(&s.stdout).is_empty(),
            name == "verbatim",
            "{name}: only a verbatim store's index holds the secret: {}",
            stdout(&s)
        );
        if name == "sealed" {
            // Without the key: an error naming the setting, exit 2.
            let r = ctx_with(&["recall", "--store", db, &archived[0]], &default);
            assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
            assert!(
                stderr(&r).contains("store.encryption_key_env"),
                "{}",
                stderr(&r)
            );
            // The variable named but not set.
            let r = ctx_with(&["recall", "--store", db, &archived[0]], &sealed[..1]);
            assert_eq!(r.status.code(), Some(2));
            assert!(
                stderr(&r).contains("`CTX_TEST_STORE_KEY`"),
                "{}",
                stderr(&r)
            );
        }
    }
}

/// `ctx recall --unmasked`: the secrets of a verbatim store (an encrypted
/// one decrypted with its key); still none from the default store, which
/// never kept them.
fn args_unmasked(name: &str, db: &str, id: &str, env: &[(&str, &str)]) {
    let r = ctx_with(&["recall", "--store", db, id, "--unmasked"], env);
    assert_eq!(r.status.code(), Some(0), "{name}: {}", stderr(&r));
    assert_eq!(
        secrets::found(&r.stdout).len(),
        if name == "default" { 0 } else { 4 },
        "{name}: {}",
        stdout(&r)
    );
}
