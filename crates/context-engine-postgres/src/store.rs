//! [`SessionStore`] on Postgres: the batches, the versioned record, the
//! handles, search, compaction records and claims.

use std::time::Duration;

use context_engine::message::Message;
use context_engine::store::Terms;
use context_engine::store::backend::{now_ms, query_words};
use context_engine::store::{
    Batch, CompactionRecord, Entry, EntryKind, HistoryWrite, SearchHit, SessionStore, Since,
    StoreError, Versioned,
};
use serde_json::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::connection::{Inner, PgStore};
use crate::fts::ts_query;
use crate::rows::Rows;
use crate::sql::{
    INSERT_ARCHIVE, INSERT_COMPACTIONS, INSERT_HANDLES, INSERT_MESSAGES, LOAD_AFTER, VERSION,
    swap_insert, swap_update,
};

impl PgStore {
    /// The record of `session` unless it is at version `known` (-1:
    /// whatever it is), from history segment `segments` on when that many
    /// are stored (see [`LOAD_AFTER`]), in one round trip.
    fn after(&self, session: &str, known: i64, segments: usize) -> Result<Since, StoreError> {
        let session = session.to_owned();
        let held = i32::try_from(segments).unwrap_or(i32::MAX);
        self.call(move |inner| async move {
            let client = inner.client().await?;
            let stmt = client
                .prepare_cached(LOAD_AFTER)
                .await
                .map_err(|e| inner.err(&e))?;
            let row = client
                .query_opt(&stmt, &[&session, &known, &held])
                .await
                .map_err(|e| inner.err(&e))?;
            let Some(row) = row else {
                return Ok(if known == 0 {
                    Since::Unchanged
                } else {
                    Since::Changed(None)
                });
            };
            let version: i64 = row.get(0);
            if version == known {
                return Ok(Since::Unchanged);
            }
            let state: Option<String> = row.get(1);
            let state = serde_json::from_str(state.as_deref().unwrap_or("null"))
                .map_err(|e| inner.corrupt(format!("state of `{session}`: {e}")))?;
            let from = row.get::<_, Option<i32>>(2).unwrap_or(0).max(0) as usize;
            let history = row.get::<_, Option<Vec<String>>>(3).unwrap_or_default();
            let version = version.max(0) as u64;
            Ok(if from > 0 {
                Since::Appended {
                    version,
                    state,
                    from,
                    segments: history,
                }
            } else {
                Since::Changed(Some(Versioned {
                    version,
                    state,
                    history,
                }))
            })
        })
    }
}

impl Inner {
    /// Writes `batches` inside the caller's transaction: four statements
    /// whatever the batches hold (messages, archive rows, handles with
    /// their members, compaction records; each skipped when empty), sent
    /// together so that they cost one round trip (see [`Rows`]).
    async fn apply(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        session: &str,
        batches: &[Batch],
    ) -> Result<(), StoreError> {
        let rows = Rows::of(batches);
        let err = |e: tokio_postgres::Error| self.err(&e);
        let (messages, archive, handles, compactions) = tokio::try_join!(
            tx.prepare_cached(INSERT_MESSAGES),
            tx.prepare_cached(INSERT_ARCHIVE),
            tx.prepare_cached(INSERT_HANDLES),
            tx.prepare_cached(INSERT_COMPACTIONS),
        )
        .map_err(err)?;
        let has_messages = !rows.hashes.is_empty();
        let (m, a, h, c) = tokio::join!(
            async {
                if has_messages {
                    let params: [&(dyn ToSql + Sync); 5] = [
                        &rows.hashes,
                        &rows.roles,
                        &rows.jsons,
                        &rows.bodies,
                        &rows.words,
                    ];
                    tx.execute(&messages, &params).await.map_err(err)?;
                }
                Ok::<_, StoreError>(())
            },
            async {
                if has_messages {
                    tx.execute(&archive, &[&session, &rows.hashes])
                        .await
                        .map_err(err)?;
                }
                Ok::<_, StoreError>(())
            },
            async {
                if rows.handles.is_empty() {
                    return Ok(());
                }
                let params: [&(dyn ToSql + Sync); 8] = [
                    &session,
                    &rows.handles,
                    &rows.kinds,
                    &rows.starts,
                    &rows.ends,
                    &rows.member_handles,
                    &rows.member_pos,
                    &rows.member_hashes,
                ];
                let row = tx.query_one(&handles, &params).await.map_err(err)?;
                let (wanted, put): (i64, i64) = (row.get(0), row.get(1));
                if wanted != put {
                    return Err(self.corrupt(format!(
                        "{} handle member(s) name messages that are not archived",
                        wanted - put
                    )));
                }
                Ok(())
            },
            async {
                if rows.seqs.is_empty() {
                    return Ok(());
                }
                let params: [&(dyn ToSql + Sync); 13] = [
                    &session,
                    &rows.seqs,
                    &rows.created,
                    &rows.triggers,
                    &rows.engines,
                    &rows.summarizers,
                    &rows.spans,
                    &rows.span_starts,
                    &rows.span_ends,
                    &rows.archived,
                    &rows.summaries,
                    &rows.tokens_before,
                    &rows.tokens_after,
                ];
                tx.execute(&compactions, &params).await.map_err(|e| {
                    if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
                        let seqs: Vec<String> = rows.seqs.iter().map(i64::to_string).collect();
                        StoreError::Duplicate {
                            location: self.location.clone(),
                            detail: format!(
                                "session `{session}` already has compaction {}",
                                seqs.join(" or ")
                            ),
                        }
                    } else {
                        self.err(&e)
                    }
                })?;
                Ok(())
            },
        );
        // The first failure in statement order is the cause (the ones
        // after it only say that the transaction is aborted).
        m.and(a).and(h).and(c)
    }

    /// Writes the state snapshot of a plain [`commit`](SessionStore::commit).
    async fn put_state(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        session: &str,
        state: &Value,
    ) -> Result<(), StoreError> {
        tx.execute(
            "INSERT INTO ctx_state (session, version, state, updated_ms) VALUES ($1, 0, $2, $3) \
             ON CONFLICT (session) DO UPDATE SET state = excluded.state, updated_ms = excluded.updated_ms",
            &[&session, &state.to_string(), &(now_ms() as i64)],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    fn parse_message(&self, json: &str) -> Result<Message, StoreError> {
        serde_json::from_str(json).map_err(|e| self.corrupt(format!("archived message: {e}")))
    }
}

fn usize_of(v: Option<i64>) -> Option<usize> {
    v.and_then(|n| usize::try_from(n).ok())
}

impl SessionStore for PgStore {
    fn location(&self) -> String {
        self.inner.location.clone()
    }

    fn commit(&self, session: &str, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (session, batch) = (session.to_owned(), batch.clone());
        self.call(|inner| async move {
            let mut client = inner.client().await?;
            let tx = client.transaction().await.map_err(|e| inner.err(&e))?;
            inner
                .apply(&tx, &session, std::slice::from_ref(&batch))
                .await?;
            if let Some(state) = batch.state() {
                inner.put_state(&tx, &session, state).await?;
            }
            tx.commit().await.map_err(|e| inner.err(&e))
        })
    }

    fn load_state(&self, session: &str) -> Result<Option<Value>, StoreError> {
        Ok(self.load_versioned(session)?.map(|v| v.state))
    }

    fn version(&self, session: &str) -> Result<Option<u64>, StoreError> {
        let session = session.to_owned();
        self.call(|inner| async move {
            let client = inner.client().await?;
            let stmt = client
                .prepare_cached(VERSION)
                .await
                .map_err(|e| inner.err(&e))?;
            let row = client
                .query_opt(&stmt, &[&session])
                .await
                .map_err(|e| inner.err(&e))?;
            Ok(row.map(|r| r.get::<_, i64>(0).max(0) as u64))
        })
    }

    fn load_versioned(&self, session: &str) -> Result<Option<Versioned>, StoreError> {
        // -1 is no version: the whole record comes back.
        match self.after(session, -1, 0)? {
            Since::Changed(record) => Ok(record),
            Since::Unchanged | Since::Appended { .. } => Ok(None),
        }
    }

    fn load_versioned_since(&self, session: &str, known: u64) -> Result<Since, StoreError> {
        self.after(session, i64::try_from(known).unwrap_or(i64::MAX), 0)
    }

    fn load_versioned_after(
        &self,
        session: &str,
        known: u64,
        segments: usize,
    ) -> Result<Since, StoreError> {
        self.after(
            session,
            i64::try_from(known).unwrap_or(i64::MAX),
            if known == 0 { 0 } else { segments },
        )
    }

    /// One statement (see [`SWAP_TAIL`]), prepared once per connection;
    /// in a transaction with the batches when there are any (a
    /// compaction's archive), the swap first so that it row-locks the
    /// session before anything else is written.
    fn commit_versioned(
        &self,
        session: &str,
        expected: u64,
        batches: &[Batch],
        state: &Value,
        history: Option<HistoryWrite<'_>>,
    ) -> Result<u64, StoreError> {
        let session = session.to_owned();
        let batches: Vec<Batch> = batches.iter().filter(|b| !b.is_empty()).cloned().collect();
        let state = state.to_string();
        let (write, keep, append) = match history {
            Some(h) => (
                true,
                i32::try_from(h.keep).unwrap_or(i32::MAX),
                h.append.to_vec(),
            ),
            None => (false, 0, Vec::new()),
        };
        self.call(|inner| async move {
            let mut client = inner.client().await?;
            let err = |e: tokio_postgres::Error| inner.err(&e);
            let version = expected + 1;
            let sql = if expected == 0 {
                swap_insert()
            } else {
                swap_update()
            };
            let stmt = client.prepare_cached(&sql).await.map_err(err)?;
            let params: [&(dyn ToSql + Sync); 8] = [
                &session,
                &(version as i64),
                &state,
                &(now_ms() as i64),
                &(expected as i64),
                &keep,
                &append,
                &write,
            ];
            let conflict = || {
                inner.conflict(format!(
                    "session `{session}` is no longer at version {expected}: another writer changed it"
                ))
            };
            if batches.is_empty() {
                let swapped: i64 = client.query_one(&stmt, &params).await.map_err(err)?.get(0);
                return if swapped == 1 { Ok(version) } else { Err(conflict()) };
            }
            // One round trip for the transaction's statements: the flush
            // setting, the swap (first, so that it row-locks the session
            // before anything else is written) and the batches' rows (the
            // record above is the state: a batch's own snapshot is not
            // written), sent together; then the commit.
            let tx = client.transaction().await.map_err(err)?;
            let (swapped, applied) = tokio::join!(
                tx.query_one(&stmt, &params),
                inner.apply(&tx, &session, &batches),
            );
            let swapped: i64 = swapped.map_err(err)?.get(0);
            if swapped != 1 {
                return Err(conflict());
            }
            applied?;
            tx.commit().await.map_err(err)?;
            Ok(version)
        })
    }

    fn resolve(&self, session: Option<&str>, handle: &str) -> Result<Option<Entry>, StoreError> {
        let session = session.map(str::to_owned);
        let handle = handle.to_owned();
        self.call(|inner| async move {
            let client = inner.client().await?;
            let err = |e: tokio_postgres::Error| inner.err(&e);
            let stmt = client
                .prepare_cached(
                    "SELECT session, kind, span_start, span_end FROM ctx_handles \
                     WHERE handle = $1 AND ($2::TEXT IS NULL OR session = $2) \
                     ORDER BY session LIMIT 1",
                )
                .await
                .map_err(err)?;
            let Some(row) = client
                .query_opt(&stmt, &[&handle, &session])
                .await
                .map_err(err)?
            else {
                return Ok(None);
            };
            let owner: String = row.get(0);
            let kind: String = row.get(1);
            let kind = EntryKind::from_name(&kind)
                .ok_or_else(|| inner.corrupt(format!("handle `{handle}` has kind `{kind}`")))?;
            let members = client
                .prepare_cached(
                    "SELECT m.json FROM ctx_handle_members hm JOIN ctx_messages m ON m.id = hm.message \
                     WHERE hm.session = $1 AND hm.handle = $2 ORDER BY hm.pos",
                )
                .await
                .map_err(err)?;
            let rows = client
                .query(&members, &[&owner, &handle])
                .await
                .map_err(err)?;
            let messages = rows
                .iter()
                .map(|r| inner.parse_message(r.get(0)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(Entry {
                handle,
                kind,
                session: owner,
                messages,
                start: usize_of(row.get(2)),
                end: usize_of(row.get(3)),
            }))
        })
    }

    fn search(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let words: Vec<String> = query_words(query).into_iter().map(str::to_owned).collect();
        let terms = Terms::of_words(&query_words(query));
        if terms.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let session = session.map(str::to_owned);
        self.call(|inner| async move {
            let client = inner.client().await?;
            let err = |e: tokio_postgres::Error| inner.err(&e);
            let stmt = client
                .prepare_cached(
                    "SELECT m.hash, m.json, m.body, \
                       ARRAY(SELECT DISTINCT h.handle FROM ctx_handle_members hm \
                             JOIN ctx_handles h ON h.session = hm.session AND h.handle = hm.handle \
                             WHERE hm.message = m.id AND h.kind = 'span' \
                               AND ($2::TEXT IS NULL OR hm.session = $2) ORDER BY h.handle), \
                       ts_rank(m.tsv, to_tsquery('simple', $1)) AS rank \
                     FROM ctx_messages m \
                     JOIN (SELECT message, MAX(seq) AS seq FROM ctx_archive \
                           WHERE $2::TEXT IS NULL OR session = $2 GROUP BY message) a ON a.message = m.id \
                     WHERE m.tsv @@ to_tsquery('simple', $1) \
                     ORDER BY rank DESC, a.seq DESC \
                     LIMIT $3",
                )
                .await
                .map_err(err)?;
            let refs: Vec<&str> = words.iter().map(String::as_str).collect();
            // The index matches lowercased tokens; a few more rows than
            // wanted, since the text must hold the words themselves
            // (`Terms::matching`, as every store checks).
            let rows_wanted = (limit * 2).max(limit + 16) as i64;
            for all in [true, false] {
                let Some(q) = ts_query(&refs, all) else {
                    return Ok(Vec::new());
                };
                let rows = client
                    .query(&stmt, &[&q, &session, &rows_wanted])
                    .await
                    .map_err(err)?;
                let mut ranked = Vec::with_capacity(rows.len());
                for r in &rows {
                    let body: String = r.get(2);
                    let Some(count) = terms.matching(&body, all) else {
                        continue;
                    };
                    let rank: f32 = r.get(4);
                    ranked.push((rank, count, r, body));
                }
                // Best rank first (then the newest, as the query ordered),
                // ties by words matched.
                ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
                if !ranked.is_empty() || refs.len() == 1 {
                    return ranked
                        .into_iter()
                        .take(limit)
                        .map(|(_, _, r, body)| {
                            let hash: String = r.get(0);
                            let message = inner.parse_message(r.get(1))?;
                            Ok(SearchHit::archived(&message, &hash, r.get(3), &body, &terms))
                        })
                        .collect();
                }
            }
            Ok(Vec::new())
        })
    }

    fn compactions(&self, session: &str) -> Result<Vec<CompactionRecord>, StoreError> {
        let session = session.to_owned();
        self.call(|inner| async move {
            let client = inner.client().await?;
            let err = |e: tokio_postgres::Error| inner.err(&e);
            let stmt = client
                .prepare_cached(
                    "SELECT seq, created_ms, trigger, engine, summarizer, handle, span_start, span_end, \
                     archived, summary, tokens_before, tokens_after FROM ctx_compactions \
                     WHERE session = $1 ORDER BY seq",
                )
                .await
                .map_err(err)?;
            let rows = client.query(&stmt, &[&session]).await.map_err(err)?;
            rows.iter()
                .map(|r| {
                    let summary: String = r.get(9);
                    let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
                    Ok(CompactionRecord {
                        seq: n(0),
                        created_ms: n(1),
                        trigger: r.get(2),
                        engine: r.get(3),
                        summarizer: r.get(4),
                        handle: r.get(5),
                        start: n(6) as usize,
                        end: n(7) as usize,
                        archived: n(8) as usize,
                        summary: serde_json::from_str(&summary).map_err(|e| {
                            inner.corrupt(format!("compaction record of `{session}`: {e}"))
                        })?,
                        tokens_before: n(10),
                        tokens_after: n(11),
                    })
                })
                .collect()
        })
    }

    fn handles(&self, session: &str) -> Result<Vec<String>, StoreError> {
        let session = session.to_owned();
        self.call(|inner| async move {
            let client = inner.client().await?;
            let rows = client
                .query(
                    "SELECT handle FROM ctx_handles WHERE session = $1 ORDER BY handle",
                    &[&session],
                )
                .await
                .map_err(|e| inner.err(&e))?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn delete_session(&self, session: &str) -> Result<(), StoreError> {
        let session = session.to_owned();
        self.call(|inner| async move {
            let mut client = inner.client().await?;
            let err = |e: tokio_postgres::Error| inner.err(&e);
            let tx = client.transaction().await.map_err(err)?;
            for table in [
                "ctx_handle_members",
                "ctx_handles",
                "ctx_compactions",
                "ctx_state",
                "ctx_history",
                "ctx_archive",
                "ctx_claims",
            ] {
                tx.execute(
                    &format!("DELETE FROM {table} WHERE session = $1"),
                    &[&session],
                )
                .await
                .map_err(err)?;
            }
            tx.execute(
                "DELETE FROM ctx_messages m WHERE NOT EXISTS \
                   (SELECT 1 FROM ctx_archive a WHERE a.message = m.id) \
                 AND NOT EXISTS (SELECT 1 FROM ctx_handle_members hm WHERE hm.message = m.id)",
                &[],
            )
            .await
            .map_err(err)?;
            tx.commit().await.map_err(err)
        })
    }

    fn try_claim(
        &self,
        session: &str,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let (session, job, owner) = (session.to_owned(), job.to_owned(), owner.to_owned());
        self.call(|inner| async move {
            let client = inner.client().await?;
            let stmt = client
                .prepare_cached(
                    "INSERT INTO ctx_claims (session, job, owner, expires_at) \
                     VALUES ($1, $2, $3, now() + make_interval(secs => $4)) \
                     ON CONFLICT (session, job) DO UPDATE SET owner = excluded.owner, \
                       expires_at = excluded.expires_at \
                     WHERE ctx_claims.owner = excluded.owner OR ctx_claims.expires_at <= now()",
                )
                .await
                .map_err(|e| inner.err(&e))?;
            let n = client
                .execute(&stmt, &[&session, &job, &owner, &ttl.as_secs_f64()])
                .await
                .map_err(|e| inner.err(&e))?;
            Ok(n == 1)
        })
    }

    fn release(&self, session: &str, job: &str, owner: &str) -> Result<(), StoreError> {
        let (session, job, owner) = (session.to_owned(), job.to_owned(), owner.to_owned());
        self.call(|inner| async move {
            let client = inner.client().await?;
            client
                .execute(
                    "DELETE FROM ctx_claims WHERE session = $1 AND job = $2 AND owner = $3",
                    &[&session, &job, &owner],
                )
                .await
                .map_err(|e| inner.err(&e))?;
            Ok(())
        })
    }
}
