//! `ctx redact [FILE|-] [--url-credentials] [--report]`: write a text with its
//! secrets masked, or list what would be masked (rule, line, masked form;
//! never the secret itself).

use crate::exit::ExitCode;
use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use context_engine::redact::{RedactOptions, Redactor};

/// Arguments of `ctx redact`.
#[derive(Debug, clap::Args)]
pub struct RedactArgs {
    /// File to redact; `-` or nothing reads standard input.
    pub file: Option<PathBuf>,
    /// Also mask sensitive URL query parameters and all URL userinfo.
    #[arg(long)]
    pub url_credentials: bool,
    /// Treat the input as source code: skip generic `KEY = value` rules.
    #[arg(long)]
    pub code_file: bool,
    /// List what is masked (rule id, line, masked form) instead of the text.
    #[arg(long)]
    pub report: bool,
    /// `security.redact_patterns` from the configuration mask too.
    #[command(flatten)]
    pub config: super::ConfigArgs,
}

/// Run `ctx redact`: the built-in rules and the configuration's
/// `security.redact_patterns`, as the engine masks what leaves the process.
/// The user asked for redaction explicitly, so the opt-out
/// (`security.redact_secrets: false`, `CTX_REDACT_SECRETS=0`) does not apply. With `--report`, exits 1
/// when something was masked (like a linter), else 0.
pub fn run(args: &RedactArgs) -> anyhow::Result<ExitCode> {
    let text = read_input(args.file.as_deref())?;
    let config = args.config.load()?;
    let redactor = Redactor::builder()
        .patterns(config.security.redact_patterns)
        .build()
        .context("building the secret redactor")?;
    let opts = RedactOptions {
        force: true,
        url_credentials: args.url_credentials,
        code_file: args.code_file,
    };
    let result = redactor.redact_report(&text, &opts);
    let mut out = std::io::stdout().lock();
    if args.report {
        for f in &result.findings {
            writeln!(out, "{}\tline {}\t{}", f.rule, f.line, f.masked)
                .context("writing the report")?;
        }
        writeln!(out, "{} secret(s) masked", result.findings.len())
            .context("writing the report")?;
        return Ok(if result.findings.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    out.write_all(result.text.as_bytes())
        .context("writing the redacted text")?;
    Ok(ExitCode::SUCCESS)
}

fn read_input(file: Option<&std::path::Path>) -> anyhow::Result<String> {
    match file {
        Some(path) if path.as_os_str() != "-" => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
        }
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading standard input")?;
            Ok(text)
        }
    }
}
