//! Opening a store file: created private, checked to be a store,
//! migrated, its journal and checkpoint set up.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::checkpoint::{AUTOCHECKPOINT_PAGES, Checkpointer};
use super::index::index_waiting;
use super::schema::{MIGRATIONS, SCHEMA_VERSION, check_identity, migrate, user_version};
use super::search::Readers;
use super::{BUSY_TIMEOUT, SqliteStore, map_err};
use context_engine::store::{MEMORY_PATH, StoreError};

impl SqliteStore {
    /// Opens (or creates) the store file at `path`, creating its folder,
    /// and migrates an older schema. Fails with a clear error, never a new
    /// store in its place, when the file is not a store, was written by a
    /// newer version, is read-only, or another writer holds it.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            private_dir(dir).map_err(|e| StoreError::Backend {
                location: path.display().to_string(),
                detail: format!("cannot create the folder {}: {e}", dir.display()),
            })?;
        }
        let private = |e: std::io::Error| StoreError::Backend {
            location: path.display().to_string(),
            detail: format!("cannot make the store file private (mode 0600): {e}"),
        };
        create_private(path);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let store = SqliteStore::open_with(path, flags, true)?;
        // Only a file found to be a store is touched.
        narrow_private(path).map_err(private)?;
        Ok(store)
    }

    /// Opens an existing store file for reading only (`ctx recall`,
    /// `ctx search`): nothing is created or migrated.
    pub fn open_read_only(path: &Path) -> Result<SqliteStore, StoreError> {
        if !path.exists() {
            return Err(StoreError::NotFound {
                what: format!("store file {}", path.display()),
            });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        SqliteStore::open_with(path, flags, false)
    }

    /// A SQLite store in memory (the same engine and schema as a file).
    pub fn open_in_memory() -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_in_memory().map_err(|e| map_err(Path::new(MEMORY_PATH), e))?;
        SqliteStore::init(conn, PathBuf::from(MEMORY_PATH), true)
    }

    pub(crate) fn open_with(
        path: &Path,
        flags: OpenFlags,
        write: bool,
    ) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_with_flags(path, flags).map_err(|e| map_err(path, e))?;
        SqliteStore::init(conn, path.to_path_buf(), write)
    }

    fn init(conn: Connection, path: PathBuf, write: bool) -> Result<SqliteStore, StoreError> {
        let err = |e| map_err(&path, e);
        conn.busy_timeout(BUSY_TIMEOUT).map_err(err)?;
        if write && conn.is_readonly(rusqlite::MAIN_DB).map_err(err)? {
            return Err(StoreError::ReadOnly { path });
        }
        check_identity(&conn, &path)?;
        if write {
            if path.as_os_str() != MEMORY_PATH {
                let mode: String = conn
                    .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                    .map_err(err)?;
                if !mode.eq_ignore_ascii_case("wal") {
                    return Err(StoreError::Backend {
                        location: path.display().to_string(),
                        detail: format!("cannot use the WAL journal (journal mode is {mode})"),
                    });
                }
            }
            conn.execute_batch(&format!(
                "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
                 PRAGMA secure_delete = ON; \
                 PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES};"
            ))
            .map_err(err)?;
            migrate(&conn, &path, MIGRATIONS)?;
            // Take the write lock once: another writer holding it is an
            // error now, not a surprise at the first compaction; and index
            // what a killed writer left waiting.
            let tx = rusqlite::Transaction::new_unchecked(&conn, TransactionBehavior::Immediate)
                .map_err(err)?;
            index_waiting(&tx, &path, &[])?;
            tx.commit().map_err(err)?;
        } else if user_version(&conn, &path)? < SCHEMA_VERSION {
            return Err(StoreError::Backend {
                location: path.display().to_string(),
                detail: "the store has an older schema; open it once for writing (e.g. `ctx compact --store`) to migrate it".into(),
            });
        }
        let checkpoint = (write && path.as_os_str() != MEMORY_PATH)
            .then(|| Checkpointer::start(&path))
            .flatten();
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            waiting: Mutex::new(Vec::new()),
            commits: AtomicUsize::new(0),
            checkpoint,
            readers: (write && path.as_os_str() != MEMORY_PATH).then(|| Readers::new(&path)),
            path,
        })
    }

    /// The file (or `:memory:`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The database's size on disk in bytes (pages in use times page size,
    /// the write-ahead log not included); `None` in memory.
    pub fn size_bytes(&self) -> Result<u64, StoreError> {
        let conn = self.lock();
        let pages: i64 = conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        Ok((pages.max(0) as u64) * (size.max(0) as u64))
    }

    /// Checkpoints the write-ahead log into the main file and runs SQLite's
    /// integrity check; `Ok(())` when the file is sound.
    pub fn check(&self) -> Result<(), StoreError> {
        let conn = self.lock();
        let result: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        if result != "ok" {
            return Err(StoreError::Corrupt {
                location: self.path.display().to_string(),
                detail: result,
            });
        }
        Ok(())
    }
}

/// Creates `dir` (and its missing parents) readable by its owner only
/// (0700 on Unix).
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates the store file `path` readable by its owner only (0600 on
/// Unix) when it is missing: SQLite gives its `-wal` and `-shm` files the
/// database's mode.
fn create_private(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // An existing file is left alone; a folder that cannot be written
        // fails here and SQLite's own error says so.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path);
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Narrows an existing store file `path` (and its log files) that others
/// can read to 0600 (one an older version created 0644).
fn narrow_private(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for suffix in ["", "-wal", "-shm"] {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            let file = Path::new(&name);
            let Ok(meta) = std::fs::metadata(file) else {
                continue;
            };
            if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
                std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))?;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}
