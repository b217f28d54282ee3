//! `Compressor`: the built-in engine with every hook of the reference
//! interface, over OpenAI-format dicts.
//!
//! The engine sits in a `Mutex` (the class is `frozen`, so several Python
//! threads may share it); heavy hooks convert their input under the
//! interpreter, then release it for parsing, engine work and serializing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use context_engine::Message;
use context_engine::engine::{
    CompactionPhase, CompactionStatusContext, CompressRequest, ContextEngine, EngineState,
    ModelInfo, PromptTokens, SelectRequest, SessionInfo, ToolCallContext, TurnInfo, Usage,
    automatic_compaction_status_message,
};
use context_engine::tokens::TokenCounter;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::convert::{
    MessageError, message_values, message_values_out, parse_messages, report_to_py, to_value,
    values_to_py,
};
use crate::errors::{engine_error, lock};
use crate::setup::{ConfigSpec, EngineSpec, build, parse_encoding, parse_profile};

/// The built-in context engine (`compressor`): threshold compaction that
/// keeps head and tail verbatim and replaces the middle with a structured
/// summary; digest of old tool results per request; proactive prune;
/// `context_recall` tool.
#[pyclass(module = "context_engine._native", name = "Compressor", frozen)]
pub struct PyCompressor {
    engine: Mutex<Box<dyn ContextEngine>>,
    counter: Arc<dyn TokenCounter>,
    spec: EngineSpec,
    warnings: Vec<String>,
    config_file: Option<PathBuf>,
    summarizer: String,
}

impl PyCompressor {
    fn from_spec(spec: EngineSpec) -> PyResult<PyCompressor> {
        let built = build(&spec)?;
        Ok(PyCompressor {
            engine: Mutex::new(built.engine),
            counter: built.counter,
            spec,
            warnings: built.warnings,
            config_file: built.config_file,
            summarizer: built.summarizer,
        })
    }

    /// Runs `f` on the engine. When another thread holds it (a long
    /// compaction), waits with the interpreter released so that the other
    /// Python threads keep running.
    fn with_engine<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut dyn ContextEngine) -> T + Send,
    ) -> PyResult<T> {
        match self.engine.try_lock() {
            Ok(mut guard) => Ok(f(guard.as_mut())),
            Err(std::sync::TryLockError::WouldBlock) => py.detach(|| {
                let mut guard = lock(&self.engine)?;
                Ok(f(guard.as_mut()))
            }),
            Err(std::sync::TryLockError::Poisoned(_)) => {
                lock(&self.engine).map(|mut g| f(g.as_mut()))
            }
        }
    }

    fn state<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&EngineState) -> T + Send,
    ) -> PyResult<T> {
        self.with_engine(py, |e| f(e.state()))
    }

    fn state_mut<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut EngineState) -> T + Send,
    ) -> PyResult<T> {
        self.with_engine(py, |e| f(e.state_mut()))
    }

    /// Runs `f` on parsed `messages` with the interpreter released.
    fn with_messages<T: Send>(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        f: impl FnOnce(&mut dyn ContextEngine, Vec<Message>) -> T + Send,
    ) -> PyResult<T> {
        let values = message_values(messages)?;
        py.detach(|| -> PyResult<T> {
            let messages = parse_messages(values).map_err(MessageError::into_py)?;
            let mut engine = lock(&self.engine)?;
            Ok(f(engine.as_mut(), messages))
        })
    }
}

fn usage_from_py(usage: &Bound<'_, PyAny>) -> PyResult<Usage> {
    let value = to_value(usage).map_err(|e| e.into_py("usage"))?;
    Usage::from_openai(&value).map_err(|e| PyValueError::new_err(e.to_string()))
}

fn non_negative(n: i64, what: &str) -> PyResult<u64> {
    u64::try_from(n).map_err(|_| PyValueError::new_err(format!("{what} must be >= 0, found {n}")))
}

fn kwarg<'py>(kwargs: Option<&Bound<'py, PyDict>>, key: &str) -> Option<Bound<'py, PyAny>> {
    kwargs
        .and_then(|k| k.get_item(key).ok().flatten())
        .filter(|v| !v.is_none())
}

fn kwarg_string(kwargs: Option<&Bound<'_, PyDict>>, key: &str) -> Option<String> {
    kwarg(kwargs, key).and_then(|v| v.str().ok().map(|s| s.to_string()))
}

#[pymethods]
impl PyCompressor {
    /// See the stub (`_native.pyi`) for the documentation of each argument.
    #[new]
    #[pyo3(signature = (context_length=None, *, model=None, encoding="o200k_base", config=None, settings=None, use_config=true, profile="openai"))]
    fn new(
        context_length: Option<i64>,
        model: Option<String>,
        encoding: &str,
        config: Option<PathBuf>,
        settings: Option<&Bound<'_, PyAny>>,
        use_config: bool,
        profile: &str,
    ) -> PyResult<PyCompressor> {
        let spec = EngineSpec {
            context_length: context_length
                .map(|n| non_negative(n, "context_length"))
                .transpose()?,
            model: model.filter(|m| !m.is_empty()),
            encoding: parse_encoding(encoding)?,
            config: ConfigSpec::from_args(config, settings, use_config)?,
            profile: parse_profile(profile)?,
        };
        PyCompressor::from_spec(spec)
    }

    /// A fresh engine with the same configuration and a copy of the token
    /// state (hosts copy the registered engine once per agent).
    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<PyCompressor> {
        let state = self.with_engine(py, |e| e.state().clone())?;
        let copy = PyCompressor::from_spec(self.spec.clone())?;
        *lock(&copy.engine)?.state_mut() = state;
        Ok(copy)
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<PyCompressor> {
        self.__deepcopy__(py, &py.None().into_bound(py))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let summarizer = self.summarizer.clone();
        self.with_engine(py, move |engine| {
            let s = engine.state();
            format!(
                "Compressor(engine={:?}, context_length={}, threshold_tokens={}, summarizer={:?}, compression_count={})",
                engine.name(),
                s.context_length,
                s.threshold_tokens,
                summarizer,
                s.compression_count
            )
        })
    }

    // -- identity and state ------------------------------------------------

    #[getter]
    fn name(&self, py: Python<'_>) -> PyResult<String> {
        self.with_engine(py, |e| e.name().to_owned())
    }

    /// Warnings of the configuration (unknown keys), as `ctx` prints them.
    #[getter]
    fn config_warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// The `config.yaml` that was read, if any.
    #[getter]
    fn config_file(&self) -> Option<PathBuf> {
        self.config_file.clone()
    }

    #[getter]
    fn summarizer(&self) -> String {
        self.summarizer.clone()
    }

    /// `-1` while awaiting real usage after a compaction (the reference
    /// design's sentinel); setting `-1` enters that state.
    #[getter]
    fn get_last_prompt_tokens(&self, py: Python<'_>) -> PyResult<i64> {
        self.state(py, |s| match s.last_prompt_tokens {
            PromptTokens::Known(n) => i64::try_from(n).unwrap_or(i64::MAX),
            PromptTokens::AwaitingRealUsage => -1,
        })
    }

    #[setter]
    fn set_last_prompt_tokens(&self, py: Python<'_>, value: i64) -> PyResult<()> {
        let tokens = if value < 0 {
            PromptTokens::AwaitingRealUsage
        } else {
            PromptTokens::Known(value.unsigned_abs())
        };
        self.state_mut(py, |s| s.last_prompt_tokens = tokens)
    }

    #[getter]
    fn get_last_completion_tokens(&self, py: Python<'_>) -> PyResult<u64> {
        self.state(py, |s| s.last_completion_tokens)
    }

    #[setter]
    fn set_last_completion_tokens(&self, py: Python<'_>, value: i64) -> PyResult<()> {
        let v = value.max(0).unsigned_abs();
        self.state_mut(py, |s| s.last_completion_tokens = v)
    }

    #[getter]
    fn get_last_total_tokens(&self, py: Python<'_>) -> PyResult<u64> {
        self.state(py, |s| s.last_total_tokens)
    }

    #[setter]
    fn set_last_total_tokens(&self, py: Python<'_>, value: i64) -> PyResult<()> {
        let v = value.max(0).unsigned_abs();
        self.state_mut(py, |s| s.last_total_tokens = v)
    }

    #[getter]
    fn get_threshold_tokens(&self, py: Python<'_>) -> PyResult<u64> {
        self.state(py, |s| s.threshold_tokens)
    }

    #[setter]
    fn set_threshold_tokens(&self, py: Python<'_>, value: i64) -> PyResult<()> {
        let v = non_negative(value, "threshold_tokens")?;
        self.state_mut(py, |s| s.threshold_tokens = v)
    }

    #[getter]
    fn get_context_length(&self, py: Python<'_>) -> PyResult<u64> {
        self.state(py, |s| s.context_length)
    }

    #[getter]
    fn get_compression_count(&self, py: Python<'_>) -> PyResult<u64> {
        self.state(py, |s| s.compression_count)
    }

    #[setter]
    fn set_compression_count(&self, py: Python<'_>, value: i64) -> PyResult<()> {
        let v = non_negative(value, "compression_count")?;
        self.state_mut(py, |s| s.compression_count = v)
    }

    #[getter]
    fn get_threshold_percent(&self, py: Python<'_>) -> PyResult<f64> {
        self.state(py, |s| s.threshold_percent)
    }

    #[setter]
    fn set_threshold_percent(&self, py: Python<'_>, value: f64) -> PyResult<()> {
        if !(value.is_finite() && value > 0.0) {
            return Err(PyValueError::new_err(format!(
                "threshold_percent must be a positive fraction, found {value}"
            )));
        }
        self.state_mut(py, |s| s.threshold_percent = value)
    }

    #[getter]
    fn get_protect_first_n(&self, py: Python<'_>) -> PyResult<usize> {
        self.state(py, |s| s.protect_first_n)
    }

    #[setter]
    fn set_protect_first_n(&self, py: Python<'_>, value: usize) -> PyResult<()> {
        self.state_mut(py, |s| s.protect_first_n = value)
    }

    #[getter]
    fn get_protect_last_n(&self, py: Python<'_>) -> PyResult<usize> {
        self.state(py, |s| s.protect_last_n)
    }

    #[setter]
    fn set_protect_last_n(&self, py: Python<'_>, value: usize) -> PyResult<()> {
        self.state_mut(py, |s| s.protect_last_n = value)
    }

    #[getter]
    fn get_emit_automatic_compaction_status(&self, py: Python<'_>) -> PyResult<bool> {
        self.state(py, |s| s.emit_automatic_compaction_status)
    }

    #[setter]
    fn set_emit_automatic_compaction_status(&self, py: Python<'_>, value: bool) -> PyResult<()> {
        self.state_mut(py, |s| s.emit_automatic_compaction_status = value)
    }

    /// Whether a compaction ran and no real usage has been reported since.
    #[getter]
    fn awaiting_real_usage(&self, py: Python<'_>) -> PyResult<bool> {
        self.state(py, |s| {
            s.last_prompt_tokens == PromptTokens::AwaitingRealUsage
        })
    }

    /// The report of the last `compress` (dict), or `None`.
    #[getter]
    fn last_report<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let report = self.with_engine(py, |e| e.last_report().cloned())?;
        report.map(|r| report_to_py(py, &r)).transpose()
    }

    // -- core hooks ----------------------------------------------------------

    fn update_from_response(&self, py: Python<'_>, usage: &Bound<'_, PyAny>) -> PyResult<()> {
        let usage = usage_from_py(usage)?;
        self.with_engine(py, |e| e.update_from_response(&usage))
    }

    #[pyo3(signature = (prompt_tokens=None))]
    fn should_compress(&self, py: Python<'_>, prompt_tokens: Option<i64>) -> PyResult<bool> {
        let tokens = prompt_tokens.map(|n| n.max(0).unsigned_abs());
        self.with_engine(py, |e| e.should_compress(tokens))
    }

    #[pyo3(signature = (prompt_tokens=None))]
    fn should_compress_info(
        &self,
        py: Python<'_>,
        prompt_tokens: Option<i64>,
    ) -> PyResult<(bool, Option<String>)> {
        let tokens = prompt_tokens.map(|n| n.max(0).unsigned_abs());
        let d = self.with_engine(py, |e| e.should_compress_info(tokens))?;
        Ok((d.should_compress, d.block_reason.map(|r| r.to_string())))
    }

    #[pyo3(signature = (messages, current_tokens=None, focus_topic=None, force=false, memory_context=""))]
    fn compress<'py>(
        &self,
        py: Python<'py>,
        messages: &Bound<'py, PyAny>,
        current_tokens: Option<i64>,
        focus_topic: Option<String>,
        force: bool,
        memory_context: &str,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut request = CompressRequest::new()
            .with_force(force)
            .with_memory_context(memory_context);
        if let Some(n) = current_tokens {
            request = request.with_current_tokens(n.max(0).unsigned_abs());
        }
        if let Some(topic) = focus_topic.filter(|t| !t.trim().is_empty()) {
            request = request.with_focus_topic(topic);
        }
        let out = self.with_messages(py, messages, |engine, messages| {
            engine
                .compress(&messages, &request)
                .map(|out| message_values_out(&out.messages))
        })?;
        let values = out.map_err(|e| engine_error(&e))?;
        values_to_py(py, &values)
    }

    #[pyo3(signature = (messages, current_tokens=None))]
    fn prune_tool_results_only<'py>(
        &self,
        py: Python<'py>,
        messages: &Bound<'py, PyAny>,
        current_tokens: Option<i64>,
    ) -> PyResult<(Bound<'py, PyAny>, usize)> {
        let tokens = current_tokens.map(|n| n.max(0).unsigned_abs());
        let (values, n) = self.with_messages(py, messages, |engine, messages| {
            let (out, n) = engine.prune_tool_results_only(&messages, tokens);
            // Unchanged: hand the caller's list back (no copy, same identity).
            let values = (n > 0).then(|| message_values_out(&out));
            (values, n)
        })?;
        match values {
            Some(v) => Ok((values_to_py(py, &v)?.into_any(), n)),
            None => Ok((messages.clone(), 0)),
        }
    }

    #[pyo3(signature = (request_messages, *, conversation_messages=None, incoming_message=None, budget_tokens=0))]
    fn select_context<'py>(
        &self,
        py: Python<'py>,
        request_messages: &Bound<'py, PyAny>,
        conversation_messages: Option<&Bound<'py, PyAny>>,
        incoming_message: Option<&Bound<'py, PyAny>>,
        budget_tokens: i64,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let conversation = match conversation_messages {
            Some(c) if !c.is_none() => message_values(c)?,
            _ => Vec::new(),
        };
        let incoming = match incoming_message {
            Some(m) if !m.is_none() => {
                Some(to_value(m).map_err(|e| e.into_py("incoming_message"))?)
            }
            _ => None,
        };
        let budget = budget_tokens.max(0).unsigned_abs();
        let out = self.with_messages(py, request_messages, move |engine, request| {
            let conversation = parse_messages(conversation)?;
            let incoming = incoming
                .map(|v| crate::convert::parse_message(0, v))
                .transpose()?;
            let mut select = SelectRequest::new(&request, &conversation);
            if let Some(m) = &incoming {
                select = select.with_incoming_message(m);
            }
            if budget > 0 {
                select = select.with_budget_tokens(budget);
            }
            Ok::<_, MessageError>(
                engine
                    .select_context(&select)
                    .map(|v| message_values_out(&v)),
            )
        })?;
        match out.map_err(MessageError::into_py)? {
            Some(values) => Ok(Some(values_to_py(py, &values)?)),
            None => Ok(None),
        }
    }

    #[pyo3(signature = (messages, usage=None, **kwargs))]
    fn on_turn_complete(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        usage: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let usage = match usage {
            Some(u) if !u.is_none() => Some(usage_from_py(u)?),
            _ => None,
        };
        let mut turn = TurnInfo::default();
        if let Some(id) = kwarg_string(kwargs, "turn_id") {
            turn = turn.with_turn_id(id);
        }
        if let Some(id) = kwarg_string(kwargs, "task_id") {
            turn = turn.with_task_id(id);
        }
        if let Some(n) = kwarg(kwargs, "api_call_count").and_then(|v| v.extract::<u32>().ok()) {
            turn = turn.with_api_call_count(n);
        }
        if let Some(b) = kwarg(kwargs, "interrupted").and_then(|v| v.is_truthy().ok()) {
            turn = turn.with_interrupted(b);
        }
        if let Some(b) = kwarg(kwargs, "failed").and_then(|v| v.is_truthy().ok()) {
            turn = turn.with_failed(b);
        }
        if let Some(r) = kwarg_string(kwargs, "turn_exit_reason") {
            turn = turn.with_exit_reason(r);
        }
        self.with_messages(py, messages, |engine, messages| {
            engine.on_turn_complete(&messages, usage.as_ref(), &turn);
        })
    }

    fn should_compress_preflight(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.with_messages(py, messages, |engine, messages| {
            engine.should_compress_preflight(&messages)
        })
    }

    fn should_defer_preflight_to_real_usage(
        &self,
        py: Python<'_>,
        rough_tokens: i64,
    ) -> PyResult<bool> {
        let tokens = rough_tokens.max(0).unsigned_abs();
        self.with_engine(py, |e| e.should_defer_preflight_to_real_usage(tokens))
    }

    #[pyo3(signature = (*, phase, default_message, **context))]
    fn get_automatic_compaction_status_message(
        &self,
        py: Python<'_>,
        phase: &str,
        default_message: &str,
        context: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<String>> {
        let phase = match phase {
            "preflight" => CompactionPhase::Preflight,
            "compress" => CompactionPhase::Compress,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown phase `{other}` (expected preflight or compress)"
                )));
            }
        };
        let mut ctx = CompactionStatusContext::default();
        if let Some(n) = kwarg(context, "approx_tokens").and_then(|v| v.extract::<u64>().ok()) {
            ctx = ctx.with_approx_tokens(n);
        }
        if let Some(n) = kwarg(context, "threshold_tokens").and_then(|v| v.extract::<u64>().ok()) {
            ctx = ctx.with_threshold_tokens(n);
        }
        let default_message = default_message.to_owned();
        self.with_engine(py, move |e| {
            automatic_compaction_status_message(&*e, phase, &default_message, &ctx)
        })
    }

    fn has_content_to_compress(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.with_messages(py, messages, |engine, messages| {
            engine.has_content_to_compress(&messages)
        })
    }

    #[pyo3(signature = (session_id, **kwargs))]
    fn on_session_start(
        &self,
        py: Python<'_>,
        session_id: &str,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let mut info = SessionInfo::default();
        if let Some(home) = kwarg_string(kwargs, "hermes_home").or(kwarg_string(kwargs, "home_dir"))
        {
            info = info.with_home_dir(home);
        }
        if let Some(p) = kwarg_string(kwargs, "platform") {
            info = info.with_platform(p);
        }
        if let Some(m) = kwarg_string(kwargs, "model") {
            info = info.with_model(m);
        }
        self.with_engine(py, |e| e.on_session_start(session_id, &info))
    }

    fn on_session_end(
        &self,
        py: Python<'_>,
        session_id: &str,
        messages: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = session_id.to_owned();
        self.with_messages(py, messages, move |engine, messages| {
            engine.on_session_end(&id, &messages);
        })
    }

    fn on_session_reset(&self, py: Python<'_>) -> PyResult<()> {
        self.with_engine(py, |e| e.on_session_reset())
    }

    fn get_tool_schemas<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let schemas = self.with_engine(py, |e| e.tool_schemas())?;
        values_to_py(py, &schemas)
    }

    #[pyo3(signature = (name, args, **kwargs))]
    fn handle_tool_call(
        &self,
        py: Python<'_>,
        name: &str,
        args: &Bound<'_, PyAny>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<String> {
        let args = to_value(args).map_err(|e| e.into_py("args"))?;
        let name = name.to_owned();
        match kwarg(kwargs, "messages") {
            Some(messages) => self.with_messages(py, &messages, move |engine, messages| {
                let ctx = ToolCallContext::default().with_messages(&messages);
                engine.handle_tool_call(&name, &args, &ctx)
            }),
            None => self.with_engine(py, |e| {
                e.handle_tool_call(&name, &args, &ToolCallContext::default())
            }),
        }
    }

    fn get_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let status = self.with_engine(py, |e| e.status())?;
        report_to_py(py, &status)
    }

    #[pyo3(signature = (model, context_length, base_url="", api_key="", provider="", api_mode=""))]
    #[allow(clippy::too_many_arguments)] // the interface's Python signature
    fn update_model(
        &self,
        py: Python<'_>,
        model: &str,
        context_length: i64,
        base_url: &str,
        api_key: &str,
        provider: &str,
        api_mode: &str,
    ) -> PyResult<()> {
        let mut info = ModelInfo::new(model, context_length.max(0).unsigned_abs());
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        if let Some(s) = some(base_url) {
            info = info.with_base_url(s);
        }
        if let Some(s) = some(api_key) {
            info = info.with_api_key(s);
        }
        if let Some(s) = some(provider) {
            info = info.with_provider(s);
        }
        if let Some(s) = some(api_mode) {
            info = info.with_api_mode(s);
        }
        self.with_engine(py, |e| e.update_model(&info))
    }

    // -- extras -----------------------------------------------------------

    /// Tokens of `messages` by this engine's counter.
    fn count_tokens(&self, py: Python<'_>, messages: &Bound<'_, PyAny>) -> PyResult<usize> {
        let counter = Arc::clone(&self.counter);
        let values = message_values(messages)?;
        py.detach(move || {
            let messages = parse_messages(values).map_err(MessageError::into_py)?;
            Ok(counter.count_messages(&messages))
        })
    }
}
