//! [`SessionStore`] on SQLite: the batches, the versioned record, the
//! handles, search, compaction records and claims.

use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde_json::Value;

use super::index::{doc_of, docs_of};
use super::{SqliteStore, map_err};
use context_engine::store::{
    Batch, CompactionRecord, Entry, EntryKind, HistoryWrite, MEMORY_PATH, SearchHit, SessionStore,
    Since, StoreError, Versioned, now_ms, version_conflict,
};

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
        self.search_scoped(session, query, limit)
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
        // The session's documents: those indexed leave the index, those
        // waiting leave the queue.
        let no: Option<i64> = tx
            .query_row(
                "SELECT no FROM search_sessions WHERE session = ?1",
                [session],
                |r| r.get(0),
            )
            .optional()
            .map_err(err)?;
        let mut indexed = 0;
        if let Some(no) = no {
            let (lo, hi) = docs_of(no);
            let waiting = tx
                .prepare("SELECT doc FROM search_pending WHERE doc BETWEEN ?1 AND ?2")
                .map_err(err)?
                .query_map(params![lo, hi], |r| r.get::<_, i64>(0))
                .map_err(err)?
                .collect::<Result<std::collections::HashSet<_>, _>>()
                .map_err(err)?;
            tx.execute(
                "DELETE FROM search_pending WHERE doc BETWEEN ?1 AND ?2",
                params![lo, hi],
            )
            .map_err(err)?;
            let seqs = tx
                .prepare("SELECT seq FROM archive WHERE session = ?1")
                .map_err(err)?
                .query_map([session], |r| r.get::<_, i64>(0))
                .map_err(err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?;
            let mut drop_doc = tx
                .prepare("DELETE FROM archive_fts WHERE rowid = ?1")
                .map_err(err)?;
            for seq in seqs {
                if let Some(doc) = doc_of(no, seq).filter(|d| !waiting.contains(d)) {
                    indexed += drop_doc.execute([doc]).map_err(err)?;
                }
            }
            tx.execute("DELETE FROM search_sessions WHERE no = ?1", [no])
                .map_err(err)?;
        }
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
        // Messages no session archives any more.
        tx.execute(
            "DELETE FROM messages WHERE id NOT IN (SELECT message FROM archive)",
            [],
        )
        .map_err(err)?;
        if indexed > 0 {
            // A deletion only marks the index's entries deleted; merging
            // its segments drops their tokens (and `secure_delete` zeroes
            // the pages they leave).
            tx.execute(
                "INSERT INTO archive_fts(archive_fts) VALUES ('optimize')",
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
