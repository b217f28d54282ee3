//! Engine registry and process plugins: pick the session's
//! [`ContextEngine`] by name, built in or a plugin written in any language.
//!
//! [`select_engine`] resolves a name in this order:
//!
//! 1. a built-in engine ([`BUILTIN_ENGINES`]: `compressor`);
//! 2. a plugin folder holding a [`plugin.yaml`](PluginManifest), searched in
//!    `plugin_dirs` order, and within each directory first `<dir>/<name>/`
//!    (the directory holds plugin folders), then `<dir>/context_engine/<name>/`,
//!    then `<dir>/plugins/context_engine/<name>/` (so a folder of plugins, a
//!    plugins directory and a project root can all be listed); the first hit
//!    wins;
//! 3. otherwise the built-in compressor with a warning, or, when the engine
//!    is `required`, an error naming every folder searched.
//!
//! A plugin runs as a child process speaking JSON-RPC 2.0 over
//! stdin/stdout (protocol in `docs/plugin-protocol.md`), started by a
//! [`PluginHost`]: this crate holds the protocol (manifest, wire types,
//! answer checks) and spawns nothing; `context-engine-plugin-host`'s
//! `ProcessEngine` is the process adapter. Plugins fail open: whatever a
//! plugin does, the host's transcript is never worse than without it.

pub mod answer;
mod events;
mod hook;
mod manifest;
pub mod start;
pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use thiserror::Error;

use crate::compressor::{Compressor, CompressorOptions};
use crate::engine::ContextEngine;
use crate::redact::Redactor;
use crate::summarize::Summarizer;
use crate::tokens::TokenCounter;

pub use answer::{Refusal, RefusalReason};
pub use events::{EventKind, FailureKind, PluginEvent};
pub use hook::{Hook, UnknownHook};
pub use manifest::{DEFAULT_MAX_FAILURES, MANIFEST_FILE, PluginManifest, Timeouts};
pub use start::{SpawnError, StartError};
pub use wire::{ERROR_BLOCKED, ERROR_NOTHING_TO_COMPRESS, PROTOCOL_VERSION};

/// Names of the engines built into the library.
pub const BUILTIN_ENGINES: &[&str] = &[crate::compressor::NAME];

/// Why an engine could not be selected or a plugin read.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PluginError {
    /// `plugin.yaml` is malformed or incomplete (line and column are 1-based;
    /// 0 when unknown).
    #[error("{}: {reason}", at(path, *line, *column))]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// Line of the offending value.
        line: u64,
        /// Column of the offending value.
        column: u64,
        /// What is wrong.
        reason: String,
    },
    /// A manifest could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A required engine is neither built in nor found in a plugin folder.
    #[error(
        "context engine `{name}` not found: not built in ({}) and no plugin folder holds it (searched: {})",
        BUILTIN_ENGINES.join(", "),
        list(searched)
    )]
    NotFound {
        /// The requested name.
        name: String,
        /// Every folder looked at, in order.
        searched: Vec<PathBuf>,
    },
    /// A plugin was found but no [`PluginHost`] was given to start it
    /// (the builder without `context-engine-adapters`' defaults).
    #[error("context engine plugin `{engine}` ({}) cannot run: no plugin host was given to start its process", manifest.display())]
    NoHost {
        /// The plugin's name.
        engine: String,
        /// Its manifest.
        manifest: PathBuf,
    },
    /// A required plugin's process did not start or failed `initialize`.
    #[error("context engine plugin `{engine}` ({}) failed to start: {reason}", manifest.display())]
    Start {
        /// The plugin's name.
        engine: String,
        /// Its manifest.
        manifest: PathBuf,
        /// What went wrong.
        #[source]
        reason: Box<StartError>,
    },
}

fn at(path: &Path, line: u64, column: u64) -> String {
    match (line, column) {
        (0, _) => path.display().to_string(),
        (l, 0) => format!("{}:{l}", path.display()),
        (l, c) => format!("{}:{l}:{c}", path.display()),
    }
}

fn list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "no plugin directories configured".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Everything an engine is built from, whichever is selected.
///
/// The compressor options and the summarizer also serve a plugin: they
/// build the built-in compressor it falls back to.
#[non_exhaustive]
pub struct EngineContext {
    /// Token counter shared with the host.
    pub counter: Arc<dyn TokenCounter>,
    /// The model's context window; 0 when unknown.
    pub context_length: u64,
    /// The compressor's tuning; its threshold and protections also seed a
    /// plugin's host-side state, and its `profile` checks plugin results.
    pub compressor_options: CompressorOptions,
    /// The compressor's primary summarizer (extractive when `None`).
    pub summarizer: Option<Box<dyn Summarizer>>,
    /// The engine's own configuration section, handed to a plugin in
    /// `initialize` as `config`.
    pub section: Value,
    /// The model the session starts with.
    pub model: Option<String>,
    /// The user's redactor (built-in rules plus `security.redact_patterns`)
    /// for everything that leaves the process, whichever engine runs: the
    /// compressor's summarizer traffic, every message sent to a plugin, and
    /// the compressor a plugin session falls back to. The built-in rules
    /// when `None`. Egress is always redacted: there is no switch to turn
    /// it off (see [`crate::redact::Egress`]).
    pub redactor: Option<Arc<Redactor>>,
}

impl std::fmt::Debug for EngineContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineContext")
            .field("context_length", &self.context_length)
            .field("compressor_options", &self.compressor_options)
            .field("summarizer", &self.summarizer.as_ref().map(|s| s.name()))
            .field("section", &self.section)
            .field("model", &self.model)
            .field("redactor", &self.redactor.is_some())
            .finish_non_exhaustive()
    }
}

impl EngineContext {
    /// Default options, the extractive summarizer, an empty section.
    pub fn new(counter: Arc<dyn TokenCounter>, context_length: u64) -> EngineContext {
        EngineContext {
            counter,
            context_length,
            compressor_options: CompressorOptions::default(),
            summarizer: None,
            section: Value::Object(serde_json::Map::new()),
            model: None,
            redactor: None,
        }
    }

    /// Sets [`redactor`](Self::redactor).
    pub fn with_redactor(mut self, redactor: Arc<Redactor>) -> EngineContext {
        self.redactor = Some(redactor);
        self
    }

    /// Sets [`compressor_options`](Self::compressor_options).
    pub fn with_compressor_options(mut self, options: CompressorOptions) -> EngineContext {
        self.compressor_options = options;
        self
    }

    /// Sets [`summarizer`](Self::summarizer).
    pub fn with_summarizer(mut self, summarizer: Box<dyn Summarizer>) -> EngineContext {
        self.summarizer = Some(summarizer);
        self
    }

    /// Sets [`section`](Self::section).
    pub fn with_section(mut self, section: Value) -> EngineContext {
        self.section = section;
        self
    }

    /// Sets [`model`](Self::model).
    pub fn with_model(mut self, model: impl Into<String>) -> EngineContext {
        self.model = Some(model.into());
        self
    }

    /// The built-in compressor made of this context.
    pub fn into_compressor(self) -> Compressor {
        let mut compressor =
            Compressor::with_options(self.counter, self.context_length, self.compressor_options);
        if let Some(redactor) = self.redactor {
            compressor = compressor.with_redactor(redactor);
        }
        match self.summarizer {
            Some(s) => compressor.with_summarizer(s),
            None => compressor,
        }
    }
}

/// Starts plugin processes for [`select_engine`] (see the module docs).
pub trait PluginHost: Send + Sync {
    /// Starts the plugin `manifest` describes (spawn and `initialize`),
    /// an engine made of `ctx`; when it does not start, why, with the
    /// built-in compressor made of `ctx` that a fallback runs instead.
    fn start(
        &self,
        manifest: PluginManifest,
        ctx: EngineContext,
    ) -> Result<Box<dyn ContextEngine>, Box<Unstarted>>;
}

/// A plugin that did not start ([`PluginHost::start`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct Unstarted {
    /// Why.
    pub error: PluginError,
    /// The built-in compressor of the same context.
    pub builtin: Compressor,
}

impl Unstarted {
    /// `error`, the fallback `builtin`.
    pub fn new(error: PluginError, builtin: Compressor) -> Unstarted {
        Unstarted { error, builtin }
    }
}

/// Where the selected engine came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineSource {
    /// A built-in engine, by name.
    Builtin,
    /// A plugin process.
    Plugin {
        /// Its manifest.
        manifest: PathBuf,
    },
    /// The requested engine was unavailable; the built-in compressor runs.
    Fallback {
        /// The name asked for.
        requested: String,
    },
}

/// The outcome of [`select_engine`].
#[non_exhaustive]
pub struct Selected {
    /// The engine to drive.
    pub engine: Box<dyn ContextEngine>,
    /// Things the user should know (e.g. an unknown name fell back).
    pub warnings: Vec<String>,
    /// Where the engine came from.
    pub source: EngineSource,
}

impl std::fmt::Debug for Selected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selected")
            .field("engine", &self.engine.name())
            .field("warnings", &self.warnings)
            .field("source", &self.source)
            .finish()
    }
}

/// The folders where a plugin named `name` may live, in search order.
/// Empty when `name` cannot be a folder name (empty, `.`/`..`, a path).
pub fn plugin_candidates(name: &str, plugin_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let valid = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !Path::new(name).is_absolute();
    if !valid {
        return Vec::new();
    }
    plugin_dirs
        .iter()
        .flat_map(|dir| {
            [
                dir.join(name),
                dir.join("context_engine").join(name),
                dir.join("plugins").join("context_engine").join(name),
            ]
        })
        .collect()
}

/// The manifest of the first plugin folder holding `name`, if any.
pub fn find_plugin(name: &str, plugin_dirs: &[PathBuf]) -> Option<PathBuf> {
    plugin_candidates(name, plugin_dirs)
        .into_iter()
        .map(|dir| dir.join(MANIFEST_FILE))
        .find(|manifest| manifest.is_file())
}

/// Picks the session's engine by `name` (see the module docs for the order).
///
/// A plugin is started here (spawn and `initialize`), so a broken one is
/// reported now rather than at the first compaction. When the engine is
/// not `required`, anything that keeps it from running (unknown name, bad
/// manifest, failed start) gives the built-in compressor and a warning;
/// when it is, an error. Without a `host` a plugin cannot start
/// ([`PluginError::NoHost`]).
pub fn select_engine(
    name: &str,
    ctx: EngineContext,
    plugin_dirs: &[PathBuf],
    required: bool,
    host: Option<&dyn PluginHost>,
) -> Result<Selected, PluginError> {
    if name == crate::compressor::NAME {
        return Ok(Selected {
            engine: Box::new(ctx.into_compressor()),
            warnings: Vec::new(),
            source: EngineSource::Builtin,
        });
    }
    let fallback = |ctx: EngineContext, error: PluginError| -> Result<Selected, PluginError> {
        if required {
            return Err(error);
        }
        Ok(Selected {
            engine: Box::new(ctx.into_compressor()),
            warnings: vec![format!(
                "{}; using the built-in compressor",
                crate::error_chain(&error)
            )],
            source: EngineSource::Fallback {
                requested: name.to_owned(),
            },
        })
    };
    let Some(path) = find_plugin(name, plugin_dirs) else {
        let error = PluginError::NotFound {
            name: name.to_owned(),
            searched: plugin_candidates(name, plugin_dirs),
        };
        return fallback(ctx, error);
    };
    let manifest = match PluginManifest::load(&path) {
        Ok(m) => m,
        Err(e) => return fallback(ctx, e),
    };
    let mut warnings = Vec::new();
    if manifest.name != name {
        warnings.push(format!(
            "{}: declares name `{}` but was selected as `{name}`",
            path.display(),
            manifest.name
        ));
    }
    let Some(host) = host else {
        let error = PluginError::NoHost {
            engine: name.to_owned(),
            manifest: path,
        };
        return fallback(ctx, error);
    };
    match host.start(manifest, ctx) {
        Ok(engine) => Ok(Selected {
            engine,
            warnings,
            source: EngineSource::Plugin { manifest: path },
        }),
        Err(unstarted) if !required => {
            warnings.push(format!(
                "{}; using the built-in compressor",
                unstarted.error
            ));
            Ok(Selected {
                engine: Box::new(unstarted.builtin),
                warnings,
                source: EngineSource::Fallback {
                    requested: name.to_owned(),
                },
            })
        }
        Err(unstarted) => Err(unstarted.error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_dir_order_then_layout() {
        let dirs = vec![PathBuf::from("/a"), PathBuf::from("/b")];
        assert_eq!(
            plugin_candidates("x", &dirs),
            vec![
                PathBuf::from("/a/x"),
                PathBuf::from("/a/context_engine/x"),
                PathBuf::from("/a/plugins/context_engine/x"),
                PathBuf::from("/b/x"),
                PathBuf::from("/b/context_engine/x"),
                PathBuf::from("/b/plugins/context_engine/x"),
            ]
        );
    }

    #[test]
    fn names_that_are_paths_are_never_searched() {
        let dirs = vec![PathBuf::from("/a")];
        for bad in ["", ".", "..", "../x", "a/b", "/etc"] {
            assert!(plugin_candidates(bad, &dirs).is_empty(), "{bad}");
        }
    }
}
