#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The shared store contract (`store_contract`) on the embedded backends.

use context_engine_testkit::store_contract;

use context_engine::store::MemoryStore;
use context_engine_sqlite::SqliteStore;

#[test]
fn memory_store_keeps_the_contract() {
    let store = MemoryStore::new();
    store_contract::archive(&store);
    store_contract::versioned(&store);
    store_contract::records_of_two_conversations(&store);
    store_contract::claims(&store);
}

#[test]
fn sqlite_store_keeps_the_contract() {
    let dir = std::env::temp_dir().join(format!("ctx-contract-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let store = SqliteStore::open(&dir.join("store.db")).expect("open");
    store_contract::archive(&store);
    store_contract::versioned(&store);
    store_contract::records_of_two_conversations(&store);
    store_contract::claims(&store);
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

/// The at-rest policies keep the contract around either backend: the
/// default (redacted) and a verbatim store under a key, whose record
/// segments and state are ciphertext.
#[test]
fn at_rest_stores_keep_the_contract() {
    use std::sync::Arc;

    use context_engine::redact::Egress;
    use context_engine::store::{AtRest, Seal, SessionStore};

    let dir = std::env::temp_dir().join(format!("ctx-contract-at-rest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let seal = || Seal::from_text("CTX_TEST_STORE_KEY", &"5e".repeat(32)).expect("key");
    let policies = [
        ("redacted", AtRest::default()),
        (
            "encrypted",
            AtRest::verbatim(Egress::builtin(), Some(seal())),
        ),
    ];
    for (name, policy) in policies {
        let memory = policy.wrap(Arc::new(MemoryStore::new()));
        let file: Arc<dyn SessionStore> =
            Arc::new(SqliteStore::open(&dir.join(format!("{name}.db"))).expect("open"));
        let sqlite = policy.wrap(file);
        for store in [memory, sqlite] {
            store_contract::archive(store.as_ref());
            store_contract::versioned(store.as_ref());
            store_contract::claims(store.as_ref());
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Every embedded backend answers a search with the same hits and the same
/// matched lines (the failing line of a long pytest output, not its
/// `PASSED` lines), byte for byte (Postgres: `pg_store.rs`).
#[test]
fn search_answers_are_the_same_on_every_embedded_backend() {
    use context_engine::store::AtRest;
    use std::sync::Arc;

    let dir = std::env::temp_dir().join(format!("ctx-search-same-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let memory = MemoryStore::new();
    store_contract::search_shows_the_matching_line(&memory);
    let expected = store_contract::search_answers(&memory);
    assert!(expected.contains("expected 38 got 136 in test_11_6"));
    let sqlite = SqliteStore::open(&dir.join("plain.db")).expect("open");
    store_contract::search_shows_the_matching_line(&sqlite);
    assert_eq!(store_contract::search_answers(&sqlite), expected, "sqlite");
    let wrapped = AtRest::default().wrap(Arc::new(
        SqliteStore::open(&dir.join("at-rest.db")).expect("open"),
    ));
    store_contract::search_shows_the_matching_line(wrapped.as_ref());
    assert_eq!(
        store_contract::search_answers(wrapped.as_ref()),
        expected,
        "redacted at rest"
    );
    drop((sqlite, wrapped));
    let _ = std::fs::remove_dir_all(dir);
}
