//! Who may drive the proxy: the rule that keeps a web page from spending
//! the proxy's key or the client's session.
//!
//! On every route that reaches upstream:
//! - a `Host` must be an allowed host ([`AllowedHosts`]): loopback names
//!   (`localhost`, `127.0.0.1`, `[::1]`, any port), the listen address,
//!   the address the connection arrived on (an IP literal is never DNS
//!   rebinding: a browser only sends it to that address), and
//!   `serve.allowed_hosts`. A request without `Host` (HTTP/1.0) passes.
//! - a browser's cross-site request is refused: an `Origin` whose host is
//!   not allowed (or `null`), or `Sec-Fetch-Site: cross-site`/`same-site`.
//! - a body must be `application/json` (parameters such as `charset`
//!   allowed); the passthrough also takes `multipart/form-data` (file
//!   uploads) from a non-browser (no `Origin`, no `Sec-Fetch-*`). Managed
//!   routes need the JSON type even on an empty body.
//!
//! Real clients (the OpenAI and Anthropic SDKs, Claude Code, Codex, curl)
//! send `Host: 127.0.0.1:PORT`, no `Origin`, and JSON.

use std::net::IpAddr;
use std::str::FromStr;

use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN, TRANSFER_ENCODING};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, Uri};

use crate::error::{ServeError, StartError};

/// The hosts a request may name (`Host`, `Origin`).
#[derive(Clone, Debug, Default)]
pub struct AllowedHosts {
    listen: Option<IpAddr>,
    entries: Vec<Entry>,
    any: bool,
}

#[derive(Clone, Debug)]
struct Entry {
    /// Lower case, without brackets; for `*.example.com`, `.example.com`.
    host: String,
    wildcard: bool,
    port: Option<u16>,
}

impl AllowedHosts {
    /// The loopback names, `listen` (unless unspecified) and `entries`
    /// (`serve.allowed_hosts`: `name`, `name:port`, `*.domain`, an IP,
    /// `[v6]:port`, or `*` for any host).
    pub fn new(listen: IpAddr, entries: &[String]) -> Result<AllowedHosts, StartError> {
        let mut out = AllowedHosts {
            listen: (!listen.is_unspecified()).then_some(listen),
            entries: Vec::with_capacity(entries.len()),
            any: false,
        };
        for raw in entries {
            let bad = |why: &str| StartError::BadAllowedHost {
                entry: raw.clone(),
                why: why.to_owned(),
            };
            let text = raw.trim();
            if text == "*" {
                out.any = true;
                continue;
            }
            let (wildcard, rest) = match text.strip_prefix("*.") {
                Some(rest) => (true, rest),
                None => (false, text),
            };
            if rest.is_empty() || rest.contains(['@', '/', '*']) {
                return Err(bad("not a host name"));
            }
            let authority = Authority::from_str(rest).map_err(|e| bad(&e.to_string()))?;
            let has_port = authority.as_str().len() > authority.host().len();
            if has_port && authority.port_u16().is_none() {
                return Err(bad("the port is not a number"));
            }
            let host = normalize(authority.host());
            out.entries.push(Entry {
                host: if wildcard { format!(".{host}") } else { host },
                wildcard,
                port: authority.port_u16(),
            });
        }
        Ok(out)
    }

    /// Whether `authority` (a `Host` value, or an origin's `host[:port]`)
    /// names an allowed host; `local` is the address the connection
    /// arrived on.
    pub fn allows(&self, authority: &str, local: Option<IpAddr>) -> bool {
        if self.any {
            return true;
        }
        let Ok(authority) = Authority::from_str(authority) else {
            return false;
        };
        if authority.as_str().contains('@') {
            return false;
        }
        let host = normalize(authority.host());
        if let Ok(ip) = IpAddr::from_str(&host) {
            if ip.is_loopback() || Some(ip) == self.listen || Some(ip) == local {
                return true;
            }
        } else if host == "localhost" {
            return true;
        }
        let port = authority.port_u16();
        self.entries.iter().any(|e| {
            let name = if e.wildcard {
                host.ends_with(&e.host)
            } else {
                host == e.host
            };
            name && (e.port.is_none() || e.port == port)
        })
    }
}

/// Lower case, brackets of an IPv6 literal and a trailing dot removed.
fn normalize(host: &str) -> String {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// What kind of route a request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKind {
    /// A managed route (chat completions, Messages, Responses): JSON only.
    Managed,
    /// The passthrough: JSON, or multipart from a non-browser.
    Passthrough,
}

/// Checks a request bound upstream against the rule above; the error says
/// what is refused and, for a host, which key allows it.
pub fn check(
    allowed: &AllowedHosts,
    headers: &HeaderMap,
    uri: &Uri,
    local: Option<IpAddr>,
    kind: RouteKind,
) -> Result<(), ServeError> {
    let host = match headers.get(HOST) {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ServeError::Forbidden("the Host header is not text".into()))?,
        ),
        None => uri.authority().map(Authority::as_str),
    };
    if let Some(host) = host
        && !allowed.allows(host, local)
    {
        return Err(ServeError::Forbidden(format!(
            "the host `{}` is not allowed (a DNS-rebinding page could use it); add it to \
             serve.allowed_hosts to reach the proxy under that name",
            host.escape_debug()
        )));
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let allowed_origin = origin
            .to_str()
            .ok()
            .and_then(|o| Uri::from_str(o).ok())
            .filter(|o| matches!(o.scheme_str(), Some("http" | "https")))
            .and_then(|o| o.authority().map(|a| allowed.allows(a.as_str(), local)))
            .unwrap_or(false);
        if !allowed_origin {
            return Err(ServeError::Forbidden(
                "cross-site request refused: the Origin is not an allowed host".into(),
            ));
        }
    }
    if let Some(site) = headers.get("sec-fetch-site")
        && (site == "cross-site" || site == "same-site")
    {
        return Err(ServeError::Forbidden(
            "cross-site request refused (Sec-Fetch-Site)".into(),
        ));
    }
    let has_body = headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if kind == RouteKind::Passthrough && !has_body {
        return Ok(());
    }
    let essence = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim);
    let browser = headers.contains_key(ORIGIN)
        || headers.keys().any(|k| k.as_str().starts_with("sec-fetch-"));
    match essence {
        Some(t) if t.eq_ignore_ascii_case("application/json") => Ok(()),
        Some(t)
            if kind == RouteKind::Passthrough
                && !browser
                && t.eq_ignore_ascii_case("multipart/form-data") =>
        {
            Ok(())
        }
        other => Err(ServeError::UnsupportedMediaType(format!(
            "the body must be `Content-Type: application/json`{}, not {}",
            if kind == RouteKind::Passthrough {
                " (or multipart/form-data from a non-browser client)"
            } else {
                ""
            },
            other.map_or_else(|| "none".to_owned(), |t| format!("`{}`", t.escape_debug()))
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn hosts(entries: &[&str]) -> AllowedHosts {
        let entries: Vec<String> = entries.iter().map(|s| (*s).to_owned()).collect();
        AllowedHosts::new(IpAddr::from([127, 0, 0, 1]), &entries).unwrap()
    }

    #[test]
    fn loopback_listen_local_and_listed_hosts() {
        let h = hosts(&["ctx.internal", "*.corp.example:8443", "10.0.0.9"]);
        for ok in [
            "127.0.0.1:8787",
            "localhost",
            "LOCALHOST:1",
            "[::1]:8787",
            "127.0.0.2",
            "ctx.internal:443",
            "CTX.internal.",
            "a.corp.example:8443",
            "10.0.0.9:1",
        ] {
            assert!(h.allows(ok, None), "{ok}");
        }
        for bad in [
            "evil.example",
            "localhost.evil.example",
            "ctx.internal.evil",
            "a.corp.example:443",
            "corp.example:8443",
            "10.0.0.8",
            "user@127.0.0.1",
            "",
        ] {
            assert!(!h.allows(bad, None), "{bad}");
        }
        assert!(h.allows("192.168.1.5:8787", Some(IpAddr::from([192, 168, 1, 5]))));
        let wide = AllowedHosts::new(IpAddr::from([10, 1, 1, 1]), &[]).unwrap();
        assert!(wide.allows("10.1.1.1:9", None));
        assert!(hosts(&["*"]).allows("evil.example", None));
        for bad in ["a/b", "*", "x@y", "*.", "host:port"] {
            if bad == "*" {
                continue;
            }
            let e = AllowedHosts::new(IpAddr::from([127, 0, 0, 1]), &[bad.to_owned()]);
            assert!(e.is_err(), "{bad}");
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn browsers_cross_site_and_bodies() {
        let h = hosts(&[]);
        let uri = Uri::from_static("/v1/chat/completions");
        let json = [
            ("host", "127.0.0.1:8787"),
            ("content-type", "application/json; charset=utf-8"),
        ];
        let status = |pairs: &[(&'static str, &'static str)], kind| {
            check(&h, &headers(pairs), &uri, None, kind).map_err(|e| e.status().as_u16())
        };
        assert_eq!(status(&json, RouteKind::Managed), Ok(()));
        assert_eq!(
            status(&[("content-type", "text/plain")], RouteKind::Managed),
            Err(415)
        );
        assert_eq!(status(&[], RouteKind::Managed), Err(415));
        assert_eq!(
            status(&[("host", "evil.example")], RouteKind::Managed),
            Err(403)
        );
        let with = |extra: (&'static str, &'static str)| {
            let mut v = json.to_vec();
            v.push(extra);
            v
        };
        assert_eq!(
            status(
                &with(("origin", "https://evil.example")),
                RouteKind::Managed
            ),
            Err(403)
        );
        assert_eq!(
            status(&with(("origin", "null")), RouteKind::Managed),
            Err(403)
        );
        assert_eq!(
            status(
                &with(("origin", "http://localhost:3000")),
                RouteKind::Managed
            ),
            Ok(())
        );
        assert_eq!(
            status(&with(("sec-fetch-site", "cross-site")), RouteKind::Managed),
            Err(403)
        );
        assert_eq!(
            status(&with(("sec-fetch-site", "same-site")), RouteKind::Managed),
            Err(403)
        );
        assert_eq!(
            status(&with(("sec-fetch-site", "same-origin")), RouteKind::Managed),
            Ok(())
        );
        // Passthrough: no body, no type needed; multipart only from a non-browser.
        assert_eq!(status(&[], RouteKind::Passthrough), Ok(()));
        let multipart = [
            ("content-type", "multipart/form-data; boundary=x"),
            ("content-length", "10"),
        ];
        assert_eq!(status(&multipart, RouteKind::Passthrough), Ok(()));
        assert_eq!(status(&multipart, RouteKind::Managed), Err(415));
        let mut browser = multipart.to_vec();
        browser.push(("sec-fetch-mode", "cors"));
        assert_eq!(status(&browser, RouteKind::Passthrough), Err(415));
        assert_eq!(
            status(
                &[
                    ("content-type", "text/plain"),
                    ("transfer-encoding", "chunked")
                ],
                RouteKind::Passthrough
            ),
            Err(415)
        );
    }
}
