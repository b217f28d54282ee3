//! The provider the proxy forwards to: one shared HTTP client (connection
//! pool, timeouts), the URL mapping `/v1/X` → `{base}/X`, which headers
//! go upstream, and the retry of a connection that failed before any byte
//! of the request was sent.
//!
//! **Connect retry.** A connection refused or reset while connecting (a
//! burst that overflows the upstream's accept queue, a restarting
//! upstream) never carried the request, so it is tried again, at most
//! `connect_retries` times, after a jittered exponential backoff (a random
//! point in the upper half of `connect_backoff`, then twice that, and so
//! on: 12–25 ms, 25–50 ms, 50–100 ms by default). Nothing else is retried:
//! once a connection is established the request may have reached the
//! model (a reset after it, a timeout waiting for the answer), and a
//! connect that timed out has already spent its deadline.

use std::time::Duration;

use axum::http::header::{self, HeaderName};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;

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
    /// Retries of a connection that failed before any byte of the request
    /// was sent (0: none).
    pub connect_retries: u32,
    /// The first retry's backoff, doubled for each next one; each wait is
    /// a random point in its upper half.
    pub connect_backoff: Duration,
}

impl UpstreamOptions {
    /// Options for `url` with the default timeouts (600 s, connect 10 s)
    /// and connect retries (3, from 25 ms).
    pub fn new(url: impl Into<String>) -> UpstreamOptions {
        UpstreamOptions {
            url: url.into(),
            api_key: None,
            timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            connect_retries: 3,
            connect_backoff: Duration::from_millis(25),
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
    /// The gateway's identity header (`serve.identity_header`): never
    /// forwarded.
    identity_header: Option<HeaderName>,
    timeout: Duration,
    connect_retries: u32,
    connect_backoff: Duration,
    retried: Counter,
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
            identity_header: None,
            timeout: options.timeout,
            connect_retries: options.connect_retries,
            connect_backoff: options.connect_backoff,
            retried: Counter::default(),
        })
    }

    /// Never forwards `name` (the gateway's identity header).
    pub fn dropping_identity_header(mut self, name: Option<HeaderName>) -> Upstream {
        self.identity_header = name;
        self
    }

    /// Counts connect retries into `counter` (the metrics').
    pub fn counting_retries(mut self, counter: Counter) -> Upstream {
        self.retried = counter;
        self
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
    /// `x-ctx-*` and the gateway's identity header; the configured key
    /// replaces `Authorization` when set. (Whatever carried the proxy's
    /// access token is gone already: [`token::strip`](crate::token::strip)
    /// in the router's auth layer.) With `identity`, asks for an
    /// uncompressed answer (the proxy reads it).
    pub fn headers(&self, incoming: &HeaderMap, identity: bool) -> HeaderMap {
        let mut out = HeaderMap::with_capacity(incoming.len());
        for (name, value) in incoming {
            if HOP_BY_HOP.contains(name)
                || name.as_str().starts_with("x-ctx-")
                || self.identity_header.as_ref() == Some(name)
            {
                continue;
            }
            if *name == header::AUTHORIZATION && self.authorization.is_some() {
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

    /// Sends one request, retrying a connection that failed before the
    /// request was sent (see the module docs). `stream` lifts the
    /// whole-request deadline (a stream may run long; silence is still
    /// bounded by the read timeout).
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
        stream: bool,
    ) -> Result<reqwest::Response, ServeError> {
        let mut retry = 0;
        loop {
            let mut req = self
                .client
                .request(method.clone(), url)
                .headers(headers.clone())
                .body(body.clone());
            if !stream {
                req = req.timeout(self.timeout);
            }
            match req.send().await {
                Ok(resp) => return Ok(resp),
                Err(e) if retry < self.connect_retries && never_sent(&e) => {
                    retry += 1;
                    self.retried.inc();
                    let wait = backoff(self.connect_backoff, retry);
                    tracing::debug!(
                        retry,
                        wait_ms = wait.as_millis(),
                        "upstream connection failed before the request was sent; retrying"
                    );
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(ServeError::from_reqwest(&e)),
            }
        }
    }

    /// How long a call may take (for a stream: how long it may stay
    /// silent).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends a non-streamed `POST` and reads its answer to the end: its
    /// status, its headers for the client ([`response_headers`]) and its
    /// body.
    pub async fn collect(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<(StatusCode, HeaderMap, Bytes), ServeError> {
        let resp = self.send(Method::POST, url, headers, body, false).await?;
        let status = resp.status();
        let headers = response_headers(resp.headers());
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ServeError::from_reqwest(&e))?;
        Ok((status, headers, bytes))
    }
}

/// Whether `e` failed the connection before any byte of the request went
/// out: a connect error (refused, reset while connecting), not a connect
/// that ran out of its deadline.
fn never_sent(e: &reqwest::Error) -> bool {
    e.is_connect() && !e.is_timeout()
}

/// The wait before retry `n` (from 1): the engine's one retry policy
/// (`context_engine::retry`), jittered: a random point in the upper half of
/// `first` doubled `n - 1` times.
fn backoff(first: Duration, n: u32) -> Duration {
    context_engine::retry::Backoff::exponential(first)
        .jittered()
        .delay(n)
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
    fn backoff_doubles_with_jitter_in_its_upper_half() {
        let first = Duration::from_millis(25);
        for _ in 0..200 {
            for (n, full) in [(1, 25), (2, 50), (3, 100)] {
                let wait = backoff(first, n);
                let full = Duration::from_millis(full);
                assert!(wait >= full / 2 && wait <= full, "retry {n}: {wait:?}");
            }
        }
        assert!(backoff(first, u32::MAX) > Duration::ZERO, "no overflow");
    }

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
        h.insert("x-user", HeaderValue::from_static("alice"));
        let out = up.headers(&h, false);
        assert_eq!(out.get(header::AUTHORIZATION).unwrap(), "Bearer client");
        assert!(out.get("x-ctx-session").is_none() && out.get(header::CONNECTION).is_none());
        assert_eq!(out.get("openai-organization").unwrap(), "org");
        assert_eq!(out.get("x-user").unwrap(), "alice");
        let up = up.dropping_identity_header(Some(HeaderName::from_static("x-user")));
        assert!(up.headers(&h, false).get("x-user").is_none());

        let mut opts = UpstreamOptions::new("https://example.invalid/v1");
        opts.api_key = Some("sk-conf".into());
        let up = Upstream::new(&opts).unwrap();
        assert_eq!(
            up.headers(&h, true).get(header::AUTHORIZATION).unwrap(),
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
