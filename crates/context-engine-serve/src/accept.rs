//! Accepting connections: the accept loop `serve` runs, one HTTP/1.1
//! connection task per client, `TCP_NODELAY` on every socket (without it a
//! streamed reply on a kept-alive connection stalls ~40 ms on Nagle and
//! delayed ACKs), and two connection timeouts hyper's server does not
//! separate:
//!
//! - the header read timeout: a request's headers must be complete this
//!   long after their first byte (for a new connection: after the accept);
//! - the keep-alive idle timeout: a connection with no request in flight
//!   is closed after this long without a byte of a new request.
//!
//! The body read timeout is the edge's ([`edge::body`](crate::edge::body)):
//! it answers 408. On shutdown, idle connections close, requests in flight
//! finish (hyper's graceful shutdown), and [`accept`] returns when the last
//! connection has ended.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tower_service::Service;

use crate::edge::hold_until_done;

/// The local address a request's connection arrived on (an extension of
/// every request served by [`accept`]).
#[derive(Clone, Copy, Debug)]
pub struct LocalAddr(pub SocketAddr);

/// The connection timeouts.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Time from a request's first byte (a new connection's accept) to the
    /// end of its headers.
    pub header_read: Duration,
    /// Time a connection may wait for a new request between two.
    pub keepalive_idle: Duration,
}

/// Serves `router` on `listener` until `stop` turns true, then waits for
/// the open connections to end.
pub async fn accept(
    listener: TcpListener,
    router: Router,
    timeouts: Timeouts,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let (done, mut all_done) = mpsc::channel::<()>(1);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, _) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, a connection reset before the
                // accept: keep serving the others.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let local = stream.local_addr().ok().map(LocalAddr);
        tokio::spawn(connection(
            stream,
            local,
            router.clone(),
            timeouts,
            stop.clone(),
            done.clone(),
        ));
    }
    drop(listener);
    drop(done);
    let _ = all_done.recv().await;
    Ok(())
}

/// One connection, until it ends, times out, or shutdown lets it finish.
async fn connection(
    stream: TcpStream,
    local: Option<LocalAddr>,
    router: Router,
    timeouts: Timeouts,
    mut stop: watch::Receiver<bool>,
    _done: mpsc::Sender<()>,
) {
    let clock = Arc::new(Clock::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        clock: Arc::clone(&clock),
    });
    let on_request = Arc::clone(&clock);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let busy = Busy::begin(&on_request);
        let mut req = req.map(Body::new);
        if let Some(local) = local {
            req.extensions_mut().insert(local);
        }
        let mut router = router.clone();
        async move {
            let response = match router.call(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(hold_until_done(response, busy))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let wake = clock.deadline(timeouts);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(wake) => {
                if clock.expired(timeouts) {
                    tracing::debug!("closing a stalled or idle connection");
                    return;
                }
            }
            () = clock.changed.notified() => {}
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// What a connection is doing, for its timeouts: requests in flight, when
/// it last went idle, and when the bytes of its next request started.
#[derive(Debug)]
struct Clock {
    epoch: Instant,
    busy: AtomicUsize,
    /// Milliseconds since `epoch`.
    idle_since: AtomicU64,
    /// Milliseconds since `epoch` of the first byte of the headers being
    /// read, or [`NONE`].
    head_since: AtomicU64,
    changed: Notify,
}

const NONE: u64 = u64::MAX;

impl Clock {
    fn new() -> Clock {
        Clock {
            epoch: Instant::now(),
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            // A new connection's first headers are due from the accept.
            head_since: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// Bytes arrived: on an idle connection, a new request's headers start.
    fn read(&self) {
        if self.busy.load(Ordering::Acquire) == 0
            && self
                .head_since
                .compare_exchange(NONE, self.now_ms(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.changed.notify_one();
        }
    }

    /// When the connection's current timeout runs out (while a request is
    /// in flight: a time to look again).
    fn deadline(&self, t: Timeouts) -> Instant {
        if self.busy.load(Ordering::Acquire) > 0 {
            return Instant::now() + t.keepalive_idle.max(t.header_read);
        }
        match self.head_since.load(Ordering::Acquire) {
            NONE => self.at(self.idle_since.load(Ordering::Acquire)) + t.keepalive_idle,
            head => self.at(head) + t.header_read,
        }
    }

    fn expired(&self, t: Timeouts) -> bool {
        self.busy.load(Ordering::Acquire) == 0 && Instant::now() >= self.deadline(t)
    }
}

/// A request in flight on its connection, from its headers to the end of
/// its response.
struct Busy(Arc<Clock>);

impl Busy {
    fn begin(clock: &Arc<Clock>) -> Busy {
        clock.busy.fetch_add(1, Ordering::AcqRel);
        clock.head_since.store(NONE, Ordering::Release);
        Busy(Arc::clone(clock))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let clock = &self.0;
        clock.idle_since.store(clock.now_ms(), Ordering::Release);
        clock.busy.fetch_sub(1, Ordering::AcqRel);
        clock.changed.notify_one();
    }
}

/// The socket, telling the clock when bytes arrive.
struct Watched {
    inner: TcpStream,
    clock: Arc<Clock>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
