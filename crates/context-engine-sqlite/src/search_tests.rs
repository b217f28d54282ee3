//! The SQLite store's search: scoped to the session inside the index, off
//! the writer's lock, and the schema 4 index upgraded.

use std::path::PathBuf;
use std::time::Duration;

use rusqlite::Connection;

use super::*;
use crate::{INDEX_ROWS, MIGRATIONS_FOR_TEST, migrate_for_test};
use context_engine::Message;
use context_engine::store::*;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ctx-search-{name}-{}-{}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Archives `n` messages `text {i}` into `session`, a batch of 50 per
/// commit (so most are indexed).
fn fill(store: &SqliteStore, session: &str, text: &str, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let mut batch = Batch::new();
        for i in chunk {
            batch.archive(&Message::user(format!("{text} {session} {i}")));
        }
        store.commit(session, &batch).expect("commit");
    }
}

fn rows_read(search: impl FnOnce()) -> usize {
    INDEX_ROWS.with(|n| n.set(0));
    search();
    INDEX_ROWS.with(|n| n.get())
}

/// Other sessions full of a word: a search of one's own session reads
/// none of their documents, whether it finds the word or not, and what
/// it finds is its own.
#[test]
fn a_search_reads_only_its_own_sessions_documents() {
    let dir = temp_dir("scoped");
    let store = SqliteStore::open(&dir.join("s.db")).expect("open");
    fill(&store, "alice", "zebracodename deploy notes", 400);
    fill(&store, "bob", "zebracodename host list", 400);
    fill(&store, "carol", "ordinary words", 200);
    fill(&store, "carol", "giraffe sighting", 3);
    let mut hits = Vec::new();
    let read = rows_read(|| {
        hits = store
            .search(Some("carol"), "zebracodename", 10)
            .expect("search");
    });
    assert!(hits.is_empty(), "{hits:?}");
    assert_eq!(read, 0, "the index yielded other sessions' documents");
    let read = rows_read(|| {
        hits = store.search(Some("carol"), "giraffe", 10).expect("search");
    });
    assert_eq!(hits.len(), 3);
    assert!(read <= 3, "read {read} documents for 3 hits");
    // Any word of two: still only carol's.
    let read = rows_read(|| {
        hits = store
            .search(Some("carol"), "giraffe zebracodename", 10)
            .expect("search");
    });
    assert_eq!(hits.len(), 3);
    assert!(read <= 3, "read {read} documents for 3 hits");
    assert!(hits.iter().all(|h| h.lines[0].text.contains("carol")));
    // The owners find theirs, newest first; the store-wide search finds
    // both.
    let own = store
        .search(Some("bob"), "zebracodename", 5)
        .expect("search");
    assert_eq!(own.len(), 5);
    assert!(
        own[0].lines[0].text.contains("bob 399"),
        "{:?}",
        own[0].lines
    );
    let all = store.search(None, "zebracodename", 1000).expect("search");
    assert_eq!(all.len(), 800);
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

/// Every term of the index is one session's: the same word in two
/// sessions is two terms, so a query of one never reads the other's.
#[test]
fn every_index_term_belongs_to_one_session() {
    let dir = temp_dir("terms");
    let path = dir.join("s.db");
    let store = SqliteStore::open(&path).expect("open");
    fill(&store, "alice", "zebracodename shared words", 40);
    fill(&store, "bob", "zebracodename shared words", 40);
    drop(store);
    let conn = Connection::open(&path).expect("open");
    conn.execute_batch("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, archive_fts, 'row')")
        .expect("vocabulary");
    let terms: Vec<String> = conn
        .prepare("SELECT term FROM temp.vocab")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("terms")
        .collect::<Result<_, _>>()
        .expect("terms");
    let numbers: Vec<i64> = conn
        .prepare("SELECT no FROM search_sessions ORDER BY no")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("numbers")
        .collect::<Result<_, _>>()
        .expect("numbers");
    assert_eq!(numbers.len(), 2);
    for word in ["zebracodename", "shared", "alice"] {
        assert!(
            !terms.iter().any(|t| t == word),
            "{word} is a store-wide term"
        );
    }
    for t in &terms {
        let owner = numbers
            .iter()
            .filter(|n| t.starts_with(&format!("s{n}x")))
            .count();
        assert_eq!(owner, 1, "{t} belongs to {owner} sessions");
    }
    assert!(
        terms
            .iter()
            .filter(|t| t.ends_with("xzebracodename"))
            .count()
            == 2
    );
    drop(conn);
    let _ = std::fs::remove_dir_all(dir);
}

/// A search runs on a read connection of its own: it answers while the
/// writer's connection is held (by a commit, another request).
#[test]
fn a_search_does_not_wait_for_the_writers_lock() {
    let dir = temp_dir("lock");
    let store = SqliteStore::open(&dir.join("s.db")).expect("open");
    fill(&store, "s", "needle in the archive", 120);
    let held = store.hold_for_test();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let _ = tx.send(store.search(Some("s"), "needle", 5).map(|h| h.len()));
        });
        let answered = rx.recv_timeout(Duration::from_secs(30));
        drop(held);
        assert!(
            matches!(answered, Ok(Ok(5))),
            "the search waited for the writer's lock: {answered:?}"
        );
    });
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

/// A schema 4 file (one index over every session's messages) opens
/// migrated: its archive searchable by session, the old index gone.
#[test]
fn a_schema_4_store_opens_with_its_archive_indexed_by_session() {
    let dir = temp_dir("v4");
    let path = dir.join("s.db");
    {
        let conn = Connection::open(&path).expect("open");
        migrate_for_test(&conn, &MIGRATIONS_FOR_TEST[..4]).expect("v4");
        conn.execute_batch(
            "INSERT INTO messages (id, hash, role, json) VALUES \
               (1, 'h1', 'user', '{\"role\":\"user\",\"content\":\"an old needle of a\"}'), \
               (2, 'h2', 'user', '{\"role\":\"user\",\"content\":\"a shared needle\"}'); \
             INSERT INTO archive (session, message, seq) VALUES ('a', 1, 1), ('a', 2, 2), ('b', 2, 1); \
             INSERT INTO message_fts (rowid, text) VALUES (1, 'an old needle of a'), (2, 'a shared needle');",
        )
        .expect("v4 rows");
    }
    let store = SqliteStore::open(&path).expect("open migrated");
    assert_eq!(store.search(Some("a"), "needle", 5).expect("a").len(), 2);
    let b = store.search(Some("b"), "needle", 5).expect("b");
    assert_eq!(b.len(), 1);
    assert!(b[0].lines[0].text.contains("shared"));
    assert_eq!(store.search(None, "needle", 5).expect("all").len(), 2);
    drop(store);
    let conn = Connection::open(&path).expect("open");
    let (version, old, docs): (i64, i64, i64) = conn
        .query_row(
            "SELECT (SELECT user_version FROM pragma_user_version), \
               (SELECT COUNT(*) FROM sqlite_master WHERE name = 'message_fts'), \
               (SELECT COUNT(*) FROM archive_fts_docsize)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("schema");
    assert_eq!((version, old, docs), (SCHEMA_VERSION, 0, 3));
    drop(conn);
    let _ = std::fs::remove_dir_all(dir);
}
