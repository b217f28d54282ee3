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

use serde_json::{Value, json};

use super::front::{Caller, FrontApi, FrontRounds, Seen};
use super::{EngineTools, answer, offer};
use crate::body::ChatBody;
use crate::identity::Reader;
use crate::session::Managed;

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

/// A message item saying the engine's call was dropped.
fn note_item() -> Value {
    json!({"type": "message", "id": "msg_ctx_note", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": NOTHING_LEFT, "annotations": []}]})
}

/// The Responses API to the rounds loop ([`FrontApi`]): items under
/// `output_index`, calls in call items, results in `function_call_output`
/// items; a stream numbers its events (`sequence_number`), names its
/// response (its id) and lists the response's items when it completes,
/// which the proxy keeps true across the rounds.
#[derive(Debug, Default)]
pub struct Responses {
    /// The complete items the client received, in its order.
    delivered: Vec<Value>,
    /// The first round's response id.
    first_id: Option<String>,
    /// The next sequence number the client expects.
    seq: u64,
}

/// A stream's engine-tool rounds on the Responses front (see the module
/// docs).
pub type StreamRounds = FrontRounds<Responses>;

impl FrontApi for Responses {
    const LIST: &'static str = "input";
    const INDEX: &'static str = "output_index";
    const PARTS: &'static str = "output";
    const CALLS_FROM_HOLD: bool = false;
    type Part = Value;

    /// The answer's output items as they came, then the engine's output
    /// for each call.
    fn exchange(guard: &mut Option<Managed>, output: &[Value]) -> Vec<String> {
        exchange_of(guard, output)
    }

    fn call(tools: &EngineTools, item: &Value) -> Option<Caller> {
        if is_engine_call(tools, item) {
            Some(Caller::Engine)
        } else {
            is_client_call(tools, item).then_some(Caller::Client)
        }
    }

    /// The items before the first engine call, less the reasoning right
    /// before it (a stream holds a reasoning item until the item after it
    /// shows, and never sends one that led to an engine call).
    fn shown(tools: &EngineTools, answer: &Value) -> Vec<Value> {
        let output = answer
            .get("output")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let dropped = engine_items(tools, output.iter().map(Some));
        let first = dropped.first().copied().unwrap_or(output.len());
        output[..first].to_vec()
    }

    fn finish(tools: &EngineTools, answer: &mut Value, shown: Vec<Value>) {
        let Some(items) = answer.get_mut("output").and_then(Value::as_array_mut) else {
            return;
        };
        items.splice(0..0, shown);
        let dropped = engine_items(tools, items.iter().map(Some));
        let mut k = 0;
        items.retain(|_| {
            k += 1;
            !dropped.contains(&(k - 1))
        });
        if items.is_empty() {
            items.push(note_item());
        }
    }

    fn seen(&mut self, kind: &str, event: &Value, index: Option<usize>, continuing: bool) -> Seen {
        match kind {
            "response.created" | "response.in_progress" => {
                if kind == "response.created" && !continuing {
                    self.first_id = event
                        .pointer("/response/id")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                }
                Seen::Start
            }
            "response.output_item.added" | "response.output_item.done" => {
                match (index, event.get("item")) {
                    (Some(i), Some(item)) => Seen::Part(i, item.clone()),
                    _ => Seen::Other,
                }
            }
            "response.failed" | "error" => Seen::Failed,
            k if is_terminal(k) => Seen::End,
            _ => Seen::Other,
        }
    }

    /// A reasoning item is held until the item after it shows: the API
    /// refuses a reasoning item sent back without the item that followed
    /// it, so one followed by an engine call must not reach the client (it
    /// goes upstream with the call in the re-send); one followed by
    /// anything else is released then, as it came.
    fn tentative(item: &Value) -> bool {
        kind_of(item) == "reasoning"
    }

    fn dropped<'a>(
        tools: &EngineTools,
        items: impl Iterator<Item = Option<&'a Value>>,
    ) -> BTreeSet<usize> {
        engine_items(tools, items)
    }

    fn ends_answer(kind: &str) -> bool {
        is_terminal(kind)
    }

    fn whole(_kind: &str, _event: &mut Value, _calls_left: bool) -> bool {
        false
    }

    fn note(index: usize) -> Vec<(&'static str, Value)> {
        let item = note_item();
        ["response.output_item.added", "response.output_item.done"]
            .into_iter()
            .map(|kind| {
                let event = json!({"type": kind, "output_index": index, "item": item});
                (kind, event)
            })
            .collect()
    }

    fn failure(message: &str) -> Vec<(&'static str, Value)> {
        crate::cut::responses_events(message).into()
    }

    fn passed(&mut self, kind: &str, event: &Value) {
        if kind == "response.output_item.done"
            && let Some(item) = event.get("item")
        {
            self.delivered.push(item.clone());
        }
        if let Some(n) = event.get("sequence_number").and_then(Value::as_u64) {
            self.seq = self.seq.max(n + 1);
        }
    }

    /// Gives `event` the next sequence number and the first round's
    /// response id; a completed response lists every item the client
    /// received.
    fn rewrite(&mut self, kind: &str, v: &mut Value) -> bool {
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
        true
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
