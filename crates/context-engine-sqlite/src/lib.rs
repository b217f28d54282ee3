//! context-engine-sqlite: [`SqliteStore`], the session store of
//! `context-engine` in an embedded SQLite file, a thin adapter behind the
//! core's [`SessionStore`] trait (the core links no SQLite); [`open`] and
//! [`open_at_rest`] pick a store from a path (`:memory:` or a file).
//!
//! WAL journal (readers never block the writer; a killed process loses at
//! most the transaction it was in), `synchronous = NORMAL` (durable across
//! process crashes; a power loss may drop the last commits, never corrupt),
//! foreign keys on, prepared statements cached per connection. The
//! full-text index (one document per archive row, a session's documents
//! one rowid range: [`search`]) trails the archive by at most
//! [`INDEX_BATCH`](index::INDEX_BATCH) rows: a commit writes the messages
//! and their rows, and the index takes the waiting rows in one go (in the
//! transaction of the commit that reaches the batch, on open), because an
//! FTS5 insert writes a new index segment per transaction, which cost more
//! than the rest of a model call's commit. A search never misses a
//! message: it scans what waits of its session. Searches run on read
//! connections of their own (a file store), never under the writer's lock. A file store
//! checkpoints the write-ahead log in a background thread of its own (its
//! own connection, a passive checkpoint every [`CHECKPOINT_EVERY`](checkpoint::CHECKPOINT_EVERY)
//! commits), so a commit does not wait for the checkpoint's `fsync`; the
//! connection's own automatic checkpoint stays as a backstop at
//! [`AUTOCHECKPOINT_PAGES`](checkpoint::AUTOCHECKPOINT_PAGES). The schema
//! is versioned by `PRAGMA user_version` and stamped with an
//! `application_id`, and the files under `src/migrations/sqlite/` run in
//! order on open, each in the transaction that records it.

mod checkpoint;
mod index;
mod open;
mod pack;
mod schema;
mod search;
mod session;
mod write;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OptionalExtension, params};
use serde_json::Value;

use crate::pack::unpack;
use checkpoint::Checkpointer;
use context_engine::message::Message;
use context_engine::store::{
    AtRest, MEMORY_PATH, MemoryStore, SessionStore, StoreError, Versioned,
};
use index::Waiting;
use search::Readers;

#[cfg(test)]
pub(crate) use index::INDEX_BATCH;
pub use schema::SCHEMA_VERSION;
#[cfg(test)]
pub(crate) use schema::{MIGRATIONS_FOR_TEST, migrate_for_test};
#[cfg(test)]
pub(crate) use search::INDEX_ROWS;

/// How many of the newest matches a search ranks at a time.
const SEARCH_WINDOW: usize = 64;

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
    /// Commits so far (every [`CHECKPOINT_EVERY`](checkpoint::CHECKPOINT_EVERY)th wakes the checkpoint).
    commits: AtomicUsize,
    /// The background checkpoint of a file store opened for writing.
    checkpoint: Option<Checkpointer>,
    /// The read connections searches run on (a file store opened for
    /// writing; otherwise searches share `conn`).
    readers: Option<Readers>,
}

impl SqliteStore {
    fn lock(&self) -> MutexGuard<'_, Connection> {
        // rusqlite rolls back an unfinished transaction when it is dropped,
        // so a panic under the lock leaves nothing half-written.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection's lock, held by a test.
    #[cfg(test)]
    pub(crate) fn hold_for_test(&self) -> MutexGuard<'_, Connection> {
        self.lock()
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

/// Opens the store at `path`: `:memory:` for a [`MemoryStore`], else a
/// [`SqliteStore`] file (created when missing, migrated when older), which
/// keeps every text redacted with the built-in rules ([`AtRest`]'s
/// default; [`open_at_rest`] for the user's patterns or a verbatim store).
pub fn open(path: &Path) -> Result<Arc<dyn SessionStore>, StoreError> {
    open_at_rest(path, &AtRest::default())
}

/// [`open`] with `at_rest` applied to everything written and read (what
/// every command and server that turns configuration into a store uses).
pub fn open_at_rest(path: &Path, at_rest: &AtRest) -> Result<Arc<dyn SessionStore>, StoreError> {
    let backend: Arc<dyn SessionStore> = if path.as_os_str() == MEMORY_PATH {
        Arc::new(MemoryStore::new())
    } else {
        Arc::new(SqliteStore::open(path)?)
    };
    Ok(at_rest.wrap(backend))
}

#[cfg(test)]
mod search_tests;
#[cfg(test)]
mod tests;
