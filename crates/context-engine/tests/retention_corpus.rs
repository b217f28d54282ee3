#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Retention probes on every corpus transcript: the transcript itself keeps
//! everything verbatim, the digest loses nothing (what it hides is
//! recallable), and a compaction with the extractive summarizer keeps the
//! latest ask verbatim. Prints the counts.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use context_engine::Message;
use context_engine::compressor::Compressor;
use context_engine::digest::{DigestOptions, digest};
use context_engine::engine::{CompressRequest, ContextEngine};
use context_engine::retention::{
    ProbeKind, ProbeStatus, RetentionReport, check, extract_probes, statuses,
};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;

use common::{corpus_files, name};
use context_engine_testkit as common;

fn adds_up(r: &RetentionReport) {
    assert_eq!(r.verbatim + r.in_summary + r.recallable + r.lost, r.probes);
    assert_eq!(r.lost_probes.len(), r.lost);
}

fn load_all() -> Option<Vec<(String, Vec<Message>)>> {
    let files = corpus_files()?;
    Some(
        files
            .iter()
            .map(|p| (name(p), Transcript::load(p).unwrap().messages))
            .collect(),
    )
}

#[test]
fn every_transcript_has_probes_of_each_main_kind_and_keeps_them_verbatim() {
    let Some(all) = load_all() else { return };
    for (file, messages) in &all {
        let started = Instant::now();
        let probes = extract_probes(messages, context_engine::validate::auto_text_actions());
        let extracted = started.elapsed();
        assert!(!probes.is_empty(), "{file}: no probes");
        assert!(
            probes.iter().any(|p| p.kind == ProbeKind::UserAsk),
            "{file}: no ask"
        );
        assert!(
            probes.iter().any(|p| p.kind == ProbeKind::Command)
                || probes.iter().any(|p| p.kind == ProbeKind::FilePath),
            "{file}: no command and no file"
        );
        let started = Instant::now();
        let report = check(&probes, messages, messages);
        let checked = started.elapsed();
        adds_up(&report);
        assert_eq!(
            report.verbatim, report.probes,
            "{file}: lost {:?}",
            report.lost_probes
        );
        let count = |k| probes.iter().filter(|p| p.kind == k).count();
        eprintln!(
            "{file}: {} probes ({} asks, {} files, {} commands, {} errors); extract {:.2} ms, check {:.2} ms",
            probes.len(),
            count(ProbeKind::UserAsk),
            count(ProbeKind::FilePath),
            count(ProbeKind::Command),
            count(ProbeKind::ErrorMessage),
            extracted.as_secs_f64() * 1000.0,
            checked.as_secs_f64() * 1000.0,
        );
    }
}

#[test]
fn the_digest_loses_nothing() {
    let Some(all) = load_all() else { return };
    let opts = DigestOptions {
        min_bytes: 256,
        ..DigestOptions::default()
    };
    for (file, messages) in &all {
        let probes = extract_probes(messages, context_engine::validate::auto_text_actions());
        let view = digest(messages, &opts);
        let report = check(&probes, &view, messages);
        adds_up(&report);
        assert_eq!(report.lost, 0, "{file}: lost {:?}", report.lost_probes);
        assert_eq!(report.in_summary, 0, "{file}");
        eprintln!(
            "{file}: digest: {} verbatim, {} recallable of {}",
            report.verbatim, report.recallable, report.probes
        );
    }
}

#[test]
fn a_compaction_keeps_the_latest_ask_verbatim() {
    let Some(all) = load_all() else { return };
    let counter: Arc<dyn TokenCounter> =
        Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)));
    let mut compacted = 0;
    for (file, messages) in &all {
        let probes = extract_probes(messages, context_engine::validate::auto_text_actions());
        let before = counter.count_messages(messages) as u64;
        let mut engine = Compressor::new(counter.clone(), before / 2);
        let Ok(out) = engine
            .compress(messages, &CompressRequest::new().with_force(true))
            .map(|c| c.messages)
        else {
            eprintln!("{file}: not compacted");
            continue;
        };
        compacted += 1;
        let report = check(&probes, &out, &out);
        adds_up(&report);
        let status = statuses(&probes, &out, &out);
        let latest_ask = probes
            .iter()
            .rposition(|p| p.kind == ProbeKind::UserAsk)
            .unwrap();
        assert_eq!(
            status[latest_ask],
            ProbeStatus::Verbatim,
            "{file}: {:?}",
            probes[latest_ask]
        );
        eprintln!(
            "{file}: compaction {} -> {} messages: {} verbatim, {} in summary, {} recallable, {} lost of {}",
            messages.len(),
            out.len(),
            report.verbatim,
            report.in_summary,
            report.recallable,
            report.lost,
            report.probes
        );
    }
    assert!(compacted > 0, "no corpus transcript compacted");
}

/// The project's long example session, compacted for a 32k window at the
/// default 75% threshold (what `ctx replay --context-length 32000` does).
#[test]
fn the_example_coding_session_compacts_keeping_the_latest_ask() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/coding-session.json");
    let messages = Transcript::load(&path).unwrap().messages;
    let probes = extract_probes(&messages, context_engine::validate::auto_text_actions());
    let count = |k| probes.iter().filter(|p| p.kind == k).count();
    assert_eq!(count(ProbeKind::UserAsk), 4);
    assert!(count(ProbeKind::FilePath) >= 8);
    assert!(count(ProbeKind::ErrorMessage) >= 2);
    assert_eq!(check(&probes, &messages, &messages).lost, 0);
    let counter: Arc<dyn TokenCounter> = Arc::new(BpeCounter::new(Encoding::O200kBase));
    let mut engine = Compressor::new(counter, 32_000);
    let out = engine
        .compress(&messages, &CompressRequest::new().with_force(true))
        .unwrap()
        .messages;
    assert!(out.len() < messages.len());
    let report = check(&probes, &out, &out);
    adds_up(&report);
    let status = statuses(&probes, &out, &out);
    let latest_ask = probes
        .iter()
        .rposition(|p| p.kind == ProbeKind::UserAsk)
        .unwrap();
    assert_eq!(status[latest_ask], ProbeStatus::Verbatim);
    eprintln!(
        "coding-session.json: compaction {} -> {} messages: {} verbatim, {} in summary, {} recallable, {} lost of {}",
        messages.len(),
        out.len(),
        report.verbatim,
        report.in_summary,
        report.recallable,
        report.lost,
        report.probes
    );
}
