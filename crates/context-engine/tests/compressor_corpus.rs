#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Compacts every corpus transcript with the extractive summarizer at a
//! context length of a half, a third and a quarter of its size: every output keeps the provider rules
//! (no violation the input did not already have; the inputs' own defects,
//! such as mini-swe-agent's trailing `exit` role, are the host's) and is
//! smaller. Prints tokens before/after and the time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use context_engine::compressor::{Compressor, Outcome};
use context_engine::engine::{CompressRequest, ContextEngine, EngineError};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::validate::{Profile, Rule, introduced_adjacency, validate};

use common::corpus_files as corpus;
use context_engine_testkit as common;

fn rule_counts(messages: &[context_engine::Message], profile: Profile) -> HashMap<Rule, usize> {
    let mut counts = HashMap::new();
    for v in validate(messages, profile) {
        *counts.entry(v.rule).or_default() += 1;
    }
    counts
}

#[test]
fn every_corpus_transcript_compacts_to_a_valid_smaller_one() {
    let Some(files) = corpus() else { return };
    let counter: Arc<dyn TokenCounter> =
        Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
    let mut compacted = 0;
    for path in &files {
        let transcript = Transcript::load(path).unwrap();
        let messages = &transcript.messages;
        let before = counter.count_messages(messages) as u64;
        for (profile, d) in Profile::ALL
            .into_iter()
            .flat_map(|p| [2, 3, 4].map(|d| (p, d)))
        {
            let mut engine = Compressor::with_options(
                counter.clone(),
                before / d,
                context_engine::compressor::CompressorOptions::default().with_profile(profile),
            );
            let started = Instant::now();
            let result = engine.compress(messages, &CompressRequest::new().with_force(true));
            let elapsed = started.elapsed();
            let report = engine.last_report().unwrap().clone();
            match result {
                Ok(compaction) => {
                    assert_eq!(compaction.report, report);
                    let out = compaction.messages;
                    compacted += 1;
                    let input = rule_counts(messages, profile);
                    for (rule, n) in rule_counts(&out, profile) {
                        assert!(
                            n <= input.get(&rule).copied().unwrap_or(0),
                            "{}: {profile}: compaction added {rule:?}",
                            path.display()
                        );
                    }
                    // Alternation-safe under every profile: no new
                    // same-role pair, the default profile included.
                    assert_eq!(
                        introduced_adjacency(messages, &out, profile),
                        None,
                        "{}: {profile}: window {}: two same-role turns in a row",
                        path.display(),
                        before / d
                    );
                    let after = counter.count_messages(&out) as u64;
                    assert!(after < before);
                    assert_eq!(report.tokens_after, after);
                    assert!(matches!(report.outcome, Outcome::Compacted));
                    eprintln!(
                        "{} [{profile}, window {}]: {} -> {} tokens, {} -> {} messages, {:.1} ms",
                        path.file_name().unwrap().to_string_lossy(),
                        before / d,
                        before,
                        after,
                        messages.len(),
                        out.len(),
                        elapsed.as_secs_f64() * 1000.0
                    );
                }
                Err(EngineError::NothingToCompress { reason, .. }) => eprintln!(
                    "{} [{profile}]: unchanged ({reason})",
                    path.file_name().unwrap().to_string_lossy()
                ),
                Err(other) => panic!("{}: {profile}: {other}", path.display()),
            }
        }
    }
    assert!(compacted > 0, "no corpus transcript was compacted");
}
