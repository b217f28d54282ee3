//! Is a model's summary worth keeping? A small model under pressure loops
//! ("alpha alpha alpha …" for a page), continues the transcript instead of
//! summarising it, writes only the section headings, or writes more than
//! the turns it replaces. Any of these is worse than the extractive
//! summary, so [`degenerate`] names the defect and the caller falls back.

use super::SummaryRequest;
use crate::tokens::TokenCounter;

/// At least this many words before the repetition test applies: a short
/// summary has too few word triples to judge.
const MIN_WORDS_FOR_LOOP: usize = 24;

/// Below this share of distinct word triples, the text is a loop. Prose
/// and structured summaries score above 0.8; a looping model near 0.
const MIN_DISTINCT_TRIPLES: f64 = 0.35;

/// Fewer letters and digits than this outside headings is no summary.
const MIN_CONTENT_CHARS: usize = 5;

/// Markers that only appear when a model copies its prompt or the
/// engine's own wrapper instead of summarising.
const ECHO_MARKERS: [&str; 12] = [
    "<transcript>",
    "</transcript>",
    "<previous-summary>",
    "</previous-summary>",
    "<memory-context>",
    "<focus-topic>",
    "<recent-user-requests>",
    "[CONTEXT SUMMARY",
    "[END CONTEXT SUMMARY]",
    "[END TOOL RESULTS]",
    "<returncode>",
    "</output>",
];

/// The defect of a model's summary `text` for `request`, or `None` when it
/// is usable. `counter` measures it against the span it replaces.
pub fn degenerate(
    text: &str,
    request: &SummaryRequest<'_>,
    counter: &dyn TokenCounter,
) -> Option<String> {
    if let Some(marker) = ECHO_MARKERS.iter().find(|m| text.contains(**m)) {
        return Some(format!(
            "the summary echoes the transcript's own markup ({marker}) instead of summarising it"
        ));
    }
    let headers = text.lines().filter(|l| is_turn_header(l)).count();
    if headers >= 2 {
        return Some(format!(
            "the summary continues the transcript ({headers} turn headers such as `[1] user:`)"
        ));
    }
    let content: usize = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::chars)
        .filter(|c| c.is_alphanumeric())
        .count();
    if content < MIN_CONTENT_CHARS {
        return Some(format!(
            "the summary has no content beyond its headings ({content} letters or digits)"
        ));
    }
    if let Some(share) = distinct_triples(text)
        && share < MIN_DISTINCT_TRIPLES
    {
        return Some(format!(
            "the summary repeats itself ({:.0}% of its word triples are distinct)",
            share * 100.0
        ));
    }
    let summary = counter.count_text(text);
    let span = request
        .turns
        .iter()
        .map(|m| counter.count_message(m))
        .sum::<usize>()
        + request
            .previous_summary
            .map_or(0, |p| counter.count_text(p));
    if summary > span {
        return Some(format!(
            "the summary ({summary} tokens) is longer than the {span} tokens it replaces"
        ));
    }
    None
}

/// `[12] assistant:`-style lines: the prompt's rendering of a turn.
fn is_turn_header(line: &str) -> bool {
    let Some(rest) = line.trim_start().strip_prefix('[') else {
        return false;
    };
    let Some((number, after)) = rest.split_once(']') else {
        return false;
    };
    !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
        && ["user", "assistant", "tool", "system"]
            .iter()
            .any(|role| after.trim_start().starts_with(role))
}

/// Share of distinct consecutive word triples, `None` for short texts.
fn distinct_triples(text: &str) -> Option<f64> {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    if words.len() < MIN_WORDS_FOR_LOOP {
        return None;
    }
    let triples: Vec<&[String]> = words.windows(3).collect();
    let mut distinct = triples.clone();
    distinct.sort_unstable();
    distinct.dedup();
    Some(distinct.len() as f64 / triples.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::tokens::{CountOptions, EstimateCounter};

    fn check(text: &str) -> Option<String> {
        let turns = vec![
            Message::user("Fix the failing parser test in src/parser.rs. ".repeat(20)),
            Message::assistant(
                "I ran cargo test and saw the failure in parse_generics. ".repeat(20),
            ),
        ];
        let counter = EstimateCounter::new(CountOptions::default());
        degenerate(text, &SummaryRequest::new(&turns, 200), &counter)
    }

    const GOOD: &str = "## Primary request and intent\nFix the failing parser test in \
        src/parser.rs.\n\n## Progress\n- Ran `cargo test`: parse_generics fails on nested \
        generics in trait bounds.\n- Next: handle `>>` tokens in the bound parser.";

    #[test]
    fn a_real_summary_passes() {
        assert_eq!(check(GOOD), None);
    }

    #[test]
    fn each_defect_is_named() {
        let looped = "alpha ".repeat(200);
        assert!(check(&looped).unwrap().contains("repeats itself"));
        let lines = "- Ran the tests.\n".repeat(40);
        assert!(check(&lines).unwrap().contains("repeats itself"));
        let echo = format!("{GOOD}\n<transcript>\n[1] user:\nfix it");
        assert!(check(&echo).unwrap().contains("echoes"));
        let continued = "[3] assistant:\nLet me look.\n\n[4] tool for call c1:\nok";
        assert!(
            check(continued)
                .unwrap()
                .contains("continues the transcript")
        );
        let empty = "## Primary request and intent\n\n## Progress\n-\n## Next steps\n";
        assert!(check(empty).unwrap().contains("no content"));
        let long: String = (0..300)
            .map(|i| format!("Step {i} touched file_{i}.rs and passed. "))
            .collect();
        assert!(check(&long).unwrap().contains("longer than"));
    }
}
