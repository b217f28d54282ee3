//! How the proxy runs: [`ServeOptions`] and the page's [`UiOptions`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use context_engine::config::ServeMode;

use crate::error::StartError;
use crate::session::SharedStore;
use crate::upstream::UpstreamOptions;

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
    /// [`crate::edge::site`]).
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
    /// Managed (the engine's request goes upstream) or observe (requests
    /// go upstream untouched, the engine runs beside them: see
    /// [`crate::handlers::observe`]).
    pub mode: ServeMode,
    /// Offer the engine's tools on requests that carry tools of their own,
    /// and resolve their calls.
    pub engine_tools: bool,
    /// The header the operator's gateway names each user in, behind the
    /// access token (see [`crate::identity`]); requires `auth_token`.
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
    /// How long a request waits for its session while another call of it
    /// (one still being drained after its client left, say) holds it; past
    /// it the request goes upstream unmanaged, logged and counted.
    pub session_wait: Duration,
    /// Where sessions are kept: `None` keeps them in this process only;
    /// a store (SQLite, Postgres) makes them durable and, for a store
    /// several processes share (Postgres), lets any instance serve any
    /// session.
    pub store: Option<SharedStore>,
    /// The page at `/ui`.
    pub ui: UiOptions,
}

/// The page at `/ui` ([`crate::handlers::ui`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct UiOptions {
    /// Answer `/ui` and its JSON, and keep each session's last calls.
    pub enabled: bool,
    /// Answer on connections that did not arrive on a loopback address.
    pub remote: bool,
    /// The operator's token: a request presenting it
    /// ([`crate::handlers::ui::OPERATOR_HEADER`]) sees every session.
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
    /// a minute idle, 30 s shutdown grace, 30 s of waiting for a busy
    /// session) for `upstream`.
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
            mode: ServeMode::Managed,
            engine_tools: true,
            identity_header: None,
            max_tool_rounds: 3,
            max_sessions: 10_000,
            session_idle: Duration::from_secs(3600),
            hibernate_after: Some(Duration::from_secs(60)),
            shutdown_grace: Duration::from_secs(30),
            session_wait: Duration::from_secs(30),
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

    /// Sets [`mode`](Self::mode).
    pub fn with_mode(mut self, mode: ServeMode) -> ServeOptions {
        self.mode = mode;
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

    /// Sets [`session_wait`](Self::session_wait).
    pub fn with_session_wait(mut self, wait: Duration) -> ServeOptions {
        self.session_wait = wait;
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

/// Refuses an identity header without the access token (anyone who
/// reaches the port could claim any user) or on a header that cannot name
/// a user.
impl ServeOptions {
    pub(crate) fn check_identity(&self) -> Result<(), StartError> {
        let options = self;
        let Some(name) = &options.identity_header else {
            return Ok(());
        };
        if options.auth_token.is_none() {
            return Err(StartError::IdentityHeaderNeedsToken(name.to_string()));
        }
        if !crate::identity::usable_identity_header(name) {
            return Err(StartError::BadIdentityHeader(name.to_string()));
        }
        Ok(())
    }
}
