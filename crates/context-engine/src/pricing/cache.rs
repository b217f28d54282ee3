//! A provider's prompt cache, simulated at token granularity: what a request
//! would read from the cache, given the requests sent before it.
//!
//! Two kinds of cache ([`CacheModel::automatic`]):
//!
//! - **automatic** (OpenAI, DeepSeek): every request is stored, and a later
//!   one reads the longest prefix it shares with a live entry, at any
//!   token (rounded down to the granularity);
//! - **breakpoints** (Anthropic's `cache_control`): a request stores its
//!   prefix only at the messages the host marked, and a later request
//!   reads an entry only when it carries that whole prefix and marks a
//!   message at most [`LOOKBACK`] messages after it (the API looks back
//!   about 20 blocks from each breakpoint). What follows the read up to the
//!   request's last breakpoint is written to the cache (the write price);
//!   what follows the last breakpoint is not cached (the input price).

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

/// How far back from one of its breakpoints a request finds an entry, in
/// messages (Anthropic: about 20 content blocks).
pub const LOOKBACK: usize = 20;

/// What the cache served one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheLookup {
    /// Tokens read from the cache: the longest common prefix with a live
    /// entry, rounded down to the granularity, zero under the minimum.
    pub hit_tokens: u64,
    /// Uncached tokens billed at the cache-write price: all of them in an
    /// automatic cache (from its minimum prefix on), those up to the last
    /// breakpoint in a breakpoint cache. The rest are billed at the input
    /// price.
    pub written_tokens: u64,
    /// The longest common prefix in tokens, before rounding (and whether
    /// or not an entry ends there).
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
    /// The prefix lengths (in messages) stored: the marked ones at least
    /// the cache's minimum long (breakpoint caches only).
    marks: Vec<usize>,
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
    /// `marks` are the prefix lengths, in messages, the host marks as
    /// breakpoints (each at most `request.len()`; a breakpoint cache
    /// stores and reads only there, an automatic one ignores them).
    /// `counter` must be the one that counted the request's prompt tokens.
    pub fn lookup_and_store(
        &mut self,
        request: &[Message],
        marks: &[usize],
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
        let mut starts = Vec::with_capacity(request.len() + 1);
        let mut total = 0;
        starts.push(0);
        for m in request {
            total += counter.count_message(m) as u64;
            starts.push(total);
        }
        let min = self.model.min_prefix_tokens;
        let mut marks: Vec<usize> = marks
            .iter()
            .copied()
            .filter(|&l| l > 0 && l <= request.len() && starts[l] >= min)
            .collect();
        marks.sort_unstable();
        marks.dedup();

        let mut common_tokens = 0;
        let mut best: Option<(usize, u64)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            let common = common_tokens_with(e, request, counter);
            common_tokens = common_tokens.max(common);
            let served = if self.model.automatic {
                self.model.servable(common)
            } else {
                let same = common_messages(&e.request, request);
                e.marks
                    .iter()
                    .filter(|&&l| l <= same && marks.iter().any(|&b| b >= l && b - l <= LOOKBACK))
                    .map(|&l| e.starts[l])
                    .max()
                    .unwrap_or(0)
            };
            if served > 0 && best.is_none_or(|(_, b)| served > b) {
                best = Some((i, served));
            }
        }
        let hit_tokens = best.map_or(0, |(_, t)| t);
        if let Some((i, _)) = best
            && let Some(e) = self.entries.get_mut(i)
        {
            e.used_at = at.or(e.used_at);
        }
        let written_tokens = if self.model.automatic {
            if total >= min { total - hit_tokens } else { 0 }
        } else {
            marks
                .last()
                .map_or(0, |&l| starts[l].saturating_sub(hit_tokens))
        };

        if self.entries.len() == ENTRIES {
            self.entries.pop_front();
        }
        self.entries.push_back(Entry {
            request: request.into(),
            starts,
            marks,
            used_at: at,
        });
        CacheLookup {
            hit_tokens,
            written_tokens,
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
fn common_tokens_with(e: &Entry, request: &[Message], counter: &dyn TokenCounter) -> u64 {
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
    use crate::pricing::PriceModel;
    use crate::tokens::{BpeCounter, Encoding};

    fn words(n: usize) -> String {
        (0..n).map(|i| format!("w{i} ")).collect()
    }

    #[test]
    fn an_appended_request_reads_its_prefix_in_whole_steps() {
        let counter = BpeCounter::new(Encoding::O200kBase);
        let mut cache = PromptCache::new(CacheModel::default());
        let first = vec![Message::system(words(1500)), Message::user("hi")];
        assert_eq!(
            cache
                .lookup_and_store(&first, &[], None, &counter)
                .hit_tokens,
            0
        );
        let mut second = first.clone();
        second.push(Message::assistant("hello"));
        let hit = cache.lookup_and_store(&second, &[], None, &counter);
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
        cache.lookup_and_store(&first, &[], None, &counter);
        let edited = vec![
            Message::user("go"),
            Message::tool_result("c", format!("{}CHANGED", &body[..body.len() / 2])),
        ];
        let hit = cache.lookup_and_store(&edited, &[], None, &counter);
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
        cache.lookup_and_store(&request, &[], Some(0.0), &counter);
        assert!(
            cache
                .lookup_and_store(&request, &[], Some(200.0), &counter)
                .hit_tokens
                > 0
        );
        // Read at 200 s: alive until 500 s.
        assert!(
            cache
                .lookup_and_store(&request, &[], Some(450.0), &counter)
                .hit_tokens
                > 0
        );
        let cold = cache.lookup_and_store(&request, &[], Some(2000.0), &counter);
        assert_eq!(cold.hit_tokens, 0);
        assert!(cold.expired);
    }

    #[test]
    fn a_breakpoint_cache_reads_only_a_marked_prefix_the_request_carries_whole() {
        let counter = BpeCounter::new(Encoding::O200kBase);
        let model = PriceModel::preset("anthropic").unwrap().cache;
        let mut cache = PromptCache::new(model);
        let tokens = |m: &[Message]| {
            m.iter()
                .map(|m| counter.count_message(m) as u64)
                .sum::<u64>()
        };
        let system = Message::system(words(1500));
        let call = |id: &str| {
            Message::assistant_tool_calls("", vec![crate::ToolCall::function(id, "bash", "{}")])
        };
        let big = |id: &str| Message::tool_result(id, words(3000));
        // The host marks the system prompt and the last message.
        let first = vec![system.clone(), Message::user("go"), call("a"), big("a")];
        let miss = cache.lookup_and_store(&first, &[1, 4], None, &counter);
        assert_eq!(miss.hit_tokens, 0);
        assert_eq!(miss.written_tokens, tokens(&first));
        // The newest result digested: the entry at the end no longer
        // matches; only the system prompt is read, the rest written again.
        let digested = Message::tool_result("a", "[digested] a");
        let second = vec![
            system.clone(),
            Message::user("go"),
            call("a"),
            digested.clone(),
            call("b"),
            big("b"),
        ];
        let hit = cache.lookup_and_store(&second, &[1, 6], None, &counter);
        assert_eq!(hit.hit_tokens, tokens(&second[..1]));
        assert_eq!(hit.written_tokens, tokens(&second[1..]));
        // An automatic cache would have read up to the digested result.
        assert_eq!(hit.common_tokens, tokens(&second[..3]));
        // Marked before the newest result instead: the next request reads
        // through that mark; the newest result is billed at the input price.
        let third = vec![
            system.clone(),
            Message::user("go"),
            call("a"),
            digested.clone(),
            call("b"),
            Message::tool_result("b", "[digested] b"),
            call("c"),
            big("c"),
        ];
        let marked = cache.lookup_and_store(&third, &[1, 7], None, &counter);
        assert_eq!(
            marked.hit_tokens,
            tokens(&second[..1]),
            "the second request marked its own end only"
        );
        let mut fourth = third.clone();
        fourth[7] = Message::tool_result("c", "[digested] c");
        fourth.extend([call("d"), big("d")]);
        let read = cache.lookup_and_store(&fourth, &[1, 9], None, &counter);
        assert_eq!(read.hit_tokens, tokens(&fourth[..7]));
        assert_eq!(read.written_tokens, tokens(&fourth[7..9]));
        // Too far back from every breakpoint: not found.
        let mut long = fourth.clone();
        for k in 0..=LOOKBACK {
            long.push(Message::user(format!("turn {k}")));
        }
        cache.lookup_and_store(&fourth, &[1, 9], None, &counter);
        let lost = cache.lookup_and_store(&long, &[1, long.len()], None, &counter);
        assert_eq!(lost.hit_tokens, tokens(&long[..1]));
    }
}
