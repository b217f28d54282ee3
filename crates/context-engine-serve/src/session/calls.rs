//! What the page at `/ui` shows of a session's calls: the tokens of the
//! client's history (counted once per message, [`ClientTokens`]) and, per
//! managed call, what the client sent against what went upstream, with the
//! engine's marks ([`CallLog`], bounded: the oldest calls go first).

use std::collections::VecDeque;

use context_engine::message::Message;
use context_engine::tokens::TokenCounter;
use serde::Serialize;
use serde_json::value::RawValue;

/// The tokens of the client's history: each message counted once, when it
/// first arrives (the engine counts the same messages, so the counter's
/// cache answers it again).
#[derive(Debug, Default)]
pub struct ClientTokens {
    /// Per message, in the client's order, when known for all of
    /// `0..known` (a session read back from a store knows only the sum).
    counts: Vec<u32>,
    /// Client messages the sum covers.
    known: usize,
    /// Their tokens, without the request's overhead.
    total: u64,
}

impl ClientTokens {
    /// Resumes from a sum: `known` messages of `total` tokens.
    pub fn resume(known: usize, total: u64) -> ClientTokens {
        ClientTokens {
            counts: Vec::new(),
            known,
            total,
        }
    }

    /// The client's history is `raw`; its messages from `new_from` on are
    /// new (parsed: `new`), the ones before as counted. Returns the tokens
    /// of the whole history, without the request's overhead. A history
    /// that dropped messages the counts cannot take back (a session read
    /// back from a store) is counted again from `raw`.
    pub fn update(
        &mut self,
        raw: &[&RawValue],
        new_from: usize,
        new: &[Message],
        counter: &dyn TokenCounter,
    ) -> u64 {
        let per_message = self.counts.len() == self.known;
        if new_from != self.known {
            if per_message && new_from < self.known {
                self.counts.truncate(new_from);
                self.total = self.counts.iter().map(|&c| u64::from(c)).sum();
            } else {
                self.counts = raw
                    .iter()
                    .take(new_from)
                    .map(|r| {
                        serde_json::from_str::<Message>(r.get())
                            .map_or(0, |m| clamp(counter.count_message(&m)))
                    })
                    .collect();
                self.total = self.counts.iter().map(|&c| u64::from(c)).sum();
            }
            self.known = new_from;
        }
        let per_message = self.counts.len() == self.known;
        for m in new {
            let n = clamp(counter.count_message(m));
            if per_message {
                self.counts.push(n);
            }
            self.total += u64::from(n);
        }
        self.known += new.len();
        self.total
    }
}

fn clamp(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// One managed call as the page draws it (16 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallPoint {
    /// Tokens of the client's history, counted.
    pub client_tokens: u32,
    /// Tokens of the request that went upstream, counted.
    pub upstream_tokens: u32,
    /// Seconds since the session's log started.
    pub at_s: u32,
    flags: u8,
}

const COMPACTION: u8 = 1;
const DIGEST: u8 = 2;
const PRUNE: u8 = 4;
const DIVERGED: u8 = 8;

impl CallPoint {
    /// A call: what the client sent, what went upstream, and the marks.
    pub fn new(client_tokens: u64, upstream_tokens: u64, marks: Marks) -> CallPoint {
        let clamp64 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let flags = [
            (marks.compaction, COMPACTION),
            (marks.digest, DIGEST),
            (marks.prune, PRUNE),
            (marks.diverged, DIVERGED),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |f, (_, bit)| f | bit);
        CallPoint {
            client_tokens: clamp64(client_tokens),
            upstream_tokens: clamp64(upstream_tokens),
            at_s: 0,
            flags,
        }
    }

    /// The marks.
    pub fn marks(&self) -> Marks {
        Marks {
            compaction: self.flags & COMPACTION != 0,
            digest: self.flags & DIGEST != 0,
            prune: self.flags & PRUNE != 0,
            diverged: self.flags & DIVERGED != 0,
        }
    }
}

/// What the engine did to one call's request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Marks {
    /// A compaction ran before it.
    pub compaction: bool,
    /// Older tool output went as digests.
    pub digest: bool,
    /// A proactive prune shortened tool results before it.
    pub prune: bool,
    /// The client's history diverged: a new lineage started.
    pub diverged: bool,
}

/// A compaction as the log remembers it: at which call, and which of the
/// session's compaction records (in its store) are its passes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CompactionMark {
    /// The call it ran before (from 1).
    pub call: u64,
    /// Its passes are the session's compaction records up to this one
    /// (numbered from 1), `passes` of them.
    pub last_record: u64,
    /// Passes.
    pub passes: u32,
    /// Tokens of the request before and after it.
    pub request_tokens_before: u64,
    /// After.
    pub request_tokens_after: u64,
    /// Messages of the history before and after it.
    pub messages_before: usize,
    /// After.
    pub messages_after: usize,
}

/// Compactions remembered per session.
const COMPACTIONS_KEPT: usize = 64;

/// A session's last calls, at most `capacity` (and its last compactions),
/// for the page.
#[derive(Debug, Default)]
pub struct CallLog {
    points: VecDeque<CallPoint>,
    compactions: VecDeque<CompactionMark>,
    /// Calls logged since the session started (the first kept is
    /// `total - points.len() + 1`).
    total: u64,
    started: Option<std::time::Instant>,
    /// Unix milliseconds of the last call.
    last_ms: u64,
}

impl CallLog {
    /// Logs one call (dropping the oldest past `capacity`) and, when it
    /// followed one, its compaction; returns the call's number (from 1).
    pub fn push(
        &mut self,
        mut point: CallPoint,
        compaction: Option<CompactionMark>,
        capacity: usize,
    ) -> u64 {
        if capacity == 0 {
            return 0;
        }
        let started = *self.started.get_or_insert_with(std::time::Instant::now);
        point.at_s = u32::try_from(started.elapsed().as_secs()).unwrap_or(u32::MAX);
        self.last_ms = context_engine::store::now_ms();
        while self.points.len() >= capacity {
            self.points.pop_front();
        }
        self.points.push_back(point);
        self.total += 1;
        if let Some(mut c) = compaction {
            c.call = self.total;
            if self.compactions.len() >= COMPACTIONS_KEPT {
                self.compactions.pop_front();
            }
            self.compactions.push_back(c);
        }
        self.total
    }

    /// The calls kept, oldest first, with their numbers.
    pub fn points(&self) -> impl Iterator<Item = (u64, &CallPoint)> {
        let first = self.total - self.points.len() as u64 + 1;
        (first..).zip(self.points.iter())
    }

    /// The compactions kept, oldest first.
    pub fn compactions(&self) -> impl Iterator<Item = &CompactionMark> {
        self.compactions.iter()
    }

    /// Calls logged since the session started.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Unix milliseconds of the last call (0: none yet).
    pub fn last_ms(&self) -> u64 {
        self.last_ms
    }

    /// Sums over the calls kept: client tokens, upstream tokens.
    pub fn sums(&self) -> (u64, u64) {
        self.points.iter().fold((0, 0), |(c, u), p| {
            (
                c + u64::from(p.client_tokens),
                u + u64::from(p.upstream_tokens),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use context_engine::tokens::EstimateCounter;

    fn raw(messages: &[Message]) -> Vec<Box<RawValue>> {
        messages
            .iter()
            .map(|m| RawValue::from_string(serde_json::to_string(m).unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn client_tokens_count_each_message_once_and_follow_a_rewritten_history() {
        let counter = EstimateCounter::default();
        let a = vec![
            Message::user("fix the parser in src/parse.rs please"),
            Message::assistant("reading it now"),
            Message::user("and run the tests"),
        ];
        let boxed = raw(&a);
        let refs: Vec<&RawValue> = boxed.iter().map(AsRef::as_ref).collect();
        let each: Vec<u64> = a.iter().map(|m| counter.count_message(m) as u64).collect();
        let mut t = ClientTokens::default();
        assert_eq!(
            t.update(&refs[..2], 0, &a[..2], &counter),
            each[0] + each[1]
        );
        assert_eq!(
            t.update(&refs, 2, &a[2..], &counter),
            each.iter().sum::<u64>()
        );
        // The client rewrote its last message: the sum drops it first.
        let b = vec![a[0].clone(), a[1].clone(), Message::user("no, stop")];
        let boxed_b = raw(&b);
        let refs_b: Vec<&RawValue> = boxed_b.iter().map(AsRef::as_ref).collect();
        let want = each[0] + each[1] + counter.count_message(&b[2]) as u64;
        assert_eq!(t.update(&refs_b, 2, &b[2..], &counter), want);
        // Read back from a store (the sum only), then rewritten: counted
        // again from the client's messages.
        let mut resumed = ClientTokens::resume(3, want);
        assert_eq!(resumed.update(&refs_b, 3, &[], &counter), want);
        assert_eq!(
            resumed.update(&refs_b[..2], 1, &b[1..2], &counter),
            each[0] + each[1]
        );
    }

    #[test]
    fn the_log_keeps_the_last_calls_numbered_and_nothing_when_off() {
        let mut log = CallLog::default();
        let marks = Marks {
            compaction: true,
            ..Marks::default()
        };
        for k in 0..5u64 {
            let compaction = (k == 3).then_some(CompactionMark {
                call: 0,
                last_record: 1,
                passes: 1,
                request_tokens_before: 10,
                request_tokens_after: 5,
                messages_before: 4,
                messages_after: 2,
            });
            let m = if k == 3 { marks } else { Marks::default() };
            log.push(CallPoint::new(100 + k, 50 + k, m), compaction, 3);
        }
        let kept: Vec<(u64, u32)> = log.points().map(|(n, p)| (n, p.client_tokens)).collect();
        assert_eq!(kept, vec![(3, 102), (4, 103), (5, 104)]);
        assert!(log.points().any(|(n, p)| n == 4 && p.marks().compaction));
        assert_eq!(
            log.compactions().map(|c| c.call).collect::<Vec<_>>(),
            vec![4]
        );
        assert_eq!(log.sums(), (309, 159));
        let mut off = CallLog::default();
        assert_eq!(off.push(CallPoint::default(), None, 0), 0);
        assert_eq!(off.points().count(), 0);
        assert_eq!(std::mem::size_of::<CallPoint>(), 16);
    }
}
