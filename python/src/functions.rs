//! Module-level functions: token counting, validation, digest, redaction,
//! transcript loading and replay. Each converts its input under the
//! interpreter and does the work with it released.

use std::path::PathBuf;

use context_engine::Message;
use context_engine::builder::{Archive, ReplayRun};
use context_engine::config::Env;
use context_engine::digest::{DigestOptions, digest_with_report};
use context_engine::redact::{RedactOptions, Redactor, redact as redact_text};
use context_engine::transcript::{LoadError, Transcript};
use context_engine::validate::validate as validate_messages;
use context_engine_sqlite::open_at_rest;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use serde_json::Value;

use crate::convert::{
    MessageError, message_values, message_values_out, parse_messages, py_str, report_to_py,
    values_to_py,
};
use crate::errors::{ContextEngineError, ValidationError, config_error};
use crate::setup::{ConfigSpec, EngineSpec, counter, engines, parse_encoding, parse_profile};

/// Parses `messages` with the interpreter released and runs `f` on them.
fn detached<T: Send>(
    py: Python<'_>,
    messages: &Bound<'_, PyAny>,
    f: impl FnOnce(Vec<Message>) -> T + Send,
) -> PyResult<T> {
    let values = message_values(messages)?;
    py.detach(|| {
        let messages = parse_messages(values).map_err(MessageError::into_py)?;
        Ok(f(messages))
    })
}

/// Exact tokens of a text, or of a message list as a provider bills it.
#[pyfunction]
#[pyo3(signature = (value, *, encoding="o200k_base", model=None))]
pub fn count_tokens(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    encoding: &str,
    model: Option<&str>,
) -> PyResult<usize> {
    let counter = counter(model, parse_encoding(encoding)?);
    if let Ok(s) = value.cast::<PyString>() {
        let text = py_str(s).map_err(|e| e.into_py("text"))?;
        return Ok(py.detach(move || counter.count_text(&text)));
    }
    detached(py, value, move |messages| counter.count_messages(&messages))
}

/// Every provider-rule violation: a list of `{"index", "rule", "detail"}`.
#[pyfunction]
#[pyo3(signature = (messages, *, profile="openai"))]
pub fn validate<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    profile: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let profile = parse_profile(profile)?;
    let violations = detached(py, messages, move |m| validate_messages(&m, profile))?;
    report_to_py(py, &violations)
}

/// Raises `ValidationError` listing every violation, as `ctx validate`
/// prints them; returns `None` when the messages are valid.
#[pyfunction]
#[pyo3(signature = (messages, *, profile="openai"))]
pub fn ensure_valid(py: Python<'_>, messages: &Bound<'_, PyAny>, profile: &str) -> PyResult<()> {
    let profile = parse_profile(profile)?;
    let violations = detached(py, messages, move |m| validate_messages(&m, profile))?;
    if violations.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = violations.iter().map(ToString::to_string).collect();
    Err(ValidationError::new_err(format!(
        "{} violation{} of the {} rules:\n{}",
        violations.len(),
        if violations.len() == 1 { "" } else { "s" },
        profile.name(),
        lines.join("\n")
    )))
}

/// The digest options of the configuration (`context.digest`, with the
/// text actions of `context.text_actions`), the caller's arguments on top:
/// what `ctx digest` does with its flags.
fn digest_options(
    config: &ConfigSpec,
    keep_batches: Option<usize>,
    min_bytes: Option<usize>,
) -> PyResult<DigestOptions> {
    let base = config
        .load(&Env::from_os(std::env::vars_os()))?
        .config
        .digest_options();
    Ok(DigestOptions {
        keep_batches: keep_batches.unwrap_or(base.keep_batches),
        min_bytes: min_bytes.unwrap_or(base.min_bytes),
        ..base
    })
}

/// The request view with older bulky tool results digested, and the
/// report (`results_digested`, `bytes_before`, ...).
#[pyfunction]
#[pyo3(signature = (messages, *, keep_batches=None, min_bytes=None, config=None, settings=None, use_config=true))]
pub fn digest_with_report_py<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    keep_batches: Option<usize>,
    min_bytes: Option<usize>,
    config: Option<PathBuf>,
    settings: Option<&Bound<'py, PyAny>>,
    use_config: bool,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyAny>)> {
    let config = ConfigSpec::from_args(config, settings, use_config)?;
    let opts = digest_options(&config, keep_batches, min_bytes)?;
    let (values, report) = detached(py, messages, move |m| {
        let (view, report) = digest_with_report(&m, &opts);
        (message_values_out(&view), report)
    })?;
    Ok((values_to_py(py, &values)?, report_to_py(py, &report)?))
}

/// The request view with older bulky tool results digested.
#[pyfunction]
#[pyo3(signature = (messages, *, keep_batches=None, min_bytes=None, config=None, settings=None, use_config=true))]
pub fn digest<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    keep_batches: Option<usize>,
    min_bytes: Option<usize>,
    config: Option<PathBuf>,
    settings: Option<&Bound<'py, PyAny>>,
    use_config: bool,
) -> PyResult<Bound<'py, PyList>> {
    Ok(digest_with_report_py(
        py,
        messages,
        keep_batches,
        min_bytes,
        config,
        settings,
        use_config,
    )?
    .0)
}

/// `text` with secrets masked: the built-in rules, the configuration's
/// `security.redact_patterns` and the caller's `patterns` (as `ctx redact`;
/// asked for explicitly, so `security.redact_secrets: false` does not
/// apply).
#[pyfunction]
#[pyo3(signature = (text, *, patterns=None, url_credentials=true, config=None, settings=None, use_config=true))]
pub fn redact(
    py: Python<'_>,
    text: &Bound<'_, PyString>,
    patterns: Option<Vec<String>>,
    url_credentials: bool,
    config: Option<PathBuf>,
    settings: Option<&Bound<'_, PyAny>>,
    use_config: bool,
) -> PyResult<String> {
    let text = py_str(text).map_err(|e| e.into_py("text"))?;
    let opts = RedactOptions {
        force: true,
        url_credentials,
        ..RedactOptions::default()
    };
    let loaded = ConfigSpec::from_args(config, settings, use_config)?
        .load(&Env::from_os(std::env::vars_os()))?;
    let mut all = loaded.config.security.redact_patterns;
    all.extend(patterns.unwrap_or_default());
    let redactor = if all.is_empty() {
        None
    } else {
        let built = Redactor::builder().patterns(all).build();
        Some(built.map_err(|e| config_error(&e))?)
    };
    Ok(py.detach(move || match &redactor {
        Some(r) => r.redact(&text, &opts).into_owned(),
        None => redact_text(&text, &opts).into_owned(),
    }))
}

fn load_error(e: LoadError) -> PyErr {
    match e {
        LoadError::Io { .. } => PyOSError::new_err(e.to_string()),
        other => PyValueError::new_err(other.to_string()),
    }
}

/// Messages of a transcript file (JSON array, `{"messages": [...]}`,
/// SWE-agent `{"history": [...]}` or JSON Lines).
#[pyfunction]
pub fn load_transcript<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyList>> {
    let values = py.detach(move || {
        Transcript::load(&path)
            .map(|t| message_values_out(&t.messages))
            .map_err(load_error)
    })?;
    values_to_py(py, &values)
}

/// Replays a recorded session through the engine of the configuration,
/// call by call, and returns the report `ctx replay --json` prints for the
/// same arguments (the same library call: `Engines::replay`).
#[pyfunction]
#[pyo3(signature = (session, *, context_length=None, model=None, config=None, settings=None, use_config=true, profile="openai", store=None, session_id=None, archive=true, baseline=true))]
#[allow(clippy::too_many_arguments)]
pub fn replay<'py>(
    py: Python<'py>,
    session: &Bound<'py, PyAny>,
    context_length: Option<u64>,
    model: Option<String>,
    config: Option<PathBuf>,
    settings: Option<&Bound<'py, PyAny>>,
    use_config: bool,
    profile: &str,
    store: Option<PathBuf>,
    session_id: Option<String>,
    archive: bool,
    baseline: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let profile = parse_profile(profile)?;
    let spec = EngineSpec {
        context_length,
        model,
        encoding: context_engine::tokens::Encoding::O200kBase,
        config: ConfigSpec::from_args(config, settings, use_config)?,
        profile,
    };
    let (engines, _) = engines(&spec)?;
    if store.is_some() && !archive {
        return Err(PyValueError::new_err(
            "store and archive=False contradict each other",
        ));
    }
    enum Source {
        Path(PathBuf),
        Values(Vec<Value>),
    }
    let source = if session.cast::<PyString>().is_ok() || session.hasattr("__fspath__")? {
        Source::Path(session.extract::<PathBuf>()?)
    } else {
        Source::Values(message_values(session)?)
    };
    let report = py.detach(move || -> PyResult<Value> {
        let (messages, times, file) = match source {
            Source::Path(p) => {
                let t = Transcript::load(&p).map_err(load_error)?;
                let times = t.message_times();
                (t.messages, times, Some(p))
            }
            Source::Values(v) => (
                parse_messages(v).map_err(MessageError::into_py)?,
                Vec::new(),
                None,
            ),
        };
        engines
            .check_window(&messages)
            .map_err(|e| config_error(&e))?;
        // As `ctx replay`: the session is named after the file.
        let id = session_id.unwrap_or_else(|| {
            file.as_deref()
                .and_then(|f| f.file_name())
                .map_or_else(|| "replay".to_owned(), |n| n.to_string_lossy().into_owned())
        });
        let archive = match (store, archive) {
            (_, false) => Archive::Off,
            (None, true) => Archive::Memory,
            (Some(path), true) => {
                let at_rest = engines.at_rest().map_err(|e| config_error(&e))?;
                Archive::Into(open_at_rest(&path, &at_rest).map_err(|e| config_error(&e))?)
            }
        };
        let run = ReplayRun {
            messages: &messages,
            message_times: times,
            session_id: id,
            archive,
            baseline,
        };
        let (report, _) = engines.replay(run, |_, _| {}).map_err(|e| {
            ContextEngineError::new_err(format!(
                "cannot replay: {}",
                context_engine::error_chain(&e)
            ))
        })?;
        let mut value = serde_json::to_value(&report).map_err(|e| {
            ContextEngineError::new_err(format!("cannot serialize the report: {e}"))
        })?;
        // `ctx replay --json` names the file first.
        if let (Some(f), Value::Object(map)) = (file, &mut value) {
            let mut with_file = serde_json::Map::new();
            with_file.insert("file".to_owned(), Value::String(f.display().to_string()));
            with_file.extend(std::mem::take(map));
            *map = with_file;
        }
        Ok(value)
    })?;
    crate::convert::to_py(py, &report)
}
