//! The `ctx` binary: the command line of the `ctx` library ([`ctx::run`]).

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(ctx::run(std::env::args_os()))
}
