#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The digest on real agent transcripts, replayed turn by turn: each
//! assistant message is one model call whose request is everything before
//! it. Checks prefix stability (only the previously newest batch changes from
//! one request to the next) and prints the tokens the digest saves.
//! Skipped with a printed reason when the corpus is absent.

use context_engine::Message;
use context_engine::digest::{DigestOptions, digest, digest_with_report};
use context_engine::message::Role;
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::validate::{Profile, reentries_with, validate};

use context_engine_testkit as common;

fn transcripts() -> Vec<(String, Vec<Message>)> {
    let Some(files) = common::corpus_files() else {
        return Vec::new();
    };
    files
        .iter()
        .map(|p| (common::name(p), Transcript::load(p).unwrap().messages))
        .collect()
}

/// The request of every model call in the replay.
fn requests(m: &[Message]) -> impl Iterator<Item = &[Message]> {
    m.iter()
        .enumerate()
        .filter(|(_, x)| x.role == Role::Assistant)
        .map(|(i, _)| &m[..i])
}

/// Where the `keep`-th newest batch starts; the length when there are
/// fewer batches (nothing is digested, so everything must stay).
fn kept_batches_start(m: &[Message], keep: usize) -> usize {
    // Tool re-entries (text envelopes and the observations of text-action
    // agents) are batches of their own, as in the digest.
    let reentry = reentries_with(m, context_engine::validate::auto_text_actions());
    let starts: Vec<usize> = m
        .iter()
        .enumerate()
        .filter(|(i, x)| x.has_tool_calls() || x.function_call.is_some() || reentry[*i])
        .map(|(i, _)| i)
        .collect();
    match starts.len().checked_sub(keep) {
        Some(k) => starts[k],
        None => m.len(),
    }
}

fn json(m: &Message) -> String {
    m.to_value().to_string()
}

#[test]
fn replayed_corpus_requests_keep_their_prefix() {
    for keep in [1, 2] {
        replay_keeps_prefix(&DigestOptions {
            keep_batches: keep,
            ..DigestOptions::default()
        });
    }
}

fn replay_keeps_prefix(opts: &DigestOptions) {
    let mut digested_any = false;
    for (name, m) in transcripts() {
        let mut previous: Option<(Vec<Message>, usize)> = None;
        for request in requests(&m) {
            let before: Vec<String> = request.iter().map(json).collect();
            let (view, report) = digest_with_report(request, opts);
            digested_any |= report.results_digested > 0;
            // The stored history is untouched, the view is a valid request
            // exactly when the history is, and nothing but content changed.
            assert_eq!(before, request.iter().map(json).collect::<Vec<_>>());
            assert_eq!(
                validate(&view, Profile::OpenAi),
                validate(request, Profile::OpenAi),
                "{name}"
            );
            assert_eq!(view.len(), request.len());
            for (a, b) in view.iter().zip(request) {
                assert_eq!((&a.role, &a.tool_call_id), (&b.role, &b.tool_call_id));
            }
            // Same history, same bytes.
            let again: Vec<String> = digest(request, opts).iter().map(json).collect();
            assert_eq!(again, view.iter().map(json).collect::<Vec<_>>(), "{name}");
            // Only the previously newest batch may differ from last turn.
            if let Some((prev, stable_until)) = &previous {
                for (j, (p, v)) in prev.iter().zip(&view).enumerate() {
                    if j < *stable_until {
                        assert_eq!(json(p), json(v), "{name}: message {j} changed");
                    }
                }
            }
            previous = Some((view, kept_batches_start(request, opts.keep_batches)));
        }
    }
    if common::corpus_dir().is_some() {
        assert!(digested_any, "no corpus transcript had a result to digest");
    }
}

/// Cumulative prompt tokens over each replayed session, with and without
/// the digest (printed: run with `--nocapture` to see the figures).
#[test]
fn tokens_saved_on_the_corpus() {
    let counter = CachedCounter::new(BpeCounter::new(Encoding::O200kBase));
    for min_bytes in [4096, 1024] {
        let opts = DigestOptions {
            min_bytes,
            ..DigestOptions::default()
        };
        for (name, m) in transcripts() {
            let (mut without, mut with, mut calls) = (0usize, 0usize, 0usize);
            for request in requests(&m) {
                calls += 1;
                without += counter.count_messages(request);
                with += counter.count_messages(&digest(request, &opts));
            }
            assert!(with <= without, "{name}");
            // The tool-calling runs re-send large outputs; the text-action
            // ones have no tool results to digest.
            if name.starts_with("mini_astropy") || name.starts_with("sweagent_fc_replace") {
                assert!(with < without, "{name}: nothing saved");
            }
            let saved = without - with;
            let pct = if without == 0 {
                0.0
            } else {
                100.0 * saved as f64 / without as f64
            };
            eprintln!(
                "min_bytes {min_bytes}: {name}: {calls} calls, cumulative prompt tokens {without} without digest, {with} with, saved {saved} ({pct:.1}%)"
            );
        }
    }
}

/// `stable_len` reads only the tail of a request; it answers what the next
/// request's digest says: the first message the digest changes once the
/// oldest kept batch turns old (the whole request when none), on every
/// request of every transcript, for one and two kept batches.
#[test]
fn the_stable_length_is_where_the_next_digest_first_changes_the_request() {
    let all = transcripts();
    if all.is_empty() {
        return;
    }
    let mut shortened = 0;
    for keep in [1, 2] {
        let opts = DigestOptions {
            keep_batches: keep,
            ..DigestOptions::default()
        };
        let next = DigestOptions {
            keep_batches: keep - 1,
            ..opts.clone()
        };
        for (name, m) in &all {
            for (k, request) in requests(m).enumerate() {
                let view = digest(request, &opts);
                let after = digest(&view, &next);
                let expected = (0..view.len())
                    .find(|&i| after[i] != view[i])
                    .unwrap_or(view.len());
                let stable = context_engine::digest::stable_len(&view, &opts);
                assert_eq!(stable, expected, "{name} request {k}, keeping {keep}");
                shortened += usize::from(stable < view.len());
            }
        }
    }
    assert!(shortened > 0, "some newest batch is digested next");
}
