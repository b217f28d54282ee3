#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Never over the window: replayed at a half, a third and a quarter of each
//! session's peak request, on every corpus transcript and on generated
//! sessions, no request the host would send is larger than the window
//! wherever the first request fits; and for generated transcripts, any
//! window at least as large as the system prompt, the latest ask and a
//! fixed minimum gets a request that fits and is valid.

use std::sync::Arc;

use context_engine::compressor::{Compressor, CompressorOptions, fit};
use context_engine::host::{HostOptions, Session};
use context_engine::replay::{ReplayOptions, replay};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::validate::{
    Profile, introduced_adjacency, introduced_violation, is_real_user_turn,
};
use context_engine::{Message, ToolCall};
use proptest::prelude::*;

use context_engine_testkit as common;

/// Tokens a window must hold beyond the system prompt and the latest ask.
const MIN_ROOM: u64 = 64;

fn counter() -> Arc<dyn TokenCounter> {
    Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)))
}

/// Replays `messages` at `window` under `profile`; panics when a request
/// the host would send is over the window (only where the first fits).
fn assert_never_over(name: &str, messages: &[Message], window: u64, profile: Profile) {
    let counter = counter();
    let engine = Compressor::with_options(
        Arc::clone(&counter),
        window,
        CompressorOptions::default().with_profile(profile),
    );
    let mut session = Session::new("fit", Box::new(engine), Arc::clone(&counter))
        .with_options(HostOptions::default().with_profile(profile));
    let options = ReplayOptions::default().with_profile(profile);
    let report = replay(
        messages,
        &mut session,
        counter.as_ref(),
        &options,
        |_, _| {},
    )
    .unwrap();
    let first_fits = report.calls[0].tokens_without_engine <= window;
    let t = &report.totals;
    let r = &report.retention;
    eprintln!(
        "{name} [{profile}] window {window}: {} calls, {} over, {} unfittable, {} fitted; facts kept {}/{} ({} verbatim, {} in summary, {} recallable)",
        t.calls,
        t.over_window.requests,
        t.unfittable_calls.len(),
        t.fitted,
        r.verbatim + r.in_summary + r.recallable,
        r.probes,
        r.verbatim,
        r.in_summary,
        r.recallable
    );
    for c in &report.calls {
        assert_eq!(c.violations_introduced, 0, "{name}: call {}", c.call + 1);
    }
    if first_fits {
        assert_eq!(
            t.over_window.requests, 0,
            "{name} [{profile}] at window {window}: requests over the window at calls {:?} (largest {})",
            t.over_window.calls, t.over_window.largest
        );
    }
}

/// The largest request of the unmanaged session.
fn peak(messages: &[Message], counter: &dyn TokenCounter) -> u64 {
    messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == context_engine::Role::Assistant)
        .map(|(i, _)| counter.count_messages(&messages[..i]) as u64)
        .max()
        .unwrap_or(0)
}

#[test]
fn no_corpus_request_goes_out_over_the_window() {
    let Some(files) = common::corpus_files() else {
        return;
    };
    let counter = counter();
    for path in &files {
        let transcript = Transcript::load(path).unwrap();
        let messages = &transcript.messages;
        let peak = peak(messages, counter.as_ref());
        for d in [2, 3, 4] {
            for profile in Profile::ALL {
                assert_never_over(&common::name(path), messages, peak / d, profile);
            }
        }
    }
}

/// A session of `asks` user asks, each followed by `rounds` tool rounds
/// whose outputs grow to `bytes`, and a closing answer.
fn session(asks: usize, rounds: usize, bytes: usize) -> Vec<Message> {
    let mut m = vec![Message::system(
        "You are a coding agent. Use the tools; answer briefly.",
    )];
    let mut id = 0;
    for a in 0..asks {
        m.push(Message::user(format!(
            "Ask {a}: fix the failing test in tests/test_{a}.py and explain the cause."
        )));
        for r in 0..rounds {
            id += 1;
            let call = format!("call_{id}");
            let args = format!(
                r#"{{"command":"python -m pytest tests/test_{a}.py -k case_{r}","note":"{}"}}"#,
                "x".repeat(r * 40)
            );
            m.push(Message::assistant_tool_calls(
                format!("Round {r}: running the test."),
                vec![ToolCall::function(call.clone(), "bash", args)],
            ));
            let body: String = (0..(bytes * (r + 1) / rounds.max(1)) / 40)
                .map(|k| format!("tests/test_{a}.py::case_{k} PASSED  [{k:>3}%]\n"))
                .collect();
            m.push(Message::tool_result(call, body));
        }
        m.push(Message::assistant(format!(
            "Fixed ask {a}: the parser dropped the last token."
        )));
    }
    m
}

#[test]
fn no_generated_request_goes_out_over_the_window() {
    let counter = counter();
    for (asks, rounds, bytes) in [
        (1, 12, 8_000),
        (3, 6, 20_000),
        (6, 4, 3_000),
        (2, 3, 60_000),
    ] {
        let messages = session(asks, rounds, bytes);
        let peak = peak(&messages, counter.as_ref());
        for d in [2, 3, 4] {
            for profile in Profile::ALL {
                let name = format!("generated {asks}x{rounds}x{bytes}");
                assert_never_over(&name, &messages, peak / d, profile);
            }
        }
    }
}

fn arb_session() -> impl Strategy<Value = Vec<Message>> {
    (1usize..4, 1usize..8, 200usize..30_000, 0usize..3).prop_map(|(asks, rounds, bytes, trim)| {
        let mut m = session(asks, rounds, bytes);
        // End on tool results or on a fresh ask, as requests do.
        for _ in 0..trim.min(m.len() - 2) {
            m.pop();
        }
        if m.last()
            .is_some_and(|x| x.role == context_engine::Role::Assistant && !x.has_tool_calls())
        {
            m.push(Message::user("Now also update the changelog."));
        }
        m
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_window_above_the_core_gets_a_valid_request_that_fits(
        messages in arb_session(),
        extra in 0u64..20_000,
        strict in any::<bool>(),
    ) {
        let profile = if strict { Profile::Strict } else { Profile::OpenAi };
        let counter = counter();
        let system = fit::system_prompt_tokens(&messages, counter.as_ref());
        let ask = (0..messages.len())
            .rev()
            .find(|&i| is_real_user_turn(&messages, i, context_engine::validate::auto_text_actions()))
            .map_or(0, |i| counter.count_message(&messages[i]) as u64);
        let window = system + ask + MIN_ROOM + extra;
        let fitted = fit::fit(&messages, window, counter.as_ref(), profile, context_engine::validate::auto_text_actions()).unwrap();
        prop_assert!(fitted.tokens_after <= window);
        prop_assert_eq!(fitted.tokens_after, counter.count_messages(&fitted.messages) as u64);
        prop_assert!(introduced_violation(&messages, &fitted.messages, profile).is_none());
        prop_assert_eq!(introduced_adjacency(&messages, &fitted.messages, profile), None);

        // Through the host, with the compressor: the request it prepares
        // fits and is valid.
        let engine = Compressor::with_options(
            Arc::clone(&counter),
            window,
            CompressorOptions::default().with_profile(profile),
        );
        let mut session = Session::new("prop", Box::new(engine), Arc::clone(&counter))
            .with_options(HostOptions::default().with_profile(profile));
        let prepared = session.before_request(&messages);
        prop_assert!(prepared.unfittable.is_none());
        prop_assert!(prepared.request_tokens <= window, "{} > {}", prepared.request_tokens, window);
        prop_assert!(introduced_violation(&messages, &prepared.request, profile).is_none());
    }
}
