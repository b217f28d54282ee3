//! Server-sent events from the upstream, relayed event by event: each
//! complete event goes to the client as it arrived (byte for byte), the
//! usage it carries is read, and the usage-only chunk the proxy asked for
//! (`stream_options.include_usage`) is dropped when the client did not ask
//! for it itself.
//!
//! With engine tools offered on a stream ([`Relay::watch`]), text passes
//! through at once and, from the event whose tool call names an engine
//! tool, the rest of the stream is held ([`Held`]) for the proxy to
//! resolve ([`crate::tools`]).

use bytes::Bytes;
use context_engine::engine::Usage;
use memchr::memmem;
use serde::Deserialize;

/// One API's upstream stream as the relay of the handlers reads it: what
/// the client gets of each chunk, where the stream ends, the usage it
/// reports, and the events that end it as failed ([`crate::cut`]).
/// Chat completions' is [`Relay`]; Anthropic's and Responses' is
/// [`WireRelay`](crate::sse_wire::WireRelay).
pub trait StreamReader: Send {
    /// Reads a chunk; the complete events the client gets now.
    fn push(&mut self, chunk: Bytes) -> Bytes;
    /// The upstream's body has ended: what is left for the client, or
    /// `None` when the body may not end here (the stream was cut).
    fn end_of_body(&mut self) -> Option<Bytes>;
    /// Whether the stream's last event went by.
    fn done(&self) -> bool;
    /// The usage the stream reported, once it did.
    fn usage(&self) -> Option<Usage>;
    /// The events that end the client's stream as failed with `message`.
    fn failure(&self, message: &str) -> Bytes;
    /// Starts over on a new upstream stream (an engine-tool round's
    /// continuation).
    fn restart(&mut self);
}

/// The relay's state across chunks.
#[derive(Debug)]
pub struct Relay {
    buf: Vec<u8>,
    strip_usage_chunk: bool,
    usage: Option<Usage>,
    done: bool,
    finished: bool,
    watch: Option<Watch>,
}

/// The watch for engine tool calls in a stream.
#[derive(Debug, Default)]
struct Watch {
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
    pub events: Vec<Vec<u8>>,
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

impl Relay {
    /// A relay; `strip_usage_chunk` when the client did not ask for usage.
    pub fn new(strip_usage_chunk: bool) -> Relay {
        Relay {
            buf: Vec::new(),
            strip_usage_chunk,
            usage: None,
            done: false,
            finished: false,
            watch: None,
        }
    }

    /// Watches for calls to the tools `names` (engine tools): from the
    /// first event naming one, events are held instead of forwarded.
    pub fn watch(mut self, names: Vec<String>) -> Relay {
        self.watch = Some(Watch {
            names,
            ..Watch::default()
        });
        self
    }

    /// Whether events are being held (an engine tool was called).
    pub fn holding(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| w.holding)
    }

    /// What the watched stream said and held, when it called an engine
    /// tool.
    pub fn held(&self) -> Option<&Held> {
        self.watch.as_ref().filter(|w| w.holding).map(|w| &w.held)
    }

    /// What the watched stream said and held, when it called an engine
    /// tool; the relay forgets it.
    pub fn take_held(&mut self) -> Option<Held> {
        let w = self.watch.as_mut().filter(|w| w.holding)?;
        w.holding = false;
        Some(std::mem::take(&mut w.held))
    }

    /// The usage the stream reported, once it did.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether the `[DONE]` event went by.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Whether the body may end here, the upstream having closed it
    /// cleanly: after `[DONE]`, or after a choice's `finish_reason` with
    /// no unterminated event left (some OpenAI-compatible servers never
    /// send `[DONE]`; a close that leaves part of an event is a cut).
    /// Call before [`finish`](Self::finish).
    pub fn may_end(&self) -> bool {
        self.done || (self.finished && self.buf.trim_ascii().is_empty())
    }

    /// Takes a chunk; returns the complete events to forward now.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        if self.buf.is_empty() && !chunk.is_empty() && self.watch.is_none() {
            // Fast path: a chunk of whole events with no usage and no end
            // in them (`[DONE]` is read event by event, however written).
            if let Some(end) = last_event_end(chunk)
                && end == chunk.len()
                && memmem::find(chunk, b"\"usage\"").is_none()
                && memmem::find(chunk, b"[DONE]").is_none()
                && !names_finish_reason(chunk)
            {
                return Bytes::copy_from_slice(chunk);
            }
        }
        self.buf.extend_from_slice(chunk);
        let Some(end) = last_event_end(&self.buf) else {
            return Bytes::new();
        };
        let complete: Vec<u8> = self.buf.drain(..end).collect();
        let mut out = Vec::with_capacity(complete.len());
        let mut rest = &complete[..];
        while let Some(len) = first_event_end(rest) {
            let (event, tail) = rest.split_at(len);
            if self.keep(event) {
                out.extend_from_slice(event);
            }
            rest = tail;
        }
        Bytes::from(out)
    }

    /// The end of the upstream's body: reads what is left (an
    /// unterminated event) and returns it when the stream has ended with
    /// it (a last event without its blank line); a partial event of a
    /// stream cut short is dropped ([`crate::cut`]).
    pub fn finish(&mut self) -> Bytes {
        let rest = std::mem::take(&mut self.buf);
        if !rest.is_empty() && self.keep(&rest) && self.done {
            Bytes::from(rest)
        } else {
            Bytes::new()
        }
    }

    /// Reads one event; whether to forward it (not when it is dropped or
    /// held).
    fn keep(&mut self, event: &[u8]) -> bool {
        let data = data_of(event);
        let forward = self.read(&data);
        if let Some(w) = self.watch.as_mut() {
            w.see(&data);
            if w.holding {
                if forward {
                    w.held.events.push(event.to_vec());
                }
                return false;
            }
        }
        forward
    }

    /// Reads one event's data (`[DONE]`, usage); whether to forward it.
    fn read(&mut self, data: &[u8]) -> bool {
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return true;
        }
        if names_finish_reason(data) {
            self.finished = true;
        }
        if memmem::find(data, b"\"usage\"").is_none() {
            return true;
        }
        #[derive(Deserialize)]
        struct Chunk {
            usage: Option<serde_json::Value>,
            choices: Option<Vec<serde_json::Value>>,
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk>(data) else {
            return true;
        };
        let Some(usage) = chunk.usage.filter(|u| !u.is_null()) else {
            return true;
        };
        if let Ok(u) = Usage::from_openai(&usage) {
            self.usage = Some(u);
        }
        !(self.strip_usage_chunk && chunk.choices.is_some_and(|c| c.is_empty()))
    }
}

impl StreamReader for Relay {
    fn push(&mut self, chunk: Bytes) -> Bytes {
        Relay::push(self, &chunk)
    }

    fn end_of_body(&mut self) -> Option<Bytes> {
        let may_end = self.may_end();
        let rest = self.finish();
        may_end.then_some(rest)
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
        *self = Relay::new(self.strip_usage_chunk);
    }
}

/// Whether `data` gives a `finish_reason` a value (a string, not `null`).
fn names_finish_reason(data: &[u8]) -> bool {
    memmem::find_iter(data, b"\"finish_reason\"").any(|at| {
        let after = &data[at + b"\"finish_reason\"".len()..];
        let after = after.trim_ascii_start();
        after
            .strip_prefix(b":")
            .is_some_and(|v| v.trim_ascii_start().starts_with(b"\""))
    })
}

impl Watch {
    /// Reads choice 0's text and tool-call deltas; starts holding at the
    /// first delta that names an engine tool.
    fn see(&mut self, data: &[u8]) {
        let tools = memmem::find(data, b"\"tool_calls\"").is_some();
        if !tools && memmem::find(data, b"\"content\"").is_none() {
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<serde_json::Value>(data) else {
            return;
        };
        let Some(delta) = chunk.pointer("/choices/0/delta") else {
            return;
        };
        if let Some(text) = delta.get("content").and_then(serde_json::Value::as_str) {
            self.held.text.push_str(text);
        }
        let Some(calls) = delta
            .get("tool_calls")
            .and_then(serde_json::Value::as_array)
        else {
            return;
        };
        for c in calls {
            let index = c
                .get("index")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
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
            let s = |p: &str| c.pointer(p).and_then(serde_json::Value::as_str);
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
            let data = data_of(event);
            let Ok(mut chunk) = serde_json::from_slice::<serde_json::Value>(&data) else {
                out.extend_from_slice(event);
                continue;
            };
            let mut changed = false;
            if let Some(choices) = chunk.get_mut("choices").and_then(|c| c.as_array_mut()) {
                for choice in choices {
                    if let Some(delta) = choice.get_mut("delta").and_then(|d| d.as_object_mut())
                        && let Some(serde_json::Value::Array(calls)) = delta.get_mut("tool_calls")
                    {
                        calls.retain_mut(|c| {
                            let index = c.get("index").and_then(serde_json::Value::as_u64);
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
                        && choice
                            .get("finish_reason")
                            .and_then(serde_json::Value::as_str)
                            == Some("tool_calls")
                    {
                        choice["finish_reason"] = serde_json::json!("stop");
                        changed = true;
                    }
                }
            }
            if changed {
                out.extend_from_slice(format!("data: {chunk}\n\n").as_bytes());
            } else {
                out.extend_from_slice(event);
            }
        }
        Bytes::from(out)
    }
}

/// The `data:` payload of an event (lines joined with `\n`).
pub(crate) fn data_of(event: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    for line in event.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(v.strip_prefix(b" ").unwrap_or(v));
        }
    }
    data
}

/// Length of the first complete event (with its blank line), if any.
pub(crate) fn first_event_end(buf: &[u8]) -> Option<usize> {
    let lf = memmem::find(buf, b"\n\n").map(|i| i + 2);
    let crlf = memmem::find(buf, b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// End of the last complete event in `buf`, if any.
pub(crate) fn last_event_end(buf: &[u8]) -> Option<usize> {
    let lf = memmem::rfind(buf, b"\n\n").map(|i| i + 2);
    let crlf = memmem::rfind(buf, b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
    const USAGE: &str = "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn run(relay: &mut Relay, chunks: &[&[u8]]) -> String {
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&relay.push(c));
        }
        out.extend_from_slice(&relay.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn strips_only_the_usage_chunk_and_reads_it() {
        let all = format!("{TEXT}{USAGE}{DONE}");
        let mut r = Relay::new(true);
        assert_eq!(run(&mut r, &[all.as_bytes()]), format!("{TEXT}{DONE}"));
        assert_eq!(r.usage().unwrap().prompt_tokens, 7);
        assert!(r.done());
        let mut r = Relay::new(false);
        assert_eq!(run(&mut r, &[all.as_bytes()]), all);
        assert_eq!(r.usage().unwrap().completion_tokens, 2);
    }

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let all = format!("{TEXT}{USAGE}{DONE}");
        for cut in 1..all.len() {
            let (a, b) = all.as_bytes().split_at(cut);
            let mut r = Relay::new(true);
            assert_eq!(
                run(&mut r, &[a, b]),
                format!("{TEXT}{DONE}"),
                "cut at {cut}"
            );
            assert_eq!(r.usage().unwrap().total_tokens, 9);
        }
        let crlf = all.replace("\n\n", "\r\n\r\n");
        let mut r = Relay::new(true);
        assert_eq!(
            run(&mut r, &[crlf.as_bytes()]),
            format!("{TEXT}{DONE}").replace("\n\n", "\r\n\r\n")
        );
    }

    #[test]
    fn a_cut_stream_relays_its_whole_events_only() {
        let all = format!("{TEXT}{USAGE}{DONE}");
        for cut in TEXT.len() + 1..all.len() - DONE.len() {
            let mut r = Relay::new(false);
            assert_eq!(run(&mut r, &[&all.as_bytes()[..cut]]), TEXT, "cut at {cut}");
            assert!(!r.done());
        }
        // A last event without its blank line ends the stream whole.
        let mut r = Relay::new(false);
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
            let mut r = Relay::new(false);
            let all = format!("{TEXT}{done}");
            assert_eq!(run(&mut r, &[all.as_bytes()]), all);
            assert!(r.done(), "{done:?}");
        }
    }
}
