//! Full-text search text: what Postgres indexes of a message and the
//! `tsquery` a search sends.

/// Longest indexed text per message, in bytes (Postgres limits a
/// `tsvector` to 1 MB); the message itself is kept whole.
pub(crate) const MAX_INDEXED_BYTES: usize = 256 * 1024;

/// The text Postgres indexes: every run of letters and digits, lowercased,
/// separated by spaces (so `test_io.py` is three words in a row, as for
/// FTS5), bounded by [`MAX_INDEXED_BYTES`].
pub(crate) fn tsv_text(body: &str) -> String {
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

/// The `tsquery` for `words`: each word the AND of its letter-and-digit
/// runs, joined by `&` or `|`. Only letters and digits reach the query
/// text, so no query is a syntax error. `None` when no word has one.
///
/// Not a phrase (`<->`): a `tsvector` keeps at most 256 positions of a
/// word, so in a long text (a test log naming `test` a thousand times) a
/// phrase near its end is not found. The index narrows by tokens, as
/// FTS5's does, and the store keeps a row only when its text holds the
/// words themselves (`Terms::matching`, the check every store makes).
pub(crate) fn ts_query(words: &[&str], all: bool) -> Option<String> {
    let phrases: Vec<String> = words
        .iter()
        .filter_map(|w| {
            let pieces: Vec<String> = w
                .split(|c: char| !c.is_alphanumeric())
                .filter(|p| !p.is_empty())
                .map(|p| p.chars().flat_map(char::to_lowercase).collect())
                .collect();
            (!pieces.is_empty()).then(|| format!("({})", pieces.join(" & ")))
        })
        .collect();
    (!phrases.is_empty()).then(|| phrases.join(if all { " & " } else { " | " }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_tokens_of_words_only() {
        assert_eq!(
            ts_query(&["test_io.py", "KeyError"], true).as_deref(),
            Some("(test & io & py) & (keyerror)")
        );
        assert_eq!(ts_query(&["a'b", "&|!"], false).as_deref(), Some("(a & b)"));
        assert_eq!(ts_query(&[":"], true), None);
        assert_eq!(
            tsv_text("Fix tests/test_io.py::x!"),
            "fix tests test io py x"
        );
    }
}
