//! The proxy's access token: the header a client may carry it in, where
//! else it may come ([`presented`]), which headers carry it ([`carries`],
//! [`strip`]: never sent upstream, never an identity), and its digest, the
//! only form of it the proxy keeps and compares. The check itself is a
//! layer of the router ([`router`](crate::router)); who a request is, is
//! [`identity`](crate::identity)'s.

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The header a client may carry the proxy's access token in, so that its
/// own `Authorization` still goes upstream.
pub const TOKEN_HEADER: &str = "x-ctx-token";

/// Headers a client carries a credential in: its own provider key, or the
/// proxy's access token.
pub const CREDENTIAL_HEADERS: &[&str] = &["authorization", "api-key", "x-api-key"];

/// The token a request presents: from `x-ctx-token`, else an
/// `Authorization` of the `Bearer` scheme (any case, any spacing).
pub fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(TOKEN_HEADER) {
        return Some(v.as_bytes());
    }
    let (scheme, token) = split_scheme(headers.get(AUTHORIZATION)?.as_bytes());
    scheme
        .filter(|s| s.eq_ignore_ascii_case(b"bearer"))
        .map(|_| token)
}

/// A credential header's value as scheme and credential: `Bearer  abc`
/// is (`Bearer`, `abc`); a value of one word is no scheme and that word.
/// Spaces and tabs around each part are not part of it.
pub fn split_scheme(value: &[u8]) -> (Option<&[u8]>, &[u8]) {
    let value = value.trim_ascii();
    match value.iter().position(|b| *b == b' ' || *b == b'\t') {
        Some(at) => (Some(&value[..at]), value[at..].trim_ascii()),
        None => (None, value),
    }
}

/// Whether the header value `v` carries the proxy's access token: whole,
/// or after a scheme of any name, case and spacing. Compared in constant
/// time (digests of equal length).
pub fn carries(v: &[u8], token: &[u8; 32]) -> bool {
    let (_, credential) = split_scheme(v);
    [credential, v.trim_ascii(), v]
        .iter()
        .fold(false, |found, c| found | matches(c, token))
}

fn matches(candidate: &[u8], token: &[u8; 32]) -> bool {
    bool::from(Sha256::digest(candidate).as_slice().ct_eq(token.as_slice()))
}

/// Removes from `headers` every credential header value that carries the
/// proxy's access token (see [`carries`]), and `x-ctx-token`: what is left
/// may go upstream and may name an identity.
pub fn strip(headers: &mut HeaderMap, token: &[u8; 32]) {
    headers.remove(TOKEN_HEADER);
    for name in CREDENTIAL_HEADERS {
        let name = HeaderName::from_static(name);
        if !headers
            .get_all(&name)
            .iter()
            .any(|v| carries(v.as_bytes(), token))
        {
            continue;
        }
        let kept: Vec<HeaderValue> = headers
            .get_all(&name)
            .iter()
            .filter(|v| !carries(v.as_bytes(), token))
            .cloned()
            .collect();
        headers.remove(&name);
        for v in kept {
            headers.append(name.clone(), v);
        }
    }
}

/// SHA-256 of a token: what is kept and compared, never the token.
pub fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_found_in_any_scheme_case_and_spacing() {
        let token = digest(b"team");
        for v in [
            "team",
            " team ",
            "Bearer team",
            "BEARER team",
            "bearer\tteam",
            "Bearer  team",
            "Token team",
            "Basic team",
        ] {
            assert!(carries(v.as_bytes(), &token), "{v:?}");
        }
        for v in ["teams", "Bearer sk-a", "Bearer team x", ""] {
            assert!(!carries(v.as_bytes(), &token), "{v:?}");
        }
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("BEARER  team"));
        assert_eq!(presented(&h), Some(&b"team"[..]));
        h.insert("authorization", HeaderValue::from_static("Token team"));
        assert_eq!(presented(&h), None);
    }

    #[test]
    fn strip_leaves_only_what_does_not_carry_the_token() {
        let token = digest(b"team");
        let mut h = HeaderMap::new();
        h.insert("x-ctx-token", HeaderValue::from_static("team"));
        h.insert("authorization", HeaderValue::from_static("Token team"));
        h.insert("x-api-key", HeaderValue::from_static("team"));
        h.append("api-key", HeaderValue::from_static("own-key"));
        h.append("api-key", HeaderValue::from_static(" team"));
        strip(&mut h, &token);
        assert!(h.get("x-ctx-token").is_none());
        assert!(h.get("authorization").is_none() && h.get("x-api-key").is_none());
        let kept: Vec<_> = h.get_all("api-key").iter().collect();
        assert_eq!(kept, ["own-key"]);
    }
}
