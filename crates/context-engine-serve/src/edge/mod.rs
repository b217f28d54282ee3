//! The proxy's edge: what a request must be before anything reaches the
//! upstream or the engine. The rules are here; the router applies them as
//! two of its layers ([`router::app`](crate::router::app)):
//!
//! - the site rule ([`site`]: allowed `Host`, no browser cross-site
//!   request, JSON bodies) on the routes that reach upstream;
//! - the body read whole within its size limit and its deadline, its
//!   bytes taken from the in-flight budget ([`budget`]) and held until the
//!   response has been sent, body included ([`body`], [`hold_until_done`]).
//!
//! The passthrough's path rule is [`path`]; connection timeouts and
//! `TCP_NODELAY` are in [`accept`](crate::accept).

pub mod body;
pub mod budget;
pub mod path;
pub mod site;

use axum::response::Response;
use http_body_util::BodyExt;

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
