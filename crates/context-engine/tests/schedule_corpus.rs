#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The cache-aware schedule on real sessions: on every corpus transcript
//! and the project's generated example, at half the session's peak request
//! and at 128K, with OpenAI's and Anthropic's cache models, the scheduled
//! engine's estimated bill is no higher than the engine digesting on every
//! call, lower than the unmanaged agent's wherever the unmanaged requests
//! fit the window, and no request passes the window.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use context_engine::compressor::{Compressor, CompressorOptions};
use context_engine::host::Session;
use context_engine::pricing::PriceModel;
use context_engine::replay::{ReplayOptions, ReplayReport, replay};
use context_engine::schedule::ScheduleOptions;
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::{Message, Role};

/// The corpus transcripts (the shared helper: `CTX_CORPUS_DIR`, else
/// `shared/corpus`; missing, it fails under `CI=true` and skips with the
/// reason elsewhere) and the project's generated example.
fn sessions() -> Option<Vec<PathBuf>> {
    let mut files = common::corpus_files()?;
    files
        .push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/coding-session.json"));
    Some(files)
}

fn counter() -> Arc<dyn TokenCounter> {
    Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)))
}

/// The largest request the unmanaged agent sent.
fn peak(messages: &[Message], counter: &dyn TokenCounter) -> u64 {
    let mut total = counter.request_overhead() as u64;
    let mut peak = 0;
    for m in messages {
        if m.role == Role::Assistant {
            peak = peak.max(total);
        }
        total += counter.count_message(m) as u64;
    }
    peak
}

fn run(
    messages: &[Message],
    window: u64,
    price: &PriceModel,
    schedule: ScheduleOptions,
) -> ReplayReport {
    let counter = counter();
    let options = CompressorOptions::default().with_schedule(schedule.with_price(price.clone()));
    let engine = Compressor::with_options(Arc::clone(&counter), window, options);
    let mut session = Session::new("schedule", Box::new(engine), Arc::clone(&counter));
    replay(
        messages,
        &mut session,
        counter.as_ref(),
        &ReplayOptions::default().with_price(price.clone()),
        |_, _| {},
    )
    .unwrap()
}

fn check(path: &Path, window: u64, price: &PriceModel, messages: &[Message]) {
    let scheduled = run(messages, window, price, ScheduleOptions::default());
    let every_call = run(messages, window, price, ScheduleOptions::every_call());
    let r = scheduled.with_baseline(&every_call);
    let c = r.costs.as_ref().unwrap();
    let name = common::name(path);
    eprintln!(
        "{name:<40} {:>7} {:<12} unmanaged ${:.4} ({:.0}%)  every-call ${:.4} ({:.0}%, {:.0}% between)  scheduled ${:.4} ({:.0}%, {:.0}% between, {} breaks)",
        window,
        price.name,
        c.unmanaged.estimated_cost,
        c.unmanaged.cache_hit_share * 100.0,
        c.every_call_digest.estimated_cost,
        c.every_call_digest.cache_hit_share * 100.0,
        c.every_call_digest.cache_hit_share_between_compactions * 100.0,
        c.scheduled.estimated_cost,
        c.scheduled.cache_hit_share * 100.0,
        c.scheduled.cache_hit_share_between_compactions * 100.0,
        c.scheduled.cache_breaks,
    );
    assert!(
        r.calls.iter().all(|c| c.violations_introduced == 0),
        "{name} at {window}: a request broke a provider rule"
    );
    assert!(
        c.scheduled.estimated_cost <= c.every_call_digest.estimated_cost * (1.0 + 1e-9),
        "{name} at {window} ({}): scheduled {c:?}",
        price.name
    );
    // Size wins: the schedule never makes a request larger than the
    // every-call engine's, nor passes a window that one kept.
    let largest = every_call.totals.largest_request_with_engine;
    assert!(
        r.totals.largest_request_with_engine <= largest.max(window),
        "{name} at {window}: a request passed the window"
    );
    // The unmanaged agent is a baseline only where its requests fit the
    // window; past it, size wins and the compactions that cost cache are
    // what makes the session possible at all.
    if r.totals.largest_request_without_engine > window {
        return;
    }
    assert!(
        c.scheduled.estimated_cost <= c.unmanaged.estimated_cost * (1.0 + 1e-9),
        "{name} at {window} ({}): {c:?}",
        price.name
    );
    if r.totals.selected + r.totals.compactions > 0 {
        assert!(
            c.scheduled.estimated_cost < c.unmanaged.estimated_cost,
            "{name} at {window} ({}): the engine changed requests but saved nothing: {c:?}",
            price.name
        );
    }
}

#[test]
fn the_schedule_costs_no_more_than_every_call_digests_and_less_than_no_engine() {
    let Some(files) = sessions() else { return };
    let counter = counter();
    let presets = ["openai", "anthropic"].map(|p| PriceModel::preset(p).unwrap());
    for path in files {
        let transcript = Transcript::load(&path).unwrap();
        let messages = &transcript.messages;
        let half_peak = (peak(messages, counter.as_ref()) / 2).max(1_000);
        for window in [half_peak, 128_000] {
            for price in &presets {
                check(&path, window, price, messages);
            }
        }
    }
}
