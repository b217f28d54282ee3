#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The cost of working on a client's own format: a 200-turn request (about
//! 1 MB) read, bridged to chat messages and back, and written, for Anthropic
//! Messages and OpenAI Responses, against reading and writing the same
//! conversation as chat-completions messages (what the chat front does).
//! `digested` adds the back-conversion of a digested view (one rewritten
//! block per old result). `rebuild_in_place` is the proxy's steady path
//! for the same digested view (`FrontRequest::rebuild_with`, unchanged
//! messages written as the client's bytes), with the client's breakpoint
//! on the newest result left there or moved to the call before it.
//!
//! `cargo bench -p context-engine --bench formats -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use std::collections::BTreeMap;

use context_engine::digest::{DigestOptions, digest, stable_len};
use context_engine::front::{FrontCache, FrontKind, FrontRequest, split_items};
use context_engine::message::Message;
use context_engine::{anthropic, responses};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::value::RawValue;
use serde_json::{Value, json};

const TURNS: usize = 200;

fn output(i: usize) -> String {
    format!("src/module{i}.rs:{i}: fn item_{i}() -> u32 {{ {i} }}\n").repeat(90)
}

fn anthropic_request() -> String {
    let mut messages = vec![json!({"role": "user", "content": "Refactor the crate."})];
    for i in 0..TURNS {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": format!("Step {i}."), "signature": format!("EqQBsig{i}==")},
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Bash", "input": {"command": format!("cat src/module{i}.rs")}}
        ]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": output(i)}
        ]}));
    }
    messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": "Done."}]}));
    json!({"model": "claude-sonnet-4-5", "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": messages}).to_string()
}

fn responses_request() -> String {
    let mut input = vec![
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Refactor the crate."}]}),
    ];
    for i in 0..TURNS {
        input.push(
            json!({"type": "reasoning", "summary": [], "encrypted_content": format!("gAAAA{i}==")}),
        );
        input.push(json!({"type": "function_call", "name": "shell", "arguments": format!("{{\"command\":[\"cat\",\"src/module{i}.rs\"]}}"), "call_id": format!("call_{i}")}));
        input.push(json!({"type": "function_call_output", "call_id": format!("call_{i}"), "output": output(i)}));
    }
    json!({"model": "gpt-5-codex", "instructions": "You are Codex.", "input": input}).to_string()
}

fn chat_request(messages: &[Message]) -> String {
    json!({"model": "gpt-5", "messages": messages}).to_string()
}

fn bench(c: &mut Criterion) {
    let a = anthropic_request();
    let r = responses_request();
    let chat =
        chat_request(&anthropic::bridge::to_chat(&anthropic::Request::parse(&a).unwrap()).messages);
    let mut g = c.benchmark_group("formats");
    g.bench_function("chat_parse_write", |b| {
        b.iter(|| {
            let mut v: Value = serde_json::from_str(black_box(&chat)).unwrap();
            let messages: Vec<Message> = serde_json::from_value(v["messages"].take()).unwrap();
            v["messages"] = serde_json::to_value(&messages).unwrap();
            black_box(v.to_string())
        })
    });
    g.bench_function("anthropic_noop", |b| {
        b.iter(|| {
            let req = anthropic::Request::parse(black_box(&a)).unwrap();
            let bridged = anthropic::bridge::to_chat(&req);
            black_box(
                anthropic::bridge::from_chat(&req, &bridged, &bridged.messages).to_json_string(),
            )
        })
    });
    g.bench_function("responses_noop", |b| {
        b.iter(|| {
            let req = responses::Request::parse(black_box(&r)).unwrap();
            let bridged = responses::bridge::to_chat(&req);
            black_box(
                responses::bridge::from_chat(&req, &bridged, &bridged.messages).to_json_string(),
            )
        })
    });
    let req = anthropic::Request::parse(&a).unwrap();
    let bridged = anthropic::bridge::to_chat(&req);
    let digested = digest(&bridged.messages, &DigestOptions::default());
    g.bench_function("anthropic_from_chat_digested", |b| {
        b.iter(|| {
            black_box(anthropic::bridge::from_chat(
                &req,
                &bridged,
                black_box(&digested),
            ))
        })
    });
    // The proxy's steady path: the request ends on the newest result, which
    // carries the client's breakpoint (Claude Code's).
    let mut marked: Value = serde_json::from_str(&a).unwrap();
    let messages = marked["messages"].as_array_mut().unwrap();
    messages.pop();
    let last = messages.len() - 1;
    messages[last]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
    let marked = marked.to_string();
    let owned: BTreeMap<String, Box<RawValue>> = serde_json::from_str(&marked).unwrap();
    let fields: Vec<(&str, &RawValue)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_ref()))
        .collect();
    let raw = split_items(FrontKind::Anthropic, &fields).unwrap();
    let mut front = FrontRequest::parse_parts(
        FrontKind::Anthropic,
        &fields,
        Some(&raw),
        &mut FrontCache::default(),
    )
    .unwrap();
    let opts = DigestOptions::default();
    let view = digest(front.chat(), &opts);
    let stable = stable_len(&view, &opts);
    assert!(stable < view.len());
    g.bench_function("anthropic_rebuild_in_place_digested", |b| {
        b.iter(|| black_box(front.rebuild_with(&view, Some(&raw), view.len()).unwrap()))
    });
    g.bench_function(
        "anthropic_rebuild_in_place_digested_breakpoint_moved",
        |b| b.iter(|| black_box(front.rebuild_with(&view, Some(&raw), stable).unwrap())),
    );
    g.finish();
    eprintln!(
        "request sizes: anthropic {} B, responses {} B, chat {} B",
        a.len(),
        r.len(),
        chat.len()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
