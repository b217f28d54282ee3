//! The schema: its version, the migrations (`src/migrations/sqlite/`)
//! and the check that a file is a context-engine store.

use std::path::Path;

use rusqlite::{Connection, ErrorCode};

use super::map_err;
#[cfg(test)]
use context_engine::store::MEMORY_PATH;
use context_engine::store::StoreError;

/// The schema version this build writes (and the newest it reads).
pub const SCHEMA_VERSION: i64 = 5;

/// `PRAGMA application_id` of a context-engine store ("CTXS").
const APPLICATION_ID: i64 = 0x4354_5853;

/// The migrations, in order: schema version reached, SQL.
pub(super) const MIGRATIONS: &[(i64, &str)] = &[
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
    (5, include_str!("migrations/sqlite/0005_session_index.sql")),
];

/// Refuses a file that is not a context-engine store (another program's
/// SQLite database, or not SQLite at all) or a newer schema's.
pub(super) fn check_identity(conn: &Connection, path: &Path) -> Result<(), StoreError> {
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

pub(super) fn user_version(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| map_err(path, e))
}

/// Runs every migration newer than the file's `user_version`, each in the
/// transaction that sets the version it reaches.
pub(super) fn migrate(
    conn: &Connection,
    path: &Path,
    migrations: &[(i64, &str)],
) -> Result<(), StoreError> {
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

#[cfg(test)]
pub(crate) fn migrate_for_test(
    conn: &Connection,
    migrations: &[(i64, &str)],
) -> Result<(), StoreError> {
    migrate(conn, Path::new(MEMORY_PATH), migrations)
}

#[cfg(test)]
pub(crate) const MIGRATIONS_FOR_TEST: &[(i64, &str)] = MIGRATIONS;
