//! `ctx compact FILE --context-length N [--focus TOPIC] [--summarizer
//! extractive|openai] [--base-url URL --model M] [-o OUT] [--report json]
//! [--profile openai|strict]`: a manual compaction with the built-in
//! `compressor` engine. The compacted transcript goes to stdout (or `-o`), in
//! the input's own format; the report goes to stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use context_engine::compressor::{CompactionReport, Compressor, CompressorOptions, Outcome};
use context_engine::engine::{CompressRequest, ContextEngine};
use context_engine::summarize::Summarizer;
use context_engine::summarize::openai::{OpenAiConfig, OpenAiSummarizer};
use context_engine::tokens::{
    BpeCounter, CachedCounter, Encoding, TokenCounter, counter_for_model,
};
use context_engine::validate::{Profile, validate};
use serde::Serialize;

use crate::output::thousands;

/// Which summarizer writes the summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SummarizerKind {
    /// Offline and deterministic, built from the messages themselves.
    Extractive,
    /// An OpenAI-compatible chat-completions endpoint (`--base-url`, `--model`).
    Openai,
}

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
    /// The model's context window, in tokens.
    #[arg(long)]
    pub context_length: u64,
    /// Topic to keep in full detail in the summary.
    #[arg(long)]
    pub focus: Option<String>,
    /// Who writes the summary.
    #[arg(long, value_enum, default_value_t = SummarizerKind::Extractive)]
    pub summarizer: SummarizerKind,
    /// Base URL of the OpenAI-compatible endpoint (e.g. http://127.0.0.1:8080/v1).
    #[arg(long)]
    pub base_url: Option<String>,
    /// Model name: the summary model for `--summarizer openai`, and the
    /// tokenizer choice (o200k when absent).
    #[arg(long)]
    pub model: Option<String>,
    /// Environment variable holding the summarizer's API key (sent as a
    /// Bearer token; the key itself is never taken as a flag).
    #[arg(long, default_value = "OPENAI_API_KEY")]
    pub api_key_env: String,
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
    context_length: u64,
    profile: &'static str,
    #[serde(flatten)]
    compaction: &'a CompactionReport,
    /// Violations of the profile in the written transcript.
    violations_after: usize,
    /// Wall time of the compaction, in milliseconds (summarizer call included).
    elapsed_ms: f64,
}

/// Builds the OpenAI-compatible summarizer; the key comes from the
/// environment variable named `api_key_env`.
pub fn openai_summarizer(
    base_url: &str,
    model: &str,
    api_key_env: &str,
) -> anyhow::Result<Box<dyn Summarizer>> {
    let config = OpenAiConfig::new(base_url, model).with_api_key_env(api_key_env);
    let summarizer = OpenAiSummarizer::new(config)
        .with_context(|| format!("cannot set up the summarizer at {base_url}"))?;
    Ok(Box::new(summarizer))
}

/// Run `ctx compact`. Exit 0 when compacted (or nothing to compact), 1 when
/// the compaction was aborted, blocked or refused (the input is written
/// back unchanged), 2 on errors.
pub fn run(args: &CompactArgs) -> anyhow::Result<ExitCode> {
    let mut transcript = args.input.load()?;
    let counter: Arc<dyn TokenCounter> = match &args.model {
        Some(model) => counter_for_model(model),
        None => Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase))),
    };
    let options = CompressorOptions::default().with_profile(args.profile);
    let mut engine = Compressor::with_options(counter, args.context_length, options);
    if args.summarizer == SummarizerKind::Openai {
        let base_url = args
            .base_url
            .as_deref()
            .context("--summarizer openai needs --base-url")?;
        let model = args
            .model
            .as_deref()
            .context("--summarizer openai needs --model")?;
        engine = engine.with_summarizer(openai_summarizer(base_url, model, &args.api_key_env)?);
    }
    let mut request = CompressRequest::new().with_force(true);
    if let Some(focus) = &args.focus {
        request = request.with_focus_topic(focus.clone());
    }
    let started = Instant::now();
    let result = engine.compress(&transcript.messages, &request);
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    let compacted = match result {
        Ok(messages) => Some(messages),
        Err(err) => {
            eprintln!("ctx: {err}");
            None
        }
    };
    let report = engine
        .last_report()
        .cloned()
        .context("the engine left no report")?;
    if let Some(messages) = compacted {
        transcript.messages = messages;
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
        context_length: args.context_length,
        profile: args.profile.name(),
        compaction: &report,
        violations_after,
        elapsed_ms,
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
    if let Some(reason) = &c.reason {
        s.push_str(&format!("  reason    {reason}\n"));
    }
    s.push_str(&format!(
        "  profile   {}: {} violations after; {:.1} ms\n",
        r.profile, r.violations_after, r.elapsed_ms
    ));
    s
}
