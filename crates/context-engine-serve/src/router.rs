//! The layers around the routes, outermost first: request metrics and
//! logs, the edge's site rule ([`edge::site`]), the access token
//! ([`token`](crate::token)), the body read under its limits and the
//! in-flight budget ([`edge::body`], [`edge::budget`]). Paths are in [`routes`](crate::routes).

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::Method;
use axum::http::header::CONTENT_LENGTH;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::accept::LocalAddr;
use crate::edge;
use crate::edge::site::RouteKind;
use crate::error::ServeError;
use crate::routes::{MANAGED, UNAUTHENTICATED, V1_ANY, routes};
use crate::state::AppState;
use crate::token::{digest, presented, strip};

pub use crate::token::TOKEN_HEADER;

/// The whole application: routes and layers, ready to serve or to call in
/// tests with `tower::ServiceExt::oneshot`.
pub fn app(state: AppState) -> Router {
    let limit = state.options().max_body_bytes;
    routes()
        .layer(middleware::from_fn_with_state(state.clone(), read_body))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
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
/// bearer `Authorization`. Compared in constant time (digests of equal
/// length); once it matches, every header carrying it is removed from the
/// request ([`strip`]).
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
        Some(token) if bool::from(digest(token).ct_eq(expected)) => {
            // Past this point the token is in no header: nothing forwards
            // it upstream and nothing takes it for an identity.
            strip(req.headers_mut(), expected);
            next.run(req).await
        }
        _ => ServeError::Unauthorized.into_response(),
    }
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

/// The site rule, on the routes that reach upstream.
async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let kind = match req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
    {
        // A managed route answers only POST (405 otherwise).
        Some(p) if MANAGED.contains(&p) && req.method() == Method::POST => RouteKind::Managed,
        Some(p) if MANAGED.contains(&p) => RouteKind::Passthrough,
        Some(V1_ANY) => RouteKind::Passthrough,
        _ => return next.run(req).await,
    };
    let local = req.extensions().get::<LocalAddr>().map(|l| l.0.ip());
    if let Err(e) = edge::site::check(state.allowed_hosts(), req.headers(), req.uri(), local, kind)
    {
        return e.into_response();
    }
    next.run(req).await
}

/// Reads the body whole under the limits and the in-flight budget, and
/// holds its bytes until the response is done.
async fn read_body(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let limits = edge::body::Limits {
        max_bytes: state.options().max_body_bytes,
        timeout: state.options().body_read_timeout,
    };
    match edge::body::read(body, declared, limits, state.inflight()).await {
        Ok((bytes, permit)) => {
            let req = Request::from_parts(parts, axum::body::Body::from(bytes));
            edge::hold_until_done(next.run(req).await, permit)
        }
        Err(e) => e.into_response(),
    }
}
