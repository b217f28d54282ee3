//! The session store: what a compaction removes is archived verbatim, so
//! nothing compacted is lost.
//!
//! Per session a store holds the engine's state (a JSON snapshot of the
//! engine and the host driver), every message that left the stored history
//! (compacted away, pruned), content-addressed by [`message_hash`] so a
//! message is kept once however often it is archived, the [handles](handle)
//! that name archived content (spans a summary replaced, tool results a
//! digest or prune shows by handle, single messages), the compaction records
//! (which input messages became which summary, when, by which summarizer)
//! and a full-text index over the archived text.
//!
//! [`SessionStore`] is the seam: small, synchronous and `Send + Sync`. The
//! library is synchronous (see ARCHITECTURE.md); an async server calls it
//! through `spawn_blocking`, and the backends of other crates implement the
//! same trait: `context-engine-sqlite` (embedded SQLite, WAL, FTS5,
//! migrations; its `open` picks a store from a path, `:memory:` or a file)
//! and `context-engine-postgres`. This crate ships [`MemoryStore`] and what
//! every backend shares ([`Batch`], handles, [`AtRest`], matching).
//!
//! Writes go through one [`Batch`] per step, applied in one transaction:
//! a compaction's record, the messages it archived, their handles and the
//! engine state after it commit together or not at all.
//!
//! ```
//! use context_engine::store::{Batch, MemoryStore, SessionStore, span_handle};
//! use context_engine::Message;
//!
//! let store = MemoryStore::new();
//! let span = vec![Message::user("fix the parser"), Message::assistant("done: src/parse.rs")];
//! let mut batch = Batch::new();
//! let handle = batch.archive_span(&span, 1, 3);
//! assert_eq!(handle, span_handle(&span));
//! store.commit("s1", &batch)?;
//! let entry = store.resolve(Some("s1"), &handle)?.expect("archived");
//! assert_eq!(entry.messages[1].text(), "done: src/parse.rs");
//! let hits = store.search(Some("s1"), "parse.rs", 5)?;
//! assert_eq!(hits.len(), 1);
//! # Ok::<(), context_engine::store::StoreError>(())
//! ```

mod archived;
mod at_rest;
mod batch;
pub mod handle;
pub mod matched_lines;
mod memory;
mod reach;
pub(crate) mod text;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::message::Message;

pub use archived::{ArchivedCompaction, archived_compactions};
pub use at_rest::{AtRest, AtRestStore, KeyError, SEALED_FIELD, Seal};
pub use batch::{ArchivedSpan, Batch, CompactionInfo};
pub use handle::{
    ArchiveNote, archive_note, archive_note_for, find_archive_note, is_store_handle, left_out_note,
    message_handle, message_hash, parse_archive_note, parse_archive_notes, span_handle,
};
pub use matched_lines::{MatchedLine, Terms};
pub use memory::MemoryStore;
pub use reach::{Reach, reachable};

/// What another crate's backend (SQLite, Postgres) shares with the built-in ones so
/// that every store indexes, matches and shows text the same way. Not a
/// stable API.
#[doc(hidden)]
pub mod backend {
    pub use super::matched_lines::query_words;
    pub use super::now_ms;
    pub use super::text::index_text;
    pub use super::{duplicate_compaction, version_conflict};
}

/// The path that selects an in-memory store (replays, tests).
pub const MEMORY_PATH: &str = ":memory:";

/// Why a store operation failed. Every variant that concerns a file names
/// it and says what to do.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The handle or session is not in the store.
    #[error("{what} not found in the store")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// Another writer changed the session's record since the version the
    /// caller read (a lost compare-and-swap,
    /// [`SessionStore::commit_versioned`]): nothing was written; read the
    /// record again and run the step again.
    #[error("{location}: conflict: {detail}")]
    Conflict {
        /// The store.
        location: String,
        /// What changed.
        detail: String,
    },
    /// The write records what the store already holds (a compaction number
    /// recorded twice): nothing was written. Not a race: writing it again
    /// clashes again, so it is never retried as a [`Conflict`](Self::Conflict) is.
    #[error("{location}: already recorded: {detail}")]
    Duplicate {
        /// The store.
        location: String,
        /// What is recorded already.
        detail: String,
    },
    /// The file is not a SQLite database, or one another program wrote.
    #[error(
        "{}: not a context-engine store ({detail}); point store.path at a new file or at a store this program wrote",
        path.display()
    )]
    NotAStore {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        detail: String,
    },
    /// A newer version of this program wrote the file.
    #[error(
        "{}: written by a newer version of context-engine (schema {found}, this version reads up to {supported}); upgrade ctx or use another store file",
        path.display()
    )]
    NewerSchema {
        /// The file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// Another process holds the write lock.
    #[error(
        "{}: locked by another writer (another ctx or agent is using this store); wait for it to finish or use another store file",
        path.display()
    )]
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// The file (or its folder, where SQLite keeps its write-ahead log)
    /// cannot be written.
    #[error(
        "{}: read-only; make the file and its folder writable, or use another store file",
        path.display()
    )]
    ReadOnly {
        /// The file.
        path: PathBuf,
    },
    /// A stored record does not parse (written by a broken program or
    /// edited by hand).
    #[error("{location}: corrupt record: {detail}")]
    Corrupt {
        /// The store and the record.
        location: String,
        /// What is wrong.
        detail: String,
    },
    /// Any other failure of the backend.
    #[error("{location}: {detail}")]
    Backend {
        /// The store (file path or `:memory:`).
        location: String,
        /// What went wrong.
        detail: String,
    },
}

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A span of messages a summary replaced.
    Span,
    /// One message (a tool result by its recall handle, or any message by
    /// its `m…` handle).
    Message,
}

impl EntryKind {
    /// The name stored and shown.
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::Span => "span",
            EntryKind::Message => "message",
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<EntryKind> {
        match name {
            "span" => Some(EntryKind::Span),
            "message" => Some(EntryKind::Message),
            _ => None,
        }
    }
}

/// One handle and what it names, as written in a [`Batch`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleEntry {
    /// The handle.
    pub handle: String,
    /// Span or message.
    pub kind: EntryKind,
    /// The [`message_hash`]es of the messages, in order.
    pub hashes: Vec<String>,
    /// For a span: its first input index (of the compaction that archived it).
    pub start: Option<usize>,
    /// For a span: one past its last input index.
    pub end: Option<usize>,
}

/// What a handle resolved to.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The handle asked for.
    pub handle: String,
    /// Span or message.
    pub kind: EntryKind,
    /// The session that archived it.
    pub session: String,
    /// The messages, verbatim, in order.
    pub messages: Vec<Message>,
    /// For a span: its input indexes `start..end`.
    pub start: Option<usize>,
    /// One past the last.
    pub end: Option<usize>,
}

/// A compaction as the store records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionRecord {
    /// Position among the session's compactions, from 1 (the engine's
    /// `compression_count` after it, for the compressor).
    pub seq: u64,
    /// When, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// What set it off (`preflight`, `post_tool`, `manual`, `agent`, `cli`).
    pub trigger: String,
    /// The engine.
    pub engine: String,
    /// The summarizer whose text went in, when the engine says.
    pub summarizer: Option<String>,
    /// The handle of the span it replaced.
    pub handle: String,
    /// The span's input indexes `start..end` (of this pass's input).
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// Messages of the input that left the history.
    pub archived: usize,
    /// [`message_hash`]es of the messages it added (the summary).
    pub summary: Vec<String>,
    /// Tokens before and after, as the host counted them.
    pub tokens_before: u64,
    /// Tokens after.
    pub tokens_after: u64,
}

/// One full-text search result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchHit {
    /// The handle to recall the whole message by.
    pub handle: String,
    /// The span handle(s) of the compaction(s) that archived it.
    pub spans: Vec<String>,
    /// The message's role.
    pub role: String,
    /// Where it came from: `history` (live) or `archive`.
    pub source: &'static str,
    /// How many of the query's words the message holds (what breaks a tie
    /// of the store's ranks).
    pub terms: usize,
    /// The lines that hold the query's words, the most words first, each
    /// with its number and the words' byte ranges
    /// ([`Terms::lines`](matched_lines::Terms::lines)).
    pub lines: Vec<MatchedLine>,
}

impl SearchHit {
    /// The hit for archived `message` (stored as `hash`, in `spans`),
    /// whose searched text is `text`: what every backend returns.
    pub fn archived(
        message: &Message,
        hash: &str,
        spans: Vec<String>,
        text: &str,
        terms: &Terms,
    ) -> SearchHit {
        SearchHit {
            handle: memory::hit_handle(message, hash),
            spans,
            role: message.role.as_str().to_owned(),
            source: "archive",
            terms: terms.count(text),
            lines: terms.lines(text),
        }
    }
}

/// The session store (see the module docs). Methods are synchronous and
/// blocking; implementations are `Send + Sync` so one store serves every
/// session of a process.
pub trait SessionStore: Send + Sync {
    /// Where the store lives (a file path or `:memory:`), for messages.
    fn location(&self) -> String;

    /// Applies `batch` to `session` in one transaction: all of it or none.
    fn commit(&self, session: &str, batch: &Batch) -> Result<(), StoreError>;

    /// The last committed state snapshot of `session`, if any.
    fn load_state(&self, session: &str) -> Result<Option<Value>, StoreError>;

    /// What `handle` names in `session` (any session when `None`).
    fn resolve(&self, session: Option<&str>, handle: &str) -> Result<Option<Entry>, StoreError>;

    /// Full-text search over the archived text of `session` (every session
    /// when `None`): at most `limit` hits, best first by the backend's rank
    /// (memory: the newest; SQLite: windows of the newest matches, each
    /// ranked by BM25; Postgres: `ts_rank`), ties broken by how many words
    /// match ([`SearchHit::terms`]). Every word of `query` must match (words
    /// are phrases of whole tokens, case aside: `test_io.py` matches those
    /// three tokens in order; [`matched_lines`]); when nothing matches all,
    /// any may. Each hit shows the lines that match ([`SearchHit::lines`]).
    fn search(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError>;

    /// The compaction records of `session`, oldest first.
    fn compactions(&self, session: &str) -> Result<Vec<CompactionRecord>, StoreError>;

    /// Every handle registered in `session`.
    fn handles(&self, session: &str) -> Result<Vec<String>, StoreError>;

    /// Forgets `session`: state, handles, records (archived messages other
    /// sessions share stay).
    fn delete_session(&self, session: &str) -> Result<(), StoreError>;

    /// The version of `session`'s [versioned record](Versioned), if it has
    /// one: a cheap check that lets a server skip reloading a session its
    /// cached copy of is current.
    fn version(&self, session: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.load_versioned(session)?.map(|v| v.version))
    }

    /// `session`'s versioned record: the state a server keeps per session
    /// (engine and host state, and the `history` segments, the server's
    /// managed history), with the version that
    /// [`commit_versioned`](Self::commit_versioned) last wrote.
    fn load_versioned(&self, session: &str) -> Result<Option<Versioned>, StoreError> {
        let Some(saved) = self.load_state(session)? else {
            return Ok(None);
        };
        Versioned::unwrap(&self.location(), session, saved).map(Some)
    }

    /// `session`'s record unless its version is `known` (0: no record),
    /// in one read where the backend can: [`Since::Unchanged`] lets a
    /// server keep the copy it holds, else the record (or its absence).
    fn load_versioned_since(&self, session: &str, known: u64) -> Result<Since, StoreError> {
        if self.version(session)?.unwrap_or(0) == known {
            return Ok(Since::Unchanged);
        }
        Ok(Since::Changed(self.load_versioned(session)?))
    }

    /// [`load_versioned_since`](Self::load_versioned_since) for a caller
    /// that holds the first `segments` history segments of version
    /// `known`: the backend may answer [`Since::Appended`] with only the
    /// segments stored after that many (a record that moved between
    /// servers is read by what changed, not whole). The default reads the
    /// whole record.
    fn load_versioned_after(
        &self,
        session: &str,
        known: u64,
        segments: usize,
    ) -> Result<Since, StoreError> {
        let _ = segments;
        self.load_versioned_since(session, known)
    }

    /// Applies `batches` and writes the record (`state`, and the history
    /// as `history` says: `None` keeps it) as version `expected + 1`,
    /// only when the stored version is `expected` (0: no record yet):
    /// compare-and-swap. [`StoreError::Conflict`] when another writer got
    /// there first, [`StoreError::Duplicate`] when a batch records what is
    /// recorded already (a compaction number); nothing is written then.
    /// Returns the new version.
    ///
    /// The default (used by [`MemoryStore`]) checks and writes in separate
    /// steps: it serializes writers of one process that hold the session's
    /// lock (`ctx serve` does), not processes. `SqliteStore` checks again
    /// in the transaction that writes the record; a store shared by
    /// several processes (Postgres) checks and writes in one transaction.
    fn commit_versioned(
        &self,
        session: &str,
        expected: u64,
        batches: &[Batch],
        state: &Value,
        history: Option<HistoryWrite<'_>>,
    ) -> Result<u64, StoreError> {
        let current = self.load_versioned(session)?;
        let found = current.as_ref().map_or(0, |v| v.version);
        if found != expected {
            return Err(version_conflict(&self.location(), session, found, expected));
        }
        for batch in batches {
            self.commit(session, batch)?;
        }
        let mut segments = current.map(|v| v.history).unwrap_or_default();
        if let Some(h) = history {
            h.apply(&mut segments);
        }
        let version = expected + 1;
        let mut batch = Batch::new();
        batch.set_state(Versioned::wrap(version, state, &segments));
        self.commit(session, &batch)?;
        Ok(version)
    }

    /// Claims job `job` of `session` for `owner` for `ttl`: `true` when
    /// the claim is now `owner`'s (it was free, expired, or already
    /// `owner`'s: renewed), `false` when another owner holds a live claim.
    /// A claim held by a process that died expires after its `ttl`. Used
    /// so that two servers never compute the same background job (a
    /// summary) of one session.
    fn try_claim(
        &self,
        session: &str,
        job: &str,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let _ = (session, job, owner, ttl);
        Err(StoreError::Backend {
            location: self.location(),
            detail: "this store does not support claims".into(),
        })
    }

    /// Gives up `owner`'s claim on job `job` of `session` (no-op when the
    /// claim is not `owner`'s).
    fn release(&self, session: &str, job: &str, owner: &str) -> Result<(), StoreError> {
        let _ = (session, job, owner);
        Err(StoreError::Backend {
            location: self.location(),
            detail: "this store does not support claims".into(),
        })
    }
}

/// A session's record as [`SessionStore::commit_versioned`] writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Versioned {
    /// Bumped by every write; 0 is "no record".
    pub version: u64,
    /// The engine and host state (what [`host::Session`](crate::host::Session)
    /// restores from) and whatever the server adds.
    pub state: Value,
    /// The server's managed history as text segments, oldest first,
    /// opaque to the store (see [`HistoryWrite`]); empty when none was
    /// written.
    pub history: Vec<String>,
}

/// What [`SessionStore::load_versioned_since`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum Since {
    /// The stored version is the one the caller knows.
    Unchanged,
    /// Another version (or none): the record as stored.
    Changed(Option<Versioned>),
    /// Another version, with the history segments stored after the
    /// first `from` (as many as the caller holds, at least 1;
    /// [`SessionStore::load_versioned_after`]). The store does not know
    /// whether the first `from` are still the caller's (a rewrite of the
    /// history may have replaced them): the caller checks what it builds
    /// against the state (a server keeps a digest of its history there)
    /// and reads the whole record when they differ.
    Appended {
        /// The stored version.
        version: u64,
        /// Its state.
        state: Value,
        /// Segments of the caller's version that are kept.
        from: usize,
        /// The segments after them, oldest first.
        segments: Vec<String>,
    },
}

/// How [`SessionStore::commit_versioned`] changes a record's history: the
/// first `keep` stored segments stay, the others are dropped, `append`
/// follows them. A server appends a segment with what changed since the
/// version it read and rewrites the whole history only now and then, so a
/// step writes what is new, not the whole session. `keep` is at most the
/// number of stored segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryWrite<'a> {
    /// Stored segments kept, from the first.
    pub keep: usize,
    /// Segments written after them.
    pub append: &'a [String],
}

impl HistoryWrite<'_> {
    /// The whole history replaced by `segments`.
    pub fn replace(segments: &[String]) -> HistoryWrite<'_> {
        HistoryWrite {
            keep: 0,
            append: segments,
        }
    }

    /// Applies the write to `segments` (a backend that keeps them in one
    /// value).
    pub fn apply(&self, segments: &mut Vec<String>) {
        segments.truncate(self.keep);
        segments.extend(self.append.iter().cloned());
    }
}

/// The conflict of a compare-and-swap that found `found`, not `expected`.
#[doc(hidden)]
pub fn version_conflict(location: &str, session: &str, found: u64, expected: u64) -> StoreError {
    StoreError::Conflict {
        location: location.to_owned(),
        detail: format!(
            "session `{session}` is at version {found}, not {expected}: another writer changed it"
        ),
    }
}

/// The clash of a compaction record numbered `seq` with one `session`
/// already has.
#[doc(hidden)]
pub fn duplicate_compaction(location: &str, session: &str, seq: u64) -> StoreError {
    StoreError::Duplicate {
        location: location.to_owned(),
        detail: format!("session `{session}` already has compaction {seq}"),
    }
}

/// The key under which the default [`SessionStore::commit_versioned`]
/// wraps a record in the plain state slot.
const VERSIONED_KEY: &str = "versioned";

impl Versioned {
    /// The record as one JSON value (the state slot of a store without a
    /// place of its own for it). The history is an array of segments.
    #[doc(hidden)]
    pub fn wrap(version: u64, state: &Value, history: &[String]) -> Value {
        serde_json::json!({
            VERSIONED_KEY: version,
            "state": state,
            "history": history,
        })
    }

    /// The record [`wrap`](Self::wrap) made. A plain state (`ctx
    /// replay`, `ctx compact`) is version 0; a history written as one
    /// text (before segments) is one segment.
    #[doc(hidden)]
    pub fn unwrap(location: &str, session: &str, saved: Value) -> Result<Versioned, StoreError> {
        let Value::Object(mut map) = saved else {
            return Err(StoreError::Corrupt {
                location: location.to_owned(),
                detail: format!("state of session `{session}` is not an object"),
            });
        };
        let Some(version) = map.get(VERSIONED_KEY).and_then(Value::as_u64) else {
            return Ok(Versioned {
                version: 0,
                state: Value::Object(map),
                history: Vec::new(),
            });
        };
        let history = match map.remove("history") {
            Some(Value::String(text)) => vec![text],
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(text) => Ok(text),
                    _ => Err(StoreError::Corrupt {
                        location: location.to_owned(),
                        detail: format!("history of session `{session}` holds a non-text segment"),
                    }),
                })
                .collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        let state = map.remove("state").unwrap_or(Value::Null);
        Ok(Versioned {
            version,
            state,
            history,
        })
    }
}

/// Milliseconds since the Unix epoch (0 before it).
#[doc(hidden)]
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
