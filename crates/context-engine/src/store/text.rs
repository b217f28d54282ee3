//! The text a store indexes and the FTS5 query that narrows a search,
//! shared by the backends so that all answer a search the same way (which
//! messages and lines match: [`super::matched_lines`]).

use crate::message::Message;

/// A message's indexed text: its content, then each tool call's name and
/// arguments (what retention searches too).
pub fn index_text(message: &Message) -> String {
    crate::retention::searchable(message, &message.text())
}

/// The FTS5 expression for `words`, joined by AND or OR: each word is the
/// AND of its tokens (its runs of letters and digits, each a quoted
/// string, so no query can be a syntax error). A phrase query would check
/// token positions in every message that holds the tokens (`test_io.py`:
/// three common tokens); the index narrows by tokens alone, cheaply, and
/// the caller keeps a message only when its text matches the words
/// ([`Terms::matches`](super::matched_lines::Terms::matches)).
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
}
