//! What watching a front's stream for engine-tool calls costs: a Claude
//! Code-like Anthropic stream and a Codex-like Responses stream (one
//! thousand text deltas, then a call of the client's), relayed with the
//! usage reader alone (engine tools off) and with the engine-tool rounds
//! on top (on, the default for clients with tools), in 4 KB chunks.
//!
//! `cargo bench -p context-engine-serve --bench stream_rounds`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use bytes::Bytes;
use context_engine::front::FrontKind;
use context_engine_serve::sse::{Reading, StreamReader, WireReader};
use context_engine_serve::tools::{ApiTools, EngineTools};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

const DELTAS: usize = 1000;

fn sse(events: &[Value]) -> Vec<u8> {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect::<String>()
        .into_bytes()
}

fn anthropic() -> Vec<u8> {
    let mut events = vec![
        json!({"type": "message_start", "message": {"id": "m", "role": "assistant", "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ];
    for k in 0..DELTAS {
        events.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("word{k} ")}}));
    }
    events.extend([
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "Bash", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"command\":\"ls\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 900}}),
        json!({"type": "message_stop"}),
    ]);
    sse(&events)
}

fn responses() -> Vec<u8> {
    let message = json!({"type": "message", "id": "msg", "role": "assistant", "content": []});
    let call = json!({"type": "function_call", "id": "fc", "call_id": "c", "name": "shell", "arguments": "{}"});
    let mut events = vec![
        json!({"type": "response.created", "response": {"id": "r", "output": []}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": message}),
    ];
    for k in 0..DELTAS {
        events.push(json!({"type": "response.output_text.delta", "output_index": 0, "item_id": "msg", "content_index": 0, "delta": format!("word{k} ")}));
    }
    events.extend([
        json!({"type": "response.output_item.done", "output_index": 0, "item": message}),
        json!({"type": "response.output_item.added", "output_index": 1, "item": call}),
        json!({"type": "response.output_item.done", "output_index": 1, "item": call}),
        json!({"type": "response.completed", "response": {"id": "r", "output": [message, call], "usage": {"input_tokens": 10, "output_tokens": 900, "total_tokens": 910}}}),
    ]);
    for (n, e) in events.iter_mut().enumerate() {
        e["sequence_number"] = json!(n);
    }
    sse(&events)
}

fn tools() -> EngineTools {
    EngineTools {
        tools_json: "[]".into(),
        names: vec!["context_recall".into()],
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("stream_rounds");
    for (kind, stream) in [
        (FrontKind::Anthropic, anthropic()),
        (FrontKind::Responses, responses()),
    ] {
        group.throughput(Throughput::Bytes(stream.len() as u64));
        // As the upstream's body arrives: 4 KiB chunks.
        let chunks: Vec<Bytes> = stream.chunks(4096).map(Bytes::copy_from_slice).collect();
        group.bench_function(format!("{kind}/usage_reader"), |b| {
            b.iter(|| {
                let mut reading = Reading::new(Box::new(WireReader::new(kind)));
                let mut out = 0;
                for chunk in &chunks {
                    out += reading.push(chunk.clone()).len();
                }
                black_box((reading.reader.usage(), out))
            })
        });
        group.bench_function(format!("{kind}/with_engine_tools"), |b| {
            b.iter(|| {
                let offered = match kind {
                    FrontKind::Anthropic => ApiTools::Anthropic(tools()),
                    FrontKind::Responses => ApiTools::Responses(tools()),
                };
                let mut rounds = offered.stream(Bytes::from_static(b"{}"), Vec::new(), 3);
                let mut reading = Reading::new(Box::new(WireReader::new(kind)));
                let mut out = 0;
                for chunk in &chunks {
                    let sent = reading.push_through(chunk.clone(), |e, out| rounds.event(e, out));
                    out += sent.len();
                }
                black_box((reading.reader.usage(), out))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
