//! The paths the proxy answers, and which handler each goes to. Layers
//! (auth, body limit, metrics) are in [`router`](crate::router).

use axum::Router;
use axum::routing::{any, get, post};

use crate::handlers::{chat, messages, ops, passthrough, responses, ui};
use crate::state::AppState;

pub use crate::paths::*;

/// The routes, without layers.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(CHAT_COMPLETIONS, post(chat::chat_completions))
        .route(MESSAGES, post(messages::messages))
        .route(MESSAGES_COUNT_TOKENS, post(messages::count_tokens))
        .route(RESPONSES, post(responses::responses))
        .route(V1_ANY, any(passthrough::passthrough))
        .route(HEALTHZ, get(ops::healthz))
        .route(METRICS, get(ops::metrics))
        .route(SESSION, get(ops::session_status))
        .route(UI, get(ui::page))
        .route(UI_OVERVIEW, get(ui::overview))
        .route(UI_SESSIONS, get(ui::sessions))
        .route(UI_SESSION, get(ui::session))
        .route(UI_COMPACTIONS, get(ui::compactions))
        .route(UI_SEARCH, get(ui::search))
        .route(UI_REQUEST, get(ui::request))
}
