#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The session store: what it costs per model call, how fast a search is
//! on a 10 MB archive, how big the file is against the text it archives,
//! and a full replay with the SQLite store against the in-memory one.
//!
//! `cargo bench -p context-engine --bench store -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use context_engine::compressor::Compressor;
use context_engine::host::Session;
use context_engine::replay::{ReplayOptions, replay};
use context_engine::store::{Batch, MemoryStore, SessionStore, span_handle};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::{Message, ToolCall};
use context_engine_sqlite::SqliteStore;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::json;

fn example() -> Vec<Message> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/coding-session.json");
    Transcript::load(&path).unwrap().messages
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ctx-bench-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

/// A state snapshot the size the host writes (engine state and counters).
fn state(n: u64) -> serde_json::Value {
    json!({
        "engine": "compressor",
        "engine_state": {"state": {"last_prompt_tokens": {"known": 12000 + n}, "last_completion_tokens": 50,
            "last_total_tokens": 12050, "threshold_tokens": 96000, "context_length": 128000,
            "compression_count": 2, "threshold_percent": 0.75, "protect_first_n": 3, "protect_last_n": 6,
            "emit_automatic_compaction_status": true, "model_thresholds": {}, "config_threshold_percent": 0.75},
            "compressor": {"cooldown_left_ms": null, "transient_failures": 0, "fallback_streak": 0,
            "ineffective_streak": 0, "last_savings_percent": 70.0, "awaiting_effect": null, "seen_real_usage": true}},
        "host": {"awaiting_usage": false, "last_usage": null, "calls_this_turn": 3, "recorded": 2}
    })
}

fn bench_per_call(c: &mut Criterion) {
    let store = SqliteStore::open(&temp("per-call.db")).unwrap();
    let n = AtomicU64::new(0);
    let mut group = c.benchmark_group("store_per_call");
    // What every model call writes: the state after the response.
    group.bench_function("save_state_sqlite", |b| {
        b.iter(|| {
            let mut batch = Batch::new();
            batch.set_state(state(n.fetch_add(1, Ordering::Relaxed)));
            store.commit("s", black_box(&batch)).unwrap();
        })
    });
    // A model call's messages archived (a call and its 2 KB result) with
    // the state: the most a call writes outside a compaction.
    group.bench_function("archive_call_sqlite", |b| {
        b.iter(|| {
            let batch = call_batch(n.fetch_add(1, Ordering::Relaxed));
            store.commit("s", black_box(&batch)).unwrap();
        })
    });
    group.finish();
    // Criterion reports the mean of batches of calls, which the rare
    // slow one (a checkpoint's fsync, an index batch) moves; the goal is
    // on the median call: time single calls.
    let mut times: Vec<Duration> = (0..2_000)
        .map(|_| {
            let batch = call_batch(n.fetch_add(1, Ordering::Relaxed));
            let start = Instant::now();
            store.commit("single", &batch).unwrap();
            start.elapsed()
        })
        .collect();
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    eprintln!(
        "archive_call_sqlite, 2000 single calls: median {:?}, p90 {:?}, p99 {:?}, max {:?}, mean {:?}",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
        mean
    );
}

/// A model call's messages (a call and its 2 KB result) and the state.
fn call_batch(i: u64) -> Batch {
    let call = Message::assistant_tool_calls(
        "",
        vec![ToolCall::function(
            format!("c{i}"),
            "bash",
            format!(r#"{{"command": "pytest -q tests/test_{i}.py"}}"#),
        )],
    );
    let result = Message::tool_result(
        format!("c{i}"),
        format!(
            "FAILED tests/test_{i}.py::test_x - KeyError\n{}",
            "line of output\n".repeat(130)
        ),
    );
    let mut batch = Batch::new();
    batch.archive(&call);
    batch.archive(&result);
    batch.set_state(state(i));
    batch
}

fn bench_search(c: &mut Criterion) {
    // ~10 MB of archived text: the example session's messages, each copy
    // made distinct (content addressing would store one copy otherwise).
    let base = example();
    let path = temp("search.db");
    let store = SqliteStore::open(&path).unwrap();
    let mut text_bytes = 0usize;
    let mut json_bytes = 0usize;
    let mut copy = 0;
    while text_bytes < 10_000_000 {
        let span: Vec<Message> = base
            .iter()
            .map(|m| {
                let mut m = m.clone();
                let t = format!("{} [copy {copy}]", m.text());
                m.content = context_engine::Content::Text(t);
                m
            })
            .collect();
        for m in &span {
            text_bytes += m.text().len();
            json_bytes += serde_json::to_string(m).unwrap().len();
        }
        let mut batch = Batch::new();
        let h = batch.archive_span(&span, 0, span.len());
        assert_eq!(h, span_handle(&span));
        store.commit("big", &batch).unwrap();
        copy += 1;
    }
    let size = store.size_bytes().unwrap();
    eprintln!(
        "store size: {size} bytes for {text_bytes} bytes of message text ({json_bytes} bytes of JSON): \
         {:.2}x the text, {:.2}x the JSON ({copy} copies of the example session)",
        size as f64 / text_bytes as f64,
        size as f64 / json_bytes as f64
    );
    let mut group = c.benchmark_group("store_search_10mb");
    group.bench_function("one_word", |b| {
        b.iter(|| {
            store
                .search(Some("big"), black_box("RetryPolicy"), 10)
                .unwrap()
        })
    });
    group.bench_function("two_words", |b| {
        b.iter(|| {
            store
                .search(Some("big"), black_box("jitter test_retry.py"), 10)
                .unwrap()
        })
    });
    group.bench_function("tool_context_search", |b| {
        let history: Vec<Message> = Vec::new();
        let sources = context_engine::recall::Sources::history(&history).with_store(&store, "big");
        let args = json!({"query": "KeyError backoff", "limit": 10});
        b.iter(|| {
            context_engine::recall::handle_tool_call("context_search", black_box(&args), sources)
        })
    });
    group.finish();
}

fn bench_replay(c: &mut Criterion) {
    let recording = example();
    let counter: Arc<dyn TokenCounter> =
        Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
    // A replay starts on an empty session: clearing the previous
    // iteration's rows is setup, not timed.
    let run = |store: Option<Arc<dyn SessionStore>>| {
        let engine = Compressor::new(Arc::clone(&counter), 8_000);
        let mut session = Session::new("bench", Box::new(engine), Arc::clone(&counter));
        if let Some(store) = store {
            session = session.with_store(store).unwrap();
        }
        replay(
            &recording,
            &mut session,
            counter.as_ref(),
            &ReplayOptions::default(),
            |_, _| {},
        )
        .unwrap()
    };
    let sqlite: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&temp("replay.db")).unwrap());
    let mut group = c.benchmark_group("store_replay_coding_session_8k");
    group.sample_size(10);
    group.bench_function("no_store", |b| b.iter_with_large_drop(|| run(None)));
    group.bench_function("memory", |b| {
        b.iter_batched(
            || Arc::new(MemoryStore::new()) as Arc<dyn SessionStore>,
            |store| run(Some(store)),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("sqlite", |b| {
        b.iter_batched(
            || {
                sqlite.delete_session("bench").unwrap();
                Arc::clone(&sqlite)
            },
            |store| run(Some(store)),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, bench_per_call, bench_search, bench_replay);
criterion_main!(benches);
