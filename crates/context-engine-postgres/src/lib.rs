//! A PostgreSQL [`SessionStore`]: several `ctx serve` instances share one
//! durable store (issue 16, "fleets").
//!
//! Same data and behaviour as the SQLite store (archive, handles,
//! compaction records, the state; search over the archive with Postgres
//! full-text search), plus what a fleet needs: the versioned session
//! record written by compare-and-swap in one transaction
//! ([`SessionStore::commit_versioned`]) and claims on background jobs
//! ([`SessionStore::try_claim`]) that expire by the database's clock.
//!
//! The trait is synchronous (the library has no async runtime); this
//! backend drives `tokio-postgres` through a `deadpool-postgres` pool on a
//! small runtime of its own (two worker threads). A call spawns its future
//! there and waits on a channel, so it is safe from any thread that may
//! block: a plain thread, or `spawn_blocking` in an async server (never call
//! it on an async worker: it blocks that worker for the round trip).
//!
//! The schema is created and migrated on first contact (migrations in
//! `src/migrations/*.sql`, version in `ctx_schema`, applied under a
//! transaction-level advisory lock so that instances starting together
//! migrate once); a database written by a newer version is refused with
//! [`StoreError::NewerSchema`]. An unreachable database is not an error at
//! construction: every call fails with a clear error until it answers,
//! and the pool reconnects by itself.
//!
//! TLS is not built in (`NoTls`): the intended deployment is a database on
//! loopback or a private network; put a TLS-terminating proxy in front
//! otherwise. The password is given apart from the URL (from the
//! environment variable the configuration names) and never appears in
//! [`location`](SessionStore::location), logs or errors.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use context_engine::message::Message;
use context_engine::store::backend::{hit_handle, index_text, now_ms, query_words, snippet};
use context_engine::store::handle::message_json;
use context_engine::store::{
    Batch, CompactionRecord, Entry, EntryKind, HistoryWrite, SearchHit, SessionStore, Since,
    StoreError, Versioned,
};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde_json::Value;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

/// The schema version this build writes (and the newest it reads).
pub const SCHEMA_VERSION: i32 = 2;

const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_init.sql")),
    (2, include_str!("migrations/0002_history_segments.sql")),
];

/// The compare-and-swap of a session's record and its history in one
/// statement (one round trip, atomic): `$1` session, `$2` new version,
/// `$3` state, `$4` time, `$5` expected version, `$6` segments kept, `$7`
/// segments appended, `$8` whether the history is written. The history is
/// touched only when the swap took (`swap` joined); rows replaced in place
/// and rows past the new end deleted are disjoint, so no row is touched
/// twice. Answers 1 when the swap took.
const SWAP_TAIL: &str = "\
    cut AS (DELETE FROM ctx_history h USING swap \
            WHERE $8 AND h.session = swap.session AND h.seq >= $6::INTEGER + cardinality($7::TEXT[])), \
    put AS (INSERT INTO ctx_history (session, seq, segment) \
            SELECT swap.session, $6::INTEGER + t.o::INTEGER - 1, t.s \
            FROM swap, unnest($7::TEXT[]) WITH ORDINALITY AS t(s, o) WHERE $8 \
            ON CONFLICT (session, seq) DO UPDATE SET segment = excluded.segment) \
    SELECT count(*) FROM swap";

/// [`SWAP_TAIL`] for a record that exists (`version = $5`).
fn swap_update() -> String {
    format!(
        "WITH swap AS (UPDATE ctx_state SET version = $2, state = $3, updated_ms = $4 \
           WHERE session = $1 AND version = $5 RETURNING session), {SWAP_TAIL}"
    )
}

/// [`SWAP_TAIL`] for a new record (or one at version 0).
fn swap_insert() -> String {
    format!(
        "WITH swap AS (INSERT INTO ctx_state (session, version, state, updated_ms) \
           VALUES ($1, $2, $3, $4) \
           ON CONFLICT (session) DO UPDATE SET version = excluded.version, state = excluded.state, \
             updated_ms = excluded.updated_ms \
           WHERE ctx_state.version = $5 RETURNING session), {SWAP_TAIL}"
    )
}

/// A session's record in one read, unless its version is `$2` (-1: none
/// known). `$3` is how many history segments the reader holds: when at
/// least that many are stored, only the ones after them come back (from
/// `$3`; the reader checks that the ones it holds are still the stored
/// ones, see [`Since::Appended`]); else all of them (from 0).
const LOAD_AFTER: &str = "SELECT version, \
       CASE WHEN version <> $2 THEN state END, \
       CASE WHEN version <> $2 THEN b.f END, \
       CASE WHEN version <> $2 THEN \
         ARRAY(SELECT segment FROM ctx_history h WHERE h.session = s.session AND h.seq >= b.f \
               ORDER BY seq) END \
     FROM ctx_state s, LATERAL (SELECT CASE WHEN $3 > 0 AND (SELECT count(*) FROM ctx_history h \
         WHERE h.session = s.session) >= $3 THEN $3 ELSE 0 END AS f) b \
     WHERE session = $1";

/// A session's record version.
const VERSION: &str = "SELECT version FROM ctx_state WHERE session = $1";

/// Key of the advisory lock migrations run under ("ctxs").
const MIGRATION_LOCK: i64 = 0x6374_7873;

/// Longest indexed text per message, in bytes (Postgres limits a
/// `tsvector` to 1 MB); the message itself is kept whole.
const MAX_INDEXED_BYTES: usize = 256 * 1024;

/// A batch's messages, content-addressed (a message archived before, by
/// any session, is kept once), inserted in hash order so that two
/// transactions archiving the same messages take their locks in the same
/// order. `$1`..`$5`: hashes, roles, JSON, indexed text, its words.
const INSERT_MESSAGES: &str = "\
    INSERT INTO ctx_messages (hash, role, json, body, tsv) \
    SELECT t.hash, t.role, t.json, t.body, to_tsvector('simple', t.words) \
    FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[]) AS t(hash, role, json, body, words) \
    ORDER BY t.hash \
    ON CONFLICT (hash) DO NOTHING";

/// The session's archive rows for `$2` (hashes, in archive order), after
/// what it archived before (a separate statement: it sees the messages
/// [`INSERT_MESSAGES`] wrote, and those another transaction committed
/// meanwhile). A message archived before keeps its place.
const INSERT_ARCHIVE: &str = "\
    INSERT INTO ctx_archive (session, message, seq) \
    SELECT $1, m.id, base.n + t.o \
    FROM unnest($2::TEXT[]) WITH ORDINALITY AS t(hash, o) \
    JOIN ctx_messages m ON m.hash = t.hash \
    CROSS JOIN (SELECT COALESCE(MAX(seq), 0) AS n FROM ctx_archive WHERE session = $1) base \
    ORDER BY t.o \
    ON CONFLICT DO NOTHING";

/// Handles (`$2`..`$5`) and their members (`$6`..`$8`: handle, position,
/// message hash): the first registration of a handle wins, so members are
/// written only for the handles this statement added. Answers the members
/// wanted and written (a difference: a member names a message that is
/// not archived).
const INSERT_HANDLES: &str = "\
    WITH added AS (INSERT INTO ctx_handles (session, handle, kind, span_start, span_end) \
        SELECT $1, t.handle, t.kind, t.s, t.e \
        FROM unnest($2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::BIGINT[]) AS t(handle, kind, s, e) \
        ON CONFLICT DO NOTHING RETURNING handle), \
    wanted AS (SELECT p.handle, p.pos, p.hash \
        FROM unnest($6::TEXT[], $7::INTEGER[], $8::TEXT[]) AS p(handle, pos, hash) \
        JOIN added a ON a.handle = p.handle), \
    put AS (INSERT INTO ctx_handle_members (session, handle, pos, message) \
        SELECT $1, w.handle, w.pos, m.id FROM wanted w JOIN ctx_messages m ON m.hash = w.hash \
        RETURNING 1) \
    SELECT (SELECT count(*) FROM wanted), (SELECT count(*) FROM put)";

/// Compaction records, one per array element.
const INSERT_COMPACTIONS: &str = "\
    INSERT INTO ctx_compactions (session, seq, created_ms, trigger, engine, summarizer, \
      handle, span_start, span_end, archived, summary, tokens_before, tokens_after) \
    SELECT $1, t.* FROM unnest($2::BIGINT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::TEXT[], \
      $7::TEXT[], $8::BIGINT[], $9::BIGINT[], $10::BIGINT[], $11::TEXT[], $12::BIGINT[], $13::BIGINT[]) AS t";

/// What one or more batches write, as the columns of the array
/// statements above: messages once per hash and handles once per name
/// (the first wins, as in the store), in batch order.
#[derive(Default)]
struct Rows {
    hashes: Vec<String>,
    roles: Vec<String>,
    jsons: Vec<String>,
    bodies: Vec<String>,
    words: Vec<String>,
    handles: Vec<String>,
    kinds: Vec<String>,
    starts: Vec<Option<i64>>,
    ends: Vec<Option<i64>>,
    member_handles: Vec<String>,
    member_pos: Vec<i32>,
    member_hashes: Vec<String>,
    seqs: Vec<i64>,
    created: Vec<i64>,
    triggers: Vec<String>,
    engines: Vec<String>,
    summarizers: Vec<Option<String>>,
    spans: Vec<String>,
    span_starts: Vec<i64>,
    span_ends: Vec<i64>,
    archived: Vec<i64>,
    summaries: Vec<String>,
    tokens_before: Vec<i64>,
    tokens_after: Vec<i64>,
}

impl Rows {
    fn of(batches: &[Batch]) -> Rows {
        let mut rows = Rows::default();
        let mut seen = std::collections::HashSet::new();
        let mut named = std::collections::HashSet::new();
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let u = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for batch in batches {
            for (hash, message) in batch.messages() {
                if !seen.insert(hash.as_str()) {
                    continue;
                }
                let body = index_text(message);
                rows.words.push(tsv_text(&body));
                rows.bodies.push(body);
                rows.hashes.push(hash.clone());
                rows.roles.push(message.role.as_str().to_owned());
                rows.jsons.push(message_json(message));
            }
            for h in batch.handles() {
                if !named.insert(h.handle.as_str()) {
                    continue;
                }
                rows.handles.push(h.handle.clone());
                rows.kinds.push(h.kind.name().to_owned());
                rows.starts.push(h.start.map(n));
                rows.ends.push(h.end.map(n));
                for (pos, hash) in h.hashes.iter().enumerate() {
                    rows.member_handles.push(h.handle.clone());
                    rows.member_pos.push(i32::try_from(pos).unwrap_or(i32::MAX));
                    rows.member_hashes.push(hash.clone());
                }
            }
            for c in batch.compactions() {
                rows.seqs.push(u(c.seq));
                rows.created.push(u(c.created_ms));
                rows.triggers.push(c.trigger.clone());
                rows.engines.push(c.engine.clone());
                rows.summarizers.push(c.summarizer.clone());
                rows.spans.push(c.handle.clone());
                rows.span_starts.push(n(c.start));
                rows.span_ends.push(n(c.end));
                rows.archived.push(n(c.archived));
                rows.summaries
                    .push(serde_json::to_string(&c.summary).unwrap_or_else(|_| "[]".into()));
                rows.tokens_before.push(u(c.tokens_before));
                rows.tokens_after.push(u(c.tokens_after));
            }
        }
        rows
    }
}

/// How to reach the database.
#[derive(Clone)]
#[non_exhaustive]
pub struct PgOptions {
    /// `postgres://user@host:port/db` (no password: see
    /// [`password`](Self::password)); any libpq-style URL tokio-postgres
    /// reads.
    pub url: String,
    /// The password, from the environment; never logged.
    pub password: Option<String>,
    /// Connections in the pool.
    pub pool_size: usize,
    /// Connecting, waiting for a pooled connection, and each call as a
    /// whole are bounded by this.
    pub timeout: Duration,
    /// Whether a write (a session record, an archive) waits for the disk
    /// flush (`synchronous_commit`). Off (the default): the store's
    /// connections commit asynchronously, a write is still atomic and
    /// visible at once and survives a crash of the caller, and only a crash
    /// of the database server may lose its last fraction of a second of
    /// writes, each transaction whole or not at all (an archive with the
    /// record that names it): the guarantee of the SQLite store's
    /// `synchronous = NORMAL`.
    pub durable_records: bool,
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("url", &redacted_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .field("durable_records", &self.durable_records)
            .finish()
    }
}

impl PgOptions {
    /// Defaults (16 connections, 5 s timeout) for `url`.
    pub fn new(url: impl Into<String>) -> PgOptions {
        PgOptions {
            url: url.into(),
            password: None,
            pool_size: 16,
            timeout: Duration::from_secs(5),
            durable_records: false,
        }
    }

    /// Sets [`durable_records`](Self::durable_records).
    pub fn with_durable_records(mut self, durable: bool) -> PgOptions {
        self.durable_records = durable;
        self
    }

    /// Sets [`password`](Self::password).
    pub fn with_password(mut self, password: Option<String>) -> PgOptions {
        self.password = password.filter(|p| !p.is_empty());
        self
    }

    /// Sets [`pool_size`](Self::pool_size).
    pub fn with_pool_size(mut self, n: usize) -> PgOptions {
        self.pool_size = n.max(1);
        self
    }

    /// Sets [`timeout`](Self::timeout).
    pub fn with_timeout(mut self, timeout: Duration) -> PgOptions {
        self.timeout = timeout;
        self
    }
}

/// Whether `url` names a Postgres database (`postgres://` or
/// `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Whether `url` carries a password (`user:password@`, or a `password=`
/// parameter), which the configuration refuses: the password comes from
/// the environment. The library's one check
/// ([`context_engine::config::url_has_password`]).
pub fn url_has_password(url: &str) -> bool {
    context_engine::config::url_has_password(url)
}

/// `url` with any password replaced by `***`, for messages.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.find("password=") {
        Some(i) => {
            let after = &tail[i + "password=".len()..];
            let stop = after.find('&').unwrap_or(after.len());
            format!("{}password=***{}", &tail[..i], &after[stop..])
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// The Postgres session store (see the crate docs).
pub struct PgStore {
    runtime: Option<tokio::runtime::Runtime>,
    inner: Arc<Inner>,
    timeout: Duration,
}

struct Inner {
    pool: Pool,
    location: String,
    /// The schema was created or checked since the store started or last
    /// lost it (see [`Inner::client`]).
    migrated: AtomicBool,
    /// Calls that found the schema gone (SQLSTATE 42P01): a call that
    /// sees this move during its run migrates and runs once more.
    schema_lost: AtomicU64,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.inner.location)
            .finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // May be dropped inside an async server: never block there.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl PgStore {
    /// A store on the database `options` names. Does not connect: see
    /// [`connect`](Self::connect) to check the database at start.
    pub fn new(options: &PgOptions) -> Result<PgStore, StoreError> {
        let location = redacted_url(&options.url);
        let backend = |detail: String| StoreError::Backend {
            location: location.clone(),
            detail,
        };
        let mut config = tokio_postgres::Config::from_str(&options.url)
            .map_err(|e| backend(format!("not a Postgres URL: {e}")))?;
        if let Some(p) = &options.password {
            config.password(p.as_bytes());
        }
        config.connect_timeout(options.timeout);
        config.application_name("context-engine");
        if !options.durable_records {
            // Commits wait for the disk flush (milliseconds) only when
            // asked (see `PgOptions::durable_records`).
            let mut startup = config.get_options().unwrap_or("").to_owned();
            if !startup.is_empty() {
                startup.push(' ');
            }
            startup.push_str("-c synchronous_commit=off");
            config.options(&startup);
        }
        let location = describe(&config, &location);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ctx-postgres")
            .enable_all()
            .build()
            .map_err(|e| backend(format!("cannot start the database runtime: {e}")))?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(options.timeout))
            .create_timeout(Some(options.timeout))
            .recycle_timeout(Some(options.timeout))
            .build()
            .map_err(|e| backend(format!("cannot build the connection pool: {e}")))?;
        Ok(PgStore {
            runtime: Some(runtime),
            inner: Arc::new(Inner {
                pool,
                location,
                migrated: AtomicBool::new(false),
                schema_lost: AtomicU64::new(0),
            }),
            timeout: options.timeout,
        })
    }

    /// [`new`](Self::new), then connects and creates or migrates the
    /// schema: an error when the database is unreachable or newer.
    pub fn connect(options: &PgOptions) -> Result<PgStore, StoreError> {
        let store = PgStore::new(options)?;
        store.check()?;
        Ok(store)
    }

    /// Connects (creating or migrating the schema on first contact) and
    /// runs a trivial query: `Ok` when the database answers.
    pub fn check(&self) -> Result<(), StoreError> {
        self.call(|inner| async move {
            let client = inner.client().await?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| inner.err(&e))?;
            Ok(())
        })
    }

    /// Opens the pool's connections (up to its size) and prepares the
    /// statements of the request path on each, so that the first requests
    /// after a start pay for neither (a connection costs a few
    /// milliseconds, a statement's first use on it a round trip more).
    /// Returns how many connections are open. Best effort: a server that
    /// starts while the database is away warms nothing and connects later.
    pub fn warm(&self) -> Result<usize, StoreError> {
        let want = self.inner.pool.status().max_size;
        self.call(move |inner| async move {
            let mut clients = Vec::with_capacity(want);
            for _ in 0..want {
                clients.push(inner.client().await?);
            }
            let (update, insert) = (swap_update(), swap_insert());
            for client in &clients {
                tokio::try_join!(
                    client.prepare_cached(LOAD_AFTER),
                    client.prepare_cached(&update),
                    client.prepare_cached(&insert),
                    client.prepare_cached(VERSION),
                )
                .map_err(|e| inner.err(&e))?;
            }
            Ok(clients.len())
        })
    }

    /// Connections open in the pool, and how many are idle.
    pub fn pool_status(&self) -> (usize, usize) {
        let s = self.inner.pool.status();
        (s.size, s.available)
    }

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

    /// Runs `job` on the store's runtime and waits for it, at most the
    /// timeout. A job that found the schema gone (the database was dropped
    /// and created again, or its tables) runs once more: its connection
    /// then migrates the schema first ([`Inner::client`]).
    fn call<T, F, Fut>(&self, job: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner>) -> Fut + Clone,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let lost = self.inner.schema_lost.load(Ordering::Acquire);
        match self.call_once(job.clone()) {
            Err(e) if self.inner.schema_lost.load(Ordering::Acquire) != lost => {
                tracing::warn!(location = %self.inner.location, error = %e, "the store's tables are gone (a database dropped and created again?): migrating and trying again");
                self.call_once(job)
            }
            out => out,
        }
    }

    /// [`call`](Self::call) without the retry.
    fn call_once<T, F, Fut>(&self, job: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let Some(rt) = &self.runtime else {
            return Err(self.inner.backend("the store is shut down".into()));
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let fut = job(Arc::clone(&self.inner));
        let timeout = self.timeout;
        let location = self.inner.location.clone();
        let spawned = std::time::Instant::now();
        rt.spawn(async move {
            let started = std::time::Instant::now();
            let out = match tokio::time::timeout(timeout, fut).await {
                Ok(out) => out,
                Err(_) => Err(StoreError::Backend {
                    location,
                    detail: format!(
                        "no answer from the database within {} ms",
                        timeout.as_millis()
                    ),
                }),
            };
            let _ = tx.send((
                out,
                started.saturating_duration_since(spawned),
                started.elapsed(),
            ));
        });
        let (out, hop, run) = rx
            .recv()
            .map_err(|_| self.inner.backend("the database task was cancelled".into()))?;
        tracing::trace!(
            target: "ctx_timing::postgres",
            hop_us = hop.as_micros() as u64,
            run_us = run.as_micros() as u64,
            back_us = spawned.elapsed().saturating_sub(hop + run).as_micros() as u64,
            "call"
        );
        out
    }
}

/// `postgres://user@host:port/db` from a parsed config (no password).
fn describe(config: &tokio_postgres::Config, fallback: &str) -> String {
    let host = config.get_hosts().first().map(|h| match h {
        tokio_postgres::config::Host::Tcp(name) => name.clone(),
        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
    });
    match host {
        Some(host) => {
            let port = config.get_ports().first().copied().unwrap_or(5432);
            let user = config
                .get_user()
                .map(|u| format!("{u}@"))
                .unwrap_or_default();
            let db = config.get_dbname().unwrap_or("");
            format!("postgres://{user}{host}:{port}/{db}")
        }
        None => fallback.to_owned(),
    }
}

type Client = deadpool_postgres::Object;

impl Inner {
    fn backend(&self, detail: String) -> StoreError {
        StoreError::Backend {
            location: self.location.clone(),
            detail,
        }
    }

    fn err(&self, e: &tokio_postgres::Error) -> StoreError {
        if e.code() == Some(&SqlState::UNDEFINED_TABLE) {
            // The schema is gone: the next connection handed out migrates.
            self.migrated.store(false, Ordering::Release);
            self.schema_lost.fetch_add(1, Ordering::AcqRel);
        }
        let detail = match e.as_db_error() {
            Some(db) => format!("{}: {}", db.severity(), db.message()),
            None => match std::error::Error::source(e) {
                Some(cause) => format!("{e}: {cause}"),
                None => e.to_string(),
            },
        };
        self.backend(detail)
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            location: self.location.clone(),
            detail,
        }
    }

    fn conflict(&self, detail: String) -> StoreError {
        StoreError::Conflict {
            location: self.location.clone(),
            detail,
        }
    }

    /// A pooled connection, the schema migrated on first contact and
    /// checked on every new connection: a database dropped and created
    /// again (which ends every connection to it) is migrated again before
    /// its first call, not found without its tables by every call.
    async fn client(&self) -> Result<Client, StoreError> {
        let t = std::time::Instant::now();
        let mut client = self.pool.get().await.map_err(|e| {
            let detail = match &e {
                deadpool_postgres::PoolError::Backend(pe) => {
                    return self.err(pe);
                }
                deadpool_postgres::PoolError::Timeout(_) => {
                    "timed out waiting for a database connection".to_owned()
                }
                other => other.to_string(),
            };
            self.backend(format!("cannot connect: {detail}"))
        })?;
        tracing::trace!(target: "ctx_timing::postgres", pool_us = t.elapsed().as_micros() as u64, "pool");
        if !self.migrated.load(Ordering::Acquire) {
            self.migrate(&mut client).await?;
            self.migrated.store(true, Ordering::Release);
        } else if Client::metrics(&client).recycle_count == 0 {
            self.check_schema(&mut client).await?;
        }
        Ok(client)
    }

    /// On a new connection: one read of the schema's version, and the
    /// migrations when the schema is missing or older (a newer one is
    /// [`StoreError::NewerSchema`]).
    async fn check_schema(&self, client: &mut Client) -> Result<(), StoreError> {
        let found = client
            .query_opt("SELECT version FROM ctx_schema WHERE id = 1", &[])
            .await;
        match found {
            Ok(Some(row)) if row.get::<_, i32>(0) == SCHEMA_VERSION => Ok(()),
            Ok(_) => self.migrate(client).await,
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => {
                tracing::warn!(location = %self.location, "the store's schema is gone (a database dropped and created again?): migrating");
                self.migrate(client).await
            }
            Err(e) => Err(self.err(&e)),
        }
    }

    /// Creates or upgrades the schema, once for all instances (advisory
    /// lock), refusing a newer one.
    async fn migrate(&self, client: &mut Client) -> Result<(), StoreError> {
        let err = |e: tokio_postgres::Error| self.err(&e);
        let tx = client.transaction().await.map_err(err)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(err)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS ctx_schema (\
               id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL, \
               application TEXT NOT NULL DEFAULT 'context-engine')",
        )
        .await
        .map_err(err)?;
        let found: i32 = tx
            .query_opt("SELECT version FROM ctx_schema WHERE id = 1", &[])
            .await
            .map_err(err)?
            .map_or(0, |r| r.get(0));
        if found > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: self.location.clone().into(),
                found: i64::from(found),
                supported: i64::from(SCHEMA_VERSION),
            });
        }
        for (version, sql) in MIGRATIONS {
            if *version > found {
                tx.batch_execute(sql).await.map_err(err)?;
            }
        }
        if found < SCHEMA_VERSION {
            tx.execute(
                "INSERT INTO ctx_schema (id, version) VALUES (1, $1) \
                 ON CONFLICT (id) DO UPDATE SET version = excluded.version",
                &[&SCHEMA_VERSION],
            )
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)
    }

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

/// The text Postgres indexes: every run of letters and digits, lowercased,
/// separated by spaces (so `test_io.py` is three words in a row, as for
/// FTS5), bounded by [`MAX_INDEXED_BYTES`].
fn tsv_text(body: &str) -> String {
    let mut out = String::with_capacity(body.len().min(MAX_INDEXED_BYTES));
    for piece in body.split(|c: char| !c.is_alphanumeric()) {
        if piece.is_empty() {
            continue;
        }
        if out.len() + piece.len() + 1 > MAX_INDEXED_BYTES {
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.extend(piece.chars().flat_map(char::to_lowercase));
    }
    out
}

/// The `tsquery` for `words`: each word a phrase of its letter-and-digit
/// runs (`<->`), joined by `&` or `|`. Only letters and digits reach the
/// query text, so no query is a syntax error. `None` when no word has one.
fn ts_query(words: &[&str], all: bool) -> Option<String> {
    let phrases: Vec<String> = words
        .iter()
        .filter_map(|w| {
            let pieces: Vec<String> = w
                .split(|c: char| !c.is_alphanumeric())
                .filter(|p| !p.is_empty())
                .map(|p| p.chars().flat_map(char::to_lowercase).collect())
                .collect();
            (!pieces.is_empty()).then(|| format!("({})", pieces.join(" <-> ")))
        })
        .collect();
    (!phrases.is_empty()).then(|| phrases.join(if all { " & " } else { " | " }))
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
        if words.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let session = session.map(str::to_owned);
        self.call(|inner| async move {
            let client = inner.client().await?;
            let err = |e: tokio_postgres::Error| inner.err(&e);
            let stmt = client
                .prepare_cached(
                    "SELECT m.hash, m.role, m.json, m.body, \
                       ARRAY(SELECT DISTINCT h.handle FROM ctx_handle_members hm \
                             JOIN ctx_handles h ON h.session = hm.session AND h.handle = hm.handle \
                             WHERE hm.message = m.id AND h.kind = 'span' \
                               AND ($2::TEXT IS NULL OR hm.session = $2) ORDER BY h.handle) \
                     FROM ctx_messages m \
                     JOIN (SELECT message, MAX(seq) AS seq FROM ctx_archive \
                           WHERE $2::TEXT IS NULL OR session = $2 GROUP BY message) a ON a.message = m.id \
                     WHERE m.tsv @@ to_tsquery('simple', $1) \
                     ORDER BY ts_rank(m.tsv, to_tsquery('simple', $1)) DESC, a.seq DESC \
                     LIMIT $3",
                )
                .await
                .map_err(err)?;
            let refs: Vec<&str> = words.iter().map(String::as_str).collect();
            for all in [true, false] {
                let Some(q) = ts_query(&refs, all) else {
                    return Ok(Vec::new());
                };
                let rows = client
                    .query(&stmt, &[&q, &session, &(limit as i64)])
                    .await
                    .map_err(err)?;
                if !rows.is_empty() || refs.len() == 1 {
                    return rows
                        .iter()
                        .map(|r| {
                            let hash: String = r.get(0);
                            let message = inner.parse_message(r.get(2))?;
                            let body: String = r.get(3);
                            Ok(SearchHit {
                                handle: hit_handle(&message, &hash),
                                spans: r.get(4),
                                role: r.get(1),
                                source: "archive",
                                snippet: snippet(&body, &refs),
                            })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_and_hidden() {
        assert!(url_has_password("postgres://u:secret@db:5432/x"));
        assert!(url_has_password("postgres://db/x?password=secret"));
        assert!(!url_has_password("postgres://u@db:5432/x"));
        assert!(!url_has_password("postgres://db/x"));
        let shown = redacted_url("postgres://u:secret@db:5432/x?password=s2&sslmode=disable");
        assert!(
            !shown.contains("secret") && !shown.contains("s2"),
            "{shown}"
        );
        assert!(shown.contains("u:***@db:5432/x"), "{shown}");
        assert!(shown.contains("sslmode=disable"), "{shown}");
    }

    #[test]
    fn queries_are_phrases_of_words_only() {
        assert_eq!(
            ts_query(&["test_io.py", "KeyError"], true).as_deref(),
            Some("(test <-> io <-> py) & (keyerror)")
        );
        assert_eq!(
            ts_query(&["a'b", "&|!"], false).as_deref(),
            Some("(a <-> b)")
        );
        assert_eq!(ts_query(&[":"], true), None);
        assert_eq!(
            tsv_text("Fix tests/test_io.py::x!"),
            "fix tests test io py x"
        );
    }

    #[test]
    fn options_never_show_the_password() {
        let o = PgOptions::new("postgres://u@h/db").with_password(Some("hunter2".into()));
        assert!(!format!("{o:?}").contains("hunter2"));
    }
}
