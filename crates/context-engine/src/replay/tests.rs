use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::compressor::Compressor;
use crate::engine::ContextEngine;
use crate::message::ToolCall;
use crate::schedule::ScheduleOptions;
use crate::tokens::{BpeCounter, CachedCounter, Encoding};
use crate::transcript::Transcript;

fn counter() -> Arc<dyn TokenCounter> {
    Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)))
}

fn run(messages: &[Message], context_length: u64) -> ReplayReport {
    run_scheduled(messages, context_length, ScheduleOptions::default())
}

fn run_scheduled(
    messages: &[Message],
    context_length: u64,
    schedule: ScheduleOptions,
) -> ReplayReport {
    let counter = counter();
    let options = crate::compressor::CompressorOptions::default().with_schedule(schedule);
    let engine = Compressor::with_options(Arc::clone(&counter), context_length, options);
    let mut session = Session::new("replay", Box::new(engine), Arc::clone(&counter));
    let mut seen = Vec::new();
    let report = replay(
        messages,
        &mut session,
        counter.as_ref(),
        &ReplayOptions::default(),
        |done, total| seen.push((done, total)),
    )
    .unwrap();
    assert_eq!(seen.len(), report.calls.len());
    assert_eq!(seen.last().map(|s| s.0), Some(report.calls.len()));
    report
}

/// The figures a replay reports hold together, whatever the input.
fn assert_consistent(r: &ReplayReport) {
    let mut with = 0;
    let mut without = 0;
    for c in &r.calls {
        assert!(
            c.tokens_with_engine <= c.tokens_without_engine,
            "call {}: {} > {}",
            c.call,
            c.tokens_with_engine,
            c.tokens_without_engine
        );
        assert_eq!(
            c.violations_introduced, 0,
            "call {}: {:?}",
            c.call, c.notices
        );
        assert!(c.cache_hit_tokens <= c.tokens_with_engine);
        assert!(c.cache_hit_tokens_without_engine <= c.tokens_without_engine);
        with += c.tokens_with_engine;
        without += c.tokens_without_engine;
    }
    assert_eq!(r.totals.prompt_tokens_with_engine, with);
    assert_eq!(r.totals.prompt_tokens_without_engine, without);
    // Cheaper than the unmanaged agent wherever the unmanaged requests fit
    // the window (past it a provider refuses them, and a small window keeps
    // requests under the cache's minimum prefix, never cached).
    if r.totals.largest_request_without_engine <= r.context_length {
        assert!(
            r.totals.estimated_cost_with_engine <= r.totals.estimated_cost_without_engine + 1e-9,
            "{:?}",
            r.totals
        );
    }
    assert_eq!(
        r.totals.compactions,
        r.calls.iter().filter(|c| c.compaction.is_some()).count()
    );
    assert_eq!(r.compaction_views.len(), r.totals.compactions);
    assert_eq!(r.compactions.len(), r.totals.compactions);
    for ret in std::iter::once(&r.retention).chain(r.compactions.iter().map(|c| &c.retention)) {
        assert_eq!(
            ret.verbatim + ret.in_summary + ret.recallable + ret.lost,
            ret.probes,
            "{ret:?}"
        );
        assert_eq!(ret.lost, ret.lost_probes.len());
    }
    assert!(r.totals.engine_time.median_ms <= r.totals.engine_time.p99_ms);
    assert!(r.totals.engine_time.p99_ms <= r.totals.engine_time.max_ms);
    assert_steady(r);
}

/// The steady hit share is over the calls neither at a compaction nor
/// right after one, for both sides on the same calls.
fn assert_steady(r: &ReplayReport) {
    let steady: Vec<&CallRecord> = r
        .calls
        .iter()
        .enumerate()
        .filter(|(i, c)| c.compaction.is_none() && !(*i > 0 && r.calls[i - 1].compaction.is_some()))
        .map(|(_, c)| c)
        .collect();
    let share = |hit: fn(&CallRecord) -> u64, sent: fn(&CallRecord) -> u64| {
        let total: u64 = steady.iter().map(|c| sent(c)).sum();
        let hits: u64 = steady.iter().map(|c| hit(c)).sum();
        if total == 0 {
            0.0
        } else {
            hits as f64 / total as f64
        }
    };
    let engine = share(|c| c.cache_hit_tokens, |c| c.tokens_with_engine);
    let unmanaged = share(
        |c| c.cache_hit_tokens_without_engine,
        |c| c.tokens_without_engine,
    );
    assert!((r.totals.cache_hit_share_steady - engine).abs() < 1e-12);
    assert!((r.totals.cache_hit_share_steady_without_engine - unmanaged).abs() < 1e-12);
    let breaks = steady.iter().filter(|c| c.cache_resent_tokens > 0).count();
    assert_eq!(r.totals.cache_breaks_between_compactions, breaks);
    assert!(breaks <= r.totals.cache_breaks);
}

fn session_messages(rounds: usize, output_lines: usize) -> Vec<Message> {
    let mut m = vec![
        Message::system("You are a coding agent."),
        Message::user("Make the test suite pass."),
    ];
    for i in 0..rounds {
        let id = format!("c{i}");
        m.push(Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                &id,
                "bash",
                format!(r#"{{"command":"cat src/mod_{i}.py"}}"#),
            )],
        ));
        m.push(Message::tool_result(
            &id,
            format!("def f_{i}(x):\n    return x * {i}  # compute\n").repeat(output_lines),
        ));
    }
    m.push(Message::assistant("All tests pass."));
    m
}

#[test]
fn an_unmanaged_window_changes_nothing_but_the_digest() {
    let messages = session_messages(6, 20);
    let r = run(&messages, 1_000_000);
    assert_consistent(&r);
    assert_eq!(r.totals.calls, 7);
    assert_eq!(r.totals.compactions, 0);
    // Small outputs: nothing to digest, so requests are the recording's.
    assert_eq!(
        r.totals.prompt_tokens_with_engine,
        r.totals.prompt_tokens_without_engine
    );
    // Append-only requests: everything but the newest messages is cached.
    assert_eq!(
        r.calls[1].cache_hit_tokens,
        r.calls[1].cache_hit_tokens_without_engine
    );
    assert_eq!(r.final_history, messages);
    // Nothing is compacted: every probe is in the last request.
    assert!(r.retention.probes > 0);
    assert_eq!(r.retention.lost, 0, "{:?}", r.retention.lost_probes);
}

#[test]
fn a_small_window_compacts_and_the_figures_hold_together() {
    let messages = session_messages(30, 60);
    let r = run(&messages, 12_000);
    assert_consistent(&r);
    assert!(r.totals.compactions >= 1, "{:?}", r.totals);
    assert!(r.totals.token_ratio < 0.8, "{}", r.totals.token_ratio);
    assert!(r.totals.largest_request_with_engine < 12_000);
    // After a compaction the stored history is shorter than the recording.
    assert!(r.final_history.len() < messages.len());
    // The last recorded answer is the end of the stored history.
    assert_eq!(r.final_history.last(), messages.last());
    // The calls a compaction rewrote are left out of the steady share:
    // what remains misses only the new content, as the unmanaged agent's.
    assert!(r.totals.cache_hit_share_steady >= r.totals.cache_hit_share);
    assert_eq!(r.totals.cache_breaks_between_compactions, 0);
}

#[test]
fn unreplayable_recordings_say_why() {
    let none = vec![Message::system("s"), Message::user("hi")];
    assert!(matches!(
        check_replayable(&none),
        Err(ReplayError::NoAssistantTurns)
    ));
    let orphan = vec![
        Message::user("hi"),
        Message::tool_result("ghost", "x"),
        Message::assistant("ok"),
    ];
    let err = check_replayable(&orphan).unwrap_err();
    assert!(
        err.to_string().starts_with("message 1: orphan-tool-result"),
        "{err}"
    );
    assert!(err.to_string().contains("ctx validate"));
}

fn corpus() -> Option<Vec<PathBuf>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipped: no corpus at {}", dir.display());
        return None;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x != "md"))
        .collect();
    files.sort();
    Some(files)
}

#[test]
fn every_corpus_transcript_replays_consistently_at_half_its_peak() {
    let Some(files) = corpus() else { return };
    for path in files {
        let t = Transcript::load(&path).unwrap();
        let full = run(&t.messages, 10_000_000);
        assert_consistent(&full);
        let peak = full.totals.largest_request_without_engine;
        let r = run(&t.messages, peak / 2);
        assert_consistent(&r);
        if let Some(c) = r.calls.iter().find(|c| c.recorded_prompt_tokens.is_some()) {
            assert!(c.recorded_prompt_tokens.unwrap() > 0);
        }
    }
}

/// `messages` with a recorded time each, 20 s apart, and `gap` seconds
/// more before message `at`.
fn timed(messages: &[Message], at: usize, gap: f64) -> Vec<Message> {
    let mut t = 1_750_000_000.0;
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            t += 20.0 + if i == at { gap } else { 0.0 };
            let mut m = m.clone();
            m.extra.insert("timestamp".into(), t.into());
            m
        })
        .collect()
}

#[test]
fn a_recorded_idle_gap_reaches_the_engine_which_compacts_where_the_cache_is_cold_anyway() {
    let messages = session_messages(30, 60);
    let counter = counter();
    let window = 12_000;
    let threshold = Compressor::new(Arc::clone(&counter), window)
        .state()
        .threshold_tokens;
    // The first tool result that takes the history past 60% of the
    // threshold: the call that follows it is above the cold floor (half the
    // threshold) and short of the threshold.
    let at = (1..messages.len())
        .find(|&i| {
            messages[i].is_tool_result()
                && counter.count_messages(&messages[..=i]) as u64 > threshold * 6 / 10
        })
        .unwrap();
    let after_gap = |r: &ReplayReport| {
        r.calls
            .iter()
            .find(|c| c.message_index == at + 1)
            .unwrap()
            .clone()
    };
    let gapped = timed(&messages, at, 600.0);
    let cold = run_scheduled(&gapped, window, ScheduleOptions::default());
    assert_consistent(&cold);
    let first = cold.calls.iter().find(|c| c.compaction.is_some()).unwrap();
    assert_eq!(first.message_index, at + 1, "{:?}", cold.totals);
    assert!(first.sent_at.is_some() && first.cache_expired);
    assert_eq!(cold.calls.iter().filter(|c| c.cache_expired).count(), 1);
    // Without the gap, or with cold compaction off, that call goes on ...
    let warm = run_scheduled(
        &timed(&messages, at, 0.0),
        window,
        ScheduleOptions::default(),
    );
    assert!(after_gap(&warm).compaction.is_none());
    let off = ScheduleOptions {
        cold_compaction_from: 1.0,
        ..ScheduleOptions::default()
    };
    let kept = run_scheduled(&gapped, window, off);
    assert!(after_gap(&kept).compaction.is_none());
    // ... and the session costs more: the cold call sent more uncached.
    assert!(
        cold.totals.estimated_cost_with_engine < kept.totals.estimated_cost_with_engine,
        "{} >= {}",
        cold.totals.estimated_cost_with_engine,
        kept.totals.estimated_cost_with_engine
    );
}

#[test]
fn a_recording_whose_times_stop_makes_up_no_idle_gap() {
    let messages = session_messages(30, 60);
    let mut partly = timed(&messages, 0, 0.0);
    for m in &mut partly[10..] {
        m.extra.remove("timestamp");
    }
    let compacted_at = |r: &ReplayReport| -> Vec<usize> {
        r.calls
            .iter()
            .filter(|c| c.compaction.is_some())
            .map(|c| c.call)
            .collect()
    };
    let r = run(&partly, 12_000);
    assert!(r.calls.iter().all(|c| !c.cache_expired));
    assert_eq!(compacted_at(&r), compacted_at(&run(&messages, 12_000)));
}
