//! [`MemoryStore`]: the store in a process's memory, for replays and tests.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::handle::{message_handle, result_handles};
use super::text::index_text;
use super::{
    Batch, CompactionRecord, Entry, EntryKind, HandleEntry, MEMORY_PATH, SearchHit, SessionStore,
    StoreError, Terms, duplicate_compaction,
};
use crate::message::Message;

/// A [`SessionStore`] in memory: nothing survives the process. Same
/// semantics as `context_engine_sqlite::SqliteStore`, including the
/// all-or-nothing commit.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// hash → message and its indexed text.
    messages: HashMap<String, (Message, String)>,
    sessions: BTreeMap<String, Session>,
    /// (session, job) → owner and when the claim expires.
    claims: HashMap<(String, String), (String, Instant)>,
}

#[derive(Debug, Default)]
struct Session {
    state: Option<Value>,
    handles: BTreeMap<String, HandleEntry>,
    /// Archived message hashes, in archive order.
    archived: Vec<String>,
    archived_set: HashSet<String>,
    compactions: Vec<CompactionRecord>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied batch:
        // commit checks everything before it changes anything.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SessionStore for MemoryStore {
    fn location(&self) -> String {
        MEMORY_PATH.to_owned()
    }

    fn commit(&self, session: &str, batch: &Batch) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if let Some(s) = inner.sessions.get(session) {
            for c in batch.compactions() {
                if s.compactions.iter().any(|k| k.seq == c.seq) {
                    return Err(duplicate_compaction(MEMORY_PATH, session, c.seq));
                }
            }
        }
        for (hash, message) in batch.messages() {
            inner
                .messages
                .entry(hash.clone())
                .or_insert_with(|| (message.clone(), index_text(message)));
        }
        let s = inner.sessions.entry(session.to_owned()).or_default();
        for (hash, _) in batch.messages() {
            if s.archived_set.insert(hash.clone()) {
                s.archived.push(hash.clone());
            }
        }
        for h in batch.handles() {
            s.handles
                .entry(h.handle.clone())
                .or_insert_with(|| h.clone());
        }
        s.compactions.extend(batch.compactions().iter().cloned());
        if let Some(state) = batch.state() {
            s.state = Some(state.clone());
        }
        Ok(())
    }

    fn load_state(&self, session: &str) -> Result<Option<Value>, StoreError> {
        Ok(self
            .lock()
            .sessions
            .get(session)
            .and_then(|s| s.state.clone()))
    }

    fn resolve(&self, session: Option<&str>, handle: &str) -> Result<Option<Entry>, StoreError> {
        let inner = self.lock();
        let found = inner
            .sessions
            .iter()
            .filter(|(name, _)| session.is_none_or(|s| s == name.as_str()))
            .find_map(|(name, s)| s.handles.get(handle).map(|h| (name, h)));
        let Some((name, entry)) = found else {
            return Ok(None);
        };
        let messages = entry
            .hashes
            .iter()
            .map(|hash| {
                inner
                    .messages
                    .get(hash)
                    .map(|(m, _)| m.clone())
                    .ok_or_else(|| StoreError::Corrupt {
                        location: MEMORY_PATH.to_owned(),
                        detail: format!("handle `{handle}` names a missing message {hash}"),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Entry {
            handle: handle.to_owned(),
            kind: entry.kind,
            session: name.clone(),
            messages,
            start: entry.start,
            end: entry.end,
        }))
    }

    fn search(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let terms = Terms::new(query);
        if terms.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let inner = self.lock();
        let sessions: Vec<&Session> = inner
            .sessions
            .iter()
            .filter(|(name, _)| session.is_none_or(|s| s == name.as_str()))
            .map(|(_, s)| s)
            .collect();
        for all in [true, false] {
            // No rank of its own: the newest first, and (any word) the
            // messages holding more of the words before them.
            let mut hits = Vec::new();
            let mut seen = HashSet::new();
            'scan: for s in &sessions {
                for hash in s.archived.iter().rev() {
                    let Some((message, text)) = inner.messages.get(hash) else {
                        continue;
                    };
                    if !seen.contains(hash) && terms.matches(text, all) {
                        seen.insert(hash.clone());
                        let spans = s
                            .handles
                            .values()
                            .filter(|h| h.kind == EntryKind::Span && h.hashes.contains(hash))
                            .map(|h| h.handle.clone())
                            .collect();
                        hits.push(SearchHit::archived(message, hash, spans, text, &terms));
                        // Every hit holds every word: the newest are the best.
                        if all && hits.len() == limit {
                            break 'scan;
                        }
                    }
                }
            }
            hits.sort_by_key(|h| std::cmp::Reverse(h.terms));
            hits.truncate(limit);
            if !hits.is_empty() || terms.len() == 1 {
                return Ok(hits);
            }
        }
        Ok(Vec::new())
    }

    fn compactions(&self, session: &str) -> Result<Vec<CompactionRecord>, StoreError> {
        Ok(self
            .lock()
            .sessions
            .get(session)
            .map(|s| s.compactions.clone())
            .unwrap_or_default())
    }

    fn handles(&self, session: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .lock()
            .sessions
            .get(session)
            .map(|s| s.handles.keys().cloned().collect())
            .unwrap_or_default())
    }

    fn delete_session(&self, session: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.sessions.remove(session);
        inner.claims.retain(|(s, _), _| s != session);
        Ok(())
    }

    fn try_claim(
        &self,
        session: &str,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let key = (session.to_owned(), job.to_owned());
        if let Some((holder, expires)) = inner.claims.get(&key)
            && holder != owner
            && *expires > now
        {
            return Ok(false);
        }
        inner.claims.insert(key, (owner.to_owned(), now + ttl));
        Ok(true)
    }

    fn release(&self, session: &str, job: &str, owner: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let key = (session.to_owned(), job.to_owned());
        if inner
            .claims
            .get(&key)
            .is_some_and(|(holder, _)| holder == owner)
        {
            inner.claims.remove(&key);
        }
        Ok(())
    }
}

/// The handle a search hit names: a tool result's recall handle, else the
/// message's `m…` handle.
pub fn hit_handle(message: &Message, hash: &str) -> String {
    result_handles(message)
        .into_iter()
        .next()
        .unwrap_or_else(|| message_handle(hash))
}
