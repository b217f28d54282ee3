#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The cut-point invariant over generated transcripts: removing the range
//! between any two safe boundaries of a valid transcript leaves a valid one.

use context_engine::validate::{CutPoints, Profile, Rule, is_tool_reentry, validate};
use context_engine::{Message, ToolCall};
use proptest::prelude::*;

/// One building block of a valid transcript.
#[derive(Clone, Debug)]
enum Block {
    User,
    Text,
    /// An assistant turn calling this many tools, then all their results.
    Tools(usize),
    /// An assistant text turn and a user message with tool-result envelopes.
    Envelope,
}

fn block() -> impl Strategy<Value = Block> {
    prop_oneof![
        Just(Block::User),
        Just(Block::Text),
        (1usize..=3).prop_map(Block::Tools),
        Just(Block::Envelope),
    ]
}

fn push(out: &mut Vec<Message>, block: &Block, next_id: &mut usize) {
    match block {
        Block::User => out.push(Message::user("please")),
        Block::Text => out.push(Message::assistant("thinking")),
        Block::Tools(k) => {
            let ids: Vec<String> = (0..*k)
                .map(|_| {
                    *next_id += 1;
                    format!("call_{next_id}")
                })
                .collect();
            let calls = ids
                .iter()
                .map(|id| ToolCall::function(id.as_str(), "bash", "{}"))
                .collect();
            out.push(Message::assistant_tool_calls("", calls));
            for id in &ids {
                out.push(Message::tool_result(id.as_str(), "ok"));
            }
        }
        Block::Envelope => {
            out.push(Message::assistant("[bash]\nls\n[/bash]"));
            out.push(Message::user(
                "[bash]\nfile.txt\n[/bash]\n[END TOOL RESULTS]",
            ));
        }
    }
}

/// Any order of blocks: valid under the OpenAI profile.
fn openai_transcript() -> impl Strategy<Value = Vec<Message>> {
    (any::<bool>(), prop::collection::vec(block(), 0..14)).prop_map(|(system, blocks)| {
        let mut out = Vec::new();
        if system {
            out.push(Message::system("you are an agent"));
        }
        let mut next_id = 0;
        for b in &blocks {
            push(&mut out, b, &mut next_id);
        }
        out
    })
}

/// A user message, then assistant turns each answered on the user side:
/// valid under the strict profile too.
fn strict_transcript() -> impl Strategy<Value = Vec<Message>> {
    let turn = prop_oneof![
        Just(vec![Block::Text, Block::User]),
        (1usize..=3).prop_map(|k| vec![Block::Tools(k)]),
        Just(vec![Block::Envelope]),
    ];
    (
        any::<bool>(),
        prop::collection::vec(turn, 0..10),
        any::<bool>(),
    )
        .prop_map(|(system, turns, last_text)| {
            let mut out = Vec::new();
            if system {
                out.push(Message::system("you are an agent"));
            }
            let mut next_id = 0;
            push(&mut out, &Block::User, &mut next_id);
            for b in turns.iter().flatten() {
                push(&mut out, b, &mut next_id);
            }
            if last_text {
                push(&mut out, &Block::Text, &mut next_id);
            }
            out
        })
}

fn cut(m: &[Message], a: usize, b: usize) -> Vec<Message> {
    m[..a].iter().chain(&m[b..]).cloned().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn removing_between_safe_boundaries_stays_valid(m in openai_transcript()) {
        prop_assert_eq!(validate(&m, Profile::OpenAi), vec![]);
        let cuts = CutPoints::new(&m, context_engine::validate::auto_text_actions());
        let safe: Vec<usize> = cuts.iter().collect();
        for (k, &a) in safe.iter().enumerate() {
            for &b in &safe[k..] {
                prop_assert!(cuts.can_remove(a, b));
                let rest = cut(&m, a, b);
                let v = validate(&rest, Profile::OpenAi);
                prop_assert!(v.is_empty(), "cut {}..{}: {:?}", a, b, v);
            }
        }
    }

    #[test]
    fn tails_never_start_on_a_result_or_a_reentry(m in openai_transcript()) {
        let cuts = CutPoints::new(&m, context_engine::validate::auto_text_actions());
        for (i, message) in m.iter().enumerate().skip(1) {
            if message.is_tool_result() || is_tool_reentry(message) {
                prop_assert!(!cuts.is_safe(i), "boundary {} is safe", i);
            }
            // A head ending right after a call would leave it unanswered.
            if m[i - 1].has_tool_calls() {
                prop_assert!(!cuts.is_safe(i));
            }
        }
        // The atomic groups tile the transcript.
        let groups: Vec<_> = cuts.groups().collect();
        prop_assert_eq!(groups.first().map_or(0, |g| g.start), 0);
        prop_assert_eq!(groups.last().map_or(0, |g| g.end), m.len());
        prop_assert!(groups.windows(2).all(|w| w[0].end == w[1].start && w[0].start < w[0].end));
    }

    #[test]
    fn nearest_boundaries_match_a_linear_scan(m in openai_transcript(), i in 0usize..40) {
        let cuts = CutPoints::new(&m, context_engine::validate::auto_text_actions());
        let n = m.len();
        let before = (0..=i.min(n)).rev().find(|&b| cuts.is_safe(b)).unwrap();
        let after = (i.min(n)..=n).find(|&b| cuts.is_safe(b)).unwrap();
        prop_assert_eq!(cuts.at_or_before(i), before);
        prop_assert_eq!(cuts.at_or_after(i), if i > n { n } else { after });
    }

    #[test]
    fn dropping_a_single_result_is_caught(m in openai_transcript()) {
        for (i, message) in m.iter().enumerate() {
            if !message.is_tool_result() {
                continue;
            }
            let owner = (0..i).rev().find(|&k| m[k].has_tool_calls()).unwrap();
            let v = validate(&cut(&m, i, i + 1), Profile::OpenAi);
            prop_assert!(
                v.iter().any(|v| v.index == owner && v.rule == Rule::UnansweredToolCall),
                "{:?}", v
            );
        }
    }

    #[test]
    fn strict_joins_are_exactly_the_valid_ones(m in strict_transcript()) {
        prop_assert_eq!(validate(&m, Profile::Strict), vec![]);
        let cuts = CutPoints::with_profile(&m, Profile::Strict, context_engine::validate::auto_text_actions());
        let safe: Vec<usize> = cuts.iter().collect();
        for (k, &a) in safe.iter().enumerate() {
            for &b in &safe[k..] {
                let v = validate(&cut(&m, a, b), Profile::Strict);
                prop_assert_eq!(cuts.can_remove(a, b), v.is_empty(), "cut {}..{}: {:?}", a, b, v);
            }
        }
    }
}
