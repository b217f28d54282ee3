//! The schema: its version, the migrations (`src/migrations/*.sql`) and
//! how a connection creates, checks or upgrades it.

use context_engine::store::StoreError;
use tokio_postgres::error::SqlState;

use crate::connection::{Client, Inner};

/// The schema version this build writes (and the newest it reads).
pub const SCHEMA_VERSION: i32 = 2;

const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_init.sql")),
    (2, include_str!("migrations/0002_history_segments.sql")),
];

/// Key of the advisory lock migrations run under ("ctxs").
const MIGRATION_LOCK: i64 = 0x6374_7873;

impl Inner {
    /// On a new connection: one read of the schema's version, and the
    /// migrations when the schema is missing or older (a newer one is
    /// [`StoreError::NewerSchema`]).
    pub(crate) async fn check_schema(&self, client: &mut Client) -> Result<(), StoreError> {
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
    pub(crate) async fn migrate(&self, client: &mut Client) -> Result<(), StoreError> {
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
}
