use serde_json::json;

use super::*;
use crate::message::Role;

const CLAUDE: &str = r#"{"model":"claude","max_tokens":1024,"system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"read the files"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"sig"},{"type":"tool_use","id":"tu_1","name":"Bash","input":{"command":"cat a.txt"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":"alpha"},{"type":"future_block","x":1}]},{"role":"assistant","content":[{"type":"text","text":"ok"}]},{"role":"user","content":[{"type":"text","text":"next","cache_control":{"type":"ephemeral"}}]}],"stream":true}"#;

#[test]
fn unchanged_output_replaces_nothing() {
    let r = FrontRequest::parse(FrontKind::Anthropic, CLAUDE).unwrap();
    assert!(r.stream());
    assert_eq!(r.rebuild(r.chat()).unwrap(), Rebuilt::default());
}

#[test]
fn a_summary_replaces_the_span_and_gets_the_prefix_breakpoint() {
    let r = FrontRequest::parse(FrontKind::Anthropic, CLAUDE).unwrap();
    let chat = r.chat();
    // system, summary, the last assistant and user turns.
    let summary = crate::compressor::wrap_summary("the files were read");
    let mut out = vec![chat[0].clone()];
    out.push(Message::new(
        Role::User,
        crate::message::Content::Text(summary.clone()),
    ));
    out.extend_from_slice(&chat[chat.len() - 2..]);
    let rebuilt = r.rebuild(&out).unwrap();
    assert!(rebuilt.marked_prefix, "{rebuilt:?}");
    let (name, messages) = &rebuilt.fields[0];
    assert_eq!(*name, "messages");
    let v: Value = serde_json::from_str(messages).unwrap();
    assert_eq!(v[0]["content"][0]["text"], summary.as_str());
    assert_eq!(v[0]["content"][0]["cache_control"]["type"], "ephemeral");
    // The client's own breakpoint on the newest message stays.
    assert!(messages.ends_with(
        r#"{"role":"user","content":[{"type":"text","text":"next","cache_control":{"type":"ephemeral"}}]}]"#
    ));
}

#[test]
fn a_rebuild_that_breaks_a_rule_is_refused() {
    let r = FrontRequest::parse(FrontKind::Anthropic, CLAUDE).unwrap();
    let chat = r.chat();
    // Dropping the tool result leaves the tool_use unanswered.
    let out: Vec<Message> = chat
        .iter()
        .filter(|m| !m.is_tool_result())
        .cloned()
        .collect();
    assert!(r.rebuild(&out).is_err());
}

#[test]
fn responses_previous_response_id_is_unmanaged() {
    let r = FrontRequest::parse(
        FrontKind::Responses,
        r#"{"model":"m","previous_response_id":"resp_1","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#,
    )
    .unwrap();
    assert_eq!(r.unmanaged(), Some(Unmanaged::ServerState));
    let r = FrontRequest::parse(FrontKind::Responses, r#"{"model":"m","input":"hi"}"#).unwrap();
    assert_eq!(r.unmanaged(), None);
    assert!(FrontRequest::parse(FrontKind::Responses, r#"{"model":"m"}"#).is_err());
}

/// A body's top-level fields as raw text, in order (what a proxy's
/// body splitter hands over).
fn fields(text: &str) -> Vec<(String, Box<RawValue>)> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<(String, Box<RawValue>)>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(e) = map.next_entry()? {
                out.push(e);
            }
            Ok(out)
        }
    }
    use serde::Deserializer;
    serde_json::Deserializer::from_str(text)
        .deserialize_map(V)
        .unwrap()
}

fn borrowed(f: &[(String, Box<RawValue>)]) -> Vec<(&str, &RawValue)> {
    f.iter().map(|(k, v)| (k.as_str(), v.as_ref())).collect()
}

fn texts(raws: &[Box<RawValue>]) -> Vec<&str> {
    raws.iter().map(|r| r.get()).collect()
}

/// A body with its conversation written item by item (`pretty`: the
/// item at that index indented, as another encoder would).
fn body(head: &str, field: &str, items: &[Value], pretty: Option<usize>) -> String {
    let items: Vec<String> = items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            if Some(i) == pretty {
                serde_json::to_string_pretty(v).unwrap()
            } else {
                v.to_string()
            }
        })
        .collect();
    format!(
        r#"{{{head},"{field}":[{}],"stream":false}}"#,
        items.join(",")
    )
}

/// Reads each body through one cache and checks the result against a
/// whole parse: the same chat view and chat JSON, the same rebuild
/// (digesting every tool result), the client's bytes spliced in.
fn check_sequence(kind: FrontKind, bodies: &[String]) {
    let mut cache = FrontCache::default();
    for (n, text) in bodies.iter().enumerate() {
        let f = fields(text);
        let f = borrowed(&f);
        let items = split_items(kind, &f);
        let mut front = FrontRequest::parse_parts(kind, &f, items.as_deref(), &mut cache).unwrap();
        let whole = FrontRequest::parse(kind, text).unwrap();
        assert_eq!(front.chat(), whole.chat(), "body {n}: chat view");
        assert_eq!(
            texts(front.chat_json()),
            texts(whole.chat_json()),
            "body {n}: chat JSON"
        );
        let digested: Vec<Message> = whole
            .chat()
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if m.is_tool_result() {
                    m.content = crate::message::Content::Text("[digest]".into());
                }
                m
            })
            .collect();
        for output in [whole.chat().to_vec(), digested] {
            let expected = whole.rebuild(&output).unwrap();
            let spliced = front
                .rebuild_with(&output, items.as_deref(), output.len())
                .unwrap();
            if items.is_some() && !expected.fields.is_empty() {
                assert!(!front.memo.is_empty(), "body {n}: rebuilt in place");
            }
            assert_eq!(spliced.fields.len(), expected.fields.len(), "body {n}");
            for ((k1, v1), (k2, v2)) in spliced.fields.iter().zip(&expected.fields) {
                assert_eq!(k1, k2);
                let a: Value = serde_json::from_str(v1).unwrap();
                let b: Value = serde_json::from_str(v2).unwrap();
                assert_eq!(a, b, "body {n}: field {k1}");
                // Every item the rebuild kept whole is the client's text.
                for raw in items.iter().flatten() {
                    let v: Value = serde_json::from_str(raw.get()).unwrap();
                    if b.as_array().is_some_and(|list| list.contains(&v)) {
                        assert!(v1.contains(raw.get()), "body {n}: {} spliced", raw.get());
                    }
                }
            }
        }
        cache.keep(front);
        assert_eq!(cache.len(), items.map_or(0, |i| i.len()));
    }
}

#[test]
fn anthropic_cache_reads_only_new_messages_and_never_reuses_other_bytes() {
    let head = r#""model":"claude","max_tokens":1024,"system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}]"#;
    let turn = |t: usize, mark: bool| {
        let mut result = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("tu_{t}"), "content": format!("output {t}")},
            {"type": "future_block", "n": t}]});
        if mark {
            result["content"][0]["cache_control"] = json!({"type": "ephemeral"});
        }
        vec![
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": format!("think {t}"), "signature": format!("sig{t}")},
                {"type": "tool_use", "id": format!("tu_{t}"), "name": "Bash", "input": {"command": format!("cat {t}")}}]}),
            result,
        ]
    };
    let conversation = |turns: usize| {
        let mut items =
            vec![json!({"role": "user", "content": [{"type": "text", "text": "fix it"}]})];
        for t in 0..turns {
            items.extend(turn(t, t + 1 == turns));
        }
        items
    };
    let mut edited = conversation(4);
    edited[2]["content"][0]["content"] = json!("output 0, edited");
    let bodies = vec![
        body(head, "messages", &conversation(3), None),
        // The breakpoint moved to the newest message.
        body(head, "messages", &conversation(4), None),
        // An old message re-encoded: the same JSON, other bytes.
        body(head, "messages", &conversation(4), Some(1)),
        body(head, "messages", &edited, None),
        body(head, "messages", &conversation(2), None),
        body(
            &head.replace("Claude Code.", "Claude Code, again."),
            "messages",
            &conversation(3),
            None,
        ),
        body(head, "messages", &conversation(3), None),
    ];
    check_sequence(FrontKind::Anthropic, &bodies);
}

#[test]
fn responses_cache_reconverts_the_groups_new_items_join() {
    let head = r#""model":"gpt","instructions":"You are Codex.","store":false"#;
    let user = |t: &str| json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]});
    let reasoning = |n: usize| json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": format!("plan {n}")}], "encrypted_content": format!("enc{n}")});
    let call = |id: &str| json!({"type": "function_call", "call_id": id, "name": "shell", "arguments": format!("{{\"cmd\":\"{id}\"}}")});
    let output = |id: &str, text: &str| json!({"type": "function_call_output", "call_id": id, "output": text});
    let search = json!({"type": "web_search_call", "id": "ws1", "status": "completed"});
    let said = json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]});
    let b1 = vec![user("task"), reasoning(1), call("c1")];
    let mut b2 = b1.clone();
    // The run of calls grows: c1 and c2 are one assistant turn.
    b2.push(call("c2"));
    let mut b3 = b2.clone();
    b3.extend([
        output("c1", "one"),
        output("c2", "two"),
        search.clone(),
        said.clone(),
        reasoning(2),
    ]);
    let mut b4 = b3.clone();
    b4.extend([call("c3"), output("c3", "three"), user("next")]);
    let mut b6 = b4.clone();
    b6[4] = output("c1", "one, edited");
    let mut b8 = b4.clone();
    // A server item first travels with the message after it.
    b8.insert(0, search.clone());
    let bodies = vec![
        body(head, "input", &b1, None),
        body(head, "input", &b2, None),
        body(head, "input", &b3, None),
        body(head, "input", &b4, None),
        body(head, "input", &b4, Some(0)),
        body(head, "input", &b6, None),
        body(head, "input", &b2, None),
        body(head, "input", &b8, None),
        body(head, "input", &b4, None),
        format!(r#"{{{head},"input":"just text"}}"#),
        body(head, "input", &b4, None),
    ];
    check_sequence(FrontKind::Responses, &bodies);
}

#[test]
fn unchanged_messages_go_out_as_the_clients_bytes() {
    let items = [
        json!({"role": "user", "content": "read a"}),
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a"}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "long text"}]}),
        json!({"role": "assistant", "content": "done"}),
    ];
    let text = body(r#""model":"claude""#, "messages", &items, Some(1));
    let f = fields(&text);
    let f = borrowed(&f);
    let raw = split_items(FrontKind::Anthropic, &f).unwrap();
    let mut front = FrontRequest::parse_parts(
        FrontKind::Anthropic,
        &f,
        Some(&raw),
        &mut FrontCache::default(),
    )
    .unwrap();
    let mut out = front.chat().to_vec();
    out[2].content = crate::message::Content::Text("[digest]".into());
    let rebuilt = front.rebuild_with(&out, Some(&raw), out.len()).unwrap();
    let messages = &rebuilt.fields[0].1;
    assert!(
        messages.contains(raw[1].get()),
        "the indented message as it came"
    );
    assert!(raw[1].get().contains('\n'));
    assert!(messages.contains("[digest]"));
    assert!(!messages.contains("long text"));
    // A conversation of another length is not spliced.
    let other = front
        .rebuild_with(&out, Some(&raw[..3]), out.len())
        .unwrap();
    assert_eq!(other, front.rebuild(&out).unwrap());
}
