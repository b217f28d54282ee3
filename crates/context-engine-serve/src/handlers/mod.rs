//! Request handlers: thin; they parse, call the session driver, and
//! forward through [`upstream`](crate::upstream).

pub mod chat;
pub(crate) mod front;
pub mod messages;
pub mod ops;
pub mod passthrough;
pub mod responses;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;

/// A response from parts (status, upstream headers already filtered).
pub(crate) fn respond(status: StatusCode, headers: axum::http::HeaderMap, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}
