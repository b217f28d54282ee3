//! Chat completions' stream: each event goes to the client as it arrived
//! (byte for byte), the usage it carries is read, and the usage-only
//! chunk the proxy asked for (`stream_options.include_usage`) is dropped
//! when the client did not ask for it itself ([`ChatReader`]).
//!
//! With engine tools offered on a stream, a [`Watch`] reads the events the
//! client gets: text passes through at once and, from the event whose
//! tool call names an engine tool, the rest of the stream is held
//! ([`Held`]) for the proxy to resolve ([`crate::tools`]).

use bytes::Bytes;
use context_engine::engine::Usage;
use serde_json::Value;

use super::{Event, StreamReader};

/// The reader's state across events.
#[derive(Debug)]
pub struct ChatReader {
    strip_usage_chunk: bool,
    usage: Option<Usage>,
    done: bool,
    finished: bool,
}

/// The watch for engine tool calls in a stream.
#[derive(Debug, Default)]
pub struct Watch {
    names: Vec<String>,
    held: Held,
    holding: bool,
}

/// What a watched stream said: its text, its tool calls, and the events
/// held from the first engine call on.
#[derive(Debug, Default)]
pub struct Held {
    /// The assistant text of choice 0, all of it.
    pub text: String,
    /// The tool calls of choice 0, in order of their `index`.
    pub calls: Vec<StreamCall>,
    /// The events held back (complete, as they came).
    pub events: Vec<Event>,
}

/// One tool call assembled from a stream's deltas.
#[derive(Debug, Default, Clone)]
pub struct StreamCall {
    /// The delta `index`.
    pub index: u64,
    /// Its id.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments text, concatenated.
    pub arguments: String,
}

impl ChatReader {
    /// A reader; `strip_usage_chunk` when the client did not ask for usage.
    pub fn new(strip_usage_chunk: bool) -> ChatReader {
        ChatReader {
            strip_usage_chunk,
            usage: None,
            done: false,
            finished: false,
        }
    }

    /// Whether the body may end here, the upstream having closed it
    /// cleanly leaving `rest`: after `[DONE]`, or after a choice's
    /// `finish_reason` with no unterminated event left (some
    /// OpenAI-compatible servers never send `[DONE]`; a close that leaves
    /// part of an event is a cut). Ask before [`finish`](Self::finish).
    pub fn may_end(&self, rest: Option<&Event>) -> bool {
        self.done || (self.finished && rest.is_none_or(Event::is_blank))
    }

    /// Reads what the end of the body left (an unterminated event);
    /// whether the client gets it: when the stream has ended with it (a
    /// last event without its blank line). A partial event of a stream cut
    /// short is dropped ([`crate::cut`]).
    pub fn finish(&mut self, rest: Option<&Event>) -> bool {
        rest.is_some_and(|rest| self.read(rest)) && self.done
    }

    /// Reads one event (`[DONE]`, a finish reason, usage); whether to
    /// forward it.
    fn read(&mut self, event: &Event) -> bool {
        if event.is_done() {
            self.done = true;
            return true;
        }
        let Some(chunk) = event.json() else {
            return true;
        };
        if names_finish_reason(chunk) {
            self.finished = true;
        }
        let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) else {
            return true;
        };
        if let Ok(u) = Usage::from_openai(usage) {
            self.usage = Some(u);
        }
        let usage_only = chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty);
        !(self.strip_usage_chunk && usage_only)
    }
}

impl StreamReader for ChatReader {
    fn read(&mut self, event: &Event) -> bool {
        ChatReader::read(self, event)
    }

    fn end_of_body(&mut self, rest: Option<&Event>) -> Option<bool> {
        let may_end = self.may_end(rest);
        let forward = self.finish(rest);
        may_end.then_some(forward)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn failure(&self, message: &str) -> Bytes {
        crate::cut::chat_event(message)
    }

    fn restart(&mut self) {
        *self = ChatReader::new(self.strip_usage_chunk);
    }
}

/// Whether `chunk` gives a `finish_reason` a value (a string, not `null`):
/// one of its choices, or the chunk itself.
fn names_finish_reason(chunk: &Value) -> bool {
    let given = |v: &Value| v.get("finish_reason").is_some_and(Value::is_string);
    given(chunk)
        || chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|c| c.iter().any(given))
}

impl Watch {
    /// Watches for calls to the tools `names` (engine tools): from the
    /// first event naming one, events are held instead of forwarded.
    pub fn new(names: Vec<String>) -> Watch {
        Watch {
            names,
            ..Watch::default()
        }
    }

    /// Whether events are being held (an engine tool was called).
    pub fn holding(&self) -> bool {
        self.holding
    }

    /// What the watched stream said and held, when it called an engine
    /// tool.
    pub fn held(&self) -> Option<&Held> {
        self.holding.then_some(&self.held)
    }

    /// What the watched stream said and held, when it called an engine
    /// tool; the watch starts over.
    pub fn take_held(&mut self) -> Option<Held> {
        if !self.holding {
            return None;
        }
        self.holding = false;
        Some(std::mem::take(&mut self.held))
    }

    /// Reads an event the client gets; whether it goes to the client now
    /// (else it is held).
    pub fn pass(&mut self, event: &Event) -> bool {
        if let Some(chunk) = event.json() {
            self.see(chunk);
        }
        if self.holding {
            self.held.events.push(event.clone());
        }
        !self.holding
    }

    /// Reads choice 0's text and tool-call deltas; starts holding at the
    /// first delta that names an engine tool.
    fn see(&mut self, chunk: &Value) {
        let Some(delta) = chunk.pointer("/choices/0/delta") else {
            return;
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            self.held.text.push_str(text);
        }
        let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) else {
            return;
        };
        for c in calls {
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            let at = match self.held.calls.iter().position(|k| k.index == index) {
                Some(at) => at,
                None => {
                    self.held.calls.push(StreamCall {
                        index,
                        ..StreamCall::default()
                    });
                    self.held.calls.len() - 1
                }
            };
            let call = &mut self.held.calls[at];
            let s = |p: &str| c.pointer(p).and_then(Value::as_str);
            if let Some(id) = s("/id") {
                call.id.push_str(id);
            }
            if let Some(name) = s("/function/name") {
                call.name.push_str(name);
                if self.names.iter().any(|n| n == &call.name) {
                    self.holding = true;
                }
            }
            if let Some(args) = s("/function/arguments") {
                call.arguments.push_str(args);
            }
        }
    }
}

impl Held {
    /// Whether `name` is among `names`.
    fn is_engine(names: &[String], name: &str) -> bool {
        names.iter().any(|n| n == name)
    }

    /// Whether every call is to one of `names`.
    pub fn only_engine_calls(&self, names: &[String]) -> bool {
        !self.calls.is_empty() && self.calls.iter().all(|c| Held::is_engine(names, &c.name))
    }

    /// The held events for the client: the calls to `names` removed, the
    /// client's calls renumbered from 0 in order, and a choice left
    /// without any call finishing as `stop`.
    pub fn for_client(&self, names: &[String]) -> Bytes {
        let mut map = Vec::new();
        for c in &self.calls {
            if !Held::is_engine(names, &c.name) {
                map.push(c.index);
            }
        }
        let any_client_call = !map.is_empty();
        let mut out = Vec::new();
        for event in &self.events {
            let Some(mut chunk) = event.json().cloned() else {
                out.extend_from_slice(&event.raw);
                continue;
            };
            let mut changed = false;
            if let Some(choices) = chunk.get_mut("choices").and_then(|c| c.as_array_mut()) {
                for choice in choices {
                    if let Some(delta) = choice.get_mut("delta").and_then(|d| d.as_object_mut())
                        && let Some(Value::Array(calls)) = delta.get_mut("tool_calls")
                    {
                        calls.retain_mut(|c| {
                            let index = c.get("index").and_then(Value::as_u64);
                            match map.iter().position(|&i| Some(i) == index) {
                                Some(to) => {
                                    c["index"] = serde_json::json!(to);
                                    true
                                }
                                None => false,
                            }
                        });
                        if calls.is_empty() {
                            delta.remove("tool_calls");
                        }
                        changed = true;
                    }
                    if !any_client_call
                        && choice.get("finish_reason").and_then(Value::as_str) == Some("tool_calls")
                    {
                        choice["finish_reason"] = serde_json::json!("stop");
                        changed = true;
                    }
                }
            }
            if changed {
                out.extend_from_slice(format!("data: {chunk}\n\n").as_bytes());
            } else {
                out.extend_from_slice(&event.raw);
            }
        }
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{Frames, events};

    const TEXT: &str = "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
    const USAGE: &str = "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn run(reader: &mut ChatReader, chunks: &[&[u8]]) -> String {
        let mut frames = Frames::default();
        let mut out = Vec::new();
        for c in chunks {
            for e in events(&frames.push(Bytes::copy_from_slice(c))) {
                if reader.read(&e) {
                    out.extend_from_slice(&e.raw);
                }
            }
        }
        let rest = frames.rest().map(Event::parse);
        if reader.finish(rest.as_ref()) {
            out.extend_from_slice(&rest.unwrap().raw);
        }
        String::from_utf8(out).unwrap()
    }

    fn names_finish_reason(data: &[u8]) -> bool {
        super::names_finish_reason(&serde_json::from_slice(data).unwrap())
    }

    #[test]
    fn strips_only_the_usage_chunk_and_reads_it() {
        let all = format!("{TEXT}{USAGE}{DONE}");
        let mut r = ChatReader::new(true);
        assert_eq!(run(&mut r, &[all.as_bytes()]), format!("{TEXT}{DONE}"));
        assert_eq!(r.usage().unwrap().prompt_tokens, 7);
        assert!(r.done());
        let mut r = ChatReader::new(false);
        assert_eq!(run(&mut r, &[all.as_bytes()]), all);
        assert_eq!(r.usage().unwrap().completion_tokens, 2);
    }

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let all = format!("{TEXT}{USAGE}{DONE}");
        for cut in 1..all.len() {
            let (a, b) = all.as_bytes().split_at(cut);
            let mut r = ChatReader::new(true);
            assert_eq!(
                run(&mut r, &[a, b]),
                format!("{TEXT}{DONE}"),
                "cut at {cut}"
            );
            assert_eq!(r.usage().unwrap().total_tokens, 9);
        }
        let crlf = all.replace("\n\n", "\r\n\r\n");
        let mut r = ChatReader::new(true);
        assert_eq!(
            run(&mut r, &[crlf.as_bytes()]),
            format!("{TEXT}{DONE}").replace("\n\n", "\r\n\r\n")
        );
    }

    #[test]
    fn a_cut_stream_relays_its_whole_events_only() {
        let all = format!("{TEXT}{USAGE}{DONE}");
        for cut in TEXT.len() + 1..all.len() - DONE.len() {
            let mut r = ChatReader::new(false);
            assert_eq!(run(&mut r, &[&all.as_bytes()[..cut]]), TEXT, "cut at {cut}");
            assert!(!r.done());
        }
        // A last event without its blank line ends the stream whole.
        let mut r = ChatReader::new(false);
        let unterminated = all.trim_end();
        assert_eq!(run(&mut r, &[unterminated.as_bytes()]), unterminated);
        assert!(r.done());
    }

    #[test]
    fn a_finish_reason_is_one_with_a_value() {
        assert!(names_finish_reason(
            br#"{"choices":[{"finish_reason":"stop"}]}"#
        ));
        assert!(names_finish_reason(br#"{"finish_reason" : "tool_calls"}"#));
        assert!(!names_finish_reason(
            br#"{"choices":[{"finish_reason":null}]}"#
        ));
        assert!(!names_finish_reason(br#"{"content":"finish_reason"}"#));
    }

    #[test]
    fn done_is_read_however_it_is_written() {
        for done in [
            "data:[DONE]\n\n",
            "data: [DONE]\r\n\r\n",
            "data:  [DONE] \n\n",
        ] {
            let mut r = ChatReader::new(false);
            let all = format!("{TEXT}{done}");
            assert_eq!(run(&mut r, &[all.as_bytes()]), all);
            assert!(r.done(), "{done:?}");
        }
    }
}
