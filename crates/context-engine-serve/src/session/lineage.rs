//! The managed history of one session and how it maps onto the client's.
//!
//! The client re-sends its full history on every call; the proxy keeps its
//! own, managed one (compacted, pruned). A hash chain over the client's
//! messages (`chain[i]` covers messages `0..=i`, each as the client wrote
//! it) tells whether a request extends what was seen. Each managed message
//! keeps the JSON text it was first sent with, so the prefix the provider
//! already cached goes out byte for byte on every later call: client
//! messages keep the client's own text, engine-made ones (summaries, pruned
//! results) are serialized once when they appear.
//!
//! Each managed message also records `depends`: how many client messages
//! it was derived from (a client message `i`: `i + 1`; an engine-made one:
//! every client message seen when it was made). When the client's history
//! diverges at `d` (edited, truncated, branched), the managed history is
//! cut before the first message with `depends > d` and rebuilt from the
//! client's messages after what is kept: a history never mixes lineages.

use context_engine::message::Message;
use serde_json::value::RawValue;

use super::LineageError;
use xxhash_rust::xxh3::{xxh3_128, xxh3_128_with_seed};

/// One managed message's bookkeeping (parallel to the messages).
#[derive(Clone, Debug)]
struct Meta {
    /// The JSON text this message is always sent as.
    text: Box<str>,
    /// Client messages `0..depends` it was derived from.
    depends: usize,
    /// Made by the engine rather than taken from the client.
    engine_made: bool,
}

/// How a request's messages relate to the lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reconcile {
    /// The request extends what was seen: client messages from `new_from`
    /// on are new.
    Extends {
        /// First new client message.
        new_from: usize,
    },
    /// The request diverged at client message `at`; the managed history
    /// was cut back and client messages from `new_from` on must be
    /// appended again.
    Diverged {
        /// First client message that differs (or the new length, when the
        /// client truncated).
        at: usize,
        /// First client message to append.
        new_from: usize,
        /// Whether engine-made messages (a summary) were dropped: the
        /// engine's own state belongs to the old lineage then.
        dropped_engine_made: bool,
    },
}

/// A session's managed history and the client chain it follows.
///
/// Awake, each managed message is held twice: parsed (what the engine
/// reads) and as its frozen text (what goes out). Asleep
/// ([`sleep`](Self::sleep), an idle session), only the texts are kept,
/// deflated into one buffer; [`wake`](Self::wake) inflates them and parses
/// the messages again, so the texts that go out are the same bytes.
#[derive(Debug, Default)]
pub struct Lineage {
    chain: Vec<u128>,
    messages: Vec<Message>,
    meta: Vec<Meta>,
    /// Per-message hashes of the last request sent, for the cacheable
    /// prefix estimate.
    last_sent: Vec<u64>,
    /// While asleep: every message's text, deflated (the texts in `meta`
    /// are empty and `messages` is empty then).
    asleep: Option<Asleep>,
}

/// The frozen texts of a sleeping lineage.
#[derive(Debug)]
struct Asleep {
    /// The texts one after another, deflated.
    packed: Box<[u8]>,
    /// Each text's length in bytes.
    lengths: Box<[u32]>,
}

/// The hash chain of `messages`: entry `i` covers messages `0..=i`.
pub fn chain(messages: &[&RawValue]) -> Vec<u128> {
    let mut out = Vec::with_capacity(messages.len());
    let mut prev = 0u128;
    for m in messages {
        let h = xxh3_128(m.get().as_bytes());
        let mut buf = [0u8; 32];
        buf[..16].copy_from_slice(&prev.to_le_bytes());
        buf[16..].copy_from_slice(&h.to_le_bytes());
        prev = xxh3_128_with_seed(&buf, 0x6374_785f_6c69_6e65);
        out.push(prev);
    }
    out
}

/// A request's messages as JSON text, and how much of it repeats the
/// previous request byte for byte.
#[derive(Debug)]
pub struct Rendered {
    /// The JSON array.
    pub json: String,
    /// Bytes of the leading messages identical to the previous request's.
    pub reused_bytes: usize,
    /// Leading messages identical to the previous request's.
    pub reused_messages: usize,
}

impl Lineage {
    /// Client messages incorporated so far.
    pub fn consumed(&self) -> usize {
        self.chain.len()
    }

    /// The client chain incorporated so far.
    pub fn chain(&self) -> &[u128] {
        &self.chain
    }

    /// The managed history (empty while asleep: [`wake`](Self::wake)
    /// first).
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Managed messages, asleep or awake.
    pub fn len(&self) -> usize {
        self.meta.len()
    }

    /// Whether the managed history is empty.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// Whether the lineage sleeps (texts only, deflated).
    pub fn is_asleep(&self) -> bool {
        self.asleep.is_some()
    }

    /// Keeps only the frozen texts, deflated, and drops the parsed
    /// messages: an idle session's memory. The chain, origins and the last
    /// request's hashes stay as they are.
    pub fn sleep(&mut self) {
        if self.asleep.is_some() {
            return;
        }
        let total: usize = self.meta.iter().map(|m| m.text.len()).sum();
        let mut lengths = Vec::with_capacity(self.meta.len());
        let mut deflater = flate2::write::DeflateEncoder::new(
            Vec::with_capacity(total / 3 + 64),
            flate2::Compression::fast(),
        );
        for m in &mut self.meta {
            let Ok(n) = u32::try_from(m.text.len()) else {
                // A single message over 4 GiB: stay awake.
                return;
            };
            lengths.push(n);
            // Writing into a Vec cannot fail.
            let _ = std::io::Write::write_all(&mut deflater, m.text.as_bytes());
        }
        let Ok(mut packed) = deflater.finish() else {
            return;
        };
        packed.shrink_to_fit();
        for m in &mut self.meta {
            m.text = Box::default();
        }
        self.meta.shrink_to_fit();
        self.chain.shrink_to_fit();
        self.last_sent.shrink_to_fit();
        self.messages = Vec::new();
        self.asleep = Some(Asleep {
            packed: packed.into_boxed_slice(),
            lengths: lengths.into_boxed_slice(),
        });
    }

    /// Inflates the texts of a sleeping lineage and parses its messages
    /// again (nothing to do when awake). On `Err` the lineage is unchanged
    /// (still asleep).
    pub fn wake(&mut self) -> Result<(), LineageError> {
        let Some(asleep) = &self.asleep else {
            return Ok(());
        };
        let texts = unpack(asleep)?;
        let messages = parse_sleeping(&texts)?;
        for (m, t) in self.meta.iter_mut().zip(texts) {
            m.text = t;
        }
        self.messages = messages;
        self.asleep = None;
        Ok(())
    }

    /// The managed history, parsed from the texts when asleep (which
    /// stays asleep).
    pub fn parsed(&self) -> Result<std::borrow::Cow<'_, [Message]>, LineageError> {
        let Some(asleep) = &self.asleep else {
            return Ok(std::borrow::Cow::Borrowed(&self.messages));
        };
        parse_sleeping(&unpack(asleep)?).map(std::borrow::Cow::Owned)
    }

    /// Each managed message's frozen text, asleep or awake.
    fn texts(&self) -> Result<std::borrow::Cow<'_, [Meta]>, LineageError> {
        let Some(asleep) = &self.asleep else {
            return Ok(std::borrow::Cow::Borrowed(&self.meta));
        };
        let texts = unpack(asleep)?;
        Ok(std::borrow::Cow::Owned(
            self.meta
                .iter()
                .zip(texts)
                .map(|(m, text)| Meta {
                    text,
                    depends: m.depends,
                    engine_made: m.engine_made,
                })
                .collect(),
        ))
    }

    /// Compares the client's chain with the one seen and cuts the managed
    /// history back at a divergence.
    pub fn reconcile(&mut self, incoming: &[u128]) -> Reconcile {
        debug_assert!(self.asleep.is_none(), "wake the lineage first");
        let seen = self.chain.len();
        let common = incoming
            .iter()
            .zip(&self.chain)
            .position(|(a, b)| a != b)
            .unwrap_or(seen.min(incoming.len()));
        if common == seen {
            return Reconcile::Extends { new_from: seen };
        }
        let cut = self
            .meta
            .iter()
            .position(|m| m.depends > common)
            .unwrap_or(self.meta.len());
        let dropped_engine_made = self.meta[cut..].iter().any(|m| m.engine_made);
        self.messages.truncate(cut);
        self.meta.truncate(cut);
        let covered = self.meta.iter().map(|m| m.depends).max().unwrap_or(0);
        self.chain.truncate(covered);
        Reconcile::Diverged {
            at: common,
            new_from: covered,
            dropped_engine_made,
        }
    }

    /// Appends client message `index` (parsed, and as the client wrote it).
    pub fn push_client(&mut self, message: Message, raw: &RawValue, index: usize) {
        debug_assert!(self.asleep.is_none(), "wake the lineage first");
        self.messages.push(message);
        self.meta.push(Meta {
            text: raw.get().into(),
            depends: index + 1,
            engine_made: false,
        });
    }

    /// Records that the client chain now extends to `chain` (all its
    /// messages incorporated).
    pub fn set_chain(&mut self, chain: &[u128]) {
        self.chain.clear();
        self.chain.extend_from_slice(chain);
    }

    /// Replaces the managed history with the engine's `new` one (a
    /// compaction or prune). A message equal to one kept in order keeps its
    /// text and lineage; any other is engine-made, serialized once now, and
    /// depends on every client message seen.
    pub fn replace(&mut self, new: Vec<Message>) {
        debug_assert!(self.asleep.is_none(), "wake the lineage first");
        let seen = self.chain.len();
        let mut meta = Vec::with_capacity(new.len());
        let mut j = 0;
        for m in &new {
            match self.messages[j..].iter().position(|old| old == m) {
                Some(k) => {
                    meta.push(self.meta[j + k].clone());
                    j += k + 1;
                }
                None => meta.push(Meta {
                    text: to_json(m).into(),
                    depends: seen,
                    engine_made: true,
                }),
            }
        }
        self.messages = new;
        self.meta = meta;
    }

    /// The JSON array of `request` (a view of the managed history): a
    /// message equal to the managed one at its position goes out as that
    /// one's text; others (digested views) are serialized, which is
    /// deterministic, so they too repeat byte for byte while unchanged.
    pub fn render(&mut self, request: &[Message]) -> Rendered {
        debug_assert!(self.asleep.is_none(), "wake the lineage first");
        // A message of the view that is a managed one goes out as that
        // one's text, matched in order (a fitted request leaves messages
        // out, so the positions shift; what follows still goes out as the
        // client wrote it).
        let mut next = 0;
        self.render_each(request.len(), |l, i| {
            let m = &request[i];
            let k = match l.messages.get(next) {
                Some(managed) if managed == m => Some(next),
                _ => l.messages[next.min(l.messages.len())..]
                    .iter()
                    .position(|x| x == m)
                    .map(|k| next + k),
            };
            match k {
                Some(k) => {
                    next = k + 1;
                    Text::Managed(k)
                }
                None => Text::Own(to_json(m)),
            }
        })
    }

    /// The managed messages, for the host to apply a request view to in
    /// place ([`host::Session::before_request_in_place`]); they must be
    /// restored before anything else reads the lineage.
    ///
    /// [`host::Session::before_request_in_place`]: context_engine::host::Session::before_request_in_place
    pub(crate) fn view_in_place(&mut self) -> &mut [Message] {
        debug_assert!(self.asleep.is_none(), "wake the lineage first");
        &mut self.messages
    }

    /// [`render`](Self::render) while a request view is applied in place:
    /// the managed messages are the request, `originals` the ones the view
    /// replaced (by ascending index). A replaced message goes out
    /// serialized, unless it equals its original (then as its text).
    pub(crate) fn render_applied(&mut self, originals: &[(usize, Message)]) -> Rendered {
        self.render_each(self.messages.len(), |l, i| {
            let Ok(k) = originals.binary_search_by_key(&i, |(j, _)| *j) else {
                return Text::Managed(i);
            };
            if originals[k].1 == l.messages[i] {
                Text::Managed(i)
            } else {
                Text::Own(to_json(&l.messages[i]))
            }
        })
    }

    /// The JSON array of `n` messages: message `i` as `text_of(i)` says
    /// (see [`Text`]); records the hashes for the next request's reuse
    /// estimate.
    fn render_each(
        &mut self,
        n: usize,
        mut text_of: impl FnMut(&Lineage, usize) -> Text,
    ) -> Rendered {
        let mut json =
            String::with_capacity(self.meta.iter().map(|m| m.text.len() + 1).sum::<usize>() + 2);
        let mut sent = Vec::with_capacity(n);
        let mut reused_bytes = 0;
        let mut reused_messages = 0;
        let mut same = true;
        json.push('[');
        for i in 0..n {
            if i > 0 {
                json.push(',');
            }
            let start = json.len();
            match text_of(self, i) {
                Text::Own(text) => json.push_str(&text),
                Text::Managed(j) => json.push_str(self.meta.get(j).map_or("", |m| &m.text)),
            }
            let h = xxhash_rust::xxh3::xxh3_64(&json.as_bytes()[start..]);
            if same && self.last_sent.get(i) == Some(&h) {
                reused_bytes = json.len();
                reused_messages += 1;
            } else {
                same = false;
            }
            sent.push(h);
        }
        json.push(']');
        self.last_sent = sent;
        Rendered {
            json,
            reused_bytes,
            reused_messages,
        }
    }

    /// Approximate heap bytes held (texts, or the deflated texts while
    /// asleep, bookkeeping and the parsed messages' slots).
    pub fn heap_bytes(&self) -> usize {
        self.chain.capacity() * 16
            + self.last_sent.capacity() * 8
            + self
                .meta
                .iter()
                .map(|m| m.text.len() + std::mem::size_of::<Meta>())
                .sum::<usize>()
            + self.messages.capacity() * std::mem::size_of::<Message>()
            + self
                .asleep
                .as_ref()
                .map_or(0, |a| a.packed.len() + a.lengths.len() * 4)
    }
}

/// Where a rendered message's text comes from.
enum Text {
    /// The frozen text of managed message `j`.
    Managed(usize),
    /// Its own serialization.
    Own(String),
}

/// The texts of a sleeping lineage, inflated.
fn unpack(asleep: &Asleep) -> Result<Vec<Box<str>>, LineageError> {
    let total: usize = asleep.lengths.iter().map(|&n| n as usize).sum();
    let mut bytes = Vec::with_capacity(total);
    std::io::Read::read_to_end(
        &mut flate2::read::DeflateDecoder::new(&asleep.packed[..]),
        &mut bytes,
    )
    .map_err(LineageError::Inflate)?;
    if bytes.len() != total {
        return Err(LineageError::Length {
            got: bytes.len(),
            expected: total,
        });
    }
    let mut out = Vec::with_capacity(asleep.lengths.len());
    let mut at = 0;
    for &n in &asleep.lengths {
        let end = at + n as usize;
        let text = std::str::from_utf8(&bytes[at..end]).map_err(LineageError::Utf8)?;
        out.push(Box::from(text));
        at = end;
    }
    Ok(out)
}

/// The messages of a sleeping lineage's texts.
fn parse_sleeping(texts: &[Box<str>]) -> Result<Vec<Message>, LineageError> {
    texts
        .iter()
        .enumerate()
        .map(|(index, t)| {
            serde_json::from_str::<Message>(t)
                .map_err(|error| LineageError::SleepingMessage { index, error })
        })
        .collect()
}

/// A lineage as a session store keeps it (see `persist`): each managed
/// message's frozen text embedded as raw JSON (byte for byte), its
/// `depends` and origin, the client chain, the last request's hashes.
///
/// The store keeps it as segments: each one keeps the first `keep` items
/// of each part that the segments before it built, then appends its own.
/// A whole lineage is one segment keeping nothing (which is also what a
/// store written before segments holds), and a step appends one with what
/// it changed.
#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    #[serde(default, skip_serializing_if = "RecordKeep::is_nothing")]
    keep: RecordKeep,
    chain: Vec<String>,
    messages: Vec<RecordMessage>,
    sent: Vec<u64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct RecordMessage {
    json: Box<RawValue>,
    depends: usize,
    engine_made: bool,
}

/// How many items of each part of a lineage a record segment keeps from
/// the segments before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecordKeep {
    /// Client chain entries.
    pub chain: usize,
    /// Managed messages.
    pub messages: usize,
    /// Hashes of the last request's messages.
    pub sent: usize,
}

impl RecordKeep {
    fn is_nothing(&self) -> bool {
        *self == RecordKeep::default()
    }
}

/// Fingerprints of a lineage's parts: what a store holds, compared with
/// the lineage now, tells what a step changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordPrints {
    /// Client chain length and its last entry (a hash chain: equal last
    /// entries mean equal chains).
    chain: (usize, u128),
    /// Per managed message: its text's hash with its `depends` and origin.
    messages: Vec<u64>,
    /// The last request's per-message hashes.
    sent: Vec<u64>,
    /// About the bytes of the whole lineage as one segment.
    pub bytes: usize,
}

impl RecordPrints {
    /// Whether the two lineages' parts are the same: nothing to write.
    pub fn same_parts(&self, other: &RecordPrints) -> bool {
        self.chain == other.chain && self.messages == other.messages && self.sent == other.sent
    }

    /// One hash of the parts: equal digests, equal lineages (what a
    /// record's segments build is checked against the digest stored
    /// with it).
    pub fn digest(&self) -> u128 {
        let mut bytes = Vec::with_capacity(32 + 8 * (self.messages.len() + self.sent.len()));
        bytes.extend_from_slice(&(self.chain.0 as u64).to_le_bytes());
        bytes.extend_from_slice(&self.chain.1.to_le_bytes());
        bytes.extend_from_slice(&(self.messages.len() as u64).to_le_bytes());
        for h in self.messages.iter().chain(&self.sent) {
            bytes.extend_from_slice(&h.to_le_bytes());
        }
        xxh3_128(&bytes)
    }
}

impl Lineage {
    /// The lineage as JSON text, for a session store (one segment that
    /// keeps nothing).
    pub fn to_record(&self) -> Result<String, LineageError> {
        self.to_segment(RecordKeep::default())
    }

    /// A record segment: the items of each part past what `keep` keeps.
    pub fn to_segment(&self, keep: RecordKeep) -> Result<String, LineageError> {
        let meta = self.texts()?;
        let messages = meta
            .iter()
            .enumerate()
            .skip(keep.messages)
            .map(|(index, m)| {
                Ok(RecordMessage {
                    json: RawValue::from_string(m.text.to_string())
                        .map_err(|error| LineageError::NotJson { index, error })?,
                    depends: m.depends,
                    engine_made: m.engine_made,
                })
            })
            .collect::<Result<Vec<_>, LineageError>>()?;
        let record = Record {
            keep,
            chain: self
                .chain
                .iter()
                .skip(keep.chain)
                .map(|h| format!("{h:032x}"))
                .collect(),
            messages,
            sent: self.last_sent.iter().skip(keep.sent).copied().collect(),
        };
        serde_json::to_string(&record).map_err(LineageError::Encode)
    }

    /// What of the lineage (whose prints are `now`) a store that holds
    /// `stored` keeps: the common start of each part.
    pub fn record_kept(&self, now: &RecordPrints, stored: &RecordPrints) -> RecordKeep {
        let common = |a: &[u64], b: &[u64]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let (n, last) = stored.chain;
        RecordKeep {
            chain: if n > 0 && self.chain.get(n - 1) == Some(&last) {
                n
            } else {
                0
            },
            messages: common(&now.messages, &stored.messages),
            sent: common(&now.sent, &stored.sent),
        }
    }

    /// Fingerprints of the lineage's parts (see [`RecordPrints`]).
    pub fn record_prints(&self) -> RecordPrints {
        let mut bytes = 64 + self.chain.len() * 35 + self.last_sent.len() * 21;
        // Asleep, the texts are unpacked for this (a stored session is
        // dropped rather than put to sleep, so this is rare).
        let meta = self.texts().unwrap_or_default();
        let messages = meta
            .iter()
            .map(|m| {
                bytes += m.text.len() + 40;
                let text = xxhash_rust::xxh3::xxh3_64(m.text.as_bytes());
                let origin = (m.depends as u64) << 1 | u64::from(m.engine_made);
                xxhash_rust::xxh3::xxh3_64_with_seed(&text.to_le_bytes(), origin)
            })
            .collect();
        RecordPrints {
            chain: (self.chain.len(), self.chain.last().copied().unwrap_or(0)),
            messages,
            sent: self.last_sent.clone(),
            bytes,
        }
    }

    /// The lineage [`to_record`](Self::to_record) wrote; each message is
    /// parsed from its frozen text.
    pub fn from_record(text: &str) -> Result<Lineage, LineageError> {
        Lineage::from_segments(&[text])
    }

    /// The lineage a store's record segments build, oldest first.
    pub fn from_segments<S: AsRef<str>>(segments: &[S]) -> Result<Lineage, LineageError> {
        let mut l = Lineage::default();
        l.apply_segments(segments, 0)?;
        Ok(l)
    }

    /// Applies record segments that follow the ones this lineage was
    /// built from (the first is segment `first` of the store's), oldest
    /// first. Awake lineages only (a stored session is never put to sleep).
    pub fn apply_segments<S: AsRef<str>>(
        &mut self,
        segments: &[S],
        first: usize,
    ) -> Result<(), LineageError> {
        if self.asleep.is_some() {
            return Err(LineageError::Asleep);
        }
        let l = self;
        for (k, text) in segments.iter().enumerate() {
            let segment = first + k;
            let record: Record = serde_json::from_str(text.as_ref())
                .map_err(|error| LineageError::Segment { segment, error })?;
            let keep = record.keep;
            if keep.chain > l.chain.len()
                || keep.messages > l.messages.len()
                || keep.sent > l.last_sent.len()
            {
                return Err(LineageError::Keeps {
                    segment,
                    keep,
                    chain: l.chain.len(),
                    messages: l.messages.len(),
                    sent: l.last_sent.len(),
                });
            }
            l.chain.truncate(keep.chain);
            for h in &record.chain {
                let hash = u128::from_str_radix(h, 16).map_err(|error| LineageError::Chain {
                    segment,
                    entry: h.clone(),
                    error,
                })?;
                l.chain.push(hash);
            }
            l.messages.truncate(keep.messages);
            l.meta.truncate(keep.messages);
            for (i, m) in record.messages.into_iter().enumerate() {
                let message: Message = serde_json::from_str(m.json.get()).map_err(|error| {
                    LineageError::StoredMessage {
                        index: keep.messages + i,
                        error,
                    }
                })?;
                l.messages.push(message);
                l.meta.push(Meta {
                    text: m.json.get().into(),
                    depends: m.depends,
                    engine_made: m.engine_made,
                });
            }
            l.last_sent.truncate(keep.sent);
            l.last_sent.extend(record.sent);
        }
        Ok(())
    }
}

/// A message's JSON text (the lossless model gives the same text for the
/// same message every time).
fn to_json(m: &Message) -> String {
    // Serializing the message model cannot fail (no non-string keys).
    serde_json::to_string(m).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raws(texts: &[&str]) -> Vec<Box<RawValue>> {
        texts
            .iter()
            .map(|t| RawValue::from_string((*t).to_owned()).unwrap())
            .collect()
    }

    fn feed(l: &mut Lineage, raws: &[Box<RawValue>]) -> Reconcile {
        let refs: Vec<&RawValue> = raws.iter().map(AsRef::as_ref).collect();
        let c = chain(&refs);
        let r = l.reconcile(&c);
        let from = match r {
            Reconcile::Extends { new_from } | Reconcile::Diverged { new_from, .. } => new_from,
        };
        for (i, raw) in refs.iter().enumerate().skip(from) {
            l.push_client(serde_json::from_str(raw.get()).unwrap(), raw, i);
        }
        l.set_chain(&c);
        r
    }

    const S: &str = r#"{"role": "system", "content": "s"}"#;
    const U1: &str = r#"{"role": "user", "content": "one"}"#;
    const A1: &str = r#"{"role": "assistant", "content": "a1"}"#;
    const U2: &str = r#"{"role": "user", "content": "two"}"#;
    const A2: &str = r#"{"role": "assistant", "content": "a2"}"#;
    const U3: &str = r#"{"role": "user", "content": "three"}"#;

    #[test]
    fn extends_then_keeps_client_bytes() {
        let mut l = Lineage::default();
        assert_eq!(
            feed(&mut l, &raws(&[S, U1])),
            Reconcile::Extends { new_from: 0 }
        );
        assert_eq!(
            feed(&mut l, &raws(&[S, U1, A1, U2])),
            Reconcile::Extends { new_from: 2 }
        );
        let msgs = l.messages().to_vec();
        let r = l.render(&msgs);
        assert_eq!(r.json, format!("[{S},{U1},{A1},{U2}]"));
        assert_eq!(r.reused_messages, 0);
        let r = l.render(&msgs);
        assert_eq!((r.reused_messages, r.reused_bytes), (4, r.json.len() - 1));
    }

    #[test]
    fn a_view_that_leaves_messages_out_sends_the_rest_as_the_client_wrote_it() {
        let mut l = Lineage::default();
        feed(&mut l, &raws(&[S, U1, A1, U2, A2, U3]));
        // A fitted view: two messages left out, the rest shifted.
        let m = l.messages().to_vec();
        let view = vec![m[0].clone(), m[1].clone(), m[4].clone(), m[5].clone()];
        assert_eq!(l.render(&view).json, format!("[{S},{U1},{A2},{U3}]"));
        // A message the view made goes out serialized, the rest as written.
        let made: Message = serde_json::from_str(r#"{"role":"user","content":"[note]"}"#).unwrap();
        let view = vec![m[0].clone(), m[1].clone(), made, m[4].clone(), m[5].clone()];
        assert_eq!(
            l.render(&view).json,
            format!(r#"[{S},{U1},{{"role":"user","content":"[note]"}},{A2},{U3}]"#)
        );
    }

    #[test]
    fn compacted_prefix_is_frozen_and_divergence_never_mixes() {
        let mut l = Lineage::default();
        feed(&mut l, &raws(&[S, U1, A1, U2]));
        // A "compaction": system, a summary, the last user message.
        let summary: Message =
            serde_json::from_str(r#"{"role":"user","content":"[summary]"}"#).unwrap();
        let mut new = vec![
            l.messages()[0].clone(),
            summary.clone(),
            l.messages()[3].clone(),
        ];
        l.replace(new.clone());
        let first = l.render(&new).json;
        assert_eq!(
            first,
            format!(r#"[{S},{{"role":"user","content":"[summary]"}},{U2}]"#)
        );
        // The client sends its full history plus new messages.
        assert_eq!(
            feed(&mut l, &raws(&[S, U1, A1, U2, A2, U3])),
            Reconcile::Extends { new_from: 4 }
        );
        new = l.messages().to_vec();
        assert_eq!(new.len(), 5);
        let second = l.render(&new).json;
        assert!(
            second.starts_with(&first[..first.len() - 1]),
            "frozen prefix byte for byte"
        );

        // Branch after U2 (inside the compacted span's lineage): the
        // summary depends on messages 0..4, so it is dropped.
        let r = feed(&mut l, &raws(&[S, U1, A1, U3]));
        assert_eq!(
            r,
            Reconcile::Diverged {
                at: 3,
                new_from: 1,
                dropped_engine_made: true
            }
        );
        let msgs = l.messages().to_vec();
        assert_eq!(l.render(&msgs).json, format!("[{S},{U1},{A1},{U3}]"));
    }

    /// `S U1 A1 U2` with `U1 A1` compacted into a summary.
    fn compacted() -> Lineage {
        let mut l = Lineage::default();
        feed(&mut l, &raws(&[S, U1, A1, U2]));
        let summary: Message =
            serde_json::from_str(r#"{"role":"user","content":"[summary]"}"#).unwrap();
        l.replace(vec![
            l.messages()[0].clone(),
            summary,
            l.messages()[3].clone(),
        ]);
        l
    }

    #[test]
    fn a_sleeping_lineage_keeps_its_texts_and_wakes_the_same() {
        let mut l = compacted();
        let msgs = l.messages().to_vec();
        let first = l.render(&msgs).json;
        let record = l.to_record().unwrap();
        l.sleep();
        assert!(l.is_asleep() && l.messages().is_empty());
        assert_eq!(l.len(), 3);
        assert_eq!(l.to_record().unwrap(), record, "the record while asleep");
        assert_eq!(l.parsed().unwrap().as_ref(), &msgs[..]);
        assert!(l.is_asleep(), "parsing for a look does not wake it");
        l.wake().unwrap();
        assert!(!l.is_asleep());
        assert_eq!(l.messages(), &msgs[..]);
        let again = l.render(&msgs);
        assert_eq!(again.json, first, "byte for byte");
        assert_eq!(again.reused_messages, 3, "the prefix estimate survives");
        // It goes on as if it never slept.
        assert_eq!(
            feed(&mut l, &raws(&[S, U1, A1, U2, A2, U3])),
            Reconcile::Extends { new_from: 4 }
        );
    }

    #[test]
    fn a_broken_stored_record_names_its_segment_and_part() {
        let good = compacted().to_record().unwrap();
        let err = |segments: &[&str]| Lineage::from_segments(segments).unwrap_err().to_string();
        let text = err(&[&good, "{not json"]);
        assert!(text.starts_with("stored lineage, segment 1: "), "{text}");
        let keeps =
            r#"{"keep":{"chain":9,"messages":0,"sent":0},"chain":[],"messages":[],"sent":[]}"#;
        let text = err(&[&good, keeps]);
        assert!(
            text.starts_with("stored lineage, segment 1: keeps RecordKeep { chain: 9,"),
            "{text}"
        );
        assert!(
            text.ends_with("of 4 chain entries, 3 messages, 0 hashes"),
            "{text}"
        );
        let text = err(&[r#"{"chain":["zz"],"messages":[],"sent":[]}"#]);
        assert!(
            text.starts_with("stored lineage, segment 0: chain entry `zz`: "),
            "{text}"
        );
        let bad = r#"{"chain":[],"messages":[{"json":{"content":"x"},"depends":1,"engine_made":false}],"sent":[]}"#;
        let text = err(&[bad]);
        assert!(text.starts_with("stored managed message 0: "), "{text}");
        assert!(
            matches!(
                Lineage::from_segments(&[bad]),
                Err(LineageError::StoredMessage { index: 0, .. })
            ),
            "typed"
        );
    }

    #[test]
    fn edit_and_truncation_after_the_compaction_keep_it() {
        let mut l = compacted();
        feed(&mut l, &raws(&[S, U1, A1, U2, A2, U3]));
        // The client rewrote its last message.
        let r = feed(&mut l, &raws(&[S, U1, A1, U2, A2, U1]));
        assert_eq!(
            r,
            Reconcile::Diverged {
                at: 5,
                new_from: 5,
                dropped_engine_made: false
            }
        );
        assert_eq!(l.messages().len(), 5);
        // Truncated back to before the summary's span ended.
        let r = feed(&mut l, &raws(&[S, U1]));
        assert_eq!(
            r,
            Reconcile::Diverged {
                at: 2,
                new_from: 1,
                dropped_engine_made: true
            }
        );
        assert_eq!(l.messages().len(), 2);
    }
}
