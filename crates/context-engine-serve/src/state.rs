//! What every handler shares: [`AppState`].

use std::sync::Arc;

use crate::edge;
use crate::error::StartError;
use crate::identity;
use crate::metrics::Metrics;
use crate::options::ServeOptions;
use crate::session::{SessionContext, Sessions};
use crate::token;
use crate::upstream::Upstream;

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
        options.check_identity()?;
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

impl axum::extract::FromRequestParts<AppState> for identity::Identity {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<identity::Identity, std::convert::Infallible> {
        let options = state.options();
        let route = parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .map(axum::extract::MatchedPath::as_str);
        let rules = identity::Rules {
            proxy_token: state.token_digest(),
            identity_header: options.identity_header.as_ref(),
            provider_key: options.upstream.api_key.is_some(),
            api: crate::identity::Api::of_route(route),
        };
        Ok(identity::Identity::of(&parts.headers, &rules))
    }
}
