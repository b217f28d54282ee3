//! The one place a configuration becomes an engine.
//!
//! `ctx` (every command), `ctx serve` and the Python package all go
//! through [`EngineBuilder`]: a loaded [`Config`], the caller's
//! environment snapshot ([`Env`]) and the few settings a caller supplies
//! itself (provider profile, the agent's model, the window) become an
//! [`Engines`]: the shared parts every engine of that configuration is
//! made of (token counter, redactor, summarizer client, text-action
//! setting, plugin folders) from which each session takes a fresh engine.
//! A configuration key therefore means the same thing everywhere; the
//! library reads no process environment and holds no process-wide setting.
//!
//! ```
//! use context_engine::builder::EngineBuilder;
//! use context_engine::config::{ConfigLoader, Env};
//!
//! let env = Env::empty();
//! let loaded = ConfigLoader::new().with_search(false).with_environment(&env).load()?;
//! let engines = EngineBuilder::from_loaded(loaded).with_env(env).build()?;
//! assert_eq!(engines.context_length(), 128_000);
//! let selected = engines.engine()?;
//! assert_eq!(selected.engine.name(), "compressor");
//! # Ok::<(), context_engine::Error>(())
//! ```

mod convert;

use std::path::PathBuf;
use std::sync::Arc;

use crate::compressor::{Compressor, CompressorOptions};
use crate::config::{Config, Env, Loaded, SummarizerKind};
use crate::engine::{ContextEngine, ModelInfo};
use crate::host::{HostOptions, Session};
use crate::message::Message;
use crate::plugin::{EngineContext, EngineSource, PluginError, PluginHost, select_engine};
use crate::pricing::PriceModel;
use crate::redact::{RedactError, Redactor};
use crate::replay::{ReplayError, ReplayOptions, ReplayReport, replay};
use crate::store::{AtRest, KeyError, MemoryStore, SessionStore, StoreError};
use crate::summarize::{ModelSummarizer, SummarizeError, SummarizerFactory};
use crate::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter, counter_for_model};
use crate::validate::{Profile, TextActions, TextActionsError};

/// The window an engine manages when neither the caller nor
/// `context.context_length` names one.
pub const DEFAULT_CONTEXT_LENGTH: u64 = 128_000;

/// Why a configuration could not become an engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// `summarizer.kind` is `openai` but a setting it needs is missing.
    #[error("the openai summarizer needs `{key}`")]
    SummarizerSetting {
        /// The missing key (e.g. `summarizer.base_url`).
        key: &'static str,
    },
    /// The summarizer client could not be set up (bad URL, no key).
    #[error("cannot set up the summarizer at {base_url}")]
    Summarizer {
        /// Its endpoint.
        base_url: String,
        /// Why.
        #[source]
        source: SummarizeError,
    },
    /// `security.redact_patterns` holds a pattern that does not compile.
    #[error("invalid security.redact_patterns")]
    Redact(#[from] RedactError),
    /// `context.text_actions` holds a pattern that does not compile.
    #[error(transparent)]
    TextActions(#[from] TextActionsError),
    /// The engine could not be started (a required plugin).
    #[error("cannot start engine `{name}`")]
    Engine {
        /// The engine asked for.
        name: String,
        /// Why.
        #[source]
        source: PluginError,
    },
    /// A key asks for an adapter the builder was not given
    /// ([`EngineBuilder::with_summarizers`]; `context-engine-adapters`
    /// gives the defaults).
    #[error("`{key}` needs {adapter}, which this engine builder was not given")]
    NoAdapter {
        /// The key.
        key: &'static str,
        /// What it needs.
        adapter: &'static str,
    },
    /// `store.encryption_key_env` names no usable key.
    #[error(transparent)]
    StoreKey(#[from] KeyError),
    /// The window cannot hold the transcript's system prompt.
    #[error(
        "window of {window} tokens is too small for the system prompt alone ({system} tokens with the request overhead)"
    )]
    WindowTooSmall {
        /// The window.
        window: u64,
        /// What the system prompt takes.
        system: u64,
    },
}

/// Turns a configuration into [`Engines`]; see the module docs.
#[derive(Clone)]
pub struct EngineBuilder {
    summarizers: Option<Arc<dyn SummarizerFactory>>,
    upstream: Option<Arc<dyn ModelSummarizer>>,
    plugins: Option<Arc<dyn PluginHost>>,
    config: Config,
    config_file: Option<PathBuf>,
    env: Env,
    profile: Profile,
    model: Option<String>,
    encoding: Encoding,
    context_length: Option<u64>,
    engine: Option<String>,
    search_cwd_plugins: bool,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("config_file", &self.config_file)
            .field("profile", &self.profile)
            .field("model", &self.model)
            .field("context_length", &self.context_length)
            .field("engine", &self.engine)
            .field("summarizers", &self.summarizers.is_some())
            .field("upstream", &self.upstream.is_some())
            .field("plugins", &self.plugins.is_some())
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// A builder for `config` (no file: plugins are looked for in
    /// `plugins.dirs` and the working directory).
    pub fn from_config(config: Config) -> EngineBuilder {
        EngineBuilder {
            summarizers: None,
            upstream: None,
            plugins: None,
            config,
            config_file: None,
            env: Env::empty(),
            profile: Profile::OpenAi,
            model: None,
            encoding: Encoding::O200kBase,
            context_length: None,
            engine: None,
            search_cwd_plugins: true,
        }
    }

    /// A builder for what a [`ConfigLoader`](crate::config::ConfigLoader)
    /// loaded (plugins are also looked for next to its file).
    pub fn from_loaded(loaded: Loaded) -> EngineBuilder {
        EngineBuilder {
            config_file: loaded.file,
            ..EngineBuilder::from_config(loaded.config)
        }
    }

    /// The configuration it builds from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What makes the model summarizer `summarizer.kind: openai` asks for
    /// (none by default: such a configuration is then an error,
    /// [`BuildError::NoAdapter`]).
    pub fn with_summarizers(mut self, factory: Arc<dyn SummarizerFactory>) -> EngineBuilder {
        self.summarizers = Some(factory);
        self
    }

    /// The summarizer `summarizer.kind: upstream` names: a proxy's own
    /// upstream (`ctx serve` gives it). Without one that kind writes the
    /// extractive summary, and the engine says so.
    pub fn with_upstream_summarizer(
        mut self,
        summarizer: Arc<dyn ModelSummarizer>,
    ) -> EngineBuilder {
        self.upstream = Some(summarizer);
        self
    }

    /// What starts plugin processes (none by default: a plugin engine then
    /// falls back to the compressor, or fails when required:
    /// [`PluginError::NoHost`]).
    pub fn with_plugin_host(mut self, host: Arc<dyn PluginHost>) -> EngineBuilder {
        self.plugins = Some(host);
        self
    }

    /// The environment the variables named in the configuration are read
    /// from (`summarizer.api_key_env`); empty by default.
    pub fn with_env(mut self, env: Env) -> EngineBuilder {
        self.env = env;
        self
    }

    /// Provider rules every engine output must keep (default OpenAI).
    pub fn with_profile(mut self, profile: Profile) -> EngineBuilder {
        self.profile = profile;
        self
    }

    /// The agent's model: picks the tokenizer and the per-model threshold.
    pub fn with_model(mut self, model: Option<String>) -> EngineBuilder {
        self.model = model.map(|m| m.trim().to_owned()).filter(|m| !m.is_empty());
        self
    }

    /// The tokenizer when no model is named (default `o200k_base`).
    pub fn with_encoding(mut self, encoding: Encoding) -> EngineBuilder {
        self.encoding = encoding;
        self
    }

    /// The window, over `context.context_length` (then
    /// [`DEFAULT_CONTEXT_LENGTH`]). Given, it is the window of every
    /// request: `context.model_windows` no longer applies.
    pub fn with_context_length(mut self, tokens: Option<u64>) -> EngineBuilder {
        self.context_length = tokens;
        self
    }

    /// The engine by name, over `context.engine`.
    pub fn with_engine(mut self, name: Option<String>) -> EngineBuilder {
        self.engine = name;
        self
    }

    /// Whether the working directory is searched for plugins last
    /// (default on: where a project's `plugins/` sits).
    pub fn with_cwd_plugins(mut self, search: bool) -> EngineBuilder {
        self.search_cwd_plugins = search;
        self
    }

    /// Builds the shared parts: counter, redactor, summarizer client,
    /// text actions, options. Nothing is started yet ([`Engines::engine`]
    /// starts one).
    pub fn build(self) -> Result<Engines, BuildError> {
        let config = self.config;
        let counter: Arc<dyn TokenCounter> = match &self.model {
            Some(m) => counter_for_model(m),
            None => Arc::new(CachedCounter::new(BpeCounter::new(self.encoding))),
        };
        let context_length = self
            .context_length
            .or(config.context.context_length)
            .unwrap_or(DEFAULT_CONTEXT_LENGTH);
        let name = self
            .engine
            .clone()
            .unwrap_or_else(|| config.context.engine.clone());
        let text_actions = config.text_actions()?;
        let redactor = Arc::new(config.redactor()?);
        let mut notes = Vec::new();
        let client = match (config.summarizer.kind, self.upstream) {
            (SummarizerKind::Upstream, Some(upstream)) => Some(upstream),
            (SummarizerKind::Upstream, None) => {
                notes.push(
                    "summarizer.kind: upstream asks `ctx serve`'s upstream, which this command \
                     does not have: the extractive summary stands in"
                        .to_owned(),
                );
                None
            }
            _ => summarizer(&config, &self.env, &redactor, self.summarizers.as_deref())?,
        };
        let compressor_options = config
            .compressor_options()
            .with_profile(self.profile)
            .with_text_actions(text_actions.clone());
        // Plugins: the configured folders, then next to the config file,
        // then the working directory (where `plugins/` of a project sits).
        let mut plugin_dirs = config.plugins.dirs.clone();
        if let Some(dir) = self.config_file.as_deref().and_then(|f| f.parent()) {
            plugin_dirs.push(dir.to_path_buf());
        }
        if self.search_cwd_plugins {
            plugin_dirs.push(PathBuf::from("."));
        }
        // A window given here (`--context-length`, the Python package's
        // `context_length`) fixes the window of every request; without one,
        // a request naming a model in `context.model_windows` is managed
        // against that model's window, any other against the configured one.
        let model_windows = match self.context_length {
            Some(_) => Default::default(),
            None => config.context.model_windows.clone(),
        };
        let host = HostOptions::default()
            .with_profile(self.profile)
            .with_text_actions(text_actions.clone())
            .with_model_windows(model_windows);
        Ok(Engines {
            section: config.engine_section(&name),
            required: config.context.engine_required,
            price: config.pricing.price_model(),
            name,
            compressor_options,
            counter,
            context_length,
            model: self.model,
            profile: self.profile,
            redactor,
            client,
            plugins: self.plugins,
            plugin_dirs,
            text_actions,
            host,
            notes,
            config_file: self.config_file,
            env: self.env,
            config,
        })
    }
}

/// The model summarizer `summarizer.*` asks for, made by `factory`;
/// `None` keeps the engine's offline extractive summarizer. Its prompts
/// leave the process: redacted with the user's patterns.
fn summarizer(
    config: &Config,
    env: &Env,
    redactor: &Arc<Redactor>,
    factory: Option<&dyn SummarizerFactory>,
) -> Result<Option<Arc<dyn ModelSummarizer>>, BuildError> {
    let s = &config.summarizer;
    if s.kind != SummarizerKind::Openai {
        return Ok(None);
    }
    if s.base_url.as_deref().is_none_or(str::is_empty) {
        return Err(BuildError::SummarizerSetting {
            key: "summarizer.base_url",
        });
    }
    if s.model.as_deref().is_none_or(str::is_empty) {
        return Err(BuildError::SummarizerSetting {
            key: "summarizer.model",
        });
    }
    let Some(openai) = config.openai_config() else {
        return Err(BuildError::SummarizerSetting {
            key: "summarizer.base_url",
        });
    };
    let Some(factory) = factory else {
        return Err(BuildError::NoAdapter {
            key: "summarizer.kind",
            adapter: "an OpenAI-compatible summarizer client",
        });
    };
    let base_url = openai.base_url.clone();
    let var = |name: &str| env.get(name).map(str::to_owned);
    let client = factory
        .openai(openai, &var, Arc::clone(redactor))
        .map_err(|source| BuildError::Summarizer { base_url, source })?;
    Ok(Some(client))
}

/// An engine as [`Engines::engine`] selected it.
pub struct Started {
    /// The engine, its model and window applied.
    pub engine: Box<dyn ContextEngine>,
    /// Where it came from (built-in, plugin, fallback).
    pub source: EngineSource,
    /// What the user should know (a plugin ran as a process, an unknown
    /// name fell back).
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for Started {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started")
            .field("engine", &self.engine.name())
            .field("source", &self.source)
            .field("warnings", &self.warnings)
            .finish()
    }
}

/// Everything the engines of one configuration share; each
/// [`engine`](Self::engine) call makes a fresh one (one per session).
#[derive(Clone)]
pub struct Engines {
    config: Config,
    config_file: Option<PathBuf>,
    name: String,
    section: serde_json::Value,
    required: bool,
    compressor_options: CompressorOptions,
    counter: Arc<dyn TokenCounter>,
    context_length: u64,
    model: Option<String>,
    profile: Profile,
    redactor: Arc<Redactor>,
    client: Option<Arc<dyn ModelSummarizer>>,
    plugins: Option<Arc<dyn PluginHost>>,
    plugin_dirs: Vec<PathBuf>,
    text_actions: TextActions,
    host: HostOptions,
    price: PriceModel,
    env: Env,
    /// What the user should know about the configuration itself (a
    /// summarizer this command cannot have), in every [`Started`].
    notes: Vec<String>,
}

impl std::fmt::Debug for Engines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engines")
            .field("name", &self.name)
            .field("context_length", &self.context_length)
            .field("model", &self.model)
            .field("profile", &self.profile)
            .field("model_summarizer", &self.has_model_summarizer())
            .field("plugin_dirs", &self.plugin_dirs)
            .finish_non_exhaustive()
    }
}

impl Engines {
    /// The configuration it was built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The configuration file read, if any.
    pub fn config_file(&self) -> Option<&std::path::Path> {
        self.config_file.as_deref()
    }

    /// The engine name asked for (`context.engine` or the caller's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The token counter every engine and host of this configuration
    /// shares (and its cache).
    pub fn counter(&self) -> &Arc<dyn TokenCounter> {
        &self.counter
    }

    /// The window the engines manage.
    pub fn context_length(&self) -> u64 {
        self.context_length
    }

    /// The agent's model, when named.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The provider rules.
    pub fn profile(&self) -> Profile {
        self.profile
    }

    /// `context.text_actions`, compiled.
    pub fn text_actions(&self) -> &TextActions {
        &self.text_actions
    }

    /// The built-in compressor's options (profile and text actions set).
    pub fn compressor_options(&self) -> &CompressorOptions {
        &self.compressor_options
    }

    /// The user's redactor (built-in rules and `security.*`).
    pub fn redactor(&self) -> &Arc<Redactor> {
        &self.redactor
    }

    /// Whether a model (not the extractive summarizer) writes summaries: a
    /// server then prepares them in the background.
    pub fn has_model_summarizer(&self) -> bool {
        self.client.is_some()
    }

    /// The model summarizer, when one writes summaries (to read its call
    /// stats after a compaction).
    pub fn summarizer_client(&self) -> Option<&Arc<dyn ModelSummarizer>> {
        self.client.as_ref()
    }

    /// The host's options: profile, text actions, per-model windows.
    pub fn host_options(&self) -> HostOptions {
        self.host.clone()
    }

    /// What a session store of this configuration keeps
    /// ([`AtRest`]: redacted unless `store.verbatim`, then sealed with the
    /// key in the variable `store.encryption_key_env` names).
    pub fn at_rest(&self) -> Result<AtRest, BuildError> {
        self.config.at_rest(&self.env)
    }

    /// A store of this configuration in memory: kept as a file store of
    /// the same configuration keeps it, so a replay sends the same requests
    /// whichever kind of store it archives into.
    pub fn memory_store(&self) -> Result<Arc<dyn SessionStore>, BuildError> {
        Ok(self.at_rest()?.wrap(Arc::new(MemoryStore::new())))
    }

    /// Prices for estimates (`pricing.*`).
    pub fn price(&self) -> &PriceModel {
        &self.price
    }

    /// The same configuration with the cache-aware schedule off: the
    /// every-call digest a replay's baseline runs.
    pub fn without_schedule(&self) -> Engines {
        let mut other = self.clone();
        other.compressor_options.schedule.enabled = false;
        other
    }

    fn context(&self) -> EngineContext {
        let mut context = EngineContext::new(Arc::clone(&self.counter), self.context_length)
            .with_compressor_options(self.compressor_options.clone())
            .with_section(self.section.clone())
            .with_redactor(Arc::clone(&self.redactor));
        if let Some(model) = &self.model {
            context = context.with_model(model.clone());
        }
        if let Some(client) = &self.client {
            context = context.with_summarizer(Box::new(Arc::clone(client)));
        }
        context
    }

    /// A fresh engine: the built-in compressor, or the plugin `name`
    /// (with fallback to the compressor unless `context.engine_required`),
    /// told the model and window.
    pub fn engine(&self) -> Result<Started, BuildError> {
        let selected = select_engine(
            &self.name,
            self.context(),
            &self.plugin_dirs,
            self.required,
            self.plugins.as_deref(),
        )
        .map_err(|source| BuildError::Engine {
            name: self.name.clone(),
            source,
        })?;
        let mut warnings = self.notes.clone();
        warnings.extend(selected.warnings);
        if let EngineSource::Plugin { manifest } = &selected.source {
            warnings.push(format!(
                "engine `{}` runs as a plugin process ({})",
                self.name,
                manifest.display()
            ));
        }
        let mut engine = selected.engine;
        if self.model.is_some() || engine.state().context_length != self.context_length {
            engine.update_model(&ModelInfo::new(
                self.model.clone().unwrap_or_default(),
                self.context_length,
            ));
        }
        Ok(Started {
            engine,
            source: selected.source,
            warnings,
        })
    }

    /// The built-in compressor of this configuration, by its concrete
    /// type, whatever `context.engine` names (for hosts that need the
    /// compressor itself; [`engine`](Self::engine) honours the name).
    pub fn compressor(&self) -> Compressor {
        let mut compressor = self.context().into_compressor();
        if self.model.is_some() {
            compressor.update_model(&ModelInfo::new(
                self.model.clone().unwrap_or_default(),
                self.context_length,
            ));
        }
        compressor
    }

    /// Whether an engine of this configuration blocks on I/O (a plugin
    /// process) and so runs on a blocking pool in an async host.
    pub fn blocks(source: &EngineSource) -> bool {
        matches!(source, EngineSource::Plugin { .. })
    }

    /// Does once, before the first request, what the first request would
    /// otherwise pay for: the tokenizer's tables, the redaction rules, the
    /// first step of `engine` (one of [`engine`](Self::engine)'s, e.g. the
    /// one a server started to check the configuration) in a throwaway
    /// session on a small tool-calling transcript, with no store. A server
    /// calls it before it reports ready, so its first request costs what
    /// the second does.
    pub fn warm_up(&self, engine: Box<dyn ContextEngine>) {
        let call = crate::message::ToolCall::function("warm_1", "bash", r#"{"command":"ls"}"#);
        let messages = [
            Message::system("You are a coding agent."),
            Message::user("List the files."),
            Message::assistant_tool_calls("", vec![call]),
            Message::tool_result("warm_1", "README.md\nsrc\n".repeat(64)),
        ];
        let opts = crate::redact::RedactOptions::default();
        let _ = self.redactor.redact("token ghp_0000", &opts);
        let _ = crate::redact::redact("token ghp_0000", &opts);
        let mut session = Session::new("warm-up", engine, Arc::clone(&self.counter))
            .with_options(self.host_options());
        let _ = session.before_request(&messages);
    }

    /// Refuses a window that cannot hold the system prompt of `messages`
    /// (an error up front, not a compaction "at threshold 0").
    pub fn check_window(&self, messages: &[Message]) -> Result<(), BuildError> {
        let system = crate::compressor::fit::system_prompt_tokens(messages, self.counter.as_ref());
        if self.context_length <= system {
            return Err(BuildError::WindowTooSmall {
                window: self.context_length,
                system,
            });
        }
        Ok(())
    }

    /// A host session `id` driving a fresh engine with this
    /// configuration's host options; the engine's warnings come back.
    pub fn session(&self, id: impl Into<String>) -> Result<(Session, Vec<String>), BuildError> {
        let Started {
            engine, warnings, ..
        } = self.engine()?;
        let session = Session::new(id.into(), engine, Arc::clone(&self.counter))
            .with_options(self.host_options());
        Ok((session, warnings))
    }

    /// The replay options of this configuration: prices, profile, text
    /// actions.
    pub fn replay_options(&self) -> ReplayOptions {
        ReplayOptions::default()
            .with_price(self.price.clone())
            .with_profile(self.profile)
            .with_text_actions(self.text_actions.clone())
    }

    /// Replays `run` as `ctx replay` does: the recording driven through a
    /// session of this configuration (archiving into `run.store`, which
    /// starts the session afresh), then, unless `run.baseline` is off or
    /// the schedule is, once more with the schedule off for the cost
    /// comparison (archived into a store of its own, never the caller's).
    /// The report, and the engine's warnings (a plugin, a fallback).
    pub fn replay(
        &self,
        run: ReplayRun<'_>,
        progress: impl FnMut(usize, usize),
    ) -> Result<(ReplayReport, Vec<String>), RunError> {
        let options = self
            .replay_options()
            .with_message_times(run.message_times.clone());
        let (mut session, warnings) = self.session(run.session_id.clone())?;
        let store = match &run.archive {
            Archive::Off => None,
            Archive::Memory => Some(self.memory_store()?),
            Archive::Into(store) => Some(Arc::clone(store)),
        };
        if let Some(store) = store {
            // A replay starts afresh, whatever an earlier one left.
            store.delete_session(&run.session_id)?;
            session = session.with_store(store)?;
        }
        let report = replay(
            run.messages,
            &mut session,
            self.counter.as_ref(),
            &options,
            progress,
        )?;
        if !run.baseline || !self.compressor_options.schedule.enabled {
            return Ok((report, warnings));
        }
        let (mut baseline, _) = self.without_schedule().session(run.session_id.clone())?;
        if !matches!(run.archive, Archive::Off) {
            baseline = baseline.with_store(self.memory_store()?)?;
        }
        let every_call = replay(
            run.messages,
            &mut baseline,
            self.counter.as_ref(),
            &options,
            |_, _| {},
        )?;
        Ok((report.with_baseline(&every_call), warnings))
    }
}

/// One replay for [`Engines::replay`].
#[derive(Clone)]
pub struct ReplayRun<'a> {
    /// The recording.
    pub messages: &'a [Message],
    /// When each message was written, by index (may be empty).
    pub message_times: Vec<Option<f64>>,
    /// The session id in the store.
    pub session_id: String,
    /// Where the replay archives what leaves its requests.
    pub archive: Archive,
    /// Also run the every-call-digest baseline for the cost comparison.
    pub baseline: bool,
}

impl<'a> ReplayRun<'a> {
    /// A run of `messages` as session `id`, archived in memory, with the
    /// baseline (what `ctx replay` does without flags).
    pub fn new(messages: &'a [Message], id: impl Into<String>) -> ReplayRun<'a> {
        ReplayRun {
            messages,
            message_times: Vec::new(),
            session_id: id.into(),
            archive: Archive::Memory,
            baseline: true,
        }
    }
}

/// Where a replay archives ([`ReplayRun::archive`]).
#[derive(Clone, Default)]
pub enum Archive {
    /// Nowhere: nothing is recallable after a compaction.
    Off,
    /// A store in memory of this configuration ([`Engines::memory_store`]).
    #[default]
    Memory,
    /// The caller's store (its session starts afresh).
    Into(Arc<dyn SessionStore>),
}

/// Why [`Engines::replay`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The engine could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The store refused the session.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The recording could not be replayed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

#[cfg(test)]
mod tests;
