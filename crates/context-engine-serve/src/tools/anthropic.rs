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

use serde_json::{Value, json};

use super::front::{Caller, FrontApi, FrontRounds, Seen, StreamPart};
use super::{EngineTools, answer, offer};
use crate::body::ChatBody;
use crate::identity::Reader;
use crate::session::Managed;

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
pub struct Block {
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

impl StreamPart for Block {
    fn open(value: Value) -> Block {
        Block {
            value,
            text: String::new(),
            thinking: String::new(),
            signature: String::new(),
            citations: Vec::new(),
            input: String::new(),
        }
    }

    /// Adds a `content_block_delta`'s `delta`.
    fn delta(&mut self, event: &Value) {
        let Some(delta) = event.get("delta") else {
            return;
        };
        let field = |k: &str| delta.get(k).and_then(Value::as_str);
        let (to, part) = match field("type").unwrap_or_default() {
            "text_delta" => (&mut self.text, field("text")),
            "thinking_delta" => (&mut self.thinking, field("thinking")),
            "signature_delta" => (&mut self.signature, field("signature")),
            "input_json_delta" => (&mut self.input, field("partial_json")),
            "citations_delta" => {
                self.citations
                    .extend(delta.get("citation").filter(|c| !c.is_null()).cloned());
                return;
            }
            _ => return,
        };
        to.push_str(part.unwrap_or_default());
    }

    fn value(&self) -> &Value {
        &self.value
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

/// The Messages API to the rounds loop ([`FrontApi`]): blocks under
/// `index`, calls in `tool_use` blocks, results in a user turn of
/// `tool_result` blocks; no numbering of its own.
#[derive(Debug, Default)]
pub struct Messages;

/// A stream's engine-tool rounds on the Anthropic front (see the module
/// docs).
pub type StreamRounds = FrontRounds<Messages>;

impl FrontApi for Messages {
    type Part = Block;
    const CALLS_FROM_HOLD: bool = true;
    const LIST: &'static str = "messages";
    const PARTS: &'static str = "content";
    const INDEX: &'static str = "index";

    fn call(tools: &EngineTools, block: &Value) -> Option<Caller> {
        match is_tool_use(block) {
            true if is_engine_call(tools, block) => Some(Caller::Engine),
            true => Some(Caller::Client),
            false => None,
        }
    }

    /// An assistant turn as the model wrote it, and a user turn with the
    /// engine's `tool_result` for each call.
    fn exchange(guard: &mut Option<Managed>, content: &[Value]) -> Vec<String> {
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
        vec![
            json!({"role": "assistant", "content": content}).to_string(),
            json!({"role": "user", "content": results}).to_string(),
        ]
    }

    /// The blocks before the first engine call (a stream holds from there).
    fn shown(tools: &EngineTools, answer: &Value) -> Vec<Value> {
        let content = answer.get("content").and_then(Value::as_array);
        content
            .into_iter()
            .flatten()
            .take_while(|b| !is_engine_call(tools, b))
            .cloned()
            .collect()
    }

    fn finish(tools: &EngineTools, answer: &mut Value, shown: Vec<Value>) {
        if let Some(content) = answer.get_mut("content").and_then(Value::as_array_mut) {
            content.splice(0..0, shown);
        }
        strip_engine_calls(answer, tools);
    }

    fn seen(&mut self, kind: &str, event: &Value, index: Option<usize>, _: bool) -> Seen {
        match (kind, index) {
            ("message_start", _) => Seen::Start,
            ("content_block_start", Some(i)) => Seen::Part(
                i,
                event.get("content_block").cloned().unwrap_or(Value::Null),
            ),
            ("content_block_delta", Some(i)) => Seen::Delta(i),
            ("message_stop", _) => Seen::End,
            ("error", _) => Seen::Failed,
            _ => Seen::Other,
        }
    }

    fn ends_answer(kind: &str) -> bool {
        kind == "message_delta" || kind == "message_stop"
    }

    /// A `message_delta` that stops for `tool_use` when no call of the
    /// client's is left stops as `end_turn`.
    fn whole(kind: &str, event: &mut Value, calls_left: bool) -> bool {
        let stops_for_calls =
            event.pointer("/delta/stop_reason").and_then(Value::as_str) == Some("tool_use");
        if kind == "message_delta" && !calls_left && stops_for_calls {
            event["delta"]["stop_reason"] = Value::String("end_turn".into());
            return true;
        }
        false
    }

    fn note(index: usize) -> Vec<(&'static str, Value)> {
        vec![
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": NOTHING_LEFT}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ),
        ]
    }

    fn failure(message: &str) -> Vec<(&'static str, Value)> {
        vec![("error", crate::cut::anthropic_error(message))]
    }

    fn passed(&mut self, _kind: &str, _event: &Value) {}

    fn rewrite(&mut self, _kind: &str, _event: &mut Value) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
