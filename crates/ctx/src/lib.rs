//! `ctx`: inspect, validate, compact and replay agent transcripts.
//!
//! A thin shell over the `context_engine` library: flags in, library calls,
//! tables or JSON out. Exit codes: 0 success, 1 checked and found wanting,
//! 2 error.
//!
//! A library as well as a binary: [`run`] is the whole command line, called
//! by `main.rs` and by the Python extension (`context_engine._native.run_cli`,
//! the `ctx` a wheel installs), so that one build of the code serves both.

mod cmd;
mod exit;
mod output;
mod plot;

pub use exit::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ctx",
    version,
    about = "Manage the context window of LLM agents: inspect, validate and compact transcripts.",
    after_help = "Exit codes: 0 success, 1 the input was checked and found wanting, 2 error.\n\n\
                  Example:\n  ctx inspect examples/bugfix-session.json"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a recorded session through the engine: tokens, cache hits, cost, retention.
    #[command(
        after_help = "Drives the engine call by call as an agent would, and compares each request \
                      with what the unmanaged agent sent.\n\n\
                      Example:\n  ctx replay examples/bugfix-session.json --context-length 8000\n  \
                            ctx replay session.traj --context-length 64000 --json > report.json"
    )]
    Replay(cmd::replay::ReplayArgs),
    /// Break a transcript down by tokens: roles, tool output, largest messages, pairing.
    #[command(
        after_help = "Example:\n  ctx inspect examples/bugfix-session.json\n  \
                            ctx inspect session.traj --encoding cl100k --json"
    )]
    Inspect(cmd::inspect::InspectArgs),
    /// Check a transcript against a provider's rules; exit 1 on any violation.
    #[command(
        after_help = "Example:\n  ctx validate examples/bugfix-session.json\n  \
                            ctx validate session.jsonl --profile strict --json"
    )]
    Validate(cmd::validate::ValidateArgs),
    /// Mask secrets (API keys, tokens, passwords, private keys) in a file or stdin.
    #[command(
        after_help = "Example:\n  ctx redact session.json > session.redacted.json\n  \
                            cat .env | ctx redact - --report"
    )]
    Redact(cmd::redact::RedactArgs),
    /// Show the request view: older bulky tool results as one-line digests.
    #[command(
        after_help = "Prints the request view as JSON on stdout and a report on stderr.\n\n\
                      Example:\n  ctx digest examples/bugfix-session.json --min-bytes 1024\n  \
                            ctx digest session.traj --keep-batches 2 --json > view.json"
    )]
    Digest(cmd::digest::DigestArgs),
    /// Compact a transcript: keep head and tail, summarize the middle.
    #[command(
        after_help = "Writes the compacted transcript (same format as the input) on stdout or -o, \
                      and a report on stderr.\n\n\
                      Example:\n  ctx compact session.traj --context-length 32000 -o compacted.traj\n  \
                            ctx compact session.json --context-length 8000 --focus \"the parser bug\" --report json"
    )]
    Compact(cmd::compact::CompactArgs),
    /// Prune old tool output: duplicates, superseded reads, re-runs, large results, long arguments.
    #[command(
        after_help = "Prints the pruned transcript as JSON on stdout and a report on stderr.\n\n\
                      Example:\n  ctx prune examples/bugfix-session.json --min-reclaim 0\n  \
                            ctx prune session.traj --current-tokens 90000 --threshold 60000 > pruned.json"
    )]
    Prune(cmd::prune::PruneArgs),
    /// Print the original messages behind a handle from the session store.
    #[command(
        after_help = "Handles come from summaries (s…), digest and prune lines (a tool call id or h…), \
                      and search hits (m…).\n\n\
                      Example:\n  ctx recall --store session.db s3f9a1c2b7d04\n  \
                            ctx recall --store session.db call_7 --json"
    )]
    Recall(cmd::recall::RecallArgs),
    /// Full-text search over what compactions archived in the session store.
    #[command(
        after_help = "Example:\n  ctx search --store session.db \"KeyError test_io.py\"\n  \
                            ctx search --store session.db pytest --json"
    )]
    Search(cmd::search::SearchArgs),
    /// Show the effective configuration with each value's source, or check a config file.
    #[command(
        after_help = "Example:\n  ctx config show --set context.threshold_percent=60\n  \
                            ctx config check config.example.yaml"
    )]
    Config(cmd::config::ConfigArgs),
    /// Run the engine as an OpenAI-compatible proxy in front of any provider.
    #[command(
        after_help = "Point the agent's base URL at http://127.0.0.1:8787/v1; every chat request is \
                      managed (digest, prune, compaction), every other /v1 call passed through. \
                      Metrics at /metrics, a session's status at /ctx/sessions/{id}.\n\n\
                      Example:\n  ctx serve --upstream https://api.openai.com/v1 --context-length 128000\n  \
                            ctx serve --upstream http://127.0.0.1:8080/v1 --listen 127.0.0.1:9000"
    )]
    Serve(cmd::serve::ServeArgs),
    /// See the proxy and its page work, offline: a recorded session driven through `ctx serve`.
    #[command(
        after_help = "Starts the proxy (a session store in memory) in front of a stand-in model that \
                      answers with the recorded session's own replies, prints the page's address and \
                      drives the session through it call by call; the page fills in live.\n\n\
                      Example:\n  ctx demo\n  ctx demo session.traj --context-length 8000 --listen 127.0.0.1:9000"
    )]
    Demo(cmd::demo::DemoArgs),
}

/// Structured logs on stderr for `ctx serve` and `ctx demo`
/// (`CTX_LOG=debug|info|warn`, default `default`); bodies and keys are never
/// logged.
fn init_logging(default: tracing::Level) {
    let level = cmd::engine::process_env()
        .get("CTX_LOG")
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(default);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        // A second run in the same process (the Python extension) keeps the
        // first one's subscriber.
        .try_init()
        .ok();
}

/// Exit status of a `ctx` whose reader went away (`ctx … | head`): what a
/// shell reports for a process that SIGPIPE ended (128 + 13), without a
/// message.
pub const BROKEN_PIPE: u8 = 141;

/// Runs the `ctx` command line `args` (the program name first, as in
/// `std::env::args_os`) and returns its exit status: 0 success, 1 checked
/// and found wanting, 2 error (and for bad flags, as clap reports them),
/// [`BROKEN_PIPE`] when stdout's reader closed it. Help and errors go to
/// stdout and stderr as the binary's do; stdout is flushed before it returns.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are "errors" that exit 0.
            let _ = err.print();
            return u8::try_from(err.exit_code()).unwrap_or(2);
        }
    };
    prepare_tokenizer(&cli.command);
    let result = match &cli.command {
        Command::Replay(args) => cmd::replay::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Validate(args) => cmd::validate::run(args),
        Command::Redact(args) => cmd::redact::run(args),
        Command::Digest(args) => cmd::digest::run(args),
        Command::Compact(args) => cmd::compact::run(args),
        Command::Prune(args) => cmd::prune::run(args),
        Command::Config(args) => cmd::config::run(args),
        Command::Recall(args) => cmd::recall::run(args),
        Command::Search(args) => cmd::search::run(args),
        Command::Serve(args) => {
            init_logging(tracing::Level::INFO);
            cmd::serve::run(args)
        }
        Command::Demo(args) => {
            init_logging(tracing::Level::WARN);
            cmd::demo::run(args)
        }
    };
    let flushed = std::io::Write::flush(&mut std::io::stdout());
    match (result, flushed) {
        (Err(err), _) if is_broken_pipe(&err) => BROKEN_PIPE,
        (Err(err), _) => {
            eprintln!("ctx: error: {err:#}");
            2
        }
        (Ok(_), Err(err)) if err.kind() == std::io::ErrorKind::BrokenPipe => BROKEN_PIPE,
        (Ok(_), Err(err)) => {
            eprintln!("ctx: error: writing the output: {err}");
            2
        }
        (Ok(code), Ok(())) => code.code(),
    }
}

/// Whether `err` is, anywhere in its chain, a write to a closed pipe.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Commands that count tokens start the default vocabulary's tables on a
/// background thread while they read their input (a build of about 1.6 s
/// in a wheel's `compact-vocab` build, a 50 ms load otherwise); one for
/// another model's vocabulary waits for its own on first use.
fn prepare_tokenizer(command: &Command) {
    let counts = !matches!(
        command,
        Command::Config(_) | Command::Recall(_) | Command::Search(_) | Command::Redact(_)
    );
    if counts {
        context_engine::tokens::prepare(context_engine::tokens::Encoding::O200kBase);
    }
}
