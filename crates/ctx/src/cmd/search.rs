//! `ctx search --store DB QUERY [--session S] [--limit N] [--json]`:
//! full-text search over the archive, each hit with the handle to recall
//! and the lines that hold the words.

use crate::exit::ExitCode;
use std::fmt::Write as _;

use context_engine::store::{SearchHit, Terms};

/// Arguments of `ctx search`.
#[derive(Debug, clap::Args)]
pub struct SearchArgs {
    /// Words to find; all must match, else any (each as a phrase: `test_io.py`).
    pub query: String,
    #[command(flatten)]
    pub store: super::StoreArgs,
    /// Only this session's archive (default: every session).
    #[arg(long)]
    pub session: Option<String>,
    /// Most hits to show.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// One JSON array of hits (each with its matched lines: number, text
    /// and the byte ranges of the words in it).
    #[arg(long)]
    pub json: bool,
    /// Show the lines as stored, without masking what redaction would
    /// mask (a verbatim store's secrets).
    #[arg(long)]
    pub unmasked: bool,
}

/// Run `ctx search`. Exit 0 with hits, 1 without, 2 on errors.
pub fn run(args: &SearchArgs) -> anyhow::Result<ExitCode> {
    let (store, _, at_rest) = args.store.open_read_only()?;
    if args
        .query
        .split_whitespace()
        .all(|w| !w.chars().any(char::is_alphanumeric))
    {
        anyhow::bail!("the query has no words to search for");
    }
    let mut hits = store.search(args.session.as_deref(), &args.query, args.limit)?;
    if !args.unmasked {
        // Masking may move the words: their ranges are found again.
        let terms = Terms::new(&args.query);
        for line in hits.iter_mut().flat_map(|h| h.lines.iter_mut()) {
            let masked = at_rest.egress().string(&line.text);
            if masked != line.text {
                line.ranges = terms.ranges(&masked);
                line.text = masked;
            }
        }
    }
    if args.json {
        crate::output::json(&hits)?;
    } else if !hits.is_empty() {
        print!("{}", render(&hits));
    } else {
        eprintln!("ctx: nothing in the archive matches `{}`", args.query);
    }
    Ok(if hits.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Each hit as a line naming its handle, role and spans, then its matched
/// lines, numbered, indented under it.
fn render(hits: &[SearchHit]) -> String {
    let mut out = String::new();
    for (k, h) in hits.iter().enumerate() {
        if k > 0 {
            out.push('\n');
        }
        let _ = write!(out, "{}  {}", h.handle, h.role);
        if !h.spans.is_empty() {
            let _ = write!(out, "  span {}", h.spans.join(" "));
        }
        out.push('\n');
        let width = h
            .lines
            .iter()
            .map(|l| l.line.to_string().len())
            .max()
            .unwrap_or(1);
        for l in &h.lines {
            let _ = writeln!(out, "  {:>width$}: {}", l.line, l.text);
        }
    }
    out
}
