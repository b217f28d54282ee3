//! Invisible characters inside tokens: a secret split by a zero-width space or
//! a control character must still be caught, so the scanner also looks at a
//! copy without them and maps what it finds back to the original text.

/// Zero-width and formatting characters that render as nothing.
fn is_invisible_char(c: char) -> bool {
    matches!(
        c,
        '\u{200B}'..='\u{200F}'
            | '\u{2060}'..='\u{2064}'
            | '\u{FEFF}'
            | '\u{00AD}'
            | '\u{180E}'
            | '\u{034F}'
    ) || (c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
}

/// Cheap byte-level test: can `text` contain an invisible character at all?
/// (Most texts cannot, and then no copy is made.)
pub(crate) fn may_contain_invisible(text: &str) -> bool {
    let bytes = text.as_bytes();
    // ASCII controls other than tab and line ends: a branch-free pass per
    // chunk, which the compiler vectorizes.
    let control = bytes.chunks(256).any(|chunk| {
        chunk.iter().fold(false, |acc, &b| {
            acc | (b < 0x20 && b != b'\t' && b != b'\n' && b != b'\r') | (b == 0x7F)
        })
    });
    if control {
        return true;
    }
    // The other invisible characters start with one of five lead bytes
    // (never continuation bytes, so always char boundaries): decode only
    // there, not every typographic quote or dash of the text.
    memchr::memchr3_iter(0xC2, 0xE2, 0xEF, bytes)
        .chain(memchr::memchr2_iter(0xCD, 0xE1, bytes))
        .any(|i| {
            text.get(i..)
                .and_then(|rest| rest.chars().next())
                .is_some_and(is_invisible_char)
        })
}

/// `text` without invisible characters, and for each byte of it the offset of
/// the same byte in `text`.
pub(crate) struct Stripped {
    pub(crate) text: String,
    pub(crate) origin: Vec<usize>,
}

pub(crate) fn strip(text: &str) -> Stripped {
    let mut out = String::with_capacity(text.len());
    let mut origin = Vec::with_capacity(text.len());
    for (i, c) in text.char_indices() {
        if is_invisible_char(c) {
            continue;
        }
        out.push(c);
        origin.extend(i..i + c.len_utf8());
    }
    Stripped { text: out, origin }
}

impl Stripped {
    /// The original byte range of the stripped range `start..end` (non-empty).
    pub(crate) fn original_range(&self, start: usize, end: usize) -> (usize, usize) {
        let s = self.origin.get(start).copied().unwrap_or(0);
        let e = self
            .origin
            .get(end.saturating_sub(1))
            .map_or(s, |&last| last + 1);
        (s, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_and_maps_back() {
        let text = "a ghp_\u{200B}xyz\u{7} b";
        assert!(may_contain_invisible(text));
        let s = strip(text);
        assert_eq!(s.text, "a ghp_xyz b");
        let (a, b) = s.original_range(2, 9);
        assert_eq!(&text[a..b], "ghp_\u{200B}xyz");
        assert!(!may_contain_invisible("plain — text’s fine\n\t"));
        // Found after typographic characters, and the C1 controls and
        // other lead bytes too.
        assert!(may_contain_invisible("a — b ’ c\u{200B}d"));
        assert!(may_contain_invisible("x\u{85}y"));
        assert!(may_contain_invisible("x\u{034F}y"));
        assert!(may_contain_invisible("x\u{180E}y"));
        assert!(may_contain_invisible("x\u{FEFF}y"));
        assert!(may_contain_invisible("x\u{7F}y"));
        assert!(!may_contain_invisible("é ü ß — … “quoted”"));
    }
}
