#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Redaction throughput on real agent transcripts with the full rule table
//! (target: at least 100 MB/s). Criterion reports the figure as throughput.

use std::hint::black_box;

use context_engine_testkit as common;

use context_engine::redact::{RedactOptions, Redactor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn corpus() -> Vec<(String, String)> {
    let Some(dir) = common::corpus_dir() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<(String, String)> = entries
        .filter_map(|e| {
            let path = e.ok()?.path();
            let text = std::fs::read_to_string(&path).ok()?;
            Some((path.file_name()?.to_string_lossy().into_owned(), text))
        })
        .collect();
    files.sort();
    files
}

fn bench(c: &mut Criterion) {
    let files = corpus();
    if files.is_empty() {
        return;
    }
    let redactor = Redactor::builder().build().unwrap();
    let opts = RedactOptions {
        force: true,
        ..RedactOptions::default()
    };
    let all: String = files.iter().map(|(_, t)| t.as_str()).collect();
    let mut group = c.benchmark_group("redact");
    group.throughput(Throughput::Bytes(all.len() as u64));
    group.bench_function("corpus_all", |b| {
        b.iter(|| redactor.redact(black_box(&all), &opts).len())
    });
    let urls = RedactOptions {
        url_credentials: true,
        ..opts.clone()
    };
    group.bench_function("corpus_all_url_credentials", |b| {
        b.iter(|| redactor.redact(black_box(&all), &urls).len())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
