//! `ctx compact FILE [--context-length N] [--focus TOPIC] [engine flags]
//! [-o OUT] [--report json] [--profile openai|strict]`: a manual compaction
//! with the engine `config.yaml` and the shared engine flags select
//! (`--config`, `--set`, `--engine`, `--model`, `--summarizer …`; see
//! [`EngineArgs`](super::engine::EngineArgs)). The compacted transcript goes
//! to stdout (or `-o`), in the input's own format; the report goes to stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use context_engine::compressor::{self, CompactionReport, Outcome};
use context_engine::engine::{CompressRequest, ContextEngine};
use context_engine::message::Message;
use context_engine::validate::{Profile, validate};
use serde::Serialize;

use super::engine::{EngineArgs, SummarizerCall};
use crate::output::thousands;

/// How the report on stderr is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// A few human-readable lines.
    Text,
    /// One JSON object.
    Json,
}

/// Arguments of `ctx compact`.
#[derive(Debug, clap::Args)]
pub struct CompactArgs {
    #[command(flatten)]
    pub input: super::Input,
    /// Topic to keep in full detail in the summary.
    #[arg(long)]
    pub focus: Option<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Write the compacted transcript here instead of stdout.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Report format on stderr.
    #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
    pub report: ReportFormat,
    /// Provider rules the result must keep: `openai` or `strict`.
    #[arg(long, default_value = "openai")]
    pub profile: Profile,
}

/// The stderr report.
#[derive(Serialize)]
struct Report<'a> {
    file: String,
    /// The engine that ran.
    engine: &'a str,
    context_length: u64,
    profile: &'static str,
    #[serde(flatten)]
    compaction: &'a Compaction,
    /// Violations of the profile in the written transcript.
    violations_after: usize,
    /// Wall time of the compaction, in milliseconds (summarizer call included).
    elapsed_ms: f64,
    /// The model call of `--summarizer openai`.
    #[serde(skip_serializing_if = "Option::is_none")]
    summarizer_call: Option<SummarizerCall>,
}

/// What the compaction did: the built-in compressor's full report, or
/// what can be observed of any other engine.
#[derive(Serialize)]
#[serde(untagged)]
enum Compaction {
    Compressor(CompactionReport),
    Observed(Observed),
}

/// The report of an engine that keeps none (a plugin): the outcome seen
/// from outside.
#[derive(Serialize)]
struct Observed {
    outcome: &'static str,
    messages_before: usize,
    messages_after: usize,
    tokens_before: u64,
    tokens_after: u64,
    threshold_tokens: u64,
    reason: Option<String>,
}

/// Run `ctx compact`. Exit 0 when compacted (or nothing to compact), 1 when
/// the compaction was aborted, blocked or refused (the input is written
/// back unchanged), 2 on errors.
pub fn run(args: &CompactArgs) -> anyhow::Result<ExitCode> {
    let mut transcript = args.input.load()?;
    let prepared = args.engine.prepare(args.profile)?;
    let mut request = CompressRequest::new().with_force(true);
    if let Some(focus) = &args.focus {
        request = request.with_focus_topic(focus.clone());
    }
    let input = &transcript.messages;
    let started = Instant::now();
    let (engine_name, result, compaction, prepared) = if prepared.name == compressor::NAME {
        // The built-in compressor, by its concrete type: it explains itself.
        let mut prepared = prepared;
        let context = std::mem::replace(
            &mut prepared.context,
            context_engine::plugin::EngineContext::new(
                std::sync::Arc::clone(&prepared.counter),
                prepared.context_length,
            ),
        );
        let mut engine = context.into_compressor();
        prepared.apply_model(&mut engine);
        let result = engine.compress(input, &request);
        let report = engine
            .last_report()
            .cloned()
            .context("the engine left no report")?;
        let name = engine.name().to_owned();
        (name, result, Compaction::Compressor(report), prepared)
    } else {
        let (mut engine, prepared) = prepared.select()?;
        let result = engine.compress(input, &request);
        let observed = observe(input, &result, engine.as_ref(), &prepared);
        (
            engine.name().to_owned(),
            result,
            Compaction::Observed(observed),
            prepared,
        )
    };
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    for w in &prepared.warnings {
        eprintln!("ctx: warning: {w}");
    }
    let exit = match &compaction {
        Compaction::Compressor(r) => matches!(
            r.outcome,
            Outcome::Compacted | Outcome::Fallback | Outcome::NothingToCompress
        ),
        Compaction::Observed(o) => o.outcome != "failed",
    };
    match result {
        Ok(messages) => transcript.messages = messages,
        Err(err) => eprintln!("ctx: {err}"),
    }
    let violations_after = validate(&transcript.messages, args.profile).len();
    match &args.output {
        Some(path) => transcript
            .write(path, transcript.format)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => println!("{}", transcript.to_json_string_pretty().trim_end()),
    }
    let out = Report {
        file: args.input.file.display().to_string(),
        engine: &engine_name,
        context_length: prepared.context_length,
        profile: args.profile.name(),
        compaction: &compaction,
        violations_after,
        elapsed_ms,
        summarizer_call: prepared
            .client
            .as_ref()
            .map(|c| SummarizerCall::from(c.last_call())),
    };
    match args.report {
        ReportFormat::Json => eprintln!("{}", serde_json::to_string_pretty(&out)?),
        ReportFormat::Text => eprint!("{}", render(&out)),
    }
    Ok(if exit {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What a compaction by an engine without its own report did, from its
/// input, its result and its state.
fn observe(
    input: &[Message],
    result: &Result<Vec<Message>, context_engine::engine::EngineError>,
    engine: &dyn ContextEngine,
    prepared: &super::engine::Prepared,
) -> Observed {
    let tokens_before = prepared.counter.count_messages(input) as u64;
    let threshold_tokens = engine.state().threshold_tokens;
    match result {
        Ok(out) => Observed {
            outcome: if out.as_slice() == input {
                "unchanged"
            } else {
                "compacted"
            },
            messages_before: input.len(),
            messages_after: out.len(),
            tokens_before,
            tokens_after: prepared.counter.count_messages(out) as u64,
            threshold_tokens,
            reason: None,
        },
        Err(err) => Observed {
            outcome: "failed",
            messages_before: input.len(),
            messages_after: input.len(),
            tokens_before,
            tokens_after: tokens_before,
            threshold_tokens,
            reason: Some(err.to_string()),
        },
    }
}

fn render(r: &Report<'_>) -> String {
    let n = thousands;
    let c = match r.compaction {
        Compaction::Compressor(c) => c,
        Compaction::Observed(o) => {
            let mut s = format!("{}: engine `{}`: {}\n", r.file, r.engine, o.outcome);
            s.push_str(&format!(
                "  tokens    {:>10} -> {:>10}  (threshold {}, window {})\n  messages  {:>10} -> {:>10}\n",
                n(o.tokens_before),
                n(o.tokens_after),
                n(o.threshold_tokens),
                n(r.context_length),
                o.messages_before,
                o.messages_after,
            ));
            if let Some(reason) = &o.reason {
                s.push_str(&format!("  reason    {reason}\n"));
            }
            return s;
        }
    };
    let outcome = match c.outcome {
        Outcome::Compacted => "compacted",
        Outcome::Fallback => "compacted with the extractive fallback",
        Outcome::Aborted => "aborted, transcript unchanged",
        Outcome::NothingToCompress => "nothing to compress, transcript unchanged",
        Outcome::Blocked => "blocked, transcript unchanged",
        Outcome::InvalidOutput => "refused (result would break a provider rule), unchanged",
    };
    let mut s = format!("{}: {outcome}\n", r.file);
    s.push_str(&format!(
        "  tokens    {:>10} -> {:>10}  (threshold {}, window {})\n  messages  {:>10} -> {:>10}\n",
        n(c.tokens_before),
        n(c.tokens_after),
        n(c.threshold_tokens),
        n(r.context_length),
        c.messages_before,
        c.messages_after,
    ));
    if let (Some(head), Some(tail)) = (c.head, c.tail) {
        s.push_str(&format!(
            "  kept      head {}..{}{}, tail {}..{}; {} messages summarized\n",
            head.start,
            head.end,
            c.pinned
                .map(|u| format!(", latest user message {u}"))
                .unwrap_or_default(),
            tail.start,
            tail.end,
            c.summarized_messages,
        ));
    }
    if let Some(name) = &c.summarizer {
        s.push_str(&format!(
            "  summary   {name}, {} tokens (target {}){}\n",
            c.summary_tokens,
            c.target_tokens,
            if c.iterative {
                ", updating the previous summary"
            } else {
                ""
            },
        ));
    }
    if let Some(call) = &r.summarizer_call {
        s.push_str(&format!("  model     {}\n", call.line()));
    }
    if let Some(reason) = &c.reason {
        s.push_str(&format!("  reason    {reason}\n"));
    }
    s.push_str(&format!(
        "  profile   {}: {} violations after; {:.1} ms\n",
        r.profile, r.violations_after, r.elapsed_ms
    ));
    s
}
