//! Per-message count cache.
//!
//! Agents re-count the whole transcript before every model call, and the
//! transcript only grows at the end; BPE over the old messages again is pure
//! waste. Counts are remembered under a 128-bit hash of exactly the fields
//! that are counted (so a change to an unbilled `extra` field does not miss),
//! which makes a collision between two different messages negligible
//! (~2^-64 even after billions of messages).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

use super::TokenCounter;
use crate::message::{Content, FunctionCall, Message};

/// Default number of messages remembered: far more than any context window
/// holds, at ~40 bytes an entry.
const DEFAULT_CAPACITY: usize = 65_536;

/// Cache effectiveness, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Messages whose count came from the cache.
    pub hits: u64,
    /// Messages that had to be counted.
    pub misses: u64,
    /// Counts currently held.
    pub entries: usize,
}

/// Wraps a counter and caches [`TokenCounter::count_message`] by content hash.
///
/// Thread-safe (a sharded concurrent cache), bounded (least-useful entries
/// are evicted past the capacity) and clearable. The wrapped counter's
/// options are fixed at construction, so cached counts never go stale.
pub struct CachedCounter<C> {
    inner: C,
    cache: quick_cache::sync::Cache<u128, usize>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<C: TokenCounter> CachedCounter<C> {
    /// Caches up to 65 536 message counts.
    pub fn new(inner: C) -> CachedCounter<C> {
        CachedCounter::with_capacity(inner, DEFAULT_CAPACITY)
    }

    /// Caches up to about `capacity` message counts.
    pub fn with_capacity(inner: C, capacity: usize) -> CachedCounter<C> {
        CachedCounter {
            inner,
            cache: quick_cache::sync::Cache::new(capacity.max(1)),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The wrapped counter.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// Hits, misses and size so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: self.cache.len(),
        }
    }

    /// Forgets every cached count and resets the statistics.
    pub fn clear(&self) {
        self.cache.clear();
        self.hits.store(0, Ordering::Relaxed);
        self.misses.store(0, Ordering::Relaxed);
    }
}

impl<C: TokenCounter> TokenCounter for CachedCounter<C> {
    fn count_text(&self, text: &str) -> usize {
        self.inner.count_text(text)
    }

    fn count_message(&self, message: &Message) -> usize {
        let key = message_hash(message);
        if let Some(n) = self.cache.get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return n;
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let n = self.inner.count_message(message);
        self.cache.insert(key, n);
        n
    }

    fn request_overhead(&self) -> usize {
        self.inner.request_overhead()
    }

    fn count_tools(&self, tools: &[Value]) -> usize {
        self.inner.count_tools(tools)
    }
}

impl<C: std::fmt::Debug> std::fmt::Debug for CachedCounter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedCounter")
            .field("inner", &self.inner)
            .field("entries", &self.cache.len())
            .field("hits", &self.hits.load(Ordering::Relaxed))
            .field("misses", &self.misses.load(Ordering::Relaxed))
            .finish()
    }
}

/// Feeds serialized JSON straight into the hasher, without a buffer.
struct HashWriter<'a>(&'a mut Xxh3);

impl io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// 128-bit XXH3 of the fields of `message` that a counter reads: role,
/// name, content, tool calls' names and arguments, legacy function call,
/// `tool_call_id` and `reasoning_content`. Every field is tagged and
/// length-prefixed, so different messages cannot produce the same byte
/// stream.
pub fn message_hash(message: &Message) -> u128 {
    let mut h = Xxh3::new();
    let put = |h: &mut Xxh3, tag: u8, s: &str| {
        h.update(&[tag]);
        h.update(&(s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    let put_call = |h: &mut Xxh3, f: &FunctionCall| {
        put(h, b'f', &f.name);
        put(h, b'a', &f.arguments);
    };
    put(&mut h, b'r', message.role.as_str());
    if let Some(name) = &message.name {
        put(&mut h, b'n', name);
    }
    match &message.content {
        Content::Absent => h.update(b"A"),
        Content::Null => h.update(b"N"),
        Content::Text(s) => put(&mut h, b'T', s),
        Content::Parts(parts) => {
            h.update(b"P");
            h.update(&(parts.len() as u64).to_le_bytes());
            for part in parts {
                h.update(b"p");
                // Writing into the hasher cannot fail; a part is plain JSON.
                let _ = serde_json::to_writer(HashWriter(&mut h), part);
            }
        }
    }
    for call in message.tool_calls() {
        h.update(b"c");
        if let Some(f) = &call.function {
            put_call(&mut h, f);
        }
    }
    if let Some(f) = &message.function_call {
        h.update(b"F");
        put_call(&mut h, f);
    }
    if let Some(id) = &message.tool_call_id {
        put(&mut h, b'i', id);
    }
    if let Some(r) = &message.reasoning_content {
        put(&mut h, b'R', r);
    }
    h.digest128()
}
