//! Every `/v1/*` path but the managed ones: forwarded unchanged (method,
//! query, headers less hop-by-hop and `x-ctx-*`, body), the answer streamed
//! back as it comes; a path that would leave the upstream's base path is
//! refused (400).

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};

use crate::handlers::respond;
use crate::state::AppState;
use crate::upstream::response_headers;

/// `ANY /v1/{*rest}`.
pub async fn passthrough(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let rest = uri.path().strip_prefix("/v1").unwrap_or(uri.path());
    let url = match state.upstream().passthrough_url(rest, uri.query()) {
        Ok(url) => url,
        Err(e) => return e.into_response(),
    };
    let out_headers = state.upstream().headers(&headers, false);
    forward(&state, method, &url, out_headers, body).await
}

/// Sends `body` to `url` and streams the answer back as it comes.
pub(crate) async fn forward(
    state: &AppState,
    method: Method,
    url: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match state
        .upstream()
        .send(method, url, headers, body, true)
        .await
    {
        Ok(resp) => {
            let status = resp.status();
            let headers = response_headers(resp.headers());
            respond(status, headers, Body::from_stream(resp.bytes_stream()))
        }
        Err(e) => e.into_response(),
    }
}
