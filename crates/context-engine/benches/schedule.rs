#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The cache-aware scheduler: its own decision per call (`decide` plus
//! `record_request`), and the whole scheduled digest of every request of a
//! turn-by-turn replay of the largest corpus transcript next to the plain
//! digest (the schedule's overhead: a second digest pass and token counts
//! when steps are pending), the compressor's preflight with the early
//! compaction check, and the stable prefix a breakpoint cache is marked at.
//!
//! `cargo bench -p context-engine --bench schedule -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use context_engine::compressor::Compressor;
use context_engine::digest::{DigestOptions, digest_view};
use context_engine::engine::{ContextEngine, SelectRequest};
use context_engine::message::{Message, Role};
use context_engine::schedule::{Edit, ScheduleOptions, Scheduler, scheduled_digest};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn bench_schedule(c: &mut Criterion) {
    let mut group = c.benchmark_group("schedule");
    group.throughput(Throughput::Elements(1));
    let mut scheduler = Scheduler::new(ScheduleOptions::default());
    scheduler.record_request(40_000, Some(0.0));
    let edit = Edit {
        at_tokens: 10_000,
        saved_tokens: 3_000,
        request_tokens: 41_000,
    };
    group.bench_function("decide_and_record", |b| {
        let mut t = 0.0;
        b.iter(|| {
            t += 1.0;
            let v = scheduler.decide(black_box(&edit), 96_000, Some(t));
            scheduler.record_request(black_box(41_000), Some(t));
            v
        })
    });

    let dir = std::env::var_os("CTX_CORPUS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
        });
    let path = dir.join("mini_astropy12907.traj.json");
    let Ok(transcript) = Transcript::load(&path) else {
        eprintln!(
            "skipping the replay benches: corpus file {} not found",
            path.display()
        );
        return;
    };
    let m = transcript.messages;
    let calls: Vec<usize> = m
        .iter()
        .enumerate()
        .filter(|(_, x)| x.role == Role::Assistant)
        .map(|(i, _)| i)
        .collect();
    let opts = DigestOptions::default();
    let counter: Arc<dyn TokenCounter> =
        Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
    // One element per request: criterion reports the time per request.
    group.throughput(Throughput::Elements(calls.len() as u64));
    group.bench_function("plain_digest_per_request", |b| {
        b.iter(|| {
            for &i in &calls {
                black_box(digest_view(&m[..i], &opts));
            }
        })
    });
    group.bench_function("scheduled_digest_per_request", |b| {
        b.iter(|| {
            let mut s = Scheduler::new(ScheduleOptions::default());
            for (k, &i) in calls.iter().enumerate() {
                black_box(scheduled_digest(
                    &mut s,
                    &m[..i],
                    &opts,
                    counter.as_ref(),
                    96_000,
                    Some(k as f64),
                ));
            }
        })
    });
    // The compressor's preflight with the early-compaction check (a plan
    // of the request and the cost model), at half astropy's peak: on the
    // upper half of the threshold it runs on every call.
    let views: Vec<Vec<Message>> = {
        let mut engine = Compressor::new(Arc::clone(&counter), 16_988);
        calls
            .iter()
            .map(|&i| {
                let request = SelectRequest::new(&m[..i], &m[..i]);
                engine
                    .select_context(&request)
                    .unwrap_or_else(|| m[..i].to_vec())
            })
            .collect()
    };
    let mut engine = Compressor::new(Arc::clone(&counter), 16_988);
    for v in &views {
        engine.select_context(&SelectRequest::new(v, v));
    }
    group.bench_function("preflight_with_early_compaction_per_request", |b| {
        b.iter(|| {
            for v in &views {
                black_box(engine.should_compress_preflight(v));
            }
        })
    });
    // Where a breakpoint cache is marked: what the next request keeps of
    // each digested request (one more digest pass over the view).
    group.bench_function("stable_prefix_per_request", |b| {
        b.iter(|| {
            for v in &views {
                black_box(engine.stable_prefix(v));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench_schedule);
criterion_main!(benches);
