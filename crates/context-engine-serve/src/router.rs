//! The layers around the routes, outermost first: request metrics and
//! logs, the edge's site rule ([`edge::guard`]), the access token, the
//! body read under its limits and the in-flight budget
//! ([`edge::read_body`]). Paths are in [`routes`](crate::routes).

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::AppState;
use crate::edge;
use crate::error::ServeError;
use crate::routes::{UNAUTHENTICATED, routes};

/// The header a client may carry the proxy's access token in, so that its
/// own `Authorization` still goes upstream.
pub const TOKEN_HEADER: &str = "x-ctx-token";

/// Set on a request whose `Authorization` header carried the proxy's own
/// access token: it must not go upstream.
#[derive(Clone, Copy, Debug)]
pub struct AuthorizationConsumed;

/// The whole application: routes and layers, ready to serve or to call in
/// tests with `tower::ServiceExt::oneshot`.
pub fn app(state: AppState) -> Router {
    let limit = state.options().max_body_bytes;
    routes()
        .layer(middleware::from_fn_with_state(
            state.clone(),
            edge::read_body,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), edge::guard))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// [`app`] without the edge's layers (site rule, body read, in-flight
/// budget): only for the load benchmark's comparison of their cost.
#[doc(hidden)]
pub fn app_without_edge(state: AppState) -> Router {
    let limit = state.options().max_body_bytes;
    routes()
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The access token, when one is configured: from `x-ctx-token`, else a
/// bearer `Authorization` (which is then not forwarded). Compared in
/// constant time (digests of equal length).
async fn auth(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let Some(expected) = state.token_digest() else {
        return next.run(req).await;
    };
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    if path
        .as_deref()
        .is_some_and(|p| UNAUTHENTICATED.contains(&p))
    {
        return next.run(req).await;
    }
    match presented(req.headers()) {
        Some((token, via_authorization)) if bool::from(digest(token).ct_eq(expected)) => {
            if via_authorization {
                req.extensions_mut().insert(AuthorizationConsumed);
            }
            next.run(req).await
        }
        _ => ServeError::Unauthorized.into_response(),
    }
}

/// The token a request presents and whether it came in `Authorization`.
fn presented(headers: &HeaderMap) -> Option<(&[u8], bool)> {
    if let Some(v) = headers.get(TOKEN_HEADER) {
        return Some((v.as_bytes(), false));
    }
    let v = headers.get(AUTHORIZATION)?.as_bytes();
    let token = v
        .strip_prefix(b"Bearer ")
        .or_else(|| v.strip_prefix(b"bearer "))?;
    Some((token, true))
}

/// SHA-256 of a token: what is kept and compared, never the token.
pub(crate) fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// Counts every response by route and status, and logs it (no bodies, no
/// headers).
async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().clone();
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    let status = response.status().as_u16();
    state.metrics().request(&route, status);
    tracing::debug!(%method, route, status, elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "request");
    response
}
