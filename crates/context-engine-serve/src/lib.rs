//! `ctx serve`: context-engine as an OpenAI-compatible proxy.
//!
//! An agent points its base URL at the proxy; the proxy forwards every
//! `/v1/*` call to the upstream provider and manages
//! `POST /v1/chat/completions`: each request's full client history becomes
//! the session's managed history (digest, proactive prune, compaction,
//! engine tools) through the library's host driver
//! ([`context_engine::host::Session`]), with the prefix sent before kept
//! byte for byte so the provider's prompt cache keeps matching.
//!
//! Layout, from the top: [`routes`] (paths), [`router`] (layers: edge
//! checks, access token, body limit, metrics), [`handlers`] (thin: parse,
//! session, engine view, relay; the one stream relay is
//! `handlers::relay`), [`tools`] (engine tools and their rounds),
//! [`session`] (keying, lineage, the driver per session), [`identity`]
//! (who a request is), [`upstream`] (the HTTP client), [`accept`]
//! (connections: timeouts, `TCP_NODELAY`), [`edge`] (what a request must
//! be: host, origin, body type, passthrough path, size, deadline, bytes in
//! flight), and at the bottom [`token`] (the access token), [`body`] (the
//! request's raw fields), [`sse`] (the stream's events, parsed once, and each
//! API's reader), [`cut`] (a stream's error events), [`metrics`], [`error`]
//! (OpenAI's error shape). A module imports only modules below it. No
//! engine logic lives here: it is all in `context_engine`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use context_engine::engine::ContextEngine;
//! use context_engine::host::HostOptions;
//! use context_engine::plugin::EngineContext;
//! use context_engine::tokens::{BpeCounter, Encoding, TokenCounter};
//! use context_engine_serve::{FactoryError, ServeOptions, SessionContext, UpstreamOptions, run};
//!
//! let counter: Arc<dyn TokenCounter> = Arc::new(BpeCounter::new(Encoding::O200kBase));
//! let c = Arc::clone(&counter);
//! let factory = move |_id: &str| -> Result<Box<dyn ContextEngine>, FactoryError> {
//!     Ok(Box::new(EngineContext::new(Arc::clone(&c), 128_000).into_compressor()))
//! };
//! let ctx = SessionContext { factory: Arc::new(factory), counter, host: HostOptions::default(), blocking: false };
//! let options = ServeOptions::new(UpstreamOptions::new("http://127.0.0.1:8080/v1"));
//! run(options, ctx)?;
//! # Ok::<(), context_engine_serve::StartError>(())
//! ```

pub mod accept;
pub mod body;
pub mod config;
pub mod cut;
pub mod edge;
pub mod error;
pub mod handlers;
pub mod identity;
pub mod metrics;
pub mod paths;
pub mod router;
pub mod routes;
pub mod session;
pub mod sse;
pub mod summarizer;
pub mod token;
pub mod tools;
pub mod unique;
pub mod upstream;
mod usage;

mod options;
mod server;
mod state;

pub use error::{ServeError, StartError};
pub use metrics::Metrics;
pub use options::{DEFAULT_MAX_INFLIGHT_BYTES, ServeMode, ServeOptions, UiOptions};
pub use router::app;
pub use server::{run, serve, shutdown_signal};
pub use session::{EngineFactory, FactoryError, SessionContext, Sessions, SharedStore};
pub use state::AppState;
pub use summarizer::UpstreamSummarizer;
pub use upstream::{Upstream, UpstreamOptions};
