//! `ctx validate`: check a transcript against a provider's rules.

use crate::exit::ExitCode;

use context_engine::validate::{Profile, Violation, validate};
use serde::Serialize;

use crate::output::{self, Table};

#[derive(clap::Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub input: super::Input,
    /// Provider rules: `openai`, or `strict` (Anthropic-like: starts with a
    /// user turn, roles alternate). Default: the format's own rules for an
    /// Anthropic or Responses request, a Claude Code or Codex session log;
    /// `openai` otherwise.
    #[arg(long)]
    profile: Option<Profile>,
    /// Print a JSON report instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    file: String,
    format: &'static str,
    profile: &'static str,
    messages: usize,
    valid: bool,
    violations: &'a [Violation],
}

pub fn run(args: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let transcript = args.input.load()?;
    let (profile, violations) = match (args.profile, transcript.native_violations()) {
        (None, Some(native)) => native,
        (profile, _) => {
            let profile = profile.unwrap_or_default();
            (profile.name(), validate(&transcript.messages, profile))
        }
    };
    let report = Report {
        file: args.input.file.display().to_string(),
        format: transcript.format.name(),
        profile,
        messages: transcript.messages.len(),
        valid: violations.is_empty(),
        violations: &violations,
    };
    if args.json {
        output::json(&report)?;
    } else if violations.is_empty() {
        println!(
            "{}: valid ({} messages, {} profile)",
            report.file, report.messages, report.profile
        );
    } else {
        println!(
            "{}: {} violation{} in {} messages ({} profile)",
            report.file,
            violations.len(),
            if violations.len() == 1 { "" } else { "s" },
            report.messages,
            report.profile
        );
        let mut table = Table::new(["index", "rule", "detail"]);
        for v in &violations {
            table.row([
                v.index.to_string(),
                v.rule.name().to_string(),
                v.detail.clone(),
            ]);
        }
        print!("{}", table.render(2));
    }
    Ok(if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
