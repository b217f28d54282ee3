//! The provider the proxy forwards to: one shared HTTP client (connection
//! pool, timeouts), the URL mapping `/v1/X` → `{base}/X`, and which headers
//! go upstream.

use std::time::Duration;

use axum::http::header::{self, HeaderName};
use axum::http::{HeaderMap, HeaderValue, Method};
use bytes::Bytes;

use crate::error::{ServeError, StartError};

/// Where and how requests go upstream.
#[derive(Clone, Debug)]
pub struct UpstreamOptions {
    /// Base URL as in the OpenAI SDKs, e.g. `http://127.0.0.1:8080/v1`.
    pub url: String,
    /// The provider key that replaces the client's `Authorization`, if any.
    pub api_key: Option<String>,
    /// Whole-request deadline of a non-streamed call; also the longest
    /// silence allowed inside a stream.
    pub timeout: Duration,
    /// TCP/TLS connect deadline.
    pub connect_timeout: Duration,
}

impl UpstreamOptions {
    /// Options for `url` with the default timeouts (600 s, connect 10 s).
    pub fn new(url: impl Into<String>) -> UpstreamOptions {
        UpstreamOptions {
            url: url.into(),
            api_key: None,
            timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// The upstream client.
#[derive(Debug)]
pub struct Upstream {
    client: reqwest::Client,
    base: String,
    /// The base URL's path, with a trailing `/`: every passthrough URL's
    /// path starts with it.
    base_path: String,
    authorization: Option<HeaderValue>,
    timeout: Duration,
}

/// Headers that describe one hop, not the message: never forwarded.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HOST,
    header::CONTENT_LENGTH,
];

impl Upstream {
    /// A client for `options`.
    pub fn new(options: &UpstreamOptions) -> Result<Upstream, StartError> {
        let bad = |why: &str| StartError::BadUpstream {
            url: options.url.clone(),
            why: why.to_owned(),
        };
        let parsed = reqwest::Url::parse(&options.url).map_err(|e| bad(&e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad("the scheme must be http or https"));
        }
        // One process-wide TLS provider; a second install is a no-op error.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .read_timeout(options.timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| bad(&format!("cannot build the HTTP client: {e}")))?;
        let authorization = match &options.api_key {
            Some(key) => Some(
                HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| bad("the API key is not a valid header value"))?,
            ),
            None => None,
        };
        let mut authorization = authorization;
        if let Some(v) = authorization.as_mut() {
            v.set_sensitive(true);
        }
        let base_path = format!("{}/", parsed.path().trim_end_matches('/'));
        Ok(Upstream {
            client,
            base: options.url.trim_end_matches('/').to_owned(),
            base_path,
            authorization,
            timeout: options.timeout,
        })
    }

    /// The upstream URL for proxy path `/v1/{rest}` and its query.
    pub fn url(&self, rest: &str, query: Option<&str>) -> String {
        let rest = rest.trim_start_matches('/');
        match query {
            Some(q) if !q.is_empty() => format!("{}/{rest}?{q}", self.base),
            _ => format!("{}/{rest}", self.base),
        }
    }

    /// The upstream URL of the passthrough path `/v1/{rest}` (`rest` as
    /// received, still percent-encoded): refused when `rest` breaks the
    /// path rule ([`edge::path`](crate::edge::path)) or the URL would not
    /// stay under the base path.
    pub fn passthrough_url(&self, rest: &str, query: Option<&str>) -> Result<String, ServeError> {
        crate::edge::path::check(rest)?;
        let url = self.url(rest, query);
        let parsed = reqwest::Url::parse(&url).map_err(|e| {
            ServeError::BadRequest(format!("the path is not a valid URL path: {e}"))
        })?;
        if !parsed.path().starts_with(&self.base_path) {
            return Err(ServeError::BadRequest(
                "the path leaves the upstream's base path: paths must stay under /v1".into(),
            ));
        }
        Ok(url)
    }

    /// The headers to send upstream: the client's, less hop-by-hop headers,
    /// `x-ctx-*`, and (when `drop_authorization`) its `Authorization`; the
    /// configured key replaces `Authorization` when set. With `identity`,
    /// asks for an uncompressed answer (the proxy reads it).
    pub fn headers(
        &self,
        incoming: &HeaderMap,
        drop_authorization: bool,
        identity: bool,
    ) -> HeaderMap {
        let mut out = HeaderMap::with_capacity(incoming.len());
        for (name, value) in incoming {
            if HOP_BY_HOP.contains(name) || name.as_str().starts_with("x-ctx-") {
                continue;
            }
            if *name == header::AUTHORIZATION
                && (drop_authorization || self.authorization.is_some())
            {
                continue;
            }
            if identity && *name == header::ACCEPT_ENCODING {
                continue;
            }
            out.append(name.clone(), value.clone());
        }
        if let Some(auth) = &self.authorization {
            out.insert(header::AUTHORIZATION, auth.clone());
        }
        if identity {
            out.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        out
    }

    /// Sends one request. `stream` lifts the whole-request deadline (a
    /// stream may run long; silence is still bounded by the read timeout).
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
        stream: bool,
    ) -> Result<reqwest::Response, ServeError> {
        let mut req = self.client.request(method, url).headers(headers).body(body);
        if !stream {
            req = req.timeout(self.timeout);
        }
        req.send().await.map_err(|e| ServeError::from_reqwest(&e))
    }
}

/// The response headers to pass back to the client: the upstream's, less
/// hop-by-hop headers (the body may be re-framed).
pub fn response_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(upstream.len());
    for (name, value) in upstream {
        if !HOP_BY_HOP.contains(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_headers() {
        let up = Upstream::new(&UpstreamOptions::new("http://127.0.0.1:9/v1/")).unwrap();
        assert_eq!(up.url("/models", None), "http://127.0.0.1:9/v1/models");
        assert_eq!(
            up.url("files", Some("a=1")),
            "http://127.0.0.1:9/v1/files?a=1"
        );
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer client"),
        );
        h.insert("x-ctx-session", HeaderValue::from_static("s1"));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        h.insert("openai-organization", HeaderValue::from_static("org"));
        let out = up.headers(&h, false, false);
        assert_eq!(out.get(header::AUTHORIZATION).unwrap(), "Bearer client");
        assert!(out.get("x-ctx-session").is_none() && out.get(header::CONNECTION).is_none());
        assert_eq!(out.get("openai-organization").unwrap(), "org");
        assert!(
            up.headers(&h, true, false)
                .get(header::AUTHORIZATION)
                .is_none()
        );

        let mut opts = UpstreamOptions::new("https://example.invalid/v1");
        opts.api_key = Some("sk-conf".into());
        let up = Upstream::new(&opts).unwrap();
        assert_eq!(
            up.headers(&h, true, true)
                .get(header::AUTHORIZATION)
                .unwrap(),
            "Bearer sk-conf"
        );
        assert!(Upstream::new(&UpstreamOptions::new("ftp://x")).is_err());
        let up = Upstream::new(&UpstreamOptions::new("http://127.0.0.1:9/api/v1/")).unwrap();
        assert_eq!(
            up.passthrough_url("/files/f-1/content", Some("a=.."))
                .unwrap(),
            "http://127.0.0.1:9/api/v1/files/f-1/content?a=.."
        );
        for bad in ["/../admin", "/%2e%2E/admin", "/x%2f..%2f..%2fadmin"] {
            assert!(up.passthrough_url(bad, None).is_err(), "{bad}");
        }
        assert!(Upstream::new(&UpstreamOptions::new("not a url")).is_err());
    }
}
