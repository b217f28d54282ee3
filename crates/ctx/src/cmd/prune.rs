//! `ctx prune FILE [--current-tokens N] [--threshold N] [--min-reclaim N]`:
//! the proactive prune of a transcript on stdout (JSON), what it did on
//! stderr.

use crate::exit::ExitCode;

use context_engine::prune::{PruneChange, PruneCounts, PruneOptions, PruneSkip, prune};
use serde::Serialize;

use crate::output::{self, thousands};

/// Arguments of `ctx prune`.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub input: super::Input,
    /// The prompt's size as the provider last reported it; counted with the
    /// `--model`'s tokenizer when not given.
    #[arg(long)]
    pub current_tokens: Option<u64>,
    /// Prune only when the prompt is above this many tokens (0 turns
    /// pruning off, as in config).
    #[arg(long, default_value_t = 1)]
    pub threshold: u64,
    /// Commit only when at least this many tokens are freed (default
    /// `context.prune.min_reclaim_tokens`).
    #[arg(long)]
    pub min_reclaim: Option<u64>,
    /// Never touch the last N messages, extended back to whole tool batches
    /// (default `context.prune.protect_last_n`).
    #[arg(long)]
    pub protect_last: Option<usize>,
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
    messages: usize,
    pruned: usize,
    #[serde(flatten)]
    counts: PruneCounts,
    tokens_before: u64,
    tokens_after: u64,
    reclaimed_tokens: u64,
    skipped: Option<PruneSkip>,
    changes: Vec<PruneChange>,
}

/// Run `ctx prune`.
pub fn run(args: &PruneArgs) -> anyhow::Result<ExitCode> {
    let transcript = args.input.load()?;
    let messages = &transcript.messages;
    let base = args.config.load()?.prune_options();
    let opts = PruneOptions {
        proactive_prune_tokens: args.threshold,
        min_reclaim_tokens: args.min_reclaim.unwrap_or(base.min_reclaim_tokens),
        protect_last_n: args.protect_last.unwrap_or(base.protect_last_n),
        ..base
    };
    let counter = args.model.counter();
    let out = prune(messages, args.current_tokens, &opts, counter.as_ref());
    output::json(&out.messages)?;
    let report = Report {
        file: args.input.file.display().to_string(),
        messages: messages.len(),
        pruned: out.pruned,
        counts: out.counts,
        tokens_before: out.tokens_before,
        tokens_after: out.tokens_after,
        reclaimed_tokens: out.reclaimed_tokens,
        skipped: out.skipped,
        changes: out.changes,
    };
    if args.json {
        eprintln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprint!("{}", render(&report, &opts));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(r: &Report, opts: &PruneOptions) -> String {
    let c = &r.counts;
    let mut s = format!(
        "{}: {} messages; {} pruned: {} duplicates, {} superseded reads, {} re-runs, \
         {} digested, {} calls with arguments clipped\n",
        r.file,
        r.messages,
        r.pruned,
        c.duplicates,
        c.superseded_reads,
        c.reruns,
        c.digested,
        c.args_clipped,
    );
    match r.skipped {
        Some(PruneSkip::Disabled) => s.push_str("  not run: --threshold 0 turns pruning off\n"),
        Some(PruneSkip::BelowThreshold) => s.push_str(&format!(
            "  not run: the prompt is not above --threshold {}\n",
            thousands(opts.proactive_prune_tokens)
        )),
        Some(PruneSkip::TooLittle { reclaimable }) => s.push_str(&format!(
            "  not committed: would free {} tokens, under --min-reclaim {}\n",
            thousands(reclaimable),
            thousands(opts.min_reclaim_tokens)
        )),
        Some(PruneSkip::WouldBreak) => {
            s.push_str("  not committed: the result would break provider rules\n");
        }
        None => {}
    }
    s.push_str(&format!(
        "  tokens  {:>12} -> {:>12}  ({} reclaimed)\n",
        thousands(r.tokens_before),
        thousands(r.tokens_after),
        thousands(r.reclaimed_tokens),
    ));
    s
}
