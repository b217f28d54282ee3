//! The marks that open and close a compaction summary in a message's text.
//!
//! The engine writes summaries (`context_engine::summary_text`); this crate
//! knows only their marks, so that reading a message (which fenced block
//! is an agent's action, see `validate::observation`) never takes the
//! engine's summary for the agent's own words.

use std::borrow::Cow;

/// Opens every summary: marks it as reference material, not a new request.
pub const SUMMARY_PREFIX: &str = "[CONTEXT SUMMARY: reference only] Earlier turns of this \
conversation were compacted into the summary below. It is background, not a new request; \
where it disagrees with the messages after it, those messages win.";

/// Closes every summary.
pub const SUMMARY_END: &str = "[END CONTEXT SUMMARY]";

/// `text` without the summaries it carries (each from its prefix to its
/// end mark, or to the text's end when the mark is missing); borrowed when
/// it carries none.
pub fn outside_summaries(text: &str) -> Cow<'_, str> {
    if !text.contains(SUMMARY_PREFIX) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(SUMMARY_PREFIX) {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        rest = after
            .find(SUMMARY_END)
            .map_or("", |e| &after[e + SUMMARY_END.len()..]);
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_left_out_and_the_rest_kept() {
        let s = format!("{SUMMARY_PREFIX}\n```\nsubmit\n```\n{SUMMARY_END}");
        assert_eq!(outside_summaries(&format!("a {s} b {s} c")), "a  b  c");
        assert_eq!(
            outside_summaries(&format!("own {SUMMARY_PREFIX} cut")),
            "own "
        );
        assert!(matches!(outside_summaries("plain"), Cow::Borrowed("plain")));
    }
}
