#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The proactive prune on the largest corpus transcript, the whole session
//! as one request: with a cached counter (as an engine holds one) and with a
//! cold exact counter, and the below-threshold early return.
//!
//! `cargo bench -p context-engine --bench prune -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::PathBuf;

use context_engine::prune::{PruneOptions, prune};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding};
use context_engine::transcript::Transcript;
use criterion::{Criterion, criterion_group, criterion_main};

fn bench_prune(c: &mut Criterion) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/mini_astropy12907.traj.json");
    let Ok(transcript) = Transcript::load(&path) else {
        eprintln!("skipping: corpus file {} not found", path.display());
        return;
    };
    let m = transcript.messages;
    let opts = PruneOptions {
        proactive_prune_tokens: 1,
        min_reclaim_tokens: 0,
        ..PruneOptions::default()
    };
    let cold = BpeCounter::new(Encoding::O200kBase);
    let cached = CachedCounter::new(BpeCounter::new(Encoding::O200kBase));
    let mut group = c.benchmark_group("prune_astropy");
    group.bench_function("whole_session_cached_counter", |b| {
        b.iter_with_large_drop(|| prune(black_box(&m), Some(40_000), &opts, &cached))
    });
    group.bench_function("whole_session_cold_counter", |b| {
        b.iter_with_large_drop(|| prune(black_box(&m), Some(40_000), &opts, &cold))
    });
    let high = PruneOptions {
        proactive_prune_tokens: 100_000,
        ..opts.clone()
    };
    group.bench_function("below_threshold", |b| {
        b.iter(|| prune(black_box(&m), Some(40_000), &high, &cold).pruned)
    });
    group.finish();
}

criterion_group!(benches, bench_prune);
criterion_main!(benches);
