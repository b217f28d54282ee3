#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The shared store contract (`store_contract`) on the embedded backends.

mod store_contract;

use context_engine::store::{MemoryStore, SqliteStore};

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
