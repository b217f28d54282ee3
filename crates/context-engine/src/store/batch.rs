//! [`Batch`]: everything one step writes, applied in one transaction.

use std::collections::HashSet;

use serde::Serialize;
use serde_json::Value;

use super::handle::{
    message_handle, message_hash, parse_archive_notes, result_handles, span_handle_of_hashes,
};
use super::{CompactionRecord, EntryKind, HandleEntry, now_ms};
use crate::message::Message;

/// The writes of one step: archived messages, their handles, compaction
/// records and the state after the step. A backend applies a batch in one
/// transaction.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    messages: Vec<(String, Message)>,
    handles: Vec<HandleEntry>,
    compactions: Vec<CompactionRecord>,
    state: Option<Value>,
    seen: HashSet<String>,
}

/// What the host knows of a compaction besides its input and output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionInfo {
    /// Position among the session's compactions, from 1.
    pub seq: u64,
    /// What set it off.
    pub trigger: String,
    /// The engine.
    pub engine: String,
    /// The summarizer, when the engine says.
    pub summarizer: Option<String>,
    /// Tokens before.
    pub tokens_before: u64,
    /// Tokens after.
    pub tokens_after: u64,
    /// The span the engine reports it summarized: input `start..end`
    /// without the `pinned` message kept verbatim inside it.
    pub span: Option<(usize, usize, Option<usize>)>,
}

impl CompactionInfo {
    /// A compaction numbered `seq`, set off by `trigger`, by `engine`.
    pub fn new(seq: u64, trigger: impl Into<String>, engine: impl Into<String>) -> CompactionInfo {
        CompactionInfo {
            seq,
            trigger: trigger.into(),
            engine: engine.into(),
            ..CompactionInfo::default()
        }
    }

    /// Sets the summarizer.
    pub fn with_summarizer(mut self, summarizer: Option<String>) -> CompactionInfo {
        self.summarizer = summarizer;
        self
    }

    /// Sets the summarized span (see [`span`](Self::span)).
    pub fn with_span(mut self, start: usize, end: usize, pinned: Option<usize>) -> CompactionInfo {
        self.span = Some((start, end, pinned));
        self
    }

    /// Sets the token counts before and after.
    pub fn with_tokens(mut self, before: u64, after: u64) -> CompactionInfo {
        self.tokens_before = before;
        self.tokens_after = after;
        self
    }
}

/// A span a compaction archived: its handle and input indexes (end
/// exclusive), as `ctx compact --report json` lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ArchivedSpan {
    /// The span handle.
    pub handle: String,
    /// First input index.
    pub start: usize,
    /// One past the last.
    pub end: usize,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Whether the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.handles.is_empty()
            && self.compactions.is_empty()
            && self.state.is_none()
    }

    /// Archives `message` verbatim under its `m…` handle and, for a tool
    /// result, the handle its digest or prune line shows. Returns its hash.
    pub fn archive(&mut self, message: &Message) -> String {
        let hash = message_hash(message);
        if self.seen.insert(hash.clone()) {
            let mut handles = vec![message_handle(&hash)];
            handles.extend(result_handles(message));
            for handle in handles {
                self.handles.push(HandleEntry {
                    handle,
                    kind: EntryKind::Message,
                    hashes: vec![hash.clone()],
                    start: None,
                    end: None,
                });
            }
            self.messages.push((hash.clone(), message.clone()));
        }
        hash
    }

    /// Archives `span` (input messages `start..end` of a compaction) and
    /// names it by its span handle, which it returns.
    pub fn archive_span(&mut self, span: &[Message], start: usize, end: usize) -> String {
        let hashes: Vec<String> = span.iter().map(|m| self.archive(m)).collect();
        let handle = span_handle_of_hashes(&hashes);
        self.push_span(&handle, hashes, start, end);
        handle
    }

    fn push_span(&mut self, handle: &str, hashes: Vec<String>, start: usize, end: usize) {
        self.handles.push(HandleEntry {
            handle: handle.to_owned(),
            kind: EntryKind::Span,
            hashes,
            start: Some(start),
            end: Some(end),
        });
    }

    /// Archives the messages of `input` that `output` no longer has (a
    /// prune, or any engine output): returns how many.
    pub fn archive_removed(&mut self, input: &[Message], output: &[Message]) -> usize {
        let kept: HashSet<String> = output.iter().map(message_hash).collect();
        let mut n = 0;
        for m in input {
            if !kept.contains(&message_hash(m)) {
                self.archive(m);
                n += 1;
            }
        }
        n
    }

    /// Records a compaction of `input` into `output`: archives every input
    /// message the output lacks and the messages it added (the summary),
    /// names the span (the one the engine reports in `info`, else the one
    /// the summary names through [`archive_note`](super::archive_note), else
    /// the removed run) and
    /// writes the record. `None` when nothing left the history.
    pub fn compaction(
        &mut self,
        input: &[Message],
        output: &[Message],
        info: &CompactionInfo,
    ) -> Option<ArchivedSpan> {
        let in_hashes: Vec<String> = input.iter().map(message_hash).collect();
        let out_hashes: Vec<String> = output.iter().map(message_hash).collect();
        let in_set: HashSet<&str> = in_hashes.iter().map(String::as_str).collect();
        let out_set: HashSet<&str> = out_hashes.iter().map(String::as_str).collect();
        let removed: Vec<usize> = (0..input.len())
            .filter(|&i| !out_set.contains(in_hashes[i].as_str()))
            .collect();
        let (&first, &last) = (removed.first()?, removed.last()?);
        let added: Vec<usize> = (0..output.len())
            .filter(|&i| !in_set.contains(out_hashes[i].as_str()))
            .collect();
        // The compressor names the span it summarized: all of `s..e`, or
        // without the messages it kept (the pinned ask). A note whose
        // handle fits neither is an older summary's, quoted.
        let named = added
            .iter()
            .flat_map(|&i| parse_archive_notes(&output[i].text()))
            .filter(|(s, e, _)| s < e && *e <= input.len())
            .find_map(|(s, e, h)| {
                let all: Vec<String> = in_hashes[s..e].to_vec();
                let gone: Vec<String> = (s..e)
                    .filter(|&i| !out_set.contains(in_hashes[i].as_str()))
                    .map(|i| in_hashes[i].clone())
                    .collect();
                if span_handle_of_hashes(&all) == h {
                    Some((s, e, h, all))
                } else if span_handle_of_hashes(&gone) == h {
                    Some((s, e, h, gone))
                } else {
                    None
                }
            });
        // The engine's own report of the span wins (the compressor's span
        // handle is computed over exactly these messages).
        let reported = info
            .span
            .filter(|(s, e, _)| s < e && *e <= input.len())
            .map(|(s, e, pinned)| {
                let hashes: Vec<String> = (s..e)
                    .filter(|&i| Some(i) != pinned)
                    .map(|i| in_hashes[i].clone())
                    .collect();
                (s, e, span_handle_of_hashes(&hashes), hashes)
            });
        let (start, end, handle, hashes) = match reported.or(named) {
            Some(span) => span,
            None => {
                let hashes: Vec<String> = removed.iter().map(|&i| in_hashes[i].clone()).collect();
                let h = span_handle_of_hashes(&hashes);
                (first, last + 1, h, hashes)
            }
        };
        for i in start..end {
            if hashes.contains(&in_hashes[i]) {
                self.archive(&input[i]);
            }
        }
        for &i in &removed {
            self.archive(&input[i]);
        }
        let summary: Vec<String> = added.iter().map(|&i| self.archive(&output[i])).collect();
        self.push_span(&handle, hashes, start, end);
        self.compactions.push(CompactionRecord {
            seq: info.seq,
            created_ms: now_ms(),
            trigger: info.trigger.clone(),
            engine: info.engine.clone(),
            summarizer: info.summarizer.clone(),
            handle: handle.clone(),
            start,
            end,
            archived: removed.len(),
            summary,
            tokens_before: info.tokens_before,
            tokens_after: info.tokens_after,
        });
        Some(ArchivedSpan { handle, start, end })
    }

    /// Writes `state` as the session's state snapshot.
    pub fn set_state(&mut self, state: Value) {
        self.state = Some(state);
    }

    /// The archived messages with their hashes, in order.
    pub fn messages(&self) -> &[(String, Message)] {
        &self.messages
    }

    /// The handles to register.
    pub fn handles(&self) -> &[HandleEntry] {
        &self.handles
    }

    /// The compaction records to write.
    pub fn compactions(&self) -> &[CompactionRecord] {
        &self.compactions
    }

    /// The state snapshot to write, if any.
    pub fn state(&self) -> Option<&Value> {
        self.state.as_ref()
    }

    /// The batch as a store keeps it ([`AtRest`](super::AtRest)): each
    /// archived message replaced by `message(hash, message)` under the
    /// same hash, the state by `state(state)`; handles and records as they
    /// are.
    pub(super) fn at_rest<E>(
        &self,
        mut message: impl FnMut(&str, &Message) -> Result<Message, E>,
        state: impl FnOnce(&Value) -> Result<Value, E>,
    ) -> Result<Batch, E> {
        Ok(Batch {
            messages: self
                .messages
                .iter()
                .map(|(h, m)| Ok((h.clone(), message(h, m)?)))
                .collect::<Result<_, E>>()?,
            handles: self.handles.clone(),
            compactions: self.compactions.clone(),
            state: self.state.as_ref().map(state).transpose()?,
            seen: self.seen.clone(),
        })
    }

    /// The batch without its state snapshot (a versioned record written
    /// with it supersedes the snapshot).
    #[doc(hidden)]
    pub fn without_state(&self) -> Batch {
        Batch {
            state: None,
            ..self.clone()
        }
    }
}
