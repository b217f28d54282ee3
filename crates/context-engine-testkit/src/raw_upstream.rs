//! An upstream written on raw TCP, for what a well-behaved HTTP server
//! never does: a body without length or chunking that closes early, a
//! chunked body cut mid-event, a stall, a reset after reading the request.
//! It counts every connection it accepted and keeps every request body.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the raw upstream answers one request.
#[derive(Clone, Debug)]
pub enum RawReply {
    /// A 200 event stream without length or chunking: these bytes, then
    /// the connection closes.
    Unframed(String),
    /// A 200 chunked event stream: each string one chunk, then the
    /// connection closes without the last (empty) chunk.
    ChunkedCut(Vec<String>),
    /// A 200 chunked event stream: each string one chunk, then the end.
    Chunked(Vec<String>),
    /// A 200 event stream: these bytes (chunked), then silence with the
    /// connection open.
    Stall(String),
    /// The connection is reset once the request was read.
    Reset,
    /// This status with this body (JSON), then the connection closes.
    Status(u16, String),
    /// The request is read, then no answer ever comes.
    Silent,
    /// A 200 chunked event stream: the first string as one chunk, then,
    /// once the gate opens, the second as another, then the end.
    Gated(String, Arc<tokio::sync::Notify>, String),
}

/// The raw upstream's state.
#[derive(Default)]
pub struct Raw {
    replies: Mutex<VecDeque<RawReply>>,
    /// Connections accepted.
    pub accepted: AtomicUsize,
    bodies: Mutex<Vec<Vec<u8>>>,
}

impl Raw {
    /// A raw upstream answering `replies` in order (then a complete chat
    /// stream).
    pub fn new(replies: impl IntoIterator<Item = RawReply>) -> Arc<Raw> {
        Arc::new(Raw {
            replies: Mutex::new(replies.into_iter().collect()),
            ..Raw::default()
        })
    }

    /// The request bodies read so far, in order.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        self.bodies.lock().unwrap().clone()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Serves `raw` on `listener` (one task per connection, one request per
/// connection).
pub fn serve(listener: TcpListener, raw: Arc<Raw>) {
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            raw.accepted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer(socket, Arc::clone(&raw)));
        }
    });
}

/// Starts `raw` on 127.0.0.1:0; its base URL (`…/v1`).
pub async fn start(raw: Arc<Raw>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    serve(listener, raw);
    format!("http://{addr}/v1")
}

/// Reads one request (head and `content-length` body); `None` when the
/// peer closed first.
async fn read_request(socket: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(buf[head_end..head_end + length].to_vec())
}

const STREAM_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n";

fn chunk(text: &str) -> String {
    format!("{:x}\r\n{text}\r\n", text.len())
}

async fn answer(mut socket: TcpStream, raw: Arc<Raw>) {
    let Some(body) = read_request(&mut socket).await else {
        return;
    };
    raw.bodies.lock().unwrap().push(body);
    let reply = raw.replies.lock().unwrap().pop_front();
    let reply = reply.unwrap_or_else(|| {
        RawReply::Chunked(vec![
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]}\n\n".into(),
            "data: [DONE]\n\n".into(),
        ])
    });
    match reply {
        RawReply::Unframed(text) => {
            let out = format!("{STREAM_HEAD}connection: close\r\n\r\n{text}");
            let _ = socket.write_all(out.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
        RawReply::ChunkedCut(chunks) | RawReply::Chunked(chunks) if chunks.is_empty() => {
            let _ = socket.shutdown().await;
        }
        RawReply::ChunkedCut(chunks) => {
            let mut out = format!("{STREAM_HEAD}transfer-encoding: chunked\r\n\r\n");
            for c in &chunks {
                out.push_str(&chunk(c));
            }
            let _ = socket.write_all(out.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
        RawReply::Chunked(chunks) => {
            let mut out =
                format!("{STREAM_HEAD}transfer-encoding: chunked\r\nconnection: close\r\n\r\n");
            for c in &chunks {
                out.push_str(&chunk(c));
            }
            out.push_str("0\r\n\r\n");
            let _ = socket.write_all(out.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
        RawReply::Stall(text) => {
            let out = format!(
                "{STREAM_HEAD}transfer-encoding: chunked\r\n\r\n{}",
                chunk(&text)
            );
            let _ = socket.write_all(out.as_bytes()).await;
            // Holds the connection open until the test ends.
            std::future::pending::<()>().await;
        }
        RawReply::Status(status, text) => {
            let out = format!(
                "HTTP/1.1 {status} Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                text.len()
            );
            let _ = socket.write_all(out.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
        RawReply::Reset => {
            let _ = socket.set_zero_linger();
            drop(socket);
        }
        RawReply::Silent => {
            // Holds the connection open until the test ends.
            std::future::pending::<()>().await;
        }
        RawReply::Gated(first, gate, rest) => {
            let out = format!(
                "{STREAM_HEAD}transfer-encoding: chunked\r\nconnection: close\r\n\r\n{}",
                chunk(&first)
            );
            let _ = socket.write_all(out.as_bytes()).await;
            gate.notified().await;
            let out = format!("{}0\r\n\r\n", chunk(&rest));
            let _ = socket.write_all(out.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    }
}
