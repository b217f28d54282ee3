//! `ctx digest FILE [--keep-batches N] [--min-bytes N] [--json]`: the request
//! view of a transcript, with older bulky tool results digested, on stdout;
//! what the digest did on stderr.

use crate::exit::ExitCode;

use context_engine::digest::{DigestOptions, DigestReport, digest_with_report};
use serde::Serialize;

use crate::output::{self, thousands};

/// Arguments of `ctx digest`.
#[derive(Debug, clap::Args)]
pub struct DigestArgs {
    #[command(flatten)]
    pub input: super::Input,
    /// Keep this many of the newest tool batches whole (default
    /// `context.digest.keep_batches`, 1).
    #[arg(long)]
    pub keep_batches: Option<usize>,
    /// Digest older results of at least this many bytes, images always
    /// (default `context.digest.min_bytes`, 4096).
    #[arg(long)]
    pub min_bytes: Option<usize>,
    #[command(flatten)]
    pub model: super::ModelArg,
    #[command(flatten)]
    pub config: super::ConfigArgs,
    /// Write the report on stderr as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The stderr report.
#[derive(Serialize)]
struct Report {
    file: String,
    enabled: bool,
    messages: usize,
    #[serde(flatten)]
    digest: DigestReport,
    /// Bytes of the request's JSON, before and after.
    request_bytes_before: usize,
    request_bytes_after: usize,
    /// Tokens of the request (the `--model`'s tokenizer), before and after.
    tokens_before: usize,
    tokens_after: usize,
}

/// Run `ctx digest`. Honours `CTX_TOOL_DIGEST_DISABLED=1` (the view is then
/// the transcript unchanged).
pub fn run(args: &DigestArgs) -> anyhow::Result<ExitCode> {
    let transcript = args.input.load()?;
    let messages = &transcript.messages;
    let config = args.config.load()?;
    let base = config.digest_options();
    let opts = DigestOptions {
        keep_batches: args.keep_batches.unwrap_or(base.keep_batches),
        min_bytes: args.min_bytes.unwrap_or(base.min_bytes),
        ..base
    };
    let (view, digest) = digest_with_report(messages, &opts);
    let counter = args.model.counter();
    let report = Report {
        file: args.input.file.display().to_string(),
        enabled: opts.enabled,
        messages: messages.len(),
        digest,
        request_bytes_before: serde_json::to_string(messages)?.len(),
        request_bytes_after: serde_json::to_string(&view)?.len(),
        tokens_before: counter.count_messages(messages),
        tokens_after: counter.count_messages(&view),
    };
    output::json(&view)?;
    if args.json {
        eprintln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprint!("{}", render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(r: &Report) -> String {
    let n = |v: usize| thousands(v as u64);
    let mut s = format!(
        "{}: {} messages; {} tool results and {} envelopes digested, {} binary parts dropped{}\n",
        r.file,
        r.messages,
        r.digest.results_digested,
        r.digest.envelopes_digested,
        r.digest.binary_parts_dropped,
        if r.enabled {
            ""
        } else {
            " (digest disabled: context.digest.enabled is false)"
        },
    );
    s.push_str(&format!(
        "  bytes   {:>12} -> {:>12}\n  tokens  {:>12} -> {:>12}\n",
        n(r.request_bytes_before),
        n(r.request_bytes_after),
        n(r.tokens_before),
        n(r.tokens_after),
    ));
    s
}
