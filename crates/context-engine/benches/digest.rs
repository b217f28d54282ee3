#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The tool-result digest as a request view on the largest corpus
//! transcript: the whole session as one request, and every request of a
//! turn-by-turn replay (each assistant message is one call whose request is
//! everything before it).
//!
//! `cargo bench -p context-engine --bench digest -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::PathBuf;

use context_engine::digest::{DigestOptions, digest, digest_view};
use context_engine::message::{Message, Role};
use context_engine::transcript::Transcript;
use context_engine::validate::reentries_with;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// The messages of a corpus file (under `$CTX_CORPUS_DIR`, else
/// `../shared/corpus`), or `None` with the reason printed.
fn load(name: &str) -> Option<Vec<Message>> {
    let path = std::env::var_os("CTX_CORPUS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"))
        .join(name);
    match Transcript::load(&path) {
        Ok(t) => Some(t.messages),
        Err(_) => {
            eprintln!("skipping: corpus file {} not found", path.display());
            None
        }
    }
}

/// The index of every model call (assistant message): its request is
/// everything before it.
fn call_indexes(m: &[Message]) -> Vec<usize> {
    m.iter()
        .enumerate()
        .filter(|(_, x)| x.role == Role::Assistant)
        .map(|(i, _)| i)
        .collect()
}

fn bench_digest(c: &mut Criterion) {
    let Some(m) = load("mini_astropy12907.traj.json") else {
        return;
    };
    let opts = DigestOptions::default();
    let calls = call_indexes(&m);
    let mut group = c.benchmark_group("digest_astropy");
    group.throughput(Throughput::Elements(1));
    group.bench_function("whole_session_request", |b| {
        b.iter_with_large_drop(|| digest(black_box(&m), &opts))
    });
    group.bench_function("whole_session_request_borrowed", |b| {
        b.iter_with_large_drop(|| digest_view(black_box(&m), &opts))
    });
    // One element per request: criterion reports the time per request.
    group.throughput(Throughput::Elements(calls.len() as u64));
    group.bench_function("replay_every_request", |b| {
        b.iter(|| {
            for &i in &calls {
                black_box(digest(black_box(&m[..i]), &opts));
            }
        })
    });
    group.bench_function("replay_every_request_borrowed", |b| {
        b.iter(|| {
            for &i in &calls {
                black_box(digest_view(black_box(&m[..i]), &opts));
            }
        })
    });
    group.finish();
}

/// A text-action transcript (SWE-agent classic: observations are user
/// messages): recognising the observations, and the digest of every
/// request.
fn bench_text_actions(c: &mut Criterion) {
    let Some(m) = load("sweagent_pydicom.traj") else {
        return;
    };
    let opts = DigestOptions::default();
    let calls = call_indexes(&m);
    let mut group = c.benchmark_group("text_actions_pydicom");
    group.throughput(Throughput::Elements(1));
    group.bench_function("observations_whole_session", |b| {
        b.iter(|| reentries_with(black_box(&m), context_engine::validate::auto_text_actions()))
    });
    group.throughput(Throughput::Elements(calls.len() as u64));
    group.bench_function("replay_every_request_borrowed", |b| {
        b.iter(|| {
            for &i in &calls {
                black_box(digest_view(black_box(&m[..i]), &opts));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench_digest, bench_text_actions);
criterion_main!(benches);
