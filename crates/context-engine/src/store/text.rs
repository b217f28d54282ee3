//! The text a store indexes and how a query matches it, shared by the
//! backends so that both answer a search the same way.

use crate::message::Message;

/// A message's indexed text: its content, then each tool call's name and
/// arguments (what retention searches too).
pub fn index_text(message: &Message) -> String {
    crate::retention::searchable(message, &message.text())
}

/// The words of a query: its whitespace-separated chunks that hold a
/// letter or digit (punctuation alone matches nothing in the index). Each
/// must appear as written (ASCII case aside): `test_io.py` is not found in
/// a text that has `test`, `io` and `py` apart.
pub fn query_words(query: &str) -> Vec<&str> {
    query
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .collect()
}

/// The FTS5 expression for `words`, joined by AND or OR: each word is the
/// AND of its tokens (its runs of letters and digits, each a quoted
/// string, so no query can be a syntax error). A phrase query would check
/// token positions in every message that holds the tokens (`test_io.py`:
/// three common tokens); the index narrows by tokens alone, cheaply, and
/// the caller keeps a message only when its text [`matches`] the words.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn fts_query(words: &[&str], all: bool) -> String {
    let terms: Vec<String> = words
        .iter()
        .map(|w| {
            let tokens: Vec<String> = w
                .split(|c: char| !c.is_alphanumeric())
                .filter(|t| !t.is_empty())
                .map(|t| format!("\"{t}\""))
                .collect();
            match tokens.len() {
                1 => tokens.concat(),
                _ => format!("({})", tokens.join(" AND ")),
            }
        })
        .collect();
    terms.join(if all { " AND " } else { " OR " })
}

/// Whether `text` contains the words (ASCII case-insensitive), all or any.
pub(crate) fn matches(text: &str, words: &[&str], all: bool) -> bool {
    let lower = text.to_ascii_lowercase();
    let found = |w: &&str| lower.contains(&w.to_ascii_lowercase());
    if all {
        words.iter().all(found)
    } else {
        words.iter().any(found)
    }
}

/// Longest snippet, in bytes, before the ellipses.
pub(crate) const SNIPPET_BYTES: usize = 200;

/// About [`SNIPPET_BYTES`] of `text` around the first word found (ASCII
/// case-insensitive), whitespace collapsed, `…` where clipped.
pub fn snippet(text: &str, words: &[&str]) -> String {
    let lower = text.to_ascii_lowercase();
    let at = words
        .iter()
        .filter_map(|w| lower.find(&w.to_ascii_lowercase()))
        .min()
        .unwrap_or(0);
    let mut start = at.saturating_sub(SNIPPET_BYTES / 3);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + SNIPPET_BYTES).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let body = text[start..end]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let open = if start > 0 { "…" } else { "" };
    let close = if end < text.len() { "…" } else { "" };
    format!("{open}{body}{close}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_cannot_be_syntax_errors() {
        assert_eq!(
            fts_query(&["a\"b", "c:d"], true),
            "(\"a\" AND \"b\") AND (\"c\" AND \"d\")"
        );
        assert_eq!(fts_query(&["x", "y"], false), "\"x\" OR \"y\"");
        assert_eq!(
            fts_query(&["test_io.py"], true),
            "(\"test\" AND \"io\" AND \"py\")"
        );
    }

    #[test]
    fn snippets_centre_on_the_match() {
        let text = format!("{}NEEDLE here{}", "a ".repeat(300), " b".repeat(300));
        let s = snippet(&text, &["needle"]);
        assert!(s.contains("NEEDLE here"));
        assert!(s.starts_with('…') && s.ends_with('…'));
        assert!(matches(&text, &["needle", "HERE"], true));
        assert!(!matches(&text, &["needle", "absent"], true));
        assert!(matches(&text, &["needle", "absent"], false));
    }
}
