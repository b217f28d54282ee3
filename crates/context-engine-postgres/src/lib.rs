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

mod connection;
mod fts;
mod options;
mod rows;
mod schema;
mod sql;
mod store;
mod url;

pub use connection::PgStore;
pub use options::PgOptions;
pub use schema::SCHEMA_VERSION;
pub use url::{is_postgres_url, redacted_url, url_has_password};
