use serde_json::json;

use super::*;
use crate::message::{ContentPart, Role};
use crate::recall::{
    LineRange, RECALL_TOOL, RecallError, handle_recall_call, recall, recall_tool_schema,
};
use crate::validate::{Profile, validate};

fn big(n: usize) -> String {
    let line = "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstu\n";
    line.repeat(n / line.len() + 1)[..n].to_owned()
}

fn call(id: &str, cmd: &str) -> Message {
    Message::assistant_tool_calls(
        "",
        vec![ToolCall::function(
            id,
            "bash",
            json!({ "command": cmd }).to_string(),
        )],
    )
}

/// system, user, then one batch per body (`c0`, `c1`, …), then a final answer.
fn session(bodies: &[String]) -> Vec<Message> {
    let mut m = vec![Message::system("agent"), Message::user("fix it")];
    for (i, body) in bodies.iter().enumerate() {
        let id = format!("c{i}");
        m.push(call(&id, &format!("step {i}")));
        m.push(Message::tool_result(id, body.clone()));
    }
    m
}

fn text(m: &Message) -> String {
    m.text().into_owned()
}

#[test]
fn newest_batch_stays_whole_older_ones_are_digested() {
    let bodies = vec![big(5000), big(6000), big(7000)];
    let m = session(&bodies);
    let (out, report) = digest_with_report(&m, &DigestOptions::default());
    assert_eq!(out.len(), m.len());
    assert_eq!(report.results_digested, 2);
    let line = text(&out[3]);
    assert!(line.starts_with(DIGEST_MARK), "{line}");
    assert!(
        line.contains(r#"bash {"command":"step 0"} → ok, 5000 bytes omitted"#),
        "{line}"
    );
    assert!(
        line.ends_with(r#"full output: context_recall {"handle":"c0"}"#),
        "{line}"
    );
    assert!(!line.contains('\n'));
    assert!(text(&out[5]).starts_with(DIGEST_MARK));
    assert_eq!(out[7], m[7], "the newest batch is kept whole");
    // Role, id and every other field stay.
    assert_eq!(out[3].role, Role::Tool);
    assert_eq!(out[3].tool_call_id.as_deref(), Some("c0"));
    assert!(validate(&out, Profile::OpenAi).is_empty());
}

#[test]
fn keep_batches_is_configurable() {
    let m = session(&[big(5000), big(5000), big(5000)]);
    let opts = DigestOptions {
        keep_batches: 2,
        ..DigestOptions::default()
    };
    let out = digest(&m, &opts);
    assert!(text(&out[3]).starts_with(DIGEST_MARK));
    assert_eq!(out[5..], m[5..]);
    let all = DigestOptions {
        keep_batches: 0,
        ..DigestOptions::default()
    };
    assert!(text(&digest(&m, &all)[7]).starts_with(DIGEST_MARK));
    let many = DigestOptions {
        keep_batches: 10,
        ..DigestOptions::default()
    };
    assert_eq!(digest(&m, &many), m);
}

#[test]
fn the_4096_byte_boundary_both_sides() {
    let m = session(&[big(4095), big(4096), big(10)]);
    let out = digest(&m, &DigestOptions::default());
    assert_eq!(out[3], m[3], "4095 bytes stay whole");
    assert!(text(&out[5]).contains("4096 bytes omitted"));
    let lower = DigestOptions {
        min_bytes: 100,
        ..DigestOptions::default()
    };
    assert!(text(&digest(&m, &lower)[3]).starts_with(DIGEST_MARK));
}

#[test]
fn the_first_error_line_wins() {
    let body = format!(
        "{}\nERR: first failure\nError: second\n{}",
        big(3000),
        big(2000)
    );
    let m = session(&[body, big(10)]);
    let line = text(&digest(&m, &DigestOptions::default())[3]);
    assert!(line.contains("→ failed — ERR: first failure;"), "{line}");
    assert!(!line.contains("second"));
    // Only at the start of a line.
    let mid = format!("{}\nsee ERR: not an error\n", big(5000));
    let m = session(&[mid, big(10)]);
    assert!(text(&digest(&m, &DigestOptions::default())[3]).contains("→ ok, "));
}

#[test]
fn long_error_lines_and_writs_are_clipped() {
    let body = format!("Error: {}\n{}", "x".repeat(500), big(5000));
    let mut m = session(&[body, big(10)]);
    m[2] = call("c0", &"y".repeat(1000));
    let line = text(&digest(&m, &DigestOptions::default())[3]);
    let (writ, rest) = line.split_once(" → ").unwrap();
    let writ = writ.strip_prefix("[digested] ").unwrap();
    assert!(writ.len() <= 240 && writ.ends_with('…'), "{}", writ.len());
    let err = rest
        .split_once(" — ")
        .unwrap()
        .1
        .split_once("; full")
        .unwrap()
        .0;
    assert!(err.len() <= 200 && err.ends_with('…'), "{}", err.len());
}

#[test]
fn exit_codes_are_errors() {
    for (body, want) in [
        (
            "<returncode>1</returncode>\n<output>\nboom\n</output>",
            "failed (exit 1)",
        ),
        ("done\n[exit 2]", "failed (exit 2)"),
        ("sh: foo: not found\nexit code: 127", "failed (exit 127)"),
        ("returncode: 1", "failed (exit 1)"),
    ] {
        let m = session(&[format!("{}\n{body}", big(5000)), big(10)]);
        let line = text(&digest(&m, &DigestOptions::default())[3]);
        assert!(line.contains(want), "{body}: {line}");
    }
    // A traceback shows its exception.
    let tb = format!(
        "<returncode>1</returncode>\n{}\nTraceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    main()\nKeyError: 'x'\n",
        big(5000)
    );
    let line = text(&digest(&session(&[tb, big(1)]), &DigestOptions::default())[3]);
    assert!(line.contains("failed (exit 1) — KeyError: 'x'"), "{line}");
    // Explicit success: error-looking output is just output.
    let ok = format!(
        "<returncode>0</returncode>\nError: in a file\n{}",
        big(5000)
    );
    let line = text(&digest(&session(&[ok, big(1)]), &DigestOptions::default())[3]);
    assert!(line.contains("→ ok, "), "{line}");
}

#[test]
fn an_explicit_error_flag_is_an_error() {
    let mut m = session(&[big(5000), big(10)]);
    m[3].extra.insert("is_error".into(), json!(true));
    let line = text(&digest(&m, &DigestOptions::default())[3]);
    assert!(line.contains("→ failed, 5000 bytes omitted"), "{line}");
    // mini-swe-agent keeps the return code in `extra`.
    let mut m = session(&[big(5000), big(10)]);
    m[3].extra
        .insert("extra".into(), json!({"returncode": 2, "raw_output": "x"}));
    let line = text(&digest(&m, &DigestOptions::default())[3]);
    assert!(line.contains("failed (exit 2)"), "{line}");
}

#[test]
fn images_are_dropped_with_one_line_each() {
    let mut m = session(&[big(10), big(10)]);
    let b64 = "QUJD".repeat(1000); // 3000 bytes decoded
    m[3].content = Content::Parts(vec![
        ContentPart::new_text("screenshot taken"),
        ContentPart::new_image_url(format!("data:image/png;base64,{b64}")),
        ContentPart::new_image_url("https://example.test/shot.jpg"),
    ]);
    let (out, report) = digest_with_report(&m, &DigestOptions::default());
    assert_eq!(report.binary_parts_dropped, 2);
    let t = text(&out[3]);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 3, "{t}");
    assert!(lines[0].contains("ok, 16 bytes omitted"));
    assert_eq!(lines[1], "[image omitted — image/png, 3000 bytes]");
    assert_eq!(lines[2], "[image omitted — https://example.test/shot.jpg]");
    assert!(matches!(out[3].content, Content::Text(_)));
    // In the newest batch an image stays.
    m.swap(3, 5);
    m[3].tool_call_id = Some("c0".into());
    m[5].tool_call_id = Some("c1".into());
    let out = digest(&m, &DigestOptions::default());
    assert_eq!(out[5], m[5]);
}

#[test]
fn notes_are_kept_word_for_word() {
    let body = format!(
        "{}\n[PRESENCE: bob joined]\nsays hi\n[END PRESENCE]\n[LOOP DETECTED] same call 3 times [END LOOP DETECTED]\n",
        big(5000)
    );
    let out = digest(&session(&[body, big(1)]), &DigestOptions::default());
    let t = text(&out[3]);
    assert!(
        t.contains("\n[PRESENCE: bob joined]\nsays hi\n[END PRESENCE]"),
        "{t}"
    );
    assert!(t.contains("\n[LOOP DETECTED] same call 3 times [END LOOP DETECTED]"));
}

#[test]
fn disable_values() {
    for v in ["1", "true", " YES ", "on"] {
        assert!(is_disable_value(v), "{v}");
    }
    for v in ["0", "", "off", "no"] {
        assert!(!is_disable_value(v), "{v}");
    }
}

#[test]
fn digesting_twice_changes_nothing() {
    let env = envelope_session();
    for m in [session(&[big(5000), big(9000), big(1)]), env] {
        for min_bytes in [0, 1, 50, 4096] {
            let opts = DigestOptions {
                min_bytes,
                ..DigestOptions::default()
            };
            let once = digest(&m, &opts);
            let twice = digest(&once, &opts);
            assert_eq!(once, twice, "min_bytes {min_bytes}");
            // And it is deterministic, to the byte.
            let a: Vec<String> = once.iter().map(|x| x.to_value().to_string()).collect();
            let b: Vec<String> = digest(&m, &opts)
                .iter()
                .map(|x| x.to_value().to_string())
                .collect();
            assert_eq!(a, b);
        }
    }
}

#[test]
fn stored_history_is_unchanged() {
    let m = session(&[big(5000), big(9000), big(1)]);
    let before: Vec<String> = m.iter().map(|x| x.to_value().to_string()).collect();
    let out = digest(&m, &DigestOptions::default());
    assert_ne!(out, m);
    let after: Vec<String> = m.iter().map(|x| x.to_value().to_string()).collect();
    assert_eq!(before, after);
}

#[test]
fn recall_returns_the_exact_original() {
    let body = format!("first\r\n{}\nlast line", big(5000));
    let m = session(&[body.clone(), big(1)]);
    let view = digest(&m, &DigestOptions::default());
    assert!(text(&view[3]).contains(r#"{"handle":"c0"}"#));
    assert_eq!(recall(&m, "c0", None).unwrap(), body);
    assert_eq!(
        recall(
            &m,
            "c0",
            Some(LineRange {
                start: 1,
                end: Some(1)
            })
        )
        .unwrap(),
        "first\r\n"
    );
    let n = body.split_inclusive('\n').count();
    assert_eq!(
        recall(
            &m,
            "c0",
            Some(LineRange {
                start: n,
                end: None
            })
        )
        .unwrap(),
        "last line"
    );
    assert!(matches!(
        recall(
            &m,
            "c0",
            Some(LineRange {
                start: n + 1,
                end: None
            })
        ),
        Err(RecallError::BadRange { .. })
    ));
    assert!(matches!(
        recall(&m, "nope", None),
        Err(RecallError::UnknownHandle { .. })
    ));
    // A request view no longer has the body, and says so.
    assert!(matches!(
        recall(&view, "c0", None),
        Err(RecallError::Digested { index: 3, .. })
    ));
}

#[test]
fn recall_tool_call_answers_in_json() {
    let body = "a\nb\nc\n".repeat(2000);
    let m = session(&[body.clone(), big(1)]);
    let r: serde_json::Value =
        serde_json::from_str(&handle_recall_call(&m, &json!({"handle": "c0"}))).unwrap();
    assert_eq!(r["content"], body);
    assert_eq!(r["total_lines"], 6000);
    let r: serde_json::Value = serde_json::from_str(&handle_recall_call(
        &m,
        &json!({"handle": "c0", "start_line": 2, "end_line": 3}),
    ))
    .unwrap();
    assert_eq!(r["content"], "b\nc\n");
    assert_eq!(r["lines"], json!([2, 3]));
    let r: serde_json::Value =
        serde_json::from_str(&handle_recall_call(&m, &json!({"handle": 7}))).unwrap();
    assert!(r["error"].as_str().unwrap().contains("handle"));
    let r: serde_json::Value =
        serde_json::from_str(&handle_recall_call(&m, &json!({"handle": "zz"}))).unwrap();
    assert!(r["error"].as_str().unwrap().contains("zz"));
    let schema = recall_tool_schema();
    assert_eq!(schema["function"]["name"], RECALL_TOOL);
    assert_eq!(
        schema["function"]["parameters"]["required"],
        json!(["handle"])
    );
}

fn envelope_text(read_body: &str) -> String {
    format!(
        "[/read src/lib.rs]\n{read_body}\n[END READ]\n[/exec cargo test]\ncompiling\nERR: 2 tests failed\n[END EXEC]\n[PRESENCE: alice]\nwatching\n[END PRESENCE]\n[TOOL RESULTS TRUNCATED: 2 more]\n[END TOOL RESULTS]"
    )
}

fn envelope_session() -> Vec<Message> {
    vec![
        Message::system("agent"),
        Message::user("fix it"),
        Message::assistant("[/read src/lib.rs]\n[/exec cargo test]"),
        Message::user(envelope_text(&format!(
            "{}\n[/exec not a writ]\n{}",
            big(3000),
            big(2000)
        ))),
        Message::assistant("[/exec ls]"),
        Message::user("[/exec ls]\nsrc\n[END EXEC]\n[END TOOL RESULTS]"),
    ]
}

#[test]
fn envelopes_are_digested_one_line_per_writ() {
    let m = envelope_session();
    let (out, report) = digest_with_report(&m, &DigestOptions::default());
    assert_eq!(report.envelopes_digested, 1);
    let t = text(&out[3]);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines[0], ENVELOPE_HEADER, "{t}");
    assert!(lines[1].starts_with("[/read src/lib.rs] → ok, 5020 bytes omitted; full output: context_recall {\"handle\":\"h"), "{t}");
    assert!(
        lines[2].starts_with("[/exec cargo test] → failed — ERR: 2 tests failed;"),
        "{t}"
    );
    assert_eq!(
        &lines[3..],
        [
            "[PRESENCE: alice]",
            "watching",
            "[END PRESENCE]",
            "[TOOL RESULTS TRUNCATED: 2 more]",
            "[END TOOL RESULTS]"
        ]
    );
    // The `[/exec not a writ]` line inside the read block is body, not a writ.
    assert!(!t.contains("not a writ"));
    // Still a tool re-entry for the cut points; the newest envelope is whole.
    assert!(crate::validate::is_tool_reentry(&out[3]));
    assert_eq!(out[5], m[5]);
    // Each block comes back whole through its handle.
    let handle = lines[1]
        .rsplit_once("\"handle\":\"")
        .unwrap()
        .1
        .trim_end_matches("\"}");
    let body = recall(&m, handle, None).unwrap();
    assert!(body.contains("[/exec not a writ]"));
    assert_eq!(body.len(), 5020);
    assert_eq!(
        recall(&m, &hash_handle("compiling\nERR: 2 tests failed"), None).unwrap(),
        "compiling\nERR: 2 tests failed"
    );
}

#[test]
fn small_envelopes_stay_whole() {
    let mut m = envelope_session();
    m[3] = Message::user(envelope_text("tiny"));
    assert_eq!(digest(&m, &DigestOptions::default()), m);
}

#[test]
fn summarizer_input_keeps_no_batch_whole() {
    let m = session(&[big(5000), big(5000)]);
    let s = summarizer_input(&m, &DigestOptions::default());
    assert!(text(&s.messages[3]).starts_with(DIGEST_MARK));
    assert!(text(&s.messages[5]).starts_with(DIGEST_MARK));
    assert!(s.instruction.contains("Do not reconstruct"));
    // The request view keeps the newest.
    assert_eq!(digest(&m, &DigestOptions::default())[5], m[5]);
}

#[test]
fn results_without_a_matching_call_and_legacy_functions() {
    let mut orphan = Message::tool_result("ghost", big(5000));
    orphan.name = Some("grep".into());
    let mut legacy_call = Message::assistant("");
    legacy_call.function_call = Some(FunctionCall::new("search", r#"{"q": "x"}"#));
    let mut legacy_result = Message::new(Role::Function, Content::Text(big(5000)));
    legacy_result.name = Some("search".into());
    let m = vec![
        Message::user("go"),
        orphan,
        legacy_call,
        legacy_result.clone(),
        call("c9", "ls"),
        Message::tool_result("c9", "x"),
    ];
    let out = digest(&m, &DigestOptions::default());
    assert!(
        text(&out[1]).starts_with("[digested] grep → ok"),
        "{}",
        text(&out[1])
    );
    let legacy = text(&out[3]);
    assert!(
        legacy.starts_with(r#"[digested] search {"q": "x"} → ok"#),
        "{legacy}"
    );
    // No id: the handle is a hash of the body, and recall finds it.
    let handle = hash_handle(&text(&legacy_result));
    assert!(legacy.contains(&handle));
    assert_eq!(recall(&m, &handle, None).unwrap(), text(&legacy_result));
}

#[test]
fn the_borrowed_view_borrows_exactly_what_is_unchanged() {
    let m = session(&[big(5000), big(10), big(5000)]);
    let (view, report) = digest_view(&m, &DigestOptions::default());
    let owned: Vec<usize> = view
        .iter()
        .enumerate()
        .filter(|(_, c)| matches!(c, Cow::Owned(_)))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(owned, vec![3]);
    assert_eq!(report.results_digested, 1);
    let as_owned: Vec<Message> = view.into_iter().map(Cow::into_owned).collect();
    assert_eq!(as_owned, digest(&m, &DigestOptions::default()));
}

#[test]
fn parts_a_digest_cannot_account_for_stay_whole() {
    let mut m = session(&[big(5000), big(10)]);
    let mut refusal = serde_json::Map::new();
    refusal.insert("type".into(), json!("refusal"));
    refusal.insert("refusal".into(), json!("no"));
    let mut input_text = serde_json::Map::new();
    input_text.insert("type".into(), json!("input_text"));
    input_text.insert("text".into(), json!(big(5000)));
    for part in [refusal, input_text] {
        m[3].content = Content::Parts(vec![
            ContentPart::new_text(big(5000)),
            ContentPart::from_map(part),
        ]);
        assert_eq!(digest(&m, &DigestOptions::default())[3], m[3]);
    }
    // An unknown part without text counts as binary.
    let mut blob = serde_json::Map::new();
    blob.insert("type".into(), json!("image"));
    blob.insert("source".into(), json!({"data": "QUJD"}));
    m[3].content = Content::Parts(vec![ContentPart::from_map(blob)]);
    let t = text(&digest(&m, &DigestOptions::default())[3]);
    assert!(t.ends_with("\n[image part omitted]"), "{t}");
}

#[test]
fn long_notes_are_clipped() {
    let body = format!(
        "{}\n[PRESENCE: {}]\n[END PRESENCE]\n",
        big(5000),
        "n".repeat(3000)
    );
    let t = text(&digest(&session(&[body, big(1)]), &DigestOptions::default())[3]);
    let note = t.lines().nth(1).unwrap();
    assert!(
        note.starts_with("[PRESENCE: nnn") && note.ends_with('…'),
        "{note}"
    );
    assert!(note.len() <= 1024);
}

#[test]
fn options_deserialize_with_defaults_for_missing_fields() {
    let o: DigestOptions = toml::from_str("enabled = false\nmin_bytes = 1024").unwrap();
    assert_eq!(
        o,
        DigestOptions {
            enabled: false,
            min_bytes: 1024,
            ..DigestOptions::default()
        }
    );
    let o: DigestOptions = toml::from_str("").unwrap();
    assert_eq!(o, DigestOptions::default());
}

#[test]
fn the_stable_length_ends_before_the_result_the_next_request_digests() {
    let opts = DigestOptions::default();
    // system, user, c0 call, c0 result, c1 call, c1 result (newest, big).
    let m = session(&[big(5000), big(6000)]);
    let view = digest(&m, &opts);
    assert_eq!(stable_len(&view, &opts), 5, "up to c1's call");
    // The next request (one more batch) carries those five as they are and
    // differs at the sixth.
    let mut next = m.clone();
    next.extend([call("c2", "step 2"), Message::tool_result("c2", "ok")]);
    let next_view = digest(&next, &opts);
    assert_eq!(next_view[..5], view[..5]);
    assert_ne!(next_view[5], view[5]);
    // A small newest result stays whole next time: all of it is stable.
    let small = digest(&session(&[big(5000), "ok".into()]), &opts);
    assert_eq!(stable_len(&small, &opts), small.len());
    // So with the digest off, with no batch, or a user turn after the batch
    // (the next batch still digests it).
    let off = DigestOptions {
        enabled: false,
        ..DigestOptions::default()
    };
    assert_eq!(stable_len(&view, &off), view.len());
    let plain = [Message::system("s"), Message::user("hi")];
    assert_eq!(stable_len(&plain, &opts), 2);
    let mut asked = view.clone();
    asked.push(Message::user("and now?"));
    assert_eq!(stable_len(&asked, &opts), 5);
    // Two kept batches: the older of the two turns old next.
    let two = DigestOptions {
        keep_batches: 2,
        ..DigestOptions::default()
    };
    let m3 = session(&[big(5000), big(6000), big(7000)]);
    assert_eq!(stable_len(&digest(&m3, &two), &two), 5, "up to c1's call");
}

#[test]
fn an_observation_digest_names_no_tool_the_agent_lacks() {
    // A mini-swe-agent text action and its observation, then the next one:
    // the older observation is digested in the agent's shape, without the
    // recall hint a text-action agent would try to run as a command.
    let action = |cmd: &str| Message::assistant(format!("THOUGHT: look.\n\n```bash\n{cmd}\n```"));
    let observe = |body: &str| {
        Message::user(format!(
            "<returncode>0</returncode>\n<output>\n{body}</output>"
        ))
    };
    let m = vec![
        Message::system("agent"),
        Message::user("fix it"),
        action("cat big.py"),
        observe(&big(6000)),
        action("ls"),
        observe("big.py\n"),
    ];
    let view = digest(&m, &DigestOptions::default());
    let t = view[3].text();
    assert!(
        t.starts_with("<returncode>0</returncode>\n<output>\n[digested] cat big.py → ok, "),
        "{t}"
    );
    assert!(t.contains("bytes omitted"), "{t}");
    assert!(!t.contains("context_recall"), "{t}");
    // A tool result of the same size keeps its hint.
    let calls = session(&[big(6000), big(10)]);
    let digested = digest(&calls, &DigestOptions::default());
    assert!(digested[3].text().contains("full output: context_recall"));
    assert!(names_recall_handle(&calls[3]) && !names_recall_handle(&m[3]));
}
