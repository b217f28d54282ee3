//! The proxy's edge: what a request must be before anything reaches the
//! upstream or the engine, as two layers of the router
//! ([`router::app`](crate::router::app)).
//!
//! - [`guard`]: the site rule ([`site`]: allowed `Host`, no browser
//!   cross-site request, JSON bodies) on the routes that reach upstream.
//! - [`read_body`]: the body read whole within its size limit and its
//!   deadline, its bytes taken from the in-flight budget ([`budget`]) and
//!   held until the response has been sent, body included ([`body`]).
//!
//! The passthrough's path rule is [`path`]; connection timeouts and
//! `TCP_NODELAY` are in [`accept`](crate::accept).

pub mod body;
pub mod budget;
pub mod path;
pub mod site;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::http::header::CONTENT_LENGTH;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use crate::AppState;
use crate::accept::LocalAddr;
use crate::routes;
use site::RouteKind;

/// The site rule, on the routes that reach upstream.
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let kind = match req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
    {
        // A managed route answers only POST (405 otherwise).
        Some(p) if routes::MANAGED.contains(&p) && req.method() == Method::POST => {
            RouteKind::Managed
        }
        Some(p) if routes::MANAGED.contains(&p) => RouteKind::Passthrough,
        Some(routes::V1_ANY) => RouteKind::Passthrough,
        _ => return next.run(req).await,
    };
    let local = req.extensions().get::<LocalAddr>().map(|l| l.0.ip());
    if let Err(e) = site::check(state.allowed_hosts(), req.headers(), req.uri(), local, kind) {
        return e.into_response();
    }
    next.run(req).await
}

/// Reads the body whole under the limits and the in-flight budget, and
/// holds its bytes until the response is done.
pub async fn read_body(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let limits = body::Limits {
        max_bytes: state.options().max_body_bytes,
        timeout: state.options().body_read_timeout,
    };
    match body::read(body, declared, limits, state.inflight()).await {
        Ok((bytes, permit)) => {
            let req = Request::from_parts(parts, axum::body::Body::from(bytes));
            hold_until_done(next.run(req).await, permit)
        }
        Err(e) => e.into_response(),
    }
}

/// `response` with `held` dropped only when its body has been sent (or
/// dropped): a streamed answer keeps it to its end.
pub fn hold_until_done<T: Send + Sync + 'static>(response: Response, held: T) -> Response {
    response.map(|body| {
        axum::body::Body::new(body.map_frame(move |frame| {
            let _ = &held;
            frame
        }))
    })
}
