//! Who a request is: the identity its sessions are keyed by, and the one
//! rule on who may read an archive.
//!
//! A request's identity is, in order:
//!
//! 1. with `serve.identity_header` configured **and** the proxy's access
//!    token required, the value of that header (set by the operator's
//!    gateway for each user): scope `u` + 16 hex digits of its SHA-256.
//!    Without the access token anyone who reaches the port could claim
//!    any user, so the proxy refuses to start with the header alone
//!    ([`StartError::IdentityHeaderNeedsToken`](crate::error::StartError));
//! 2. else the client's own credential when it goes upstream as it came,
//!    so the provider checks it: the first header the API's provider
//!    authenticates ([`Api::credential_headers`]: on Anthropic Messages
//!    `x-api-key`, then `Authorization`; elsewhere `Authorization`,
//!    `api-key`, `x-api-key`) that holds one: 16 hex digits of the SHA-256
//!    of the header's value (the scope the proxy always used, so stored
//!    sessions stay reachable). Not a credential: an empty value, a bare
//!    scheme (`Authorization: Bearer `, one word), the proxy's own access
//!    token in any scheme, case or spacing (a team token every user
//!    shares; the auth layer removed it already, [`token::strip`]), nor
//!    anything when the proxy replaces the client's key with its own
//!    provider key (nobody checks it then);
//! 3. else none: [`Identity::Anonymous`], scope `-`.
//!
//! Sessions are keyed by (identity, session id). An anonymous request is
//! still managed (digest, prune, compaction), but it can never read an
//! archive: the engine tools are not offered to it, their calls are never
//! resolved for it, and its session status is refused. The proof that a
//! request may read is a [`Reader`], which only [`Identity::reader`]
//! makes; the tool offers take one.

use axum::http::{HeaderMap, HeaderName, header};
use sha2::{Digest, Sha256};

use crate::paths::{MESSAGES, MESSAGES_COUNT_TOKENS};
use crate::token::{self, CREDENTIAL_HEADERS, TOKEN_HEADER, split_scheme};

/// Longest identity header value read, in bytes.
const MAX_IDENTITY_BYTES: usize = 256;

/// Who a request is (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// No identity: managed, never reads an archive.
    Anonymous,
    /// The client's own credential: 16 hex digits of its SHA-256.
    Credential(String),
    /// The user the operator's gateway named: `u` + 16 hex digits of the
    /// SHA-256 of the header's value.
    User(String),
}

/// A request whose identity may read its own sessions' archives: made only
/// by [`Identity::reader`].
#[derive(Clone, Copy, Debug)]
pub struct Reader(());

/// Which provider API a request is for: what its provider authenticates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Api {
    /// OpenAI chat completions, Responses, every other path and the page.
    #[default]
    OpenAi,
    /// Anthropic Messages (`/v1/messages`, its `count_tokens`).
    Anthropic,
}

impl Api {
    /// The API of a request on the route `route`.
    pub fn of_route(route: Option<&str>) -> Api {
        match route {
            Some(MESSAGES | MESSAGES_COUNT_TOKENS) => Api::Anthropic,
            _ => Api::OpenAi,
        }
    }

    /// The headers the API's provider authenticates, in the order it
    /// reads them.
    pub fn credential_headers(self) -> &'static [&'static str] {
        match self {
            Api::OpenAi => CREDENTIAL_HEADERS,
            Api::Anthropic => &["x-api-key", "authorization"],
        }
    }
}

/// What decides a request's identity: the proxy's configuration and the
/// request's API.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rules<'a> {
    /// SHA-256 of the proxy's access token, when one is required.
    pub proxy_token: Option<&'a [u8; 32]>,
    /// The trusted per-user header (`serve.identity_header`); honoured only
    /// with `proxy_token`.
    pub identity_header: Option<&'a HeaderName>,
    /// Whether the proxy sends its own provider key upstream instead of
    /// the client's.
    pub provider_key: bool,
    /// The request's API.
    pub api: Api,
}

impl Identity {
    /// The identity of a request with `headers` under `rules`.
    pub fn of(headers: &HeaderMap, rules: &Rules<'_>) -> Identity {
        if let (Some(name), Some(_)) = (rules.identity_header, rules.proxy_token)
            && let Some(value) = headers.get(name)
        {
            let value = value.as_bytes().trim_ascii();
            if !value.is_empty() && value.len() <= MAX_IDENTITY_BYTES {
                let mut h = Sha256::new();
                h.update(b"identity-header\0");
                h.update(value);
                return Identity::User(format!("u{}", hex(&h.finalize()[..8])));
            }
        }
        if rules.provider_key {
            return Identity::Anonymous;
        }
        let credential = rules
            .api
            .credential_headers()
            .iter()
            .filter_map(|h| headers.get(*h).map(|v| (*h, v.as_bytes())))
            .find(|(name, v)| {
                holds_credential(name, v)
                    && !rules.proxy_token.is_some_and(|t| token::carries(v, t))
            })
            .map(|(_, v)| v);
        match credential {
            Some(c) => Identity::Credential(hex(&Sha256::digest(c)[..8])),
            None => Identity::Anonymous,
        }
    }

    /// The scope sessions of this identity are keyed (and stored) under:
    /// `-` when anonymous.
    pub fn scope(&self) -> String {
        match self {
            Identity::Anonymous => "-".to_owned(),
            Identity::Credential(s) | Identity::User(s) => s.clone(),
        }
    }

    /// The proof that this identity may read its archives; `None` when
    /// anonymous.
    pub fn reader(&self) -> Option<Reader> {
        match self {
            Identity::Anonymous => None,
            Identity::Credential(_) | Identity::User(_) => Some(Reader(())),
        }
    }
}

/// Whether the value `v` of the credential header `name` holds a
/// credential: `Authorization` a scheme and something after it, a key
/// header something that is not empty nor a scheme's name alone.
fn holds_credential(name: &str, v: &[u8]) -> bool {
    match split_scheme(v) {
        (Some(_), credential) => name != "authorization" || !credential.is_empty(),
        (None, word) => {
            name != "authorization"
                && !word.is_empty()
                && !word.eq_ignore_ascii_case(b"bearer")
                && !word.eq_ignore_ascii_case(b"basic")
        }
    }
}

/// Whether `name` may be the trusted identity header: not a credential,
/// not the proxy's own headers, not one every client sends.
pub fn usable_identity_header(name: &HeaderName) -> bool {
    !CREDENTIAL_HEADERS.contains(&name.as_str())
        && name.as_str() != TOKEN_HEADER
        && !name.as_str().starts_with("x-ctx-")
        && ![
            header::HOST,
            header::CONTENT_TYPE,
            header::CONTENT_LENGTH,
            header::USER_AGENT,
            header::COOKIE,
        ]
        .contains(name)
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

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn a_credential_is_an_identity_the_team_token_is_not() {
        let token = Sha256::digest(b"team").into();
        let rules = Rules {
            proxy_token: Some(&token),
            ..Rules::default()
        };
        let none = Rules::default();
        assert_eq!(Identity::of(&headers(&[]), &none), Identity::Anonymous);
        let a = Identity::of(&headers(&[("authorization", "Bearer sk-a")]), &none);
        let b = Identity::of(&headers(&[("x-api-key", "sk-b")]), &none);
        assert!(matches!(a, Identity::Credential(_)) && a != b);
        // The scope of a credential is what it always was: stored sessions
        // stay reachable.
        assert_eq!(a.scope(), hex(&Sha256::digest(b"Bearer sk-a")[..8]));
        for shared in [
            &[("authorization", "Bearer team")][..],
            &[("x-ctx-token", "team"), ("x-api-key", "team")],
            &[("authorization", "team")],
        ] {
            let id = Identity::of(&headers(shared), &rules);
            assert_eq!(id, Identity::Anonymous, "{shared:?}");
            assert!(id.reader().is_none());
            assert_eq!(id.scope(), "-");
        }
        // The team token in x-ctx-token, the client's own key upstream.
        let own = Identity::of(
            &headers(&[("x-ctx-token", "team"), ("authorization", "Bearer sk-a")]),
            &rules,
        );
        assert_eq!(own, a);
        // The team token in Authorization, the client's own key in
        // x-api-key: the key is the identity.
        let beside = Identity::of(
            &headers(&[("authorization", "Bearer team"), ("x-api-key", "sk-b")]),
            &rules,
        );
        assert_eq!(beside, b);
        // A key the proxy replaces with its own is checked by nobody.
        let replaced = Rules {
            provider_key: true,
            ..rules
        };
        assert_eq!(
            Identity::of(&headers(&[("authorization", "Bearer sk-a")]), &replaced),
            Identity::Anonymous
        );
    }

    #[test]
    fn the_token_in_any_form_is_no_identity() {
        let token = Sha256::digest(b"team").into();
        let rules = Rules {
            proxy_token: Some(&token),
            ..Rules::default()
        };
        for api in [Api::OpenAi, Api::Anthropic] {
            let rules = Rules { api, ..rules };
            for shared in [
                &[("authorization", "BEARER team")][..],
                &[("authorization", "Bearer  team")],
                &[("authorization", "Token team")],
                &[("authorization", "bearer\tteam ")],
                &[("x-api-key", "team")],
                &[("api-key", "Bearer team")],
            ] {
                let id = Identity::of(&headers(shared), &rules);
                assert_eq!(id, Identity::Anonymous, "{api:?} {shared:?}");
            }
        }
    }

    #[test]
    fn no_credential_is_no_identity() {
        for api in [Api::OpenAi, Api::Anthropic] {
            let rules = Rules {
                api,
                ..Rules::default()
            };
            for empty in [
                &[("authorization", "Bearer ")][..],
                &[("authorization", "Bearer")],
                &[("authorization", "bearer  ")],
                &[("authorization", "Basic")],
                &[("authorization", "")],
                &[("x-api-key", "")],
                &[("x-api-key", "  ")],
                &[("api-key", "Bearer ")],
                &[("authorization", "Bearer "), ("x-api-key", "")],
            ] {
                let id = Identity::of(&headers(empty), &rules);
                assert_eq!(id, Identity::Anonymous, "{api:?} {empty:?}");
            }
        }
    }

    #[test]
    fn each_api_names_the_caller_by_what_its_provider_authenticates() {
        let both = headers(&[("authorization", "Bearer sk-a"), ("x-api-key", "sk-b")]);
        let openai = Identity::of(&both, &Rules::default());
        let anthropic = Identity::of(
            &both,
            &Rules {
                api: Api::Anthropic,
                ..Rules::default()
            },
        );
        assert_eq!(openai.scope(), hex(&Sha256::digest(b"Bearer sk-a")[..8]));
        assert_eq!(anthropic.scope(), hex(&Sha256::digest(b"sk-b")[..8]));
        // No key: Anthropic takes the bearer token.
        let bearer = headers(&[("authorization", "Bearer sk-a")]);
        let rules = Rules {
            api: Api::Anthropic,
            ..Rules::default()
        };
        assert_eq!(Identity::of(&bearer, &rules), openai);
        // Azure's api-key is no Anthropic credential.
        assert_eq!(
            Identity::of(&headers(&[("api-key", "sk-c")]), &rules),
            Identity::Anonymous
        );
        assert_eq!(Api::of_route(Some(MESSAGES)), Api::Anthropic);
        assert_eq!(Api::of_route(Some("/v1/chat/completions")), Api::OpenAi);
    }

    #[test]
    fn the_identity_header_counts_only_behind_the_access_token() {
        let token = Sha256::digest(b"team").into();
        let name = HeaderName::from_static("x-user");
        let rules = Rules {
            proxy_token: Some(&token),
            identity_header: Some(&name),
            provider_key: true,
            ..Rules::default()
        };
        let alice = Identity::of(
            &headers(&[("authorization", "Bearer team"), ("x-user", "alice")]),
            &rules,
        );
        let bob = Identity::of(
            &headers(&[("authorization", "Bearer team"), ("x-user", "bob")]),
            &rules,
        );
        assert!(matches!(alice, Identity::User(_)) && alice != bob);
        assert!(alice.scope().starts_with('u') && alice.reader().is_some());
        assert_eq!(
            Identity::of(&headers(&[("authorization", "Bearer team")]), &rules),
            Identity::Anonymous
        );
        let open = Rules {
            proxy_token: None,
            ..rules
        };
        assert_eq!(
            Identity::of(&headers(&[("x-user", "alice")]), &open),
            Identity::Anonymous
        );
        assert!(!usable_identity_header(&HeaderName::from_static(
            "authorization"
        )));
        assert!(!usable_identity_header(&HeaderName::from_static(
            "x-ctx-session"
        )));
        assert!(usable_identity_header(&name));
    }
}
