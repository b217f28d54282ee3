#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A session id is a name, not a lock: two different conversations sent
//! under one `x-ctx-session` id, one after the other and interleaved
//! request by request, are both managed (no request falls back to the
//! client's history) and both stay within the window, on every session
//! store (memory, a SQLite file and, when a server answers, Postgres).
//!
//! A new conversation under an id that already compacted used to restart
//! the compaction numbering at 1: its first compaction clashed with the
//! stored record 1, the clash was retried as if another instance had
//! written, and every later request of the id went out unmanaged, past
//! the window.

mod common;
use context_engine_testkit::postgres as pg;

use std::sync::Arc;

use context_engine::message::Message;
use context_engine::store::{MemoryStore, SessionStore};
use context_engine::tokens::TokenCounter;
use context_engine_postgres::{PgOptions, PgStore};
use context_engine_sqlite::SqliteStore;
use serde_json::{Value, json};

use common::{
    Reply, Script, completion, compressor_context, counter, metric, options, settled, start_proxy,
    start_upstream,
};

/// The managed window: the (a conversation of 60 turns is ~9,000
/// tokens, so each compacts).
const WINDOW: u64 = 4_000;
/// Tool calls per conversation.
const TURNS: usize = 60;

/// A coding conversation about `topic`: its own system prompt and task,
/// then tool calls and their results (~150 tokens a turn).
fn conversation(topic: &str) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": format!("You are a coding agent working on {topic}.")}),
        json!({"role": "user", "content": format!("Fix the {topic} bug in src/{topic}.rs")}),
    ];
    for i in 0..TURNS {
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{topic}_{i}"), "type": "function",
            "function": {"name": "bash", "arguments": format!("{{\"cmd\":\"cat src/{topic}/file{i}.rs\"}}")}}]}));
        let body: String = (0..8)
            .map(|j| format!("line {j} of {topic} file {i}: let {topic}{j} = compute({j});\n"))
            .collect();
        m.push(
            json!({"role": "tool", "tool_call_id": format!("call_{topic}_{i}"), "content": body}),
        );
    }
    m
}

/// The client's history at its call `n` (from 0): the task and the first
/// `n` tool calls with their results.
fn at_call(conversation: &[Value], n: usize) -> &[Value] {
    &conversation[..2 + 2 * n]
}

/// What the upstream received for one call.
struct Sent {
    topic: &'static str,
    tokens: u64,
    text: String,
}

/// Sends the calls `order` names (conversation, call) under one session id
/// through a proxy with `store`; returns what went upstream and the
/// proxy's fallbacks and compactions.
async fn run(
    store: Arc<dyn SessionStore>,
    order: &[(&'static str, usize)],
) -> (Vec<Sent>, u64, u64) {
    let counter = counter();
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (proxy, state) = start_proxy(
        options(&url).with_store(Some(Arc::clone(&store))),
        compressor_context(Arc::clone(&counter), WINDOW),
    )
    .await;
    let client = reqwest::Client::new();
    let alpha = conversation("alpha");
    let beta = conversation("beta");
    let mut sent = Vec::new();
    for (k, &(topic, n)) in order.iter().enumerate() {
        let c = Arc::clone(&counter);
        script.push(Reply::With(Arc::new(move |req: &Value| {
            let msgs: Vec<Message> = serde_json::from_value(req["messages"].clone()).unwrap();
            let answer = json!({"role": "assistant", "content": "ok"});
            completion(answer, c.count_messages(&msgs) as u64, 5)
        })));
        let messages = at_call(if topic == "alpha" { &alpha } else { &beta }, n);
        let body = json!({"model": "scripted", "messages": messages});
        let resp = client
            .post(format!("http://{proxy}/v1/chat/completions"))
            .header("x-ctx-session", "reused")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "call {k}");
        resp.bytes().await.unwrap();
        let upstream: Value =
            serde_json::from_slice(&script.received().last().unwrap().body).unwrap();
        let msgs: Vec<Message> = serde_json::from_value(upstream["messages"].clone()).unwrap();
        sent.push(Sent {
            topic,
            tokens: counter.count_messages(&msgs) as u64,
            text: upstream["messages"].to_string(),
        });
    }
    // The last response's usage is written after the client has it.
    assert!(settled(&state).await, "the last call's usage is written");
    let text = state.metrics().encode();
    (
        sent,
        metric(&text, "ctx_fallbacks_total"),
        metric(&text, "ctx_compactions_total"),
    )
}

/// Both conversations, one after the other and then interleaved call by
/// call, managed and within the window; the store holds every compaction
/// of both, numbered once.
async fn check(store: Arc<dyn SessionStore>) {
    let sequential: Vec<(&'static str, usize)> = (0..=TURNS)
        .map(|n| ("alpha", n))
        .chain((0..=TURNS).map(|n| ("beta", n)))
        .collect();
    let interleaved: Vec<(&'static str, usize)> = (0..=TURNS)
        .flat_map(|n| [("alpha", n), ("beta", n)])
        .collect();
    let mut recorded = 0;
    for (name, order) in [
        ("one after the other", sequential),
        ("interleaved", interleaved),
    ] {
        let t = std::time::Instant::now();
        let (sent, fallbacks, compactions) = run(Arc::clone(&store), &order).await;
        eprintln!(
            "{name}: {} calls in {:.1} s, {compactions} compactions, largest request {} tokens",
            sent.len(),
            t.elapsed().as_secs_f64(),
            sent.iter().map(|s| s.tokens).max().unwrap_or(0)
        );
        assert_eq!(fallbacks, 0, "{name}: every request is managed");
        for (k, s) in sent.iter().enumerate() {
            assert!(
                s.tokens <= WINDOW,
                "{name}: call {k} ({}) sent {} tokens over the {WINDOW}-token window",
                s.topic,
                s.tokens
            );
            let other = if s.topic == "alpha" { "beta" } else { "alpha" };
            assert!(
                !s.text.contains(&format!("src/{other}")),
                "{name}: call {k} ({}) mixes in the other conversation",
                s.topic
            );
        }
        assert!(compactions >= 2, "{name}: both compacted ({compactions})");
        let s = Arc::clone(&store);
        let records = tokio::task::spawn_blocking(move || s.compactions("-:reused"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            records.len() as u64,
            recorded + compactions,
            "{name}: every compaction is recorded"
        );
        let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
        let expected: Vec<u64> = (1..=records.len() as u64).collect();
        assert_eq!(seqs, expected, "{name}: numbered once, in order");
        // Each conversation compacted: this run's records archive spans
        // of both.
        let mut spans = Vec::new();
        for r in &records[recorded as usize..] {
            let (s, handle) = (Arc::clone(&store), r.handle.clone());
            let entry = tokio::task::spawn_blocking(move || s.resolve(Some("-:reused"), &handle))
                .await
                .unwrap()
                .unwrap()
                .expect("a record's span is archived");
            spans.push(serde_json::to_string(&entry.messages).unwrap());
        }
        for topic in ["alpha", "beta"] {
            assert!(
                spans.iter().any(|s| s.contains(&format!("src/{topic}/"))),
                "{name}: {topic} compacted"
            );
        }
        recorded = records.len() as u64;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_conversations_under_one_id_are_managed_on_the_memory_store() {
    check(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_conversations_under_one_id_are_managed_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("ctx-reuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(&dir.join("store.db")).unwrap();
    check(Arc::new(store)).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_conversations_under_one_id_are_managed_on_postgres() {
    let Some(db) = pg::TestDb::create() else {
        return;
    };
    let opts = PgOptions::new(db.url.clone());
    let store = tokio::task::spawn_blocking(move || PgStore::connect(&opts))
        .await
        .unwrap()
        .unwrap();
    check(Arc::new(store)).await;
    drop(db);
}

/// A session whose stored records run ahead of its own count (records
/// another program wrote under its name): its first compaction clashes,
/// and the step runs again once, numbered after the stored records, so
/// the session stays managed instead of clashing on every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_behind_its_stored_records_numbers_after_them() {
    use context_engine::store::{Batch, CompactionInfo};
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    // Records 1 to 3 under the name, with no record of the session.
    for seq in 1..=3u64 {
        let input = vec![
            Message::system("s"),
            Message::user(format!("old task {seq}")),
            Message::assistant(format!("old answer {seq}")),
            Message::user("next"),
        ];
        let output = vec![
            input[0].clone(),
            Message::user("[summary]"),
            input[3].clone(),
        ];
        let mut batch = Batch::new();
        batch.compaction(
            &input,
            &output,
            &CompactionInfo::new(seq, "cli", "compressor"),
        );
        store.commit("-:reused", &batch).unwrap();
    }
    let order: Vec<(&'static str, usize)> = (0..=TURNS).map(|n| ("alpha", n)).collect();
    let (sent, fallbacks, compactions) = run(Arc::clone(&store), &order).await;
    assert_eq!(fallbacks, 0, "every request is managed");
    assert!(compactions >= 1);
    assert!(sent.iter().all(|s| s.tokens <= WINDOW));
    let seqs: Vec<u64> = store
        .compactions("-:reused")
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect();
    let expected: Vec<u64> = (1..=3 + compactions).collect();
    assert_eq!(seqs, expected, "numbered after the stored records");
}
