use super::*;
use crate::tools::{Fed, Rounds};
use bytes::Bytes;

fn tools() -> EngineTools {
    EngineTools {
        tools_json: r#"[{"name":"Bash","input_schema":{"type":"object"}},{"name":"context_recall","input_schema":{"type":"object"}}]"#.into(),
        names: vec!["context_recall".into()],
    }
}

fn sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect()
}

/// The events a client reads from `bytes`, as JSON.
fn events(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(bytes)
        .split("\n\n")
        .filter_map(|e| {
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            serde_json::from_str(data).ok()
        })
        .collect()
}

fn start(id: &str) -> Value {
    json!({"type": "message_start", "message": {"id": id, "role": "assistant", "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}})
}

fn text_block(index: usize, text: &str) -> Vec<Value> {
    vec![
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": index}),
    ]
}

fn tool_block(index: usize, id: &str, name: &str, input: &str) -> Vec<Value> {
    let (a, b) = input.split_at(input.len() / 2);
    vec![
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": a}}),
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": b}}),
        json!({"type": "content_block_stop", "index": index}),
    ]
}

fn end(stop: &str) -> Vec<Value> {
    vec![
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 9}}),
        json!({"type": "message_stop"}),
    ]
}

fn stream(parts: &[Vec<Value>]) -> String {
    sse(&parts.concat())
}

const BODY: &str = r#"{"model":"claude","max_tokens":64,"tools":[{"name":"Bash","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"read a.txt"}],"stream":true}"#;

fn rounds(max_rounds: u32) -> Fed<StreamRounds> {
    Fed::new(StreamRounds::new(
        tools(),
        Bytes::from_static(BODY.as_bytes()),
        Vec::new(),
        max_rounds,
    ))
}

/// Pushes `text` cut at `cut` and at its end; what the client got.
fn push_cut(r: &mut Fed<StreamRounds>, text: &str, cut: usize) -> Vec<u8> {
    let (a, b) = text.as_bytes().split_at(cut);
    let mut out = r.push(a);
    out.extend(r.push(b));
    out.extend(r.finish());
    out
}

#[test]
fn an_engine_call_is_resolved_and_the_continuation_follows_the_clients_blocks() {
    let first = stream(&[
        vec![start("m1")],
        text_block(0, "Let me look back."),
        tool_block(1, "toolu_1", "context_recall", r#"{"handle":"call_7"}"#),
        end("tool_use"),
    ]);
    let second = stream(&[
        vec![start("m2"), json!({"type": "ping"})],
        text_block(0, "Found it."),
        end("end_turn"),
    ]);
    for cut in (0..first.len()).step_by(7) {
        let mut r = rounds(3);
        let out = events(&push_cut(&mut r, &first, cut));
        assert!(r.holding() && r.ended() && r.resolvable(), "cut {cut}");
        // The client has the message start and the text, not the call.
        let kinds: Vec<&str> = out.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop"
            ],
            "cut {cut}"
        );
        let next = r.next_request(&mut None);
        let next: Value = serde_json::from_slice(&next).unwrap();
        let messages = next["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1]["role"], "assistant");
        assert_eq!(messages[1]["content"][0]["text"], "Let me look back.");
        assert_eq!(
            messages[1]["content"][1]["input"],
            json!({"handle": "call_7"})
        );
        assert_eq!(messages[2]["content"][0]["type"], "tool_result");
        assert_eq!(messages[2]["content"][0]["tool_use_id"], "toolu_1");
        assert_eq!(next["tools"].as_array().unwrap().len(), 2);

        let out = events(&push_cut(&mut r, &second, cut.min(second.len())));
        assert!(!r.holding() && r.ended());
        // No second message start; the new text is the client's block 1.
        assert!(out.iter().all(|e| e["type"] != "message_start"));
        let indices: Vec<u64> = out.iter().filter_map(|e| e["index"].as_u64()).collect();
        assert_eq!(indices, [1, 1, 1]);
        assert_eq!(out.last().unwrap()["type"], "message_stop");
        assert!(out.iter().any(|e| e["delta"]["stop_reason"] == "end_turn"));
    }
}

#[test]
fn mixed_calls_reach_the_client_without_the_engines_renumbered() {
    let text = stream(&[
        vec![start("m1")],
        tool_block(0, "toolu_1", "context_recall", r#"{"handle":"h"}"#),
        tool_block(1, "toolu_2", "Bash", r#"{"command":"ls"}"#),
        end("tool_use"),
    ]);
    let mut r = rounds(3);
    let mut out = r.push(text.as_bytes());
    assert!(r.holding() && r.ended() && !r.resolvable());
    out.extend(r.release_held());
    let out = events(&out);
    let starts: Vec<&Value> = out
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .collect();
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0]["index"], 0);
    assert_eq!(starts[0]["content_block"]["name"], "Bash");
    assert!(
        out.iter()
            .filter_map(|e| e["index"].as_u64())
            .all(|i| i == 0)
    );
    assert!(out.iter().any(|e| e["delta"]["stop_reason"] == "tool_use"));
    assert_eq!(out.last().unwrap()["type"], "message_stop");
}

#[test]
fn an_engine_call_past_the_last_round_leaves_a_note_and_ends_the_turn() {
    let text = stream(&[
        vec![start("m1")],
        tool_block(0, "toolu_1", "context_recall", r#"{"handle":"h"}"#),
        end("tool_use"),
    ]);
    let mut r = rounds(0);
    let mut out = r.push(text.as_bytes());
    assert!(r.holding() && !r.resolvable());
    out.extend(r.release_held());
    let out = events(&out);
    let texts: Vec<&str> = out
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(texts, [NOTHING_LEFT]);
    assert!(out.iter().all(|e| e["content_block"]["type"] != "tool_use"));
    assert!(out.iter().any(|e| e["delta"]["stop_reason"] == "end_turn"));
}

#[test]
fn thinking_keeps_its_signature_in_the_exchange() {
    let text = stream(&[
        vec![
            start("m1"),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig=="}}),
            json!({"type": "content_block_stop", "index": 0}),
        ],
        tool_block(1, "toolu_1", "context_recall", "{}"),
        end("tool_use"),
    ]);
    let mut r = rounds(1);
    r.push(text.as_bytes());
    assert!(r.resolvable());
    let next: Value = serde_json::from_slice(&r.next_request(&mut None)).unwrap();
    assert_eq!(
        next["messages"][1]["content"][0],
        json!({"type": "thinking", "thinking": "hm", "signature": "sig=="})
    );
    // The last round goes out with the client's tools only.
    assert_eq!(next["tools"].as_array().unwrap().len(), 1);
}

#[test]
fn a_non_streamed_answer_loses_the_engines_calls_only() {
    let mut mixed = json!({"content": [
        {"type": "tool_use", "id": "a", "name": "context_recall", "input": {}},
        {"type": "tool_use", "id": "b", "name": "Bash", "input": {}}],
        "stop_reason": "tool_use"});
    strip_engine_calls(&mut mixed, &tools());
    assert_eq!(mixed["content"].as_array().unwrap().len(), 1);
    assert_eq!(mixed["content"][0]["id"], "b");
    assert_eq!(mixed["stop_reason"], "tool_use");
    let mut only = json!({"content": [
        {"type": "tool_use", "id": "a", "name": "context_recall", "input": {}}],
        "stop_reason": "tool_use"});
    strip_engine_calls(&mut only, &tools());
    assert_eq!(
        only["content"],
        json!([{"type": "text", "text": NOTHING_LEFT}])
    );
    assert_eq!(only["stop_reason"], "end_turn");
}

#[test]
fn chat_schemas_become_anthropic_tools() {
    let chat = json!({"type": "function", "function": {"name": "context_recall", "description": "d", "parameters": {"type": "object", "properties": {"handle": {"type": "string"}}}}});
    assert_eq!(
        anthropic_schema(&chat).unwrap(),
        json!({"name": "context_recall", "description": "d", "input_schema": {"type": "object", "properties": {"handle": {"type": "string"}}}})
    );
    assert!(anthropic_schema(&json!({"name": "x"})).is_none());
}

#[test]
fn every_event_of_the_api_reads_as_one() {
    for data in [
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}"#,
        r#"{"type":"ping"}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"future_delta","x":1}}"#,
    ] {
        let e: Value = serde_json::from_str(data).unwrap();
        assert!(e["type"].as_str().is_some_and(|k| !k.is_empty()), "{data}");
    }
}
