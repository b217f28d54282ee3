//! Writing batches: messages content-addressed, archive rows, handles,
//! compaction records and the state, in one transaction.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use rusqlite::{ErrorCode, OptionalExtension, TransactionBehavior, params};

use super::checkpoint::CHECKPOINT_EVERY;
use super::index::{INDEX_BATCH, Waiting, doc_of, index_waiting, session_no, session_text};
use super::{SqliteStore, map_err};
use crate::pack::pack;
use context_engine::store::backend::index_text;
use context_engine::store::{Batch, StoreError, duplicate_compaction, now_ms};

impl SqliteStore {
    /// Writes `batches` and then what `then` writes in one transaction:
    /// all of it commits or none (a compaction's archive and the record
    /// that names it too). Indexes what waits when a batch's worth does,
    /// and wakes the checkpoint thread now and then.
    pub(super) fn transact(
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

    /// One batch's rows, in the caller's transaction; the archive rows it
    /// added join `added` (they wait for the index).
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
        let mut pending = tx
            .prepare_cached("INSERT INTO search_pending (doc, message) VALUES (?1, ?2)")
            .map_err(err)?;
        let mut no = None;
        for (hash, message) in batch.messages() {
            let id = match find
                .query_row([hash], |r| r.get::<_, i64>(0))
                .optional()
                .map_err(err)?
            {
                Some(id) => id,
                None => {
                    let json = context_engine::store::handle::message_json(message);
                    insert
                        .execute(params![hash, message.role.as_str(), pack(&json)])
                        .map_err(err)?;
                    tx.last_insert_rowid()
                }
            };
            if archive
                .execute(params![session, id, next_seq])
                .map_err(err)?
                > 0
            {
                // A document of the session's own in the index.
                let no = match no {
                    Some(no) => no,
                    None => *no.insert(session_no(tx, &self.path, session)?),
                };
                let doc = doc_of(no, next_seq).ok_or_else(|| StoreError::Backend {
                    location: self.path.display().to_string(),
                    detail: format!(
                        "session `{session}` archives more messages than its index can hold (2^32)"
                    ),
                })?;
                pending.execute(params![doc, id]).map_err(err)?;
                added.push(Waiting {
                    doc,
                    message: id,
                    hash: hash.clone(),
                    text: session_text(no, &index_text(message)),
                });
                next_seq += 1;
            }
            ids.insert(hash.as_str(), id);
        }
        self.write_handles(tx, session, batch, &ids)?;
        self.write_records(tx, session, batch)?;
        Ok(())
    }

    /// The batch's handles and their members (`ids`: the archive ids of the
    /// batch's messages by hash; others are looked up).
    fn write_handles(
        &self,
        tx: &rusqlite::Transaction<'_>,
        session: &str,
        batch: &Batch,
        ids: &HashMap<&str, i64>,
    ) -> Result<(), StoreError> {
        let err = |e| map_err(&self.path, e);
        let mut find = tx
            .prepare_cached("SELECT id FROM messages WHERE hash = ?1")
            .map_err(err)?;
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
        Ok(())
    }

    /// The batch's compaction records and state snapshot.
    fn write_records(
        &self,
        tx: &rusqlite::Transaction<'_>,
        session: &str,
        batch: &Batch,
    ) -> Result<(), StoreError> {
        let err = |e| map_err(&self.path, e);
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
