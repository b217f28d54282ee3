//! A call's usage: read from a JSON answer, fed to the metrics.

use context_engine::engine::Usage;

use crate::state::AppState;

/// Feeds a call's usage to the metrics (the session gets it when it is
/// released: [`Sessions::release`](crate::session::Sessions::release)).
pub(crate) fn settle(state: &AppState, usage: &Usage) {
    state
        .metrics()
        .tokens(usage.prompt_tokens, usage.completion_tokens);
    state
        .metrics()
        .cache_tokens(usage.cache_read_tokens, usage.cache_write_tokens);
}

/// The `usage` of a JSON answer.
pub(crate) fn usage_of(bytes: &[u8]) -> Option<Usage> {
    #[derive(serde::Deserialize)]
    struct UsageOnly {
        usage: Option<serde_json::Value>,
    }
    let u = serde_json::from_slice::<UsageOnly>(bytes).ok()?.usage?;
    Usage::from_openai(&u).ok()
}
