//! A request in a client's own wire format, as a proxy front serves it:
//! Anthropic Messages (`POST /v1/messages`, Claude Code) or OpenAI
//! Responses (`POST /v1/responses`, Codex).
//!
//! [`FrontRequest::parse`] reads the body through the lossless model and
//! its bridge, so the engine sees chat messages ([`FrontRequest::chat`]);
//! [`FrontRequest::rebuild`] turns the engine's result back into the
//! client's format and answers with the top-level fields to replace (as
//! JSON text), every other field of the body going upstream as it came.
//! A rebuilt request that would break a rule of its API the client's own
//! request kept (or that changed the thinking of a tool-using turn) is
//! refused with the violation, so the caller sends the client's request
//! instead.
//!
//! A proxy serving one session's calls keeps the last request in a
//! [`FrontCache`] and reads the next one with
//! [`FrontRequest::parse_fields`]: the top-level fields and each message
//! (item) are hashed as the client wrote them, and only the messages past
//! the common prefix are parsed and bridged (a message whose bytes changed
//! in any way, a moved `cache_control` included, is read again; a cached
//! conversion is never used for other bytes). [`FrontRequest::rebuild_with`]
//! writes every message (item) the engine left unchanged as the client's
//! own bytes and serializes only the rest.
//!
//! Prompt caching: an Anthropic request keeps the breakpoints the client
//! placed on blocks that stay; after a compaction the summary (the end of
//! the managed prefix) gets one when fewer than four remain
//! ([`crate::anthropic::cache`]). A Responses input is append-only for its
//! client: unchanged items go back byte for byte, so the managed prefix is
//! byte-identical from call to call.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::{Xxh3Default, xxh3_128};

use crate::anthropic::{self, FormatError};
use crate::compressor::is_summary;
use crate::message::Message;
use crate::responses;
use crate::validate::{self, Violation};

/// The client formats a front serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrontKind {
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Responses.
    Responses,
}

impl FrontKind {
    /// The top-level field holding the conversation.
    pub fn items_field(self) -> &'static str {
        match self {
            FrontKind::Anthropic => "messages",
            FrontKind::Responses => "input",
        }
    }

    /// The format's name, for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            FrontKind::Anthropic => "anthropic",
            FrontKind::Responses => "responses",
        }
    }
}

impl fmt::Display for FrontKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a request is passed through without the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unmanaged {
    /// A Responses request continuing server-side state
    /// (`previous_response_id`): its input is not the whole conversation.
    ServerState,
}

impl Unmanaged {
    /// A short stable name (a metrics label).
    pub fn name(self) -> &'static str {
        match self {
            Unmanaged::ServerState => "previous_response_id",
        }
    }
}

enum Inner {
    Anthropic {
        request: anthropic::Request,
        bridged: anthropic::bridge::Bridged,
    },
    Responses {
        request: responses::Request,
        bridged: responses::bridge::Bridged,
    },
}

/// A parsed client request and its chat view.
pub struct FrontRequest {
    inner: Inner,
    /// Each chat message as compact JSON (what a session hashes and
    /// freezes).
    chat_json: Vec<Box<RawValue>>,
    /// The hash of the top-level fields other than the conversation, and
    /// each message's (item's) hash, as the client wrote them; `None` when
    /// read whole ([`FrontRequest::parse`]): not reusable.
    hashes: Option<(u128, Vec<u128>)>,
    /// The rewritten messages (items) of the last rebuild, by source:
    /// what the engine made of them and the JSON they became.
    memo: HashMap<u128, Memo>,
}

/// One source message (Anthropic) or chat message's items (Responses)
/// the engine rewrote: the chat messages it came back as and the JSON the
/// rebuild wrote for it.
struct Memo {
    output: Vec<Message>,
    json: Box<str>,
}

/// The last request of one session, kept so that the next one parses and
/// bridges only what is new ([`FrontRequest::parse_fields`]). Content
/// addressed: whatever happens to the session (a new lineage, an engine
/// restart), a cached message is reused only for the same bytes.
#[derive(Default)]
pub struct FrontCache {
    last: Option<FrontRequest>,
}

impl fmt::Debug for FrontCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrontCache")
            .field("last", &self.last)
            .finish()
    }
}

impl FrontCache {
    /// Keeps `front` for the next request (a request read whole is not
    /// kept).
    pub fn keep(&mut self, front: FrontRequest) {
        self.last = front.hashes.is_some().then_some(front);
    }

    /// Forgets the kept request.
    pub fn clear(&mut self) {
        self.last = None;
    }

    /// Messages (items) of the kept request.
    pub fn len(&self) -> usize {
        self.last
            .as_ref()
            .and_then(|f| f.hashes.as_ref())
            .map_or(0, |(_, h)| h.len())
    }

    /// Whether no request is kept.
    pub fn is_empty(&self) -> bool {
        self.last.is_none()
    }
}

impl fmt::Debug for FrontRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrontRequest")
            .field("kind", &self.kind())
            .field("messages", &self.chat().len())
            .finish_non_exhaustive()
    }
}

/// The top-level fields of a rebuilt request that differ from the
/// client's, each as compact JSON text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// `(field, JSON)` pairs, in the order to write them.
    pub fields: Vec<(&'static str, String)>,
    /// A breakpoint was placed on the end of the managed prefix.
    pub marked_prefix: bool,
}

impl FrontRequest {
    /// Reads a request body of format `kind`.
    pub fn parse(kind: FrontKind, text: &str) -> Result<FrontRequest, FormatError> {
        let inner = match kind {
            FrontKind::Anthropic => {
                let request = anthropic::Request::parse(text)?;
                let bridged = anthropic::bridge::to_chat(&request);
                Inner::Anthropic { request, bridged }
            }
            FrontKind::Responses => {
                let request = responses::Request::parse(text)?;
                let bridged = responses::bridge::to_chat(&request);
                Inner::Responses { request, bridged }
            }
        };
        let mut front = FrontRequest {
            inner,
            chat_json: Vec::new(),
            hashes: None,
            memo: HashMap::new(),
        };
        front.extend_chat_json(0)?;
        Ok(front)
    }

    /// Reads a request of format `kind` from its top-level fields (each
    /// as the client wrote it, in order), reusing what `cache` kept of the
    /// session's previous request: when the other top-level fields are the
    /// same bytes, the messages (items) of the common prefix keep their
    /// parse and chat conversion, and only the rest is read. The cache is
    /// emptied; hand the request back with [`FrontCache::keep`].
    pub fn parse_fields(
        kind: FrontKind,
        fields: &[(&str, &RawValue)],
        cache: &mut FrontCache,
    ) -> Result<FrontRequest, FormatError> {
        let items = split_items(kind, fields);
        FrontRequest::parse_parts(kind, fields, items.as_deref(), cache)
    }

    /// [`parse_fields`](Self::parse_fields) with the conversation already
    /// split into its messages (items) by [`split_items`] (`None`: not an
    /// array).
    pub fn parse_parts(
        kind: FrontKind,
        fields: &[(&str, &RawValue)],
        items: Option<&[&RawValue]>,
        cache: &mut FrontCache,
    ) -> Result<FrontRequest, FormatError> {
        let items_field = kind.items_field();
        if !fields.iter().any(|(k, _)| *k == items_field) {
            return Err(FormatError::Missing { field: items_field });
        }
        let Some(items) = items else {
            // A string input, or not an array at all: read whole.
            return FrontRequest::from_fields(kind, fields, None);
        };
        let mut head = Xxh3Default::new();
        for (k, v) in fields {
            head.update(&(k.len() as u64).to_le_bytes());
            head.update(k.as_bytes());
            if *k != items_field {
                head.update(&(v.get().len() as u64).to_le_bytes());
                head.update(v.get().as_bytes());
            }
        }
        let head = head.digest128();
        let hashes: Vec<u128> = items.iter().map(|r| xxh3_128(r.get().as_bytes())).collect();
        let reusable = cache
            .last
            .take()
            .filter(|p| p.kind() == kind && p.hashes.as_ref().is_some_and(|(h, _)| *h == head));
        let Some(prev) = reusable else {
            return FrontRequest::from_fields(kind, fields, Some((head, hashes, items)));
        };
        let common = prev.hashes.as_ref().map_or(0, |(_, h)| {
            h.iter().zip(&hashes).take_while(|(a, b)| a == b).count()
        });
        let FrontRequest {
            inner,
            chat_json,
            memo,
            ..
        } = prev;
        let mut front = FrontRequest {
            inner,
            chat_json,
            hashes: Some((head, hashes)),
            memo,
        };
        let kept = match &mut front.inner {
            Inner::Anthropic { request, bridged } => {
                request.messages.truncate(common);
                push_messages(&mut request.messages, items, common)?;
                let prev = std::mem::replace(bridged, empty_anthropic());
                let (b, kept) = anthropic::bridge::to_chat_from(request, prev, common);
                *bridged = b;
                kept
            }
            Inner::Responses { request, bridged } => {
                let mut list = match std::mem::replace(
                    &mut request.input,
                    responses::Input::Items(Vec::new()),
                ) {
                    responses::Input::Items(list) => list,
                    responses::Input::Text(_) => Vec::new(),
                };
                list.truncate(common);
                push_items(&mut list, items, common)?;
                request.input = responses::Input::Items(list);
                let prev = std::mem::replace(bridged, empty_responses());
                let (b, kept) = responses::bridge::to_chat_from(request, prev, common);
                *bridged = b;
                kept
            }
        };
        front.chat_json.truncate(kept);
        front.extend_chat_json(kept)?;
        Ok(front)
    }

    /// Reads the whole request from its fields; with `hashes` (the
    /// conversation as an array of raw items) each item is parsed from
    /// its own text and the request can be kept.
    fn from_fields(
        kind: FrontKind,
        fields: &[(&str, &RawValue)],
        hashes: Option<(u128, Vec<u128>, &[&RawValue])>,
    ) -> Result<FrontRequest, FormatError> {
        let items_field = kind.items_field();
        let mut map = Map::with_capacity(fields.len());
        for (k, v) in fields {
            let value = if hashes.is_some() && *k == items_field {
                Value::Array(Vec::new())
            } else {
                serde_json::from_str(v.get()).map_err(|e| FormatError::Json(e.to_string()))?
            };
            map.insert((*k).to_owned(), value);
        }
        let value = Value::Object(map);
        let inner = match kind {
            FrontKind::Anthropic => {
                let mut request = anthropic::Request::from_value(value)?;
                if let Some((_, _, items)) = &hashes {
                    push_messages(&mut request.messages, items, 0)?;
                }
                let bridged = anthropic::bridge::to_chat(&request);
                Inner::Anthropic { request, bridged }
            }
            FrontKind::Responses => {
                let mut request = responses::Request::from_value(value)?;
                if let Some((_, _, items)) = &hashes {
                    let mut list = Vec::with_capacity(items.len());
                    push_items(&mut list, items, 0)?;
                    request.input = responses::Input::Items(list);
                }
                let bridged = responses::bridge::to_chat(&request);
                Inner::Responses { request, bridged }
            }
        };
        let mut front = FrontRequest {
            inner,
            chat_json: Vec::new(),
            hashes: hashes.map(|(head, h, _)| (head, h)),
            memo: HashMap::new(),
        };
        front.extend_chat_json(0)?;
        Ok(front)
    }

    /// Serializes the chat messages from `from` on into `chat_json`.
    fn extend_chat_json(&mut self, from: usize) -> Result<(), FormatError> {
        let messages = match &mut self.inner {
            Inner::Anthropic { bridged, .. } => &mut bridged.messages,
            Inner::Responses { bridged, .. } => &mut bridged.messages,
        };
        self.chat_json.reserve(messages.len().saturating_sub(from));
        for m in messages.iter_mut().skip(from) {
            let raw =
                serde_json::value::to_raw_value(m).map_err(|e| FormatError::Json(e.to_string()))?;
            // The message as a session reads it back from that text (its
            // key order recorded): what the engine returns for a message
            // it leaves alone, so equal compares equal.
            *m = serde_json::from_str(raw.get()).map_err(|e| FormatError::Json(e.to_string()))?;
            self.chat_json.push(raw);
        }
        Ok(())
    }

    /// The chat view's messages as compact JSON, one per message of
    /// [`chat`](Self::chat).
    pub fn chat_json(&self) -> &[Box<RawValue>] {
        &self.chat_json
    }

    /// The request's format.
    pub fn kind(&self) -> FrontKind {
        match self.inner {
            Inner::Anthropic { .. } => FrontKind::Anthropic,
            Inner::Responses { .. } => FrontKind::Responses,
        }
    }

    /// The conversation as chat messages (what the engine works on).
    pub fn chat(&self) -> &[Message] {
        match &self.inner {
            Inner::Anthropic { bridged, .. } => &bridged.messages,
            Inner::Responses { bridged, .. } => &bridged.messages,
        }
    }

    fn extra(&self) -> &crate::message::Extra {
        match &self.inner {
            Inner::Anthropic { request, .. } => &request.extra,
            Inner::Responses { request, .. } => &request.extra,
        }
    }

    /// A top-level field the models keep unparsed (`model`, `stream`,
    /// `metadata`, `prompt_cache_key`…).
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.extra().get(name)
    }

    /// Whether the client asked for a stream.
    pub fn stream(&self) -> bool {
        self.field("stream").and_then(Value::as_bool) == Some(true)
    }

    /// Why the request must go upstream without the engine, if it must.
    pub fn unmanaged(&self) -> Option<Unmanaged> {
        unmanaged(self.kind(), |name| self.field(name).cloned())
    }

    /// The client's request rebuilt from the engine's `output` (chat
    /// messages): the fields to replace. Empty when `output` is the chat
    /// view unchanged (the body goes upstream as it came). `Err` when the
    /// rebuilt request would add a violation of its API's rules.
    pub fn rebuild(&self, output: &[Message]) -> Result<Rebuilt, Violation> {
        self.rebuild_whole(output, None, None)
    }

    /// [`rebuild`](Self::rebuild), writing each message (item) the engine
    /// left unchanged as its text in `raw`: the conversation this request
    /// was read from, one entry per message (item), as the client wrote
    /// it (ignored when its length differs).
    ///
    /// When the engine rewrote messages in place (each chat message came
    /// back at its position, changed or not: a digest, a clip), a request
    /// read by [`parse_parts`](Self::parse_parts) is rebuilt message by
    /// message: a rewritten message the previous rebuild saw come back the
    /// same way reuses the JSON it became then, the others are patched
    /// alone; the API's rules are judged by shape (a rewrite that keeps
    /// every message's role, blocks, tool ids and thinking keeps the
    /// client's request's violations), and anything else takes the whole
    /// rebuild.
    ///
    /// `stable` is how many leading messages of `output` the engine expects
    /// the next request to carry as they are (`output.len()` when all:
    /// see [`crate::host::Session::stable_prefix`]). When the rest are
    /// the client's own newest messages and it marked a breakpoint on
    /// them, the breakpoint moves to the message before them
    /// ([`anthropic::cache::move_tail_breakpoints`]): an entry written
    /// on messages the next request changes is never read.
    pub fn rebuild_with(
        &mut self,
        output: &[Message],
        raw: Option<&[&RawValue]>,
        stable: usize,
    ) -> Result<Rebuilt, Violation> {
        let tail = self.breakpoint_tail(output, stable);
        if output == self.chat() && tail.is_none() {
            return Ok(Rebuilt::default());
        }
        // A summary the engine added marks the end of the managed
        // prefix: the whole rebuild places its breakpoint.
        if let Some(raw) = raw
            && last_new(self.chat(), output).is_none()
            && let Some(rebuilt) = self.rebuild_in_place(output, raw, tail)
        {
            return Ok(rebuilt);
        }
        self.memo.clear();
        self.rebuild_whole(output, raw, tail)
    }

    /// How many messages at the end of this Anthropic request the next
    /// call changes, when the client marked a breakpoint on them: the
    /// messages past `output`'s first `stable` are the client's own (the
    /// engine left them as they came), they start a message, and an
    /// assistant message comes before them.
    fn breakpoint_tail(&self, output: &[Message], stable: usize) -> Option<usize> {
        let Inner::Anthropic { request, bridged } = &self.inner else {
            return None;
        };
        let chat = self.chat();
        let after = output.len().checked_sub(stable).filter(|&t| t > 0)?;
        let first = chat.len().checked_sub(after)?;
        if output.get(stable..)? != chat.get(first..)? {
            return None;
        }
        let anthropic::bridge::Origin::Message { index, .. } = *bridged.origins.get(first)? else {
            return None;
        };
        // The chat message before the tail comes from the message before.
        let starts_message = first == 0
            || !matches!(bridged.origins.get(first - 1),
                Some(anthropic::bridge::Origin::Message { index: i, .. }) if *i == index);
        let before = index.checked_sub(1).and_then(|i| request.messages.get(i))?;
        let tail = &request.messages[index..];
        let marked = tail
            .iter()
            .map(anthropic::cache::message_breakpoints)
            .sum::<usize>()
            > 0;
        (starts_message && marked && before.role == "assistant").then_some(tail.len())
    }

    /// The in-place rebuild of [`rebuild_with`](Self::rebuild_with), with
    /// the client's breakpoints on the last `tail` messages moved; `None`
    /// when it does not apply.
    fn rebuild_in_place(
        &mut self,
        output: &[Message],
        raw: &[&RawValue],
        tail: Option<usize>,
    ) -> Option<Rebuilt> {
        let hashes = &self.hashes.as_ref()?.1;
        if hashes.len() != raw.len() || output.len() != self.chat().len() {
            return None;
        }
        let steps = crate::bridge::align(self.chat(), output);
        let in_place = steps.iter().enumerate().all(|(k, s)| s.source() == Some(k));
        if !in_place || steps.len() != output.len() {
            return None;
        }
        let mut memo = std::mem::take(&mut self.memo);
        let mut next = HashMap::new();
        let mut json =
            String::with_capacity(raw.iter().map(|r| r.get().len() + 1).sum::<usize>() + 2);
        json.push('[');
        let field = match &self.inner {
            Inner::Anthropic { request, bridged } => {
                // The messages the moved breakpoints change, as they go out.
                let mut moved = HashMap::new();
                if let Some(n) = tail {
                    let from = request.messages.len().checked_sub(n + 1)?;
                    let mut last: Vec<anthropic::Message> = request.messages[from..].to_vec();
                    for k in anthropic::cache::move_tail_breakpoints(&mut last, n) {
                        moved.insert(from + k, to_json(&last[k]));
                    }
                }
                // The system prompt comes first and must come back as it was.
                let system = usize::from(matches!(
                    bridged.origins.first(),
                    Some(anthropic::bridge::Origin::System)
                ));
                if system == 1 && steps[0] != crate::bridge::Step::Same(0) {
                    return None;
                }
                let mut k = system;
                for (i, source) in request.messages.iter().enumerate() {
                    let start = k;
                    while matches!(bridged.origins.get(k), Some(anthropic::bridge::Origin::Message { index, .. }) if *index == i)
                    {
                        k += 1;
                    }
                    if start == k {
                        return None;
                    }
                    if i > 0 {
                        json.push(',');
                    }
                    let changes: Vec<(usize, &Message)> = steps[start..k]
                        .iter()
                        .filter_map(|s| match *s {
                            crate::bridge::Step::Changed(j, m) => Some((j, m)),
                            _ => None,
                        })
                        .collect();
                    if let Some(text) = moved.remove(&i) {
                        // The engine left it as it came (the tail is the
                        // client's own): only its breakpoints differ.
                        if !changes.is_empty() {
                            return None;
                        }
                        json.push_str(&text);
                        continue;
                    }
                    if changes.is_empty() {
                        json.push_str(raw[i].get());
                        continue;
                    }
                    let now = &output[start..k];
                    let entry = match memo.remove(&hashes[i]) {
                        Some(m) if m.output == now => m,
                        _ => {
                            let m =
                                anthropic::bridge::patch_message(request, bridged, i, &changes)?;
                            if !validate::anthropic::same_shape(source, &m) {
                                return None;
                            }
                            Memo {
                                output: now.to_vec(),
                                json: to_json(&m).into(),
                            }
                        }
                    };
                    json.push_str(&entry.json);
                    next.insert(hashes[i], entry);
                }
                if k != bridged.origins.len() {
                    return None;
                }
                "messages"
            }
            Inner::Responses { request, bridged } => {
                let source = request.items();
                let mut first = true;
                let mut count = 0;
                for (j, step) in steps.iter().enumerate() {
                    let list = match &bridged.origins[j] {
                        responses::bridge::Origin::Items(list) => list,
                        responses::bridge::Origin::Instructions
                            if *step == crate::bridge::Step::Same(j) =>
                        {
                            continue;
                        }
                        _ => return None,
                    };
                    count += list.len();
                    let mut push = |json: &mut String, text: &str| {
                        if !first {
                            json.push(',');
                        }
                        first = false;
                        json.push_str(text);
                    };
                    let crate::bridge::Step::Changed(_, now) = *step else {
                        for &i in list {
                            push(&mut json, raw.get(i)?.get());
                        }
                        continue;
                    };
                    let was = &bridged.messages[j];
                    // Text for a turn with no message item adds an item.
                    let carries_text = list.iter().any(|&i| {
                        source.get(i).is_some_and(|it| {
                            matches!(
                                it.kind(),
                                responses::ItemKind::Message { .. }
                                    | responses::ItemKind::Output { .. }
                            )
                        })
                    });
                    if !carries_text && was.content != now.content && !now.text().is_empty() {
                        return None;
                    }
                    let mut key = Xxh3Default::new();
                    for &i in list {
                        key.update(&hashes.get(i)?.to_le_bytes());
                    }
                    let key = key.digest128();
                    let entry = match memo.remove(&key) {
                        Some(m) if m.output.len() == 1 && m.output[0] == *now => m,
                        _ => {
                            let mut text = String::new();
                            for (n, &i) in list.iter().enumerate() {
                                if n > 0 {
                                    text.push(',');
                                }
                                let item = source.get(i)?;
                                match responses::bridge::patch(item, was, now) {
                                    Some(p) => {
                                        if !validate::responses::same_shape(item, &p) {
                                            return None;
                                        }
                                        text.push_str(&to_json(&p));
                                    }
                                    None => text.push_str(raw.get(i)?.get()),
                                }
                            }
                            Memo {
                                output: vec![now.clone()],
                                json: text.into(),
                            }
                        }
                    };
                    push(&mut json, &entry.json);
                    next.insert(key, entry);
                }
                if count != source.len() {
                    return None;
                }
                "input"
            }
        };
        json.push(']');
        self.memo = next;
        Some(Rebuilt {
            fields: vec![(field, json)],
            marked_prefix: false,
        })
    }

    /// The whole rebuild: the engine's output through the bridge, the
    /// API's rules on the result.
    fn rebuild_whole(
        &self,
        output: &[Message],
        raw: Option<&[&RawValue]>,
        tail: Option<usize>,
    ) -> Result<Rebuilt, Violation> {
        if output == self.chat() && tail.is_none() {
            return Ok(Rebuilt::default());
        }
        let prefix_end = last_new(self.chat(), output);
        match &self.inner {
            Inner::Anthropic { request, bridged } => {
                let raw = raw.filter(|r| r.len() == request.messages.len());
                let (mut out, mut sources) =
                    anthropic::bridge::from_chat_traced(request, bridged, output);
                let after = validate::anthropic::validate(&out);
                if !after.is_empty()
                    && let Some(v) = introduced(validate::anthropic::validate(request), after)
                {
                    return Err(v);
                }
                if let Some(v) = validate::anthropic::thinking_changed(request, &out)
                    .into_iter()
                    .next()
                {
                    return Err(v);
                }
                let marked =
                    prefix_end.and_then(|t| anthropic::cache::mark_prefix_end_at(&mut out, &t));
                if let Some(s) = marked.and_then(|i| sources.get_mut(i)) {
                    *s = None;
                }
                if let Some(n) = tail {
                    for i in anthropic::cache::move_tail_breakpoints(&mut out.messages, n) {
                        if let Some(s) = sources.get_mut(i) {
                            *s = None;
                        }
                    }
                }
                let mut fields = Vec::with_capacity(2);
                if out.system != request.system {
                    fields.push(("system", to_json(&out.system)));
                }
                fields.push(("messages", splice(&out.messages, &sources, raw)));
                let marked_prefix = marked.is_some();
                Ok(Rebuilt {
                    fields,
                    marked_prefix,
                })
            }
            Inner::Responses { request, bridged } => {
                let raw = raw.filter(|r| r.len() == request.items().len());
                let (out, sources) = responses::bridge::from_chat_traced(request, bridged, output);
                let after = validate::responses::validate(&out);
                if !after.is_empty()
                    && let Some(v) = introduced(validate::responses::validate(request), after)
                {
                    return Err(v);
                }
                let mut fields = Vec::with_capacity(2);
                let instructions = out.extra.get("instructions");
                if instructions != request.extra.get("instructions")
                    && let Some(v) = instructions
                {
                    fields.push(("instructions", to_json(v)));
                }
                match &out.input {
                    responses::Input::Items(items) => {
                        fields.push(("input", splice(items, &sources, raw)));
                    }
                    text => fields.push(("input", to_json(text))),
                }
                Ok(Rebuilt {
                    fields,
                    marked_prefix: false,
                })
            }
        }
    }
}

/// Why a request of format `kind` must go upstream without the engine, if
/// it must, read from its top-level fields (`field` gives one by name):
/// a Responses request continuing server-side state
/// (`previous_response_id`).
pub fn unmanaged(kind: FrontKind, field: impl Fn(&str) -> Option<Value>) -> Option<Unmanaged> {
    match kind {
        FrontKind::Responses if field("previous_response_id").is_some_and(|v| v.is_string()) => {
            Some(Unmanaged::ServerState)
        }
        _ => None,
    }
}

/// The conversation of a request of format `kind` (`messages`, `input`)
/// split into its messages (items), each as the client wrote it; `None`
/// when it is missing or not an array.
pub fn split_items<'a>(
    kind: FrontKind,
    fields: &[(&str, &'a RawValue)],
) -> Option<Vec<&'a RawValue>> {
    let items_field = kind.items_field();
    let (_, raw) = fields.iter().find(|(k, _)| *k == items_field)?;
    serde_json::from_str::<Vec<&RawValue>>(raw.get()).ok()
}

/// The text of the summary the engine put in `output` (a message carrying
/// one that the client never sent): the end of the managed prefix.
fn last_new(input: &[Message], output: &[Message]) -> Option<String> {
    output
        .iter()
        .rev()
        .find(|m| is_summary(m) && !input.contains(m))
        .map(|m| m.content.text().into_owned())
        .filter(|t| !t.is_empty())
}

/// The first violation of `after` beyond those `before` already had (by
/// rule).
fn introduced(before: Vec<Violation>, after: Vec<Violation>) -> Option<Violation> {
    let mut budget: HashMap<_, usize> = HashMap::new();
    for v in before {
        *budget.entry(v.rule).or_default() += 1;
    }
    after.into_iter().find(|v| match budget.get_mut(&v.rule) {
        Some(n) if *n > 0 => {
            *n -= 1;
            false
        }
        _ => true,
    })
}

fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    // The models serialize without failing (string keys only).
    serde_json::to_string(value).unwrap_or_default()
}

/// The JSON array of `values`: an entry whose source (`sources[k]`) is
/// unchanged goes out as the client's text of that source (`raw`), the
/// others are serialized.
fn splice<T: Serialize>(
    values: &[T],
    sources: &[Option<usize>],
    raw: Option<&[&RawValue]>,
) -> String {
    let Some(raw) = raw else {
        return to_json(values);
    };
    let mut out = Vec::with_capacity(raw.iter().map(|r| r.get().len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (k, v) in values.iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        match sources.get(k).copied().flatten().and_then(|i| raw.get(i)) {
            Some(r) => out.extend_from_slice(r.get().as_bytes()),
            // The models serialize without failing (string keys only).
            None => {
                let _ = serde_json::to_writer(&mut out, v);
            }
        }
    }
    out.push(b']');
    String::from_utf8(out).unwrap_or_default()
}

fn empty_anthropic() -> anthropic::bridge::Bridged {
    anthropic::bridge::Bridged {
        messages: Vec::new(),
        origins: Vec::new(),
    }
}

fn empty_responses() -> responses::bridge::Bridged {
    responses::bridge::Bridged {
        messages: Vec::new(),
        origins: Vec::new(),
    }
}

/// Parses `items[from..]` as Anthropic messages onto `messages`.
fn push_messages(
    messages: &mut Vec<anthropic::Message>,
    items: &[&RawValue],
    from: usize,
) -> Result<(), FormatError> {
    messages.reserve(items.len().saturating_sub(from));
    for (index, raw) in items.iter().enumerate().skip(from) {
        let at = |error| FormatError::At {
            what: "message",
            index,
            error: Box::new(error),
        };
        let value: Value =
            serde_json::from_str(raw.get()).map_err(|e| at(FormatError::Json(e.to_string())))?;
        messages.push(anthropic::Message::from_value(value).map_err(at)?);
    }
    Ok(())
}

/// Parses `items[from..]` as Responses input items onto `list`.
fn push_items(
    list: &mut Vec<responses::Item>,
    items: &[&RawValue],
    from: usize,
) -> Result<(), FormatError> {
    list.reserve(items.len().saturating_sub(from));
    for (index, raw) in items.iter().enumerate().skip(from) {
        let at = |error| FormatError::At {
            what: "input item",
            index,
            error: Box::new(error),
        };
        let value: Value =
            serde_json::from_str(raw.get()).map_err(|e| at(FormatError::Json(e.to_string())))?;
        match value {
            Value::Object(map) => list.push(responses::Item::from_map(map)),
            other => {
                return Err(at(FormatError::NotAnObject {
                    found: crate::message::json_type(&other),
                }));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::message::Role;

    const CLAUDE: &str = r#"{"model":"claude","max_tokens":1024,"system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"read the files"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"sig"},{"type":"tool_use","id":"tu_1","name":"Bash","input":{"command":"cat a.txt"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":"alpha"},{"type":"future_block","x":1}]},{"role":"assistant","content":[{"type":"text","text":"ok"}]},{"role":"user","content":[{"type":"text","text":"next","cache_control":{"type":"ephemeral"}}]}],"stream":true}"#;

    #[test]
    fn unchanged_output_replaces_nothing() {
        let r = FrontRequest::parse(FrontKind::Anthropic, CLAUDE).unwrap();
        assert!(r.stream());
        assert_eq!(r.rebuild(r.chat()).unwrap(), Rebuilt::default());
    }

    #[test]
    fn a_summary_replaces_the_span_and_gets_the_prefix_breakpoint() {
        let r = FrontRequest::parse(FrontKind::Anthropic, CLAUDE).unwrap();
        let chat = r.chat();
        // system, summary, the last assistant and user turns.
        let summary = crate::compressor::wrap_summary("the files were read");
        let mut out = vec![chat[0].clone()];
        out.push(Message::new(
            Role::User,
            crate::message::Content::Text(summary.clone()),
        ));
        out.extend_from_slice(&chat[chat.len() - 2..]);
        let rebuilt = r.rebuild(&out).unwrap();
        assert!(rebuilt.marked_prefix, "{rebuilt:?}");
        let (name, messages) = &rebuilt.fields[0];
        assert_eq!(*name, "messages");
        let v: Value = serde_json::from_str(messages).unwrap();
        assert_eq!(v[0]["content"][0]["text"], summary.as_str());
        assert_eq!(v[0]["content"][0]["cache_control"]["type"], "ephemeral");
        // The client's own breakpoint on the newest message stays.
        assert!(messages.ends_with(
            r#"{"role":"user","content":[{"type":"text","text":"next","cache_control":{"type":"ephemeral"}}]}]"#
        ));
    }

    #[test]
    fn a_rebuild_that_breaks_a_rule_is_refused() {
        let r = FrontRequest::parse(FrontKind::Anthropic, CLAUDE).unwrap();
        let chat = r.chat();
        // Dropping the tool result leaves the tool_use unanswered.
        let out: Vec<Message> = chat
            .iter()
            .filter(|m| !m.is_tool_result())
            .cloned()
            .collect();
        assert!(r.rebuild(&out).is_err());
    }

    #[test]
    fn responses_previous_response_id_is_unmanaged() {
        let r = FrontRequest::parse(
            FrontKind::Responses,
            r#"{"model":"m","previous_response_id":"resp_1","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.unmanaged(), Some(Unmanaged::ServerState));
        let r = FrontRequest::parse(FrontKind::Responses, r#"{"model":"m","input":"hi"}"#).unwrap();
        assert_eq!(r.unmanaged(), None);
        assert!(FrontRequest::parse(FrontKind::Responses, r#"{"model":"m"}"#).is_err());
    }

    /// A body's top-level fields as raw text, in order (what a proxy's
    /// body splitter hands over).
    fn fields(text: &str) -> Vec<(String, Box<RawValue>)> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Vec<(String, Box<RawValue>)>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(e) = map.next_entry()? {
                    out.push(e);
                }
                Ok(out)
            }
        }
        use serde::Deserializer;
        serde_json::Deserializer::from_str(text)
            .deserialize_map(V)
            .unwrap()
    }

    fn borrowed(f: &[(String, Box<RawValue>)]) -> Vec<(&str, &RawValue)> {
        f.iter().map(|(k, v)| (k.as_str(), v.as_ref())).collect()
    }

    fn texts(raws: &[Box<RawValue>]) -> Vec<&str> {
        raws.iter().map(|r| r.get()).collect()
    }

    /// A body with its conversation written item by item (`pretty`: the
    /// item at that index indented, as another encoder would).
    fn body(head: &str, field: &str, items: &[Value], pretty: Option<usize>) -> String {
        let items: Vec<String> = items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if Some(i) == pretty {
                    serde_json::to_string_pretty(v).unwrap()
                } else {
                    v.to_string()
                }
            })
            .collect();
        format!(
            r#"{{{head},"{field}":[{}],"stream":false}}"#,
            items.join(",")
        )
    }

    /// Reads each body through one cache and checks the result against a
    /// whole parse: the same chat view and chat JSON, the same rebuild
    /// (digesting every tool result), the client's bytes spliced in.
    fn check_sequence(kind: FrontKind, bodies: &[String]) {
        let mut cache = FrontCache::default();
        for (n, text) in bodies.iter().enumerate() {
            let f = fields(text);
            let f = borrowed(&f);
            let items = split_items(kind, &f);
            let mut front =
                FrontRequest::parse_parts(kind, &f, items.as_deref(), &mut cache).unwrap();
            let whole = FrontRequest::parse(kind, text).unwrap();
            assert_eq!(front.chat(), whole.chat(), "body {n}: chat view");
            assert_eq!(
                texts(front.chat_json()),
                texts(whole.chat_json()),
                "body {n}: chat JSON"
            );
            let digested: Vec<Message> = whole
                .chat()
                .iter()
                .map(|m| {
                    let mut m = m.clone();
                    if m.is_tool_result() {
                        m.content = crate::message::Content::Text("[digest]".into());
                    }
                    m
                })
                .collect();
            for output in [whole.chat().to_vec(), digested] {
                let expected = whole.rebuild(&output).unwrap();
                let spliced = front
                    .rebuild_with(&output, items.as_deref(), output.len())
                    .unwrap();
                if items.is_some() && !expected.fields.is_empty() {
                    assert!(!front.memo.is_empty(), "body {n}: rebuilt in place");
                }
                assert_eq!(spliced.fields.len(), expected.fields.len(), "body {n}");
                for ((k1, v1), (k2, v2)) in spliced.fields.iter().zip(&expected.fields) {
                    assert_eq!(k1, k2);
                    let a: Value = serde_json::from_str(v1).unwrap();
                    let b: Value = serde_json::from_str(v2).unwrap();
                    assert_eq!(a, b, "body {n}: field {k1}");
                    // Every item the rebuild kept whole is the client's text.
                    for raw in items.iter().flatten() {
                        let v: Value = serde_json::from_str(raw.get()).unwrap();
                        if b.as_array().is_some_and(|list| list.contains(&v)) {
                            assert!(v1.contains(raw.get()), "body {n}: {} spliced", raw.get());
                        }
                    }
                }
            }
            cache.keep(front);
            assert_eq!(cache.len(), items.map_or(0, |i| i.len()));
        }
    }

    #[test]
    fn anthropic_cache_reads_only_new_messages_and_never_reuses_other_bytes() {
        let head = r#""model":"claude","max_tokens":1024,"system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}]"#;
        let turn = |t: usize, mark: bool| {
            let mut result = json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("tu_{t}"), "content": format!("output {t}")},
                {"type": "future_block", "n": t}]});
            if mark {
                result["content"][0]["cache_control"] = json!({"type": "ephemeral"});
            }
            vec![
                json!({"role": "assistant", "content": [
                    {"type": "thinking", "thinking": format!("think {t}"), "signature": format!("sig{t}")},
                    {"type": "tool_use", "id": format!("tu_{t}"), "name": "Bash", "input": {"command": format!("cat {t}")}}]}),
                result,
            ]
        };
        let conversation = |turns: usize| {
            let mut items =
                vec![json!({"role": "user", "content": [{"type": "text", "text": "fix it"}]})];
            for t in 0..turns {
                items.extend(turn(t, t + 1 == turns));
            }
            items
        };
        let mut edited = conversation(4);
        edited[2]["content"][0]["content"] = json!("output 0, edited");
        let bodies = vec![
            body(head, "messages", &conversation(3), None),
            // The breakpoint moved to the newest message.
            body(head, "messages", &conversation(4), None),
            // An old message re-encoded: the same JSON, other bytes.
            body(head, "messages", &conversation(4), Some(1)),
            body(head, "messages", &edited, None),
            body(head, "messages", &conversation(2), None),
            body(
                &head.replace("Claude Code.", "Claude Code, again."),
                "messages",
                &conversation(3),
                None,
            ),
            body(head, "messages", &conversation(3), None),
        ];
        check_sequence(FrontKind::Anthropic, &bodies);
    }

    #[test]
    fn responses_cache_reconverts_the_groups_new_items_join() {
        let head = r#""model":"gpt","instructions":"You are Codex.","store":false"#;
        let user = |t: &str| json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]});
        let reasoning = |n: usize| json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": format!("plan {n}")}], "encrypted_content": format!("enc{n}")});
        let call = |id: &str| json!({"type": "function_call", "call_id": id, "name": "shell", "arguments": format!("{{\"cmd\":\"{id}\"}}")});
        let output = |id: &str, text: &str| json!({"type": "function_call_output", "call_id": id, "output": text});
        let search = json!({"type": "web_search_call", "id": "ws1", "status": "completed"});
        let said = json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]});
        let b1 = vec![user("task"), reasoning(1), call("c1")];
        let mut b2 = b1.clone();
        // The run of calls grows: c1 and c2 are one assistant turn.
        b2.push(call("c2"));
        let mut b3 = b2.clone();
        b3.extend([
            output("c1", "one"),
            output("c2", "two"),
            search.clone(),
            said.clone(),
            reasoning(2),
        ]);
        let mut b4 = b3.clone();
        b4.extend([call("c3"), output("c3", "three"), user("next")]);
        let mut b6 = b4.clone();
        b6[4] = output("c1", "one, edited");
        let mut b8 = b4.clone();
        // A server item first travels with the message after it.
        b8.insert(0, search.clone());
        let bodies = vec![
            body(head, "input", &b1, None),
            body(head, "input", &b2, None),
            body(head, "input", &b3, None),
            body(head, "input", &b4, None),
            body(head, "input", &b4, Some(0)),
            body(head, "input", &b6, None),
            body(head, "input", &b2, None),
            body(head, "input", &b8, None),
            body(head, "input", &b4, None),
            format!(r#"{{{head},"input":"just text"}}"#),
            body(head, "input", &b4, None),
        ];
        check_sequence(FrontKind::Responses, &bodies);
    }

    #[test]
    fn unchanged_messages_go_out_as_the_clients_bytes() {
        let items = [
            json!({"role": "user", "content": "read a"}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a"}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "long text"}]}),
            json!({"role": "assistant", "content": "done"}),
        ];
        let text = body(r#""model":"claude""#, "messages", &items, Some(1));
        let f = fields(&text);
        let f = borrowed(&f);
        let raw = split_items(FrontKind::Anthropic, &f).unwrap();
        let mut front = FrontRequest::parse_parts(
            FrontKind::Anthropic,
            &f,
            Some(&raw),
            &mut FrontCache::default(),
        )
        .unwrap();
        let mut out = front.chat().to_vec();
        out[2].content = crate::message::Content::Text("[digest]".into());
        let rebuilt = front.rebuild_with(&out, Some(&raw), out.len()).unwrap();
        let messages = &rebuilt.fields[0].1;
        assert!(
            messages.contains(raw[1].get()),
            "the indented message as it came"
        );
        assert!(raw[1].get().contains('\n'));
        assert!(messages.contains("[digest]"));
        assert!(!messages.contains("long text"));
        // A conversation of another length is not spliced.
        let other = front
            .rebuild_with(&out, Some(&raw[..3]), out.len())
            .unwrap();
        assert_eq!(other, front.rebuild(&out).unwrap());
    }
}
