//! The scan: keyword prefilter, regexes on small windows around keyword hits,
//! candidate checks, and merging of overlapping candidates into replacements.

use regex_automata::Input;

use super::rules::Rule;
use super::{RedactOptions, Redactor, filters, mask};

/// One stretch of the scanned text to replace.
#[derive(Debug)]
pub(crate) struct Replacement {
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// Index of the (first) rule that matched.
    pub(crate) rule: usize,
    pub(crate) with: String,
}

#[derive(Debug, Clone, Copy)]
struct Candidate {
    start: usize,
    end: usize,
    rule: usize,
    /// The match is one of our own masks: nothing overlapping it is masked
    /// again (keeps redaction idempotent).
    masked: bool,
}

fn active(rule: &Rule, opts: &RedactOptions) -> bool {
    !(rule.generic && opts.code_file) && (!rule.url_credentials || opts.url_credentials)
}

/// Every replacement in `text`, sorted and non-overlapping.
pub(crate) fn find(r: &Redactor, text: &str, opts: &RedactOptions) -> Vec<Replacement> {
    let hay = text.as_bytes();

    // 1. Keyword hits, bucketed per rule. The keyword pass reports hits by
    // end position, so each bucket is nearly sorted already (a cheap sort,
    // unlike one sort of every hit of every rule).
    let mut hits: Vec<Vec<(usize, usize)>> = vec![Vec::new(); r.rules.len()];
    for m in r.prefilter.find_overlapping_iter(hay) {
        for &ri in &r.keyword_rules[m.pattern().as_usize()] {
            hits[ri].push((m.start(), m.end()));
        }
    }

    // 2. Windows around hits (merged per rule), then the rule's regex.
    let mut candidates = Vec::new();
    for (ri, rule_hits) in hits.iter_mut().enumerate() {
        let rule = &r.rules[ri];
        if rule_hits.is_empty() || !active(rule, opts) {
            continue;
        }
        if !rule_hits.is_sorted() {
            rule_hits.sort_unstable();
        }
        let mut window: Option<(usize, usize)> = None;
        for &(start, end) in rule_hits.iter() {
            let (lo, hi) = window_of(hay, rule, start, end);
            window = match window {
                Some((wlo, whi)) if lo <= whi => Some((wlo, whi.max(hi))),
                Some(w) => {
                    run_rule(r, ri, text, w, &mut candidates);
                    Some((lo, hi))
                }
                None => Some((lo, hi)),
            };
        }
        if let Some(w) = window {
            run_rule(r, ri, text, w, &mut candidates);
        }
    }
    for &ri in &r.unfiltered {
        if active(&r.rules[ri], opts) {
            run_rule(r, ri, text, (0, hay.len()), &mut candidates);
        }
    }

    merge(r, text, candidates)
}

/// The bytes a rule's regex may need around a keyword at `start..end`:
/// its longest possible match on each side, cut at line ends for single-line
/// rules.
fn window_of(hay: &[u8], rule: &Rule, start: usize, end: usize) -> (usize, usize) {
    let mut lo = start.saturating_sub(rule.reach);
    let mut hi = end.saturating_add(rule.reach).min(hay.len());
    if !rule.multiline {
        if let Some(nl) = memchr::memrchr(b'\n', &hay[lo..start]) {
            lo += nl + 1;
        }
        if let Some(nl) = memchr::memchr(b'\n', &hay[end..hi]) {
            hi = end + nl + 1;
        }
    }
    (lo, hi)
}

fn run_rule(
    r: &Redactor,
    ri: usize,
    text: &str,
    (lo, hi): (usize, usize),
    out: &mut Vec<Candidate>,
) {
    let rule = &r.rules[ri];
    let hay = text.as_bytes();
    let mut caps = rule.regex.create_captures();
    let mut at = lo;
    while at < hi {
        let input = Input::new(hay).range(at..hi);
        rule.regex.search_captures(&input, &mut caps);
        let Some(whole) = caps.get_match() else {
            break;
        };
        let span = match rule.secret_group {
            Some(g) => caps.get_group(g),
            None => (1..caps.group_len())
                .find_map(|g| caps.get_group(g))
                .or(Some(whole.span())),
        };
        // After a rejected match, look again from its next byte: a shorter
        // match inside it may be a secret (a rejected quoted value can hide
        // a `token=...` inside it).
        let mut next = whole.start() + 1;
        if let Some(span) = span {
            let (start, end) = char_bounds(text, span.start, span.end);
            // A fixed replacement (PEM block) never looks like a mask.
            let state = if start < end && rule.replace.is_none() {
                filters::masked_state(hay, start, end)
            } else {
                filters::Masked::No
            };
            let masked = state == filters::Masked::Mask;
            if start < end
                && state != filters::Masked::Touches
                && (masked || keep(r, rule, hay, start, end))
            {
                out.push(Candidate {
                    start,
                    end,
                    rule: ri,
                    masked,
                });
                next = whole.end().max(whole.start() + 1);
            }
        }
        at = next;
    }
}

/// Widen a byte range to char boundaries (byte regexes may cut a char).
fn char_bounds(text: &str, mut start: usize, mut end: usize) -> (usize, usize) {
    while start > 0 && !text.is_char_boundary(start) {
        start -= 1;
    }
    while end < text.len() && !text.is_char_boundary(end) {
        end += 1;
    }
    (start, end)
}

fn keep(r: &Redactor, rule: &Rule, hay: &[u8], start: usize, end: usize) -> bool {
    let secret = &hay[start..end];
    if let Some(min) = rule.entropy
        && filters::entropy(secret) < min
    {
        return false;
    }
    if let Some(f) = rule.filter
        && !filters::passes(f, hay, start, end)
    {
        return false;
    }
    !r.allow.iter().any(|a| a.is_match(secret))
}

/// Overlapping candidates become one replacement covering their union; a
/// fixed replacement (PEM blocks) wins over a mask.
fn merge(r: &Redactor, text: &str, cands: Vec<Candidate>) -> Vec<Replacement> {
    let (zones, mut cands): (Vec<Candidate>, Vec<Candidate>) =
        cands.into_iter().partition(|c| c.masked);
    if !zones.is_empty() {
        cands.retain(|c| !zones.iter().any(|z| c.start < z.end && z.start < c.end));
    }
    cands.sort_unstable_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    let mut groups: Vec<(usize, usize, usize, Option<usize>)> = Vec::new();
    for c in cands {
        let fixed = r.rules[c.rule].replace.as_ref().map(|_| c.rule);
        match groups.last_mut() {
            Some(g) if c.start < g.1 => {
                g.1 = g.1.max(c.end);
                if g.3.is_none() {
                    g.3 = fixed;
                }
            }
            _ => groups.push((c.start, c.end, c.rule, fixed)),
        }
    }
    groups
        .into_iter()
        .map(|(start, end, rule, fixed)| {
            let with = match fixed.and_then(|f| r.rules[f].replace.clone()) {
                Some(w) => w,
                None => mask(&text[start..end]),
            };
            Replacement {
                start,
                end,
                rule: fixed.unwrap_or(rule),
                with,
            }
        })
        .collect()
}
