//! Building the engine from the configuration layers, as `ctx` does:
//! defaults < `config.yaml` < `CTX_…` variables < the caller's settings (a
//! nested dict, e.g. Hermes's `plugins.entries.ctx`), then the library's
//! `EngineBuilder`: engine by name (plugins too), tokenizer, summarizer,
//! text actions, window.

use std::path::PathBuf;
use std::sync::Arc;

use context_engine::builder::Engines;
use context_engine::config::{ConfigLoader, Env, Loaded};
use context_engine::engine::ContextEngine;
use context_engine::plugin::EngineSource;
use context_engine::tokens::{
    BpeCounter, CachedCounter, Encoding, TokenCounter, counter_for_model,
};
use context_engine::validate::Profile;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;

use crate::errors::{ConfigError, config_error};

/// Everything needed to build (and rebuild, for `copy.deepcopy`) an engine.
#[derive(Clone, Debug)]
pub struct EngineSpec {
    /// The model's window; `None` takes `context.context_length`, else
    /// 128,000 (as `ctx`).
    pub context_length: Option<u64>,
    /// The agent's model: picks the tokenizer.
    pub model: Option<String>,
    /// The tokenizer when no model is given.
    pub encoding: Encoding,
    /// The configuration layers to read.
    pub config: ConfigSpec,
    /// Provider rules the engine's output must keep.
    pub profile: Profile,
}

/// What a built engine comes with.
pub struct Built {
    pub engine: Box<dyn ContextEngine>,
    pub counter: Arc<dyn TokenCounter>,
    pub warnings: Vec<String>,
    pub config_file: Option<PathBuf>,
    /// Who writes its summaries (the compressor's summarizer, or the plugin).
    pub summarizer: String,
}

/// `o200k_base` / `cl100k_base` (or `o200k` / `cl100k`).
pub fn parse_encoding(name: &str) -> PyResult<Encoding> {
    match name.trim().to_ascii_lowercase().as_str() {
        "o200k" | "o200k_base" => Ok(Encoding::O200kBase),
        "cl100k" | "cl100k_base" => Ok(Encoding::Cl100kBase),
        other => Err(PyValueError::new_err(format!(
            "unknown encoding `{other}` (expected o200k_base or cl100k_base)"
        ))),
    }
}

/// `openai` / `strict`.
pub fn parse_profile(name: &str) -> PyResult<Profile> {
    name.parse::<Profile>()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The exact counter for `model`, else for `encoding`, with the
/// per-message cache.
pub fn counter(model: Option<&str>, encoding: Encoding) -> Arc<dyn TokenCounter> {
    match model {
        Some(m) if !m.is_empty() => counter_for_model(m),
        _ => Arc::new(CachedCounter::new(BpeCounter::new(encoding))),
    }
}

/// Flattens a settings object into `key.path=value` overrides (values as
/// JSON, which the loader reads as YAML). Segments with dots are quoted.
pub fn settings_overrides(settings: &Value) -> PyResult<Vec<String>> {
    let Value::Object(map) = settings else {
        if settings.is_null() {
            return Ok(Vec::new());
        }
        return Err(ConfigError::new_err(format!(
            "settings must be a dict of config.yaml keys, found {}",
            context_engine::message::json_type(settings)
        )));
    };
    let mut out = Vec::new();
    let mut path = Vec::new();
    flatten(map, &mut path, &mut out);
    Ok(out)
}

fn flatten(map: &serde_json::Map<String, Value>, path: &mut Vec<String>, out: &mut Vec<String>) {
    for (key, value) in map {
        let seg = if key.contains('.') || key.contains('"') {
            format!("\"{}\"", key.replace('"', "\\\""))
        } else {
            key.clone()
        };
        path.push(seg);
        match value {
            Value::Object(inner) if !inner.is_empty() => flatten(inner, path, out),
            leaf => out.push(format!("{}={leaf}", path.join("."))),
        }
        path.pop();
    }
}

/// Where a call reads its configuration: the same layers as `ctx` (a file,
/// the `CTX_…` variables with `use_config`, then the caller's settings).
#[derive(Clone, Debug, Default)]
pub struct ConfigSpec {
    /// `config.yaml` to read instead of the default search.
    pub config_file: Option<PathBuf>,
    /// Read the default config locations and `CTX_…` variables.
    pub use_config: bool,
    /// The caller's `settings`, as `key=value` overrides.
    pub overrides: Vec<String>,
}

impl ConfigSpec {
    /// The spec of a module function's `config`, `settings` and
    /// `use_config` arguments.
    pub fn from_args(
        config: Option<PathBuf>,
        settings: Option<&Bound<'_, PyAny>>,
        use_config: bool,
    ) -> PyResult<ConfigSpec> {
        let settings = match settings {
            Some(s) => crate::convert::to_value(s).map_err(|e| e.into_py("settings"))?,
            None => Value::Null,
        };
        Ok(ConfigSpec {
            config_file: config,
            use_config,
            overrides: settings_overrides(&settings)?,
        })
    }

    /// Loads the layers. `env` is the process environment, read once by
    /// the caller: the library reads none.
    pub fn load(&self, env: &Env) -> PyResult<Loaded> {
        let mut loader = ConfigLoader::new()
            .with_file(self.config_file.clone())
            .with_overrides(self.overrides.iter().cloned());
        if self.use_config {
            loader = loader.with_environment(env);
        } else {
            loader = loader.with_search(false);
        }
        loader.load().map_err(|e| config_error(&e))
    }
}

/// Loads the configuration layers and builds the engines of that
/// configuration through the library's [`EngineBuilder`] (the one place a
/// configuration becomes an engine, as for `ctx` and `ctx serve`); the
/// configuration's warnings come back.
pub fn engines(spec: &EngineSpec) -> PyResult<(Engines, Vec<String>)> {
    // The process environment, read here once: the library reads none.
    // `CTX_…` layers only with `use_config`; the variables the
    // configuration names (the summarizer's key) always.
    let env = Env::from_os(std::env::vars_os());
    let loaded = spec.config.load(&env)?;
    let warnings = loaded.warnings.iter().map(ToString::to_string).collect();
    let engines = context_engine_adapters::builder(loaded)
        .with_env(env)
        .with_profile(spec.profile)
        .with_model(spec.model.clone())
        .with_encoding(spec.encoding)
        .with_context_length(spec.context_length)
        .build()
        .map_err(|e| config_error(&e))?;
    Ok((engines, warnings))
}

/// Builds the engine `context.engine` names (the built-in compressor, or a
/// plugin) as `spec` and the configuration say.
pub fn build(spec: &EngineSpec) -> PyResult<Built> {
    let (engines, mut warnings) = engines(spec)?;
    let started = engines.engine().map_err(|e| config_error(&e))?;
    warnings.extend(started.warnings);
    let summarizer = match started.source {
        EngineSource::Plugin { .. } => format!("plugin:{}", engines.name()),
        _ => engines.compressor().summarizer_name().to_owned(),
    };
    Ok(Built {
        engine: started.engine,
        counter: Arc::clone(engines.counter()),
        warnings,
        config_file: engines.config_file().map(PathBuf::from),
        summarizer,
    })
}
