use proptest::prelude::*;
use serde_json::{Value, json};

use super::bridge::{from_chat, to_chat};
use super::*;
use crate::requests::{claude_code_request, long_session};
use crate::validate::anthropic::{cut_points, thinking_changed, validate};
use crate::validate::{Profile, Rule};

#[test]
fn claude_code_request_round_trips_byte_for_byte() {
    let text = claude_code_request("ok");
    let request = Request::parse(&text).unwrap();
    assert_eq!(request.to_json_string(), text);
    assert_eq!(request.messages.len(), 8);
    assert!(matches!(request.system, Some(Content::Blocks(ref b)) if b.len() == 2));
    let kinds: Vec<_> = request.messages[3]
        .blocks()
        .iter()
        .map(Block::kind)
        .collect();
    assert_eq!(
        kinds[0],
        BlockKind::RedactedThinking {
            data: "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"
        }
    );
    assert!(matches!(
        kinds[1],
        BlockKind::ServerToolUse {
            id: "srvtoolu_1",
            ..
        }
    ));
    assert!(matches!(
        kinds[2],
        BlockKind::ServerToolResult {
            tool_use_id: "srvtoolu_1"
        }
    ));
    assert_eq!(
        request.messages[4].blocks()[2].kind(),
        BlockKind::Unknown(Some("future_block"))
    );
    assert!(validate(&request).is_empty(), "{:?}", validate(&request));
}

#[test]
fn malformed_requests_say_where() {
    let e = Request::parse(r#"{"messages": [{"role": "user", "content": "x"}, {"content": "y"}]}"#)
        .unwrap_err();
    assert_eq!(e.to_string(), "message 1: missing field `role`");
    let e = Request::parse(r#"{"messages": {}}"#).unwrap_err();
    assert_eq!(
        e.to_string(),
        "field `messages` must be an array, found an object"
    );
    assert!(Request::parse("[1]").is_err());
    assert!(
        Request::parse("{")
            .unwrap_err()
            .to_string()
            .starts_with("invalid JSON")
    );
    // A content of an unexpected type is kept, not judged by the parser.
    let text = r#"{"messages":[{"role":"user","content":7}]}"#;
    let r = Request::parse(text).unwrap();
    assert_eq!(r.messages[0].content, None);
    assert_eq!(r.to_json_string(), text);
}

/// Any small JSON value (shared with the Responses tests).
pub(crate) fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        "[a-z _]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,6}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn arb_block() -> impl Strategy<Value = Value> {
    let ty = prop_oneof![
        Just("text"),
        Just("tool_use"),
        Just("tool_result"),
        Just("thinking"),
        Just("redacted_thinking"),
        Just("image"),
        Just("mystery")
    ];
    (
        ty,
        prop::collection::vec(("[a-z_]{1,8}", arb_json()), 0..4),
        "[a-z]{0,6}",
    )
        .prop_map(|(ty, extra, s)| {
            let mut m = serde_json::Map::new();
            for (k, v) in extra {
                m.insert(k, v);
            }
            m.insert("type".into(), ty.into());
            match ty {
                "text" => drop(m.insert("text".into(), s.into())),
                "tool_use" => {
                    m.insert("id".into(), s.clone().into());
                    m.insert("name".into(), "Bash".into());
                }
                "tool_result" => drop(m.insert("tool_use_id".into(), s.into())),
                "thinking" => drop(m.insert("signature".into(), s.into())),
                _ => {}
            }
            Value::Object(m)
        })
}

fn arb_request() -> impl Strategy<Value = Value> {
    let content = prop_oneof![
        "[a-z ]{0,10}".prop_map(Value::String),
        prop::collection::vec(arb_block(), 0..4).prop_map(Value::Array),
        arb_json(),
    ];
    let message = (
        prop_oneof![Just("user"), Just("assistant"), Just("system")],
        prop::option::of(content),
        prop::collection::vec(("[a-z_]{1,8}", arb_json()), 0..2),
        any::<bool>(),
    )
        .prop_map(|(role, content, extra, content_first)| {
            let mut m = serde_json::Map::new();
            if content_first && let Some(c) = content.clone() {
                m.insert("content".into(), c);
            }
            m.insert("role".into(), role.into());
            for (k, v) in extra {
                m.insert(k, v);
            }
            if let Some(c) = content {
                m.entry("content").or_insert(c);
            }
            Value::Object(m)
        });
    (
        prop::collection::vec(message, 0..6),
        prop::option::of(prop_oneof![
            "[a-z ]{0,10}".prop_map(Value::String),
            prop::collection::vec(arb_block(), 0..3).prop_map(Value::Array)
        ]),
        prop::collection::vec(("[a-z_]{1,8}", arb_json()), 0..3),
    )
        .prop_map(|(messages, system, extra)| {
            let mut m = serde_json::Map::new();
            for (k, v) in extra {
                m.insert(k, v);
            }
            if let Some(s) = system {
                m.insert("system".into(), s);
            }
            m.insert("messages".into(), Value::Array(messages));
            Value::Object(m)
        })
}

proptest! {
    #[test]
    fn generated_requests_round_trip(value in arb_request()) {
        let text = value.to_string();
        let request = Request::parse(&text).unwrap();
        prop_assert_eq!(request.to_json_string(), text.clone());
        // And a no-op pass through the bridge changes nothing.
        let bridged = to_chat(&request);
        let back = from_chat(&request, &bridged, &bridged.messages);
        prop_assert_eq!(back.to_json_string(), text);
    }
}

#[test]
fn no_op_bridge_returns_the_exact_bytes() {
    let text = claude_code_request(&"line of output\n".repeat(400));
    let request = Request::parse(&text).unwrap();
    let bridged = to_chat(&request);
    // System, 1 user, 1 assistant, 2 tool + 1 user, assistant, tool + user,
    // system, assistant, user.
    assert_eq!(bridged.messages.len(), 12);
    assert!(crate::validate::validate(&bridged.messages, Profile::OpenAi).is_empty());
    let back = from_chat(&request, &bridged, &bridged.messages);
    assert_eq!(back.to_json_string(), text);
}

/// The compressor prepends its summary to the first tail message when
/// both roles would collide; a tool-calling turn with no text block gets
/// the summary as a new text block after its thinking, never dropped.
#[test]
fn text_prepended_to_a_tool_turn_without_text_is_kept() {
    let text = json!({"model": "m", "messages": [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "a"}]}
    ]})
    .to_string();
    let request = Request::parse(&text).unwrap();
    let bridged = to_chat(&request);
    let mut out = bridged.messages.clone();
    out[1].content = crate::message::Content::Text("[summary]".into());
    let back = from_chat(&request, &bridged, &out).to_value();
    let blocks = &back["messages"][1]["content"];
    assert_eq!(blocks[0]["type"], "thinking");
    assert_eq!(blocks[1], json!({"type": "text", "text": "[summary]"}));
    assert_eq!(blocks[2]["type"], "tool_use");
    assert!(thinking_changed(&request, &Request::from_value(back).unwrap()).is_empty());
}

#[test]
fn rules_report_each_violation_with_its_index() {
    let parse = |v: Value| Request::from_value(v).unwrap();
    let rules = |r: &Request| -> Vec<(usize, Rule)> {
        validate(r).into_iter().map(|v| (v.index, v.rule)).collect()
    };
    let call = |id: &str| json!({"type": "tool_use", "id": id, "name": "Bash", "input": {}});
    let result = |id: &str| json!({"type": "tool_result", "tool_use_id": id, "content": "x"});
    // Unanswered, and a result after text.
    let r = parse(json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [call("a"), call("b")]},
        {"role": "user", "content": [result("a"), {"type": "text", "text": "x"}, result("b")]}
    ]}));
    assert_eq!(rules(&r), vec![(2, Rule::ToolResultNotFirst)]);
    let r = parse(json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [call("a"), call("b")]},
        {"role": "user", "content": [result("a"), result("a"), result("z")]}
    ]}));
    assert_eq!(
        rules(&r),
        vec![
            (1, Rule::UnansweredToolCall),
            (2, Rule::DuplicateToolResult),
            (2, Rule::OrphanToolResult)
        ]
    );
    // Alternation, first message, unknown role, duplicate ids.
    let r = parse(json!({"messages": [
        {"role": "assistant", "content": "hi"},
        {"role": "assistant", "content": [call("a")]},
        {"role": "user", "content": [result("a")]},
        {"role": "tool", "content": "x"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": [call("a")]}
    ]}));
    assert_eq!(
        rules(&r),
        vec![
            (0, Rule::FirstNotUser),
            (1, Rule::ConsecutiveSameRole),
            (3, Rule::UnknownRole),
            (4, Rule::ConsecutiveSameRole),
            (5, Rule::DuplicateToolCallId),
            (5, Rule::UnansweredToolCall)
        ]
    );
}

#[test]
fn changed_thinking_is_reported() {
    let text = claude_code_request("ok");
    let before = Request::parse(&text).unwrap();
    let mut after = before.clone();
    if let Some(Content::Blocks(b)) = after.messages[1].content.as_mut() {
        b[0].as_map_mut()
            .insert("signature".into(), "forged".into());
    }
    let v = thinking_changed(&before, &after);
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].index, v[0].rule), (1, Rule::ThinkingChanged));
}

#[test]
fn cut_points_keep_calls_with_their_results() {
    let request = Request::parse(&long_session(3)).unwrap();
    let cuts = cut_points(&request);
    // user, (a, u) x3, a, u: boundaries inside a call/result pair are unsafe.
    let safe: Vec<usize> = cuts.iter().collect();
    assert_eq!(safe, vec![0, 1, 3, 5, 7, 8, 9]);
    // Removing one call group keeps alternation; removing an odd span not.
    assert!(cuts.can_remove(1, 3));
    assert!(!cuts.can_remove(1, 8));
}

/// A valid session: per turn, 1..3 parallel calls (with thinking) answered
/// in the next user message, sometimes followed by the user's text.
fn arb_session() -> impl Strategy<Value = String> {
    prop::collection::vec((1usize..4, any::<bool>()), 1..8).prop_map(|turns| {
        let mut messages = vec![json!({"role": "user", "content": "task"})];
        for (t, (calls, text_after)) in turns.into_iter().enumerate() {
            let mut blocks = vec![json!({"type": "thinking", "thinking": "hm", "signature": format!("s{t}")})];
            let mut results = Vec::new();
            for c in 0..calls {
                let id = format!("toolu_{t}_{c}");
                blocks.push(json!({"type": "tool_use", "id": id, "name": "Bash", "input": {"n": c}}));
                results.push(json!({"type": "tool_result", "tool_use_id": id, "content": "out"}));
            }
            if text_after {
                results.push(json!({"type": "text", "text": "and then?", "cache_control": {"type": "ephemeral"}}));
            }
            messages.push(json!({"role": "assistant", "content": blocks}));
            messages.push(json!({"role": "user", "content": results}));
        }
        messages.push(json!({"role": "assistant", "content": "done"}));
        json!({"system": "sys", "messages": messages}).to_string()
    })
}

proptest! {
    /// Removing any span the strict cut points allow, with or without a
    /// summary in its place, gives a valid Anthropic request whose thinking
    /// blocks are untouched.
    #[test]
    fn removing_a_safe_span_keeps_the_request_valid(
        text in arb_session(),
        a in 0usize..40,
        len in 0usize..40,
        summary in any::<bool>(),
    ) {
        let request = Request::parse(&text).unwrap();
        prop_assert!(validate(&request).is_empty());
        let bridged = to_chat(&request);
        let cuts = crate::validate::CutPoints::with_profile(&bridged.messages, Profile::Strict, crate::validate::auto_text_actions());
        let n = bridged.messages.len();
        // Two safe boundaries after the system prompt.
        let safe: Vec<usize> = cuts.iter().filter(|&i| i >= 1).collect();
        let (x, y) = (safe[a % safe.len()], safe[len % safe.len()]);
        let (a, b) = (x.min(y), x.max(y));
        prop_assume!(a < n && cuts.can_remove(a, b));
        let mut out: Vec<_> = bridged.messages[..a].to_vec();
        if summary && a < b {
            out.push(crate::message::Message::user("summary of the span"));
        }
        out.extend_from_slice(&bridged.messages[b..]);
        let back = from_chat(&request, &bridged, &out);
        prop_assert!(validate(&back).is_empty(), "{:?}\n{}", validate(&back), back.to_json_string());
        prop_assert!(thinking_changed(&request, &back).is_empty());
    }
}
