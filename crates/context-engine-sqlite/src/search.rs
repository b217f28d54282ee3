//! Search: the full-text query restricted to the caller's session inside
//! the index (its documents are one rowid range), on a read connection of
//! its own, so that neither what other sessions archived nor a long
//! search touches anyone else's requests.
//!
//! Cost: the index's terms are the session's own (each token of a
//! session's document is written with the session's mark, `s{no}x`, and
//! so is each token of its query: [`session_text`](super::index::session_text)),
//! so the query reads only the session's doclists, whatever other
//! sessions hold (a word they have is another term); it is bounded to the
//! session's rowid range as well, and reads its documents newest first, a
//! window at a time. The rank is not FTS5's `bm25`: its statistics (how
//! many documents hold each word) take a scan of every match in the store,
//! other sessions' included. A window's hits are ordered by the words
//! they hold, then newest first, as the other backends do.
//!
//! A file store searches on a read connection from a small pool (WAL:
//! readers never wait for the writer, nor the writer for them), in one
//! read transaction (what waits for the index and what is in it are seen
//! at one moment); an in-memory store has only its one connection. What
//! the handle's own commits left waiting for the index (a batch at most)
//! is indexed first when the writer's connection is free (`try_lock`:
//! never waited for), else scanned.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use super::index::{Waiting, docs_of, index_waiting, session_query, split_doc};
use super::{BUSY_TIMEOUT, SEARCH_WINDOW, SqliteStore, map_err};
use context_engine::store::backend::index_text;
use context_engine::store::backend::query_words;
use context_engine::store::{MEMORY_PATH, SearchHit, StoreError, Terms};

/// Idle read connections kept for searches.
const IDLE_READERS: usize = 8;

/// The read connections of a file store's searches.
#[derive(Debug)]
pub(super) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    pub(super) fn new(path: &Path) -> Readers {
        Readers {
            path: path.to_path_buf(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on an idle read connection, or a new one.
    fn with<R>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => {
                let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
                let conn = Connection::open_with_flags(&self.path, flags)
                    .map_err(|e| map_err(&self.path, e))?;
                conn.busy_timeout(BUSY_TIMEOUT)
                    .map_err(|e| map_err(&self.path, e))?;
                conn
            }
        };
        let out = f(&conn);
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_READERS {
            idle.push(conn);
        }
        out
    }
}

/// A document the index matched, before it becomes a hit.
struct Candidate {
    id: i64,
    count: usize,
    hash: String,
    message: context_engine::message::Message,
    text: String,
}

#[cfg(test)]
thread_local! {
    /// Documents the full-text query yielded on this thread (tests: what
    /// a search read of the index).
    pub(crate) static INDEX_ROWS: std::cell::Cell<usize> =
        const { std::cell::Cell::new(0) };
}

impl SqliteStore {
    /// The stored message `json` as a candidate when its text holds the
    /// search's words (all of them, or any, as `mode` asks).
    fn candidate(
        &self,
        id: i64,
        hash: String,
        json: rusqlite::types::Value,
        mode: &Mode<'_>,
    ) -> Result<Option<Candidate>, StoreError> {
        let message = self.parse_message(json)?;
        let text = index_text(&message);
        Ok(mode.terms.matching(&text, mode.all).map(|count| Candidate {
            id,
            count,
            hash,
            message,
            text,
        }))
    }

    /// [`SessionStore::search`](context_engine::store::SessionStore::search) (see
    /// the module docs).
    pub(super) fn search_scoped(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let words = query_words(query);
        let terms = Terms::of_words(&words);
        if terms.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        // What this handle's commits left waiting for the index goes in
        // first when the writer's connection is free (at most a batch,
        // the work the next commit would do); else the search scans it.
        match &self.readers {
            Some(_) => {
                if let Ok(mut conn) = self.conn.try_lock() {
                    self.index_now(&mut conn);
                }
            }
            // In memory: one connection, the search's too.
            None if self.path.as_os_str() == MEMORY_PATH => self.index_now(&mut self.lock()),
            // Opened for reading: it scans what waits.
            None => {}
        }
        let run = |conn: &Connection| {
            let tx = conn.unchecked_transaction().map_err(|e| self.err(e))?;
            let hits = self.search_on(&tx, session, &words, &terms, limit);
            // A read: nothing to keep (dropping it would roll back too).
            let _ = tx.rollback();
            hits
        };
        match &self.readers {
            Some(readers) => readers.with(run),
            None => run(&self.lock()),
        }
    }

    /// Indexes what waits for the index, if anything (this handle's
    /// commits' texts known, others read back); a failure (another writer
    /// holds the file) leaves it to the next commit, and the search scans
    /// it meanwhile.
    fn index_now(&self, conn: &mut Connection) {
        let mut texts = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        // What waits may be another writer's, or read back (a delete
        // forgets the texts): the file says.
        let pending = texts.is_empty()
            && conn
                .query_row("SELECT EXISTS (SELECT 1 FROM search_pending)", [], |r| {
                    r.get::<_, bool>(0)
                })
                .unwrap_or(false);
        if texts.is_empty() && !pending {
            return;
        }
        let known: Vec<&Waiting> = texts.iter().collect();
        let indexed = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.err(e))
            .and_then(|tx| {
                index_waiting(&tx, &self.path, &known)?;
                tx.commit().map_err(|e| self.err(e))
            });
        if indexed.is_ok() {
            texts.clear();
        }
    }

    fn search_on(
        &self,
        conn: &Connection,
        session: Option<&str>,
        words: &[&str],
        terms: &Terms,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        // The sessions searched: the caller's, or every one, the newest
        // first (a store-wide search, the operator's).
        let sessions: Vec<i64> = match session {
            Some(s) => conn
                .prepare_cached("SELECT no FROM search_sessions WHERE session = ?1")
                .map_err(|e| self.err(e))?
                .query_row([s], |r| r.get(0))
                .optional()
                .map_err(|e| self.err(e))?
                .into_iter()
                .collect(),
            None => conn
                .prepare_cached("SELECT no FROM search_sessions ORDER BY no DESC")
                .map_err(|e| self.err(e))?
                .query_map([], |r| r.get(0))
                .map_err(|e| self.err(e))?
                .collect::<Result<_, _>>()
                .map_err(|e| self.err(e))?,
        };
        let modes: &[bool] = if words.len() == 1 {
            &[true]
        } else {
            &[true, false]
        };
        for &all in modes {
            let mut hits = Hits {
                list: Vec::with_capacity(limit),
                seen: HashSet::new(),
                limit,
            };
            for &no in &sessions {
                if hits.list.len() == limit {
                    break;
                }
                let mode = Mode { words, terms, all };
                self.search_session(conn, session, no, &mode, &mut hits)?;
            }
            if !hits.list.is_empty() {
                return Ok(hits.list);
            }
        }
        Ok(Vec::new())
    }

    /// One session's matches (numbered `no`) in one mode, into `hits`:
    /// what waits for the index, then the index, newest first.
    fn search_session(
        &self,
        conn: &Connection,
        session: Option<&str>,
        no: i64,
        mode: &Mode<'_>,
        hits: &mut Hits,
    ) -> Result<(), StoreError> {
        let (lo, hi) = docs_of(no);
        let page = (hits.limit * 4).max(SEARCH_WINDOW);
        // What waits for the index (a batch at most).
        let waiting = conn
            .prepare_cached(
                "SELECT m.id, m.hash, m.json FROM search_pending p \
                 JOIN messages m ON m.id = p.message \
                 WHERE p.doc BETWEEN ?1 AND ?2 ORDER BY p.doc DESC",
            )
            .map_err(|e| self.err(e))?
            .query_map(params![lo, hi], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, rusqlite::types::Value>(2)?,
                ))
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        let mut window = Vec::new();
        for (id, hash, json) in waiting {
            window.extend(self.candidate(id, hash, json, mode)?);
        }
        hits.take(self, conn, session, mode.terms, &mut window)?;
        // Then the index: the session's own terms, in its own range. When
        // every hit holds every word (or, of two words, one), the newest
        // are the best: a window is read only until the hits are found;
        // with more words, a window is ranked by the words each holds.
        let streaming = mode.all || mode.words.len() <= 2;
        let name: String = conn
            .prepare_cached("SELECT session FROM search_sessions WHERE no = ?1")
            .map_err(|e| self.err(e))?
            .query_row([no], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let expr = session_query(no, mode.words, mode.all);
        let mut upper = hi;
        while hits.list.len() < hits.limit {
            let docs = conn
                .prepare_cached(
                    "SELECT rowid FROM archive_fts WHERE archive_fts MATCH ?1 \
                     AND rowid BETWEEN ?2 AND ?3 ORDER BY rowid DESC LIMIT ?4",
                )
                .map_err(|e| self.err(e))?
                .query_map(params![expr, lo, upper, page as i64], |r| {
                    r.get::<_, i64>(0)
                })
                .map_err(|e| self.err(e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| self.err(e))?;
            #[cfg(test)]
            INDEX_ROWS.with(|n| n.set(n.get() + docs.len()));
            let mut window = Vec::with_capacity(docs.len());
            for &doc in &docs {
                if streaming && hits.list.len() == hits.limit {
                    break;
                }
                let (_, seq) = split_doc(doc);
                let row: Option<(i64, String, rusqlite::types::Value)> = conn
                    .prepare_cached(
                        "SELECT m.id, m.hash, m.json FROM archive a \
                         JOIN messages m ON m.id = a.message \
                         WHERE a.session = ?1 AND a.seq = ?2",
                    )
                    .map_err(|e| self.err(e))?
                    .query_row(params![name, seq], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                    .optional()
                    .map_err(|e| self.err(e))?;
                let Some((id, hash, json)) = row else {
                    continue;
                };
                // The index matched the words' tokens; the text must hold
                // the words themselves.
                if let Some(candidate) = self.candidate(id, hash, json, mode)? {
                    window.push(candidate);
                    if streaming {
                        hits.take(self, conn, session, mode.terms, &mut window)?;
                    }
                }
            }
            hits.take(self, conn, session, mode.terms, &mut window)?;
            match docs.last() {
                Some(&last) if docs.len() == page && last > lo => upper = last - 1,
                _ => break,
            }
        }
        Ok(())
    }
}

/// A search's words and whether a hit holds all of them.
struct Mode<'a> {
    words: &'a [&'a str],
    terms: &'a Terms,
    all: bool,
}

/// The hits so far: at most `limit`, a message once (a message two
/// sessions archived is one hit of a store-wide search).
struct Hits {
    list: Vec<SearchHit>,
    seen: HashSet<String>,
    limit: usize,
}

impl Hits {
    /// Moves the best of a window (newest first) into the hits: the most
    /// words first, then the newest, until the limit.
    fn take(
        &mut self,
        store: &SqliteStore,
        conn: &Connection,
        session: Option<&str>,
        terms: &Terms,
        window: &mut Vec<Candidate>,
    ) -> Result<(), StoreError> {
        // Stable: ties stay newest first.
        window.sort_by_key(|c| std::cmp::Reverse(c.count));
        for c in window.drain(..) {
            if self.list.len() == self.limit {
                break;
            }
            if !self.seen.insert(c.hash.clone()) {
                continue;
            }
            let spans = store.spans_of(conn, session, c.id)?;
            self.list.push(SearchHit::archived(
                &c.message, &c.hash, spans, &c.text, terms,
            ));
        }
        Ok(())
    }
}
