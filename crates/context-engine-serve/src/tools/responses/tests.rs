use super::*;
use crate::tools::{Fed, Rounds};
use bytes::Bytes;

fn tools() -> EngineTools {
    EngineTools {
        tools_json: r#"[{"type":"function","name":"shell","parameters":{"type":"object"}},{"type":"function","name":"context_recall","parameters":{"type":"object"}}]"#.into(),
        names: vec!["context_recall".into()],
    }
}

const BODY: &str = r#"{"model":"gpt-5","tools":[{"type":"function","name":"shell","parameters":{"type":"object"}}],"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"what was in a.txt?"}]}],"stream":true,"store":false}"#;

fn rounds(max_rounds: u32) -> Fed<StreamRounds> {
    Fed::new(StreamRounds::new(
        tools(),
        Bytes::from_static(BODY.as_bytes()),
        Vec::new(),
        max_rounds,
    ))
}

/// A response's events: `items` (complete), each added, (a text delta for
/// messages,) and done; sequence numbers from 0.
fn stream(id: &str, items: &[Value]) -> String {
    let mut events = vec![
        json!({"type": "response.created", "response": {"id": id, "output": []}}),
        json!({"type": "response.in_progress", "response": {"id": id, "output": []}}),
    ];
    for (i, item) in items.iter().enumerate() {
        events.push(json!({"type": "response.output_item.added", "output_index": i, "item": item}));
        if item["type"] == "message" {
            events.push(json!({"type": "response.output_text.delta", "output_index": i, "item_id": item["id"], "content_index": 0, "delta": item["content"][0]["text"]}));
        }
        events.push(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
    }
    events.push(json!({"type": "response.completed", "response": {"id": id, "output": items, "usage": {"input_tokens": 50, "output_tokens": 5, "total_tokens": 55}}}));
    events
        .iter()
        .enumerate()
        .map(|(n, e)| {
            let mut e = e.clone();
            e["sequence_number"] = json!(n);
            format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())
        })
        .collect()
}

fn events(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(bytes)
        .split("\n\n")
        .filter_map(|e| {
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            serde_json::from_str(data).ok()
        })
        .collect()
}

/// The events' sequence numbers run on from `first`, one by one.
fn assert_numbered_from(events: &[Value], first: u64) {
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (first..first + seqs.len() as u64).collect::<Vec<_>>());
}

fn message(id: &str, text: &str) -> Value {
    json!({"type": "message", "id": id, "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call(call_id: &str, name: &str, args: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id, "name": name, "arguments": args, "status": "completed"})
}

fn reasoning() -> Value {
    json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc=="})
}

#[test]
fn an_engine_call_is_resolved_and_the_continuation_continues_the_response() {
    let first = stream(
        "resp_1",
        &[
            reasoning(),
            call("c1", "context_recall", r#"{"handle":"call_7"}"#),
        ],
    );
    let second = stream("resp_2", &[message("msg_2", "a.txt held the config.")]);
    for cut in (0..first.len()).step_by(11) {
        let mut r = rounds(3);
        let (a, b) = first.as_bytes().split_at(cut);
        let mut out = r.push(a);
        out.extend(r.push(b));
        out.extend(r.finish());
        assert!(r.holding() && r.ended() && r.resolvable(), "cut {cut}");
        // The reasoning before the engine's call never reaches the client
        // (sent back without the call, the API would refuse it).
        let out = events(&out);
        let kinds: Vec<&str> = out.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["response.created", "response.in_progress"]);
        let next: Value = serde_json::from_slice(&r.next_request(&mut None)).unwrap();
        let input = next["input"].as_array().unwrap();
        assert_eq!(input.len(), 4);
        assert_eq!(input[1]["encrypted_content"], "enc==");
        assert_eq!(input[2]["name"], "context_recall");
        assert_eq!(input[3]["type"], "function_call_output");
        assert_eq!(input[3]["call_id"], "c1");
        assert_eq!(next["tools"].as_array().unwrap().len(), 2);

        let out = events(&r.push(second.as_bytes()));
        assert!(r.ended() && !r.holding());
        let kinds: Vec<&str> = out.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert!(!kinds.contains(&"response.created"), "{kinds:?}");
        // The message is the client's item 0, numbered on.
        assert!(
            out.iter()
                .filter_map(|e| e["output_index"].as_u64())
                .all(|i| i == 0)
        );
        assert_numbered_from(&out, 2);
        let done = out.last().unwrap();
        assert_eq!(done["type"], "response.completed");
        assert_eq!(done["response"]["id"], "resp_1");
        let output = done["response"]["output"].as_array().unwrap();
        assert_eq!(output.len(), 1, "the message only");
        assert_eq!(output[0]["id"], "msg_2");
        assert_eq!(done["response"]["usage"]["total_tokens"], 55);
    }
}

#[test]
fn reasoning_followed_by_the_clients_own_item_reaches_it_as_it_came() {
    let text = stream(
        "resp_1",
        &[reasoning(), call("c2", "shell", r#"{"command":["ls"]}"#)],
    );
    for cut in (0..text.len()).step_by(13) {
        let mut r = rounds(3);
        let (a, b) = text.as_bytes().split_at(cut);
        let mut out = r.push(a);
        out.extend(r.push(b));
        out.extend(r.finish());
        assert!(!r.holding(), "cut {cut}: released once the call showed");
        assert_eq!(out, text.as_bytes(), "cut {cut}: byte for byte");
    }
    // A response that ends on its reasoning: released at the end.
    let text = stream("resp_1", &[reasoning()]);
    let mut r = rounds(3);
    let mut out = r.push(text.as_bytes());
    assert!(r.holding() && r.ended() && !r.resolvable());
    out.extend(r.release_held());
    assert_eq!(events(&out), events(text.as_bytes()));
}

#[test]
fn a_continuations_reasoning_is_released_with_the_item_after_it() {
    let first = stream("resp_1", &[reasoning(), call("c1", "context_recall", "{}")]);
    let second = stream(
        "resp_2",
        &[reasoning(), message("msg_2", "a.txt held the config.")],
    );
    let mut r = rounds(3);
    let mut out = r.push(first.as_bytes());
    assert!(r.resolvable());
    r.next_request(&mut None);
    out.extend(r.push(second.as_bytes()));
    assert!(r.ended() && !r.holding());
    let out = events(&out);
    let added: Vec<(u64, &str)> = out
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .map(|e| {
            (
                e["output_index"].as_u64().unwrap(),
                e["item"]["type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(added, [(0, "reasoning"), (1, "message")]);
    assert_numbered_from(&out, 0);
    let done = out.last().unwrap();
    assert_eq!(done["response"]["output"].as_array().unwrap().len(), 2);
}

#[test]
fn mixed_calls_reach_the_client_without_the_engines_renumbered() {
    // The reasoning that led to the engine's call goes with it: sent back
    // without its call, the API would refuse it.
    let text = stream(
        "resp_1",
        &[
            reasoning(),
            call("c1", "context_recall", "{}"),
            call("c2", "shell", r#"{"command":["ls"]}"#),
        ],
    );
    let mut r = rounds(3);
    let mut out = r.push(text.as_bytes());
    assert!(r.holding() && r.ended() && !r.resolvable());
    out.extend(r.release_held());
    let out = events(&out);
    let added: Vec<&Value> = out
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .collect();
    assert_eq!(added.len(), 1);
    assert_eq!(added[0]["item"]["name"], "shell");
    assert_eq!(added[0]["output_index"], 0);
    assert_numbered_from(&out, 0);
    let done = out.last().unwrap();
    let output = done["response"]["output"].as_array().unwrap();
    assert_eq!(output.len(), 1);
    assert_eq!(output[0]["call_id"], "c2");
}

#[test]
fn an_engine_call_past_the_last_round_leaves_a_note() {
    let text = stream("resp_1", &[call("c1", "context_recall", "{}")]);
    let mut r = rounds(0);
    let mut out = r.push(text.as_bytes());
    assert!(r.holding() && !r.resolvable());
    out.extend(r.release_held());
    let out = events(&out);
    assert!(out.iter().all(|e| e["item"]["type"] != "function_call"));
    let done = out.last().unwrap();
    assert_eq!(
        done["response"]["output"][0]["content"][0]["text"],
        NOTHING_LEFT
    );
    let added = out
        .iter()
        .find(|e| e["type"] == "response.output_item.added")
        .unwrap();
    assert_eq!(added["output_index"], 0);
}

#[test]
fn server_side_calls_are_not_the_clients() {
    let t = tools();
    assert!(!is_client_call(&t, &json!({"type": "web_search_call"})));
    assert!(is_client_call(
        &t,
        &json!({"type": "custom_tool_call", "name": "apply_patch"})
    ));
    assert!(is_client_call(&t, &call("c", "shell", "{}")));
    assert!(!is_client_call(&t, &call("c", "context_recall", "{}")));
    assert!(is_engine_call(&t, &call("c", "context_recall", "{}")));
}

#[test]
fn chat_schemas_become_responses_tools() {
    let chat = json!({"type": "function", "function": {"name": "context_recall", "description": "d", "parameters": {"type": "object"}}});
    assert_eq!(
        responses_schema(&chat).unwrap(),
        json!({"type": "function", "name": "context_recall", "description": "d", "parameters": {"type": "object"}})
    );
}

#[test]
fn the_reasoning_before_a_dropped_engine_call_is_dropped_with_it() {
    let reasoning = json!({"type": "reasoning", "id": "rs_1", "encrypted_content": "gA"});
    let engine = json!({"type": "function_call", "call_id": "c1", "name": "context_recall", "arguments": "{}"});
    let client =
        json!({"type": "function_call", "call_id": "c2", "name": "shell", "arguments": "{}"});
    let message = json!({"type": "message", "role": "assistant", "content": []});
    let items = [
        reasoning.clone(),
        message.clone(),
        reasoning.clone(),
        reasoning.clone(),
        engine.clone(),
        reasoning.clone(),
        client.clone(),
        engine,
    ];
    let dropped = engine_items(&tools(), items.iter().map(Some));
    // The reasoning that led to the message and to the client's call stays;
    // the two before the first engine call go with it.
    assert_eq!(dropped.into_iter().collect::<Vec<_>>(), [2, 3, 4, 7]);
}
