#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Token counting on a real transcript: cold vs. cached re-count after one
//! appended message, and the two BPE crates on the same text.
//!
//! `cargo bench -p context-engine --bench tokens -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use context_engine::Message;
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, EstimateCounter, TokenCounter};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

fn transcript() -> Option<Vec<Message>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/mini_astropy12907.traj.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("skipping: corpus file {} not found", path.display());
        return None;
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let list = v["messages"].as_array().unwrap().clone();
    Some(
        list.into_iter()
            .map(|m| Message::from_value(m).unwrap())
            .collect(),
    )
}

/// A tool result never seen before, so that it misses the cache.
fn fresh_message(seq: &AtomicU64) -> Message {
    let n = seq.fetch_add(1, Ordering::Relaxed);
    Message::tool_result(
        format!("call_{n}"),
        format!("<returncode>0</returncode>\n<output>\nrun {n}: 3 passed in 0.42s\n</output>"),
    )
}

fn transcript_counting(c: &mut Criterion) {
    let Some(messages) = transcript() else { return };
    let mut group = c.benchmark_group("transcript");
    let seq = AtomicU64::new(0);

    group.bench_function("cold_count", |b| {
        // `_ref`: building and dropping the input stay outside the timing.
        b.iter_batched_ref(
            || CachedCounter::new(BpeCounter::new(Encoding::O200kBase)),
            |counter| black_box(counter.count_messages(black_box(&messages))),
            BatchSize::SmallInput,
        )
    });

    let warm = CachedCounter::new(BpeCounter::new(Encoding::O200kBase));
    warm.count_messages(&messages);
    group.bench_function("warm_recount_after_append", |b| {
        b.iter_batched_ref(
            || {
                let mut grown = messages.clone();
                grown.push(fresh_message(&seq));
                grown
            },
            |grown| black_box(warm.count_messages(black_box(grown))),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn bpe_crates(c: &mut Criterion) {
    let Some(messages) = transcript() else { return };
    let text: String = messages
        .iter()
        .map(|m| m.text().into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    for (enc, tiktoken) in [
        (Encoding::O200kBase, tiktoken_rs::o200k_base_singleton()),
        (Encoding::Cl100kBase, tiktoken_rs::cl100k_base_singleton()),
    ] {
        let ours = BpeCounter::new(enc);
        assert_eq!(ours.count_text(&text), tiktoken.count_ordinary(&text));
        let mut group = c.benchmark_group(format!("bpe_{}", enc.name()));
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function("bpe-openai", |b| {
            b.iter(|| ours.count_text(black_box(&text)))
        });
        group.bench_function("tiktoken-rs", |b| {
            b.iter(|| tiktoken.count_ordinary(black_box(&text)))
        });
        group.bench_function("estimate_chars_div_4", |b| {
            b.iter(|| EstimateCounter::default().count_text(black_box(&text)))
        });
        group.finish();
    }
}

criterion_group!(benches, transcript_counting, bpe_crates);
criterion_main!(benches);
