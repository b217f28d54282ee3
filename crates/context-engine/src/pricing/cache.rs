//! A provider's prompt cache, simulated at token granularity: what a request
//! would read from the cache, given the requests sent before it.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::Serialize;

use super::CacheModel;
use crate::message::Message;
use crate::tokens::TokenCounter;

/// How many earlier requests are compared with a new one. A cached prefix
/// from an older request is longer than the newest one's only when the
/// newest diverged earlier; four covers a compaction or an edit followed by
/// a retry.
const ENTRIES: usize = 4;

/// What the cache served one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheLookup {
    /// Tokens read from the cache: the longest common prefix with a live
    /// entry, rounded down to the granularity, zero under the minimum.
    pub hit_tokens: u64,
    /// The longest common prefix in tokens, before rounding.
    pub common_tokens: u64,
    /// The request's first message that differs from the previous request
    /// (`None` when the previous request is a prefix of this one, or when
    /// there was none): where the cache broke.
    pub broke_at: Option<usize>,
    /// Tokens of messages after the break that the previous request had
    /// after it too: cached content sent again at the full price. Zero
    /// when only new content follows the change (a digest of the batch
    /// that was newest), positive when the change was deep (a compaction,
    /// a prune, a late digest step).
    pub resent_tokens: u64,
    /// Whether every earlier entry had expired (an idle gap longer than the
    /// lifetime).
    pub expired: bool,
}

struct Entry {
    request: Arc<[Message]>,
    /// Tokens before message `i`; one more element than `request`.
    starts: Vec<u64>,
    /// When the entry was last written or read, in seconds.
    used_at: Option<f64>,
}

/// The simulated cache. Feed it every request in order with
/// [`lookup_and_store`](Self::lookup_and_store).
pub struct PromptCache {
    model: CacheModel,
    entries: VecDeque<Entry>,
}

impl PromptCache {
    /// An empty cache behaving as `model`.
    pub fn new(model: CacheModel) -> PromptCache {
        PromptCache {
            model,
            entries: VecDeque::new(),
        }
    }

    /// What the cache serves `request`, sent at `at` seconds (any epoch;
    /// `None` when unknown, in which case nothing expires); then stores it.
    /// `counter` must be the one that counted the request's prompt tokens.
    pub fn lookup_and_store(
        &mut self,
        request: &[Message],
        at: Option<f64>,
        counter: &dyn TokenCounter,
    ) -> CacheLookup {
        let lifetime = self.model.lifetime_secs as f64;
        let alive = |e: &Entry| match (at, e.used_at) {
            (Some(now), Some(used)) => now - used <= lifetime,
            _ => true,
        };
        let had_entries = !self.entries.is_empty();
        self.entries.retain(alive);
        let expired = had_entries && self.entries.is_empty();

        let broke_at = self.entries.back().and_then(|last| {
            let same = common_messages(&last.request, request);
            (same < last.request.len()).then_some(same)
        });
        let resent_tokens = match (broke_at, self.entries.back()) {
            (Some(at), Some(last)) => {
                let old = last.request.get(at..).unwrap_or_default();
                request
                    .get(at..)
                    .unwrap_or_default()
                    .iter()
                    .filter(|m| old.contains(m))
                    .map(|m| counter.count_message(m) as u64)
                    .sum()
            }
            _ => 0,
        };
        let mut best: Option<(usize, u64)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            let common = common_tokens(e, request, counter);
            if best.is_none_or(|(_, b)| common > b) {
                best = Some((i, common));
            }
        }
        let common_tokens = best.map_or(0, |(_, t)| t);
        let hit_tokens = self.model.servable(common_tokens);
        if hit_tokens > 0
            && let Some((i, _)) = best
            && let Some(e) = self.entries.get_mut(i)
        {
            e.used_at = at.or(e.used_at);
        }

        let mut starts = Vec::with_capacity(request.len() + 1);
        let mut total = 0;
        starts.push(0);
        for m in request {
            total += counter.count_message(m) as u64;
            starts.push(total);
        }
        if self.entries.len() == ENTRIES {
            self.entries.pop_front();
        }
        self.entries.push_back(Entry {
            request: request.into(),
            starts,
            used_at: at,
        });
        CacheLookup {
            hit_tokens,
            common_tokens,
            broke_at,
            resent_tokens,
            expired,
        }
    }
}

/// Leading messages `a` and `b` share.
fn common_messages(a: &[Message], b: &[Message]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Tokens of the common prefix of `e`'s request and `request`: whole equal
/// messages, then the common start of the first differing message's text.
fn common_tokens(e: &Entry, request: &[Message], counter: &dyn TokenCounter) -> u64 {
    let same = common_messages(&e.request, request);
    let whole = e.starts.get(same).copied().unwrap_or(0);
    let (Some(old), Some(new)) = (e.request.get(same), request.get(same)) else {
        return whole;
    };
    if old.role != new.role {
        return whole;
    }
    let (old, new) = (old.text(), new.text());
    let shared = common_prefix_len(&old, &new);
    if shared == 0 {
        return whole;
    }
    // Part of a message: its text up to the first difference, never the
    // whole message (something in it differs).
    let own = e.starts.get(same + 1).map_or(0, |s| s - whole);
    let partial = (counter.count_text(&old[..shared]) as u64).min(own.saturating_sub(1));
    whole + partial
}

/// Bytes of the common prefix of `a` and `b`, on a character boundary.
fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{BpeCounter, Encoding};

    fn words(n: usize) -> String {
        (0..n).map(|i| format!("w{i} ")).collect()
    }

    #[test]
    fn an_appended_request_reads_its_prefix_in_whole_steps() {
        let counter = BpeCounter::new(Encoding::O200kBase);
        let mut cache = PromptCache::new(CacheModel::default());
        let first = vec![Message::system(words(1500)), Message::user("hi")];
        assert_eq!(cache.lookup_and_store(&first, None, &counter).hit_tokens, 0);
        let mut second = first.clone();
        second.push(Message::assistant("hello"));
        let hit = cache.lookup_and_store(&second, None, &counter);
        let prefix = counter.count_messages(&first) as u64 - counter.request_overhead() as u64;
        assert_eq!(hit.common_tokens, prefix);
        assert_eq!(hit.hit_tokens, prefix / 128 * 128);
        assert_eq!(hit.broke_at, None);
    }

    #[test]
    fn an_edit_breaks_the_cache_inside_the_edited_message() {
        let counter = BpeCounter::new(Encoding::O200kBase);
        let mut cache = PromptCache::new(CacheModel {
            granularity_tokens: 1,
            min_prefix_tokens: 0,
            ..CacheModel::default()
        });
        let body = words(2000);
        let first = vec![Message::user("go"), Message::tool_result("c", body.clone())];
        cache.lookup_and_store(&first, None, &counter);
        let edited = vec![
            Message::user("go"),
            Message::tool_result("c", format!("{}CHANGED", &body[..body.len() / 2])),
        ];
        let hit = cache.lookup_and_store(&edited, None, &counter);
        assert_eq!(hit.broke_at, Some(1));
        let go = counter.count_message(&first[0]) as u64;
        assert!(hit.common_tokens > go + 500, "{hit:?}");
        assert!(hit.common_tokens < go + counter.count_message(&first[1]) as u64);
    }

    #[test]
    fn entries_expire_after_the_lifetime() {
        let counter = BpeCounter::new(Encoding::O200kBase);
        let mut cache = PromptCache::new(CacheModel::default());
        let request = vec![Message::system(words(3000))];
        cache.lookup_and_store(&request, Some(0.0), &counter);
        assert!(
            cache
                .lookup_and_store(&request, Some(200.0), &counter)
                .hit_tokens
                > 0
        );
        // Read at 200 s: alive until 500 s.
        assert!(
            cache
                .lookup_and_store(&request, Some(450.0), &counter)
                .hit_tokens
                > 0
        );
        let cold = cache.lookup_and_store(&request, Some(2000.0), &counter);
        assert_eq!(cold.hit_tokens, 0);
        assert!(cold.expired);
    }
}
