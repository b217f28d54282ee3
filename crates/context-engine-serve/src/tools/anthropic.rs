//! Engine tools on the Anthropic Messages front (Claude Code): offered and
//! resolved in the proxy by the rules of chat completions ([`super`]), in
//! Anthropic's own format.
//!
//! - **Offered** when the client did not pin `tool_choice` (absent or
//!   `{"type":"auto"}`): the engine's schemas, as `{name, description,
//!   input_schema}`, are appended to the client's `tools` text, whose bytes
//!   (cache breakpoints included) stay as they came. A name the client
//!   already uses is not offered.
//! - **Resolved**: an answer whose `tool_use` blocks all name engine tools
//!   is answered here (`tool_result` blocks in a user message) and the
//!   request re-sent with the exchange appended, for at most
//!   `max_tool_rounds` rounds; the last round goes out without the engine
//!   tools. The exchange is not added to the managed history: the client's
//!   history does not contain it.
//! - **Mixed** blocks: the client's `tool_use` blocks reach it unchanged
//!   and the engine's are removed (the client never gets a call it cannot
//!   run); an answer left without any `tool_use` ends as `end_turn`, and
//!   one left empty gets a one-line text block, since the API refuses an
//!   empty assistant message on the client's next request.
//! - **Streams** ([`StreamRounds`]): events pass through at once until a
//!   `content_block_start` opens an engine `tool_use` block; from there the
//!   round's events are held. At `message_stop` the held calls are resolved
//!   and the continuation's events are relayed as the rest of the same
//!   message: its `message_start` is dropped and its block indices follow
//!   the blocks the client already has. Otherwise the held events go out
//!   with the engine blocks removed and the later indices closed up.
//!   Thinking blocks keep their signatures in the exchange, as the API
//!   requires of an assistant turn that calls a tool.

use std::collections::BTreeSet;

use bytes::Bytes;
use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::{
    Answers, Calls, EngineTools, Events, HeldEvent, Resend, Rounds, answer, finish_events,
    messages_of, offer, push_events, replay_held, request_with,
};
use crate::body::ChatBody;
use crate::identity::Reader;
use crate::session::Managed;
use crate::sse::data_of;

/// What an answer left with no block says to the client.
const NOTHING_LEFT: &str = "(The context tool is not available on this turn.)";

/// Whether `block` is a `tool_use` block naming an engine tool.
fn is_engine_call(tools: &EngineTools, block: &Value) -> bool {
    is_tool_use(block) && block_name(block).is_some_and(|n| tools.is_engine(n))
}

/// The engine's tools to offer with this Anthropic request, if any.
pub fn schemas(reader: Reader, m: &Managed, body: &ChatBody<'_>) -> Option<EngineTools> {
    if let Some(choice) = body.field("tool_choice") {
        let auto = serde_json::from_str::<Value>(choice.get())
            .ok()
            .is_some_and(|c| c.get("type").and_then(Value::as_str) == Some("auto"));
        if !auto {
            return None;
        }
    }
    offer(reader, m, body, anthropic_schema)
}

/// A chat-completions tool schema in Anthropic's format.
fn anthropic_schema(chat: &Value) -> Option<Value> {
    let f = chat.get("function")?;
    let name = f.get("name")?.as_str()?;
    let mut tool = json!({
        "name": name,
        "input_schema": f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"})),
    });
    if let Some(d) = f.get("description").and_then(Value::as_str) {
        tool["description"] = Value::String(d.to_owned());
    }
    Some(tool)
}

fn is_tool_use(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_use")
}

fn block_name(block: &Value) -> Option<&str> {
    block.get("name").and_then(Value::as_str)
}

/// The exchange of one resolved round: the assistant's turn as the model
/// wrote it, and a user turn with the engine's `tool_result` for each call.
fn exchange_of(guard: &mut Option<Managed>, content: &[Value]) -> [String; 2] {
    let results: Vec<Value> = content
        .iter()
        .filter(|b| is_tool_use(b))
        .map(|call| {
            let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
            let name = block_name(call).unwrap_or_default();
            let input = call.get("input").cloned().unwrap_or_else(|| json!({}));
            let result = answer(guard, name, &input.to_string());
            json!({"type": "tool_result", "tool_use_id": id, "content": result})
        })
        .collect();
    [
        json!({"role": "assistant", "content": content}).to_string(),
        json!({"role": "user", "content": results}).to_string(),
    ]
}

/// The Messages API's answers.
pub(crate) struct MessagesAnswers<'a, 'b> {
    body: &'a ChatBody<'b>,
    overrides: &'a [(&'a str, String)],
    messages: String,
    tools: &'a EngineTools,
}

impl Answers for MessagesAnswers<'_, '_> {
    fn request(&self, exchange: &[String], tools: &str) -> Bytes {
        request_with(self.body, self.overrides, &self.messages, exchange, tools)
    }

    fn calls(&self, answer: &Value) -> Option<Calls> {
        let content = answer.get("content").and_then(Value::as_array)?;
        let all = content.iter().filter(|b| is_tool_use(b)).count();
        let engine = content
            .iter()
            .filter(|b| is_engine_call(self.tools, b))
            .count();
        Some(Calls {
            engine,
            client: all - engine,
        })
    }

    fn exchange(&self, guard: &mut Option<Managed>, answer: &Value) -> Vec<String> {
        let content = answer
            .get("content")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        exchange_of(guard, content).into()
    }

    /// The blocks before the first engine call (a stream holds from there).
    fn shown(&self, answer: &Value) -> Vec<Value> {
        let content = answer.get("content").and_then(Value::as_array);
        content
            .into_iter()
            .flatten()
            .take_while(|b| !is_engine_call(self.tools, b))
            .cloned()
            .collect()
    }

    fn finish(&self, answer: &mut Value, shown: Vec<Value>) {
        if let Some(content) = answer.get_mut("content").and_then(Value::as_array_mut) {
            content.splice(0..0, shown);
        }
        strip_engine_calls(answer, self.tools);
    }
}

/// The answers of a request sent with `overrides` over the client's
/// `body`, `tools` offered.
pub(crate) fn answers<'a, 'b>(
    body: &'a ChatBody<'b>,
    overrides: &'a [(&'a str, String)],
    tools: &'a EngineTools,
) -> MessagesAnswers<'a, 'b> {
    MessagesAnswers {
        body,
        overrides,
        messages: messages_of(body, overrides),
        tools,
    }
}

/// Removes the engine's `tool_use` blocks from a Messages answer.
fn strip_engine_calls(answer: &mut Value, tools: &EngineTools) {
    let Some(content) = answer.get_mut("content").and_then(Value::as_array_mut) else {
        return;
    };
    content.retain(|b| !is_engine_call(tools, b));
    let calls_left = content.iter().any(is_tool_use);
    if content.is_empty() {
        content.push(json!({"type": "text", "text": NOTHING_LEFT}));
    }
    if !calls_left && answer.get("stop_reason").and_then(Value::as_str) == Some("tool_use") {
        answer["stop_reason"] = Value::String("end_turn".into());
    }
}

/// One content block of a streamed answer, rebuilt from its events.
#[derive(Debug)]
struct Block {
    /// As `content_block_start` opened it.
    value: Value,
    /// Streamed text, thinking and signature (appended in place: a long
    /// answer streams thousands of deltas).
    text: String,
    thinking: String,
    signature: String,
    citations: Vec<Value>,
    /// A `tool_use` block's input as streamed (`input_json_delta`).
    input: String,
}

/// The parts of an event the rounds read (borrowed: most events are
/// small text deltas, read once).
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Cow<'a, str>,
    index: Option<usize>,
    #[serde(borrow)]
    content_block: Option<&'a RawValue>,
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
}

/// A `content_block_delta`'s delta (`message_delta`'s has no `type`).
#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(borrow)]
    partial_json: Option<Cow<'a, str>>,
    citation: Option<Value>,
}

impl Block {
    fn new(value: Value) -> Block {
        Block {
            value,
            text: String::new(),
            thinking: String::new(),
            signature: String::new(),
            citations: Vec::new(),
            input: String::new(),
        }
    }

    fn delta(&mut self, delta: Delta<'_>) {
        let (to, part) = match delta.kind.as_ref() {
            "text_delta" => (&mut self.text, delta.text),
            "thinking_delta" => (&mut self.thinking, delta.thinking),
            "signature_delta" => (&mut self.signature, delta.signature),
            "input_json_delta" => (&mut self.input, delta.partial_json),
            "citations_delta" => {
                self.citations.extend(delta.citation);
                return;
            }
            _ => return,
        };
        to.push_str(part.as_deref().unwrap_or_default());
    }

    /// The block as the model wrote it: what it opened with, plus what
    /// streamed.
    fn finished(&self) -> Value {
        let mut value = self.value.clone();
        for (field, part) in [
            ("text", &self.text),
            ("thinking", &self.thinking),
            ("signature", &self.signature),
        ] {
            if !part.is_empty() {
                let start = value.get(field).and_then(Value::as_str).unwrap_or("");
                value[field] = Value::String(format!("{start}{part}"));
            }
        }
        if !self.citations.is_empty() {
            let mut all = value
                .get("citations")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            all.extend(self.citations.iter().cloned());
            value["citations"] = Value::Array(all);
        }
        if is_tool_use(&value)
            && !self.input.trim().is_empty()
            && let Ok(input) = serde_json::from_str::<Value>(&self.input)
        {
            value["input"] = input;
        }
        value
    }
}

/// A stream's engine-tool rounds on the Anthropic front (see the module
/// docs): reads the events of each round's stream, holds a round from its
/// first engine call, and writes what the client gets.
#[derive(Debug)]
pub struct StreamRounds {
    /// The tools offered.
    pub tools: EngineTools,
    resend: Resend,
    events: Events,
    /// The client's index of this round's block 0.
    offset: usize,
    /// This round's blocks, by index.
    blocks: Vec<Option<Block>>,
    /// The index of the round's first engine call: held from there.
    hold_from: Option<usize>,
    held: Vec<Vec<u8>>,
    /// `message_stop` (or `error`) went by in this round.
    ended: bool,
    errored: bool,
    /// Blocks the client has received.
    sent: usize,
}

impl StreamRounds {
    /// The rounds of a stream sent with `overrides` over the client's
    /// `body`, at most `max_rounds`.
    pub fn new(
        tools: EngineTools,
        body: Bytes,
        overrides: Vec<(&'static str, String)>,
        max_rounds: u32,
    ) -> StreamRounds {
        StreamRounds {
            tools,
            resend: Resend::new(body, overrides, "messages", max_rounds),
            events: Events::default(),
            offset: 0,
            blocks: Vec::new(),
            hold_from: None,
            held: Vec::new(),
            ended: false,
            errored: false,
            sent: 0,
        }
    }

    /// A text block saying the engine's call was dropped, for an answer
    /// that would reach the client with no block at all.
    fn note_block(&mut self, out: &mut Vec<u8>) {
        let index = self.sent;
        self.sent += 1;
        let events = [
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": NOTHING_LEFT}}),
            json!({"type": "content_block_stop", "index": index}),
        ];
        for e in events {
            let kind = e["type"].as_str().unwrap_or_default().to_owned();
            out.extend(encode(&kind, &e));
        }
    }

    /// Writes an event of this round's block `round_index` to the client
    /// at the client's index for it.
    fn forward(&mut self, kind: &str, v: &mut Value, round_index: usize, out: &mut Vec<u8>) {
        let client_index = self.offset + round_index;
        self.sent = self.sent.max(client_index + 1);
        v["index"] = json!(client_index);
        out.extend(encode(kind, v));
    }

    fn event(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        let data = data_of(raw);
        let Ok(e) = serde_json::from_slice::<Event<'_>>(&data) else {
            // Not an event of the API (a comment, a keep-alive).
            if self.holding() {
                self.held.push(raw.to_vec());
            } else {
                out.extend_from_slice(raw);
            }
            return;
        };
        let index = e.index;
        match e.kind.as_ref() {
            // A continuation's events are the rest of the client's message.
            "message_start" if self.resend.continuing() => return,
            "content_block_start" => {
                if let Some(i) = index {
                    let block = e
                        .content_block
                        .and_then(|b| serde_json::from_str(b.get()).ok())
                        .unwrap_or(Value::Null);
                    if self.hold_from.is_none() && is_engine_call(&self.tools, &block) {
                        self.hold_from = Some(i);
                    }
                    if self.blocks.len() <= i {
                        self.blocks.resize_with(i + 1, || None);
                    }
                    self.blocks[i] = Some(Block::new(block));
                }
            }
            "content_block_delta" => {
                if let (Some(b), Some(d)) = (self.block(index), e.delta) {
                    b.delta(d);
                }
            }
            "message_stop" => self.ended = true,
            "error" => {
                self.ended = true;
                self.errored = true;
            }
            _ => {}
        }
        if self.holding() {
            self.held.push(raw.to_vec());
            return;
        }
        match index {
            Some(i) if self.resend.continuing() => {
                if let Ok(mut v) = serde_json::from_slice::<Value>(&data) {
                    let kind = e.kind.into_owned();
                    self.forward(&kind, &mut v, i, out);
                }
            }
            Some(i) => {
                self.sent = self.sent.max(i + 1);
                out.extend_from_slice(raw);
            }
            None => out.extend_from_slice(raw),
        }
    }

    fn block(&mut self, index: Option<usize>) -> Option<&mut Block> {
        self.blocks.get_mut(index?)?.as_mut()
    }
}

impl Rounds for StreamRounds {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut events = std::mem::take(&mut self.events);
        let out = push_events(&mut events, chunk, |e, out| self.event(e, out));
        self.events = events;
        out
    }

    fn finish(&mut self) -> Vec<u8> {
        let mut events = std::mem::take(&mut self.events);
        let out = finish_events(&mut events, |e, out| self.event(e, out));
        self.events = events;
        out
    }

    fn holding(&self) -> bool {
        self.hold_from.is_some()
    }

    fn ended(&self) -> bool {
        self.ended
    }

    fn resolvable(&self) -> bool {
        let Some(from) = self.hold_from else {
            return false;
        };
        self.ended
            && !self.errored
            && self.resend.may_resolve()
            && self
                .blocks
                .iter()
                .skip(from)
                .flatten()
                .filter(|b| is_tool_use(&b.value))
                .all(|b| is_engine_call(&self.tools, &b.value))
    }

    fn next_request(&mut self, guard: &mut Option<Managed>) -> Bytes {
        let round: Vec<Value> = self.blocks.iter().flatten().map(Block::finished).collect();
        let items = exchange_of(guard, &round);
        self.offset = self.sent;
        self.blocks.clear();
        self.hold_from = None;
        self.held.clear();
        self.events.clear();
        self.ended = false;
        self.resend.next(items.into(), &self.tools.tools_json)
    }

    fn release_held(&mut self) -> Vec<u8> {
        let Some(from) = self.hold_from.take() else {
            return Vec::new();
        };
        let removed: BTreeSet<usize> = self
            .blocks
            .iter()
            .enumerate()
            .skip(from)
            .filter(|(_, b)| {
                b.as_ref()
                    .is_some_and(|b| is_engine_call(&self.tools, &b.value))
            })
            .map(|(i, _)| i)
            .collect();
        let calls_left = self
            .blocks
            .iter()
            .flatten()
            .any(|b| is_tool_use(&b.value) && !is_engine_call(&self.tools, &b.value));
        let held = std::mem::take(&mut self.held);
        replay_held(held, "index", &removed, |e, out| match e {
            HeldEvent::Indexed {
                kind,
                mut event,
                index,
            } => self.forward(&kind, &mut event, index, out),
            HeldEvent::Whole {
                kind,
                mut event,
                raw,
            } => {
                if (kind == "message_delta" || kind == "message_stop") && self.sent == 0 {
                    self.note_block(out);
                }
                if kind == "message_delta"
                    && !calls_left
                    && event.pointer("/delta/stop_reason").and_then(Value::as_str)
                        == Some("tool_use")
                {
                    event["delta"]["stop_reason"] = Value::String("end_turn".into());
                    out.extend(encode(&kind, &event));
                } else {
                    out.extend_from_slice(raw);
                }
            }
            HeldEvent::Raw(raw) => out.extend_from_slice(raw),
        })
    }

    fn fail(&mut self, message: &str) -> Vec<u8> {
        self.hold_from = None;
        self.held.clear();
        crate::cut::anthropic_event(message).to_vec()
    }
}

/// An event as Anthropic writes it.
fn encode(kind: &str, data: &Value) -> Vec<u8> {
    format!("event: {kind}\ndata: {data}\n\n").into_bytes()
}

#[cfg(test)]
mod tests;
