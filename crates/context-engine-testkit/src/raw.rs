//! For the edge tests: requests written byte for byte on a socket (a path
//! no client library would leave as is, a `Host` of our choosing, a
//! request that never finishes), and an upstream that records the path
//! and `Authorization` of every request that reaches it, whatever its path.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use axum::serve::ListenerExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const REPLY: &str = r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}"#;
const STREAM: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"}}]}\n\ndata: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// One request the recording upstream received.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Its method.
    pub method: Method,
    /// Its path and query, as received.
    pub path: String,
    /// Its `Authorization`, if any.
    pub authorization: Option<String>,
    /// Its body's length.
    pub bytes: usize,
}

/// The recording upstream's state.
#[derive(Default)]
pub struct Recorder {
    /// Requests received, in order.
    pub seen: Mutex<Vec<Seen>>,
    /// Whether answers wait (a slow upstream keeps requests in flight
    /// until the test releases them: [`Recorder::hold`]).
    pub held: watch::Sender<bool>,
}

impl Recorder {
    /// The requests received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// From now on every answer waits (its request recorded) until
    /// [`Recorder::release`].
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Lets every waiting answer go, and the ones to come.
    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

async fn record(
    State(rec): State<Arc<Recorder>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    rec.seen.lock().unwrap().push(Seen {
        method,
        path: uri
            .path_and_query()
            .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned()),
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        bytes: body.len(),
    });
    let mut held = rec.held.subscribe();
    let _ = held.wait_for(|held| !*held).await;
    if body.len() < 1 << 20 && contains(&body, b"\"stream\":true") {
        // Event by event, a few milliseconds apart, as a model streams:
        // the response head goes out before the first event.
        let events: Vec<String> = STREAM.split_inclusive("\n\n").map(str::to_owned).collect();
        let paced = futures_util::stream::unfold(events.into_iter(), |mut events| async move {
            let event = events.next()?;
            tokio::time::sleep(Duration::from_millis(5)).await;
            Some((Ok::<_, std::io::Error>(Bytes::from(event)), events))
        });
        return Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(paced))
            .unwrap();
    }
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(REPLY))
        .unwrap()
}

/// Starts the recording upstream; returns its base URL (`…/v1`).
pub async fn start_recorder(rec: Arc<Recorder>) -> String {
    let app = Router::new()
        .fallback(record)
        .layer(DefaultBodyLimit::disable())
        .with_state(rec);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Its own streams must not stall on Nagle either.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

/// A response read off a socket.
#[derive(Debug)]
pub struct RawResponse {
    /// Its status.
    pub status: u16,
    /// Its head (status line and headers) and body, as text.
    pub text: String,
}

impl RawResponse {
    /// A header's value (case-insensitive name), if present.
    pub fn header(&self, name: &str) -> Option<String> {
        let head = self.text.split("\r\n\r\n").next()?;
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

/// Sends `request` as written (it should say `Connection: close`) and
/// reads the answer to the end.
pub async fn raw(addr: SocketAddr, request: &[u8]) -> RawResponse {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    RawResponse { status, text }
}

/// A request with `Connection: close`, the given extra header lines
/// (`Name: value`) and body.
pub fn request(method: &str, path: &str, headers: &[&str], body: &str) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\n");
    for h in headers {
        out.push_str(h);
        out.push_str("\r\n");
    }
    if !body.is_empty() {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("Connection: close\r\n\r\n");
    out.push_str(body);
    out.into_bytes()
}

/// Waits until the server closes `s` (EOF or reset), for at most `within`;
/// returns how long it took, or `None` if it stayed open.
pub async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = within.checked_sub(start.elapsed())?;
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {} // an answer (408) before the close
        }
    }
}

/// Time from sending `request` on `s` to the first byte of the first
/// server-sent event of the answer; reads the answer to its end (a
/// chunked stream's last chunk).
pub async fn first_event(s: &mut TcpStream, request: &[u8]) -> Duration {
    let start = Instant::now();
    s.write_all(request).await.unwrap();
    let mut seen = Vec::new();
    let mut first = None;
    let mut buf = [0u8; 16384];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the end of the stream");
        seen.extend_from_slice(&buf[..n]);
        if first.is_none() && contains(&seen, b"data: ") {
            first = Some(start.elapsed());
        }
        if seen.ends_with(b"\r\n0\r\n\r\n") {
            break;
        }
    }
    first.unwrap()
}
