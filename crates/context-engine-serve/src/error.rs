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
    /// The proxy itself failed (never the engine: that fails open).
    #[error("internal error: {0}")]
    Internal(String),
    /// No such session for this credential.
    #[error("no session `{0}` for this credential")]
    SessionNotFound(String),
}

impl ServeError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ServeError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ServeError::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ServeError::Unauthorized => StatusCode::UNAUTHORIZED,
            ServeError::NoIdentity(_) => StatusCode::FORBIDDEN,
            ServeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ServeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ServeError::SessionNotFound(_) => StatusCode::NOT_FOUND,
        }
    }

    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ServeError::Upstream(_) => ("api_error", "upstream_error"),
            ServeError::UpstreamTimeout => ("api_error", "upstream_timeout"),
            ServeError::Unauthorized => ("invalid_request_error", "invalid_api_key"),
            ServeError::NoIdentity(_) => ("permission_error", "no_identity"),
            ServeError::BadRequest(_) => ("invalid_request_error", "invalid_request"),
            ServeError::Internal(_) => ("api_error", "internal_error"),
            ServeError::SessionNotFound(_) => ("invalid_request_error", "not_found"),
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
        (self.status(), axum::Json(self.body())).into_response()
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
