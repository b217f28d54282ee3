//! Errors of the proxy, in OpenAI's error shape
//! (`{"error":{"message","type","param","code"}}`) so that every client SDK
//! shows them as it shows a provider's.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error the proxy itself answers with (upstream errors are passed back
/// as they came, never wrapped).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The upstream could not be reached or broke off.
    #[error("upstream request failed: {0}")]
    Upstream(String),
    /// The upstream did not answer in time.
    #[error("upstream did not answer within the timeout")]
    UpstreamTimeout,
    /// A request without an identity asked for what only an identity may
    /// read (see [`identity`](crate::identity)): 403.
    #[error("{0}")]
    NoIdentity(String),
    /// Missing or wrong access token.
    #[error(
        "missing or invalid access token (send `Authorization: Bearer <token>` or `x-ctx-token`)"
    )]
    Unauthorized,
    /// The request cannot be read.
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// A key twice in one object of the body: what the proxy reads and
    /// what a provider reads could differ ([`unique`](crate::unique)).
    #[error(
        "invalid request: the key `{key}` appears twice in {}: send each key once",
        if at.is_empty() { "the body" } else { at.as_str() }
    )]
    DuplicateKey {
        /// The key.
        key: String,
        /// Where, e.g. `messages[3]` (empty: the top level).
        at: String,
    },
    /// The proxy itself failed (never the engine: that fails open).
    #[error("internal error: {0}")]
    Internal(String),
    /// No such session for this credential.
    #[error("no session `{0}` for this credential")]
    SessionNotFound(String),
    /// Something else the request names is not here (said in full).
    #[error("{0}")]
    NotFound(String),
    /// A request the proxy refuses to forward: a cross-site or foreign-host
    /// request (what a web page could send).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// A body of a type the route does not take.
    #[error("unsupported media type: {0}")]
    UnsupportedMediaType(String),
    /// A body larger than `serve.max_body_bytes`.
    #[error("request body larger than {limit} bytes (serve.max_body_bytes)")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The body did not arrive within `serve.body_read_timeout_seconds`.
    #[error("the request body did not arrive within {seconds} s")]
    BodyTimeout {
        /// The deadline, in seconds.
        seconds: u64,
    },
    /// Too many request bytes in flight (`serve.max_inflight_bytes`):
    /// answered at once with `Retry-After`.
    #[error(
        "the proxy is holding its limit of request bytes in flight (serve.max_inflight_bytes); retry shortly"
    )]
    Overloaded,
}

/// Seconds a client is asked to wait after [`ServeError::Overloaded`].
pub const RETRY_AFTER_SECONDS: u32 = 1;

impl ServeError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ServeError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ServeError::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ServeError::Unauthorized => StatusCode::UNAUTHORIZED,
            ServeError::NoIdentity(_) => StatusCode::FORBIDDEN,
            ServeError::BadRequest(_) | ServeError::DuplicateKey { .. } => StatusCode::BAD_REQUEST,
            ServeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ServeError::SessionNotFound(_) | ServeError::NotFound(_) => StatusCode::NOT_FOUND,
            ServeError::Forbidden(_) => StatusCode::FORBIDDEN,
            ServeError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ServeError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ServeError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ServeError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ServeError::Upstream(_) => ("api_error", "upstream_error"),
            ServeError::UpstreamTimeout => ("api_error", "upstream_timeout"),
            ServeError::Unauthorized => ("invalid_request_error", "invalid_api_key"),
            ServeError::NoIdentity(_) => ("permission_error", "no_identity"),
            ServeError::BadRequest(_) => ("invalid_request_error", "invalid_request"),
            ServeError::DuplicateKey { .. } => ("invalid_request_error", "duplicate_key"),
            ServeError::Internal(_) => ("api_error", "internal_error"),
            ServeError::SessionNotFound(_) | ServeError::NotFound(_) => {
                ("invalid_request_error", "not_found")
            }
            ServeError::Forbidden(_) => ("invalid_request_error", "forbidden"),
            ServeError::UnsupportedMediaType(_) => {
                ("invalid_request_error", "unsupported_media_type")
            }
            ServeError::PayloadTooLarge { .. } => ("invalid_request_error", "payload_too_large"),
            ServeError::BodyTimeout { .. } => ("invalid_request_error", "request_timeout"),
            ServeError::Overloaded => ("api_error", "overloaded"),
        }
    }

    /// The error as OpenAI's JSON error body.
    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        serde_json::json!({
            "error": { "message": self.to_string(), "type": kind, "param": null, "code": code }
        })
    }

    /// From a `reqwest` failure, without its URL (which may carry a key in
    /// a query string).
    pub(crate) fn from_reqwest(err: &reqwest::Error) -> ServeError {
        if err.is_timeout() {
            return ServeError::UpstreamTimeout;
        }
        let what = if err.is_connect() {
            "cannot connect"
        } else if err.is_body() || err.is_decode() {
            "the response body broke off"
        } else {
            "the request failed"
        };
        ServeError::Upstream(what.to_owned())
    }
}

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        if matches!(self, ServeError::Overloaded) {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `--listen` is not loopback and no access token is configured.
    #[error(
        "refusing to listen on {addr} without an access token: set serve.auth_token_env to the \
         name of a variable holding one, or listen on 127.0.0.1"
    )]
    NeedsToken {
        /// The address asked for.
        addr: std::net::SocketAddr,
    },
    /// A provider key is configured but no access token: any caller
    /// could spend the key.
    #[error(
        "refusing to start: serve.upstream.api_key_env is set, so every request would go \
         upstream with that key, but no client authentication is configured; set \
         serve.auth_token_env to the name of a variable holding the token clients must send \
         (or unset serve.upstream.api_key_env so that each client's own key goes upstream)"
    )]
    KeyNeedsToken,
    /// An entry of `serve.allowed_hosts` is not a host name.
    #[error(
        "invalid serve.allowed_hosts entry `{entry}`: {why} (expected a host name or IP address, \
         optionally with a port and a leading `*.`, or `*`)"
    )]
    BadAllowedHost {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        why: String,
    },
    /// `serve.max_inflight_bytes` is below `serve.max_body_bytes`: a body
    /// the limit accepts could never be admitted.
    #[error("serve.max_inflight_bytes ({inflight}) must be at least serve.max_body_bytes ({body})")]
    InflightBelowBody {
        /// `serve.max_inflight_bytes`.
        inflight: usize,
        /// `serve.max_body_bytes`.
        body: usize,
    },
    /// A variable the configuration names is not set.
    #[error("environment variable `{name}` ({key}) is not set or empty")]
    MissingEnv {
        /// The variable.
        name: String,
        /// The configuration key that names it.
        key: &'static str,
    },
    /// The upstream URL is not usable.
    #[error("invalid upstream URL `{url}`: {why}")]
    BadUpstream {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// No upstream is configured.
    #[error("ctx serve needs --upstream URL (or serve.upstream.url)")]
    NoUpstream,
    /// The listen address does not parse.
    #[error("invalid listen address `{0}` (expected host:port, e.g. 127.0.0.1:8787)")]
    BadListen(String),
    /// `serve.identity_header` without an access token: anyone who reaches
    /// the port could claim any user.
    #[error(
        "serve.identity_header `{0}` needs serve.auth_token_env: without the proxy's access token \
         anyone who reaches the port can send the header and read that user's archive"
    )]
    IdentityHeaderNeedsToken(String),
    /// `serve.identity_header` names a header that cannot name a user.
    #[error(
        "serve.identity_header `{0}` cannot name a user: give the header your gateway sets \
         (e.g. x-user), not a credential, an x-ctx-* header or a standard one"
    )]
    BadIdentityHeader(String),
    /// Binding or serving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
