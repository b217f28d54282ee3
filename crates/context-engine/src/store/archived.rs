//! A compaction as a person looks at it: its record with the messages it
//! replaced and the summary it added, read back from the store (what the
//! replay's HTML report and `ctx serve`'s page show). Reads only.

use std::ops::RangeInclusive;

use serde::Serialize;

use super::{SessionStore, StoreError, message_handle};
use crate::message::Message;

/// One compaction pass, read back from the store.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ArchivedCompaction {
    /// Position among the session's compactions, from 1.
    pub seq: u64,
    /// What set it off (`preflight`, `post_tool`, `manual`, `agent`, `cli`).
    pub trigger: String,
    /// The summarizer whose text went in, when the engine says.
    pub summarizer: Option<String>,
    /// The handle of the span it replaced (what `context_expand` takes).
    pub handle: String,
    /// The span's input indexes `start..end` (of this pass's input).
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// Tokens before, as the host counted them.
    pub tokens_before: u64,
    /// Tokens after.
    pub tokens_after: u64,
    /// The messages it added (the summary), as the store keeps them.
    pub summary: Vec<Message>,
    /// The messages it replaced, in order, as the store keeps them
    /// (redacted or sealed as the store's at-rest rule says).
    pub replaced: Vec<Message>,
}

/// The compactions of `session` numbered in `seqs` (all: `1..=u64::MAX`),
/// in order, each with its summary and the messages it replaced. A handle
/// the store no longer resolves gives an empty list, not an error.
pub fn archived_compactions(
    store: &dyn SessionStore,
    session: &str,
    seqs: RangeInclusive<u64>,
) -> Result<Vec<ArchivedCompaction>, StoreError> {
    let mut records = store.compactions(session)?;
    records.retain(|r| seqs.contains(&r.seq));
    records.sort_by_key(|r| r.seq);
    let resolve = |handle: &str| -> Result<Vec<Message>, StoreError> {
        Ok(store
            .resolve(Some(session), handle)?
            .map(|e| e.messages)
            .unwrap_or_default())
    };
    records
        .into_iter()
        .map(|r| {
            let mut summary = Vec::with_capacity(r.summary.len());
            for hash in &r.summary {
                summary.extend(resolve(&message_handle(hash))?);
            }
            Ok(ArchivedCompaction {
                replaced: resolve(&r.handle)?,
                summary,
                seq: r.seq,
                trigger: r.trigger,
                summarizer: r.summarizer,
                handle: r.handle,
                start: r.start,
                end: r.end,
                tokens_before: r.tokens_before,
                tokens_after: r.tokens_after,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Batch, CompactionInfo, MemoryStore};

    #[test]
    fn a_compaction_reads_back_with_its_summary_and_the_messages_it_replaced() {
        let store = MemoryStore::new();
        let input = vec![
            Message::system("sys"),
            Message::user("fix the parser"),
            Message::assistant("reading src/parse.rs"),
            Message::user("and the tests"),
        ];
        let output = vec![
            Message::system("sys"),
            Message::user("[CONTEXT SUMMARY] the parser was read"),
            Message::user("and the tests"),
        ];
        let mut batch = Batch::new();
        let info = CompactionInfo::new(1, "preflight", "compressor").with_span(1, 3, None);
        batch.compaction(&input, &output, &info);
        store.commit("s", &batch).unwrap();

        let all = archived_compactions(&store, "s", 1..=u64::MAX).unwrap();
        assert_eq!(all.len(), 1);
        let c = &all[0];
        assert_eq!((c.seq, c.start, c.end), (1, 1, 3));
        assert_eq!(c.replaced, input[1..3].to_vec());
        assert_eq!(c.summary, vec![output[1].clone()]);
        // Another range, or another session, reads nothing.
        assert!(archived_compactions(&store, "s", 2..=5).unwrap().is_empty());
        assert!(
            archived_compactions(&store, "other", 1..=u64::MAX)
                .unwrap()
                .is_empty()
        );
    }
}
