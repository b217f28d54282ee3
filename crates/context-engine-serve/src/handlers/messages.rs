//! `POST /v1/messages` (Anthropic Messages, Claude Code) and
//! `POST /v1/messages/count_tokens`, managed through the one pipeline
//! ([`managed`](super::managed)).

use axum::body::Bytes;
use axum::extract::{MatchedPath, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use context_engine::front::FrontKind;

use crate::handlers::count_tokens;
use crate::handlers::managed::{self, Call};
use crate::identity::Identity;
use crate::session::requests::Wire;
use crate::state::AppState;

/// `POST /v1/messages`: forwarded to `{upstream}/messages`, streamed as
/// Anthropic events or not, as the client asked.
pub async fn messages(
    State(state): State<AppState>,
    route: MatchedPath,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let call = Call {
        api: Wire::Front(FrontKind::Anthropic),
        route: route.as_str().to_owned(),
    };
    managed::spawn(state, call, identity, uri, headers, body).await
}

/// `POST /v1/messages/count_tokens`: counted upstream on the managed
/// request.
pub async fn count_tokens(
    State(state): State<AppState>,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    count_tokens::count_tokens(state, identity, uri, headers, body).await
}
