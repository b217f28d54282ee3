//! context-engine-adapters: the default adapters of `context-engine`, wired
//! into its one engine builder for every host (`ctx`, `ctx serve`, Python).
//!
//! The core ([`context_engine::builder::EngineBuilder`]) turns a
//! configuration into engines but links no I/O: it is handed what makes a
//! model summarizer ([`SummarizerFactory`](context_engine::summarize::SummarizerFactory))
//! and what starts a plugin process
//! ([`PluginHost`](context_engine::plugin::PluginHost)). This crate gives it
//! the defaults, the OpenAI-compatible client (`context-engine-openai`) and
//! the process host (`context-engine-plugin-host`), and opens a session
//! store from a path with `context-engine-sqlite`.
//!
//! ```
//! use context_engine::config::{ConfigLoader, Env};
//! use context_engine_adapters::WithAdapters;
//!
//! let env = Env::empty();
//! let loaded = ConfigLoader::new().with_search(false).with_environment(&env).load()?;
//! let engines = context_engine::builder::EngineBuilder::from_loaded(loaded)
//!     .with_default_adapters()
//!     .with_env(env)
//!     .build()?;
//! assert_eq!(engines.engine()?.engine.name(), "compressor");
//! # Ok::<(), context_engine::Error>(())
//! ```

use std::sync::Arc;

use context_engine::builder::EngineBuilder;
use context_engine::config::Loaded;

pub use context_engine_sqlite::{open as open_store, open_at_rest as open_store_at_rest};

/// Gives an [`EngineBuilder`] the default adapters.
pub trait WithAdapters {
    /// The OpenAI-compatible summarizer client and the plugin process host.
    fn with_default_adapters(self) -> Self;
}

impl WithAdapters for EngineBuilder {
    fn with_default_adapters(self) -> EngineBuilder {
        self.with_summarizers(Arc::new(context_engine_openai::Factory))
            .with_plugin_host(Arc::new(context_engine_plugin_host::Host))
    }
}

/// [`EngineBuilder::from_loaded`] with the default adapters: what every
/// host starts from.
pub fn builder(loaded: Loaded) -> EngineBuilder {
    EngineBuilder::from_loaded(loaded).with_default_adapters()
}
