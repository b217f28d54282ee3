#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The engine end to end on the largest corpus transcript: one extractive
//! compaction of the whole session, and a full replay (every model call
//! through the host driver: preflight, digest, post-tool checks,
//! compactions) at half the session's peak request.
//!
//! `cargo bench -p context-engine --bench replay -- --warm-up-time 1 --measurement-time 5`

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use context_engine::compressor::Compressor;
use context_engine::engine::{CompressRequest, ContextEngine};
use context_engine::host::Session;
use context_engine::replay::{ReplayOptions, replay};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use criterion::{Criterion, criterion_group, criterion_main};

fn bench_engine(c: &mut Criterion) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/mini_astropy12907.traj.json");
    let Ok(transcript) = Transcript::load(&path) else {
        eprintln!("skipping: corpus file {} not found", path.display());
        return;
    };
    // The session without its closing `exit` message, as a request.
    let m: Vec<_> = transcript.messages[..transcript.messages.len() - 1].to_vec();
    let counter: Arc<dyn TokenCounter> =
        Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
    let peak = counter.count_messages(&m) as u64;

    let mut group = c.benchmark_group("engine_astropy");
    group.sample_size(10);
    group.bench_function("compress_extractive_whole_session", |b| {
        b.iter_with_large_drop(|| {
            let mut engine = Compressor::new(Arc::clone(&counter), peak / 2);
            engine
                .compress(black_box(&m), &CompressRequest::new().with_force(true))
                .unwrap()
                .messages
        })
    });
    group.bench_function("replay_at_half_peak", |b| {
        b.iter_with_large_drop(|| {
            let engine = Compressor::new(Arc::clone(&counter), peak / 2);
            let mut session = Session::new("bench", Box::new(engine), Arc::clone(&counter));
            replay(
                black_box(&transcript.messages),
                &mut session,
                counter.as_ref(),
                &ReplayOptions::default(),
                |_, _| {},
            )
            .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_engine);
criterion_main!(benches);
