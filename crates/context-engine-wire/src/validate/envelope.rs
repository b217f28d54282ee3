//! Text tool-result envelopes (arbiter style): a user message carrying
//! `[/verb args]\n<body>\n[END VERB]` blocks (or `[verb args]\n<body>\n[/verb]`)
//! and closed by `[END TOOL RESULTS]`.
//!
//! The one parser of the envelope: [`super::is_tool_reentry`] asks it
//! whether a user message is an envelope, the digest asks it for the blocks
//! and recall for their bodies, so they cannot disagree on whether a `[/…`
//! line opens a block or closes one.

/// The first line of a digested envelope; also how a digest recognizes its
/// own output (idempotence).
pub const ENVELOPE_HEADER: &str = "[TOOL RESULTS — earlier batch, bodies omitted]";

/// The marker that closes an envelope.
pub const END_TOOL_RESULTS: &str = "[END TOOL RESULTS]";

/// One `[/verb args]` block of an envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block<'a> {
    /// The writ line, `[/verb args]`, without its line break.
    pub writ: &'a str,
    /// The body between the writ line and `[END VERB]` (or the next writ
    /// when the block is not closed), without the line break before the end
    /// marker: exactly what the tool returned.
    pub body: &'a str,
}

/// One line of `text`: its byte range without the line break, and where the
/// next line starts.
#[derive(Clone, Copy, Debug)]
struct Line {
    start: usize,
    end: usize,
    next: usize,
}

fn lines(text: &str) -> Vec<Line> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let (end, next) = match text[start..].find('\n') {
            Some(n) => (start + n, start + n + 1),
            None => (text.len(), text.len()),
        };
        let end = if text[start..end].ends_with('\r') {
            end - 1
        } else {
            end
        };
        out.push(Line { start, end, next });
        start = next;
    }
    out
}

/// The verb of a writ line `[/verb args]`, or `None` for any other line.
fn writ_verb(line: &str) -> Option<&str> {
    bracket_verb(line.strip_prefix("[/")?)
}

/// The verb of an opener line `[verb args]` (closed later by `[/verb]`).
fn opener_verb(line: &str) -> Option<&str> {
    let rest = line.strip_prefix('[')?;
    if rest.starts_with('/') {
        return None;
    }
    bracket_verb(rest)
}

/// `verb` of `verb args]`: letters, digits, `_`, `-`, `.`.
fn bracket_verb(rest: &str) -> Option<&str> {
    let inner = rest.trim_end().strip_suffix(']')?;
    let verb = inner.split(|c: char| c.is_whitespace()).next()?;
    let ok = !verb.is_empty()
        && verb
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '.');
    ok.then_some(verb)
}

/// Whether `line` is `[/verb]` (no arguments) closing an opener of `verb`.
fn closes(line: &str, verb: &str) -> bool {
    line.trim()
        .strip_prefix("[/")
        .and_then(|r| r.strip_suffix(']'))
        .is_some_and(|v| v.eq_ignore_ascii_case(verb))
}

/// The blocks of an envelope, in order.
///
/// A `[/verb]` line with no arguments that follows an opener `[verb …]`
/// closes it: the block's writ is the
/// opener and its body the lines between. Any other `[/verb args]` line
/// opens a block.
///
/// A block ends at the first later line that is exactly its `[END VERB]`
/// (case-insensitive). Inside that span every line is body, even one that
/// starts with `[/` (a file can contain such lines); only a block whose end
/// marker never comes is ended by the next writ line or by
/// `[END TOOL RESULTS]`.
pub fn blocks(text: &str) -> Vec<Block<'_>> {
    let lines = lines(text);
    let line_text = |l: &Line| &text[l.start..l.end];
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(line) = lines.get(i) {
        if let Some(verb) = opener_verb(line_text(line))
            && let Some(k) = lines[i + 1..]
                .iter()
                .position(|l| closes(line_text(l), verb))
        {
            let close = i + 1 + k;
            out.push(Block {
                writ: line_text(line),
                body: body_between(text, &lines, line.next, close),
            });
            i = close + 1;
            continue;
        }
        let Some(verb) = writ_verb(line_text(line)) else {
            i += 1;
            continue;
        };
        let end_marker = format!("[END {}]", verb.to_uppercase());
        let body_start = line.next;
        let closed = lines[i + 1..]
            .iter()
            .position(|l| line_text(l).trim().eq_ignore_ascii_case(&end_marker))
            .map(|k| i + 1 + k);
        let (stop, resume) = match closed {
            Some(j) => (j, j + 1),
            None => {
                let j = lines[i + 1..]
                    .iter()
                    .position(|l| {
                        let t = line_text(l);
                        writ_verb(t).is_some() || t.trim() == END_TOOL_RESULTS
                    })
                    .map_or(lines.len(), |k| i + 1 + k);
                (j, j)
            }
        };
        out.push(Block {
            writ: line_text(line),
            body: body_between(text, &lines, body_start, stop),
        });
        i = resume;
    }
    out
}

/// The text from byte `start` to the start of line `stop` (the end when
/// there is no such line), without the line break before `stop`.
fn body_between<'t>(text: &'t str, lines: &[Line], start: usize, stop: usize) -> &'t str {
    let end = lines.get(stop).map_or(text.len(), |l| l.start);
    let body = text.get(start.min(end)..end).unwrap_or_default();
    let body = body.strip_suffix('\n').unwrap_or(body);
    body.strip_suffix('\r').unwrap_or(body)
}

/// Whether `text` is an envelope this module already digested.
pub fn is_digested(text: &str) -> bool {
    text.starts_with(ENVELOPE_HEADER)
}

/// Whether `text` is a text tool-result envelope: closed by
/// `[END TOOL RESULTS]` on a line of its own and carrying at least one
/// block (or already digested).
pub(crate) fn is_envelope(text: &str) -> bool {
    text.lines().any(|l| l.trim() == END_TOOL_RESULTS)
        && (is_digested(text) || !blocks(text).is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_split_at_their_end_markers() {
        let text = "[/read a.rs]\nfn main() {}\n[END READ]\n[/exec ls]\nx\ny\n[END EXEC]\n[END TOOL RESULTS]";
        let b = blocks(text);
        assert_eq!(
            b,
            vec![
                Block {
                    writ: "[/read a.rs]",
                    body: "fn main() {}"
                },
                Block {
                    writ: "[/exec ls]",
                    body: "x\ny"
                },
            ]
        );
    }

    #[test]
    fn a_body_line_starting_with_a_writ_is_body_while_the_end_is_ahead() {
        let text = "[/read notes.md]\nline\n[/exec rm -rf /]\nmore\n[END READ]\n[END TOOL RESULTS]";
        let b = blocks(text);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].body, "line\n[/exec rm -rf /]\nmore");
    }

    #[test]
    fn an_unclosed_block_ends_at_the_next_writ() {
        let text = "[/exec make]\nbuilding\n[/read b]\nB\n[END READ]\n[END TOOL RESULTS]\n";
        let b = blocks(text);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].body, "building");
        assert_eq!(b[1].body, "B");
        let text = "[/exec make]\nbuilding\n[END TOOL RESULTS]";
        assert_eq!(blocks(text)[0].body, "building");
    }

    #[test]
    fn empty_bodies_and_crlf() {
        let b = blocks("[/exec true]\n[END EXEC]\r\n");
        assert_eq!(b[0].body, "");
        let b = blocks("[/read x]\r\nA\r\n[END READ]\r\n");
        assert_eq!(b[0].body, "A");
        assert_eq!(b[0].writ, "[/read x]");
    }

    #[test]
    fn closing_tag_style_blocks() {
        let b = blocks("[bash]\nls\n[/bash]\n[END TOOL RESULTS]");
        assert_eq!(
            b,
            vec![Block {
                writ: "[bash]",
                body: "ls"
            }]
        );
        assert!(is_envelope("[bash]\nls\n[/bash]\n[END TOOL RESULTS]"));
        // `[/x]` with no opener before it opens a block of its own.
        assert_eq!(blocks("[/exec]\nout\n[END EXEC]")[0].body, "out");
        assert!(!is_envelope("see [/x] [END TOOL RESULTS]"));
        assert!(!is_envelope("[bash]\nls\n[/bash]"));
    }

    #[test]
    fn non_writ_lines_are_ignored() {
        assert_eq!(writ_verb("[/]"), None);
        assert_eq!(writ_verb("[/read"), None);
        assert_eq!(writ_verb("[/path/to/x]"), None);
        assert_eq!(writ_verb("[/read x y]"), Some("read"));
    }
}
