use proptest::prelude::*;
use serde_json::{Value, json};

use super::bridge::{from_chat, to_chat};
use super::*;
use crate::anthropic::tests::arb_json;
use crate::requests::{codex_request, long_codex};
use crate::validate::responses::{cut_points, validate};
use crate::validate::{Profile, Rule};

#[test]
fn codex_request_round_trips_and_validates() {
    let text = codex_request("ok");
    let request = Request::parse(&text).unwrap();
    assert_eq!(request.to_json_string(), text);
    let items = request.items();
    assert_eq!(items.len(), 16);
    assert_eq!(
        items[2].kind(),
        ItemKind::Reasoning {
            encrypted_content: Some("gAAAAABo+enc==")
        }
    );
    assert!(matches!(
        items[8].kind(),
        ItemKind::Call {
            call_id: "call_3",
            name: Some("apply_patch")
        }
    ));
    assert!(matches!(
        items[10].kind(),
        ItemKind::Call {
            call_id: "call_4",
            name: None
        }
    ));
    assert_eq!(items[12].kind(), ItemKind::Other(Some("web_search_call")));
    assert!(matches!(
        items[15].kind(),
        ItemKind::Message { role: "user", .. }
    ));
    assert!(validate(&request).is_empty(), "{:?}", validate(&request));
    assert_eq!(request.previous_response_id(), None);
}

#[test]
fn string_input_and_bad_shapes() {
    let text = r#"{"model":"m","input":"hello","previous_response_id":"resp_1"}"#;
    let r = Request::parse(text).unwrap();
    assert_eq!(r.to_json_string(), text);
    assert_eq!(r.previous_response_id(), Some("resp_1"));
    let b = to_chat(&r);
    assert_eq!(b.messages.len(), 1);
    assert_eq!(from_chat(&r, &b, &b.messages).to_json_string(), text);
    assert_eq!(
        Request::parse(r#"{"input":[{"type":"message"},3]}"#)
            .unwrap_err()
            .to_string(),
        "input item 1: expected a JSON object, found a number"
    );
    assert_eq!(
        Request::parse(r#"{"model":"m"}"#).unwrap_err().to_string(),
        "missing field `input`"
    );
}

fn arb_item() -> impl Strategy<Value = Value> {
    let ty = prop_oneof![
        Just("message"),
        Just("function_call"),
        Just("function_call_output"),
        Just("reasoning"),
        Just("custom_tool_call"),
        Just("web_search_call"),
        Just("mystery"),
    ];
    (
        ty,
        prop::collection::vec(("[a-z_]{1,8}", arb_json()), 0..3),
        "c[0-3]",
        prop_oneof![
            "[a-z ]{0,8}".prop_map(Value::String),
            Just(json!([{"type": "input_text", "text": "hi"}]))
        ],
    )
        .prop_map(|(ty, extra, id, content)| {
            let mut m = serde_json::Map::new();
            m.insert("type".into(), ty.into());
            for (k, v) in extra {
                m.insert(k, v);
            }
            match ty {
                "message" => {
                    m.insert("role".into(), "user".into());
                    m.insert("content".into(), content);
                }
                "function_call" | "custom_tool_call" => {
                    m.insert("call_id".into(), id.into());
                    m.insert("name".into(), "shell".into());
                    m.insert("arguments".into(), "{}".into());
                }
                "function_call_output" => {
                    m.insert("call_id".into(), id.into());
                    m.insert("output".into(), content);
                }
                _ => {}
            }
            Value::Object(m)
        })
}

proptest! {
    #[test]
    fn generated_requests_round_trip(
        items in prop::collection::vec(arb_item(), 0..8),
        extra in prop::collection::vec(("[a-z_]{1,8}", arb_json()), 0..3),
    ) {
        let mut m = serde_json::Map::new();
        for (k, v) in extra {
            m.insert(k, v);
        }
        m.insert("input".into(), Value::Array(items));
        let text = Value::Object(m).to_string();
        let request = Request::parse(&text).unwrap();
        prop_assert_eq!(request.to_json_string(), text.clone());
        let bridged = to_chat(&request);
        let back = from_chat(&request, &bridged, &bridged.messages);
        prop_assert_eq!(back.to_json_string(), text);
    }
}

#[test]
fn no_op_bridge_returns_the_exact_bytes() {
    let text = codex_request(&"output line\n".repeat(500));
    let request = Request::parse(&text).unwrap();
    let bridged = to_chat(&request);
    assert!(crate::validate::validate(&bridged.messages, Profile::OpenAi).is_empty());
    let back = from_chat(&request, &bridged, &bridged.messages);
    assert_eq!(back.to_json_string(), text);
}

#[test]
fn text_given_to_a_tool_calling_turn_is_kept_as_a_message_item() {
    // A summary merged into a turn of reasoning + call (no message item):
    // its text must reach the request, before the turn's items.
    let text = long_codex(3);
    let request = Request::parse(&text).unwrap();
    let bridged = to_chat(&request);
    let j = bridged
        .messages
        .iter()
        .position(|m| m.has_tool_calls())
        .unwrap();
    let mut out = bridged.messages.clone();
    out[j].content = crate::message::Content::Text("SUMMARY of earlier turns".into());
    let back = from_chat(&request, &bridged, &out);
    assert!(validate(&back).is_empty(), "{:#?}", validate(&back));
    let v = back.to_value();
    let items = v["input"].as_array().unwrap();
    let k = items
        .iter()
        .position(|i| i.to_string().contains("SUMMARY of earlier turns"))
        .expect("the merged text is in the request");
    assert_eq!(items[k]["type"], "message");
    assert_eq!(items[k]["role"], "assistant");
    assert_eq!(items[k + 1]["type"], "reasoning");
    assert_eq!(items[k + 2]["type"], "function_call");
    // Read back, the turn is the one message the engine wrote: a replay
    // of the engine's output counts what the proxy sends.
    let again = to_chat(&back);
    assert_eq!(again.messages.len(), out.len());
    assert_eq!(again.messages[j].text(), "SUMMARY of earlier turns");
    assert_eq!(again.messages[j].tool_calls(), out[j].tool_calls());
}

#[test]
fn an_assistant_message_and_the_calls_after_it_are_one_turn() {
    // One response's output: reasoning, a message, a call. As in chat
    // completions and Anthropic, one chat message (one model call).
    let input = json!([
        {"type": "message", "role": "user", "content": "fix the parser"},
        {"type": "reasoning", "summary": [], "encrypted_content": "e0"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "e1"},
        {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c0"},
        {"type": "function_call_output", "call_id": "c0", "output": "ok"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        {"type": "message", "role": "user", "content": "thanks"}
    ]);
    let text = json!({"instructions": "sys", "input": input}).to_string();
    let request = Request::parse(&text).unwrap();
    let bridged = to_chat(&request);
    let roles: Vec<&str> = bridged.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "assistant", "user"]
    );
    assert_eq!(bridged.origins[2], bridge::Origin::Items(vec![1, 2, 3, 4]));
    assert_eq!(bridged.messages[2].text(), "Looking.");
    assert_eq!(bridged.messages[2].tool_calls().len(), 1);
    // A message not followed by calls stays a message of its own.
    assert!(!bridged.messages[4].has_tool_calls());
    // The no-op bridge gives back the exact bytes.
    let back = from_chat(&request, &bridged, &bridged.messages);
    assert_eq!(back.to_json_string(), text);
    // The engine's text on the turn patches the message item only.
    let mut out = bridged.messages.clone();
    out[2].content = crate::message::Content::Text("SUMMARY\n\nLooking.".into());
    let back = from_chat(&request, &bridged, &out);
    assert!(validate(&back).is_empty(), "{:#?}", validate(&back));
    assert_eq!(back.items().len(), request.items().len());
    assert_eq!(back.items()[1], request.items()[1], "reasoning untouched");
    assert_eq!(back.items()[4], request.items()[4], "call untouched");
    assert_eq!(to_chat(&back).messages[2].text(), "SUMMARY\n\nLooking.");
    // Read a call at a time (a proxy's cache), the message joins the calls
    // that arrive after it.
    let cut = |n: usize| {
        let mut r = request.clone();
        r.input = Input::Items(request.items()[..n].to_vec());
        r
    };
    for n in 1..=request.items().len() {
        let (whole, _) = bridge::to_chat_from(&request, to_chat(&cut(n)), n);
        assert_eq!(whole, bridged, "{n} items read first");
    }
}

#[test]
fn rules_report_each_violation_with_its_index() {
    let parse = |v: Value| Request::from_value(v).unwrap();
    let rules = |r: &Request| -> Vec<(usize, Rule)> {
        validate(r).into_iter().map(|v| (v.index, v.rule)).collect()
    };
    let call = |id: &str| json!({"type": "function_call", "name": "shell", "arguments": "{}", "call_id": id});
    let out = |id: &str| json!({"type": "function_call_output", "call_id": id, "output": "x"});
    let r = parse(json!({"input": [
        out("z"),
        call("a"),
        call("a"),
        out("a"),
        out("a"),
        {"type": "reasoning", "encrypted_content": "e"},
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "exit", "content": "hi"},
        call("b"),
        {"type": "reasoning", "encrypted_content": "e"}
    ]}));
    assert_eq!(
        rules(&r),
        vec![
            (0, Rule::OrphanToolResult),
            (2, Rule::DuplicateToolCallId),
            (4, Rule::DuplicateToolResult),
            (5, Rule::ReasoningNotFollowed),
            (7, Rule::UnknownRole),
            (8, Rule::UnansweredToolCall),
            (9, Rule::ReasoningNotFollowed)
        ]
    );
    // An output before its call does not answer it.
    let r = parse(json!({"input": [out("a"), call("a")]}));
    assert_eq!(
        rules(&r),
        vec![(0, Rule::OrphanToolResult), (1, Rule::UnansweredToolCall)]
    );
}

#[test]
fn cut_points_keep_reasoning_calls_and_outputs_together() {
    let request = Request::parse(&long_codex(2)).unwrap();
    // user, (reasoning, call, output) x2, assistant, user.
    let safe: Vec<usize> = cut_points(&request).iter().collect();
    assert_eq!(safe, vec![0, 1, 4, 7, 8, 9]);
    let request = Request::parse(&codex_request("x")).unwrap();
    let safe: Vec<usize> = cut_points(&request).iter().collect();
    // Reasoning + parallel calls + outputs (2..7) stay together, the web
    // search and the unknown item stay with the local shell call before them.
    assert_eq!(safe, vec![0, 1, 2, 7, 10, 14, 15, 16]);
}

/// A valid Codex-like input: per turn, reasoning, 1..3 calls and their
/// outputs, sometimes a web search and an assistant message.
fn arb_session() -> impl Strategy<Value = String> {
    prop::collection::vec((1usize..4, any::<bool>()), 1..8).prop_map(|turns| {
        let mut input = vec![json!({"type": "message", "role": "user", "content": "task"})];
        for (t, (calls, extra)) in turns.into_iter().enumerate() {
            input.push(json!({"type": "reasoning", "summary": [], "encrypted_content": format!("e{t}")}));
            for c in 0..calls {
                input.push(json!({"type": "function_call", "name": "shell", "arguments": "{}", "call_id": format!("c{t}_{c}")}));
            }
            for c in 0..calls {
                input.push(json!({"type": "function_call_output", "call_id": format!("c{t}_{c}"), "output": "ok"}));
            }
            if extra {
                input.push(json!({"type": "web_search_call", "id": format!("ws{t}"), "status": "completed"}));
                input.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "so far"}]}));
            }
        }
        json!({"instructions": "sys", "input": input}).to_string()
    })
}

proptest! {
    /// Removing any span the chat cut points allow, with or without a
    /// summary, gives a valid Responses input; reasoning stays with its call.
    #[test]
    fn removing_a_safe_span_keeps_the_input_valid(
        text in arb_session(),
        x in 0usize..40,
        y in 0usize..40,
        summary in any::<bool>(),
    ) {
        let request = Request::parse(&text).unwrap();
        prop_assert!(validate(&request).is_empty());
        let bridged = to_chat(&request);
        let cuts = crate::validate::CutPoints::new(&bridged.messages, crate::validate::auto_text_actions());
        let safe: Vec<usize> = cuts.iter().filter(|&i| i >= 1).collect();
        let (x, y) = (safe[x % safe.len()], safe[y % safe.len()]);
        let (a, b) = (x.min(y), x.max(y));
        let mut out: Vec<_> = bridged.messages[..a].to_vec();
        if summary && a < b {
            out.push(crate::message::Message::user("summary of the span"));
        }
        out.extend_from_slice(&bridged.messages[b..]);
        let back = from_chat(&request, &bridged, &out);
        prop_assert!(validate(&back).is_empty(), "{:?}\n{}", validate(&back), back.to_json_string());
        // Every encrypted reasoning item kept is byte-identical.
        for item in back.items() {
            if let ItemKind::Reasoning { encrypted_content } = item.kind() {
                prop_assert!(request.items().iter().any(|o| o == item), "{:?}", encrypted_content);
            }
        }
    }
}
