#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Extractive compaction of a 1 MB, 740-message session (the corpus
//! sessions concatenated: the largest once, the others repeated; tool-call
//! ids made unique), from a cold counter
//! and with a warm counter cache (the live case: the host counted the
//! history before); and the escalation ladder's cost: the same compaction
//! at a window where the normal budget fits against one where it must
//! escalate, and `fit` alone on the whole session.
//!
//! `cargo bench -p context-engine --bench compaction -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use context_engine::compressor::{Compressor, fit};
use context_engine::engine::{CompressRequest, ContextEngine};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::validate::{Profile, validate};
use context_engine::{Message, Role, ToolCall};
use criterion::{Criterion, criterion_group, criterion_main};

/// Messages of the session.
const MESSAGES: usize = 740;

/// The corpus sessions' conversations, one after the other, until
/// `MESSAGES` messages: one system prompt, then each session's messages
/// without its own system prompt and closing `exit`, with every tool-call
/// id suffixed by the repetition so that ids stay unique. `None` when the
/// corpus is absent.
fn session() -> Option<Vec<Message>> {
    let dir = std::env::var_os("CTX_CORPUS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"),
        PathBuf::from,
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json" || e == "traj"))
        .collect();
    files.sort();
    let sessions: Vec<Vec<Message>> = files
        .iter()
        .filter_map(|p| Transcript::load(p).ok())
        .map(|t| t.messages)
        .collect();
    let system = sessions.first()?.first()?.clone();
    let mut out = vec![system];
    let mut round = 0;
    while out.len() < MESSAGES {
        round += 1;
        // The largest session once, the others over and over: about 1 MB.
        for s in sessions.iter().skip(usize::from(round > 1)) {
            for m in s
                .iter()
                .filter(|m| matches!(m.role, Role::User | Role::Assistant | Role::Tool))
            {
                let mut m = m.clone();
                if let Some(calls) = &mut m.tool_calls {
                    for c in calls {
                        c.id = c.id.take().map(|id| format!("{id}_{round}"));
                    }
                }
                m.tool_call_id = m.tool_call_id.take().map(|id| format!("{id}_{round}"));
                out.push(m);
            }
        }
    }
    // Cut at the end of a tool-call group.
    out.truncate(MESSAGES);
    while out.last().is_some_and(|m| m.has_tool_calls()) {
        out.pop();
    }
    Some(out)
}

fn counter() -> Arc<dyn TokenCounter> {
    Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)))
}

fn bench_compaction(c: &mut Criterion) {
    let Some(m) = session() else {
        eprintln!("skipping: no corpus (set CTX_CORPUS_DIR)");
        return;
    };
    let bytes: usize = m.iter().map(|m| m.to_value().to_string().len()).sum();
    let warm = counter();
    let tokens = warm.count_messages(&m) as u64;
    eprintln!(
        "session: {} messages, {bytes} bytes, {tokens} tokens, {} violations",
        m.len(),
        validate(&m, Profile::OpenAi).len()
    );
    let force = CompressRequest::new().with_force(true);
    let roomy = tokens / 2;
    // The same session whose newest batch is one 60 KB result, at a window
    // whose threshold that result alone exceeds: the normal budget cannot
    // fit, so the ladder climbs (the newest result is digested). Against
    // the same window without the big result, that is escalation's cost.
    let window = 16_000;
    let mut big = m.clone();
    big.push(Message::assistant_tool_calls(
        "",
        vec![ToolCall::function(
            "call_big",
            "bash",
            r#"{"command":"cat build.log"}"#,
        )],
    ));
    big.push(Message::tool_result(
        "call_big",
        (0..1500)
            .map(|k| format!("[{k:>5}] compiling module_{k}.rs ... ok\n"))
            .collect::<String>(),
    ));
    warm.count_messages(&big);
    for (name, session, window) in [
        ("roomy", &m, roomy),
        ("plain", &m, window),
        ("big newest result", &big, window),
    ] {
        let mut e = Compressor::new(Arc::clone(&warm), window);
        e.compress(session, &force).unwrap();
        let r = e.last_report().unwrap();
        eprintln!(
            "{name} at window {window}: {} -> {} tokens, escalation {:?}",
            r.tokens_before,
            r.tokens_after,
            r.escalation
                .iter()
                .map(|s| s.step.name())
                .collect::<Vec<_>>()
        );
    }

    let mut group = c.benchmark_group("compaction_1mb");
    group.sample_size(10);
    group.bench_function("extractive_cold_counter", |b| {
        b.iter_with_large_drop(|| {
            let mut engine = Compressor::new(counter(), roomy);
            engine.compress(black_box(&m), &force).unwrap()
        })
    });
    group.bench_function("extractive_warm_counter", |b| {
        b.iter_with_large_drop(|| {
            let mut engine = Compressor::new(Arc::clone(&warm), roomy);
            engine.compress(black_box(&m), &force).unwrap()
        })
    });
    group.bench_function("extractive_warm_counter_16k", |b| {
        b.iter_with_large_drop(|| {
            let mut engine = Compressor::new(Arc::clone(&warm), window);
            engine.compress(black_box(&m), &force).unwrap()
        })
    });
    group.bench_function("extractive_warm_counter_16k_escalating", |b| {
        b.iter_with_large_drop(|| {
            let mut engine = Compressor::new(Arc::clone(&warm), window);
            engine.compress(black_box(&big), &force).unwrap()
        })
    });
    group.bench_function("fit_whole_session_to_a_quarter", |b| {
        b.iter_with_large_drop(|| {
            fit::fit(
                black_box(&m),
                tokens / 4,
                warm.as_ref(),
                Profile::OpenAi,
                context_engine::validate::auto_text_actions(),
            )
            .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_compaction);
criterion_main!(benches);
