//! `ctx search --store DB QUERY [--session S] [--limit N] [--json]`:
//! full-text search over the archive, each hit with the handle to recall.

use std::process::ExitCode;

use crate::output::Table;

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
    /// One JSON array of hits.
    #[arg(long)]
    pub json: bool,
    /// Show the snippets as stored, without masking what redaction would
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
        for h in &mut hits {
            h.snippet = at_rest.egress().string(&h.snippet);
        }
    }
    if args.json {
        crate::output::json(&hits)?;
    } else if !hits.is_empty() {
        let mut table = Table::new(["handle", "role", "span", "snippet"]);
        for h in &hits {
            table.row([
                h.handle.clone(),
                h.role.clone(),
                h.spans.join(" "),
                h.snippet.clone(),
            ]);
        }
        print!("{}", table.render(0));
    } else {
        eprintln!("ctx: nothing in the archive matches `{}`", args.query);
    }
    Ok(if hits.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
