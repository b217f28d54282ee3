#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Each provider rule (positive and negative), the reported indices, and the
//! cut-point queries.

use context_engine::validate::{
    CutPoints, Profile, Rule, Violation, atomic_groups, is_real_user_turn, is_tool_reentry,
    validate,
};
use context_engine::{Content, ContentPart, Message, Role, ToolCall};
use serde_json::json;

fn call(id: &str) -> ToolCall {
    ToolCall::function(id, "bash", r#"{"command":"ls"}"#)
}

fn calls(ids: &[&str]) -> Message {
    Message::assistant_tool_calls("", ids.iter().map(|id| call(id)).collect())
}

fn msg(value: serde_json::Value) -> Message {
    Message::from_value(value).unwrap()
}

fn found(messages: &[Message], profile: Profile) -> Vec<(usize, Rule)> {
    validate(messages, profile)
        .into_iter()
        .map(|v| (v.index, v.rule))
        .collect()
}

fn openai(messages: &[Message]) -> Vec<(usize, Rule)> {
    found(messages, Profile::OpenAi)
}

fn strict(messages: &[Message]) -> Vec<(usize, Rule)> {
    found(messages, Profile::Strict)
}

const ENVELOPE: &str = "[bash]\nls\n[/bash]\n[END TOOL RESULTS]";

fn reentry() -> Message {
    Message::user(ENVELOPE)
}

#[test]
fn a_well_formed_transcript_passes_both_profiles() {
    let m = vec![
        Message::system("be brief"),
        Message::user("list files"),
        calls(&["a", "b"]),
        Message::tool_result("a", "x"),
        Message::tool_result("b", "y"),
        Message::assistant("done"),
        Message::user("thanks"),
    ];
    assert_eq!(openai(&m), vec![]);
    assert_eq!(strict(&m), vec![]);
}

#[test]
fn orphan_results_are_reported_at_the_result() {
    let m = vec![Message::user("hi"), Message::tool_result("x", "out")];
    assert_eq!(openai(&m), vec![(1, Rule::OrphanToolResult)]);

    // The id exists, but in an earlier assistant turn: still an orphan, and
    // the later turn's own call is unanswered.
    let m = vec![
        calls(&["a"]),
        Message::tool_result("a", "x"),
        calls(&["b"]),
        Message::tool_result("a", "again"),
    ];
    let v = validate(&m, Profile::OpenAi);
    assert_eq!(
        v.iter().map(|v| (v.index, v.rule)).collect::<Vec<_>>(),
        vec![(2, Rule::UnansweredToolCall), (3, Rule::OrphanToolResult)]
    );
    assert!(v[1].detail.contains("message 0"), "{}", v[1].detail);
}

#[test]
fn a_tool_message_needs_a_tool_call_id() {
    let mut bare = Message::new(Role::Tool, Content::Text("out".into()));
    let m = vec![calls(&["a"]), bare.clone()];
    assert_eq!(
        openai(&m),
        vec![
            (0, Rule::UnansweredToolCall),
            (1, Rule::ToolResultWithoutId)
        ]
    );
    bare.tool_call_id = Some("a".into());
    assert_eq!(openai(&[calls(&["a"]), bare]), vec![]);
}

#[test]
fn unanswered_calls_are_reported_at_the_assistant_message() {
    let m = vec![
        Message::user("go"),
        calls(&["a", "b"]),
        Message::tool_result("a", "x"),
        Message::assistant("next"),
    ];
    let v = validate(&m, Profile::OpenAi);
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].index, v[0].rule), (1, Rule::UnansweredToolCall));
    assert!(v[0].detail.contains("`b`"), "{}", v[0].detail);

    // Decision: a trailing call with no result is a violation (as a request,
    // providers reject it).
    let m = vec![Message::user("go"), calls(&["a"])];
    let v = validate(&m, Profile::OpenAi);
    assert_eq!((v[0].index, v[0].rule), (1, Rule::UnansweredToolCall));
    assert!(v[0].detail.contains("end"), "{}", v[0].detail);
}

#[test]
fn duplicate_call_ids_and_duplicate_results() {
    // The same id in two turns: reported once, at the second use.
    let m = vec![
        calls(&["a"]),
        Message::tool_result("a", "1"),
        calls(&["a"]),
        Message::tool_result("a", "2"),
    ];
    assert_eq!(openai(&m), vec![(2, Rule::DuplicateToolCallId)]);

    // Twice in one turn with two results: only the id is the problem.
    let m = vec![
        calls(&["a", "a"]),
        Message::tool_result("a", "1"),
        Message::tool_result("a", "2"),
    ];
    assert_eq!(openai(&m), vec![(0, Rule::DuplicateToolCallId)]);

    // One call, two results.
    let m = vec![
        calls(&["a"]),
        Message::tool_result("a", "1"),
        Message::tool_result("a", "2"),
    ];
    assert_eq!(openai(&m), vec![(2, Rule::DuplicateToolResult)]);
}

#[test]
fn results_must_follow_their_call_directly() {
    let m = vec![
        calls(&["a"]),
        Message::user("hurry"),
        Message::tool_result("a", "x"),
    ];
    let v = validate(&m, Profile::OpenAi);
    assert_eq!(
        v.iter().map(|v| (v.index, v.rule)).collect::<Vec<_>>(),
        vec![(2, Rule::ToolResultNotAdjacent)]
    );
    assert!(v[0].detail.contains("message 1"), "{}", v[0].detail);
}

#[test]
fn tool_calls_need_an_id_and_a_name() {
    let m = vec![msg(json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": "{}"}},
            {"id": "b", "type": "function"},
            {"id": "c", "type": "function", "function": {"name": "", "arguments": "{}"}},
        ]
    }))];
    let v = validate(&m, Profile::OpenAi);
    let rules: Vec<_> = v.iter().map(|v| v.rule).collect();
    assert_eq!(
        rules,
        vec![
            Rule::ToolCallWithoutId,
            Rule::ToolCallWithoutName,
            Rule::ToolCallWithoutName,
            Rule::UnansweredToolCall,
            Rule::UnansweredToolCall,
        ]
    );
    assert!(v[1].detail.contains("tool call 1"), "{}", v[1].detail);
    assert!(v[2].detail.contains("tool call 2"), "{}", v[2].detail);

    let answered = |c: ToolCall| {
        vec![
            Message::assistant_tool_calls("", vec![c]),
            Message::tool_result("a", "x"),
        ]
    };
    let mut good = call("a");
    assert_eq!(openai(&answered(good.clone())), vec![]);
    good.id = None;
    assert_eq!(
        openai(&answered(good)),
        vec![(0, Rule::ToolCallWithoutId), (1, Rule::OrphanToolResult)]
    );
}

#[test]
fn internal_keys_are_reported_wherever_they_sit() {
    let m = vec![msg(json!({
        "role": "assistant",
        "content": null,
        "_step": 3,
        "extra": {"_nested": "is not a top-level key"},
        "tool_calls": [{
            "id": "a", "type": "function", "_cache": true,
            "function": {"name": "bash", "arguments": "{}", "_raw": ""}
        }]
    }))];
    let mut m = m;
    m.push(Message::tool_result("a", "x"));
    let v = validate(&m, Profile::OpenAi);
    let details: Vec<_> = v
        .iter()
        .map(|v| (v.index, v.rule, v.detail.as_str()))
        .collect();
    assert_eq!(details.len(), 3, "{details:?}");
    assert!(details.iter().all(|d| d.0 == 0 && d.1 == Rule::InternalKey));
    assert!(details[0].2.contains("`_step`"));
    assert!(details[1].2.contains("`tool_calls[0]._cache`"));
    assert!(details[2].2.contains("`tool_calls[0].function._raw`"));

    let clean = msg(json!({"role": "user", "content": "hi", "extra": {"cost": 1}}));
    assert_eq!(openai(&[clean]), vec![]);
}

#[test]
fn unknown_roles_are_reported() {
    let m = vec![
        msg(json!({"role": "developer", "content": "rules"})),
        Message::user("hi"),
        msg(json!({"role": "exit", "content": "bye"})),
    ];
    assert_eq!(openai(&m), vec![(2, Rule::UnknownRole)]);
    // Strict skips the unknown message for alternation; it is reported once.
    assert_eq!(strict(&m), vec![(2, Rule::UnknownRole)]);
}

#[test]
fn strict_requires_the_user_to_speak_first() {
    let m = vec![Message::system("s"), Message::assistant("hello")];
    assert_eq!(openai(&m), vec![]);
    assert_eq!(strict(&m), vec![(1, Rule::FirstNotUser)]);
    let m = vec![Message::system("s"), Message::user("hi")];
    assert_eq!(strict(&m), vec![]);
}

#[test]
fn strict_requires_alternation() {
    let two_users = vec![Message::user("a"), Message::user("b")];
    assert_eq!(openai(&two_users), vec![]);
    assert_eq!(strict(&two_users), vec![(1, Rule::ConsecutiveSameRole)]);

    let two_assistants = vec![
        Message::user("a"),
        Message::assistant("b"),
        Message::assistant("c"),
    ];
    assert_eq!(
        strict(&two_assistants),
        vec![(2, Rule::ConsecutiveSameRole)]
    );

    // Several results of one turn merge into one user turn: fine. An
    // envelope re-entry after a text assistant turn is the user side: fine.
    let fine = vec![
        Message::user("a"),
        calls(&["x", "y"]),
        Message::tool_result("x", "1"),
        Message::tool_result("y", "2"),
        Message::assistant("b"),
        reentry(),
        Message::assistant("c"),
    ];
    assert_eq!(strict(&fine), vec![]);

    // Decision: a user message right after tool results is a second user turn.
    let after_results = vec![
        Message::user("a"),
        calls(&["x"]),
        Message::tool_result("x", "1"),
        Message::user("and also"),
    ];
    assert_eq!(openai(&after_results), vec![]);
    assert_eq!(strict(&after_results), vec![(3, Rule::ConsecutiveSameRole)]);
}

#[test]
fn every_violation_is_reported_in_index_order() {
    let mut ghost = msg(json!({"role": "exit", "content": ""}));
    ghost.extra.insert("_t".into(), json!(1));
    let m = vec![
        Message::assistant("I start"),           // 0: first-not-user (strict)
        calls(&["a", "b"]),                      // 1: consecutive, b unanswered
        Message::tool_result("a", "x"),          // 2
        Message::tool_result("a", "x"),          // 3: duplicate result
        Message::tool_result("zzz", "x"),        // 4: orphan
        ghost,                                   // 5: unknown role, internal key
        Message::new(Role::Tool, Content::Null), // 6: no id
        calls(&["a"]),                           // 7: duplicate id, unanswered
    ];
    assert_eq!(
        openai(&m),
        vec![
            (1, Rule::UnansweredToolCall),
            (3, Rule::DuplicateToolResult),
            (4, Rule::OrphanToolResult),
            (5, Rule::UnknownRole),
            (5, Rule::InternalKey),
            (6, Rule::ToolResultWithoutId),
            (7, Rule::DuplicateToolCallId),
            (7, Rule::UnansweredToolCall),
        ]
    );
    let s = strict(&m);
    assert_eq!(s.len(), 8 + 2, "{s:?}");
    assert_eq!(s[0], (0, Rule::FirstNotUser));
    assert!(s.contains(&(1, Rule::ConsecutiveSameRole)));
}

#[test]
fn rule_names_are_stable_kebab_case_and_match_serde() {
    let mut seen = std::collections::HashSet::new();
    for rule in Rule::ALL {
        let name = rule.name();
        assert!(seen.insert(name), "duplicate name {name}");
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '-'));
        assert_eq!(serde_json::to_value(rule).unwrap(), json!(name));
        assert_eq!(Rule::from_name(name), Some(rule));
        assert_eq!(rule.to_string(), name);
    }
    assert_eq!(Rule::OrphanToolResult.name(), "orphan-tool-result");
    assert_eq!(Rule::from_name("nope"), None);

    let v = Violation::new(4, Rule::UnknownRole, "role `exit`");
    assert_eq!(
        serde_json::to_value(&v).unwrap(),
        json!({"index": 4, "rule": "unknown-role", "detail": "role `exit`"})
    );
    assert_eq!(v.to_string(), "message 4: unknown-role: role `exit`");
}

#[test]
fn profiles_parse_from_their_names() {
    assert_eq!("openai".parse::<Profile>(), Ok(Profile::OpenAi));
    assert_eq!("strict".parse::<Profile>(), Ok(Profile::Strict));
    let err = "anthropic".parse::<Profile>().unwrap_err();
    assert_eq!(err.given, "anthropic");
    assert!(err.to_string().contains("`anthropic`"));
    assert_eq!(
        serde_json::to_value(Profile::OpenAi).unwrap(),
        json!("openai")
    );
    assert_eq!(Profile::default(), Profile::OpenAi);
}

#[test]
fn envelopes_mark_a_user_message_as_a_tool_reentry() {
    assert!(is_tool_reentry(&reentry()));
    assert!(!is_real_user_turn(
        &[reentry()],
        0,
        context_engine::validate::auto_text_actions()
    ));
    // Both markers are needed.
    assert!(!is_tool_reentry(&Message::user("[bash]\nls\n[/bash]")));
    assert!(!is_tool_reentry(&Message::user(
        "see [/x] [END TOOL RESULTS]"
    )));
    assert!(is_real_user_turn(
        &[Message::user("see [/x] [END TOOL RESULTS]")],
        0,
        context_engine::validate::auto_text_actions()
    ));
    // Only user messages re-enter.
    assert!(!is_tool_reentry(&Message::assistant(ENVELOPE)));
    assert!(!is_real_user_turn(
        &[Message::assistant("hi")],
        0,
        context_engine::validate::auto_text_actions()
    ));
    // Content parts are read as text.
    let parts = Message::new(
        Role::User,
        Content::Parts(vec![
            ContentPart::new_text("[bash]\nls\n[/bash]"),
            ContentPart::new_text("[END TOOL RESULTS]"),
        ]),
    );
    assert!(is_tool_reentry(&parts));
}

/// system, user, call(a,b), a, b, text, re-entry, user.
fn sample() -> Vec<Message> {
    vec![
        Message::system("s"),
        Message::user("u"),
        calls(&["a", "b"]),
        Message::tool_result("a", "x"),
        Message::tool_result("b", "y"),
        Message::assistant("t"),
        reentry(),
        Message::user("u2"),
    ]
}

#[test]
fn cut_points_keep_calls_with_results_and_reentries_with_their_turn() {
    let m = sample();
    let cuts = CutPoints::new(&m, context_engine::validate::auto_text_actions());
    assert_eq!(cuts.len(), 8);
    assert_eq!(cuts.iter().collect::<Vec<_>>(), vec![0, 1, 2, 5, 7, 8]);
    for i in [3, 4, 6, 9] {
        assert!(!cuts.is_safe(i), "{i}");
    }
    assert_eq!(
        cuts.groups().collect::<Vec<_>>(),
        vec![0..1, 1..2, 2..5, 5..7, 7..8]
    );
    assert_eq!(
        atomic_groups(&m, context_engine::validate::auto_text_actions()),
        cuts.groups().collect::<Vec<_>>()
    );
    assert_eq!(
        CutPoints::with_profile(
            &m,
            Profile::Strict,
            context_engine::validate::auto_text_actions()
        )
        .iter()
        .len(),
        6
    );
}

#[test]
fn nearest_safe_boundaries() {
    let cuts = CutPoints::new(&sample(), context_engine::validate::auto_text_actions());
    assert_eq!(cuts.at_or_before(4), 2);
    assert_eq!(cuts.at_or_before(5), 5);
    assert_eq!(cuts.at_or_before(6), 5);
    assert_eq!(cuts.at_or_before(0), 0);
    assert_eq!(cuts.at_or_before(100), 8);
    assert_eq!(cuts.at_or_after(3), 5);
    assert_eq!(cuts.at_or_after(6), 7);
    assert_eq!(cuts.at_or_after(8), 8);
    assert_eq!(cuts.at_or_after(100), 8);
}

#[test]
fn the_ends_are_always_safe() {
    let empty = CutPoints::new(&[], context_engine::validate::auto_text_actions());
    assert!(empty.is_empty());
    assert_eq!(empty.iter().collect::<Vec<_>>(), vec![0]);
    assert_eq!(empty.groups().count(), 0);
    assert_eq!(empty.at_or_after(0), 0);

    // Even a transcript that starts on a tool result.
    let cuts = CutPoints::new(
        &[Message::tool_result("a", "x"), reentry()],
        context_engine::validate::auto_text_actions(),
    );
    assert_eq!(cuts.iter().collect::<Vec<_>>(), vec![0, 2]);
}

#[test]
fn a_late_result_stays_with_its_call() {
    // Invalid, but a cut must not make it worse by separating the two.
    let m = vec![
        calls(&["a"]),
        Message::user("hurry"),
        Message::tool_result("a", "x"),
        Message::user("next"),
    ];
    assert_eq!(
        atomic_groups(&m, context_engine::validate::auto_text_actions()),
        vec![0..3, 3..4]
    );
}

#[test]
fn can_remove_checks_boundaries_and_the_strict_join() {
    let m = sample();
    let cuts = CutPoints::new(&m, context_engine::validate::auto_text_actions());
    assert!(cuts.can_remove(2, 5));
    assert!(cuts.can_remove(5, 5));
    assert!(!cuts.can_remove(3, 5));
    assert!(!cuts.can_remove(5, 2));
    assert!(!cuts.can_remove(0, 9));

    let m = vec![
        Message::system("s"),
        Message::user("u1"),
        Message::assistant("a1"),
        Message::user("u2"),
        Message::assistant("a2"),
    ];
    let loose = CutPoints::new(&m, context_engine::validate::auto_text_actions());
    let cuts = CutPoints::with_profile(
        &m,
        Profile::Strict,
        context_engine::validate::auto_text_actions(),
    );
    assert!(loose.can_remove(2, 3));
    assert!(!cuts.can_remove(2, 3), "u1 would meet u2");
    assert!(cuts.can_remove(2, 4), "u1 meets a2");
    assert!(cuts.can_remove(1, 3), "u2 becomes the first turn");
    assert!(!cuts.can_remove(1, 2), "a1 would come first");
    assert!(cuts.can_remove(1, 5), "nothing left but the system prompt");
    assert!(cuts.can_remove(3, 5), "the tail may go");
}
