//! `context_engine._native`: the context-engine library for Python.
//!
//! A thin layer: conversion of OpenAI-format dicts (`convert`), the
//! exception hierarchy (`errors`), engine construction from the
//! configuration layers (`setup`), the built-in engine (`engine`), the
//! module functions (`functions`) and the `ctx` command line (`cli`).
//! Engine logic lives in the core crate, which knows nothing of Python.

mod cli;
mod convert;
mod engine;
mod errors;
mod functions;
mod setup;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add(
        "ContextEngineError",
        py.get_type::<errors::ContextEngineError>(),
    )?;
    m.add("ValidationError", py.get_type::<errors::ValidationError>())?;
    m.add("ConfigError", py.get_type::<errors::ConfigError>())?;
    m.add_class::<engine::PyCompressor>()?;
    m.add_function(wrap_pyfunction!(functions::count_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(functions::validate, m)?)?;
    m.add_function(wrap_pyfunction!(functions::ensure_valid, m)?)?;
    m.add_function(wrap_pyfunction!(functions::digest, m)?)?;
    let with_report = wrap_pyfunction!(functions::digest_with_report_py, m)?;
    m.add("digest_with_report", with_report)?;
    m.add_function(wrap_pyfunction!(functions::redact, m)?)?;
    m.add_function(wrap_pyfunction!(functions::load_transcript, m)?)?;
    m.add_function(wrap_pyfunction!(functions::replay, m)?)?;
    m.add_function(wrap_pyfunction!(cli::run_cli, m)?)?;
    // The default vocabulary's tables (built at run time in this build:
    // `compact-vocab`) start on a background thread now, so that the first
    // count after import does not pay for them.
    context_engine::tokens::prepare(context_engine::tokens::Encoding::O200kBase);
    Ok(())
}
