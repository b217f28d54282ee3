//! Server-sent events of the Anthropic Messages and OpenAI Responses
//! streams, relayed unchanged: every whole event goes to the client as it
//! arrived (nothing is dropped or rewritten; an event a chunk cuts waits
//! for the rest of it), and each is read for the usage and the end of the
//! stream.
//!
//! Anthropic reports usage in `message_start` (`message.usage`: input,
//! cache read and cache creation tokens) and `message_delta` (`usage`: the
//! output tokens, sometimes the input counts again); the two are merged,
//! later fields winning. The stream ends at `message_stop` (or `error`).
//! Responses reports it in `response.completed` (`response.usage`), which
//! ends the stream like `response.failed`, `response.incomplete` and
//! `error`. A stream cut before its end gets the error events of
//! [`crate::cut`] ([`WireRelay::failure`]), numbered after the last
//! Responses event it relayed.

use bytes::Bytes;
use context_engine::engine::Usage;
use context_engine::front::FrontKind;
use memchr::memmem;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::cut;
use crate::sse::{StreamReader, data_of, first_event_end, last_event_end};

/// The reader's state across chunks.
#[derive(Debug)]
pub struct WireRelay {
    kind: FrontKind,
    buf: Vec<u8>,
    usage: Map<String, Value>,
    done: bool,
    /// Responses: the sequence number after the last event relayed.
    next_seq: u64,
    /// Responses: the response's id (`response.created`).
    id: Option<String>,
}

impl WireRelay {
    /// A reader for a stream of format `kind`.
    pub fn new(kind: FrontKind) -> WireRelay {
        WireRelay {
            kind,
            buf: Vec::new(),
            usage: Map::new(),
            done: false,
            next_seq: 0,
            id: None,
        }
    }

    /// The usage the stream reported, once it did.
    pub fn usage(&self) -> Option<Usage> {
        if self.usage.is_empty() {
            return None;
        }
        Usage::from_openai(&Value::Object(self.usage.clone())).ok()
    }

    /// Whether the stream's last event went by.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Reads a chunk; returns what the client gets of it now: its whole
    /// events, unchanged (the chunk itself when it ends on an event's end).
    pub fn push(&mut self, chunk: Bytes) -> Bytes {
        if self.done && self.buf.is_empty() {
            return chunk;
        }
        if self.buf.is_empty() {
            let end = last_event_end(&chunk).unwrap_or(0);
            self.read_all(&chunk[..end]);
            self.buf.extend_from_slice(&chunk[end..]);
            return chunk.slice(..end);
        }
        self.buf.extend_from_slice(&chunk);
        let end = last_event_end(&self.buf).unwrap_or(0);
        let complete: Vec<u8> = self.buf.drain(..end).collect();
        self.read_all(&complete);
        Bytes::from(complete)
    }

    /// The end of the upstream's body: reads what is left (an
    /// unterminated event) and returns it when the stream has ended with
    /// it (a last event without its blank line); a partial event of a
    /// stream cut short is dropped.
    pub fn finish(&mut self) -> Bytes {
        let rest = std::mem::take(&mut self.buf);
        if rest.is_empty() {
            return Bytes::new();
        }
        if !self.done {
            self.read(&rest);
        }
        if self.done {
            Bytes::from(rest)
        } else {
            Bytes::new()
        }
    }

    /// The events that end this stream as failed with `message`
    /// ([`crate::cut`]), numbered after the events relayed.
    pub fn failure(&self, message: &str) -> Bytes {
        match self.kind {
            FrontKind::Anthropic => cut::anthropic_event(message),
            FrontKind::Responses => {
                let mut out = Vec::new();
                for (seq, (kind, mut event)) in
                    (self.next_seq..).zip(cut::responses_events(message))
                {
                    event["sequence_number"] = json!(seq);
                    if let (Some(id), Some(r)) = (&self.id, event.get_mut("response")) {
                        r["id"] = json!(id);
                    }
                    out.extend(cut::encode(kind, &event));
                }
                Bytes::from(out)
            }
        }
    }

    /// Reads every whole event of `events`.
    fn read_all(&mut self, mut events: &[u8]) {
        while !self.done
            && let Some(len) = first_event_end(events)
        {
            let (event, rest) = events.split_at(len);
            self.read(event);
            events = rest;
        }
    }

    fn read(&mut self, event: &[u8]) {
        let interesting = match self.kind {
            FrontKind::Anthropic => {
                memmem::find(event, b"\"usage\"").is_some()
                    || memmem::find(event, b"message_stop").is_some()
                    || memmem::find(event, b"error").is_some()
            }
            FrontKind::Responses => {
                memmem::find(event, b"response.").is_some()
                    || memmem::find(event, b"error").is_some()
            }
        };
        if !interesting {
            return;
        }
        #[derive(Deserialize)]
        struct Event {
            #[serde(rename = "type")]
            kind: Option<String>,
            usage: Option<Value>,
            message: Option<Inner>,
            response: Option<Inner>,
            sequence_number: Option<u64>,
        }
        #[derive(Deserialize)]
        struct Inner {
            usage: Option<Value>,
            id: Option<String>,
        }
        let data = data_of(event);
        let Ok(e) = serde_json::from_slice::<Event>(&data) else {
            return;
        };
        if let Some(n) = e.sequence_number {
            self.next_seq = self.next_seq.max(n.saturating_add(1));
        }
        let kind = e.kind.as_deref().unwrap_or("");
        let usage = match self.kind {
            FrontKind::Anthropic => match kind {
                "message_start" => e.message.and_then(|m| m.usage),
                "message_delta" => e.usage,
                "message_stop" | "error" => {
                    self.done = true;
                    None
                }
                _ => None,
            },
            FrontKind::Responses => match kind {
                "response.created" => {
                    self.id = e.response.and_then(|r| r.id);
                    None
                }
                "response.completed" | "response.failed" | "response.incomplete" => {
                    self.done = true;
                    e.response.and_then(|r| r.usage)
                }
                "error" => {
                    self.done = true;
                    None
                }
                _ => None,
            },
        };
        if let Some(Value::Object(u)) = usage {
            for (k, v) in u {
                if !v.is_null() {
                    self.usage.insert(k, v);
                }
            }
        }
    }
}

impl StreamReader for WireRelay {
    fn push(&mut self, chunk: Bytes) -> Bytes {
        WireRelay::push(self, chunk)
    }

    fn end_of_body(&mut self) -> Option<Bytes> {
        let rest = self.finish();
        self.done.then_some(rest)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn usage(&self) -> Option<Usage> {
        WireRelay::usage(self)
    }

    fn failure(&self, message: &str) -> Bytes {
        WireRelay::failure(self, message)
    }

    fn restart(&mut self) {
        *self = WireRelay::new(self.kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":100,\"cache_creation_input_tokens\":20,\"output_tokens\":1}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    const RESPONSES: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":300,\"input_tokens_details\":{\"cached_tokens\":256},\"output_tokens\":9,\"total_tokens\":309}}}\n\n";

    /// Pushes `chunks` then ends the body; what the client got.
    fn run(r: &mut WireRelay, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&r.push(Bytes::copy_from_slice(c)));
        }
        out.extend_from_slice(&r.finish());
        out
    }

    #[test]
    fn anthropic_usage_is_merged_at_any_cut() {
        for cut in 1..ANTHROPIC.len() {
            let (a, b) = ANTHROPIC.as_bytes().split_at(cut);
            let mut r = WireRelay::new(FrontKind::Anthropic);
            assert_eq!(run(&mut r, &[a, b]), ANTHROPIC.as_bytes(), "cut at {cut}");
            let u = r.usage().unwrap();
            assert_eq!(u.prompt_tokens, 125, "cut at {cut}");
            assert_eq!(u.cache_read_tokens, Some(100));
            assert_eq!(u.cache_write_tokens, Some(20));
            assert_eq!(u.completion_tokens, 7);
            assert!(r.done());
        }
    }

    #[test]
    fn responses_usage_from_completed() {
        let mut r = WireRelay::new(FrontKind::Responses);
        assert_eq!(run(&mut r, &[RESPONSES.as_bytes()]), RESPONSES.as_bytes());
        let u = r.usage().unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cache_read_tokens, u.completion_tokens),
            (300, Some(256), 9)
        );
        assert!(r.done());
    }

    #[test]
    fn a_complete_stream_without_its_last_blank_line_is_relayed_whole() {
        let unterminated = ANTHROPIC.trim_end();
        let mut r = WireRelay::new(FrontKind::Anthropic);
        assert_eq!(
            run(&mut r, &[unterminated.as_bytes()]),
            unterminated.as_bytes()
        );
        assert!(r.done());
    }

    #[test]
    fn a_cut_stream_relays_its_whole_events_only() {
        // Cut inside `message_delta`: the events before it, not its part.
        let at = ANTHROPIC.find("event: message_delta").unwrap();
        for cut in at + 1..ANTHROPIC.find("event: message_stop").unwrap() - 1 {
            let mut r = WireRelay::new(FrontKind::Anthropic);
            let half = &ANTHROPIC.as_bytes()[..cut];
            assert_eq!(
                run(&mut r, &[half]),
                &ANTHROPIC.as_bytes()[..at],
                "cut at {cut}"
            );
            assert!(!r.done());
        }
    }

    #[test]
    fn responses_failure_is_numbered_after_the_last_event_and_names_the_response() {
        let events = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_7\"}}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"hi\"}\n\n";
        let mut r = WireRelay::new(FrontKind::Responses);
        run(&mut r, &[events.as_bytes()]);
        assert!(!r.done());
        let failure = r.failure("gone");
        let mut rest = &failure[..];
        let mut seen = Vec::new();
        while let Some(len) = first_event_end(rest) {
            let v: Value = serde_json::from_slice(&data_of(&rest[..len])).unwrap();
            seen.push(v);
            rest = &rest[len..];
        }
        assert_eq!(seen.len(), 2);
        assert_eq!(
            (&seen[0]["type"], &seen[0]["sequence_number"]),
            (&json!("error"), &json!(2))
        );
        assert_eq!(seen[1]["type"], "response.failed");
        assert_eq!(seen[1]["sequence_number"], 3);
        assert_eq!(seen[1]["response"]["id"], "resp_7");
        assert_eq!(seen[1]["response"]["error"]["message"], "gone");
    }
}
