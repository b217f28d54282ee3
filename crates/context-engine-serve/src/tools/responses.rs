//! Engine tools on the Responses front (Codex): offered and resolved in the
//! proxy by the rules of chat completions ([`super`]), in the Responses
//! API's own format.
//!
//! - **Offered** when the client did not pin `tool_choice` (absent or
//!   `"auto"`) and sends its conversation as an `input` array: the
//!   engine's schemas, as `{"type":"function", name, description,
//!   parameters}`, are appended to the client's `tools` text. A name the
//!   client already uses is not offered.
//! - **Resolved**: an answer whose calls all name engine tools is answered
//!   here (`function_call_output` items) and the request re-sent with the
//!   answer's output items and the outputs appended to `input`, for at
//!   most `max_tool_rounds` rounds, the last without the engine tools.
//!   Reasoning items go back as they came (with their encrypted content,
//!   which a stateless client such as Codex asks for). The exchange is not
//!   added to the managed history.
//! - **Mixed** output: the client's calls (`function_call`,
//!   `custom_tool_call`, `local_shell_call`, …) reach it unchanged and the
//!   engine's are removed, with the reasoning items right before each
//!   (a reasoning item sent back without the item it led to is refused);
//!   an answer left with no item gets a one-line assistant message.
//! - **Streams** ([`StreamRounds`]): events pass through until a
//!   `response.output_item.added` opens an engine call; from there the
//!   round's events are held. At `response.completed` the held calls are
//!   resolved and the continuation's events are relayed as the rest of the
//!   same response: its `response.created` and `response.in_progress` are
//!   dropped, its output indices follow the items the client already has,
//!   its sequence numbers follow the last one sent, its response objects
//!   carry the first round's id, and its `response.completed` lists every
//!   item the client received. Otherwise the held events go out with the
//!   engine's items removed and the later indices closed up.

use std::collections::BTreeSet;

use bytes::Bytes;
use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::{
    Answers, Calls, EngineTools, Events, HeldEvent, Resend, Rounds, answer, finish_events, list_of,
    offer, push_events, replay_held, request_with_list,
};
use crate::body::ChatBody;
use crate::identity::Reader;
use crate::session::Managed;
use crate::sse::data_of;

/// What an answer left with no item says to the client.
const NOTHING_LEFT: &str = "(The context tool is not available on this turn.)";

/// Output items the provider runs itself: not calls the client answers.
const SERVER_CALLS: &[&str] = &[
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
];

/// Whether `item` is a `function_call` naming an engine tool.
fn is_engine_call(tools: &EngineTools, item: &Value) -> bool {
    kind_of(item) == "function_call"
        && item
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| tools.is_engine(n))
}

/// Whether `item` is a call the client has to answer.
fn is_client_call(tools: &EngineTools, item: &Value) -> bool {
    let kind = kind_of(item);
    kind.ends_with("_call") && !SERVER_CALLS.contains(&kind) && !is_engine_call(tools, item)
}

fn kind_of(item: &Value) -> &str {
    item.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The engine's tools to offer with this Responses request, if any.
pub fn schemas(reader: Reader, m: &Managed, body: &ChatBody<'_>) -> Option<EngineTools> {
    if let Some(choice) = body.field("tool_choice")
        && choice.get().trim() != "\"auto\""
    {
        return None;
    }
    if !body.field("input")?.get().trim_start().starts_with('[') {
        return None;
    }
    offer(reader, m, body, responses_schema)
}

/// A chat-completions tool schema in the Responses format.
fn responses_schema(chat: &Value) -> Option<Value> {
    let f = chat.get("function")?;
    let name = f.get("name")?.as_str()?;
    let mut tool = json!({
        "type": "function",
        "name": name,
        "parameters": f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"})),
    });
    if let Some(d) = f.get("description").and_then(Value::as_str) {
        tool["description"] = Value::String(d.to_owned());
    }
    Some(tool)
}

/// The input items of one resolved round: the answer's output items as
/// they came, then the engine's output for each call.
fn exchange_of(guard: &mut Option<Managed>, output: &[Value]) -> Vec<String> {
    let mut items: Vec<String> = output.iter().map(Value::to_string).collect();
    for call in output.iter().filter(|i| kind_of(i) == "function_call") {
        let id = call
            .get("call_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
        let args = call
            .get("arguments")
            .and_then(Value::as_str)
            .unwrap_or("{}");
        let result = answer(guard, name, args);
        items.push(
            json!({"type": "function_call_output", "call_id": id, "output": result}).to_string(),
        );
    }
    items
}

/// The request of the next round.
fn next_body(
    body: &ChatBody<'_>,
    overrides: &[(&str, String)],
    exchange: &[String],
    tools: &str,
) -> Bytes {
    let input = list_of(body, overrides, "input");
    request_with_list(body, overrides, ("input", &input), exchange, tools)
}

/// A message item saying the engine's call was dropped.
fn note_item() -> Value {
    json!({"type": "message", "id": "msg_ctx_note", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": NOTHING_LEFT, "annotations": []}]})
}

/// The Responses API's answers.
pub(crate) struct ResponsesAnswers<'a, 'b> {
    body: &'a ChatBody<'b>,
    overrides: &'a [(&'a str, String)],
    tools: &'a EngineTools,
}

fn output_of(answer: &Value) -> &[Value] {
    answer
        .get("output")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

impl Answers for ResponsesAnswers<'_, '_> {
    fn request(&self, exchange: &[String], tools: &str) -> Bytes {
        next_body(self.body, self.overrides, exchange, tools)
    }

    fn calls(&self, answer: &Value) -> Option<Calls> {
        let output = answer.get("output").and_then(Value::as_array)?;
        Some(Calls {
            engine: output
                .iter()
                .filter(|i| is_engine_call(self.tools, i))
                .count(),
            client: output
                .iter()
                .filter(|i| is_client_call(self.tools, i))
                .count(),
        })
    }

    fn exchange(&self, guard: &mut Option<Managed>, answer: &Value) -> Vec<String> {
        exchange_of(guard, output_of(answer))
    }

    /// The items before the first engine call, less the reasoning right
    /// before it (a stream holds a reasoning item until the item after it
    /// shows, and never sends one that led to an engine call).
    fn shown(&self, answer: &Value) -> Vec<Value> {
        let output = output_of(answer);
        let dropped = engine_items(self.tools, output.iter().map(Some));
        let first = dropped.first().copied().unwrap_or(output.len());
        output[..first].to_vec()
    }

    fn finish(&self, answer: &mut Value, shown: Vec<Value>) {
        let Some(items) = answer.get_mut("output").and_then(Value::as_array_mut) else {
            return;
        };
        items.splice(0..0, shown);
        let dropped = engine_items(self.tools, items.iter().map(Some));
        let mut k = 0;
        items.retain(|_| {
            k += 1;
            !dropped.contains(&(k - 1))
        });
        if items.is_empty() {
            items.push(note_item());
        }
    }
}

/// The answers of a request sent with `overrides` over the client's
/// `body`, `tools` offered.
pub(crate) fn answers<'a, 'b>(
    body: &'a ChatBody<'b>,
    overrides: &'a [(&'a str, String)],
    tools: &'a EngineTools,
) -> ResponsesAnswers<'a, 'b> {
    ResponsesAnswers {
        body,
        overrides,
        tools,
    }
}

/// A stream's engine-tool rounds on the Responses front (see the module
/// docs).
#[derive(Debug)]
pub struct StreamRounds {
    /// The tools offered.
    pub tools: EngineTools,
    resend: Resend,
    events: Events,
    /// The client's output index of this round's item 0.
    offset: usize,
    /// This round's items, by output index (complete once done).
    items: Vec<Option<Value>>,
    hold_from: Option<usize>,
    /// The hold is of reasoning items only so far: the first item after
    /// them decides whether they reach the client (see [`Self::event`]).
    tentative: bool,
    held: Vec<Vec<u8>>,
    ended: bool,
    errored: bool,
    /// Items the client has been told of.
    sent: usize,
    /// The complete items the client received, in its order.
    delivered: Vec<Value>,
    /// The first round's response id.
    first_id: Option<String>,
    /// The next sequence number the client expects.
    seq: u64,
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
            resend: Resend::new(body, overrides, "input", max_rounds),
            events: Events::default(),
            offset: 0,
            items: Vec::new(),
            hold_from: None,
            tentative: false,
            held: Vec::new(),
            ended: false,
            errored: false,
            sent: 0,
            delivered: Vec::new(),
            first_id: None,
            seq: 0,
        }
    }

    fn round_items(&self) -> impl Iterator<Item = &Value> {
        self.items.iter().flatten()
    }

    /// A message item saying the engine's call was dropped, for a response
    /// that would reach the client with no item.
    fn note(&mut self, out: &mut Vec<u8>) {
        let item = note_item();
        let index = self.sent;
        for kind in ["response.output_item.added", "response.output_item.done"] {
            let mut v = json!({"type": kind, "output_index": index, "item": item});
            self.write(kind, &mut v, Some(index), out);
        }
    }

    /// Writes an event of this round's item `round_index` (if it is about
    /// one) to the client, renumbered.
    fn forward(
        &mut self,
        kind: &str,
        v: &mut Value,
        round_index: Option<usize>,
        out: &mut Vec<u8>,
    ) {
        self.write(kind, v, round_index.map(|i| self.offset + i), out);
    }

    /// Writes `v` with the client's output index, the next sequence
    /// number and the first round's response id; a completed response
    /// lists every item the client received.
    fn write(&mut self, kind: &str, v: &mut Value, client_index: Option<usize>, out: &mut Vec<u8>) {
        if let Some(i) = client_index {
            v["output_index"] = json!(i);
            self.sent = self.sent.max(i + 1);
        }
        if kind == "response.output_item.done"
            && let Some(item) = v.get("item")
        {
            self.delivered.push(item.clone());
        }
        if v.get("sequence_number").is_some() {
            v["sequence_number"] = json!(self.seq);
            self.seq += 1;
        }
        if let Some(response) = v.get_mut("response").and_then(Value::as_object_mut) {
            if let Some(id) = &self.first_id {
                response.insert("id".into(), Value::String(id.clone()));
            }
            if is_terminal(kind) && response.contains_key("output") {
                response.insert("output".into(), Value::Array(self.delivered.clone()));
            }
        }
        out.extend(format!("event: {kind}\ndata: {v}\n\n").into_bytes());
    }

    /// Reads one event. A reasoning item is held until the item after it
    /// shows: the API refuses a reasoning item sent back without the item
    /// that followed it, so one followed by an engine call must not reach
    /// the client (it goes upstream with the call in the re-send); one
    /// followed by anything else is released then, as it came.
    fn event(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        let data = data_of(raw);
        let Ok(e) = serde_json::from_slice::<Event<'_>>(&data) else {
            if self.holding() {
                self.held.push(raw.to_vec());
            } else {
                out.extend_from_slice(raw);
            }
            return;
        };
        let index = e.output_index;
        // Only items are read whole (text deltas, most of a stream, are not).
        let item: Option<Value> = e.item.and_then(|i| serde_json::from_str(i.get()).ok());
        match e.kind.as_ref() {
            // A continuation's events are the rest of the client's response.
            "response.created" | "response.in_progress" if self.resend.continuing() => return,
            "response.created" => {
                self.first_id = e.response.and_then(|r| r.id).map(Cow::into_owned);
            }
            "response.output_item.added" | "response.output_item.done" => {
                if let (Some(i), Some(item)) = (index, &item) {
                    let engine = is_engine_call(&self.tools, item);
                    let reasoning = kind_of(item) == "reasoning";
                    if self.hold_from.is_none() && (engine || reasoning) {
                        self.hold_from = Some(i);
                        self.tentative = !engine;
                    } else if self.tentative && !reasoning {
                        if engine {
                            self.tentative = false;
                        } else {
                            self.tentative = false;
                            let released = self.release_held();
                            out.extend(released);
                        }
                    }
                    if self.items.len() <= i {
                        self.items.resize_with(i + 1, || None);
                    }
                    self.items[i] = Some(item.clone());
                }
            }
            "response.failed" | "error" => {
                self.ended = true;
                self.errored = true;
            }
            k if is_terminal(k) => self.ended = true,
            _ => {}
        }
        if self.holding() {
            self.held.push(raw.to_vec());
            return;
        }
        if !self.resend.continuing() {
            // The first round goes out as it came.
            if let Some(i) = index {
                self.sent = self.sent.max(i + 1);
            }
            if e.kind == "response.output_item.done"
                && let Some(item) = item
            {
                self.delivered.push(item);
            }
            if let Some(n) = e.sequence_number {
                self.seq = self.seq.max(n + 1);
            }
            out.extend_from_slice(raw);
            return;
        }
        if let Ok(mut v) = serde_json::from_slice::<Value>(&data) {
            let kind = e.kind.into_owned();
            self.forward(&kind, &mut v, index, out);
        }
    }
}

/// The parts of an event the rounds read (borrowed: most events are
/// small text deltas, read once).
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Cow<'a, str>,
    output_index: Option<usize>,
    sequence_number: Option<u64>,
    #[serde(borrow)]
    item: Option<&'a RawValue>,
    #[serde(borrow)]
    response: Option<ResponseId<'a>>,
}

#[derive(Deserialize)]
struct ResponseId<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
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
        self.hold_from.is_some()
            && !self.tentative
            && self.ended
            && !self.errored
            && self.resend.may_resolve()
            && !self.round_items().any(|i| is_client_call(&self.tools, i))
    }

    fn next_request(&mut self, guard: &mut Option<Managed>) -> Bytes {
        let round: Vec<Value> = self.round_items().cloned().collect();
        let items = exchange_of(guard, &round);
        self.offset = self.sent;
        self.items.clear();
        self.hold_from = None;
        self.tentative = false;
        self.held.clear();
        self.events.clear();
        self.ended = false;
        self.resend.next(items, &self.tools.tools_json)
    }

    fn release_held(&mut self) -> Vec<u8> {
        self.tentative = false;
        let Some(from) = self.hold_from.take() else {
            return Vec::new();
        };
        let removed: BTreeSet<usize> =
            engine_items(&self.tools, self.items.iter().map(Option::as_ref))
                .into_iter()
                .filter(|&k| k >= from)
                .collect();
        let held = std::mem::take(&mut self.held);
        replay_held(held, "output_index", &removed, |e, out| match e {
            HeldEvent::Indexed {
                kind,
                mut event,
                index,
            } => self.forward(&kind, &mut event, Some(index), out),
            HeldEvent::Whole {
                kind, mut event, ..
            } => {
                if is_terminal(&kind) && self.sent == 0 {
                    self.note(out);
                }
                self.forward(&kind, &mut event, None, out);
            }
            HeldEvent::Raw(raw) => out.extend_from_slice(raw),
        })
    }

    fn fail(&mut self, message: &str) -> Vec<u8> {
        self.hold_from = None;
        self.tentative = false;
        self.held.clear();
        let mut out = Vec::new();
        for (kind, mut event) in crate::cut::responses_events(message) {
            self.write(kind, &mut event, None, &mut out);
        }
        out
    }
}

/// The indices of the items a client must not get: the engine's calls,
/// and the reasoning items right before one (a reasoning item is valid in
/// a later request only followed by the item it led to).
fn engine_items<'a>(
    tools: &EngineTools,
    items: impl Iterator<Item = Option<&'a Value>>,
) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    let mut reasoning = Vec::new();
    for (k, item) in items.enumerate() {
        match item {
            Some(i) if is_engine_call(tools, i) => {
                out.insert(k);
                out.extend(reasoning.drain(..));
            }
            Some(i) if kind_of(i) == "reasoning" => reasoning.push(k),
            _ => reasoning.clear(),
        }
    }
    out
}

/// The events that end a response.
fn is_terminal(kind: &str) -> bool {
    matches!(
        kind,
        "response.completed" | "response.incomplete" | "response.failed"
    )
}

#[cfg(test)]
mod tests;
