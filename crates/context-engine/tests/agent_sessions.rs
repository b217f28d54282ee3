//! Reading what Claude Code and Codex write on disk, and Anthropic /
//! Responses request files, through the format bridges.

use std::path::PathBuf;

use context_engine::message::Role;
use context_engine::transcript::{Format, LoadError, Transcript};
use context_engine::validate::{Profile, validate};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sessions")
        .join(name)
}

#[test]
fn a_claude_code_session_log_reads_as_its_main_chain() {
    let t = Transcript::load(fixture("claude-code-session.jsonl")).unwrap();
    assert_eq!(t.format, Format::ClaudeCode);
    let roles: Vec<&str> = t.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
    // The three entries of one reply (thinking, two tool uses) are one turn.
    let first = &t.messages[1];
    assert_eq!(first.tool_calls().len(), 2);
    assert_eq!(
        first.reasoning_content.as_deref(),
        Some("Read the code and the test first.")
    );
    assert_eq!(first.tool_calls()[0].id.as_deref(), Some("toolu_01"));
    // The sub-agent's sidechain is not part of the conversation.
    let all = serde_json::to_string(&t.messages).unwrap();
    assert!(!all.contains("Sub-agent"));
    assert!(!all.contains("PostToolUse hook"));
    assert!(validate(&t.messages, Profile::OpenAi).is_empty());
    assert!(validate(&t.messages, Profile::Strict).is_empty());
    // Written in its own kind, it is the Anthropic request it amounts to.
    let v: Value = serde_json::from_str(&t.render(Format::ClaudeCode)).unwrap();
    let messages = v["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 8);
    assert_eq!(
        messages[1]["content"][0]["signature"],
        "EqMBCkgIBxABGAIiQKz3+sig=="
    );
    assert_eq!(messages[2]["content"].as_array().unwrap().len(), 2);
}

#[test]
fn a_codex_rollout_reads_as_its_response_items() {
    let t = Transcript::load(fixture("rollout-2026-01-01T10-00-00-0199a1b2.jsonl")).unwrap();
    assert_eq!(t.format, Format::Codex);
    let roles: Vec<&str> = t.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
    assert!(t.messages[0].text().starts_with("You are Codex"));
    assert_eq!(
        t.messages[3].reasoning_content.as_deref(),
        Some("**Inspecting calc.py**")
    );
    assert_eq!(t.messages[5].tool_calls()[0].name(), Some("apply_patch"));
    assert!(validate(&t.messages, Profile::OpenAi).is_empty());
    // Written back: the Responses request, reasoning kept verbatim.
    let v: Value = serde_json::from_str(&t.render(Format::Codex)).unwrap();
    assert_eq!(v["instructions"], t.messages[0].text().as_ref());
    assert_eq!(v["input"][2]["encrypted_content"], "gAAAAABpVx0enc1==");
}

#[test]
fn session_log_errors_name_the_line() {
    let text = std::fs::read_to_string(fixture("claude-code-session.jsonl")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[3] = r#"{"parentUuid":"a1","sessionId":"x","type":"assistant","uuid":"a2"}"#;
    let err = Transcript::parse(lines.join("\n"), "s.jsonl").unwrap_err();
    assert!(
        matches!(err, LoadError::Format { line: Some(4), .. }),
        "{err}"
    );
    assert_eq!(err.to_string(), "s.jsonl (line 4): missing field `message`");
    lines[3] = "{not json";
    let err = Transcript::parse(lines.join("\n"), "s.jsonl").unwrap_err();
    assert!(err.to_string().contains("line 4"), "{err}");
    let codex = "{\"timestamp\":\"t\",\"type\":\"response_item\",\"payload\":3}\n";
    let err = Transcript::parse(codex, "r.jsonl").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("r.jsonl (line 1): missing field"),
        "{err}"
    );
}

const ANTHROPIC: &str = r#"{"system":"You are helpful.","messages":[{"role":"user","content":"list files"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"bash","input":{"cmd":"ls"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a.py","cache_control":{"type":"ephemeral"}}]}],"max_tokens":100}"#;

#[test]
fn anthropic_and_responses_request_files_round_trip() {
    let t = Transcript::parse(ANTHROPIC, "a.json").unwrap();
    assert_eq!(t.format, Format::Anthropic);
    assert_eq!(t.messages.len(), 4);
    assert_eq!(t.messages[0].role, Role::System);
    assert_eq!(t.messages[3].tool_call_id.as_deref(), Some("t1"));
    assert_eq!(t.to_json_string(), ANTHROPIC);
    // Converted to chat messages and back into Anthropic form.
    let chat = Transcript::parse(t.render(Format::Array), "c.json").unwrap();
    assert_eq!(chat.format, Format::Array);
    let back: Value = serde_json::from_str(&chat.render(Format::Anthropic)).unwrap();
    assert_eq!(back["system"], "You are helpful.");
    assert_eq!(back["messages"][2]["content"][0]["tool_use_id"], "t1");

    let responses = r#"{"model":"gpt-5","input":[{"type":"message","role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"shell","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok"}]}"#;
    let t = Transcript::parse(responses, "r.json").unwrap();
    assert_eq!(t.format, Format::Responses);
    assert_eq!(t.messages.len(), 3);
    assert_eq!(t.to_json_string(), responses);
    // A bare array of Anthropic messages stays an array.
    let bare = r#"[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"text","text":"y"}]}]"#;
    let t = Transcript::parse(bare, "b.json").unwrap();
    assert_eq!(t.format, Format::Anthropic);
    assert_eq!(t.to_json_string(), bare);
}

#[test]
fn native_rules_judge_wire_transcripts_in_their_own_indexes() {
    let broken = r#"{"messages":[{"role":"user","content":"go"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"bash","input":{}}]},{"role":"user","content":[{"type":"text","text":"never mind"}]}]}"#;
    let t = Transcript::parse(broken, "a.json").unwrap();
    let (rules, v) = t.native_violations().unwrap();
    assert_eq!(rules, "anthropic");
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].index, v[0].rule.name()), (1, "unanswered-tool-call"));
    let t = Transcript::load(fixture("rollout-2026-01-01T10-00-00-0199a1b2.jsonl")).unwrap();
    assert_eq!(
        t.native_violations().map(|(r, v)| (r, v.len())),
        Some(("responses", 0))
    );
    assert!(
        Transcript::parse("[]", "x")
            .unwrap()
            .native_violations()
            .is_none()
    );
}

const ROLLOUT: &str = "rollout-2026-01-01T10-00-00-0199a1b2.jsonl";

/// Replays `t` with the built-in engine and its recorded times; returns
/// which calls found the prompt cache expired.
fn expired_calls(t: &Transcript) -> Result<Vec<usize>, context_engine::replay::ReplayError> {
    use context_engine::compressor::Compressor;
    use context_engine::host::Session;
    use context_engine::replay::{ReplayOptions, replay};
    use context_engine::tokens::{BpeCounter, Encoding, TokenCounter};
    use std::sync::Arc;
    let counter: Arc<dyn TokenCounter> = Arc::new(BpeCounter::new(Encoding::O200kBase));
    let engine = Compressor::new(Arc::clone(&counter), 128_000);
    let mut session = Session::new("log", Box::new(engine), Arc::clone(&counter));
    let options = ReplayOptions::default().with_message_times(t.message_times());
    let r = replay(
        &t.messages,
        &mut session,
        counter.as_ref(),
        &options,
        |_, _| {},
    )?;
    Ok(r.calls
        .iter()
        .filter(|c| c.cache_expired)
        .map(|c| c.call)
        .collect())
}

#[test]
fn session_logs_carry_their_entries_times_to_the_replay() {
    // 2026-01-01T10:00:00Z.
    let start = 1_767_261_600.0;
    let within = |times: &[Option<f64>]| {
        times
            .iter()
            .all(|at| at.is_some_and(|s| (start..start + 60.0).contains(&s)))
    };
    let claude = Transcript::load(fixture("claude-code-session.jsonl")).unwrap();
    let times = claude.message_times();
    assert_eq!(times.len(), claude.messages.len());
    assert!(within(&times), "{times:?}");
    // Codex: the instructions have no time, the items theirs.
    let codex = Transcript::load(fixture(ROLLOUT)).unwrap();
    let times = codex.message_times();
    assert_eq!(times[0], None);
    assert!(within(&times[1..]), "{times:?}");
    assert!(times[1..].windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // A ten-minute pause in the log: the call after it finds the cache
    // expired; without it, none does.
    assert!(expired_calls(&codex).unwrap().is_empty());
    let text = std::fs::read_to_string(fixture(ROLLOUT)).unwrap();
    let paused = Transcript::parse(
        text.replace("2026-01-01T10:00:1", "2026-01-01T10:10:1"),
        "paused.jsonl",
    )
    .unwrap();
    assert_eq!(expired_calls(&paused).unwrap().len(), 1);
}
