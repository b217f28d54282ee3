#![allow(clippy::unwrap_used, clippy::expect_used)]
//! No secret at rest in the clear through the proxy: a client whose tool
//! outputs hold an AWS key, a GitHub token, an RSA private key and a
//! secret only the user's pattern knows talks to one proxy instance, then
//! to another on the same store (a restart, or a move within a fleet).
//! Every byte of the SQLite files (and every column of every table) and
//! every text column of every Postgres table is scanned for each secret
//! after the compactions archived them and the history segments and state
//! were written: none is found with the default (redacted) store, nor with
//! a verbatim store under a key. The second instance resumes the session
//! from the redacted record: no divergence, still managed, compactions
//! numbered on, and the managed history it sends holds the mask where a
//! secret was.

mod common;
use context_engine_testkit::postgres as pg;
use context_engine_testkit::secrets;
use context_engine_testkit::sqlite_scan;

use std::sync::Arc;

use context_engine::message::{Message, Role};
use context_engine::redact::{Egress, Redactor};
use context_engine::store::{AtRest, Seal, SessionStore};
use context_engine::tokens::TokenCounter;
use context_engine_postgres::{PgOptions, PgStore};
use context_engine_sqlite::SqliteStore;

use common::{
    Reply, Script, completion, compressor_context, counter, metric, options, start_proxy,
    start_upstream,
};

const SID: &str = "-:leaky";

fn egress() -> Egress {
    let redactor = Redactor::builder()
        .pattern(secrets::USER_PATTERN)
        .build()
        .unwrap();
    Egress::new(Some(Arc::new(redactor)))
}

/// The tool outputs that hold the secrets (turn numbers).
const PLANTED: [usize; 4] = [1, 4, 8, 13];

/// A coding session whose planted tool outputs hold every secret.
fn recording() -> Vec<Message> {
    let mut m = common::long_history(30);
    for turn in PLANTED {
        let i = 3 + 2 * turn;
        assert_eq!(m[i]["role"], "tool");
        let text = secrets::planted(m[i]["content"].as_str().unwrap());
        m[i]["content"] = text.into();
    }
    m.into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

/// What the two instances did.
struct Outcome {
    /// Each upstream request of the second instance.
    second: Vec<String>,
    /// The second instance's metrics text.
    metrics: String,
    /// Compactions per instance.
    compactions: (u64, u64),
}

/// Replays `recording` through one proxy on `store` up to call `switch`,
/// then through a fresh one on the same store.
async fn two_instances(store: Arc<dyn SessionStore>, switch: usize) -> Outcome {
    instances(store, switch, false).await
}

/// [`two_instances`], or (`alternate`) the two taking turns from call
/// `switch` on: each reads what the other appended to the record.
async fn instances(store: Arc<dyn SessionStore>, switch: usize, alternate: bool) -> Outcome {
    let recording = recording();
    let counter = counter();
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let window = 2_500;
    let first = start_proxy(
        options(&url).with_store(Some(Arc::clone(&store))),
        compressor_context(Arc::clone(&counter), window),
    )
    .await;
    let second = start_proxy(
        options(&url).with_store(Some(Arc::clone(&store))),
        compressor_context(Arc::clone(&counter), window),
    )
    .await;
    let client = reqwest::Client::new();
    let calls: Vec<usize> = recording
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Assistant)
        .map(|(i, _)| i)
        .collect();
    let mut seen = 0;
    for (k, &index) in calls.iter().enumerate() {
        let c = Arc::clone(&counter);
        let answer = serde_json::to_value(&recording[index]).unwrap();
        script.push(Reply::With(Arc::new(move |req: &serde_json::Value| {
            let msgs: Vec<Message> = serde_json::from_value(req["messages"].clone()).unwrap();
            completion(answer.clone(), c.count_messages(&msgs) as u64, 50)
        })));
        let body = serde_json::json!({"model": "scripted", "messages": &recording[..index]});
        let on_second = k >= switch && (!alternate || (k - switch).is_multiple_of(2));
        let (addr, _) = if on_second { &second } else { &first };
        let resp = client
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("x-ctx-session", "leaky")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "call {k}");
        resp.bytes().await.unwrap();
        if k + 1 == switch {
            seen = script.received().len();
        }
    }
    let second_requests = script.received()[seen..]
        .iter()
        .map(|r| String::from_utf8(r.body.to_vec()).unwrap())
        .collect();
    let count = |state: &context_engine_serve::AppState| {
        metric(&state.metrics().encode(), "ctx_compactions_total")
    };
    Outcome {
        second: second_requests,
        metrics: second.1.metrics().encode(),
        compactions: (count(&first.1), count(&second.1)),
    }
}

/// The second instance resumed the stored session: no new lineage,
/// nothing unmanaged, compactions on both sides numbered on in the store.
fn resumed(outcome: &Outcome, store: &Arc<dyn SessionStore>) {
    let m = &outcome.metrics;
    assert_eq!(metric(m, "ctx_lineages_total"), 0, "diverged: {m}");
    assert_eq!(metric(m, "ctx_unmanaged_total"), 0, "unmanaged: {m}");
    assert_eq!(metric(m, "ctx_fallbacks_total"), 0, "fell back: {m}");
    let (a, b) = outcome.compactions;
    assert!(b > 0, "compactions after the move: {a}, {b}");
    let seqs: Vec<u64> = store
        .compactions(SID)
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(seqs, (1..=a + b).collect::<Vec<_>>(), "numbered on");
}

/// The secrets found in the stored texts of a Postgres test database.
fn scan_postgres(db: &pg::TestDb) -> Vec<String> {
    let mut out = Vec::new();
    for (column, text) in db.all_text() {
        for s in secrets::found(text.as_bytes()) {
            out.push(format!("{column}: {s}"));
        }
    }
    out
}

fn sqlite(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ctx-serve-at-rest-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir.join("store.db")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_sqlite_store_keeps_no_secret_and_a_restart_resumes() {
    let path = sqlite("default");
    let raw: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&path).unwrap());
    let store = AtRest::redacted(egress()).wrap(raw);
    let outcome = two_instances(Arc::clone(&store), 16).await;
    assert!(outcome.compactions.0 > 0, "compactions before the move");
    resumed(&outcome, &store);
    // The first request after the move carries the managed history as
    // stored: the mask where the last planted output's secrets were.
    let first = &outcome.second[0];
    assert!(first.contains("[REDACTED PRIVATE KEY]"), "{first}");
    assert!(secrets::found(first.as_bytes()).is_empty(), "{first}");
    // The state and history are in the store, the archive too.
    let record = store.load_versioned(SID).unwrap().expect("record");
    assert!(!record.history.is_empty());
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());
    drop(store);
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Two instances taking turns on a redacted store: each applies what the
/// other appended (or reads the record whole when the masks make it differ
/// from its own copy), and the session stays one managed lineage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_taking_turns_on_a_redacted_store_act_as_one_lineage() {
    let path = sqlite("turns");
    let raw: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&path).unwrap());
    let store = AtRest::redacted(egress()).wrap(raw);
    let outcome = instances(Arc::clone(&store), 2, true).await;
    resumed(&outcome, &store);
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verbatim_sqlite_store_under_a_key_keeps_ciphertext_and_resumes() {
    let path = sqlite("sealed");
    let raw: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&path).unwrap());
    let seal = Seal::from_text("CTX_TEST_STORE_KEY", &"ab".repeat(32)).unwrap();
    let store = AtRest::verbatim(egress(), Some(seal)).wrap(raw);
    let outcome = two_instances(Arc::clone(&store), 16).await;
    assert!(outcome.compactions.0 > 0, "compactions before the move");
    resumed(&outcome, &store);
    // Verbatim: the moved session goes on with the texts as written.
    assert!(!secrets::found(outcome.second[0].as_bytes()).is_empty());
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_postgres_store_keeps_no_secret_in_any_column_and_resumes() {
    let Some(db) = tokio::task::spawn_blocking(pg::TestDb::create)
        .await
        .unwrap()
    else {
        return;
    };
    let url = db.url.clone();
    let raw = tokio::task::spawn_blocking(move || PgStore::connect(&PgOptions::new(url)))
        .await
        .unwrap()
        .unwrap();
    let store = AtRest::redacted(egress()).wrap(Arc::new(raw));
    let outcome = two_instances(Arc::clone(&store), 16).await;
    assert!(outcome.compactions.0 > 0, "compactions before the move");
    resumed(&outcome, &store);
    let db = tokio::task::spawn_blocking(move || {
        assert_eq!(scan_postgres(&db), Vec::<String>::new());
        db
    })
    .await
    .unwrap();
    drop(store);
    tokio::task::spawn_blocking(move || drop(db)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verbatim_postgres_store_under_a_key_keeps_ciphertext() {
    let Some(db) = tokio::task::spawn_blocking(pg::TestDb::create)
        .await
        .unwrap()
    else {
        return;
    };
    let url = db.url.clone();
    let raw = tokio::task::spawn_blocking(move || PgStore::connect(&PgOptions::new(url)))
        .await
        .unwrap()
        .unwrap();
    let seal = Seal::from_text("CTX_TEST_STORE_KEY", &"cd".repeat(32)).unwrap();
    let store = AtRest::verbatim(egress(), Some(seal)).wrap(Arc::new(raw));
    let outcome = two_instances(Arc::clone(&store), 16).await;
    assert!(outcome.compactions.0 > 0, "compactions before the move");
    resumed(&outcome, &store);
    // Recall with the key gives the verbatim output back.
    let recording = recording();
    let handle = recording[3 + 2 * PLANTED[0]].tool_call_id.clone().unwrap();
    let s = Arc::clone(&store);
    let entry = tokio::task::spawn_blocking(move || s.resolve(Some(SID), &handle))
        .await
        .unwrap()
        .unwrap()
        .expect("the first planted output is archived");
    assert_eq!(entry.messages[0], recording[3 + 2 * PLANTED[0]]);
    let db = tokio::task::spawn_blocking(move || {
        assert_eq!(scan_postgres(&db), Vec::<String>::new());
        db
    })
    .await
    .unwrap();
    drop(store);
    tokio::task::spawn_blocking(move || drop(db)).await.unwrap();
}
