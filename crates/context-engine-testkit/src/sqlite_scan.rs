//! Scans of what a SQLite store left behind for the planted secrets
//! ([`crate::secrets`]), for the crates whose tests write SQLite stores.

use std::path::Path;

use crate::secrets::found;

/// The secrets found in any byte of the SQLite store `db` and its `-wal`
/// and `-shm` files, and in any column of any of its tables (DEFLATE
/// blobs inflated): `file or table: secret` for each.
pub fn scan_sqlite(db: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{}{suffix}", db.display());
        if let Ok(bytes) = std::fs::read(&file) {
            for s in found(&bytes) {
                out.push(format!("{file}: {s}"));
            }
        }
    }
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for table in tables {
        let Ok(mut stmt) = conn.prepare(&format!("SELECT * FROM \"{table}\"")) else {
            continue;
        };
        let n = stmt.column_count();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            for i in 0..n {
                let bytes: Vec<u8> = match row.get_ref(i).unwrap() {
                    rusqlite::types::ValueRef::Text(t) => t.to_vec(),
                    rusqlite::types::ValueRef::Blob(b) => {
                        let mut all = b.to_vec();
                        let mut inflated = Vec::new();
                        if std::io::Read::read_to_end(
                            &mut flate2::read::DeflateDecoder::new(b),
                            &mut inflated,
                        )
                        .is_ok()
                        {
                            all.extend_from_slice(&inflated);
                        }
                        all
                    }
                    _ => continue,
                };
                for s in found(&bytes) {
                    out.push(format!("table {table}: {s}"));
                }
            }
        }
    }
    out
}
