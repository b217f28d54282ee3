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
pub mod token;
pub mod tools;
pub mod unique;
pub mod upstream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

pub use error::{ServeError, StartError};
pub use metrics::Metrics;
pub use router::app;
pub use session::{EngineFactory, FactoryError, SessionContext, Sessions, SharedStore};
pub use upstream::{Upstream, UpstreamOptions};

/// How the proxy runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ServeOptions {
    /// Address to listen on (loopback by default).
    pub listen: SocketAddr,
    /// The provider.
    pub upstream: UpstreamOptions,
    /// The access token clients must present; required off loopback and
    /// whenever the upstream options carry a provider key.
    pub auth_token: Option<String>,
    /// Hosts a request may name besides the loopback names, the listen
    /// address and the address a connection arrived on (see
    /// [`edge::site`]).
    pub allowed_hosts: Vec<String>,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Request body bytes all requests together may hold; past it a
    /// request is refused at once (503, `Retry-After`).
    pub max_inflight_bytes: usize,
    /// Time from a request's first byte to the end of its headers.
    pub header_read_timeout: Duration,
    /// Time from the start of a body's read to its last byte.
    pub body_read_timeout: Duration,
    /// Time a connection may stay open without a request.
    pub keepalive_idle: Duration,
    /// Offer the engine's tools on requests that carry tools of their own,
    /// and resolve their calls.
    pub engine_tools: bool,
    /// The header the operator's gateway names each user in, behind the
    /// access token (see [`identity`]); requires `auth_token`.
    pub identity_header: Option<axum::http::HeaderName>,
    /// Upstream round trips per request for engine-tool calls.
    pub max_tool_rounds: u32,
    /// Sessions kept in memory.
    pub max_sessions: usize,
    /// Idle time after which a session is dropped.
    pub session_idle: Duration,
    /// Idle time after which a session sleeps: only the deflated texts of
    /// its managed history and its engine state stay in memory (with a
    /// session store, nothing: the store holds it). `None`: never.
    pub hibernate_after: Option<Duration>,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// Where sessions are kept: `None` keeps them in this process only;
    /// a store (SQLite, Postgres) makes them durable and, for a store
    /// several processes share (Postgres), lets any instance serve any
    /// session.
    pub store: Option<SharedStore>,
    /// The page at `/ui`.
    pub ui: UiOptions,
}

/// The page at `/ui` ([`handlers::ui`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct UiOptions {
    /// Answer `/ui` and its JSON, and keep each session's last calls.
    pub enabled: bool,
    /// Answer on connections that did not arrive on a loopback address.
    pub remote: bool,
    /// The operator's token: a request presenting it
    /// ([`handlers::ui::OPERATOR_HEADER`]) sees every session.
    pub operator_token: Option<String>,
    /// Calls kept per session.
    pub calls_per_session: usize,
    /// The prices the overview estimates the bill with (`pricing.*`);
    /// `None`: no estimate.
    pub price: Option<context_engine::pricing::PriceModel>,
    /// Bytes of the last managed calls' bodies kept for the page's view of
    /// a call's request, all sessions together (0: none).
    pub request_bytes: usize,
    /// The redaction the page shows a call's request with (the user's
    /// `security.*` patterns).
    pub egress: context_engine::redact::Egress,
}

impl Default for UiOptions {
    /// On, loopback only, no operator, 1,000 calls per session, no bill
    /// estimate, 32 MiB of request bodies, the built-in redaction rules.
    fn default() -> UiOptions {
        UiOptions {
            enabled: true,
            remote: false,
            operator_token: None,
            calls_per_session: 1000,
            price: None,
            request_bytes: 32 << 20,
            egress: context_engine::redact::Egress::builtin(),
        }
    }
}

impl UiOptions {
    /// The page off: no route, no call kept.
    pub fn off() -> UiOptions {
        UiOptions {
            enabled: false,
            ..UiOptions::default()
        }
    }

    /// Sets [`remote`](Self::remote).
    pub fn with_remote(mut self, on: bool) -> UiOptions {
        self.remote = on;
        self
    }

    /// Sets [`operator_token`](Self::operator_token) (empty: none).
    pub fn with_operator_token(mut self, token: Option<String>) -> UiOptions {
        self.operator_token = token.filter(|t| !t.is_empty());
        self
    }

    /// Sets [`price`](Self::price).
    pub fn with_price(mut self, price: context_engine::pricing::PriceModel) -> UiOptions {
        self.price = Some(price);
        self
    }

    /// Sets [`request_bytes`](Self::request_bytes).
    pub fn with_request_bytes(mut self, bytes: usize) -> UiOptions {
        self.request_bytes = bytes;
        self
    }

    /// Sets [`egress`](Self::egress).
    pub fn with_egress(mut self, egress: context_engine::redact::Egress) -> UiOptions {
        self.egress = egress;
        self
    }

    /// Sets [`calls_per_session`](Self::calls_per_session).
    pub fn with_calls_per_session(mut self, n: usize) -> UiOptions {
        self.calls_per_session = n;
        self
    }
}

impl ServeOptions {
    /// Defaults (`127.0.0.1:8787`, 64 MiB bodies, 96 MiB of bodies in
    /// flight, header / body / keep-alive timeouts of 10 / 60 / 90 s,
    /// engine tools, 10 000 sessions idle for at most an hour, asleep after
    /// a minute idle, 30 s shutdown grace) for `upstream`.
    pub fn new(upstream: UpstreamOptions) -> ServeOptions {
        ServeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 8787)),
            upstream,
            auth_token: None,
            allowed_hosts: Vec::new(),
            max_body_bytes: 64 * 1024 * 1024,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(60),
            keepalive_idle: Duration::from_secs(90),
            engine_tools: true,
            identity_header: None,
            max_tool_rounds: 3,
            max_sessions: 10_000,
            session_idle: Duration::from_secs(3600),
            hibernate_after: Some(Duration::from_secs(60)),
            shutdown_grace: Duration::from_secs(30),
            store: None,
            ui: UiOptions::default(),
        }
    }

    /// Sets [`ui`](Self::ui).
    pub fn with_ui(mut self, ui: UiOptions) -> ServeOptions {
        self.ui = ui;
        self
    }

    /// Sets [`store`](Self::store).
    pub fn with_store(
        mut self,
        store: Option<Arc<dyn context_engine::store::SessionStore>>,
    ) -> ServeOptions {
        self.store = store.map(SharedStore::new);
        self
    }

    /// Sets [`listen`](Self::listen).
    pub fn with_listen(mut self, listen: SocketAddr) -> ServeOptions {
        self.listen = listen;
        self
    }

    /// Sets [`auth_token`](Self::auth_token).
    pub fn with_auth_token(mut self, token: Option<String>) -> ServeOptions {
        self.auth_token = token.filter(|t| !t.is_empty());
        self
    }

    /// Sets [`allowed_hosts`](Self::allowed_hosts).
    pub fn with_allowed_hosts(mut self, hosts: Vec<String>) -> ServeOptions {
        self.allowed_hosts = hosts;
        self
    }

    /// Sets [`max_inflight_bytes`](Self::max_inflight_bytes).
    pub fn with_max_inflight_bytes(mut self, n: usize) -> ServeOptions {
        self.max_inflight_bytes = n;
        self
    }

    /// Sets the header read, body read and keep-alive idle timeouts.
    pub fn with_timeouts(
        mut self,
        header_read: Duration,
        body_read: Duration,
        keepalive_idle: Duration,
    ) -> ServeOptions {
        self.header_read_timeout = header_read;
        self.body_read_timeout = body_read;
        self.keepalive_idle = keepalive_idle;
        self
    }

    /// Sets [`engine_tools`](Self::engine_tools).
    pub fn with_engine_tools(mut self, on: bool) -> ServeOptions {
        self.engine_tools = on;
        self
    }

    /// Sets [`identity_header`](Self::identity_header) from its name
    /// (`None` or empty: none); a name that is not a header name is an
    /// error.
    pub fn with_identity_header(mut self, name: Option<&str>) -> Result<ServeOptions, StartError> {
        self.identity_header = match name.map(str::trim) {
            None | Some("") => None,
            Some(n) => Some(
                axum::http::HeaderName::try_from(n)
                    .map_err(|_| StartError::BadIdentityHeader(n.to_owned()))?,
            ),
        };
        Ok(self)
    }

    /// Sets [`max_body_bytes`](Self::max_body_bytes).
    pub fn with_max_body_bytes(mut self, n: usize) -> ServeOptions {
        self.max_body_bytes = n;
        self
    }

    /// Sets [`max_tool_rounds`](Self::max_tool_rounds).
    pub fn with_max_tool_rounds(mut self, n: u32) -> ServeOptions {
        self.max_tool_rounds = n;
        self
    }

    /// Sets [`max_sessions`](Self::max_sessions) and
    /// [`session_idle`](Self::session_idle).
    pub fn with_sessions(mut self, max: usize, idle: Duration) -> ServeOptions {
        self.max_sessions = max;
        self.session_idle = idle;
        self
    }

    /// Sets [`hibernate_after`](Self::hibernate_after).
    pub fn with_hibernation(mut self, after: Option<Duration>) -> ServeOptions {
        self.hibernate_after = after;
        self
    }

    /// Sets [`shutdown_grace`](Self::shutdown_grace).
    pub fn with_shutdown_grace(mut self, grace: Duration) -> ServeOptions {
        self.shutdown_grace = grace;
        self
    }
}

/// The default of [`ServeOptions::max_inflight_bytes`]: 96 MiB, one body
/// of the largest default size and room for many ordinary ones. A managed
/// request peaks at about six times its body (its parsed history, the
/// engine's work, the body it sends): six concurrent 60 MB chat requests
/// in six sessions peaked at 1.5 GiB RSS with 256 MiB in flight, 790 MiB
/// with 128 MiB, and stay near 450 MiB with this default.
pub const DEFAULT_MAX_INFLIGHT_BYTES: usize = 96 * 1024 * 1024;

/// What every handler shares: options, the upstream client, the sessions,
/// the metrics.
#[derive(Clone, Debug)]
pub struct AppState(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    options: ServeOptions,
    upstream: Upstream,
    sessions: Sessions,
    metrics: Metrics,
    token: Option<[u8; 32]>,
    allowed_hosts: edge::site::AllowedHosts,
    inflight: Arc<edge::budget::InflightBudget>,
    operator: Option<[u8; 32]>,
}

impl AppState {
    /// The state for `options`; refuses a non-loopback address or a
    /// provider key without an access token, a bad `allowed_hosts` entry,
    /// and an in-flight cap below the body limit.
    pub fn new(options: ServeOptions, ctx: SessionContext) -> Result<AppState, StartError> {
        if !options.listen.ip().is_loopback() && options.auth_token.is_none() {
            return Err(StartError::NeedsToken {
                addr: options.listen,
            });
        }
        if options.upstream.api_key.is_some() && options.auth_token.is_none() {
            return Err(StartError::KeyNeedsToken);
        }
        if options.max_inflight_bytes < options.max_body_bytes {
            return Err(StartError::InflightBelowBody {
                inflight: options.max_inflight_bytes,
                body: options.max_body_bytes,
            });
        }
        let allowed_hosts =
            edge::site::AllowedHosts::new(options.listen.ip(), &options.allowed_hosts)?;
        let inflight = edge::budget::InflightBudget::new(options.max_inflight_bytes);
        let metrics = Metrics::new();
        let upstream = Upstream::new(&options.upstream)?
            .counting_retries(metrics.connect_retries())
            .dropping_identity_header(options.identity_header.clone());
        identity::check_options(&options)?;
        let (calls, request_bytes) = if options.ui.enabled {
            (options.ui.calls_per_session, options.ui.request_bytes)
        } else {
            (0, 0)
        };
        let sessions = Sessions::new(ctx, options.max_sessions, options.session_idle)
            .with_store(options.store.clone())
            .with_hibernation(options.hibernate_after)
            .with_call_log(calls)
            .with_request_log(request_bytes);
        if let Some(store) = sessions.store() {
            store.health.time_into(metrics.store_latency());
            sessions.set_summary_claims(Arc::new(store.clone()));
        }
        let token = options
            .auth_token
            .as_deref()
            .map(|t| token::digest(t.as_bytes()));
        let operator = options
            .ui
            .operator_token
            .as_deref()
            .map(|t| token::digest(t.as_bytes()));
        Ok(AppState(Arc::new(Shared {
            options,
            upstream,
            sessions,
            metrics,
            token,
            allowed_hosts,
            inflight,
            operator,
        })))
    }

    /// The options.
    pub fn options(&self) -> &ServeOptions {
        &self.0.options
    }

    /// The upstream client.
    pub fn upstream(&self) -> &Upstream {
        &self.0.upstream
    }

    /// The sessions.
    pub fn sessions(&self) -> &Sessions {
        &self.0.sessions
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    /// The hosts requests may name.
    pub(crate) fn allowed_hosts(&self) -> &edge::site::AllowedHosts {
        &self.0.allowed_hosts
    }

    /// The budget of request bytes in flight.
    pub fn inflight(&self) -> &Arc<edge::budget::InflightBudget> {
        &self.0.inflight
    }

    /// SHA-256 of the access token, when one is required.
    pub(crate) fn token_digest(&self) -> Option<&[u8; 32]> {
        self.0.token.as_ref()
    }

    /// SHA-256 of the page's operator token, when one is configured.
    pub(crate) fn operator_digest(&self) -> Option<&[u8; 32]> {
        self.0.operator.as_ref()
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, then lets
/// in-flight requests (streams included) finish for at most the shutdown
/// grace. Connections are served by [`accept::accept`] (timeouts,
/// `TCP_NODELAY`). Idle sessions are swept once a minute by one task, which also
/// puts sessions to sleep (on the blocking pool: it deflates) as often as
/// the hibernation time asks (at most once a second).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let sweeper = {
        let state = state.clone();
        let mut rx = rx.clone();
        tokio::spawn(async move {
            const SWEEP: Duration = Duration::from_secs(60);
            let hibernate = state.sessions().hibernation();
            let period = hibernate.map_or(SWEEP, |h| (h / 2).clamp(Duration::from_secs(1), SWEEP));
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_sweep = tokio::time::Instant::now();
            loop {
                let stop = tokio::select! {
                    _ = tick.tick() => false,
                    _ = rx.wait_for(|stop| *stop) => true,
                };
                if stop {
                    break;
                }
                if let Some(after) = hibernate {
                    let s = state.clone();
                    let _ = tokio::task::spawn_blocking(move || s.sessions().hibernate_idle(after))
                        .await;
                }
                if last_sweep.elapsed() >= SWEEP {
                    last_sweep = tokio::time::Instant::now();
                    let left = state.sessions().sweep();
                    state.metrics().set_sessions(left);
                }
            }
        })
    };
    let grace = state.options().shutdown_grace;
    let timeouts = accept::Timeouts {
        header_read: state.options().header_read_timeout,
        keepalive_idle: state.options().keepalive_idle,
    };
    let server = accept::accept(listener, app(state), timeouts, rx.clone());
    let mut expired = rx;
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
        let _ = tx.send(true);
    });
    let result = tokio::select! {
        r = server => r,
        _ = async {
            let _ = expired.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(grace_s = grace.as_secs(), "in-flight requests cut off after the grace period");
            Ok(())
        }
    };
    sweeper.abort();
    result
}

/// Binds `options.listen` and serves until Ctrl-C or SIGTERM, on a
/// multi-threaded runtime of its own.
pub fn run(options: ServeOptions, ctx: SessionContext) -> Result<(), StartError> {
    // Engine steps that may block (model summarizer, plugin process) run on
    // the blocking pool, bounded so a burst cannot spawn a thread per session.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(64)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listen = options.listen;
        let state = AppState::new(options, ctx)?;
        let listener = TcpListener::bind(listen).await?;
        tracing::info!(addr = %listener.local_addr()?, "ctx serve listening");
        serve(listener, state, shutdown_signal()).await?;
        Ok(())
    })
}

/// Ctrl-C, or SIGTERM on Unix.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
