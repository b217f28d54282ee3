use serde_json::{Value, json};

use super::*;
use crate::message::Content;

fn parse(text: &str) -> Transcript {
    Transcript::parse(text, "t.json").unwrap()
}

fn err(text: &str) -> LoadError {
    Transcript::parse(text, "t.json").unwrap_err()
}

fn same_json(a: &str, b: &str) {
    let a: Value = serde_json::from_str(a).unwrap();
    let b: Value = serde_json::from_str(b).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_string(), b.to_string(), "key order differs");
}

#[test]
fn detects_each_format_by_content() {
    let msg = r#"{"role":"user","content":"hi"}"#;
    assert_eq!(parse(&format!("[{msg}]")).format, Format::Array);
    assert_eq!(
        parse(&format!(r#"{{"info":1,"messages":[{msg}]}}"#)).format,
        Format::MiniSweAgent
    );
    assert_eq!(
        parse(&format!(r#"{{"history":[{msg}],"info":{{}}}}"#)).format,
        Format::SweAgent
    );
    let jsonl = parse(&format!("{msg}\n\n{msg}\r\n"));
    assert_eq!(jsonl.format, Format::JsonLines);
    assert_eq!(jsonl.messages.len(), 2);
    let single = parse(msg);
    assert_eq!(single.format, Format::JsonLines);
    assert_eq!(single.messages[0].text(), "hi");
}

#[test]
fn messages_array_wins_over_history_and_history_is_kept() {
    let t = parse(r#"{"history":[{"role":"user"}],"messages":[{"role":"system"}]}"#);
    assert_eq!(t.format, Format::MiniSweAgent);
    assert_eq!(t.messages[0].role, Role::System);
    assert!(t.metadata().contains_key("history"));
    same_json(
        &t.to_json_string(),
        r#"{"history":[{"role":"user"}],"messages":[{"role":"system"}]}"#,
    );
}

#[test]
fn envelope_keeps_other_keys_in_order() {
    let text = r#"{"info":{"a":1},"messages":[{"role":"user","content":null}],"trajectory_format":"mini-swe-agent-1","instance_id":"x"}"#;
    let t = parse(text);
    let keys: Vec<_> = t.metadata().keys().cloned().collect();
    assert_eq!(keys, ["info", "trajectory_format", "instance_id"]);
    assert_eq!(t.messages[0].content, Content::Null);
    assert_eq!(t.to_json_string(), text);
}

#[test]
fn forced_format_is_obeyed() {
    let msg = r#"{"role":"user","content":"hi"}"#;
    // One message object parsed as JSON Lines even though it has a `messages` key.
    let odd = r#"{"role":"user","messages":[]}"#;
    assert_eq!(parse(odd).format, Format::MiniSweAgent);
    let t = Transcript::parse_as(odd, "t", Format::JsonLines).unwrap();
    assert_eq!(t.format, Format::JsonLines);
    assert_eq!(t.messages.len(), 1);

    let e = Transcript::parse_as(format!("[{msg}]"), "t", Format::SweAgent).unwrap_err();
    assert!(e.to_string().contains("`history`"), "{e}");
    let e =
        Transcript::parse_as(format!(r#"{{"messages":[{msg}]}}"#), "t", Format::Array).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t: expected a JSON array of messages, found keys messages"
    );
    let e = Transcript::parse_as(format!(r#"{{"messages":[{msg}]}}"#), "t", Format::SweAgent)
        .unwrap_err();
    assert!(e.to_string().contains("found keys messages"), "{e}");
}

#[test]
fn format_names_round_trip() {
    for f in Format::ALL {
        assert_eq!(f.name().parse::<Format>(), Ok(f));
    }
    assert_eq!("NDJSON".parse::<Format>(), Ok(Format::JsonLines));
    assert_eq!("traj".parse::<Format>(), Ok(Format::SweAgent));
    assert!("yaml".parse::<Format>().is_err());
}

#[test]
fn shape_error_names_message_and_field() {
    let e = Transcript::parse(
        r#"[{"role":"system"},{"role":"user"},{"content":"x"}]"#,
        "examples/x.json",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "examples/x.json: message 2: missing field `role`"
    );
    assert_eq!(e.message_index(), Some(2));
    assert_eq!(e.field(), Some("role"));

    let e = Transcript::parse("{\"role\":\"user\"}\n\n{\"role\":3}\n", "x.jsonl").unwrap_err();
    assert_eq!(
        e.to_string(),
        "x.jsonl: message 1 (line 3): field `role` must be a string, found a number"
    );
    assert_eq!(e.line(), Some(3));
}

#[test]
fn syntax_errors_give_line_and_column() {
    let e = err("[\n  {\"role\": \"user\",}\n]");
    match &e {
        LoadError::Json {
            line,
            column,
            truncated,
            ..
        } => {
            assert_eq!((*line, *column), (2, 19));
            assert!(!truncated);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        e.to_string().starts_with("t.json: line 2, column 19: "),
        "{e}"
    );

    let e = err("[{\"role\": \"user\"");
    assert!(
        matches!(
            e,
            LoadError::Json {
                truncated: true,
                ..
            }
        ),
        "{e:?}"
    );

    // JSON Lines: the line of the file, the column within it.
    let e =
        Transcript::parse("{\"role\":\"user\"}\n\n{\"role\" \"user\"}\n", "x.jsonl").unwrap_err();
    assert_eq!(e.line(), Some(3));
    assert!(
        e.to_string().starts_with("x.jsonl: line 3, column 9: "),
        "{e}"
    );
}

#[test]
fn top_level_mistakes_are_explained() {
    assert!(matches!(err(""), LoadError::Empty { .. }));
    assert!(matches!(err(" \n\t\r\n"), LoadError::Empty { .. }));
    assert!(matches!(
        Transcript::parse_as("\n\n", "t", Format::JsonLines).unwrap_err(),
        LoadError::Empty { .. }
    ));
    let e = err(r#"{"a":1,"b":2,"c":3}"#);
    assert!(e.to_string().ends_with("found keys a, b, c"), "{e}");
    assert!(err("{}").to_string().ends_with("found an empty object"));
    assert!(err("42").to_string().ends_with("found a number"));
    let e = err(r#"{"messages":"nope"}"#);
    assert_eq!(
        e.to_string(),
        "t.json: field `messages` must be an array of messages, found a string"
    );
    assert_eq!(e.field(), Some("messages"));
    let e = Transcript::parse(b"[\"ok\", \xff]".as_slice(), "bin").unwrap_err();
    assert_eq!(e.to_string(), "bin: not UTF-8: invalid byte at offset 7");
}

#[test]
fn byte_order_mark_is_skipped() {
    let t = parse("\u{feff}[{\"role\":\"user\"}]");
    assert_eq!(t.messages.len(), 1);
}

#[test]
fn swe_agent_tool_call_ids_are_normalised_and_restored() {
    let text = json!({"history": [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "content": "out", "agent": "main", "tool_call_ids": ["c1"]},
        {"role": "tool", "content": "none", "tool_call_ids": []},
        {"role": "tool", "content": "two", "tool_call_ids": ["a", "b"]},
        {"role": "tool", "content": "std", "tool_call_id": "c9", "tool_call_ids": ["c9"]},
        {"role": "user", "content": "u", "tool_call_ids": ["c1"]}
    ]})
    .to_string();
    let t = parse(&text);
    let ids: Vec<_> = t
        .messages
        .iter()
        .map(|m| m.tool_call_id.as_deref())
        .collect();
    assert_eq!(ids, [None, Some("c1"), None, None, Some("c9"), None]);
    assert_eq!(
        t.warnings(),
        [
            Warning::ToolCallIds {
                index: 2,
                problem: "is an empty list".into()
            },
            Warning::ToolCallIds {
                index: 3,
                problem: "holds 2 ids".into()
            }
        ]
    );
    // Own format: back to the original, key for key.
    assert_eq!(t.to_json_string(), text);
    // Conversion: standard messages keep the id, original fields too.
    let array: Value = serde_json::from_str(&t.to_array_string()).unwrap();
    assert_eq!(array[1]["tool_call_id"], "c1");
    assert_eq!(array[1]["tool_call_ids"], json!(["c1"]));
    assert_eq!(array[1]["agent"], "main");
    // The id survives message edits (dropping a message shifts indices).
    let mut edited = t.clone();
    edited.messages.remove(0);
    let out: Value = serde_json::from_str(&edited.to_json_string()).unwrap();
    assert!(out["history"][0].get("tool_call_id").is_none());
}

#[test]
fn an_id_already_answered_is_not_added_twice() {
    let text = json!([
        {"role": "tool", "tool_call_ids": ["c1"], "content": "a"},
        {"role": "tool", "tool_call_id": "c1", "tool_call_ids": ["c1"], "content": "b"}
    ])
    .to_string();
    let t = parse(&text);
    assert_eq!(t.messages[0].tool_call_id, None);
    assert_eq!(
        t.warnings()[0].to_string(),
        "message 0: `tool_call_ids` repeats `c1`, which another message has as `tool_call_id`; `tool_call_id` left unset"
    );
    assert_eq!(t.to_json_string(), text);
}

#[test]
fn trailing_garbage_after_a_multi_line_object_is_a_json_error() {
    let e = err("{\n  \"messages\": []\n}\n]");
    assert_eq!(e.line(), Some(4), "{e}");
    assert!(e.to_string().contains("trailing characters"), "{e}");
    // One-line objects followed by more are JSON Lines.
    let e = err("{\"role\":\"user\"}\n]");
    assert!(matches!(e, LoadError::Json { line: 2, .. }), "{e}");
}

#[test]
fn conversions_between_formats() {
    let text = r#"{"trajectory":[1],"history":[{"role":"user","content":"q"}],"info":{}}"#;
    let t = parse(text);
    same_json(
        &t.render(Format::MiniSweAgent),
        r#"{"trajectory":[1],"messages":[{"role":"user","content":"q"}],"info":{}}"#,
    );
    assert_eq!(t.to_array_string(), r#"[{"role":"user","content":"q"}]"#);
    assert_eq!(
        t.to_jsonl_string(),
        "{\"role\":\"user\",\"content\":\"q\"}\n"
    );
    let back = Transcript::parse(t.to_jsonl_string(), "x").unwrap();
    assert_eq!(back.messages, t.messages);
    // An array written as an envelope gets a minimal one.
    let a = Transcript::from_messages(vec![Message::user("hi")]);
    assert_eq!(
        a.render(Format::SweAgent),
        r#"{"history":[{"role":"user","content":"hi"}]}"#
    );
    // Pretty output parses back to the same transcript.
    let pretty = t.to_json_string_pretty();
    assert!(pretty.contains("\n  \"history\": ["));
    assert_eq!(
        Transcript::parse(&pretty, "p").unwrap().messages,
        t.messages
    );
}

#[test]
fn metadata_edits_are_written() {
    let mut t = parse(r#"{"messages":[],"info":1}"#);
    t.metadata_mut().insert("note".into(), json!("added"));
    t.metadata_mut().insert("messages".into(), json!("shadow"));
    assert_eq!(
        t.to_json_string(),
        r#"{"messages":[],"info":1,"note":"added"}"#
    );
}

#[test]
fn load_and_write_files() {
    let dir = std::env::temp_dir().join(format!("ctx-transcript-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.traj");
    let t = Transcript::from_messages(vec![Message::system("s"), Message::user("u")]);
    t.write(&path, Format::JsonLines).unwrap();
    let back = Transcript::load(&path).unwrap();
    assert_eq!(back.format, Format::JsonLines);
    assert_eq!(back.to_array_string(), t.to_array_string());
    assert_eq!(back.source_name(), path.display().to_string());
    t.write(&path, Format::SweAgent).unwrap();
    assert_eq!(Transcript::load(&path).unwrap().format, Format::SweAgent);

    let missing = dir.join("missing.json");
    let e = Transcript::load(&missing).unwrap_err();
    assert!(matches!(e, LoadError::Io { .. }));
    assert!(
        e.to_string()
            .starts_with(&format!("{}: cannot read: ", missing.display()))
    );
    let e = t
        .write(dir.join("no/such/dir/x.json"), Format::Array)
        .unwrap_err();
    assert!(e.to_string().contains("cannot write"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
