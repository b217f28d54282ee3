//! The full-text index, which trails the archive by at most
//! [`INDEX_BATCH`] messages (see the module docs of [`super`]).

use std::path::Path;

use rusqlite::{Connection, params};

use super::map_err;
use crate::message::Message;
use crate::store::StoreError;
use crate::store::pack::unpack;
use crate::store::text::index_text;

/// How many archived messages may wait for the full-text index (see the
/// module docs): the commit that reaches this many indexes them all.
pub const INDEX_BATCH: usize = 32;

/// A message waiting for the index, as the commit that archived it saw it.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) id: i64,
    pub(super) hash: String,
    pub(super) text: String,
}

/// The id of the newest indexed message. Messages are indexed in id order,
/// all that wait at once, so every message up to it is in the index and
/// every later one waits (the index's per-document table has a row per
/// indexed message; a deleted session's messages leave both).
pub(super) const INDEXED_UPTO: &str = "SELECT COALESCE(MAX(id), 0) FROM message_fts_docsize";

/// Indexes every message that waits for the full-text index, in `tx`:
/// with the text the commit that archived it computed (`known`, when the
/// message with that id is still the one it archived), else read back.
pub(super) fn index_waiting(
    tx: &Connection,
    path: &Path,
    known: &[&Waiting],
) -> Result<(), StoreError> {
    let err = |e| map_err(path, e);
    let mut read = tx
        .prepare_cached(&format!(
            "SELECT id, hash FROM messages WHERE id > ({INDEXED_UPTO}) ORDER BY id"
        ))
        .map_err(err)?;
    let rows = read
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .map_err(err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    if rows.is_empty() {
        return Ok(());
    }
    let mut index = tx
        .prepare_cached("INSERT INTO message_fts (rowid, text) VALUES (?1, ?2)")
        .map_err(err)?;
    let mut json = tx
        .prepare_cached("SELECT json FROM messages WHERE id = ?1")
        .map_err(err)?;
    let corrupt = |id: i64, e: String| StoreError::Corrupt {
        location: path.display().to_string(),
        detail: format!("archived message {id}: {e}"),
    };
    for (id, hash) in rows {
        let text = match known.iter().find(|w| w.id == id && w.hash == hash) {
            Some(w) => std::borrow::Cow::Borrowed(w.text.as_str()),
            None => {
                let stored = json.query_row([id], |r| r.get(0)).map_err(err)?;
                let text = unpack(stored).map_err(|e| corrupt(id, e.to_string()))?;
                let message: Message =
                    serde_json::from_str(&text).map_err(|e| corrupt(id, e.to_string()))?;
                std::borrow::Cow::Owned(index_text(&message))
            }
        };
        index.execute(params![id, text.as_ref()]).map_err(err)?;
    }
    Ok(())
}
