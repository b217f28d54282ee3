use std::path::PathBuf;

use rusqlite::Connection;
use serde_json::json;

use super::*;
use context_engine::store::*;
use context_engine::{Message, ToolCall};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ctx-store-{name}-{}-{}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Messages compare by their exact JSON (what the store keeps).
fn json_of(messages: &[Message]) -> Vec<String> {
    messages.iter().map(handle::message_json).collect()
}

fn history() -> Vec<Message> {
    vec![
        Message::system("You are a coding agent."),
        Message::user("fix the failing parser test in src/parse.rs"),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "c1",
                "bash",
                r#"{"command": "pytest -q tests/test_parse.py"}"#,
            )],
        ),
        Message::tool_result(
            "c1",
            "FAILED tests/test_parse.py::test_empty - KeyError: 'token'\n[exit 1]",
        ),
        Message::assistant("The tokenizer drops empty input; editing src/parse.rs."),
        Message::user("also run the linter"),
    ]
}

/// The same lifecycle on every backend.
fn story(store: &dyn SessionStore) {
    let input = history();
    // A compaction that keeps the system prompt and the last ask.
    let span = &input[1..5];
    let handle = span_handle(span);
    let summary = Message::user(format!(
        "[CONTEXT SUMMARY]\n{}\n[END]",
        archive_note(1, 5, &handle)
    ));
    let output = vec![input[0].clone(), summary, input[5].clone()];
    let mut batch = Batch::new();
    let info = CompactionInfo::new(1, "manual", "compressor")
        .with_summarizer(Some("extractive".into()))
        .with_tokens(500, 200);
    let archived = batch.compaction(&input, &output, &info).expect("archived");
    assert_eq!(
        archived,
        ArchivedSpan {
            handle: handle.clone(),
            start: 1,
            end: 5
        }
    );
    batch.set_state(json!({"compression_count": 1}));
    store.commit("s1", &batch).expect("commit");

    // The span resolves to the original messages, exactly.
    let entry = store
        .resolve(Some("s1"), &handle)
        .expect("resolve")
        .expect("found");
    assert_eq!(entry.kind, EntryKind::Span);
    assert_eq!(json_of(&entry.messages), json_of(span));
    assert_eq!((entry.start, entry.end), (Some(1), Some(5)));
    assert_eq!(entry.session, "s1");
    // A tool result resolves by its digest handle; any session when None.
    let result = store.resolve(None, "c1").expect("resolve").expect("found");
    assert_eq!(json_of(&result.messages), json_of(&input[3..4]));
    assert!(
        store
            .resolve(Some("other"), "c1")
            .expect("resolve")
            .is_none()
    );
    assert!(
        store
            .resolve(Some("s1"), "s000000000000")
            .expect("resolve")
            .is_none()
    );

    // Full-text search: phrases, all words first, then any.
    let hits = store
        .search(Some("s1"), "KeyError test_parse.py", 5)
        .expect("search");
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].handle, "c1");
    assert_eq!(hits[0].spans, vec![handle.clone()]);
    // The line that holds the words, with their ranges.
    let line = &hits[0].lines[0];
    assert_eq!(line.line, 1, "{line:?}");
    let marked: Vec<&str> = line
        .ranges
        .iter()
        .map(|[s, e]| &line.text[*s..*e])
        .collect();
    assert_eq!(marked, ["test_parse.py", "KeyError"], "{line:?}");
    let any = store
        .search(Some("s1"), "linter tokenizer", 5)
        .expect("search");
    assert_eq!(any.len(), 1, "falls back to any word: {any:?}");
    assert!(
        store
            .search(Some("s1"), "   ", 5)
            .expect("search")
            .is_empty()
    );
    assert!(
        store
            .search(Some("s1"), "\"\" :", 5)
            .expect("search")
            .is_empty()
    );

    // Records and state.
    let records = store.compactions("s1").expect("records");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].handle, handle);
    assert_eq!(records[0].archived, 4);
    assert_eq!(records[0].summarizer.as_deref(), Some("extractive"));
    assert_eq!(records[0].summary.len(), 1);
    assert_eq!(
        store.load_state("s1").expect("state"),
        Some(json!({"compression_count": 1}))
    );
    assert_eq!(store.load_state("nobody").expect("state"), None);

    // The same compaction number twice is a clash of records, and changes
    // nothing.
    let mut again = Batch::new();
    again.compaction(&input, &output, &info);
    again.set_state(json!({"compression_count": 99}));
    assert!(matches!(
        store.commit("s1", &again),
        Err(StoreError::Duplicate { .. })
    ));
    assert_eq!(
        store.load_state("s1").expect("state"),
        Some(json!({"compression_count": 1}))
    );

    // Archiving the same message again (another session) stores it once.
    let mut other = Batch::new();
    other.archive(&input[3]);
    store.commit("s2", &other).expect("commit");
    assert_eq!(
        store
            .resolve(Some("s2"), "c1")
            .expect("r")
            .expect("f")
            .messages
            .len(),
        1
    );
    store.delete_session("s2").expect("delete");
    assert!(store.resolve(Some("s2"), "c1").expect("r").is_none());
    assert!(store.resolve(Some("s1"), "c1").expect("r").is_some());
    assert!(store.handles("s1").expect("handles").contains(&handle));
}

#[test]
fn memory_story() {
    story(&MemoryStore::new());
}

#[test]
fn sqlite_story() {
    let dir = temp_dir("story");
    let path = dir.join("sub/store.db");
    {
        let store = SqliteStore::open(&path).expect("open");
        story(&store);
        store.check().expect("integrity");
    }
    // Reopened: everything is still there.
    let store = SqliteStore::open(&path).expect("reopen");
    assert_eq!(store.compactions("s1").expect("records").len(), 1);
    let ro = SqliteStore::open_read_only(&path).expect("read only");
    assert_eq!(ro.search(None, "KeyError", 3).expect("search").len(), 1);
    drop((store, ro));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sqlite_in_memory_story() {
    story(&SqliteStore::open_in_memory().expect("open"));
}

#[test]
fn fts5_and_wal_are_compiled_in() {
    let conn = Connection::open_in_memory().expect("open");
    let fts5: i64 = conn
        .query_row("SELECT sqlite_compileoption_used('ENABLE_FTS5')", [], |r| {
            r.get(0)
        })
        .expect("query");
    assert_eq!(fts5, 1);
    let dir = temp_dir("wal");
    let path = dir.join("s.db");
    drop(SqliteStore::open(&path).expect("open"));
    let conn = Connection::open(&path).expect("open");
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("query");
    assert_eq!(mode, "wal");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_store_files_are_refused_by_name() {
    let dir = temp_dir("bad");
    // Not a database: refused, and the file is left as it was.
    let junk = dir.join("notes.txt");
    let text = "these are my notes, not a database\n".repeat(200);
    std::fs::write(&junk, &text).expect("write");
    let err = SqliteStore::open(&junk).expect_err("not a db");
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    assert!(err.to_string().contains("notes.txt"), "{err}");
    assert_eq!(std::fs::read_to_string(&junk).expect("read"), text);

    // Another program's SQLite database.
    let foreign = dir.join("foreign.db");
    Connection::open(&foreign)
        .expect("open")
        .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .expect("create");
    let err = SqliteStore::open(&foreign).expect_err("foreign");
    assert!(err.to_string().contains("another program"), "{err}");

    // A newer schema.
    let newer = dir.join("newer.db");
    drop(SqliteStore::open(&newer).expect("create"));
    Connection::open(&newer)
        .expect("open")
        .execute_batch(&format!("PRAGMA user_version = {}", SCHEMA_VERSION + 1))
        .expect("bump");
    let err = SqliteStore::open(&newer).expect_err("newer");
    assert!(matches!(err, StoreError::NewerSchema { .. }), "{err}");
    assert!(err.to_string().contains("newer version"), "{err}");

    // Locked by another writer.
    let locked = dir.join("locked.db");
    drop(SqliteStore::open(&locked).expect("create"));
    let writer = Connection::open(&locked).expect("open");
    writer.execute_batch("BEGIN IMMEDIATE").expect("lock");
    let err = SqliteStore::open(&locked).expect_err("locked");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("locked.db"), "{err}");
    writer.execute_batch("ROLLBACK").expect("unlock");
    SqliteStore::open(&locked).expect("free again");

    // Read-only: a writer that can only read is refused up front.
    let err = SqliteStore::open_with(&locked, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY, true)
        .expect_err("read only");
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err}");
    // And a missing file is not created by a reader.
    let err = SqliteStore::open_read_only(&dir.join("missing.db")).expect_err("missing");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    assert!(!dir.join("missing.db").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_older_schema_is_migrated_keeping_its_data() {
    let conn = Connection::open_in_memory().expect("open");
    let v1 = (1, "CREATE TABLE a (x TEXT); INSERT INTO a VALUES ('kept');");
    let v2 = (2, "ALTER TABLE a ADD COLUMN y TEXT DEFAULT 'new';");
    crate::migrate_for_test(&conn, &[v1]).expect("v1");
    crate::migrate_for_test(&conn, &[v1, v2]).expect("v2");
    let (x, y): (String, String) = conn
        .query_row("SELECT x, y FROM a", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("row");
    assert_eq!((x.as_str(), y.as_str()), ("kept", "new"));
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, 2);
    // A failing migration leaves the previous version intact.
    let bad = (3, "CREATE TABLE b (x); THIS IS NOT SQL;");
    assert!(crate::migrate_for_test(&conn, &[v1, v2, bad]).is_err());
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, 2);
    let b: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'b'",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(b, 0);
}

#[test]
fn reachable_follows_handles_transitively() {
    let store = MemoryStore::new();
    let old = vec![
        Message::user("first ask: port the lexer"),
        Message::assistant("ok"),
    ];
    let mut batch = Batch::new();
    let h1 = batch.archive_span(&old, 1, 3);
    store.commit("s", &batch).expect("commit");
    let mid = vec![
        Message::user(format!("summary: {}", archive_note(1, 3, &h1))),
        Message::assistant("second step"),
    ];
    let mut batch = Batch::new();
    let h2 = batch.archive_span(&mid, 1, 3);
    store.commit("s", &batch).expect("commit");
    let view = vec![Message::user(format!("latest summary names {h2}"))];
    let found = reachable(&store, "s", &view).expect("reach");
    assert_eq!(found.len(), 4, "{found:?}");
    assert!(json_of(&found).contains(&handle::message_json(&old[0])));
    // A view naming nothing reaches nothing.
    assert!(
        reachable(&store, "s", &[Message::user("hi")])
            .expect("reach")
            .is_empty()
    );
}

#[test]
fn a_schema_1_store_opens_migrated_and_its_plain_json_rows_still_read() {
    let dir = std::env::temp_dir().join(format!("ctx-store-v1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("v1.db");
    let _ = std::fs::remove_file(&path);
    let long = Message::tool_result("c1", "line of output\n".repeat(100));
    let hash = message_hash(&long);
    {
        // What schema 1 wrote: the JSON as TEXT.
        let conn = Connection::open(&path).expect("open");
        crate::migrate_for_test(
            &conn,
            &[(1, include_str!("migrations/sqlite/0001_init.sql"))],
        )
        .expect("v1");
        conn.execute_batch(&format!("PRAGMA application_id = {}", 0x4354_5853_i64))
            .expect("id");
        conn.execute(
            "INSERT INTO messages (id, hash, role, json) VALUES (1, ?1, 'tool', ?2)",
            rusqlite::params![hash, context_engine::store::handle::message_json(&long)],
        )
        .expect("row");
        conn.execute_batch(
            "INSERT INTO archive VALUES ('s', 1, 1); \
             INSERT INTO handles VALUES ('s', 'c1', 'message', NULL, NULL); \
             INSERT INTO handle_members VALUES ('s', 'c1', 0, 1);",
        )
        .expect("rows");
    }
    let store = SqliteStore::open(&path).expect("migrated");
    let entry = store
        .resolve(Some("s"), "c1")
        .expect("resolve")
        .expect("there");
    let json = context_engine::store::handle::message_json;
    assert_eq!(entry.messages.len(), 1);
    assert_eq!(json(&entry.messages[0]), json(&long));
    // New rows are deflated, and read back byte for byte.
    let other = Message::tool_result("c2", "another line\n".repeat(100));
    let mut batch = Batch::new();
    batch.archive(&other);
    store.commit("s", &batch).expect("commit");
    let entry = store
        .resolve(Some("s"), "c2")
        .expect("resolve")
        .expect("there");
    assert_eq!(entry.messages.len(), 1);
    assert_eq!(json(&entry.messages[0]), json(&other));
    let conn = Connection::open(&path).expect("open");
    let (version, blobs): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT user_version FROM pragma_user_version), \
             (SELECT COUNT(*) FROM messages WHERE typeof(json) = 'blob')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("query");
    assert_eq!((version, blobs), (SCHEMA_VERSION, 1));
    drop(conn);
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_schema_3_record_opens_migrated_with_its_history_as_one_segment() {
    let dir = std::env::temp_dir().join(format!("ctx-store-v3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("v3.db");
    let _ = std::fs::remove_file(&path);
    {
        // What schema 3 wrote for a server's session: the record wrapped in
        // the state slot, the history one text.
        let conn = Connection::open(&path).expect("open");
        let upto3: Vec<(i64, &str)> = crate::MIGRATIONS_FOR_TEST[..3].to_vec();
        crate::migrate_for_test(&conn, &upto3).expect("v3");
        conn.execute_batch(&format!("PRAGMA application_id = {}", 0x4354_5853_i64))
            .expect("id");
        let wrapped =
            serde_json::json!({"versioned": 7, "state": {"n": 1}, "history": "{\"chain\":[]}"});
        conn.execute(
            "INSERT INTO state (session, json, updated_ms) VALUES ('s', ?1, 1), ('plain', '{\"x\":1}', 1)",
            [wrapped.to_string()],
        )
        .expect("row");
    }
    let store = SqliteStore::open(&path).expect("migrated");
    assert_eq!(store.version("s").expect("version"), Some(7));
    assert_eq!(store.version("plain").expect("version"), Some(0));
    let rec = store.load_versioned("s").expect("load").expect("record");
    assert_eq!(rec.version, 7);
    assert_eq!(rec.state, serde_json::json!({"n": 1}));
    assert_eq!(rec.history, vec!["{\"chain\":[]}".to_owned()]);
    // The next write appends to it.
    let next = vec!["second".to_owned()];
    let v = store
        .commit_versioned(
            "s",
            7,
            &[],
            &serde_json::json!({"n": 2}),
            Some(HistoryWrite {
                keep: 1,
                append: &next,
            }),
        )
        .expect("append");
    assert_eq!(v, 8);
    let rec = store.load_versioned("s").expect("load").expect("record");
    assert_eq!(
        rec.history,
        vec!["{\"chain\":[]}".to_owned(), "second".to_owned()]
    );
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_index_trails_by_a_batch_and_no_search_misses_what_waits() {
    use crate::INDEX_BATCH;
    let dir = temp_dir("index-batch");
    let path = dir.join("s.db");
    let indexed = || -> i64 {
        Connection::open(&path)
            .expect("open")
            .query_row("SELECT COUNT(*) FROM archive_fts_docsize", [], |r| r.get(0))
            .expect("count")
    };
    let archive = |store: &SqliteStore, text: String| {
        let mut batch = Batch::new();
        batch.archive(&Message::user(text));
        store.commit("s", &batch).expect("commit");
    };
    let store = SqliteStore::open(&path).expect("open");
    archive(&store, "a needle in the first message".into());
    assert_eq!(indexed(), 0, "one message waits for the index");
    // A reader scans what waits; the writer indexes it before searching.
    let reader = SqliteStore::open_read_only(&path).expect("read only");
    assert_eq!(
        reader.search(Some("s"), "needle", 5).expect("search").len(),
        1
    );
    assert_eq!(indexed(), 0);
    assert_eq!(
        store.search(Some("s"), "needle", 5).expect("search").len(),
        1
    );
    assert_eq!(indexed(), 1);
    // The commit that reaches a batch indexes all that wait.
    for k in 0..INDEX_BATCH {
        archive(&store, format!("haystack message {k}"));
        let expected = if k + 1 == INDEX_BATCH {
            1 + INDEX_BATCH
        } else {
            1
        };
        assert_eq!(indexed(), expected as i64, "after {} commits", k + 1);
    }
    // A writer that stops without indexing (a killed process): the next
    // one indexes on open, and nothing was missed meanwhile.
    archive(&store, "a needle in a late message".into());
    drop(store);
    assert_eq!(
        reader.search(Some("s"), "needle", 5).expect("search").len(),
        2
    );
    assert_eq!(indexed(), (1 + INDEX_BATCH) as i64);
    let store = SqliteStore::open(&path).expect("reopen");
    assert_eq!(indexed(), (2 + INDEX_BATCH) as i64);
    let hits = store.search(Some("s"), "needle", 5).expect("search");
    assert_eq!(hits.len(), 2);
    assert!(
        hits.iter()
            .any(|h| h.lines[0].text.contains("late message"))
    );
    // Deleting a session drops its messages, indexed or waiting.
    archive(&store, "one more needle".into());
    store.delete_session("s").expect("delete");
    assert_eq!(indexed(), 0);
    assert!(store.search(None, "needle", 5).expect("search").is_empty());
    archive(&store, "a needle after the delete".into());
    assert_eq!(
        store.search(Some("s"), "needle", 5).expect("search").len(),
        1
    );
    // Another session's message waits while the newest indexed ones go.
    let mut batch = Batch::new();
    batch.archive(&Message::user("a needle of session t"));
    store.commit("t", &batch).expect("commit");
    store.delete_session("s").expect("delete");
    assert_eq!(reader.search(None, "needle", 5).expect("search").len(), 1);
    let hits = store.search(None, "needle", 5).expect("search");
    assert_eq!(hits.len(), 1);
    assert!(hits[0].lines[0].text.contains("session t"));
    assert_eq!(indexed(), 1);
    drop((store, reader));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_record_and_its_batches_commit_together_or_not_at_all() {
    let dir = temp_dir("record-atomic");
    let store = SqliteStore::open(&dir.join("s.db")).expect("open");
    let input = history();
    let output = vec![
        input[0].clone(),
        Message::user("[summary]"),
        input[5].clone(),
    ];
    let info = CompactionInfo::new(1, "auto", "compressor");
    let mut first = Batch::new();
    first.compaction(&input, &output, &info).expect("archived");
    let v = store
        .commit_versioned("s", 0, &[first], &json!({"n": 1}), None)
        .expect("first record");
    assert_eq!(v, 1);
    // A step whose second batch cannot be written (compaction 1 again):
    // the first batch's archive must not stand without the record.
    let mut archived = Batch::new();
    archived.archive(&Message::user("a zanzibar only this step archived"));
    let mut again = Batch::new();
    again.compaction(&input, &output, &info);
    let err = store
        .commit_versioned("s", 1, &[archived, again], &json!({"n": 2}), None)
        .expect_err("the repeated compaction clashes");
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err}");
    assert_eq!(store.version("s").expect("version"), Some(1));
    assert_eq!(
        store
            .load_versioned("s")
            .expect("load")
            .expect("record")
            .state,
        json!({"n": 1})
    );
    assert!(
        store
            .search(Some("s"), "zanzibar", 5)
            .expect("search")
            .is_empty(),
        "nothing of the failed step is archived"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
