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

mod rebuild;

use std::collections::HashMap;
use std::fmt;

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::{Xxh3Default, xxh3_128};

use crate::anthropic::{self, FormatError};
use crate::message::Message;
use crate::responses;

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
mod tests;
