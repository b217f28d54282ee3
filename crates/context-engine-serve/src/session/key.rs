//! Which session a request belongs to.
//!
//! In order: the `x-ctx-session` header; else a known client's own session
//! id (the `session_id` header Codex CLI sends, `x-session-id`, or the
//! body's `metadata.session_id`, or its `prompt_cache_key`); else a hash of
//! the first system (or developer) message, the tool names and the first
//! user message. Every key is scoped by the request's
//! [`Identity`](crate::identity::Identity), so two identities never share
//! a session even with the same id (or the same fallback hash); anonymous
//! requests share the scope `-`, and so never read an archive.
//!
//! The fallback collides when two conversations start identically (same
//! system prompt, tools and first user message, e.g. one task run twice in
//! parallel): the hash chain then sees each as a divergence of the other
//! and starts a new lineage on every switch, never mixing them but losing
//! their compaction. Clients that can should send `x-ctx-session`.

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::body::ChatBody;
use crate::identity::Identity;

/// The header a client names its session with.
pub const SESSION_HEADER: &str = "x-ctx-session";

/// Headers other clients carry their own session id in.
const CLIENT_SESSION_HEADERS: &[&str] = &["session_id", "x-session-id"];

/// Where a session key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// `x-ctx-session`.
    Header,
    /// A known client's session header or body field.
    Client,
    /// The hash of the conversation's start.
    Fallback,
}

/// A session's key: the identity's scope and the id within it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey {
    /// [`Identity::scope`]: `-` for anonymous requests.
    pub scope: String,
    /// The session id (the client's, or a hash).
    pub id: String,
}

/// The session key of a chat request of `identity`.
pub fn session_key(
    identity: &Identity,
    headers: &HeaderMap,
    body: &ChatBody<'_>,
) -> (SessionKey, KeySource) {
    let scope = identity.scope();
    if let Some(id) = header_str(headers, SESSION_HEADER) {
        return (SessionKey { scope, id }, KeySource::Header);
    }
    if let Some(id) = CLIENT_SESSION_HEADERS
        .iter()
        .find_map(|h| header_str(headers, h))
        .or_else(|| body_session(body))
    {
        return (SessionKey { scope, id }, KeySource::Client);
    }
    (
        SessionKey {
            scope,
            id: fallback_id(body),
        },
        KeySource::Fallback,
    )
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    let v = headers.get(name)?.to_str().ok()?.trim();
    (!v.is_empty() && v.len() <= 256).then(|| v.to_owned())
}

fn body_session(body: &ChatBody<'_>) -> Option<String> {
    #[derive(Deserialize)]
    struct Metadata {
        session_id: Option<String>,
    }
    let from_metadata = body
        .field("metadata")
        .and_then(|raw| serde_json::from_str::<Metadata>(raw.get()).ok())
        .and_then(|m| m.session_id);
    let id = from_metadata.or_else(|| {
        body.field("prompt_cache_key")
            .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
    })?;
    let id = id.trim();
    (!id.is_empty() && id.len() <= 256).then(|| id.to_owned())
}

/// SHA-256 of the first system/developer message, the tool names and the
/// first user message (each as the client wrote it), 32 hex digits.
fn fallback_id(body: &ChatBody<'_>) -> String {
    #[derive(Deserialize)]
    struct RoleOnly<'a> {
        #[serde(borrow)]
        role: Option<std::borrow::Cow<'a, str>>,
    }
    let mut hasher = Sha256::new();
    let (mut system, mut user): (Option<&RawValue>, Option<&RawValue>) = (None, None);
    for m in body.messages() {
        let role = serde_json::from_str::<RoleOnly<'_>>(m.get())
            .ok()
            .and_then(|r| r.role);
        match role.as_deref() {
            Some("system" | "developer") if system.is_none() => system = Some(m),
            Some("user") if user.is_none() => user = Some(m),
            _ => {}
        }
        if user.is_some() {
            break;
        }
    }
    hasher.update(b"system\0");
    hasher.update(system.map_or("", |m| m.get()).as_bytes());
    hasher.update(b"\0tools\0");
    for name in tool_names(body) {
        hasher.update(name.as_bytes());
        hasher.update(b"\0");
    }
    hasher.update(b"user\0");
    hasher.update(user.map_or("", |m| m.get()).as_bytes());
    hex(&hasher.finalize()[..16])
}

/// The function names of the request's `tools`.
pub fn tool_names(body: &ChatBody<'_>) -> Vec<String> {
    #[derive(Deserialize)]
    struct Function {
        name: Option<String>,
    }
    #[derive(Deserialize)]
    struct Tool {
        function: Option<Function>,
        name: Option<String>,
    }
    body.field("tools")
        .and_then(|raw| serde_json::from_str::<Vec<Tool>>(raw.get()).ok())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|t| t.function.and_then(|f| f.name).or(t.name))
        .collect()
}

/// Headers Claude Code and Codex carry their session (or thread) id in.
const FRONT_SESSION_HEADERS: &[&str] = &[
    "x-claude-code-session-id",
    "session-id",
    "session_id",
    "thread-id",
    "x-session-id",
];

/// The session key of an Anthropic Messages or Responses request: the
/// `x-ctx-session` header; else the client's own session header
/// (`X-Claude-Code-Session-Id`; Codex's `session-id` / `thread-id`); else
/// the body's `metadata.user_id` (Claude Code writes a JSON object with its
/// `session_id` there) or `prompt_cache_key` (Codex); else a hash of the
/// conversation's start, as for chat.
///
/// Only the fields named are read from `body` (a request of format
/// `kind`); the conversation is read whole only for the fallback.
pub fn front_session_key(
    identity: &Identity,
    headers: &HeaderMap,
    kind: context_engine::front::FrontKind,
    body: &ChatBody<'_>,
) -> (SessionKey, KeySource) {
    use context_engine::front::{FrontCache, FrontRequest};
    let scope = identity.scope();
    if let Some(id) = header_str(headers, SESSION_HEADER) {
        return (SessionKey { scope, id }, KeySource::Header);
    }
    let field = |name: &str| -> Option<serde_json::Value> {
        serde_json::from_str(body.field(name)?.get()).ok()
    };
    let from_body = || {
        let metadata = field("metadata");
        let user_id = metadata
            .as_ref()
            .and_then(|m| m.get("user_id"))
            .and_then(serde_json::Value::as_str);
        let id = match user_id {
            Some(u) => serde_json::from_str::<serde_json::Value>(u)
                .ok()
                .and_then(|v| v.get("session_id")?.as_str().map(str::to_owned))
                .unwrap_or_else(|| u.to_owned()),
            None => field("prompt_cache_key")?.as_str()?.to_owned(),
        };
        let id = id.trim();
        (!id.is_empty() && id.len() <= 256).then(|| id.to_owned())
    };
    if let Some(id) = FRONT_SESSION_HEADERS
        .iter()
        .find_map(|h| header_str(headers, h))
        .or_else(from_body)
    {
        return (SessionKey { scope, id }, KeySource::Client);
    }
    let mut hasher = Sha256::new();
    hasher.update(kind.name().as_bytes());
    let request = FrontRequest::parse_fields(kind, &body.fields(), &mut FrontCache::default());
    let chat = request.as_ref().map(FrontRequest::chat).unwrap_or_default();
    let system = chat.iter().find(|m| {
        matches!(
            m.role,
            context_engine::message::Role::System | context_engine::message::Role::Developer
        )
    });
    let user = chat
        .iter()
        .find(|m| m.role == context_engine::message::Role::User);
    for m in [system, user] {
        hasher.update(b"\0");
        if let Some(m) = m {
            hasher.update(m.content.text().as_bytes());
        }
    }
    if let Some(serde_json::Value::Array(tools)) = field("tools") {
        for t in tools {
            if let Some(name) = t.get("name").and_then(serde_json::Value::as_str) {
                hasher.update(b"\0");
                hasher.update(name.as_bytes());
            }
        }
    }
    (
        SessionKey {
            scope,
            id: hex(&hasher.finalize()[..16]),
        },
        KeySource::Fallback,
    )
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn key(headers: &HeaderMap, body: &str) -> (SessionKey, KeySource) {
        let identity = Identity::of(headers, &crate::identity::Rules::default());
        session_key(
            &identity,
            headers,
            &ChatBody::parse(body.as_bytes()).unwrap(),
        )
    }

    #[test]
    fn precedence_and_scope() {
        let body = r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"metadata":{"session_id":"m1"}}"#;
        let mut h = HeaderMap::new();
        assert_eq!(key(&h, body).0.id, "m1");
        assert_eq!(key(&h, body).1, KeySource::Client);
        h.insert("session_id", HeaderValue::from_static("codex-1"));
        assert_eq!(key(&h, body).0.id, "codex-1");
        h.insert(SESSION_HEADER, HeaderValue::from_static("mine"));
        assert_eq!(
            key(&h, body),
            (
                SessionKey {
                    scope: "-".into(),
                    id: "mine".into()
                },
                KeySource::Header
            )
        );
        let mut a = h.clone();
        a.insert("authorization", HeaderValue::from_static("Bearer a"));
        let mut b = h.clone();
        b.insert("authorization", HeaderValue::from_static("Bearer b"));
        assert_ne!(
            key(&a, body).0,
            key(&b, body).0,
            "tenants never share a session"
        );
        assert_eq!(key(&a, body).0.id, key(&b, body).0.id);
    }

    #[test]
    fn fallback_hashes_the_start_only() {
        let h = HeaderMap::new();
        let a = r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"bash"}}]}"#;
        let longer = r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"x"}],"tools":[{"type":"function","function":{"name":"bash"}}]}"#;
        let other_tools = r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"edit"}}]}"#;
        let other_user =
            r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"v"}]}"#;
        assert_eq!(key(&h, a).1, KeySource::Fallback);
        assert_eq!(key(&h, a).0, key(&h, longer).0);
        assert_ne!(key(&h, a).0, key(&h, other_tools).0);
        assert_ne!(key(&h, a).0, key(&h, other_user).0);
    }
}
