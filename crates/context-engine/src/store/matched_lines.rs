//! Which lines of a message match a search, and how a query matches a
//! message at all: the one place every store (memory, SQLite, Postgres) and
//! the `context_search` tool ask, so that the same archive answers a query
//! with the same hits and the same lines whichever backend holds it.
//!
//! Terms are what the full-text indexes see: a query word is its runs of
//! letters and digits (`test_11_6` is `test`, `11`, `6`), matched as a
//! phrase of whole tokens, case-insensitively, so `in` is not found inside
//! `main` and `test_io.py` is found in `test_io.py` (and `test io py`), not
//! in a text that has the three tokens apart.
//!
//! A hit shows the lines that hold the terms: the lines with the most
//! distinct terms first (then in text order), and after them only lines
//! that hold a term none shown holds, at most [`MAX_MATCHED_LINES`]; each
//! cut to about [`MAX_LINE_BYTES`] around its first match with `…` where
//! cut, with its 1-based line number and the byte ranges of the terms
//! within the shown text.

use serde::{Deserialize, Serialize};

/// Most lines a hit shows.
pub const MAX_MATCHED_LINES: usize = 3;

/// Longest shown line, in bytes, before the ellipses.
pub const MAX_LINE_BYTES: usize = 200;

/// One line of a message that holds query terms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatchedLine {
    /// The line's number in the message's searched text, from 1.
    pub line: usize,
    /// The line (whitespace trimmed, control characters as spaces), cut to
    /// about [`MAX_LINE_BYTES`] around its first match, `…` where cut.
    pub text: String,
    /// The byte ranges `[start, end)` of the matched terms within `text`,
    /// in order (what a page highlights).
    pub ranges: Vec<[usize; 2]>,
}

/// A query's words, each as the tokens the full-text index splits it into
/// (lowercased).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Terms {
    words: Vec<Vec<String>>,
}

/// The words of a query: its whitespace-separated chunks that hold a
/// letter or digit (punctuation alone matches nothing in the index).
pub fn query_words(query: &str) -> Vec<&str> {
    query
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .collect()
}

/// The byte ranges of the runs of letters and digits of `text`: the tokens
/// of every index (FTS5's `unicode61`, Postgres' `simple` over the text
/// split at everything else).
fn tokens(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

fn lowercase(token: &str) -> String {
    token.chars().flat_map(char::to_lowercase).collect()
}

impl Terms {
    /// The terms of `query` (see [`query_words`]).
    pub fn new(query: &str) -> Terms {
        Terms::of_words(&query_words(query))
    }

    /// The terms of `words`, each split into its tokens; a word without
    /// any is left out.
    pub fn of_words(words: &[&str]) -> Terms {
        let words = words
            .iter()
            .map(|w| {
                tokens(w)
                    .into_iter()
                    .map(|(s, e)| lowercase(&w[s..e]))
                    .collect()
            })
            .filter(|t: &Vec<String>| !t.is_empty())
            .collect();
        Terms { words }
    }

    /// Whether the query has no term.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// How many words the query has.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Every occurrence in `text` (tokenized as `toks`): the byte range
    /// from its first token's start to its last token's end, and the word.
    fn occurrences(&self, text: &str, toks: &[(usize, usize)]) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        for (w, word) in self.words.iter().enumerate() {
            let k = word.len();
            if toks.len() < k {
                continue;
            }
            for i in 0..=toks.len() - k {
                if word
                    .iter()
                    .zip(&toks[i..i + k])
                    .all(|(q, &(s, e))| same_token(&text[s..e], q))
                {
                    out.push((toks[i].0, toks[i + k - 1].1, w));
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Which words occur in `text`, in word order.
    fn found(&self, text: &str) -> Vec<bool> {
        let toks = tokens(text);
        let mut found = vec![false; self.words.len()];
        for (w, word) in self.words.iter().enumerate() {
            let k = word.len();
            found[w] = toks.len() >= k
                && (0..=toks.len() - k).any(|i| {
                    word.iter()
                        .zip(&toks[i..i + k])
                        .all(|(q, &(s, e))| same_token(&text[s..e], q))
                });
        }
        found
    }

    /// Whether `text` holds the words, all or any.
    pub fn matches(&self, text: &str, all: bool) -> bool {
        let found = self.found(text);
        if all {
            !found.is_empty() && found.iter().all(|f| *f)
        } else {
            found.iter().any(|f| *f)
        }
    }

    /// How many of the words `text` holds when it [`matches`](Self::matches)
    /// them (all or any), in one pass.
    pub fn matching(&self, text: &str, all: bool) -> Option<usize> {
        let found = self.found(text);
        let count = found.iter().filter(|f| **f).count();
        let ok = if all { count == found.len() } else { count > 0 };
        (ok && count > 0).then_some(count)
    }

    /// How many of the words `text` holds (what breaks a tie of ranks).
    pub fn count(&self, text: &str) -> usize {
        self.found(text).into_iter().filter(|f| *f).count()
    }

    /// The byte ranges of the words in `text` (one line, as shown), in
    /// order: what a caller that changed a shown line (masked it) marks
    /// again.
    pub fn ranges(&self, text: &str) -> Vec<[usize; 2]> {
        self.occurrences(text, &tokens(text))
            .into_iter()
            .map(|(s, e, _)| [s, e])
            .collect()
    }

    /// The lines of `text` that hold the words (see the module docs).
    pub fn lines(&self, text: &str) -> Vec<MatchedLine> {
        let occurrences = self.occurrences(text, &tokens(text));
        // Per line (number, bounds): the words it holds and their ranges.
        let mut lines: Vec<LineMatch> = Vec::new();
        let (mut number, mut line_start, mut scanned) = (1usize, 0usize, 0usize);
        for (s, e, w) in occurrences {
            // Count the line breaks up to this match (the matches come in
            // text order, so the text is scanned once).
            for (i, b) in text.as_bytes()[scanned..s].iter().enumerate() {
                if *b == b'\n' {
                    number += 1;
                    line_start = scanned + i + 1;
                }
            }
            scanned = s;
            if lines.last().is_none_or(|l| l.number != number) {
                let line_end = text[line_start..]
                    .find('\n')
                    .map_or(text.len(), |i| line_start + i);
                lines.push(LineMatch {
                    number,
                    start: line_start,
                    end: line_end,
                    words: vec![false; self.words.len()],
                    ranges: Vec::new(),
                });
            }
            if let Some(line) = lines.last_mut() {
                line.words[w] = true;
                // A phrase across a line break is shown on its first line.
                line.ranges.push((s, e.min(line.end)));
            }
        }
        lines.sort_by_key(|l| (std::cmp::Reverse(l.distinct()), l.number));
        // The best lines, then lines that add words none shown holds; a
        // line with fewer words that adds none (a `PASSED … in 0.01s` line
        // under a query that also says `in`) is noise.
        let best = lines.first().map_or(0, LineMatch::distinct);
        let mut covered = vec![false; self.words.len()];
        let mut shown = Vec::new();
        for l in lines {
            if shown.len() == MAX_MATCHED_LINES {
                break;
            }
            let adds = l
                .words
                .iter()
                .zip(&covered)
                .any(|(has, seen)| *has && !*seen);
            if l.distinct() == best || adds {
                for (seen, has) in covered.iter_mut().zip(&l.words) {
                    *seen |= *has;
                }
                shown.push(l.shown(text));
            }
        }
        shown
    }
}

/// Whether a token of the text is the (lowercased) query token `q`.
fn same_token(token: &str, q: &str) -> bool {
    token.chars().flat_map(char::to_lowercase).eq(q.chars())
}

struct LineMatch {
    number: usize,
    start: usize,
    end: usize,
    words: Vec<bool>,
    ranges: Vec<(usize, usize)>,
}

impl LineMatch {
    fn distinct(&self) -> usize {
        self.words.iter().filter(|w| **w).count()
    }

    /// The line as shown: trimmed, cut around its first match.
    fn shown(self, text: &str) -> MatchedLine {
        let raw = &text[self.start..self.end];
        let lead = raw.len() - raw.trim_start().len();
        let body = raw.trim();
        let base = self.start + lead;
        let ranges: Vec<(usize, usize)> = self
            .ranges
            .iter()
            .map(|&(s, e)| (s - base, (e - base).min(body.len())))
            .collect();
        let (from, to) = if body.len() <= MAX_LINE_BYTES {
            (0, body.len())
        } else {
            let first = ranges.first().map_or(0, |r| r.0);
            let from = floor_boundary(body, first.saturating_sub(MAX_LINE_BYTES / 3));
            (
                from,
                floor_boundary(body, (from + MAX_LINE_BYTES).min(body.len())),
            )
        };
        let open = if from > 0 { "…" } else { "" };
        let close = if to < body.len() { "…" } else { "" };
        // Control characters (tabs, a carriage return) as spaces: one byte
        // for one, so the ranges hold.
        let cut: String = body[from..to]
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let ranges = ranges
            .into_iter()
            .filter_map(|(s, e)| {
                let (s, e) = (s.max(from), e.min(to));
                (s < e).then(|| [s - from + open.len(), e - from + open.len()])
            })
            .collect();
        MatchedLine {
            line: self.number,
            text: format!("{open}{cut}{close}"),
            ranges,
        }
    }
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(line: &MatchedLine) -> Vec<&str> {
        line.ranges
            .iter()
            .map(|[s, e]| &line.text[*s..*e])
            .collect()
    }

    #[test]
    fn the_line_with_the_match_is_shown_not_the_lines_around_it() {
        let mut text = String::new();
        for i in 0..200 {
            text.push_str(&format!("tests/test_main.py::test_{i} PASSED in 0.01s\n"));
        }
        text.push_str("E   AssertionError: expected 38 got 136 in test_11_6\n");
        for i in 0..50 {
            text.push_str(&format!("tests/test_io.py::test_{i} PASSED\n"));
        }
        let terms = Terms::new("expected 38 got 136 in test_11_6");
        assert!(terms.matches(&text, true));
        let lines = terms.lines(&text);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].line, 201);
        assert_eq!(
            lines[0].text,
            "E   AssertionError: expected 38 got 136 in test_11_6"
        );
        assert_eq!(
            marked(&lines[0]),
            ["expected", "38", "got", "136", "in", "test_11_6"]
        );
        // One word: its first lines.
        let lines = Terms::new("passed").lines(&text);
        let numbers: Vec<usize> = lines.iter().map(|l| l.line).collect();
        assert_eq!(numbers, [1, 2, 3]);
    }

    #[test]
    fn terms_are_whole_tokens_as_the_index_splits_them() {
        let terms = Terms::new("in");
        assert!(!terms.matches("tests/test_main.py", true));
        assert!(terms.matches("failed IN setup", true));
        let phrase = Terms::new("test_io.py");
        assert!(phrase.matches("ran tests/TEST_IO.PY ok", true));
        assert!(!phrase.matches("test and io and py", true));
        let two = Terms::new("KeyError absent");
        assert!(two.matches("KeyError: x", false));
        assert!(!two.matches("KeyError: x", true));
        assert_eq!(two.count("KeyError: x"), 1);
        assert!(Terms::new("-- ::").is_empty());
        assert!(!Terms::new("-- ::").matches("anything", false));
    }

    #[test]
    fn lines_with_most_terms_come_first_and_long_lines_are_cut_around_the_match() {
        let text = format!(
            "alpha only\n{}needle and thread here{}\nthread only\n",
            "é ".repeat(200),
            " b".repeat(300)
        );
        let lines = Terms::new("needle thread alpha").lines(&text);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0].line, 2);
        assert!(lines[0].text.starts_with('…') && lines[0].text.ends_with('…'));
        assert!(lines[0].text.len() <= MAX_LINE_BYTES + 6);
        assert_eq!(marked(&lines[0]), ["needle", "thread"]);
        // `thread only` adds no word the first line lacks; `alpha only` does.
        assert_eq!((lines[1].line, lines[1].text.as_str()), (1, "alpha only"));
        // Unicode case folds; a phrase split by a line break shows on its
        // first line.
        let lines = Terms::new("ÉTÉ").lines("un été\n");
        assert_eq!(marked(&lines[0]), ["été"]);
        let lines = Terms::new("a.b").lines("x a\nb y");
        assert_eq!((lines[0].line, marked(&lines[0])), (1, vec!["a"]));
    }
}
