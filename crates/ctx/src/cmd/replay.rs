//! `ctx replay FILE`: replay a recorded session through an engine, the way
//! an agent would have driven it, and report what it would have sent, what
//! the prompt cache would have saved, what it would have cost, and what
//! information survived.

use crate::exit::ExitCode;
use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use context_engine::builder::{Archive, ReplayRun};
use context_engine::host::Trigger;
use context_engine::replay::{CallRecord, CostComparison, ReplayReport};
use context_engine::validate::Profile;
use serde::Serialize;

use crate::output::{Table, json, thousands};
use crate::plot::{PlotData, write_svg};

/// Arguments of `ctx replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub input: super::Input,
    #[command(flatten)]
    pub engine: super::engine::EngineArgs,
    /// Provider rules every request must keep: `openai` or `strict`.
    #[arg(long, default_value = "openai")]
    pub profile: Profile,
    /// Provider preset for prices and the prompt cache: openai, anthropic,
    /// anthropic-1h, deepseek or none (overrides `pricing.provider`;
    /// default openai).
    #[arg(long, value_name = "PRESET", value_parser = clap::builder::PossibleValuesParser::new(context_engine::pricing::PRESETS))]
    pub provider: Option<String>,
    /// Input price per million tokens (default: the preset's).
    #[arg(long)]
    pub price_input: Option<f64>,
    /// Cached-input price per million tokens (default: the preset's).
    #[arg(long)]
    pub price_cached_input: Option<f64>,
    /// Cache-write price per million tokens (default: the preset's).
    #[arg(long)]
    pub price_cache_write: Option<f64>,
    /// Output price per million tokens (default: the preset's).
    #[arg(long)]
    pub price_output: Option<f64>,
    /// Skip the second replay with the schedule off (the every-call digest
    /// column of the bill).
    #[arg(long)]
    pub no_baseline: bool,
    /// One JSON report on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also list every call and every lost probe.
    #[arg(short, long)]
    pub verbose: bool,
    /// Draw prompt tokens per call, with and without the engine, as SVG.
    #[arg(long, value_name = "OUT.svg")]
    pub plot: Option<PathBuf>,
    /// Also write the report as one self-contained HTML page (opens from
    /// disk, no network): the per-call chart, the bill of the three
    /// policies, each compaction's summary beside the messages it replaced,
    /// and every lost or recallable fact. The tables (or `--json`) still go
    /// to stdout.
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<PathBuf>,
    /// Session store the replay archives into (default: in memory); the
    /// replay's session in it starts afresh.
    #[arg(long, value_name = "DB", conflicts_with = "no_store")]
    pub store: Option<PathBuf>,
    /// The session id in the store (default: the file's name).
    #[arg(long)]
    pub session: Option<String>,
    /// Replay without a session store (compacted messages are not archived,
    /// and nothing is recallable after a compaction).
    #[arg(long)]
    pub no_store: bool,
}

/// Run `ctx replay`. Exit 0 when replayed, 1 when the engine produced an
/// invalid request or a request over the window (or one that could not fit
/// at all), 2 on errors (including an unreplayable input).
pub fn run(args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let transcript = args.input.load()?;
    // The price flags are configuration overrides: the engine's schedule
    // and the estimate read the same `pricing`.
    let mut engine_args = args.engine.clone();
    let prices = [
        ("provider", args.provider.clone()),
        ("input", args.price_input.map(|p| p.to_string())),
        (
            "cached_input",
            args.price_cached_input.map(|p| p.to_string()),
        ),
        ("cache_write", args.price_cache_write.map(|p| p.to_string())),
        ("output", args.price_output.map(|p| p.to_string())),
    ];
    for (key, value) in prices {
        if let Some(value) = value {
            engine_args.set.push(format!("pricing.{key}={value}"));
        }
    }
    let (engines, warnings) = engine_args.engines(args.profile)?;
    engines
        .check_window(&transcript.messages)
        .map_err(super::engine::flagged)?;
    for w in &warnings {
        eprintln!("ctx: warning: {w}");
    }
    let id = args.session.clone().unwrap_or_else(|| {
        args.input
            .file
            .file_name()
            .map_or_else(|| "replay".to_owned(), |n| n.to_string_lossy().into_owned())
    });
    let archive = match (&args.store, args.no_store) {
        (_, true) => Archive::Off,
        (Some(path), false) => Archive::Into(super::open_store(path, &engine_args)?),
        (None, false) => Archive::Memory,
    };
    let run = ReplayRun {
        messages: &transcript.messages,
        message_times: transcript.message_times(),
        session_id: id,
        archive,
        baseline: !args.no_baseline,
    };

    let bar = (!args.json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "replaying {bar:30} {pos}/{len} calls {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let (report, engine_warnings) = engines
        .replay(run, |done, total| {
            if let Some(bar) = &bar {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            }
        })
        .with_context(|| format!("cannot replay {}", args.input.file.display()))?;
    // The engine's own warnings (a plugin, a fallback), printed once.
    for w in &engine_warnings {
        eprintln!("ctx: warning: {w}");
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }

    let file = args.input.file.display().to_string();
    if let Some(path) = &args.plot {
        // The calls where `keep` holds, as markers.
        let calls_where = |keep: fn(&CallRecord) -> bool| -> Vec<usize> {
            report
                .calls
                .iter()
                .filter(|c| keep(c))
                .map(|c| c.call)
                .collect()
        };
        let data = PlotData {
            title: format!("{file}: prompt tokens per model call"),
            with_engine: report.calls.iter().map(|c| c.tokens_with_engine).collect(),
            without_engine: report
                .calls
                .iter()
                .map(|c| c.tokens_without_engine)
                .collect(),
            compactions: report.compactions.iter().map(|c| c.call).collect(),
            prunes: calls_where(|c| c.pruned > 0),
            cache_breaks: calls_where(|c| c.cache_resent_tokens > 0),
            cache_expired: calls_where(|c| c.cache_expired),
            threshold: Some(report.threshold_tokens).filter(|t| *t > 0),
            context_length: Some(report.context_length).filter(|t| *t > 0),
        };
        write_svg(path, &data)?;
    }
    let json_report = JsonReport {
        file: &file,
        report: &report,
    };
    if let Some(path) = &args.html {
        let text = serde_json::to_string(&json_report).context("cannot serialize the report")?;
        let page = context_engine_view::replay_page(&format!("{file}: replay"), &text);
        std::fs::write(path, page)
            .with_context(|| format!("cannot write the HTML report to {}", path.display()))?;
    }
    if args.json {
        json(&json_report)?;
    } else {
        print!("{}", render(&file, &report, args.verbose));
    }
    let invalid = report.calls.iter().any(|c| c.violations_introduced > 0);
    let t = &report.totals;
    if t.over_window.requests > 0 {
        eprintln!(
            "ctx: {} requests would have gone out over the {}-token window (largest {} tokens)",
            t.over_window.requests,
            thousands(report.context_length),
            thousands(t.over_window.largest)
        );
    }
    if let Some(first) = report.calls.iter().find_map(|c| c.unfittable.as_ref()) {
        eprintln!(
            "ctx: {} calls could not fit the window at all and would not have been sent ({first})",
            t.unfittable_calls.len()
        );
    }
    let over = t.over_window.requests > 0 || !t.unfittable_calls.is_empty();
    Ok(if invalid || over {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[derive(Serialize)]
struct JsonReport<'a> {
    file: &'a str,
    #[serde(flatten)]
    report: &'a ReplayReport,
}

fn percent(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn money(x: f64) -> String {
    if x < 0.1 {
        format!("${x:.4}")
    } else {
        format!("${x:.2}")
    }
}

/// The human report: a summary table a newcomer can read without the code.
fn render(file: &str, r: &ReplayReport, verbose: bool) -> String {
    let n = thousands;
    let t = &r.totals;
    let mut s = format!(
        "{file}: {} model calls replayed through engine `{}`\n  window {} tokens, compaction at {} tokens; prices: {} (${:.2} input, ${:.2} cached, ${:.2} cache write, ${:.2} output per 1M; cache from {} tokens in steps of {}, {} s lifetime{})\n\n",
        t.calls,
        r.engine,
        n(r.context_length),
        n(r.threshold_tokens),
        r.price.name,
        r.price.input_per_million,
        r.price.cached_input_per_million,
        r.price.cache_write_per_million,
        r.price.output_per_million,
        n(r.price.cache.min_prefix_tokens),
        r.price.cache.granularity_tokens,
        r.price.cache.lifetime_secs,
        if r.price.cache.automatic {
            ""
        } else {
            "; breakpoints at the system prompt and the last message, the engine's before the results it digests next"
        },
    );
    s.push_str(&totals_table(t));
    if let Some(costs) = &r.costs {
        s.push_str(&render_costs(costs));
    }
    let compactions = compaction_lines(r);
    s.push_str(&format!(
        "\n  compactions  {} ({})\n",
        compactions.len(),
        compaction_story(t, &compactions)
    ));
    s.push_str(&format!(
        "  digested    {} of {} requests carried older tool output as one-line digests\n",
        t.selected, t.calls
    ));
    s.push_str(&format!(
        "  pruned      {} calls followed a proactive prune\n",
        t.prunes
    ));
    s.push_str(&format!(
        "  over window {}\n",
        if t.over_window.requests == 0 {
            "0 requests went out larger than the window".to_string()
        } else {
            format!(
                "{} requests larger than the window (largest {} tokens; calls {})",
                t.over_window.requests,
                n(t.over_window.largest),
                list(&t.over_window.calls)
            )
        }
    ));
    if t.fitted > 0 {
        s.push_str(&format!(
            "  fitted      {} requests brought under the window by escalation\n",
            t.fitted
        ));
    }
    if !t.unfittable_calls.is_empty() {
        let first = r.calls.iter().find_map(|c| c.unfittable.as_ref());
        s.push_str(&format!(
            "  unfittable  {} calls not sent: {} (calls {})\n",
            t.unfittable_calls.len(),
            first.map(ToString::to_string).unwrap_or_default(),
            list(&t.unfittable_calls)
        ));
    }
    if !t.thrash_calls.is_empty() {
        s.push_str(&format!(
            "  thrash      {} compactions within {} calls of the previous one (calls {}): the window barely holds the system prompt and the tail; each compacted deeper\n",
            t.thrash_calls.len(),
            context_engine::engine::THRASH_CALLS,
            list(&t.thrash_calls)
        ));
    }
    if !t.ledger_cut_calls.is_empty() {
        s.push_str(&format!(
            "  state record cut on {} calls (calls {}): the window cannot hold the system prompt, the latest exchange and the record whole; the history keeps it\n",
            t.ledger_cut_calls.len(),
            list(&t.ledger_cut_calls)
        ));
    }
    s.push_str(&format!(
        "  engine time per call: median {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
        t.engine_time.median_ms, t.engine_time.p99_ms, t.engine_time.max_ms
    ));
    let warnings: Vec<&str> = r
        .calls
        .iter()
        .flat_map(|c| &c.notices)
        .filter(|w| w.kind == context_engine::host::NoticeKind::Warning)
        .map(|w| w.text.as_str())
        .collect();
    if let Some(first) = warnings.first() {
        s.push_str(&format!(
            "  warnings    {} (first: {first})\n",
            warnings.len()
        ));
    }
    let ret = &r.retention;
    s.push_str(&format!(
        "  retention   of {} facts in the session (user asks, files touched, commands, errors), the last request has\n              {} verbatim, {} in a summary, {} recallable through a handle it names, {} lost\n",
        ret.probes, ret.verbatim, ret.in_summary, ret.recallable, ret.lost
    ));
    if verbose && !ret.lost_probes.is_empty() {
        s.push_str("\n  lost facts\n");
        for p in &ret.lost_probes {
            let kind = serde_json::to_value(p.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            s.push_str(&format!(
                "    message {:>4}  {kind:<13}  {}\n",
                p.source_index, p.text
            ));
        }
    }
    if verbose {
        s.push('\n');
        s.push_str(&calls_table(r));
    }
    s
}

/// The totals with and without the engine, as a table.
fn totals_table(t: &context_engine::replay::Totals) -> String {
    let n = thousands;
    let mut table = Table::new(["", "without engine", "with engine", "change"]);
    table.row([
        "prompt tokens sent".to_string(),
        n(t.prompt_tokens_without_engine),
        n(t.prompt_tokens_with_engine),
        change(
            t.prompt_tokens_without_engine as f64,
            t.prompt_tokens_with_engine as f64,
        ),
    ]);
    table.row([
        "largest request".to_string(),
        n(t.largest_request_without_engine),
        n(t.largest_request_with_engine),
        change(
            t.largest_request_without_engine as f64,
            t.largest_request_with_engine as f64,
        ),
    ]);
    table.row([
        "prompt-cache hits".to_string(),
        format!(
            "{} ({})",
            n(t.cache_hit_tokens_without_engine),
            percent(t.cache_hit_share_without_engine)
        ),
        format!("{} ({})", n(t.cache_hit_tokens), percent(t.cache_hit_share)),
        String::new(),
    ]);
    table.row([
        "estimated cost".to_string(),
        money(t.estimated_cost_without_engine),
        money(t.estimated_cost_with_engine),
        change(
            t.estimated_cost_without_engine,
            t.estimated_cost_with_engine,
        ),
    ]);
    table.render(2)
}

/// One line per compaction: when, and the request before and after.
fn compaction_lines(r: &ReplayReport) -> Vec<String> {
    let n = thousands;
    r.calls
        .iter()
        .filter_map(|c| {
            let k = c.compaction.as_ref()?;
            let why = match k.trigger {
                Trigger::Preflight => "before",
                Trigger::PostTool => "after tools, before",
                Trigger::Manual => "manual, before",
                Trigger::Agent => "asked by the agent, before",
            };
            let cold = if c.cache_expired {
                ", cache expired"
            } else {
                ""
            };
            Some(format!(
                "{why} call {}{cold}: request {} -> {} tokens",
                c.call + 1,
                n(k.request_tokens_before),
                n(k.request_tokens_after)
            ))
        })
        .collect()
}

/// The per-call table of `--verbose`.
fn calls_table(r: &ReplayReport) -> String {
    let n = thousands;
    let mut calls = Table::new(["call", "msg", "without", "with", "cache hit", "event"]);
    for c in &r.calls {
        let mut event = Vec::new();
        if c.compaction.is_some() {
            event.push("compaction");
        }
        if c.pruned > 0 {
            event.push("prune");
        }
        if c.selected {
            event.push("digest");
        }
        calls.row([
            (c.call + 1).to_string(),
            c.message_index.to_string(),
            n(c.tokens_without_engine),
            n(c.tokens_with_engine),
            n(c.cache_hit_tokens),
            event.join(", "),
        ]);
    }
    calls.render(2)
}

/// What happened to compaction over the session, truthfully: the
/// compactions made, attempts that failed or were refused (with the first
/// reason), hold-backs, or that the threshold was never reached.
fn compaction_story(t: &context_engine::replay::Totals, made: &[String]) -> String {
    let attempts = t.compactions_failed + t.compactions_refused;
    let failed = |all: bool| {
        let how = match (t.compactions_failed, t.compactions_refused) {
            (0, _) => "refused",
            (_, 0) => "failed",
            _ => "refused or failed",
        };
        format!(
            "{}attempted {attempts} time(s), {}{how} (first reason: {})",
            if all { "" } else { "and " },
            if all { "all " } else { "" },
            t.first_compaction_failure.as_deref().unwrap_or("unknown")
        )
    };
    let blocked = || {
        format!(
            "held back {} time(s) by cooldown or anti-thrash (first: {})",
            t.compactions_blocked,
            t.first_compaction_block.as_deref().unwrap_or("unknown")
        )
    };
    let mut parts = Vec::new();
    if !made.is_empty() {
        parts.push(made.join("; "));
    }
    if attempts > 0 {
        parts.push(failed(made.is_empty()));
    }
    if t.compactions_blocked > 0 {
        parts.push(blocked());
    }
    if parts.is_empty() {
        parts.push("the session never reached the threshold".to_owned());
    }
    parts.join("; ")
}

/// Call numbers, the first ten and a count of the rest.
fn list(calls: &[usize]) -> String {
    let mut out: Vec<String> = calls.iter().take(10).map(ToString::to_string).collect();
    if calls.len() > 10 {
        out.push(format!("and {} more", calls.len() - 10));
    }
    out.join(", ")
}

/// The bill of the three policies side by side.
fn render_costs(c: &CostComparison) -> String {
    let mut table = Table::new([
        "",
        "estimated cost",
        "cache hits",
        "between compactions",
        "steady calls",
        "cache breaks",
        "re-sent after breaks",
    ]);
    let lines = [
        ("unmanaged agent", &c.unmanaged),
        ("digest every call", &c.every_call_digest),
        ("scheduled (this engine)", &c.scheduled),
    ];
    for (name, l) in lines {
        table.row([
            name.to_string(),
            format!(
                "{} ({})",
                money(l.estimated_cost),
                change(c.unmanaged.estimated_cost, l.estimated_cost)
            ),
            percent(l.cache_hit_share),
            percent(l.cache_hit_share_between_compactions),
            percent(l.cache_hit_share_steady),
            l.cache_breaks.to_string(),
            format!(
                "{} tokens, {}",
                thousands(l.resent_tokens),
                money(l.parts.resent)
            ),
        ]);
    }
    let (every, scheduled) = (&c.every_call_digest, &c.scheduled);
    format!(
        "\n{}\n  schedule    {}; cache breaks cost {} of its bill\n",
        table.render(2),
        against_every_call(every.estimated_cost, scheduled.estimated_cost),
        percent_of(scheduled.parts.resent, scheduled.estimated_cost),
    )
}

/// The scheduled bill against the every-call one, to a tenth of a percent.
fn against_every_call(every: f64, scheduled: f64) -> String {
    let pct = if every > 0.0 {
        (scheduled - every) / every * 100.0
    } else {
        0.0
    };
    if pct.abs() < 0.05 {
        return "the same bill as digesting on every call".into();
    }
    let sign = if scheduled < every { "-" } else { "+" };
    format!(
        "{pct:+.1}% against digesting on every call ({sign}{})",
        money((every - scheduled).abs())
    )
}

/// `part` as a share of `whole`, to a tenth of a percent.
fn percent_of(part: f64, whole: f64) -> String {
    if whole <= 0.0 {
        return "0%".into();
    }
    format!("{:.1}%", part / whole * 100.0)
}

/// `-42%` style change from `before` to `after`.
fn change(before: f64, after: f64) -> String {
    if before <= 0.0 {
        return String::new();
    }
    let pct = (after - before) / before * 100.0;
    if pct.abs() < 0.05 {
        "same".into()
    } else {
        format!("{pct:+.0}%")
    }
}
