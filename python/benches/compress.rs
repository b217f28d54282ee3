//! The Rust side of the Python benchmark (`python/bench/bench.py`): the
//! same engine call on the same ~1 MB session, without Python. The session
//! generator mirrors `tool_session` in `python/tests/conftest.py`.
//!
//! `cargo bench --manifest-path python/Cargo.toml --bench compress`

use std::sync::Arc;

use context_engine::Message;
use context_engine::compressor::{Compressor, CompressorOptions};
use context_engine::engine::{CompressRequest, ContextEngine};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

/// Turns of the ~1 MB session (the Python benchmark uses the same).
const TURNS: usize = 160;
/// Bytes of each tool result.
const RESULT_BYTES: usize = 6000;

fn tool_session(turns: usize, result_bytes: usize) -> Vec<Value> {
    let mut msgs = vec![
        json!({"role": "system", "content": "You are a careful coding agent."}),
        json!({"role": "user", "content": "Fix the failing test in tests/test_parser.py"}),
    ];
    for i in 0..turns {
        let args = json!({"command": format!("cat src/module_{i}.py")}).to_string();
        msgs.push(json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                            "function": {"name": "bash", "arguments": args}}],
        }));
        let body: Vec<String> = (0..result_bytes / 60)
            .map(|j| {
                format!("def function_{i}_{j}(x):  # line {j} of module {i}\n    return x * {j}")
            })
            .collect();
        msgs.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": body.join("\n")}));
        msgs.push(
            json!({"role": "assistant", "content": format!("Read module {i}; nothing wrong yet.")}),
        );
    }
    msgs.push(json!({"role": "user", "content": "Now run the tests again."}));
    msgs
}

fn bench(c: &mut Criterion) {
    let values = tool_session(TURNS, RESULT_BYTES);
    let bytes: usize = values.iter().map(|v| v.to_string().len()).sum();
    let messages: Vec<Message> = values
        .into_iter()
        .filter_map(|v| Message::from_value(v).ok())
        .collect();
    let counter = Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
    let mut engine = Compressor::with_options(counter, 64_000, CompressorOptions::default());
    let request = CompressRequest::new().with_force(true);
    let mut group = c.benchmark_group(format!("python_parity/{bytes}_bytes"));
    group.sample_size(20);
    group.bench_function("compress_from_rust", |b| {
        b.iter(|| {
            engine
                .compress(&messages, &request)
                .map(|c| c.messages.len())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
