//! The summary under the ladder: how much of it a request or a history
//! keeps (step 4, [`FitStepKind::LowerSummary`](super::FitStepKind)), the
//! forms it is cut down to, and whether a fit kept its state record.

use super::{SUMMARY_END, SUMMARY_PREFIX, Work, clip_middle, is_summary, with_text};
use crate::message::Message;
use crate::summarize::state::{Collapsed, STATE_RECORD_HEADING, StateRecord};

/// Whether every state record that a summary of `before` carries is in
/// `after` whole (the ladder cut only narratives, if anything, of the
/// summaries): what a fit that keeps every fact of the ledger must give.
pub fn ledger_kept(before: &[Message], after: &[Message]) -> bool {
    let ledger = |text: &str| -> Option<String> {
        let body = crate::summary_text::summary_body(text)?;
        let at = body.find(STATE_RECORD_HEADING)?;
        Some(body[at..].trim().to_owned())
    };
    before.iter().filter(|m| is_summary(m)).all(|m| {
        let Some(record) = ledger(&m.text()) else {
            return true;
        };
        after.iter().any(|a| a.text().contains(record.as_str()))
    })
}

/// What a summary says when the window left no room for its narrative.
pub const NARRATIVE_CUT: &str =
    "[The summary's narrative was cut to fit the window; the state record below is whole.]";

impl Work<'_> {
    /// Step 4: the summary's body is cut to what the budget leaves it.
    pub(super) fn lower_summary(&mut self, budget: u64) -> usize {
        let Some(s) = self.summary().filter(|&s| !self.dropped[s]) else {
            return 0;
        };
        let original = self.messages[s].clone();
        let text = original.text();
        let Some(start) = text.find(SUMMARY_PREFIX).map(|p| p + SUMMARY_PREFIX.len()) else {
            return 0;
        };
        let end = text[start..]
            .find(SUMMARY_END)
            .map_or(text.len(), |e| start + e);
        let body = &text[start..end];
        // What must stay of it: the note naming the span it replaced (the
        // way back to everything it summarized) and the user's asks of its
        // state record; then the note alone.
        let found = crate::store::find_archive_note(body);
        let note = found.as_ref().map(|n| n.text.to_owned());
        let rest = match &note {
            Some(n) => body.replacen(n.as_str(), "", 1),
            None => body.to_owned(),
        };
        // The ledger (the state record) holds the session's facts: the
        // narrative goes first, then the ledger is rendered again in less
        // room, its oldest entries collapsing into counts that name the
        // span's handle.
        if let Some(at) = rest.find(STATE_RECORD_HEADING) {
            let (narrative, ledger) = (rest[..at].trim(), rest[at..].trim());
            let head = note.clone().map(|n| n + "\n\n").unwrap_or_default();
            if self.halve_until_fits(s, &original, budget, narrative.len(), |keep| {
                let cut = clip_middle(narrative, keep / 2, None);
                // What was cut is said: all of the narrative, when none
                // of it fits.
                let cut = match (cut.trim().is_empty(), narrative.is_empty()) {
                    (true, true) => String::new(),
                    (true, false) => format!("{NARRATIVE_CUT}\n\n"),
                    (false, _) => format!("{}\n\n", cut.trim()),
                };
                format!("{}{head}{cut}{ledger}{}", &text[..start], &text[end..])
            }) {
                return 1;
            }
            // A stored history keeps its ledger whole: the facts of every
            // earlier compaction live there and nowhere else in the
            // conversation; a request view may cut it (its host says so).
            if self.history {
                return 1;
            }
            if let Some(record) = StateRecord::parse(ledger) {
                let collapsed = found.as_ref().map_or(Collapsed::NotListed, |n| {
                    Collapsed::archived(&n.handle, n.channel())
                });
                let mut room = ledger.len() / 2;
                while room >= STATE_RECORD_HEADING.len() + 64 {
                    let lower = record.render(room, collapsed);
                    let new = format!("{}{head}{lower}{}", &text[..start], &text[end..]);
                    self.set(s, with_text(&original, new));
                    if self.total() <= budget {
                        return 1;
                    }
                    room /= 2;
                }
            }
        }
        let asks = asks_section(body);
        let full = [note.as_deref(), asks]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("\n\n");
        let essentials = [full, note.clone().unwrap_or_default(), String::new()];
        // Halve the rest until the request fits or nothing is left of it.
        for essential in &essentials {
            if self.halve_until_fits(s, &original, budget, rest.len(), |keep| {
                let cut = clip_middle(rest.trim(), keep / 2, None);
                let cut = match (essential.is_empty(), cut.trim().is_empty()) {
                    (true, _) => cut,
                    (false, true) => essential.clone(),
                    (false, false) => format!("{essential}\n\n{cut}"),
                };
                format!("{}{}{}", &text[..start], cut, &text[end..])
            }) {
                return 1;
            }
        }
        1
    }

    /// Sets message `s` to `original` with the text `text(keep)` gives,
    /// `keep` halving from `len / 2` down to 0, until the request fits
    /// `budget`; whether it did.
    fn halve_until_fits(
        &mut self,
        s: usize,
        original: &Message,
        budget: u64,
        len: usize,
        text: impl Fn(usize) -> String,
    ) -> bool {
        let mut keep = len / 2;
        loop {
            self.set(s, with_text(original, text(keep)));
            if self.total() <= budget {
                return true;
            }
            if keep == 0 {
                return false;
            }
            keep /= 2;
        }
    }
}

/// A summary message cut down to its opening, the note naming the span it
/// replaced and its closing; `None` when it has no note or is no longer.
pub(super) fn summary_note_only(message: &Message) -> Option<Message> {
    let text = message.text();
    let (start, end) = body_range(&text)?;
    let note = crate::store::find_archive_note(&text[start..end])?.text;
    let new = format!("{}\n{note}\n{}", &text[..start], &text[end..]);
    (new.len() < text.len()).then(|| with_text(message, new))
}

/// A summary message cut down to its opening, the note naming the span it
/// replaced, its state record and its closing (the holder's own words
/// after it stay); `None` when it has no state record or is no longer.
pub(super) fn summary_ledger_only(message: &Message) -> Option<Message> {
    let text = message.text();
    let (start, end) = body_range(&text)?;
    let body = &text[start..end];
    let ledger = body[body.find(STATE_RECORD_HEADING)?..].trim();
    let note = crate::store::find_archive_note(body)
        .map(|n| format!("{}\n\n", n.text))
        .unwrap_or_default();
    let new = format!("{}\n{note}{ledger}\n{}", &text[..start], &text[end..]);
    (new.len() < text.len()).then(|| with_text(message, new))
}

/// Where the body of the summary in `text` starts and ends (after its
/// prefix, before its end marker or the text's end).
fn body_range(text: &str) -> Option<(usize, usize)> {
    let start = text.find(SUMMARY_PREFIX)? + SUMMARY_PREFIX.len();
    let end = text[start..]
        .find(SUMMARY_END)
        .map_or(text.len(), |e| start + e);
    Some((start, end))
}

/// The `### User asks` section of the state record in a summary body.
fn asks_section(body: &str) -> Option<&str> {
    const HEADING: &str = "### User asks";
    let at = body.find(HEADING)?;
    let after = at + HEADING.len();
    let end = body[after..]
        .find("\n### ")
        .map_or(body.len(), |e| after + e);
    Some(body[at..end].trim_end())
}
