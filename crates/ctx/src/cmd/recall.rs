//! `ctx recall --store DB HANDLE [--session S] [--json]`: the original
//! messages behind a handle a summary, digest line or search hit names,
//! as they were archived, what redaction masks masked unless `--unmasked`.

use crate::exit::ExitCode;

use context_engine::store::EntryKind;
use serde_json::json;

/// Arguments of `ctx recall`.
#[derive(Debug, clap::Args)]
pub struct RecallArgs {
    /// The handle (`s…` span, `m…` message, a tool call id or `h…` hash).
    pub handle: String,
    #[command(flatten)]
    pub store: super::StoreArgs,
    /// Only this session's archive (default: every session).
    #[arg(long)]
    pub session: Option<String>,
    /// The messages as JSON objects, byte for byte as archived (masked
    /// unless `--unmasked`).
    #[arg(long)]
    pub json: bool,
    /// Show the messages as archived, without masking what redaction would
    /// mask (a verbatim store's secrets; an encrypted store's need its key).
    #[arg(long)]
    pub unmasked: bool,
}

/// Run `ctx recall`. Exit 0 when found, 1 when the store has no such
/// handle, 2 on errors.
pub fn run(args: &RecallArgs) -> anyhow::Result<ExitCode> {
    let (store, path, at_rest) = args.store.open_read_only()?;
    let Some(mut entry) = store.resolve(args.session.as_deref(), &args.handle)? else {
        eprintln!(
            "ctx: no handle `{}` in {}{}",
            args.handle,
            path.display(),
            args.session
                .as_deref()
                .map(|s| format!(" (session `{s}`)"))
                .unwrap_or_default()
        );
        return Ok(ExitCode::from(1));
    };
    if !args.unmasked {
        for m in &mut entry.messages {
            if let Some(masked) = at_rest.egress().message_at_rest(m) {
                *m = masked;
            }
        }
    }
    if args.json {
        let out = json!({
            "handle": entry.handle,
            "kind": entry.kind,
            "session": entry.session,
            "start": entry.start,
            "end": entry.end,
            "messages": entry.messages,
        });
        crate::output::json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let what = match (entry.kind, entry.start, entry.end) {
        (EntryKind::Span, Some(s), Some(e)) => format!("messages {s}..{e} of a compaction"),
        (EntryKind::Span, _, _) => "a span".to_owned(),
        (EntryKind::Message, _, _) => "one message".to_owned(),
    };
    eprintln!(
        "{}: {what}, session `{}`, {} message(s)",
        entry.handle,
        entry.session,
        entry.messages.len()
    );
    for (k, m) in entry.messages.iter().enumerate() {
        let mut head = format!("── {} · {}", k + 1, m.role.as_str());
        if let Some(id) = &m.tool_call_id {
            head.push_str(&format!(" · result of {id}"));
        }
        println!("{head} ──");
        println!("{}", m.text());
        for call in m.tool_calls() {
            if let Some(f) = &call.function {
                println!(
                    "→ {} {} {}",
                    call.id.as_deref().unwrap_or("-"),
                    f.name,
                    f.arguments
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
