//! Reading a request body at the edge: within `serve.max_body_bytes`
//! (413), within `serve.body_read_timeout_seconds` from its first byte to
//! its last (408), and only with its bytes taken from the in-flight budget
//! (503 with `Retry-After`): a declared `Content-Length` is taken before
//! anything is read, a body without a length as it streams.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use bytes::BytesMut;
use http_body_util::BodyExt;

use super::budget::{InflightBudget, Permit};
use crate::error::ServeError;

/// The limits a body is read under.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest body.
    pub max_bytes: usize,
    /// Longest time from the start of the read to the last byte.
    pub timeout: Duration,
}

/// Reads `body` (declaring `declared` bytes, if it does) whole; returns it
/// with the permit holding its bytes.
pub async fn read(
    body: Body,
    declared: Option<u64>,
    limits: Limits,
    budget: &Arc<InflightBudget>,
) -> Result<(Bytes, Permit), ServeError> {
    let too_large = ServeError::PayloadTooLarge {
        limit: limits.max_bytes,
    };
    let declared = match declared.map(usize::try_from) {
        Some(Ok(n)) if n <= limits.max_bytes => Some(n),
        Some(_) => return Err(too_large),
        None => None,
    };
    let mut permit = budget
        .try_take(declared.unwrap_or(0))
        .ok_or(ServeError::Overloaded)?;
    if body.is_end_stream() {
        return Ok((Bytes::new(), permit));
    }
    let collect = async {
        let mut body = body;
        let mut first: Option<Bytes> = None;
        let mut buf = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ServeError::BadRequest(format!("the request body could not be read: {e}"))
            })?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let len = first.as_ref().map_or(0, Bytes::len) + buf.len() + data.len();
            if len > limits.max_bytes {
                return Err(ServeError::PayloadTooLarge {
                    limit: limits.max_bytes,
                });
            }
            if declared.is_none() && !permit.grow(data.len()) {
                return Err(ServeError::Overloaded);
            }
            // One frame is kept as it came; more are gathered into one
            // buffer sized for the whole body when its length is known.
            match first.take() {
                None if buf.is_empty() => first = Some(data),
                None => buf.extend_from_slice(&data),
                Some(head) => {
                    buf.reserve(declared.unwrap_or(head.len() + data.len()));
                    buf.extend_from_slice(&head);
                    buf.extend_from_slice(&data);
                }
            }
        }
        Ok(first.unwrap_or_else(|| buf.freeze()))
    };
    match tokio::time::timeout(limits.timeout, collect).await {
        Ok(Ok(bytes)) => Ok((bytes, permit)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ServeError::BodyTimeout {
            seconds: limits.timeout.as_secs(),
        }),
    }
}
