//! [`SqliteStore`]: the session store in an embedded SQLite file.
//!
//! WAL journal (readers never block the writer; a killed process loses at
//! most the transaction it was in), `synchronous = NORMAL` (durable across
//! process crashes; a power loss may drop the last commits, never corrupt),
//! foreign keys on, prepared statements cached per connection. The
//! full-text index trails the archive by at most [`INDEX_BATCH`] messages:
//! a commit writes the messages and their rows, and the index takes the
//! waiting messages in one go (in the transaction of the commit that
//! reaches the batch, before a search, on open), because an FTS5 insert
//! writes a new index segment per transaction, which cost more than the
//! rest of a model call's commit. A search never misses a message: the
//! writer indexes what waits first, a reader scans it. A file store
//! checkpoints the write-ahead log in a background thread of its own (its
//! own connection, a passive checkpoint every [`CHECKPOINT_EVERY`]
//! commits), so a commit does not wait for the checkpoint's `fsync`; the
//! connection's own automatic checkpoint stays as a backstop at
//! [`AUTOCHECKPOINT_PAGES`]. The schema
//! is versioned by `PRAGMA user_version` and stamped with an
//! `application_id`, and the files under `store/migrations/sqlite/` run in
//! order on open, each in the transaction that records it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;

use super::memory::hit_handle;
use super::pack::{pack, unpack};
use super::text::{fts_query, index_text, matches, query_words, snippet};
use super::{
    Batch, CompactionRecord, Entry, EntryKind, HistoryWrite, MEMORY_PATH, SearchHit, SessionStore,
    Since, StoreError, Versioned, duplicate_compaction, now_ms, version_conflict,
};
use crate::message::Message;

/// The schema version this build writes (and the newest it reads).
pub const SCHEMA_VERSION: i64 = 4;

/// `PRAGMA application_id` of a context-engine store ("CTXS").
const APPLICATION_ID: i64 = 0x4354_5853;

/// The migrations, in order: schema version reached, SQL.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("migrations/sqlite/0001_init.sql")),
    (
        2,
        include_str!("migrations/sqlite/0002_deflated_messages.sql"),
    ),
    (3, include_str!("migrations/sqlite/0003_claims.sql")),
    (
        4,
        include_str!("migrations/sqlite/0004_history_segments.sql"),
    ),
];

/// How many of the newest matches a search ranks at a time.
const SEARCH_WINDOW: usize = 64;

/// How many archived messages may wait for the full-text index (see the
/// module docs): the commit that reaches this many indexes them all.
pub const INDEX_BATCH: usize = 32;

/// Commits between two background checkpoints of the write-ahead log.
pub const CHECKPOINT_EVERY: usize = 64;

/// The write-ahead log's size, in pages, at which a commit checkpoints it
/// itself (the background checkpoint fell behind): four times SQLite's
/// default.
pub const AUTOCHECKPOINT_PAGES: u32 = 4_000;

/// How long a write waits for another writer before [`StoreError::Locked`].
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// A [`SessionStore`] in a SQLite file (see the module docs).
#[derive(Debug)]
pub struct SqliteStore {
    conn: Mutex<Connection>,
    path: PathBuf,
    /// The messages this handle archived that wait for the index: id,
    /// hash and indexed text, in id order (changed under the connection's
    /// lock), so indexing them does not read them back.
    waiting: Mutex<Vec<Waiting>>,
    /// Opened for writing (a reader scans what waits instead).
    write: bool,
    /// Commits so far (every [`CHECKPOINT_EVERY`]th wakes the checkpoint).
    commits: AtomicUsize,
    /// The background checkpoint of a file store opened for writing.
    checkpoint: Option<Checkpointer>,
}

/// A message waiting for the index, as the commit that archived it saw it.
#[derive(Debug)]
struct Waiting {
    id: i64,
    hash: String,
    text: String,
}

/// The background checkpoint: a thread with its own connection that runs
/// a passive checkpoint when woken, and stops when the store is dropped.
#[derive(Debug)]
struct Checkpointer {
    wake: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the thread for the store file at `path`; `None` when it cannot
    /// (the connection's own checkpoint then does the work).
    fn start(path: &Path) -> Option<Checkpointer> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).ok()?;
        conn.busy_timeout(BUSY_TIMEOUT).ok()?;
        let (wake, woken) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("ctx-store-checkpoint".into())
            .spawn(move || checkpoint_loop(&conn, &woken))
            .ok()?;
        Some(Checkpointer {
            wake: Some(wake),
            thread: Some(thread),
        })
    }

    /// Wakes the thread, unless a wake-up is already pending.
    fn wake(&self) {
        if let Some(wake) = &self.wake {
            // Full: a wake-up is pending already; disconnected: stopping.
            let _ = wake.try_send(());
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Closing the channel ends the loop; the thread finishes the
        // checkpoint it is in, if any.
        drop(self.wake.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs a passive checkpoint each time it is woken (it never blocks the
/// writer; what it cannot copy now, the next one does). A failure is left
/// to the next one and to the writer's own automatic checkpoint.
fn checkpoint_loop(conn: &Connection, woken: &Receiver<()>) {
    while woken.recv().is_ok() {
        let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
    }
}

impl SqliteStore {
    /// Opens (or creates) the store file at `path`, creating its folder,
    /// and migrates an older schema. Fails with a clear error, never a new
    /// store in its place, when the file is not a store, was written by a
    /// newer version, is read-only, or another writer holds it.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            private_dir(dir).map_err(|e| StoreError::Backend {
                location: path.display().to_string(),
                detail: format!("cannot create the folder {}: {e}", dir.display()),
            })?;
        }
        let private = |e: std::io::Error| StoreError::Backend {
            location: path.display().to_string(),
            detail: format!("cannot make the store file private (mode 0600): {e}"),
        };
        create_private(path);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let store = SqliteStore::open_with(path, flags, true)?;
        // Only a file found to be a store is touched.
        narrow_private(path).map_err(private)?;
        Ok(store)
    }

    /// Opens an existing store file for reading only (`ctx recall`,
    /// `ctx search`): nothing is created or migrated.
    pub fn open_read_only(path: &Path) -> Result<SqliteStore, StoreError> {
        if !path.exists() {
            return Err(StoreError::NotFound {
                what: format!("store file {}", path.display()),
            });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        SqliteStore::open_with(path, flags, false)
    }

    /// A SQLite store in memory (the same engine and schema as a file).
    pub fn open_in_memory() -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_in_memory().map_err(|e| map_err(Path::new(MEMORY_PATH), e))?;
        SqliteStore::init(conn, PathBuf::from(MEMORY_PATH), true)
    }

    pub(super) fn open_with(
        path: &Path,
        flags: OpenFlags,
        write: bool,
    ) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_with_flags(path, flags).map_err(|e| map_err(path, e))?;
        SqliteStore::init(conn, path.to_path_buf(), write)
    }

    fn init(conn: Connection, path: PathBuf, write: bool) -> Result<SqliteStore, StoreError> {
        let err = |e| map_err(&path, e);
        conn.busy_timeout(BUSY_TIMEOUT).map_err(err)?;
        if write && conn.is_readonly(rusqlite::MAIN_DB).map_err(err)? {
            return Err(StoreError::ReadOnly { path });
        }
        check_identity(&conn, &path)?;
        if write {
            if path.as_os_str() != MEMORY_PATH {
                let mode: String = conn
                    .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                    .map_err(err)?;
                if !mode.eq_ignore_ascii_case("wal") {
                    return Err(StoreError::Backend {
                        location: path.display().to_string(),
                        detail: format!("cannot use the WAL journal (journal mode is {mode})"),
                    });
                }
            }
            conn.execute_batch(&format!(
                "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
                 PRAGMA secure_delete = ON; \
                 PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES};"
            ))
            .map_err(err)?;
            migrate(&conn, &path, MIGRATIONS)?;
            // Take the write lock once: another writer holding it is an
            // error now, not a surprise at the first compaction; and index
            // what a killed writer left waiting.
            let tx = rusqlite::Transaction::new_unchecked(&conn, TransactionBehavior::Immediate)
                .map_err(err)?;
            index_waiting(&tx, &path, &[])?;
            tx.commit().map_err(err)?;
        } else if user_version(&conn, &path)? < SCHEMA_VERSION {
            return Err(StoreError::Backend {
                location: path.display().to_string(),
                detail: "the store has an older schema; open it once for writing (e.g. `ctx compact --store`) to migrate it".into(),
            });
        }
        let checkpoint = (write && path.as_os_str() != MEMORY_PATH)
            .then(|| Checkpointer::start(&path))
            .flatten();
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            path,
            waiting: Mutex::new(Vec::new()),
            write,
            commits: AtomicUsize::new(0),
            checkpoint,
        })
    }

    /// The file (or `:memory:`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The database's size on disk in bytes (pages in use times page size,
    /// the write-ahead log not included); `None` in memory.
    pub fn size_bytes(&self) -> Result<u64, StoreError> {
        let conn = self.lock();
        let pages: i64 = conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        Ok((pages.max(0) as u64) * (size.max(0) as u64))
    }

    /// Checkpoints the write-ahead log into the main file and runs SQLite's
    /// integrity check; `Ok(())` when the file is sound.
    pub fn check(&self) -> Result<(), StoreError> {
        let conn = self.lock();
        let result: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        if result != "ok" {
            return Err(StoreError::Corrupt {
                location: self.path.display().to_string(),
                detail: result,
            });
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // rusqlite rolls back an unfinished transaction when it is dropped,
        // so a panic under the lock leaves nothing half-written.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        map_err(&self.path, e)
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            location: self.path.display().to_string(),
            detail,
        }
    }

    /// The message a stored value holds (JSON, or deflated JSON).
    fn parse_message(&self, stored: rusqlite::types::Value) -> Result<Message, StoreError> {
        let json = unpack(stored).map_err(|e| self.corrupt(format!("archived message: {e}")))?;
        serde_json::from_str(&json).map_err(|e| self.corrupt(format!("archived message: {e}")))
    }

    /// A session's versioned record: the state slot and the history
    /// segments from `from` on (from 0: a history an older schema left in
    /// the slot when there are none).
    fn read_versioned(
        &self,
        conn: &Connection,
        session: &str,
        from: usize,
    ) -> Result<Option<Versioned>, StoreError> {
        let json: Option<String> = conn
            .prepare_cached("SELECT json FROM state WHERE session = ?1")
            .map_err(|e| self.err(e))?
            .query_row([session], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))?;
        let Some(json) = json else {
            return Ok(None);
        };
        let saved: Value = serde_json::from_str(&json)
            .map_err(|e| self.corrupt(format!("state of `{session}`: {e}")))?;
        let segments = conn
            .prepare_cached(
                "SELECT segment FROM history WHERE session = ?1 AND seq >= ?2 ORDER BY seq",
            )
            .map_err(|e| self.err(e))?
            .query_map(rusqlite::params![session, from as i64], |r| {
                r.get::<_, String>(0)
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        let mut record = Versioned::unwrap(&self.location(), session, saved)?;
        if !segments.is_empty() || from > 0 {
            record.history = segments;
        }
        Ok(Some(record))
    }

    /// The version of `session`'s record, if it has one.
    fn version_on(&self, conn: &Connection, session: &str) -> Result<Option<u64>, StoreError> {
        let version: Option<i64> = conn
            .prepare_cached("SELECT version FROM state WHERE session = ?1")
            .map_err(|e| self.err(e))?
            .query_row([session], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(version.map(|v| v.max(0) as u64))
    }

    /// Whether message `id` is archived by `session` (any session when
    /// `None`).
    fn archived_in(
        &self,
        conn: &Connection,
        id: i64,
        session: Option<&str>,
    ) -> Result<bool, StoreError> {
        conn.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM archive \
             WHERE message = ?1 AND (?2 IS NULL OR session = ?2))",
        )
        .map_err(|e| self.err(e))?
        .query_row(params![id, session], |r| r.get(0))
        .map_err(|e| self.err(e))
    }

    /// The messages not in the full-text index yet, oldest first: id,
    /// hash, stored JSON.
    fn unindexed(
        &self,
        conn: &Connection,
    ) -> Result<Vec<(i64, String, rusqlite::types::Value)>, StoreError> {
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT id, hash, json FROM messages WHERE id > ({INDEXED_UPTO}) ORDER BY id"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    fn spans_of(
        &self,
        conn: &Connection,
        session: Option<&str>,
        message: i64,
    ) -> Result<Vec<String>, StoreError> {
        let mut stmt = conn
            .prepare_cached(
                "SELECT DISTINCT hm.handle FROM handle_members hm \
                 JOIN handles h ON h.session = hm.session AND h.handle = hm.handle \
                 WHERE hm.message = ?1 AND h.kind = 'span' AND (?2 IS NULL OR hm.session = ?2)",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![message, session], |r| r.get::<_, String>(0))
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }
}

impl SessionStore for SqliteStore {
    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn commit(&self, session: &str, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.transact(session, &[batch], |_| Ok(()))
    }

    fn load_state(&self, session: &str) -> Result<Option<Value>, StoreError> {
        let conn = self.lock();
        let json: Option<String> = conn
            .prepare_cached("SELECT json FROM state WHERE session = ?1")
            .map_err(|e| self.err(e))?
            .query_row([session], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))?;
        json.map(|j| {
            serde_json::from_str(&j).map_err(|e| self.corrupt(format!("state of `{session}`: {e}")))
        })
        .transpose()
    }

    fn resolve(&self, session: Option<&str>, handle: &str) -> Result<Option<Entry>, StoreError> {
        let conn = self.lock();
        let head = conn
            .prepare_cached(
                "SELECT session, kind, span_start, span_end FROM handles \
                 WHERE handle = ?1 AND (?2 IS NULL OR session = ?2) ORDER BY session LIMIT 1",
            )
            .map_err(|e| self.err(e))?
            .query_row(params![handle, session], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            })
            .optional()
            .map_err(|e| self.err(e))?;
        let Some((owner, kind, start, end)) = head else {
            return Ok(None);
        };
        let kind = EntryKind::from_name(&kind)
            .ok_or_else(|| self.corrupt(format!("handle `{handle}` has kind `{kind}`")))?;
        let mut stmt = conn
            .prepare_cached(
                "SELECT m.json FROM handle_members hm JOIN messages m ON m.id = hm.message \
                 WHERE hm.session = ?1 AND hm.handle = ?2 ORDER BY hm.pos",
            )
            .map_err(|e| self.err(e))?;
        let jsons = stmt
            .query_map(params![owner, handle], |r| {
                r.get::<_, rusqlite::types::Value>(0)
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        let messages = jsons
            .into_iter()
            .map(|j| self.parse_message(j))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Entry {
            handle: handle.to_owned(),
            kind,
            session: owner,
            messages,
            start: start.map(|s| s.max(0) as usize),
            end: end.map(|e| e.max(0) as usize),
        }))
    }

    fn search(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let words = query_words(query);
        if words.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.lock();
        // What waits for the index: the writer indexes it now; a reader
        // (or a writer that cannot take the lock) scans it below.
        let mut waiting = self.unindexed(&conn)?;
        if self.write && !waiting.is_empty() {
            let mut texts = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
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
                waiting.clear();
            }
        }
        let modes: &[bool] = if words.len() == 1 {
            &[true]
        } else {
            &[true, false]
        };
        // Ranking every match costs as much as there are matches (a common
        // word in a large archive: thousands), so the newest matches come
        // first, a window at a time (FTS5 walks its index by rowid and stops
        // at the LIMIT), and each window is ranked best first; the session
        // and the message are point lookups by key afterwards.
        let page = (limit * 4).max(SEARCH_WINDOW);
        for &all in modes {
            let expr = fts_query(&words, all);
            let mut hits = Vec::with_capacity(limit);
            // The newest messages first: those not indexed yet.
            for (id, hash, json) in waiting.iter().rev() {
                if hits.len() == limit {
                    break;
                }
                if !self.archived_in(&conn, *id, session)? {
                    continue;
                }
                let message = self.parse_message(json.clone())?;
                let text = index_text(&message);
                if !matches(&text, &words, all) {
                    continue;
                }
                hits.push(SearchHit {
                    handle: hit_handle(&message, hash),
                    spans: self.spans_of(&conn, session, *id)?,
                    role: message.role.as_str().to_owned(),
                    source: "archive",
                    snippet: snippet(&text, &words),
                });
            }
            let mut offset = 0usize;
            while hits.len() < limit {
                let ids = conn
                    .prepare_cached(
                        "SELECT rowid FROM (SELECT rowid, rank FROM message_fts \
                         WHERE message_fts MATCH ?1 ORDER BY rowid DESC LIMIT ?2 OFFSET ?3) \
                         ORDER BY rank",
                    )
                    .map_err(|e| self.err(e))?
                    .query_map(params![expr, page as i64, offset as i64], |r| {
                        r.get::<_, i64>(0)
                    })
                    .map_err(|e| self.err(e))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| self.err(e))?;
                for &id in &ids {
                    if !self.archived_in(&conn, id, session)? {
                        continue;
                    }
                    let (hash, json): (String, rusqlite::types::Value) = conn
                        .prepare_cached("SELECT hash, json FROM messages WHERE id = ?1")
                        .map_err(|e| self.err(e))?
                        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
                        .map_err(|e| self.err(e))?;
                    let message = self.parse_message(json)?;
                    // The index matched the words' tokens; the text must
                    // hold the words themselves.
                    let text = index_text(&message);
                    if !matches(&text, &words, all) {
                        continue;
                    }
                    hits.push(SearchHit {
                        handle: hit_handle(&message, &hash),
                        spans: self.spans_of(&conn, session, id)?,
                        role: message.role.as_str().to_owned(),
                        source: "archive",
                        snippet: snippet(&text, &words),
                    });
                    if hits.len() == limit {
                        break;
                    }
                }
                if hits.len() == limit || ids.len() < page {
                    break;
                }
                offset += page;
            }
            if !hits.is_empty() {
                return Ok(hits);
            }
        }
        Ok(Vec::new())
    }

    fn compactions(&self, session: &str) -> Result<Vec<CompactionRecord>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare_cached(
                "SELECT seq, created_ms, trigger, engine, summarizer, handle, span_start, span_end, \
                 archived, summary, tokens_before, tokens_after FROM compactions \
                 WHERE session = ?1 ORDER BY seq",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([session], |r| {
                Ok((
                    CompactionRecord {
                        seq: r.get::<_, i64>(0)?.max(0) as u64,
                        created_ms: r.get::<_, i64>(1)?.max(0) as u64,
                        trigger: r.get(2)?,
                        engine: r.get(3)?,
                        summarizer: r.get(4)?,
                        handle: r.get(5)?,
                        start: r.get::<_, i64>(6)?.max(0) as usize,
                        end: r.get::<_, i64>(7)?.max(0) as usize,
                        archived: r.get::<_, i64>(8)?.max(0) as usize,
                        summary: Vec::new(),
                        tokens_before: r.get::<_, i64>(10)?.max(0) as u64,
                        tokens_after: r.get::<_, i64>(11)?.max(0) as u64,
                    },
                    r.get::<_, String>(9)?,
                ))
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        rows.into_iter()
            .map(|(mut record, summary)| {
                record.summary = serde_json::from_str(&summary).map_err(|e| {
                    self.corrupt(format!("compaction {} of `{session}`: {e}", record.seq))
                })?;
                Ok(record)
            })
            .collect()
    }

    fn handles(&self, session: &str) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare_cached("SELECT handle FROM handles WHERE session = ?1 ORDER BY handle")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([session], |r| r.get::<_, String>(0))
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    fn version(&self, session: &str) -> Result<Option<u64>, StoreError> {
        self.version_on(&self.lock(), session)
    }

    fn load_versioned(&self, session: &str) -> Result<Option<Versioned>, StoreError> {
        let conn = self.lock();
        self.read_versioned(&conn, session, 0)
    }

    fn load_versioned_since(&self, session: &str, known: u64) -> Result<Since, StoreError> {
        self.load_versioned_after(session, known, 0)
    }

    /// The segments after the `held` first when at least that many are
    /// stored (the caller checks they are still its own).
    fn load_versioned_after(
        &self,
        session: &str,
        known: u64,
        held: usize,
    ) -> Result<Since, StoreError> {
        let conn = self.lock();
        if self.version_on(&conn, session)?.unwrap_or(0) == known {
            return Ok(Since::Unchanged);
        }
        let stored: i64 = if known == 0 || held == 0 {
            0
        } else {
            conn.prepare_cached("SELECT count(*) FROM history WHERE session = ?1")
                .map_err(|e| self.err(e))?
                .query_row([session], |r| r.get(0))
                .map_err(|e| self.err(e))?
        };
        if held == 0 || stored < held as i64 {
            return self.read_versioned(&conn, session, 0).map(Since::Changed);
        }
        Ok(match self.read_versioned(&conn, session, held)? {
            Some(r) => Since::Appended {
                version: r.version,
                state: r.state,
                from: held,
                segments: r.history,
            },
            None => Since::Changed(None),
        })
    }

    /// The version check, the batches (each in its transaction, as
    /// [`commit`](SessionStore::commit)), then the record and its history
    /// in one transaction that checks the version again: two processes
    /// sharing the file never both write a version. Only the history
    /// segments the write names are touched.
    fn commit_versioned(
        &self,
        session: &str,
        expected: u64,
        batches: &[Batch],
        state: &Value,
        history: Option<HistoryWrite<'_>>,
    ) -> Result<u64, StoreError> {
        let found = self.version(session)?.unwrap_or(0);
        if found != expected {
            return Err(version_conflict(&self.location(), session, found, expected));
        }
        // The record below is the state: a batch's own snapshot is not
        // written. The batches (a compaction's archive) and the record
        // commit in one transaction: a crash leaves both or neither.
        let batches: Vec<Batch> = batches.iter().map(Batch::without_state).collect();
        let batches: Vec<&Batch> = batches.iter().filter(|b| !b.is_empty()).collect();
        let version = expected + 1;
        let json = Versioned::wrap(version, state, &[]).to_string();
        let location = self.location();
        let written = self.transact(session, &batches, |tx| {
            let err = |e| map_err(&self.path, e);
            let swapped = tx
                .prepare_cached(
                    "INSERT INTO state (session, json, updated_ms, version) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (session) DO UPDATE SET json = excluded.json, \
                       updated_ms = excluded.updated_ms, version = excluded.version \
                     WHERE state.version = ?5",
                )
                .map_err(err)?
                .execute(params![
                    session,
                    json,
                    now_ms() as i64,
                    version as i64,
                    expected as i64
                ])
                .map_err(err)?;
            if swapped != 1 {
                // Another process wrote it since the check: nothing is
                // written (the transaction rolls back when dropped).
                return Err(version_conflict(&location, session, expected + 1, expected));
            }
            if let Some(h) = history {
                tx.prepare_cached("DELETE FROM history WHERE session = ?1 AND seq >= ?2")
                    .map_err(err)?
                    .execute(params![session, h.keep as i64])
                    .map_err(err)?;
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO history (session, seq, segment) VALUES (?1, ?2, ?3)",
                    )
                    .map_err(err)?;
                for (i, segment) in h.append.iter().enumerate() {
                    insert
                        .execute(params![session, (h.keep + i) as i64, segment])
                        .map_err(err)?;
                }
            }
            Ok(())
        });
        match written {
            Ok(()) => Ok(version),
            Err(e @ StoreError::Duplicate { .. }) => {
                // Another process may have recorded the same compaction
                // since the check: then a lost race, not a clash.
                let found = self.version(session)?.unwrap_or(0);
                Err(if found == expected {
                    e
                } else {
                    version_conflict(&location, session, found, expected)
                })
            }
            Err(e) => Err(e),
        }
    }

    fn try_claim(
        &self,
        session: &str,
        job: &str,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let now = now_ms() as i64;
        let expires = now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        let conn = self.lock();
        // One statement: take the claim when it is free, expired or ours.
        let taken = conn
            .prepare_cached(
                "INSERT INTO claims (session, job, owner, expires_ms) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (session, job) DO UPDATE SET owner = excluded.owner, expires_ms = excluded.expires_ms \
                 WHERE claims.owner = excluded.owner OR claims.expires_ms <= ?5",
            )
            .map_err(|e| self.err(e))?
            .execute(params![session, job, owner, expires, now])
            .map_err(|e| self.err(e))?;
        Ok(taken > 0)
    }

    fn release(&self, session: &str, job: &str, owner: &str) -> Result<(), StoreError> {
        let conn = self.lock();
        conn.prepare_cached("DELETE FROM claims WHERE session = ?1 AND job = ?2 AND owner = ?3")
            .map_err(|e| self.err(e))?
            .execute(params![session, job, owner])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn delete_session(&self, session: &str) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let err = |e| map_err(&self.path, e);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        for table in [
            "handle_members",
            "handles",
            "compactions",
            "state",
            "history",
            "archive",
            "claims",
        ] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE session = ?1"),
                [session],
            )
            .map_err(err)?;
        }
        // Messages no session archives any more, and the index entries of
        // those indexed (what waits is not in the index; what stays of it
        // still has ids above the newest indexed one).
        let unindexed = tx
            .execute(
                &format!(
                    "DELETE FROM message_fts WHERE rowid IN \
                       (SELECT id FROM messages WHERE id <= ({INDEXED_UPTO}) \
                        AND id NOT IN (SELECT message FROM archive))"
                ),
                [],
            )
            .map_err(err)?;
        tx.execute(
            "DELETE FROM messages WHERE id NOT IN (SELECT message FROM archive)",
            [],
        )
        .map_err(err)?;
        if unindexed > 0 {
            // A deletion only marks the index's entries deleted; merging
            // its segments drops their tokens (and `secure_delete` zeroes
            // the pages they leave).
            tx.execute(
                "INSERT INTO message_fts(message_fts) VALUES ('optimize')",
                [],
            )
            .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        // What still waits is read back from the file when it is indexed.
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        // The freed pages were zeroed (`secure_delete`), but the log still
        // holds their old images: copy it back and empty it.
        if self.path.as_os_str() != MEMORY_PATH {
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .map_err(err)?;
        }
        Ok(())
    }
}

/// Creates `dir` (and its missing parents) readable by its owner only
/// (0700 on Unix).
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates the store file `path` readable by its owner only (0600 on
/// Unix) when it is missing: SQLite gives its `-wal` and `-shm` files the
/// database's mode.
fn create_private(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // An existing file is left alone; a folder that cannot be written
        // fails here and SQLite's own error says so.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path);
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Narrows an existing store file `path` (and its log files) that others
/// can read to 0600 (one an older version created 0644).
fn narrow_private(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for suffix in ["", "-wal", "-shm"] {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            let file = Path::new(&name);
            let Ok(meta) = std::fs::metadata(file) else {
                continue;
            };
            if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
                std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))?;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// The id of the newest indexed message. Messages are indexed in id order,
/// all that wait at once, so every message up to it is in the index and
/// every later one waits (the index's per-document table has a row per
/// indexed message; a deleted session's messages leave both).
const INDEXED_UPTO: &str = "SELECT COALESCE(MAX(id), 0) FROM message_fts_docsize";

/// Indexes every message that waits for the full-text index, in `tx`:
/// with the text the commit that archived it computed (`known`, when the
/// message with that id is still the one it archived), else read back.
fn index_waiting(tx: &Connection, path: &Path, known: &[&Waiting]) -> Result<(), StoreError> {
    let err = |e| map_err(path, e);
    let mut read = tx
        .prepare_cached(&format!(
            "SELECT id, hash FROM messages WHERE id > ({INDEXED_UPTO}) ORDER BY id"
        ))
        .map_err(err)?;
    let rows = read
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .map_err(err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    if rows.is_empty() {
        return Ok(());
    }
    let mut index = tx
        .prepare_cached("INSERT INTO message_fts (rowid, text) VALUES (?1, ?2)")
        .map_err(err)?;
    let mut json = tx
        .prepare_cached("SELECT json FROM messages WHERE id = ?1")
        .map_err(err)?;
    let corrupt = |id: i64, e: String| StoreError::Corrupt {
        location: path.display().to_string(),
        detail: format!("archived message {id}: {e}"),
    };
    for (id, hash) in rows {
        let text = match known.iter().find(|w| w.id == id && w.hash == hash) {
            Some(w) => std::borrow::Cow::Borrowed(w.text.as_str()),
            None => {
                let stored = json.query_row([id], |r| r.get(0)).map_err(err)?;
                let text = unpack(stored).map_err(|e| corrupt(id, e))?;
                let message: Message =
                    serde_json::from_str(&text).map_err(|e| corrupt(id, e.to_string()))?;
                std::borrow::Cow::Owned(index_text(&message))
            }
        };
        index.execute(params![id, text.as_ref()]).map_err(err)?;
    }
    Ok(())
}

/// Refuses a file that is not a context-engine store (another program's
/// SQLite database, or not SQLite at all) or a newer schema's.
fn check_identity(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let not_a_store = |detail: String| StoreError::NotAStore {
        path: path.to_path_buf(),
        detail,
    };
    let app: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| match e.sqlite_error_code() {
            Some(ErrorCode::NotADatabase) => {
                not_a_store("the file is not a SQLite database".into())
            }
            _ => map_err(path, e),
        })?;
    if app != 0 && app != APPLICATION_ID {
        return Err(not_a_store(format!(
            "a SQLite database of another program (application_id {app:#x})"
        )));
    }
    if app == 0 {
        let tables: i64 = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(|e| map_err(path, e))?;
        if tables > 0 {
            return Err(not_a_store(
                "a SQLite database with tables of another program".into(),
            ));
        }
    }
    let found = user_version(conn, path)?;
    let supported = MIGRATIONS.last().map_or(0, |m| m.0);
    if found > supported {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported,
        });
    }
    Ok(())
}

fn user_version(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| map_err(path, e))
}

/// Runs every migration newer than the file's `user_version`, each in the
/// transaction that sets the version it reaches.
fn migrate(conn: &Connection, path: &Path, migrations: &[(i64, &str)]) -> Result<(), StoreError> {
    let err = |e| map_err(path, e);
    for (version, sql) in migrations {
        if user_version(conn, path)? >= *version {
            continue;
        }
        conn.execute_batch("BEGIN IMMEDIATE").map_err(err)?;
        let applied = conn
            .execute_batch(sql)
            .and_then(|()| {
                conn.execute_batch(&format!(
                    "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {version};"
                ))
            })
            .and_then(|()| conn.execute_batch("COMMIT"));
        if let Err(e) = applied {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(match e.sqlite_error_code() {
                Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked | ErrorCode::ReadOnly) => {
                    map_err(path, e)
                }
                _ => StoreError::Backend {
                    location: path.display().to_string(),
                    detail: format!("migration to schema {version} failed: {e}"),
                },
            });
        }
    }
    Ok(())
}

/// A SQLite error as a [`StoreError`] naming `path`.
fn map_err(path: &Path, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Locked {
            path: path.to_path_buf(),
        },
        Some(ErrorCode::ReadOnly) => StoreError::ReadOnly {
            path: path.to_path_buf(),
        },
        Some(ErrorCode::NotADatabase) => StoreError::NotAStore {
            path: path.to_path_buf(),
            detail: "the file is not a SQLite database".into(),
        },
        _ => StoreError::Backend {
            location: path.display().to_string(),
            detail: e.to_string(),
        },
    }
}

impl SqliteStore {
    /// Writes `batches` and then what `then` writes in one transaction:
    /// all of it commits or none (a compaction's archive and the record
    /// that names it too). Indexes what waits when a batch's worth does,
    /// and wakes the checkpoint thread now and then.
    fn transact(
        &self,
        session: &str,
        batches: &[&Batch],
        then: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let err = |e| map_err(&self.path, e);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let mut added: Vec<Waiting> = Vec::new();
        for batch in batches {
            self.write_batch(&tx, session, batch, &mut added)?;
        }
        then(&tx)?;
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let flush = waiting.len() + added.len() >= INDEX_BATCH;
        if flush {
            let known: Vec<&Waiting> = waiting.iter().chain(&added).collect();
            index_waiting(&tx, &self.path, &known)?;
        }
        tx.commit().map_err(err)?;
        match flush {
            true => waiting.clear(),
            false => waiting.extend(added),
        }
        drop(waiting);
        if let Some(checkpoint) = &self.checkpoint
            && (self.commits.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(CHECKPOINT_EVERY)
        {
            checkpoint.wake();
        }
        Ok(())
    }

    /// One batch's rows, in the caller's transaction; the messages it
    /// stored for the first time join `added` (they wait for the index).
    fn write_batch(
        &self,
        tx: &rusqlite::Transaction<'_>,
        session: &str,
        batch: &Batch,
        added: &mut Vec<Waiting>,
    ) -> Result<(), StoreError> {
        let err = |e| map_err(&self.path, e);
        let mut ids: HashMap<&str, i64> = HashMap::new();
        let mut find = tx
            .prepare_cached("SELECT id FROM messages WHERE hash = ?1")
            .map_err(err)?;
        let mut insert = tx
            .prepare_cached("INSERT INTO messages (hash, role, json) VALUES (?1, ?2, ?3)")
            .map_err(err)?;
        let mut next_seq: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM archive WHERE session = ?1",
                [session],
                |r| r.get(0),
            )
            .map_err(err)?;
        let mut archive = tx
            .prepare_cached(
                "INSERT OR IGNORE INTO archive (session, message, seq) VALUES (?1, ?2, ?3)",
            )
            .map_err(err)?;
        for (hash, message) in batch.messages() {
            let id = match find
                .query_row([hash], |r| r.get::<_, i64>(0))
                .optional()
                .map_err(err)?
            {
                Some(id) => id,
                None => {
                    let json = super::handle::message_json(message);
                    insert
                        .execute(params![hash, message.role.as_str(), pack(&json)])
                        .map_err(err)?;
                    let id = tx.last_insert_rowid();
                    added.push(Waiting {
                        id,
                        hash: hash.clone(),
                        text: index_text(message),
                    });
                    id
                }
            };
            if archive
                .execute(params![session, id, next_seq])
                .map_err(err)?
                > 0
            {
                next_seq += 1;
            }
            ids.insert(hash.as_str(), id);
        }
        let mut handle = tx
            .prepare_cached(
                "INSERT OR IGNORE INTO handles (session, handle, kind, span_start, span_end) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(err)?;
        let mut member = tx
            .prepare_cached(
                "INSERT INTO handle_members (session, handle, pos, message) VALUES (?1, ?2, ?3, ?4)",
            )
            .map_err(err)?;
        for h in batch.handles() {
            let added = handle
                .execute(params![
                    session,
                    h.handle,
                    h.kind.name(),
                    h.start.map(|s| s as i64),
                    h.end.map(|e| e as i64)
                ])
                .map_err(err)?;
            if added == 0 {
                continue; // the first registration of a handle wins
            }
            for (pos, hash) in h.hashes.iter().enumerate() {
                let id = match ids.get(hash.as_str()) {
                    Some(id) => *id,
                    None => find
                        .query_row([hash], |r| r.get::<_, i64>(0))
                        .optional()
                        .map_err(err)?
                        .ok_or_else(|| {
                            self.corrupt(format!(
                                "handle `{}` names message {hash}, which is not archived",
                                h.handle
                            ))
                        })?,
                };
                member
                    .execute(params![session, h.handle, pos as i64, id])
                    .map_err(err)?;
            }
        }
        let mut record = tx
            .prepare_cached(
                "INSERT INTO compactions (session, seq, created_ms, trigger, engine, summarizer, \
                 handle, span_start, span_end, archived, summary, tokens_before, tokens_after) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )
            .map_err(err)?;
        for c in batch.compactions() {
            let summary = serde_json::to_string(&c.summary).unwrap_or_else(|_| "[]".into());
            record
                .execute(params![
                    session,
                    c.seq as i64,
                    c.created_ms as i64,
                    c.trigger,
                    c.engine,
                    c.summarizer,
                    c.handle,
                    c.start as i64,
                    c.end as i64,
                    c.archived as i64,
                    summary,
                    c.tokens_before as i64,
                    c.tokens_after as i64
                ])
                .map_err(|e| match e.sqlite_error_code() {
                    Some(ErrorCode::ConstraintViolation) => {
                        duplicate_compaction(&self.path.display().to_string(), session, c.seq)
                    }
                    _ => map_err(&self.path, e),
                })?;
        }
        if let Some(state) = batch.state() {
            tx.prepare_cached(
                "INSERT INTO state (session, json, updated_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (session) DO UPDATE SET json = excluded.json, updated_ms = excluded.updated_ms, \
                 version = 0",
            )
            .map_err(err)?
            .execute(params![session, state.to_string(), now_ms() as i64])
            .map_err(err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) fn migrate_for_test(
    conn: &Connection,
    migrations: &[(i64, &str)],
) -> Result<(), StoreError> {
    migrate(conn, Path::new(MEMORY_PATH), migrations)
}

#[cfg(test)]
pub(super) const MIGRATIONS_FOR_TEST: &[(i64, &str)] = MIGRATIONS;
