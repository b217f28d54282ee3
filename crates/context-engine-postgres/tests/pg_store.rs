#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Postgres store on a real server: the same contract as the embedded
//! stores, concurrent compare-and-swap from many threads, claims across
//! instances, schema versioning, and an unreachable database.

use std::sync::Arc;
use std::time::Duration;

use context_engine::store::{HistoryWrite, SessionStore, Since, StoreError};
use context_engine_postgres::{PgOptions, PgStore, SCHEMA_VERSION};
use context_engine_testkit::eventually_blocking;
use context_engine_testkit::postgres::TestDb;
use context_engine_testkit::store_contract;
use serde_json::json;

fn store(db: &TestDb) -> PgStore {
    PgStore::connect(&PgOptions::new(&db.url)).expect("connect")
}

#[test]
fn keeps_the_store_contract() {
    let Some(db) = TestDb::create() else { return };
    let store = store(&db);
    store_contract::archive(&store);
    store_contract::versioned(&store);
    store_contract::records_of_two_conversations(&store);
    store_contract::claims(&store);
    // A second instance sees everything the first wrote.
    let other = self::store(&db);
    assert_eq!(other.compactions("s1").expect("records").len(), 1);
    assert_eq!(other.search(None, "KeyError", 5).expect("search").len(), 1);
}

/// Postgres answers a search with the hits and matched lines the embedded
/// stores give for the same archive, byte for byte.
#[test]
fn search_answers_match_the_embedded_stores() {
    let Some(db) = TestDb::create() else { return };
    let store = store(&db);
    store_contract::search_shows_the_matching_line(&store);
    let memory = context_engine::store::MemoryStore::new();
    store_contract::search_archive(&memory);
    assert_eq!(
        store_contract::search_answers(&store),
        store_contract::search_answers(&memory)
    );
}

/// The at-rest policies keep the contract around Postgres: the default
/// (redacted) and a verbatim store under a key (ciphertext segments read
/// by what follows, as Postgres answers).
#[test]
fn keeps_the_store_contract_under_the_at_rest_policies() {
    use context_engine::redact::Egress;
    use context_engine::store::{AtRest, Seal};
    let seal = Seal::from_text("CTX_TEST_STORE_KEY", &"3c".repeat(32)).expect("key");
    for policy in [
        AtRest::default(),
        AtRest::verbatim(Egress::builtin(), Some(seal)),
    ] {
        let Some(db) = TestDb::create() else { return };
        let wrapped = policy.wrap(Arc::new(store(&db)));
        store_contract::archive(wrapped.as_ref());
        store_contract::versioned(wrapped.as_ref());
        store_contract::claims(wrapped.as_ref());
    }
}

/// A server that holds a session's history reads only the segments
/// written after the ones it holds (the contract allows a whole read;
/// Postgres answers by what follows).
#[test]
fn a_reader_holding_the_history_reads_what_follows_it() {
    let Some(db) = TestDb::create() else { return };
    let store = store(&db);
    let first = vec!["h1".to_owned(), "h2".to_owned()];
    store
        .commit_versioned(
            "s",
            0,
            &[],
            &json!({"n": 1}),
            Some(HistoryWrite::replace(&first)),
        )
        .expect("first");
    let more = vec!["h3".to_owned()];
    let write = HistoryWrite {
        keep: 2,
        append: &more,
    };
    store
        .commit_versioned("s", 1, &[], &json!({"n": 2}), Some(write))
        .expect("append");
    store
        .commit_versioned("s", 2, &[], &json!({"n": 3}), None)
        .expect("state only");
    // Holding version 1's two segments: the third comes back; holding
    // version 2's three: only the state changed since, no segment.
    for (known, held, segments) in [(1, 2, more.clone()), (2, 3, Vec::new())] {
        assert_eq!(
            store.load_versioned_after("s", known, held).expect("after"),
            Since::Appended {
                version: 3,
                state: json!({"n": 3}),
                from: held,
                segments,
            }
        );
    }
}

/// Warming opens every connection of the pool (what `ctx serve` does at
/// start), and the store works as before.
#[test]
fn warming_opens_the_pool() {
    let Some(db) = TestDb::create() else { return };
    let store = PgStore::connect(&PgOptions::new(&db.url).with_pool_size(4)).expect("connect");
    assert_eq!(store.warm().expect("warm"), 4);
    assert_eq!(store.pool_status(), (4, 4), "four open, all idle");
    store
        .commit_versioned("w", 0, &[], &json!({"n": 1}), None)
        .expect("write");
    assert_eq!(store.version("w").expect("version"), Some(1));
}

#[test]
fn compare_and_swap_serializes_writers_of_one_session() {
    let Some(db) = TestDb::create() else { return };
    let a: Arc<dyn SessionStore> = Arc::new(store(&db));
    let b: Arc<dyn SessionStore> = Arc::new(store(&db));
    // 8 threads over two instances each add 25 increments with
    // read-modify-write and retry on conflict: no increment is lost.
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let s = if t % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            std::thread::spawn(move || {
                let mut conflicts = 0;
                for _ in 0..25 {
                    loop {
                        let cur = s.load_versioned("counter").expect("load");
                        let (v, n) =
                            cur.map_or((0, 0), |r| (r.version, r.state["n"].as_u64().expect("n")));
                        match s.commit_versioned("counter", v, &[], &json!({"n": n + 1}), None) {
                            Ok(_) => break,
                            Err(StoreError::Conflict { .. }) => conflicts += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    let conflicts: u32 = threads.into_iter().map(|t| t.join().expect("join")).sum();
    let rec = a.load_versioned("counter").expect("load").expect("record");
    assert_eq!(rec.state["n"], json!(200));
    assert_eq!(rec.version, 200);
    eprintln!("{conflicts} conflicts retried");
}

#[test]
fn a_claim_is_held_by_one_instance_and_expires() {
    let Some(db) = TestDb::create() else { return };
    let (a, b) = (store(&db), store(&db));
    let ttl = Duration::from_millis(300);
    assert!(a.try_claim("s", "summary", "instance-a", ttl).expect("a"));
    assert!(
        !b.try_claim("s", "summary", "instance-b", ttl)
            .expect("b waits")
    );
    // Instance a dies without releasing: the claim expires (polled: a
    // failed claim changes nothing).
    drop(a);
    let taken = eventually_blocking(Duration::from_secs(10), || {
        b.try_claim("s", "summary", "instance-b", ttl)
            .expect("b takes over")
            .then_some(())
    });
    assert!(taken.is_some(), "b takes over once the claim expired");
}

#[test]
fn schema_is_versioned_and_a_newer_one_refused() {
    let Some(db) = TestDb::create() else { return };
    drop(store(&db));
    // Two instances starting together migrate once.
    let again = store(&db);
    drop(again);
    db.execute(&format!(
        "UPDATE ctx_schema SET version = {}",
        SCHEMA_VERSION + 1
    ));
    let err = PgStore::connect(&PgOptions::new(&db.url)).expect_err("newer");
    assert!(matches!(err, StoreError::NewerSchema { .. }), "{err}");
    assert!(err.to_string().contains("newer version"), "{err}");
}

#[test]
fn an_unreachable_database_is_a_clear_error_without_the_password() {
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let options = PgOptions::new(format!("postgres://postgres@127.0.0.1:{port}/test"))
        .with_password(Some("hunter2-secret".into()))
        .with_timeout(Duration::from_secs(2));
    let store = PgStore::new(&options).expect("no connection needed yet");
    let err = store.version("s").expect_err("unreachable");
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(!format!("{err:?}").contains("hunter2"));
    assert!(!store.location().contains("hunter2"));
}

#[test]
fn a_schema_1_database_opens_migrated_with_its_history_as_one_segment() {
    let Some(db) = TestDb::create() else { return };
    // What schema 1 wrote: the history as one text in the record's row.
    db.execute(include_str!("../src/migrations/0001_init.sql"));
    db.execute(
        "CREATE TABLE ctx_schema (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL, \
           application TEXT NOT NULL DEFAULT 'context-engine'); \
         INSERT INTO ctx_schema (id, version) VALUES (1, 1); \
         INSERT INTO ctx_state (session, version, state, history, updated_ms) \
           VALUES ('s', 5, '{\"n\": 1}', '{\"chain\":[],\"messages\":[],\"sent\":[]}', 1)",
    );
    let store = store(&db);
    let rec = store.load_versioned("s").expect("load").expect("record");
    assert_eq!((rec.version, rec.state.clone()), (5, json!({"n": 1})));
    assert_eq!(rec.history, ["{\"chain\":[],\"messages\":[],\"sent\":[]}"]);
    let next = vec!["next".to_owned()];
    store
        .commit_versioned(
            "s",
            5,
            &[],
            &json!({"n": 2}),
            Some(HistoryWrite {
                keep: 1,
                append: &next,
            }),
        )
        .expect("append");
    let rec = store.load_versioned("s").expect("load").expect("record");
    assert_eq!(rec.version, 6);
    assert_eq!(rec.history.len(), 2);
    assert_eq!(rec.history[1], "next");
}

/// A compaction of `span` into one summary, numbered `seq`.
fn compaction(span: &[context_engine::Message], seq: u64) -> context_engine::store::Batch {
    let mut batch = context_engine::store::Batch::new();
    let summary = [context_engine::Message::user(format!("summary {seq}"))];
    batch.compaction(
        span,
        &summary,
        &context_engine::store::CompactionInfo::new(seq, "preflight", "test"),
    );
    batch
}

#[test]
fn an_archive_is_written_with_its_record_or_not_at_all() {
    let Some(db) = TestDb::create() else { return };
    let store = store(&db);
    let shared = context_engine::Message::user("the parser fails on tests/test_io.py");
    let span = |tag: &str| -> Vec<context_engine::Message> {
        vec![
            shared.clone(),
            context_engine::Message::assistant(format!("{tag}word: looking at src/parse.rs")),
            context_engine::Message::user(format!("{tag}word: KeyError in parse_header")),
        ]
    };
    // Two batches in one write: the message they share is archived once,
    // each span resolves whole, the records are both there.
    let (a, b) = (compaction(&span("a"), 1), compaction(&span("b"), 2));
    let v = store
        .commit_versioned("s", 0, &[a.clone(), b.clone()], &json!({"n": 1}), None)
        .expect("write");
    assert_eq!(v, 1);
    let records = store.compactions("s").expect("records");
    assert_eq!(records.len(), 2);
    for r in &records {
        let entry = store
            .resolve(Some("s"), &r.handle)
            .expect("resolve")
            .expect("span");
        assert_eq!(entry.messages.len(), 3, "{}", r.handle);
        assert_eq!(entry.messages[0].text(), shared.text());
    }
    assert_eq!(
        store
            .search(Some("s"), "parse_header", 5)
            .expect("search")
            .len(),
        2
    );
    // A write from a stale version conflicts and leaves nothing behind: no
    // record, no archived message, no handle.
    let c = compaction(&span("c"), 3);
    let stale = store.commit_versioned("s", 0, &[c], &json!({"n": 2}), None);
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    assert_eq!(store.compactions("s").expect("records").len(), 2);
    assert!(store.search(None, "cword", 5).expect("search").is_empty());
    assert_eq!(store.version("s").expect("version"), Some(1));
    // A compaction recorded twice is a clash of records (not a lost
    // race), and the record stays.
    let again =
        store.commit_versioned("s", 1, &[compaction(&span("d"), 2)], &json!({"n": 3}), None);
    assert!(
        matches!(again, Err(StoreError::Duplicate { .. })),
        "{again:?}"
    );
    assert_eq!(store.version("s").expect("version"), Some(1));
    assert!(store.search(None, "dword", 5).expect("search").is_empty());
}

#[test]
fn sessions_archiving_the_same_messages_at_once_each_keep_them() {
    let Some(db) = TestDb::create() else { return };
    let stores: Vec<Arc<PgStore>> = (0..2).map(|_| Arc::new(store(&db))).collect();
    // Eight sessions over two instances archive spans that share most of
    // their messages, at the same time: every span resolves whole.
    let common: Vec<context_engine::Message> = (0..20)
        .map(|i| context_engine::Message::user(format!("shared tool output line {i}")))
        .collect();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = Arc::clone(&stores[t % 2]);
            let mut span = common.clone();
            span.push(context_engine::Message::user(format!(
                "own message of session {t}"
            )));
            std::thread::spawn(move || {
                let sid = format!("s{t}");
                store
                    .commit_versioned(&sid, 0, &[compaction(&span, 1)], &json!({}), None)
                    .expect("write");
                sid
            })
        })
        .collect();
    for t in threads {
        let sid = t.join().expect("join");
        let records = stores[0].compactions(&sid).expect("records");
        assert_eq!(records.len(), 1);
        let entry = stores[0]
            .resolve(Some(&sid), &records[0].handle)
            .expect("resolve")
            .expect("span");
        assert_eq!(entry.messages.len(), 21, "{sid}");
    }
}

/// A database dropped and created again while a store uses it (its
/// connections ended) is migrated again: the next write and read succeed
/// instead of every call failing on missing tables. So is a schema dropped
/// under live connections (the call that finds it gone migrates and runs
/// once more).
#[test]
fn a_recreated_database_is_migrated_again() {
    let Some(db) = TestDb::create() else { return };
    let store = store(&db);
    assert_eq!(
        store
            .commit_versioned("s", 0, &[], &json!({"n": 1}), None)
            .expect("first"),
        1
    );
    db.recreate();
    // Nothing survived: the new database's first record is version 1.
    assert_eq!(store.version("s").expect("version after recreate"), None);
    assert_eq!(
        store
            .commit_versioned("s", 0, &[], &json!({"n": 2}), None)
            .expect("a write after the recreate"),
        1
    );
    let rec = store.load_versioned("s").expect("load").expect("record");
    assert_eq!(rec.state, json!({"n": 2}));

    // The tables dropped while the store's connections stay open.
    db.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;");
    let v = store
        .commit_versioned("s", 0, &[], &json!({"n": 3}), None)
        .expect("a write after the schema was dropped");
    assert_eq!(v, 1);
    assert_eq!(
        store
            .load_versioned("s")
            .expect("load")
            .expect("record")
            .state,
        json!({"n": 3})
    );
    assert_eq!(store.version("t").expect("version"), None);
}
