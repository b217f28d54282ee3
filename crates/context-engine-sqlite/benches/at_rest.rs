#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What redaction before archiving costs a compaction's commit: a
//! realistic compaction batch (a corpus session, `sweagent_pydicom.traj`,
//! read at run time; a generated one when the corpus is missing) committed
//! to a SQLite store as it is (verbatim), redacted (the default) and
//! encrypted (verbatim with a key), in one run. Each iteration archives
//! new content (every message made unique), as a real compaction does.
//! Prints the median of each and the ratios; the budget is redacted ≤ 1.2×
//! verbatim.
//!
//! `cargo bench -p context-engine --bench at_rest -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use context_engine::Message;
use context_engine::message::Content;
use context_engine::redact::{Egress, Redactor};
use context_engine::store::{AtRest, Batch, CompactionInfo, Seal, SessionStore};
use context_engine::transcript::Transcript;
use context_engine_sqlite::SqliteStore;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

/// The corpus session, else a generated coding session of about the same
/// size.
fn session() -> (Vec<Message>, &'static str) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/sweagent_pydicom.traj");
    if let Ok(t) = Transcript::load(&path) {
        return (t.messages, "sweagent_pydicom.traj");
    }
    let mut m = vec![
        Message::system("You are a coding agent."),
        Message::user("fix it"),
    ];
    for i in 0..60 {
        m.push(Message::assistant(format!("I'll look at file {i}.")));
        m.push(Message::user(
            (0..30)
                .map(|j| format!("{j:4}  def f{j}(x): return compute(x, {i}) # line of file {i}\n"))
                .collect::<String>(),
        ));
    }
    (m, "generated")
}

/// The compaction of `messages` (unique to iteration `n`): everything but
/// the first 3 and the last 6 replaced by a summary.
fn compaction(messages: &[Message], n: u64) -> Batch {
    let input: Vec<Message> = messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Content::Text(t) = &mut m.content {
                t.push_str(&format!("\n[{n}]"));
            }
            m
        })
        .collect();
    let len = input.len();
    let mut output = input[..3].to_vec();
    output.push(Message::user(format!(
        "[summary {n}] the agent read and edited files"
    )));
    output.extend_from_slice(&input[len - 6..]);
    let mut batch = Batch::new();
    batch.compaction(
        &input,
        &output,
        &CompactionInfo::new(n + 1, "bench", "compressor"),
    );
    batch
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ctx-bench-at-rest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

fn stores() -> Vec<(&'static str, Arc<dyn SessionStore>)> {
    let redactor = Redactor::builder()
        .pattern("ACMESECRET[a-z0-9]{12}")
        .build()
        .unwrap();
    let egress = Egress::new(Some(Arc::new(redactor)));
    let key = Seal::from_text("BENCH_KEY", &"7a".repeat(32)).unwrap();
    let open = |name: &str| -> Arc<dyn SessionStore> {
        Arc::new(SqliteStore::open(&temp(&format!("{name}.db"))).unwrap())
    };
    vec![
        (
            "verbatim",
            AtRest::verbatim(egress.clone(), None).wrap(open("verbatim")),
        ),
        (
            "redacted",
            AtRest::redacted(egress.clone()).wrap(open("redacted")),
        ),
        (
            "encrypted",
            AtRest::verbatim(egress, Some(key)).wrap(open("encrypted")),
        ),
    ]
}

fn bench_at_rest(c: &mut Criterion) {
    let (messages, source) = session();
    let n = AtomicU64::new(0);
    let stores = stores();
    let sample = compaction(&messages, u64::MAX);
    let bytes: usize = sample
        .messages()
        .iter()
        .map(|(_, m)| serde_json::to_string(m).unwrap().len())
        .sum();
    let mut group = c.benchmark_group("at_rest_compaction_commit");
    for (name, store) in &stores {
        group.bench_function(*name, |b| {
            b.iter_batched(
                || compaction(&messages, n.fetch_add(1, Ordering::Relaxed)),
                |batch| store.commit("s", black_box(&batch)).unwrap(),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
    // The medians of single commits, interleaved so that the three see
    // the same machine.
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); stores.len()];
    for _ in 0..60 {
        for (k, (_, store)) in stores.iter().enumerate() {
            let batch = compaction(&messages, n.fetch_add(1, Ordering::Relaxed));
            let start = Instant::now();
            store.commit("s", &batch).unwrap();
            times[k].push(start.elapsed());
        }
    }
    let median = |t: &mut Vec<Duration>| {
        t.sort();
        t[t.len() / 2]
    };
    let medians: Vec<Duration> = times.iter_mut().map(median).collect();
    println!(
        "at_rest: one compaction of {} messages ({} KB, {source}) committed to SQLite, median of 60: \
         verbatim {:.2} ms, redacted {:.2} ms ({:.2}x), encrypted {:.2} ms ({:.2}x)",
        sample.messages().len(),
        bytes / 1024,
        medians[0].as_secs_f64() * 1e3,
        medians[1].as_secs_f64() * 1e3,
        medians[1].as_secs_f64() / medians[0].as_secs_f64(),
        medians[2].as_secs_f64() * 1e3,
        medians[2].as_secs_f64() / medians[0].as_secs_f64(),
    );
}

/// What a server step writes (`ctx serve`): the state and a history
/// segment with the step's new messages (a call and its ~2 KB result, as
/// the lineage writes them), by compare-and-swap, under each policy.
fn bench_server_step(c: &mut Criterion) {
    let (messages, _) = session();
    let stores = stores();
    let result = messages
        .iter()
        .find(|m| m.text().len() > 1_500)
        .cloned()
        .unwrap_or_else(|| Message::user("x".repeat(2_000)));
    let segment = |n: u64| {
        let chain = format!("{:032x}", u128::from(n) * 0x9e37_79b9_7f4a_7c15);
        serde_json::json!({
            "keep": {"chain": n, "messages": n, "sent": n},
            "chain": [chain],
            "messages": [
                {"json": serde_json::to_value(Message::assistant(format!("step {n}: I'll run the tests"))).unwrap(), "depends": n + 1, "engine_made": false},
                {"json": serde_json::to_value(&result).unwrap(), "depends": n + 2, "engine_made": false},
            ],
            "sent": [n, n + 1],
        })
        .to_string()
    };
    let state = |n: u64| {
        serde_json::json!({
            "engine": "compressor",
            "engine_state": {"state": {"last_prompt_tokens": {"known": 12000 + n}, "compression_count": 2,
                "threshold_tokens": 96000, "context_length": 128000}},
            "host": {"awaiting_usage": false, "calls_this_turn": 3, "recorded": 2},
            "serve": {"calls": n, "lineage": format!("{:032x}", n)}
        })
    };
    let mut group = c.benchmark_group("at_rest_server_step");
    for (name, store) in &stores {
        let mut version = 0u64;
        group.bench_function(*name, |b| {
            b.iter(|| {
                let seg = [segment(version)];
                let write = context_engine::store::HistoryWrite {
                    // One segment per step: as many stored as versions.
                    keep: version as usize,
                    append: &seg,
                };
                version = store
                    .commit_versioned("step", version, &[], &state(version), Some(write))
                    .unwrap();
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_at_rest, bench_server_step);
criterion_main!(benches);
