//! The exception hierarchy: `ContextEngineError` and its two subclasses.
//! Messages are the library errors' `Display`, which is what `ctx` prints.
//! Bad input from the caller is a plain `ValueError` (see `convert`).

use std::sync::{Mutex, MutexGuard};

use context_engine::engine::EngineError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _native,
    ContextEngineError,
    PyException,
    "Base class of every error the engine reports (message as the `ctx` CLI prints it)."
);
create_exception!(
    _native,
    ValidationError,
    ContextEngineError,
    "A transcript breaks a provider rule, or an engine produced one that would."
);
create_exception!(
    _native,
    ConfigError,
    ContextEngineError,
    "The configuration (config.yaml, CTX_ variables, settings) cannot be used."
);

/// The Python error of an engine failure.
pub fn engine_error(e: &EngineError) -> PyErr {
    match e {
        EngineError::InvalidOutput { .. } => ValidationError::new_err(e.to_string()),
        _ => ContextEngineError::new_err(context_engine::error_chain(e)),
    }
}

/// The error of a configuration problem, with its causes (each once, as
/// `ctx` prints them).
pub fn config_error(e: &(dyn std::error::Error + 'static)) -> PyErr {
    ConfigError::new_err(context_engine::error_chain(e))
}

/// Locks `mutex`; a panic in another thread while it held the lock is an
/// exception here, never a second panic.
pub fn lock<T>(mutex: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    mutex.lock().map_err(|_| {
        ContextEngineError::new_err(
            "the engine is unusable: a previous call failed while holding it",
        )
    })
}
