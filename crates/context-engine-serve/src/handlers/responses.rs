//! `POST /v1/responses` (OpenAI Responses, Codex), managed through the
//! shared front path ([`front`](super::front)); a request on server-side
//! state (`previous_response_id`) passes through unmanaged.

use axum::body::Bytes;
use axum::extract::{MatchedPath, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use context_engine::front::FrontKind;

use crate::handlers::managed::{self, Call};
use crate::identity::Identity;
use crate::session::requests::Wire;
use crate::state::AppState;

/// `POST /v1/responses`: forwarded to `{upstream}/responses`, streamed as
/// Responses events or not, as the client asked.
pub async fn responses(
    State(state): State<AppState>,
    route: MatchedPath,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let call = Call {
        api: Wire::Front(FrontKind::Responses),
        route: route.as_str().to_owned(),
    };
    managed::spawn(state, call, identity, uri, headers, body).await
}
