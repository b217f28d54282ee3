//! The proxy's access token: the header a client may carry it in, where
//! else it may come ([`presented`]), and its digest, the only form of it
//! the proxy keeps and compares. The check itself is a layer of the
//! router ([`router`](crate::router)); who a request is, is
//! [`identity`](crate::identity)'s.

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};

/// The header a client may carry the proxy's access token in, so that its
/// own `Authorization` still goes upstream.
pub const TOKEN_HEADER: &str = "x-ctx-token";

/// Set on a request whose `Authorization` header carried the proxy's own
/// access token: it must not go upstream.
#[derive(Clone, Copy, Debug)]
pub struct AuthorizationConsumed;

/// The token a request presents and whether it came in `Authorization`:
/// from `x-ctx-token`, else a bearer `Authorization`.
pub fn presented(headers: &HeaderMap) -> Option<(&[u8], bool)> {
    if let Some(v) = headers.get(TOKEN_HEADER) {
        return Some((v.as_bytes(), false));
    }
    let v = headers.get(AUTHORIZATION)?.as_bytes();
    let token = v
        .strip_prefix(b"Bearer ")
        .or_else(|| v.strip_prefix(b"bearer "))?;
    Some((token, true))
}

/// SHA-256 of a token: what is kept and compared, never the token.
pub fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}
