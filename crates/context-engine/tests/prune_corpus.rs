#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The prune on real agent transcripts: prints the tokens each rule frees
//! on every corpus file (whole session, default protected tail, no
//! min-reclaim gate) and checks the output stays as valid as the input.
//! Skipped with a printed reason when the corpus is absent.

use context_engine::prune::{PruneOptions, prune};
use context_engine::tokens::{BpeCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::validate::{Profile, validate};

use context_engine_testkit as common;

#[test]
fn prune_reclaims_tokens_on_the_corpus() {
    let Some(files) = common::corpus_files() else {
        return;
    };
    let counter = BpeCounter::new(Encoding::O200kBase);
    let opts = PruneOptions {
        proactive_prune_tokens: 1,
        min_reclaim_tokens: 0,
        ..PruneOptions::default()
    };
    let mut total = 0;
    for path in &files {
        let name = common::name(path);
        let m = Transcript::load(path).unwrap().messages;
        let out = prune(&m, None, &opts, &counter);
        let after = counter.count_messages(&out.messages) as u64;
        assert_eq!(after, out.tokens_after, "{name}");
        assert!(
            validate(&out.messages, Profile::OpenAi).len() <= validate(&m, Profile::OpenAi).len(),
            "{name}"
        );
        let c = out.counts;
        println!(
            "{name}: {} -> {} tokens ({} reclaimed, {:.1}%); {} duplicates, {} superseded reads, \
             {} re-runs, {} digested, {} calls clipped",
            out.tokens_before,
            after,
            out.reclaimed_tokens,
            100.0 * out.reclaimed_tokens as f64 / out.tokens_before.max(1) as f64,
            c.duplicates,
            c.superseded_reads,
            c.reruns,
            c.digested,
            c.args_clipped,
        );
        if name == "mini_astropy12907.traj.json" {
            // 64 bash calls, several re-reads and long outputs.
            assert!(out.reclaimed_tokens > 0 && out.pruned > 0);
        }
        total += out.reclaimed_tokens;
    }
    println!("total reclaimed: {total} tokens");
}
