//! `ctx compact FILE [--context-length N] [--focus TOPIC] [engine flags]
//! [-o OUT] [--report json] [--profile openai|strict]`: a manual compaction
//! with the engine `config.yaml` and the shared engine flags select
//! (`--config`, `--set`, `--engine`, `--model`, `--summarizer …`; see
//! [`EngineArgs`](super::engine::EngineArgs)). The compacted transcript goes
//! to stdout (or `-o`), in the input's own format; the report goes to stderr.

use crate::exit::ExitCode;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use context_engine::compressor::NAME as COMPRESSOR;
use context_engine::engine::{CompactionReport, CompressRequest, Outcome};
use context_engine::store::{ArchivedSpan, Batch, CompactionInfo, SessionStore};
use context_engine::summarize::openai::CallStats;
use context_engine::validate::{Profile, validate};
use serde::Serialize;

use super::engine::{EngineArgs, call_line};
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
    /// Archive what the compaction removes in this session store (created
    /// when missing); the summary names the handle to recall it by.
    #[arg(long, value_name = "DB")]
    pub store: Option<PathBuf>,
    /// The session the archive is filed under.
    #[arg(long, default_value = "default", requires = "store")]
    pub session: String,
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
    compaction: &'a CompactionReport,
    /// Violations of the profile in the written transcript.
    violations_after: usize,
    /// Spans archived in `--store`: handle and input indexes (end exclusive).
    archived: Vec<ArchivedSpan>,
    /// Messages that left the transcript, archived.
    archived_messages: usize,
    /// Wall time of the compaction, in milliseconds (summarizer call included).
    elapsed_ms: f64,
    /// The model call of `--summarizer openai`.
    #[serde(skip_serializing_if = "Option::is_none")]
    summarizer_call: Option<CallStats>,
}

/// Run `ctx compact`. Exit 0 when compacted (or nothing to compact), 1 when
/// the compaction was aborted, blocked or refused (the input is written
/// back unchanged), 2 on errors.
pub fn run(args: &CompactArgs) -> anyhow::Result<ExitCode> {
    let mut transcript = args.input.load()?;
    // A bad store fails before any work, and before anything is written.
    let store = match &args.store {
        Some(path) => Some(super::open_store(path, &args.engine)?),
        None => None,
    };
    let (mut engine, prepared) = args.engine.start(args.profile, &transcript.messages)?;
    let mut request = CompressRequest::new()
        .with_force(true)
        .with_archive(store.is_some());
    if let Some(focus) = &args.focus {
        request = request.with_focus_topic(focus.clone());
    }
    let started = Instant::now();
    let result = engine.compress(&transcript.messages, &request);
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut archived = Vec::new();
    let mut archived_messages = 0;
    // A failure is reported once, as the report's outcome and reason.
    let report = match result {
        Ok(compaction) => {
            // Archive first: the compacted transcript is written only once
            // what it dropped is safe in the store.
            if let Some(store) = &store {
                let (span, n) = archive(
                    store.as_ref(),
                    &args.session,
                    &transcript.messages,
                    &compaction.messages,
                    &compaction.report,
                )?;
                archived.extend(span);
                archived_messages = n;
            }
            transcript.messages = compaction.messages;
            compaction.report
        }
        Err(err) => CompactionReport::failed(
            &err,
            &transcript.messages,
            prepared.counter().as_ref(),
            engine.state().threshold_tokens,
        ),
    };
    let violations_after = validate(&transcript.messages, args.profile).len();
    match &args.output {
        Some(path) => transcript
            .write(path, transcript.format)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => println!("{}", transcript.to_json_string_pretty().trim_end()),
    }
    let out = Report {
        file: args.input.file.display().to_string(),
        engine: engine.name(),
        context_length: prepared.context_length(),
        profile: args.profile.name(),
        compaction: &report,
        violations_after,
        archived,
        archived_messages,
        elapsed_ms,
        summarizer_call: prepared.summarizer_client().map(|c| c.last_call()),
    };
    match args.report {
        ReportFormat::Json => eprintln!("{}", serde_json::to_string_pretty(&out)?),
        ReportFormat::Text => eprint!("{}", render(&out)),
    }
    Ok(match report.outcome {
        Outcome::Compacted | Outcome::Fallback | Outcome::NothingToCompress => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}

/// Archives the compaction of `input` into `output` in `store`: the span,
/// and how many messages left the transcript.
fn archive(
    store: &dyn SessionStore,
    session: &str,
    input: &[context_engine::Message],
    output: &[context_engine::Message],
    report: &CompactionReport,
) -> anyhow::Result<(Option<ArchivedSpan>, usize)> {
    let seq = store.compactions(session)?.last().map_or(0, |c| c.seq) + 1;
    let mut info = CompactionInfo::new(seq, "cli", COMPRESSOR)
        .with_summarizer(report.summarizer.clone())
        .with_tokens(report.tokens_before, report.tokens_after);
    if let Some(span) = report.summarized {
        info = info.with_span(span.start, span.end, report.pinned);
    }
    let mut batch = Batch::new();
    let span = batch.compaction(input, output, &info);
    let removed = batch.compactions().last().map_or(0, |c| c.archived);
    store
        .commit(session, &batch)
        .with_context(|| format!("cannot archive the compaction in {}", store.location()))?;
    Ok((span, removed))
}

fn render(r: &Report<'_>) -> String {
    let c = r.compaction;
    let n = thousands;
    let outcome = match c.outcome {
        Outcome::Compacted => "compacted",
        Outcome::Fallback => "compacted with the extractive fallback",
        Outcome::Aborted => "aborted, transcript unchanged",
        Outcome::NothingToCompress => "nothing to compress, transcript unchanged",
        Outcome::Blocked => "blocked, transcript unchanged",
        Outcome::InvalidOutput => "refused (result would break a provider rule), unchanged",
        _ => "failed, transcript unchanged",
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
        s.push_str(&format!("  model     {}\n", call_line(call)));
    }
    if let Some(reason) = &c.reason {
        s.push_str(&format!("  reason    {reason}\n"));
    }
    for span in &r.archived {
        s.push_str(&format!(
            "  archived  {} messages (input {}..{}) under handle {}: ctx recall {}\n",
            r.archived_messages, span.start, span.end, span.handle, span.handle
        ));
    }
    s.push_str(&format!(
        "  profile   {}: {} violations after; {:.1} ms\n",
        r.profile, r.violations_after, r.elapsed_ms
    ));
    s
}
