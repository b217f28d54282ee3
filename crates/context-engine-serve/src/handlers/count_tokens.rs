//! `POST /v1/messages/count_tokens`: counted by the upstream on the
//! request the session would send now.

use axum::body::Bytes;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use context_engine::front::{self as lib, FrontCache, FrontKind, FrontRequest};
use serde_json::value::RawValue;

use crate::body::ChatBody;
use crate::error::ServeError;
use crate::handlers::managed;
use crate::identity::Identity;
use crate::session::key::front_session_key;
use crate::state::AppState;

/// `POST /v1/messages/count_tokens`: counted by the upstream on the
/// request the session would send now (its managed history and the
/// client's messages past it), without running the engine or recording
/// anything; the client's own request when the session has not seen its
/// history.
pub(crate) async fn count_tokens(
    state: AppState,
    identity: Identity,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let out_headers = state.upstream().headers(&headers, false);
    let url = managed::upstream_url(&state, &uri);
    let kind = FrontKind::Anthropic;
    let split = match ChatBody::parse_object(&body) {
        Ok(split) => split,
        Err(e @ ServeError::DuplicateKey { .. }) => return e.into_response(),
        Err(_) => return managed::forward(&state, &url, out_headers, body).await,
    };
    let fields = split.fields();
    let items = lib::split_items(kind, &fields);
    let Ok(mut front) =
        FrontRequest::parse_parts(kind, &fields, items.as_deref(), &mut FrontCache::default())
    else {
        return managed::forward(&state, &url, out_headers, body).await;
    };
    let (key, _) = front_session_key(&identity, &headers, kind, &split);
    let mut replace = Vec::new();
    if let Some(slot) = state.sessions().get(&key) {
        let guard = slot.state.lock().await;
        if let Some(m) = guard.as_ref() {
            let refs: Vec<&RawValue> = front.chat_json().iter().map(AsRef::as_ref).collect();
            if let Some(view) = m.peek(&refs) {
                match front.rebuild_with(&view, items.as_deref(), view.len()) {
                    Ok(r) => replace = r.fields,
                    Err(v) => {
                        tracing::debug!(violation = %v, "count_tokens on the client's request")
                    }
                }
            }
        }
    }
    let upstream_body = if replace.is_empty() {
        body.clone()
    } else {
        let borrowed: Vec<(&str, &str)> = replace.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Bytes::from(split.write(&borrowed))
    };
    managed::forward(&state, &url, out_headers, upstream_body).await
}
