//! `ctx compact FILE --context-length N [--focus TOPIC] [--summarizer
//! extractive|openai] [--base-url URL --model M] [--summarizer-context-length
//! N] [--max-output-tokens N] [-o OUT] [--report json] [--profile
//! openai|strict]`: a manual compaction with the built-in
//! `compressor` engine. The compacted transcript goes to stdout (or `-o`), in
//! the input's own format; the report goes to stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use context_engine::compressor::{Compressor, CompressorOptions};
use context_engine::engine::{CompactionReport, CompressRequest, ContextEngine, Outcome};
use context_engine::summarize::openai::{CallStats, OpenAiConfig, OpenAiSummarizer};
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
    /// The model's context window, in tokens (at least 1, and more than
    /// the system prompt).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
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
    /// The summary model's own window, in tokens: the request sent to it
    /// (prompt plus reply reserve) is bounded to fit. Unbounded when absent.
    #[arg(long)]
    pub summarizer_context_length: Option<u64>,
    /// Longest summary reply, in tokens (sent as `max_tokens`).
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
    /// Deadline of one summarizer request, in seconds (a small model on a
    /// busy CPU may need more than the default 120).
    #[arg(long)]
    pub summarizer_timeout: Option<u64>,
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
    /// The model call of `--summarizer openai`.
    #[serde(skip_serializing_if = "Option::is_none")]
    summarizer_call: Option<SummarizerCall>,
}

/// One summarizer call: latency and tokens, as counted here and as the
/// server reported them.
#[derive(Serialize)]
pub struct SummarizerCall {
    /// Wall time of the call, retries included, in milliseconds.
    pub latency_ms: f64,
    /// HTTP attempts (0 when the prompt could not be built).
    pub attempts: u32,
    /// The prompt as counted here (margin and template included).
    pub counted_prompt_tokens: usize,
    /// `max_tokens` sent.
    pub max_tokens: Option<u32>,
    /// Prompt tokens the server reported.
    pub prompt_tokens: Option<u64>,
    /// Reply tokens the server reported.
    pub completion_tokens: Option<u64>,
}

impl From<CallStats> for SummarizerCall {
    fn from(s: CallStats) -> SummarizerCall {
        SummarizerCall {
            latency_ms: s.elapsed.as_secs_f64() * 1000.0,
            attempts: s.attempts,
            counted_prompt_tokens: s.counted_prompt_tokens,
            max_tokens: s.max_tokens,
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.completion_tokens,
        }
    }
}

impl SummarizerCall {
    /// One line for the text report.
    pub fn line(&self) -> String {
        let server = |n: Option<u64>| n.map_or_else(|| "?".to_owned(), thousands);
        format!(
            "{:.0} ms, {} attempt(s); prompt {} tokens (server), {} counted with margin; \
             reply {} tokens (server){}",
            self.latency_ms,
            self.attempts,
            server(self.prompt_tokens),
            thousands(self.counted_prompt_tokens as u64),
            server(self.completion_tokens),
            self.max_tokens
                .map(|m| format!(", max {m}"))
                .unwrap_or_default(),
        )
    }
}

/// The OpenAI-compatible client for `config` (the key comes from the
/// environment variable it names), shared so that the caller can read its
/// [`OpenAiSummarizer::last_call`] stats after a compaction.
pub fn openai_client(config: OpenAiConfig) -> anyhow::Result<Arc<OpenAiSummarizer>> {
    let base_url = config.base_url.clone();
    let summarizer = OpenAiSummarizer::new(config)
        .with_context(|| format!("cannot set up the summarizer at {base_url}"))?;
    Ok(Arc::new(summarizer))
}

/// The client config from the flags: endpoint, model, key variable and the
/// summary model's bounds.
pub fn openai_config(
    base_url: &str,
    model: &str,
    api_key_env: &str,
    context_length: Option<u64>,
    max_output_tokens: Option<u32>,
) -> OpenAiConfig {
    let mut config = OpenAiConfig::new(base_url, model).with_api_key_env(api_key_env);
    if let Some(n) = context_length {
        config = config.with_context_length(n);
    }
    if let Some(n) = max_output_tokens {
        config = config.with_max_output_tokens(n);
    }
    config
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
    super::check_window(&transcript.messages, args.context_length, counter.as_ref())?;
    let options = CompressorOptions::default().with_profile(args.profile);
    let mut engine = Compressor::with_options(Arc::clone(&counter), args.context_length, options);
    let mut client = None;
    if args.summarizer == SummarizerKind::Openai {
        let base_url = args
            .base_url
            .as_deref()
            .context("--summarizer openai needs --base-url")?;
        let model = args
            .model
            .as_deref()
            .context("--summarizer openai needs --model")?;
        let mut config = openai_config(
            base_url,
            model,
            &args.api_key_env,
            args.summarizer_context_length,
            args.max_output_tokens,
        );
        if let Some(secs) = args.summarizer_timeout {
            config = config.with_timeout(std::time::Duration::from_secs(secs));
        }
        let summarizer = openai_client(config)?;
        engine = engine.with_summarizer(Box::new(Arc::clone(&summarizer)));
        client = Some(summarizer);
    }
    let mut request = CompressRequest::new().with_force(true);
    if let Some(focus) = &args.focus {
        request = request.with_focus_topic(focus.clone());
    }
    let started = Instant::now();
    let engine: &mut dyn ContextEngine = &mut engine;
    let result = engine.compress(&transcript.messages, &request);
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    // A failure is reported once, as the report's outcome and reason.
    let report = match result {
        Ok(compaction) => {
            transcript.messages = compaction.messages;
            compaction.report
        }
        Err(err) => CompactionReport::failed(
            &err,
            &transcript.messages,
            counter.as_ref(),
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
        context_length: args.context_length,
        profile: args.profile.name(),
        compaction: &report,
        violations_after,
        elapsed_ms,
        summarizer_call: client.map(|c| SummarizerCall::from(c.last_call())),
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
