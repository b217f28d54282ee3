#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The prune over generated transcripts: the output is valid whenever the
//! input is, never costs more tokens (per message or in total), keeps every
//! message's role and `tool_call_id`, leaves the protected tail alone, and
//! pruning it again changes nothing.

use std::borrow::Cow;

use context_engine::prune::{PruneOptions, protected_from, prune};
use context_engine::tokens::{BpeCounter, Encoding, TokenCounter};
use context_engine::validate::{Profile, validate};
use context_engine::{Message, ToolCall};
use proptest::prelude::*;

/// Calls the rules know (reads, partial reads, edits, re-runs, long and
/// broken arguments) and some they do not.
const CALLS: &[(&str, &str)] = &[
    ("bash", r#"{"command":"cat /t/a.py"}"#),
    ("bash", r#"{"command":"cd /t && cat a.py"}"#),
    ("bash", r#"{"command":"sed -n '1,40p' /t/b.py"}"#),
    ("bash", r#"{"command":"python reproduce.py"}"#),
    ("bash", r#"{"command":"sed -i 's/a/b/' /t/b.py"}"#),
    (
        "str_replace_editor",
        r#"{"command":"view","path":"/t/b.py"}"#,
    ),
    (
        "str_replace_editor",
        r#"{"command":"str_replace","path":"/t/a.py","old_str":"a","new_str":"b"}"#,
    ),
    ("scroll_down", "{}"),
    ("bash", "{\"command\": \"echo"),
];

#[derive(Clone, Debug)]
enum Block {
    User,
    Tools(Vec<(usize, usize, bool)>),
}

fn block() -> impl Strategy<Value = Block> {
    prop_oneof![
        1 => Just(Block::User),
        4 => prop::collection::vec((0..CALLS.len(), 0usize..4, any::<bool>()), 1..=2)
            .prop_map(Block::Tools),
    ]
}

/// Bodies from a small pool (so duplicates happen), one of them large
/// enough to digest.
fn body(k: usize) -> String {
    let lines = [3, 60, 120, 400][k];
    (0..lines).map(|i| format!("body {k} line {i}\n")).collect()
}

fn transcript() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec(block(), 0..14).prop_map(|blocks| {
        let mut out = vec![Message::system("agent"), Message::user("task")];
        let mut next = 0;
        for b in blocks {
            match b {
                Block::User => out.push(Message::user("go on")),
                Block::Tools(calls) => {
                    let mut results = Vec::new();
                    let mut tcs = Vec::new();
                    for (c, k, long) in calls {
                        next += 1;
                        let id = format!("call_{next}");
                        let (name, mut args) = (CALLS[c].0, CALLS[c].1.to_owned());
                        if long && args.ends_with("\"}") {
                            args = format!(
                                "{},\"note\":\"{}\"}}",
                                &args[..args.len() - 1],
                                "n".repeat(900)
                            );
                        }
                        tcs.push(ToolCall::function(id.as_str(), name, args));
                        results.push(Message::tool_result(id, body(k)));
                    }
                    out.push(Message::assistant_tool_calls("", tcs));
                    out.extend(results);
                }
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn prune_is_valid_shorter_and_faithful(
        m in transcript(),
        protect in 0usize..8,
        min in prop_oneof![Just(0u64), Just(500), Just(4096)],
    ) {
        let counter = BpeCounter::new(Encoding::O200kBase);
        let opts = PruneOptions {
            proactive_prune_tokens: 1,
            min_reclaim_tokens: min,
            protect_last_n: protect,
            ..PruneOptions::default()
        };
        prop_assert_eq!(validate(&m, Profile::OpenAi), vec![]);
        let out = prune(&m, None, &opts, &counter);
        // Exactly the reported messages change, and the tokens add up.
        let changed = m.iter().zip(out.messages.iter()).filter(|(a, b)| a != b).count();
        prop_assert_eq!(changed, out.pruned);
        prop_assert_eq!(out.tokens_after, out.tokens_before - out.reclaimed_tokens);
        prop_assert_eq!(validate(&out.messages, Profile::OpenAi), vec![]);
        prop_assert_eq!(out.messages.len(), m.len());
        for (a, b) in m.iter().zip(out.messages.iter()) {
            prop_assert_eq!(&a.role, &b.role);
            prop_assert_eq!(&a.tool_call_id, &b.tool_call_id);
            let ids = |x: &Message| x.tool_calls().iter().map(|c| c.id.clone()).collect::<Vec<_>>();
            prop_assert_eq!(ids(a), ids(b));
            prop_assert!(counter.count_message(b) <= counter.count_message(a));
        }
        let tail = protected_from(&m, protect, context_engine::validate::auto_text_actions());
        prop_assert_eq!(&out.messages[tail..], &m[tail..]);
        prop_assert_eq!(
            counter.count_messages(&out.messages) as u64,
            counter.count_messages(&m) as u64 - out.reclaimed_tokens
        );
        if out.pruned == 0 {
            prop_assert!(matches!(out.messages, Cow::Borrowed(_)));
        } else {
            prop_assert!(out.reclaimed_tokens >= min);
            let again = prune(&out.messages, None, &PruneOptions { min_reclaim_tokens: 0, ..opts }, &counter);
            prop_assert_eq!(again.pruned, 0, "{:?}", again.changes);
        }
    }
}
