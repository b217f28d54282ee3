#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Property tests of the compressor over generated tool-calling sessions
//! (parallel calls included): the output validates, keeps the system prompt
//! and the latest user message, and never grows.

use std::sync::Arc;

use context_engine::compressor::{Compressor, CompressorOptions};
use context_engine::engine::{CompressRequest, ContextEngine, EngineError};
use context_engine::tokens::{CountOptions, EstimateCounter, TokenCounter};
use context_engine::validate::{Profile, introduced_adjacency, is_real_user_turn, validate};
use context_engine::{Message, ToolCall};
use proptest::prelude::*;

/// One exchange: a user ask, some tool rounds (each with 1-3 parallel
/// calls), a final assistant text. Valid under both profiles.
#[derive(Clone, Debug)]
struct Exchange {
    ask_words: usize,
    rounds: Vec<Vec<usize>>,
    answer_words: usize,
}

fn exchange() -> impl Strategy<Value = Exchange> {
    (
        1usize..80,
        prop::collection::vec(prop::collection::vec(1usize..400, 1..4), 0..4),
        1usize..60,
    )
        .prop_map(|(ask_words, rounds, answer_words)| Exchange {
            ask_words,
            rounds,
            answer_words,
        })
}

fn build(exchanges: &[Exchange]) -> Vec<Message> {
    let mut out = vec![Message::system("You are an agent. Follow the rules.")];
    let mut id = 0;
    for (e, ex) in exchanges.iter().enumerate() {
        out.push(Message::user(format!(
            "ask {e}: {}",
            "please fix src/a.py ".repeat(ex.ask_words)
        )));
        for round in &ex.rounds {
            let ids: Vec<String> = round
                .iter()
                .map(|_| {
                    id += 1;
                    format!("call_{id}")
                })
                .collect();
            let calls = ids
                .iter()
                .map(|i| ToolCall::function(i.clone(), "bash", r#"{"command": "ls"}"#))
                .collect();
            out.push(Message::assistant_tool_calls("", calls));
            for (i, lines) in ids.iter().zip(round) {
                out.push(Message::tool_result(
                    i.clone(),
                    "output line\n".repeat(*lines),
                ));
            }
        }
        out.push(Message::assistant(format!(
            "done {e}: {}",
            "word ".repeat(ex.answer_words)
        )));
    }
    out
}

fn check(messages: &[Message], context_length: u64, profile: Profile) {
    let counter: Arc<dyn TokenCounter> = Arc::new(EstimateCounter::new(CountOptions::default()));
    assert!(validate(messages, profile).is_empty());
    let mut engine = Compressor::with_options(
        counter.clone(),
        context_length,
        CompressorOptions::default().with_profile(profile),
    );
    match engine.compress(messages, &CompressRequest::new()) {
        Ok(compaction) => {
            let out = compaction.messages;
            let violations = validate(&out, profile);
            assert!(violations.is_empty(), "{violations:?}");
            assert!(out[0].text().starts_with(messages[0].text().as_ref()));
            assert!(counter.count_messages(&out) < counter.count_messages(messages));
            let latest = (0..messages.len())
                .rev()
                .find(|&i| {
                    is_real_user_turn(messages, i, context_engine::validate::auto_text_actions())
                })
                .map(|i| &messages[i])
                .unwrap();
            // The summary may be merged into it (both roles would collide
            // next to it): its own words stay, at the end.
            let text = latest.text();
            assert!(out.iter().any(|m| m.text().ends_with(text.as_ref())));
            // No new same-role pair, whatever the profile.
            assert_eq!(introduced_adjacency(messages, &out, profile), None);
            assert_eq!(engine.state().compression_count, 1);
        }
        Err(EngineError::NothingToCompress { .. }) => {}
        Err(other) => panic!("unexpected error: {other}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn openai_output_validates_keeps_and_shrinks(
        exchanges in prop::collection::vec(exchange(), 1..12),
        context_length in 300u64..20_000,
    ) {
        check(&build(&exchanges), context_length, Profile::OpenAi);
    }

    #[test]
    fn strict_output_validates_keeps_and_shrinks(
        exchanges in prop::collection::vec(exchange(), 1..12),
        context_length in 300u64..20_000,
    ) {
        check(&build(&exchanges), context_length, Profile::Strict);
    }
}

/// The generator does produce sessions that compact (the properties above
/// are not vacuously satisfied by `NothingToCompress`).
#[test]
fn a_long_generated_session_compacts_under_both_profiles() {
    let ex = Exchange {
        ask_words: 20,
        rounds: vec![vec![300, 200], vec![100], vec![50, 60, 70]],
        answer_words: 30,
    };
    let messages = build(&vec![ex; 10]);
    for profile in Profile::ALL {
        let counter: Arc<dyn TokenCounter> =
            Arc::new(EstimateCounter::new(CountOptions::default()));
        let mut engine = Compressor::with_options(
            counter,
            4_000,
            CompressorOptions::default().with_profile(profile),
        );
        let out = engine
            .compress(&messages, &CompressRequest::new())
            .unwrap()
            .messages;
        assert!(out.len() < messages.len());
        check(&messages, 4_000, profile);
    }
}
