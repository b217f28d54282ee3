//! `run_cli`: the `ctx` command line, in process. The console script a
//! wheel installs (`context_engine._cli:main`) calls it with `sys.argv`.

use std::ffi::OsString;

use pyo3::prelude::*;

/// Runs `ctx` with `argv` (the program name first) and returns its exit
/// status (see `ctx --help`). The interpreter is released while it runs;
/// stdout and stderr are the process's own file descriptors, as for the
/// binary.
#[pyfunction]
pub fn run_cli(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    py.detach(move || ctx::run(argv))
}
