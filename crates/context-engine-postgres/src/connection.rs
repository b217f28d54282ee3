//! The store's runtime and connection pool: a synchronous call runs its
//! future on the store's own runtime, and a connection is handed out with
//! the schema migrated.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use context_engine::store::StoreError;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use crate::options::PgOptions;
use crate::sql::{LOAD_AFTER, VERSION, swap_insert, swap_update};
use crate::url::{describe, redacted_url};

/// The Postgres session store (see the crate docs).
pub struct PgStore {
    runtime: Option<tokio::runtime::Runtime>,
    pub(crate) inner: Arc<Inner>,
    timeout: Duration,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) location: String,
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

    /// Runs `job` on the store's runtime and waits for it, at most the
    /// timeout. A job that found the schema gone (the database was dropped
    /// and created again, or its tables) runs once more: its connection
    /// then migrates the schema first ([`Inner::client`]).
    pub(crate) fn call<T, F, Fut>(&self, job: F) -> Result<T, StoreError>
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

pub(crate) type Client = deadpool_postgres::Object;

impl Inner {
    pub(crate) fn backend(&self, detail: String) -> StoreError {
        StoreError::Backend {
            location: self.location.clone(),
            detail,
        }
    }

    pub(crate) fn err(&self, e: &tokio_postgres::Error) -> StoreError {
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

    pub(crate) fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            location: self.location.clone(),
            detail,
        }
    }

    pub(crate) fn conflict(&self, detail: String) -> StoreError {
        StoreError::Conflict {
            location: self.location.clone(),
            detail,
        }
    }

    /// A pooled connection, the schema migrated on first contact and
    /// checked on every new connection: a database dropped and created
    /// again (which ends every connection to it) is migrated again before
    /// its first call, not found without its tables by every call.
    pub(crate) async fn client(&self) -> Result<Client, StoreError> {
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
}
