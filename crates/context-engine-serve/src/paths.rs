//! The paths the proxy answers, by name: what every module may name
//! without the handlers ([`routes`](crate::routes) maps them to those).

/// OpenAI chat completions, managed by the engine.
pub const CHAT_COMPLETIONS: &str = "/v1/chat/completions";
/// Anthropic Messages, managed by the engine.
pub const MESSAGES: &str = "/v1/messages";
/// Anthropic token counting, answered for the managed request.
pub const MESSAGES_COUNT_TOKENS: &str = "/v1/messages/count_tokens";
/// OpenAI Responses, managed by the engine.
pub const RESPONSES: &str = "/v1/responses";
/// Every other OpenAI path, passed through unchanged.
pub const V1_ANY: &str = "/v1/{*rest}";
/// Liveness, never behind auth.
pub const HEALTHZ: &str = "/healthz";
/// Prometheus metrics.
pub const METRICS: &str = "/metrics";
/// One session's engine status.
pub const SESSION: &str = "/ctx/sessions/{id}";
/// The live page (no data: it needs no token to load).
pub const UI: &str = "/ui";
/// The page's overview: the proxy's counters.
pub const UI_OVERVIEW: &str = "/ui/api/overview";
/// The caller's sessions.
pub const UI_SESSIONS: &str = "/ui/api/sessions";
/// One session's calls.
pub const UI_SESSION: &str = "/ui/api/sessions/{scope}/{id}";
/// One session's compactions.
pub const UI_COMPACTIONS: &str = "/ui/api/sessions/{scope}/{id}/compactions";
/// One session's archive, searched.
pub const UI_SEARCH: &str = "/ui/api/sessions/{scope}/{id}/search/{query}";
/// The page's view of a call's request of one call.
pub const UI_REQUEST: &str = "/ui/api/sessions/{scope}/{id}/calls/{call}";

/// The managed routes: JSON bodies only (see
/// [`edge::site`](crate::edge::site)).
pub const MANAGED: &[&str] = &[CHAT_COMPLETIONS, MESSAGES, MESSAGES_COUNT_TOKENS, RESPONSES];

/// Paths that need no access token.
pub const UNAUTHENTICATED: &[&str] = &[HEALTHZ, UI];
