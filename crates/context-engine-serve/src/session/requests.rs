//! The last managed calls' bodies, for the page's view of a call's request: what the
//! client sent and what went upstream, as they were on the wire.
//!
//! One log for the whole server, bounded in bytes (`serve.ui.request_bytes`;
//! 0 keeps none): the newest calls of every session are kept, the oldest
//! dropped first, whichever session they belong to. Keeping a call costs
//! two reference counts on the request path: the bodies are the buffers
//! the handler already holds (the client's as it arrived, the upstream's as
//! it was sent); a body is parsed only when someone opens the view.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use axum::body::Bytes;
use context_engine::front::{FrontKind, FrontRequest};
use context_engine::message::Message;

use crate::body::ChatBody;
use crate::error::ServeError;
use crate::session::SessionKey;

/// The wire format of a kept call's bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// Chat completions.
    Chat,
    /// A front's own format (Anthropic Messages, Responses).
    Front(FrontKind),
}

impl std::fmt::Display for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wire::Chat => f.write_str("chat"),
            Wire::Front(kind) => kind.fmt(f),
        }
    }
}

/// One kept call.
#[derive(Clone, Debug)]
pub struct KeptCall {
    pub key: SessionKey,
    /// The call's number in its session (as the call log counts).
    pub call: u64,
    pub wire: Wire,
    /// The client's body.
    pub client: Bytes,
    /// The body that went upstream.
    pub upstream: Bytes,
}

impl KeptCall {
    fn bytes(&self) -> usize {
        self.client.len() + self.upstream.len()
    }

    /// The client's messages and the upstream's, as chat messages (a
    /// front's bridged).
    pub fn messages(&self) -> Result<(Vec<Message>, Vec<Message>), ServeError> {
        Ok((
            messages_of(self.wire, &self.client, "client")?,
            messages_of(self.wire, &self.upstream, "upstream")?,
        ))
    }
}

fn messages_of(wire: Wire, body: &[u8], which: &str) -> Result<Vec<Message>, ServeError> {
    let unreadable = |e: &dyn std::fmt::Display| {
        ServeError::BadRequest(format!("the {which} body of this call cannot be read: {e}"))
    };
    match wire {
        Wire::Chat => ChatBody::parse(body)?
            .messages()
            .iter()
            .map(|raw| serde_json::from_str::<Message>(raw.get()).map_err(|e| unreadable(&e)))
            .collect(),
        Wire::Front(kind) => {
            let text = std::str::from_utf8(body).map_err(|e| unreadable(&e))?;
            FrontRequest::parse(kind, text)
                .map(|f| f.chat().to_vec())
                .map_err(|e| unreadable(&e))
        }
    }
}

/// The log (see the module docs).
#[derive(Debug)]
pub struct RequestLog {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    calls: VecDeque<KeptCall>,
    bytes: usize,
}

impl RequestLog {
    /// A log that keeps up to `budget` bytes of bodies (0: none).
    pub fn new(budget: usize) -> RequestLog {
        RequestLog {
            budget,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Whether it keeps anything.
    pub fn is_on(&self) -> bool {
        self.budget > 0
    }

    /// Keeps `call`, dropping the oldest calls past the budget; a call
    /// larger than the whole budget is not kept.
    pub fn keep(&self, call: KeptCall) {
        let size = call.bytes();
        if size > self.budget {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.bytes += size;
        inner.calls.push_back(call);
        while inner.bytes > self.budget {
            match inner.calls.pop_front() {
                Some(old) => inner.bytes -= old.bytes(),
                None => break,
            }
        }
    }

    /// Call `call` of session `key`, if kept.
    pub fn get(&self, key: &SessionKey, call: u64) -> Option<KeptCall> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .calls
            .iter()
            .rev()
            .find(|c| c.call == call && c.key == *key)
            .cloned()
    }

    /// The numbers of the calls of session `key` kept, oldest first.
    pub fn calls_of(&self, key: &SessionKey) -> Vec<u64> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .calls
            .iter()
            .filter(|c| c.key == *key)
            .map(|c| c.call)
            .collect()
    }

    /// Bytes of bodies kept.
    pub fn bytes(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, n: u64, size: usize) -> KeptCall {
        KeptCall {
            key: SessionKey {
                scope: "s".into(),
                id: id.into(),
            },
            call: n,
            wire: Wire::Chat,
            client: Bytes::from(vec![b'c'; size]),
            upstream: Bytes::from(vec![b'u'; size]),
        }
    }

    #[test]
    fn the_oldest_calls_go_first_past_the_budget() {
        let log = RequestLog::new(1000);
        for n in 1..=6 {
            log.keep(call("a", n, 100));
        }
        // Six calls of 200 bytes in a 1,000-byte budget: the last five.
        assert_eq!(log.calls_of(&call("a", 0, 0).key), [2, 3, 4, 5, 6]);
        assert_eq!(log.bytes(), 1000);
        log.keep(call("b", 1, 250));
        assert_eq!(log.calls_of(&call("a", 0, 0).key), [5, 6]);
        assert!(log.get(&call("b", 0, 0).key, 1).is_some());
        assert!(log.get(&call("a", 0, 0).key, 4).is_none());
        assert!(log.bytes() <= 1000);
    }

    #[test]
    fn a_call_larger_than_the_budget_is_not_kept_and_an_empty_budget_keeps_none() {
        let log = RequestLog::new(100);
        log.keep(call("a", 1, 30));
        log.keep(call("a", 2, 60));
        assert_eq!(log.calls_of(&call("a", 0, 0).key), [1]);
        let off = RequestLog::new(0);
        assert!(!off.is_on());
        off.keep(call("a", 1, 0));
        assert_eq!(off.bytes(), 0);
    }
}
