#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hostile and broken input gives errors that say where, never a panic.

use context_engine::transcript::{Format, LoadError, Transcript};
use proptest::prelude::*;
use serde_json::json;

/// A small but varied mini-swe-agent file (tool calls, null content, unicode).
fn small_envelope() -> String {
    serde_json::to_string_pretty(&json!({
        "info": {"model_stats": {"api_calls": 2}, "note": "ünïcödé ✓ 🦀"},
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": [{"type": "text", "text": "fix \"it\"\n"}]},
            {"content": null, "role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"ls\"}"}}
            ], "extra": {"usage": {"prompt_tokens": 12, "completion_tokens": -3, "cost": 1.5e-3}}},
            {"role": "tool", "tool_call_id": "c1", "content": "a\tb", "ok": true, "err": false}
        ],
        "trajectory_format": "mini-swe-agent-1",
        "instance_id": "x__y-1"
    }))
    .unwrap()
}

fn small_jsonl() -> String {
    [
        r#"{"role":"system","content":"s é"}"#,
        r#"{"role":"user","content":"🦀 u"}"#,
        "",
        r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
        r#"{"role":"tool","tool_call_id":"c1","content":"r"}"#,
    ]
    .join("\n")
        + "\n"
}

#[test]
fn every_prefix_of_an_envelope_is_a_clean_error() {
    let full = small_envelope();
    let bytes = full.as_bytes();
    assert!(Transcript::parse(bytes, "full").is_ok());
    for len in 0..bytes.len() {
        let prefix = &bytes[..len];
        match Transcript::parse(prefix, "cut") {
            Ok(t) => panic!(
                "prefix of {len} bytes parsed: {} messages",
                t.messages.len()
            ),
            Err(LoadError::Empty { .. }) => assert!(prefix.iter().all(u8::is_ascii_whitespace)),
            Err(LoadError::NotUtf8 { byte, .. }) => {
                // Cut inside a multi-byte character: the error points at its start.
                assert!(byte < len && len - byte < 4, "byte {byte} of {len}");
                assert!(std::str::from_utf8(&prefix[..byte]).is_ok());
            }
            Err(LoadError::Json {
                truncated, line, ..
            }) => {
                assert!(truncated, "prefix of {len} bytes");
                assert!(line >= 1);
            }
            Err(other) => panic!("prefix of {len} bytes: {other}"),
        }
    }
}

#[test]
fn every_prefix_of_json_lines_is_an_error_or_the_complete_lines() {
    let full = small_jsonl();
    let bytes = full.as_bytes();
    // End offsets of the complete, non-blank lines.
    let mut ends = Vec::new();
    let mut offset = 0;
    for line in full.split_inclusive('\n') {
        let content = line.trim_end_matches('\n');
        if !content.is_empty() {
            ends.push(offset + content.len());
        }
        offset += line.len();
    }
    for len in 0..=bytes.len() {
        let prefix = &bytes[..len];
        let trimmed = prefix.trim_ascii_end().len();
        let complete = ends.iter().filter(|&&e| e <= trimmed).count();
        let at_line_end = ends.contains(&trimmed);
        match Transcript::parse_as(prefix, "cut.jsonl", Format::JsonLines) {
            Ok(t) => {
                assert!(at_line_end, "prefix of {len} bytes parsed");
                assert_eq!(t.messages.len(), complete);
            }
            Err(e) => {
                assert!(!at_line_end, "prefix of {len} bytes: {e}");
                if let LoadError::Json { line, .. } = e {
                    assert_eq!(line, prefix.iter().filter(|&&b| b == b'\n').count() + 1);
                }
            }
        }
        // Detection on a prefix never panics either.
        let _ = Transcript::parse(prefix, "cut");
    }
}

#[test]
fn invalid_utf8_names_the_byte() {
    let mut bytes = br#"[{"role":"user","content":"caf"#.to_vec();
    let at = bytes.len();
    bytes.extend_from_slice(b"\xC3\x28\"}]");
    let e = Transcript::parse(&bytes, "latin1.json").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("latin1.json: not UTF-8: invalid byte at offset {at}")
    );
    let e = Transcript::parse([0xff, 0xfe, 0, b'['], "utf16.json").unwrap_err();
    assert!(matches!(e, LoadError::NotUtf8 { byte: 0, .. }));
}

#[test]
fn binary_garbage_is_an_error() {
    // A fixed pseudo-random stream (xorshift), plus typical binary headers.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    for input in [
        &random[..],
        b"\x7fELF\x02\x01\x01\0\0\0",
        b"\x89PNG\r\n\x1a\n",
        b"PK\x03\x04",
        b"\0\0\0\0",
    ] {
        assert!(Transcript::parse(input, "bin").is_err());
    }
}

/// Nesting far beyond serde_json's recursion limit is reported, not a stack
/// overflow (tests run on 2 MiB threads, so an unbounded recursion would
/// crash here).
#[test]
fn deep_nesting_is_reported() {
    let deep_array = "[".repeat(100_000);
    let deep_object = r#"{"a":"#.repeat(100_000);
    let inputs = [
        deep_array.clone(),
        format!(r#"{{"messages":{deep_array}"#),
        format!(r#"{{"history":[{{"role":"user","content":{deep_object}"#),
        format!("{{\"role\":\"user\"}}\n{{\"role\":\"user\",\"x\":{deep_array}\n"),
        deep_object.clone(),
    ];
    for input in &inputs {
        let e = Transcript::parse(input, "deep.json").unwrap_err();
        match &e {
            LoadError::Json { message, .. } => {
                assert!(message.contains("recursion limit"), "{e}");
            }
            other => panic!("{other}"),
        }
    }
    // The JSON Lines error is on the second line of the file.
    let e = Transcript::parse(&inputs[3], "deep.jsonl").unwrap_err();
    assert_eq!(e.line(), Some(2));
    // Forced formats too.
    for format in Format::ALL {
        assert!(Transcript::parse_as(&deep_array, "deep", format).is_err());
    }
}

#[test]
fn nesting_under_the_limit_loads_and_round_trips() {
    let depth = 100;
    let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let text = format!(r#"[{{"role":"user","content":"x","deep":{deep}}}]"#);
    let t = Transcript::parse(&text, "deep.json").unwrap();
    assert_eq!(t.to_json_string(), text);
}

#[test]
fn huge_string_content_loads() {
    let big = "x".repeat(50 * 1024 * 1024);
    let text =
        format!(r#"{{"messages":[{{"role":"tool","content":"{big}","tool_call_id":"c"}}]}}"#);
    drop(big);
    let t = Transcript::parse(&text, "big.json").unwrap();
    assert_eq!(t.messages[0].text().len(), 50 * 1024 * 1024);
    assert_eq!(t.to_json_string().len(), text.len());
}

#[test]
fn many_messages_load_in_every_format() {
    let n = 200_000;
    let mut text = String::with_capacity(n * 40);
    for i in 0..n {
        text.push_str(&format!("{{\"role\":\"user\",\"content\":\"m{i}\"}}\n"));
    }
    let t = Transcript::parse(&text, "many.jsonl").unwrap();
    assert_eq!(t.format, Format::JsonLines);
    assert_eq!(t.messages.len(), n);
    assert_eq!(t.messages[n - 1].text(), format!("m{}", n - 1));
    assert_eq!(t.to_jsonl_string(), text);
    let array = Transcript::parse(t.to_array_string(), "many.json").unwrap();
    assert_eq!(array.messages.len(), n);
}

#[test]
fn wrong_shapes_name_the_message_and_field() {
    let messages = json!([
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"content": "no role"}
    ]);
    let cases = [
        ("x.json", messages.to_string()),
        (
            "x.traj",
            json!({"info": {}, "messages": messages}).to_string(),
        ),
        ("x.traj", json!({"history": messages}).to_string()),
    ];
    for (name, text) in &cases {
        let e = Transcript::parse(text, *name).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{name}: message 2: missing field `role`")
        );
        assert_eq!((e.message_index(), e.field()), (Some(2), Some("role")));
    }
    let jsonl: String = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{m}\n\n"))
        .collect();
    let e = Transcript::parse(&jsonl, "x.jsonl").unwrap_err();
    assert_eq!(
        e.to_string(),
        "x.jsonl: message 2 (line 5): missing field `role`"
    );

    let e = Transcript::parse(r#"[{"role":"user"}, 7]"#, "x.json").unwrap_err();
    assert_eq!(
        e.to_string(),
        "x.json: message 1: expected a JSON object, found a number"
    );
    assert_eq!(e.field(), None);
    let e = Transcript::parse(r#"[{"role":null}]"#, "x.json").unwrap_err();
    assert_eq!(e.field(), Some("role"));
    let e = Transcript::parse(r#"{"history":{"role":"user"}}"#, "x.traj").unwrap_err();
    assert_eq!(
        e.to_string(),
        "x.traj: field `history` must be an array of messages, found an object"
    );
    let e = Transcript::parse(
        r#"{"trajectory":[],"info":{},"environment":"main"}"#,
        "x.traj",
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .ends_with("found keys trajectory, info, environment"),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Transcript::parse(&bytes, "fuzz");
        let _ = Transcript::parse_as(&bytes, "fuzz", Format::JsonLines);
    }

    /// Transcript-shaped text, sometimes damaged, reaches deeper into the
    /// parser than random bytes; what loads must write back to text that
    /// loads and writes the same again.
    #[test]
    fn transcript_like_text_never_panics_and_round_trips(
        messages in proptest::collection::vec(MESSAGE, 0..5),
        shape in 0..4usize,
        damage in proptest::option::of((any::<prop::sample::Index>(), r#"[\[\]{}",:\n ]"#)),
    ) {
        let list = messages.join(",");
        let mut text = match shape {
            0 => format!("[{list}]"),
            1 => format!(r#"{{"info":1,"messages":[{list}],"instance_id":"i"}}"#),
            2 => format!(r#"{{"history":[{list}],"trajectory":null}}"#),
            _ => messages.join("\n"),
        };
        if let Some((at, junk)) = damage {
            let at = at.index(text.len() + 1);
            text.insert_str(at, &junk);
        }
        if let Ok(t) = Transcript::parse(&text, "fuzz") {
            let written = t.to_json_string();
            let back = Transcript::parse_as(&written, "again", t.format).unwrap();
            prop_assert_eq!(back.to_json_string(), written);
        }
    }
}

/// One message object with a random selection of fields and values.
const MESSAGE: &str = r#"\{"role":"(user|tool|assistant)"(,"(content|tool_call_ids|tool_call_id|tool_calls|messages|history)":(null|"x"|\["a"\]|\["a","b"\]|\[\]|\{\}|1))*\}"#;
