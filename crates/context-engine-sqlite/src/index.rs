//! The full-text index, one document per archive row, which trails the
//! archive by at most [`INDEX_BATCH`] rows (see the module docs of
//! [`super`]).

use std::path::Path;

use rusqlite::{Connection, params};

use super::map_err;
use crate::pack::unpack;
use context_engine::message::Message;
use context_engine::store::StoreError;
use context_engine::store::backend::index_text;

/// How many archive rows may wait for the full-text index (see the module
/// docs): the commit that reaches this many indexes them all.
pub const INDEX_BATCH: usize = 32;

/// Bits of a document number below the session's number: its seq.
const SEQ_BITS: u32 = 32;

/// An archive row waiting for the index, as the commit that archived it
/// saw it: `text` is its [`session_text`].
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) doc: i64,
    pub(super) message: i64,
    pub(super) hash: String,
    pub(super) text: String,
}

/// The document number of the archive row `seq` of the session numbered
/// `no`; `None` past the 32 bits a seq has.
pub(super) fn doc_of(no: i64, seq: i64) -> Option<i64> {
    (0..1 << SEQ_BITS)
        .contains(&seq)
        .then_some((no << SEQ_BITS) | seq)
}

/// The documents of the session numbered `no`: one rowid range.
pub(super) fn docs_of(no: i64) -> (i64, i64) {
    (no << SEQ_BITS, (no << SEQ_BITS) | ((1 << SEQ_BITS) - 1))
}

/// The session number and seq of document `doc`.
pub(super) fn split_doc(doc: i64) -> (i64, i64) {
    (doc >> SEQ_BITS, doc & ((1 << SEQ_BITS) - 1))
}

/// The text session `no`'s document is indexed under: each token of
/// `text` (a run of letters and digits, as [`session_query`] splits a
/// query's words) with the session's mark, so that every term of the
/// index belongs to one session, and a query reads no other session's
/// doclists.
pub(super) fn session_text(no: i64, text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for token in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
    {
        if !out.is_empty() {
            out.push(' ');
        }
        push_token(&mut out, no, token);
    }
    out
}

/// `s{no}x{token}`: the session's mark (digits ended by `x`, so no two
/// sessions' marks are prefixes of one another) and the token.
fn push_token(out: &mut String, no: i64, token: &str) {
    use std::fmt::Write;
    let _ = write!(out, "s{no}x{token}");
}

/// The FTS5 expression for `words` in session `no`'s index, joined by AND
/// or OR: each word the AND of its tokens (its runs of letters and
/// digits), each with the session's mark and quoted, so no query can be a
/// syntax error. A phrase query would check token positions in every
/// message that holds the tokens (`test_io.py`: three common tokens); the
/// index narrows by tokens alone, cheaply, and the caller keeps a message
/// only when its text matches the words
/// ([`Terms::matches`](context_engine::store::matched_lines::Terms::matches)).
pub(super) fn session_query(no: i64, words: &[&str], all: bool) -> String {
    let terms: Vec<String> = words
        .iter()
        .filter_map(|w| {
            let tokens: Vec<String> = w
                .split(|c: char| !c.is_alphanumeric())
                .filter(|t| !t.is_empty())
                .map(|t| {
                    let mut q = String::from("\"");
                    push_token(&mut q, no, t);
                    q.push('"');
                    q
                })
                .collect();
            match tokens.len() {
                0 => None,
                1 => Some(tokens.concat()),
                _ => Some(format!("({})", tokens.join(" AND "))),
            }
        })
        .collect();
    terms.join(if all { " AND " } else { " OR " })
}

/// The number of `session`'s documents, given it now (in `tx`) when it has
/// none.
pub(super) fn session_no(tx: &Connection, path: &Path, session: &str) -> Result<i64, StoreError> {
    let err = |e| map_err(path, e);
    tx.prepare_cached("INSERT INTO search_sessions (session) VALUES (?1) ON CONFLICT DO NOTHING")
        .map_err(err)?
        .execute([session])
        .map_err(err)?;
    let no: i64 = tx
        .prepare_cached("SELECT no FROM search_sessions WHERE session = ?1")
        .map_err(err)?
        .query_row([session], |r| r.get(0))
        .map_err(err)?;
    if no >= 1 << 31 {
        return Err(StoreError::Backend {
            location: path.display().to_string(),
            detail: "the store numbers more sessions than its index can hold (2^31)".into(),
        });
    }
    Ok(no)
}

/// Indexes every archive row that waits for the full-text index, in `tx`:
/// with the text the commit that archived it computed (`known`, when the
/// message is still the one it archived), else read back.
pub(super) fn index_waiting(
    tx: &Connection,
    path: &Path,
    known: &[&Waiting],
) -> Result<(), StoreError> {
    let err = |e| map_err(path, e);
    let mut read = tx
        .prepare_cached(
            "SELECT p.doc, p.message, m.hash FROM search_pending p \
             JOIN messages m ON m.id = p.message ORDER BY p.doc",
        )
        .map_err(err)?;
    let rows = read
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
            ))
        })
        .map_err(err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    if rows.is_empty() {
        return Ok(());
    }
    let mut index = tx
        .prepare_cached("INSERT INTO archive_fts (rowid, text) VALUES (?1, ?2)")
        .map_err(err)?;
    let mut json = tx
        .prepare_cached("SELECT json FROM messages WHERE id = ?1")
        .map_err(err)?;
    let corrupt = |id: i64, e: String| StoreError::Corrupt {
        location: path.display().to_string(),
        detail: format!("archived message {id}: {e}"),
    };
    for (doc, id, hash) in rows {
        let text = match known
            .iter()
            .find(|w| w.doc == doc && w.message == id && w.hash == hash)
        {
            Some(w) => std::borrow::Cow::Borrowed(w.text.as_str()),
            None => {
                let stored = json.query_row([id], |r| r.get(0)).map_err(err)?;
                let text = unpack(stored).map_err(|e| corrupt(id, e.to_string()))?;
                let message: Message =
                    serde_json::from_str(&text).map_err(|e| corrupt(id, e.to_string()))?;
                std::borrow::Cow::Owned(session_text(split_doc(doc).0, &index_text(&message)))
            }
        };
        index.execute(params![doc, text.as_ref()]).map_err(err)?;
    }
    tx.execute("DELETE FROM search_pending", []).map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_cannot_be_syntax_errors_and_name_the_sessions_terms() {
        assert_eq!(
            session_query(3, &["a\"b", "c:d"], true),
            "(\"s3xa\" AND \"s3xb\") AND (\"s3xc\" AND \"s3xd\")"
        );
        assert_eq!(
            session_query(12, &["x", "y"], false),
            "\"s12xx\" OR \"s12xy\""
        );
        assert_eq!(
            session_query(1, &["test_io.py"], true),
            "(\"s1xtest\" AND \"s1xio\" AND \"s1xpy\")"
        );
        assert_eq!(
            session_text(7, "KeyError: 'total' (x2)"),
            "s7xKeyError s7xtotal s7xx2"
        );
        // No session's mark is the start of another's.
        assert_ne!(session_text(1, "2xa"), session_text(12, "a"));
    }
}
