//! `POST /v1/chat/completions`, managed through the one pipeline
//! ([`managed`](super::managed)).

use axum::body::Bytes;
use axum::extract::{MatchedPath, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;

use crate::handlers::managed::{self, Call};
use crate::identity::Identity;
use crate::session::requests::Wire;
use crate::state::AppState;

/// `POST /v1/chat/completions`: forwarded to `{upstream}/chat/completions`,
/// streamed or not, as the client asked.
pub async fn chat_completions(
    State(state): State<AppState>,
    route: MatchedPath,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let call = Call {
        api: Wire::Chat,
        route: route.as_str().to_owned(),
    };
    managed::spawn(state, call, identity, uri, headers, body).await
}
