//! A batch as the columns of the array inserts (see [`crate::sql`]).

use context_engine::store::Batch;
use context_engine::store::backend::index_text;
use context_engine::store::handle::message_json;

use crate::fts::tsv_text;

/// What one or more batches write, as the columns of the array
/// statements above: messages once per hash and handles once per name
/// (the first wins, as in the store), in batch order.
#[derive(Default)]
pub(crate) struct Rows {
    pub(crate) hashes: Vec<String>,
    pub(crate) roles: Vec<String>,
    pub(crate) jsons: Vec<String>,
    pub(crate) bodies: Vec<String>,
    pub(crate) words: Vec<String>,
    pub(crate) handles: Vec<String>,
    pub(crate) kinds: Vec<String>,
    pub(crate) starts: Vec<Option<i64>>,
    pub(crate) ends: Vec<Option<i64>>,
    pub(crate) member_handles: Vec<String>,
    pub(crate) member_pos: Vec<i32>,
    pub(crate) member_hashes: Vec<String>,
    pub(crate) seqs: Vec<i64>,
    pub(crate) created: Vec<i64>,
    pub(crate) triggers: Vec<String>,
    pub(crate) engines: Vec<String>,
    pub(crate) summarizers: Vec<Option<String>>,
    pub(crate) spans: Vec<String>,
    pub(crate) span_starts: Vec<i64>,
    pub(crate) span_ends: Vec<i64>,
    pub(crate) archived: Vec<i64>,
    pub(crate) summaries: Vec<String>,
    pub(crate) tokens_before: Vec<i64>,
    pub(crate) tokens_after: Vec<i64>,
}

impl Rows {
    pub(crate) fn of(batches: &[Batch]) -> Rows {
        let mut rows = Rows::default();
        let mut seen = std::collections::HashSet::new();
        let mut named = std::collections::HashSet::new();
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let u = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for batch in batches {
            for (hash, message) in batch.messages() {
                if !seen.insert(hash.as_str()) {
                    continue;
                }
                let body = index_text(message);
                rows.words.push(tsv_text(&body));
                rows.bodies.push(body);
                rows.hashes.push(hash.clone());
                rows.roles.push(message.role.as_str().to_owned());
                rows.jsons.push(message_json(message));
            }
            for h in batch.handles() {
                if !named.insert(h.handle.as_str()) {
                    continue;
                }
                rows.handles.push(h.handle.clone());
                rows.kinds.push(h.kind.name().to_owned());
                rows.starts.push(h.start.map(n));
                rows.ends.push(h.end.map(n));
                for (pos, hash) in h.hashes.iter().enumerate() {
                    rows.member_handles.push(h.handle.clone());
                    rows.member_pos.push(i32::try_from(pos).unwrap_or(i32::MAX));
                    rows.member_hashes.push(hash.clone());
                }
            }
            for c in batch.compactions() {
                rows.seqs.push(u(c.seq));
                rows.created.push(u(c.created_ms));
                rows.triggers.push(c.trigger.clone());
                rows.engines.push(c.engine.clone());
                rows.summarizers.push(c.summarizer.clone());
                rows.spans.push(c.handle.clone());
                rows.span_starts.push(n(c.start));
                rows.span_ends.push(n(c.end));
                rows.archived.push(n(c.archived));
                rows.summaries
                    .push(serde_json::to_string(&c.summary).unwrap_or_else(|_| "[]".into()));
                rows.tokens_before.push(u(c.tokens_before));
                rows.tokens_after.push(u(c.tokens_after));
            }
        }
        rows
    }
}
