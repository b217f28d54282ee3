#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `validate` and `CutPoints` on real agent transcripts from the shared
//! corpus (skipped with a reason when the corpus is absent).

use context_engine::Message;
use context_engine::validate::{CutPoints, Profile, Rule, reentries_with, validate};
use serde_json::Value;

use context_engine_testkit as common;

fn corpus(name: &str) -> Option<Vec<Message>> {
    let path = common::corpus_dir()?.join(name);
    let Ok(text) = std::fs::read_to_string(&path) else {
        common::skip(&format!("corpus file {} not found", path.display()));
        return None;
    };
    let value: Value = serde_json::from_str(&text).unwrap();
    let items = match value {
        Value::Array(items) => items,
        Value::Object(mut o) => match o.remove("messages").or_else(|| o.remove("history")) {
            Some(Value::Array(items)) => items,
            _ => panic!("{name}: no message list"),
        },
        _ => panic!("{name}: not a transcript"),
    };
    Some(
        items
            .into_iter()
            .map(|v| Message::from_value(v).unwrap())
            .collect(),
    )
}

fn pairs(v: &[context_engine::validate::Violation]) -> Vec<(usize, Rule)> {
    v.iter().map(|v| (v.index, v.rule)).collect()
}

#[test]
fn mini_swe_agent_tool_calling_run() {
    let Some(m) = corpus("mini_astropy12907.traj.json") else {
        return;
    };
    assert_eq!(m.len(), 130);
    // The run ends with a `submit`-style call that is never answered, then
    // mini-swe-agent's own `exit` message: both must go before a request.
    let expected = vec![(128, Rule::UnansweredToolCall), (129, Rule::UnknownRole)];
    assert_eq!(pairs(&validate(&m, Profile::OpenAi)), expected);
    assert_eq!(pairs(&validate(&m, Profile::Strict)), expected);

    let cuts = CutPoints::new(&m, context_engine::validate::auto_text_actions());
    // Every call is glued to its result: 63 answered pairs, so 63 boundaries
    // are unsafe.
    assert_eq!(cuts.iter().len(), m.len() + 1 - 63);
    for (i, message) in m.iter().enumerate() {
        assert_eq!(cuts.is_safe(i), !message.is_tool_result(), "boundary {i}");
    }

    // Cutting between safe boundaries never adds a violation: the trailing
    // problems stay or go, nothing new appears.
    let safe: Vec<usize> = cuts.iter().collect();
    for (k, &a) in safe.iter().enumerate() {
        for &b in safe[k..].iter().take(4).chain([&m.len()]) {
            let rest: Vec<Message> = m[..a].iter().chain(&m[b..]).cloned().collect();
            let v = validate(&rest, Profile::OpenAi);
            assert!(v.len() <= 2, "cut {a}..{b}: {v:?}");
            assert!(
                v.iter()
                    .all(|v| matches!(v.rule, Rule::UnansweredToolCall | Rule::UnknownRole)),
                "cut {a}..{b}: {v:?}"
            );
        }
    }
}

#[test]
fn text_action_transcripts_alternate() {
    for name in ["mini_github_issue.traj.json", "mini_local.traj.json"] {
        let Some(m) = corpus(name) else {
            return;
        };
        assert_eq!(validate(&m, Profile::OpenAi), vec![], "{name}");
        assert_eq!(validate(&m, Profile::Strict), vec![], "{name}");
        // No tool messages, but each observation (the output of the
        // action before it, sent as a user message) stays with its action:
        // every boundary but the ones before an observation is safe.
        let observations = reentries_with(&m, context_engine::validate::auto_text_actions())
            .iter()
            .filter(|r| **r)
            .count();
        assert!(observations > 0, "{name}");
        assert_eq!(
            CutPoints::new(&m, context_engine::validate::auto_text_actions())
                .iter()
                .len(),
            m.len() + 1 - observations,
            "{name}"
        );
    }
}

#[test]
fn swe_agent_tool_call_ids_lists_are_not_wire_format() {
    // SWE-agent's tool messages carry `tool_call_ids: [..]`; the transcript
    // loader converts them. Unconverted, each result lacks its id.
    let Some(m) = corpus("sweagent_fc_simple.traj") else {
        return;
    };
    let v = validate(&m, Profile::OpenAi);
    let tools = m.iter().filter(|m| m.is_tool_result()).count();
    assert!(tools > 0);
    assert_eq!(
        v.iter()
            .filter(|v| v.rule == Rule::ToolResultWithoutId)
            .count(),
        tools
    );
}
