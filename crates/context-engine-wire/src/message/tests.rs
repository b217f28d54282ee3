use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

/// Parses then serializes, and checks the JSON text is identical (same keys,
/// same order, same null/absent).
fn round_trip(value: &Value) -> Message {
    let message = Message::from_value(value.clone()).unwrap();
    assert_eq!(
        serde_json::to_string(&message).unwrap(),
        serde_json::to_string(value).unwrap()
    );
    message
}

#[test]
fn keeps_key_order_unknown_fields_and_null_content() {
    let v = json!({
        "content": null, "role": "assistant",
        "tool_calls": [{"index": 0, "function": {"arguments": "{}", "name": "bash"}, "id": "c1", "type": "function"}],
        "function_call": null, "provider_specific_fields": null, "extra": {"k": [1, 2.5]}
    });
    let m = round_trip(&v);
    assert_eq!(m.role, Role::Assistant);
    assert_eq!(m.content, Content::Null);
    assert_eq!(m.tool_calls()[0].name(), Some("bash"));
    assert_eq!(m.tool_calls()[0].id.as_deref(), Some("c1"));
    assert!(
        m.function_call.is_none(),
        "null function_call is kept in extra"
    );
    assert_eq!(m.extra.get("function_call"), Some(&Value::Null));
}

#[test]
fn absent_content_stays_absent() {
    let m = round_trip(&json!({"role": "assistant", "tool_calls": []}));
    assert_eq!(m.content, Content::Absent);
    assert!(!m.has_tool_calls());
}

#[test]
fn unknown_role_is_kept() {
    let m =
        round_trip(&json!({"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}}));
    assert_eq!(m.role, Role::Other("exit".into()));
}

#[test]
fn parts_are_typed_and_kept() {
    let v = json!({"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}, "type": "image_url"},
        {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}},
        {"type": "file", "file": {"file_id": "f1"}},
        {"type": "hologram", "beam": 3}
    ]});
    let m = round_trip(&v);
    let kinds: Vec<_> = m.content.parts().iter().map(ContentPart::kind).collect();
    assert_eq!(kinds[0], PartKind::Text("look"));
    assert_eq!(
        kinds[1],
        PartKind::ImageUrl {
            url: "data:image/png;base64,AAAA",
            detail: Some("low")
        }
    );
    assert_eq!(
        kinds[2],
        PartKind::InputAudio {
            data: "UklG",
            format: Some("wav")
        }
    );
    assert!(matches!(
        kinds[3],
        PartKind::File {
            file_id: Some("f1"),
            ..
        }
    ));
    assert_eq!(kinds[4], PartKind::Unknown(Some("hologram")));
    assert_eq!(m.text(), "look");
}

#[test]
fn ill_typed_known_fields_go_to_extra() {
    let v = json!({"role": "tool", "tool_call_id": 7, "content": {"weird": true}, "name": null});
    let m = round_trip(&v);
    assert!(m.tool_call_id.is_none());
    assert_eq!(m.content, Content::Absent);
    assert_eq!(m.extra.len(), 3);
}

#[test]
fn tool_call_with_object_arguments_keeps_function_in_extra() {
    let v = json!({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {"x": 1}}}]});
    let m = round_trip(&v);
    assert!(m.tool_calls()[0].function.is_none());
    assert!(m.tool_calls()[0].extra.contains_key("function"));
}

#[test]
fn fields_set_after_loading_are_written_once() {
    let mut m =
        Message::from_value(json!({"role": "tool", "tool_call_id": null, "content": "x"})).unwrap();
    m.tool_call_id = Some("c9".into());
    m.extra.insert("note".into(), json!(1));
    let out = serde_json::to_string(&m).unwrap();
    assert_eq!(
        out,
        r#"{"role":"tool","tool_call_id":"c9","content":"x","note":1}"#
    );
}

#[test]
fn built_messages_serialize_canonically() {
    let m = Message::assistant_tool_calls(
        "",
        vec![ToolCall::function("c1", "bash", "{\"cmd\":\"ls\"}")],
    );
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\"}"}}]}"#
    );
    let r = Message::tool_result("c1", "ok");
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"role":"tool","content":"ok","tool_call_id":"c1"}"#
    );
}

#[test]
fn shape_errors_name_the_field() {
    assert_eq!(
        Message::from_value(json!([1])),
        Err(ShapeError::NotAnObject { found: "an array" })
    );
    assert_eq!(
        Message::from_value(json!({"content": "x"})),
        Err(ShapeError::MissingRole)
    );
    let e = Message::from_value(json!({"role": 3})).unwrap_err();
    assert_eq!(e.field(), Some("role"));
    assert_eq!(
        e.to_string(),
        "field `role` must be a string, found a number"
    );
}

#[test]
fn text_joins_text_parts() {
    let m = Message::new(
        Role::User,
        Content::Parts(vec![
            ContentPart::new_text("a"),
            ContentPart::new_image_url("http://x/i.png"),
            ContentPart::new_text("b"),
        ]),
    );
    assert_eq!(m.text(), "a\nb");
    assert!(m.content.parts()[1].is_binary());
}

// ---- property test: generated messages round-trip exactly ----

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,6}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// An object whose keys come from `known` (with values from `typed`) and from
/// random names, in random order.
fn object_of(known: Vec<(&'static str, BoxedStrategy<Value>)>) -> impl Strategy<Value = Value> {
    let picks: Vec<_> = known
        .into_iter()
        .map(|(k, s)| prop::option::of(s.prop_map(move |v| (k.to_string(), v))))
        .collect();
    (
        picks,
        prop::collection::vec(("[a-z_]{1,8}", json_value()), 0..4),
    )
        .prop_flat_map(|(picked, extra)| {
            let mut entries: Vec<(String, Value)> = picked.into_iter().flatten().collect();
            entries.extend(extra);
            Just(entries).prop_shuffle()
        })
        .prop_map(|entries| Value::Object(entries.into_iter().collect()))
}

fn function_value() -> BoxedStrategy<Value> {
    prop_oneof![
        object_of(vec![
            ("name", ".{0,8}".prop_map(Value::String).boxed()),
            ("arguments", ".{0,16}".prop_map(Value::String).boxed())
        ]),
        json_value(),
    ]
    .boxed()
}

fn part_value() -> BoxedStrategy<Value> {
    let ty = prop_oneof![
        Just("text"),
        Just("image_url"),
        Just("input_audio"),
        Just("file"),
        Just("refusal"),
        Just("other")
    ]
    .prop_map(Value::from)
    .boxed();
    object_of(vec![
        ("type", ty),
        ("text", ".{0,8}".prop_map(Value::String).boxed()),
        (
            "image_url",
            object_of(vec![("url", ".{0,8}".prop_map(Value::String).boxed())]).boxed(),
        ),
    ])
    .boxed()
}

fn message_value() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        Just("system"),
        Just("developer"),
        Just("user"),
        Just("assistant"),
        Just("tool"),
        Just("exit")
    ]
    .prop_map(Value::from)
    .boxed();
    let content = prop_oneof![
        Just(Value::Null),
        ".{0,20}".prop_map(Value::String),
        prop::collection::vec(part_value(), 0..3).prop_map(Value::Array),
        json_value(),
    ]
    .boxed();
    let call = object_of(vec![
        ("id", ".{0,6}".prop_map(Value::String).boxed()),
        ("type", Just(Value::from("function")).boxed()),
        ("function", function_value()),
    ]);
    let calls = prop_oneof![
        prop::collection::vec(call, 0..3).prop_map(Value::Array),
        json_value()
    ]
    .boxed();
    let string_or_any = || prop_oneof![".{0,8}".prop_map(Value::String), json_value()].boxed();
    object_of(vec![
        ("content", content),
        ("name", string_or_any()),
        ("tool_calls", calls),
        ("tool_call_id", string_or_any()),
        ("function_call", function_value()),
        ("reasoning_content", string_or_any()),
    ])
    .prop_flat_map(move |v| (Just(v), role.clone(), 0..8usize))
    .prop_map(|(v, role, at)| {
        // Insert `role` at a random position.
        let Value::Object(m) = v else { unreachable!() };
        let mut entries: Vec<(String, Value)> =
            m.into_iter().filter(|(k, _)| k != "role").collect();
        let at = at.min(entries.len());
        entries.insert(at, ("role".into(), role));
        Value::Object(entries.into_iter().collect())
    })
}

proptest! {
    #[test]
    fn generated_messages_round_trip(v in message_value()) {
        let m = Message::from_value(v.clone()).unwrap();
        prop_assert_eq!(serde_json::to_string(&m).unwrap(), serde_json::to_string(&v).unwrap());
        // And a second pass is stable.
        let again = Message::from_value(m.to_value()).unwrap();
        prop_assert_eq!(again, m);
    }
}
