#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Loading, validating and finding cut points on a real transcript.
//!
//! `cargo bench -p context-engine --bench load_validate -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::PathBuf;

use context_engine::transcript::Transcript;
use context_engine::validate::{CutPoints, Profile, validate};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn load_validate(c: &mut Criterion) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/mini_astropy12907.traj.json");
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!("skipping: corpus file {} not found", path.display());
        return;
    };
    let mut group = c.benchmark_group("astropy");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("parse", |b| {
        b.iter(|| Transcript::parse(black_box(&bytes), "astropy").unwrap())
    });
    let transcript = Transcript::parse(&bytes, "astropy").unwrap();
    group.bench_function("validate_openai", |b| {
        b.iter(|| validate(black_box(&transcript.messages), Profile::OpenAi))
    });
    group.bench_function("cut_points", |b| {
        b.iter(|| {
            CutPoints::new(
                black_box(&transcript.messages),
                context_engine::validate::auto_text_actions(),
            )
        })
    });
    group.bench_function("parse_and_validate", |b| {
        b.iter(|| {
            let t = Transcript::parse(black_box(&bytes), "astropy").unwrap();
            validate(&t.messages, Profile::OpenAi)
        })
    });
    group.bench_function("write_back", |b| {
        b.iter(|| black_box(&transcript).to_json_string())
    });
    group.finish();
}

criterion_group!(benches, load_validate);
criterion_main!(benches);
