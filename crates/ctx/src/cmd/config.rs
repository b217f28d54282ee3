//! `ctx config show|check`: the effective configuration and where each value
//! came from; checking a config file.

use crate::exit::ExitCode;
use std::path::PathBuf;

use context_engine::config::{ConfigError, ConfigLoader, ConfigWarning, Entry};
use serde::Serialize;

use crate::output::{self, Table};

#[derive(clap::Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(clap::Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration, each value with its source
    /// (default, FILE:LINE, env VAR, flag).
    #[command(after_help = "Example:\n  ctx config show\n  \
                            ctx config show --config ./config.yaml --set context.threshold_percent=60 --json")]
    Show(ShowArgs),
    /// Check a config file: exit 0 when valid (warnings on stderr), 1 when invalid.
    #[command(after_help = "Example:\n  ctx config check config.example.yaml")]
    Check(CheckArgs),
}

#[derive(clap::Args)]
pub struct ShowArgs {
    /// Config file (else $CTX_CONFIG, ./config.yaml, the user config folder).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Override a key: `key.path=value` (value read as YAML); repeatable,
    /// later wins.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The config file to check (read alone: no environment, no flags).
    file: PathBuf,
    /// Print a JSON report instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct ShowReport<'a> {
    file: Option<String>,
    config: &'a context_engine::config::Config,
    entries: Vec<Entry>,
    warnings: &'a [ConfigWarning],
}

#[derive(Serialize)]
struct CheckReport<'a> {
    file: String,
    valid: bool,
    error: Option<String>,
    warnings: &'a [ConfigWarning],
}

pub fn run(args: &ConfigArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        ConfigCommand::Show(a) => show(a),
        ConfigCommand::Check(a) => check(a),
    }
}

fn warn(warnings: &[ConfigWarning]) {
    for w in warnings {
        eprintln!("ctx: warning: {w}");
    }
}

fn show(args: &ShowArgs) -> anyhow::Result<ExitCode> {
    let loaded = ConfigLoader::new()
        .with_file(args.config.clone())
        .with_environment(&super::engine::process_env())
        .with_overrides(args.set.iter().cloned())
        .load()?;
    warn(&loaded.warnings);
    let entries = loaded.entries();
    let file = loaded.file.as_ref().map(|p| p.display().to_string());
    if args.json {
        output::json(&ShowReport {
            file,
            config: &loaded.config,
            entries,
            warnings: &loaded.warnings,
        })?;
    } else {
        println!("config file: {}", file.as_deref().unwrap_or("(none)"));
        let mut table = Table::new(["key", "value", "source"]);
        for e in &entries {
            let value = match &e.value {
                serde_json::Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            table.row([e.path.clone(), value, e.source.to_string()]);
        }
        print!("{}", table.render(0));
    }
    Ok(ExitCode::SUCCESS)
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let file = args.file.display().to_string();
    let result = ConfigLoader::new()
        .with_file(Some(args.file.clone()))
        .load();
    let (error, warnings) = match result {
        Ok(loaded) => (None, loaded.warnings),
        // A file that cannot be read is an error of the call, not a verdict.
        Err(e @ (ConfigError::NotFound { .. } | ConfigError::Read { .. })) => return Err(e.into()),
        Err(e) => (Some(e.to_string()), Vec::new()),
    };
    let valid = error.is_none();
    if args.json {
        output::json(&CheckReport {
            file,
            valid,
            error,
            warnings: &warnings,
        })?;
    } else {
        warn(&warnings);
        match &error {
            None => println!(
                "{file}: valid ({} warning{})",
                warnings.len(),
                if warnings.len() == 1 { "" } else { "s" }
            ),
            Some(e) => eprintln!("ctx: error: {e}"),
        }
    }
    Ok(if valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
