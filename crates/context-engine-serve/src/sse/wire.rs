//! The streams of the Anthropic Messages and OpenAI Responses APIs, relayed
//! unchanged: every whole event goes to the client as it arrived (nothing
//! is dropped or rewritten), and each is read for the usage and the end of
//! the stream.
//!
//! Anthropic reports usage in `message_start` (`message.usage`: input,
//! cache read and cache creation tokens) and `message_delta` (`usage`: the
//! output tokens, sometimes the input counts again); the two are merged,
//! later fields winning. The stream ends at `message_stop` (or `error`).
//! Responses reports it in `response.completed` (`response.usage`), which
//! ends the stream like `response.failed`, `response.incomplete` and
//! `error`. A stream cut before its end gets the error events of
//! [`crate::cut`] ([`WireReader::failure`]), numbered after the last
//! Responses event it relayed.

use bytes::Bytes;
use context_engine::engine::Usage;
use context_engine::front::FrontKind;
use serde_json::{Map, Value, json};

use super::{Event, StreamReader};
use crate::cut;

/// The reader's state across events.
#[derive(Debug)]
pub struct WireReader {
    kind: FrontKind,
    usage: Map<String, Value>,
    done: bool,
    /// Responses: the sequence number after the last event relayed.
    next_seq: u64,
    /// Responses: the response's id (`response.created`).
    id: Option<String>,
}

impl WireReader {
    /// A reader for a stream of format `kind`.
    pub fn new(kind: FrontKind) -> WireReader {
        WireReader {
            kind,
            usage: Map::new(),
            done: false,
            next_seq: 0,
            id: None,
        }
    }

    /// Reads one event of the API (a comment or a keep-alive says nothing).
    fn read(&mut self, event: &Event) {
        let Some(e) = event.object().filter(|_| !self.done) else {
            return;
        };
        if let Some(n) = e.get("sequence_number").and_then(Value::as_u64) {
            self.next_seq = self.next_seq.max(n.saturating_add(1));
        }
        let usage = match (self.kind, event.kind()) {
            (FrontKind::Anthropic, "message_start") => e.pointer("/message/usage"),
            (FrontKind::Anthropic, "message_delta") => e.get("usage"),
            (FrontKind::Anthropic, "message_stop" | "error") => {
                self.done = true;
                None
            }
            (FrontKind::Responses, "response.created") => {
                self.id = e
                    .pointer("/response/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                None
            }
            (
                FrontKind::Responses,
                "response.completed" | "response.failed" | "response.incomplete",
            ) => {
                self.done = true;
                e.pointer("/response/usage")
            }
            (FrontKind::Responses, "error") => {
                self.done = true;
                None
            }
            _ => None,
        };
        if let Some(Value::Object(u)) = usage {
            for (k, v) in u {
                if !v.is_null() {
                    self.usage.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

impl StreamReader for WireReader {
    /// Every event goes to the client.
    fn read(&mut self, event: &Event) -> bool {
        WireReader::read(self, event);
        true
    }

    /// A last event without its blank line ends the stream whole; a
    /// partial event of a stream cut short is dropped.
    fn end_of_body(&mut self, rest: Option<&Event>) -> Option<bool> {
        if let Some(rest) = rest {
            WireReader::read(self, rest);
        }
        self.done.then_some(true)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn usage(&self) -> Option<Usage> {
        if self.usage.is_empty() {
            return None;
        }
        Usage::from_openai(&Value::Object(self.usage.clone())).ok()
    }

    /// The events that end this stream as failed with `message`
    /// ([`crate::cut`]), numbered after the events relayed.
    fn failure(&self, message: &str) -> Bytes {
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

    fn restart(&mut self) {
        *self = WireReader::new(self.kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{Reading, as_it_came};

    const ANTHROPIC: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":100,\"cache_creation_input_tokens\":20,\"output_tokens\":1}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    const RESPONSES: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":300,\"input_tokens_details\":{\"cached_tokens\":256},\"output_tokens\":9,\"total_tokens\":309}}}\n\n";

    /// Pushes `chunks` then ends the body; what the client got.
    fn run(r: &mut Reading<WireReader>, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&r.push(Bytes::copy_from_slice(c)));
        }
        out.extend_from_slice(&r.end_of_body(as_it_came).unwrap_or_default());
        out
    }

    fn reader(kind: FrontKind) -> Reading<WireReader> {
        Reading::new(Box::new(WireReader::new(kind)))
    }

    #[test]
    fn anthropic_usage_is_merged_at_any_cut() {
        for cut in 1..ANTHROPIC.len() {
            let (a, b) = ANTHROPIC.as_bytes().split_at(cut);
            let mut r = reader(FrontKind::Anthropic);
            assert_eq!(run(&mut r, &[a, b]), ANTHROPIC.as_bytes(), "cut at {cut}");
            let u = r.reader.usage().unwrap();
            assert_eq!(u.prompt_tokens, 125, "cut at {cut}");
            assert_eq!(u.cache_read_tokens, Some(100));
            assert_eq!(u.cache_write_tokens, Some(20));
            assert_eq!(u.completion_tokens, 7);
            assert!(r.reader.done());
        }
    }

    #[test]
    fn responses_usage_from_completed() {
        let mut r = reader(FrontKind::Responses);
        assert_eq!(run(&mut r, &[RESPONSES.as_bytes()]), RESPONSES.as_bytes());
        let u = r.reader.usage().unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cache_read_tokens, u.completion_tokens),
            (300, Some(256), 9)
        );
        assert!(r.reader.done());
    }

    #[test]
    fn a_complete_stream_without_its_last_blank_line_is_relayed_whole() {
        let unterminated = ANTHROPIC.trim_end();
        let mut r = reader(FrontKind::Anthropic);
        assert_eq!(
            run(&mut r, &[unterminated.as_bytes()]),
            unterminated.as_bytes()
        );
        assert!(r.reader.done());
    }

    #[test]
    fn a_cut_stream_relays_its_whole_events_only() {
        // Cut inside `message_delta`: the events before it, not its part.
        let at = ANTHROPIC.find("event: message_delta").unwrap();
        for cut in at + 1..ANTHROPIC.find("event: message_stop").unwrap() - 1 {
            let mut r = reader(FrontKind::Anthropic);
            let half = &ANTHROPIC.as_bytes()[..cut];
            assert_eq!(
                run(&mut r, &[half]),
                &ANTHROPIC.as_bytes()[..at],
                "cut at {cut}"
            );
            assert!(!r.reader.done());
        }
    }

    #[test]
    fn responses_failure_is_numbered_after_the_last_event_and_names_the_response() {
        let events = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_7\"}}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"hi\"}\n\n";
        let mut r = reader(FrontKind::Responses);
        run(&mut r, &[events.as_bytes()]);
        assert!(!r.reader.done());
        let failure = r.reader.failure("gone");
        let seen: Vec<Value> = crate::sse::events(&failure)
            .map(|e| e.json().cloned().unwrap())
            .collect();
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

    #[test]
    fn an_error_event_ends_either_stream() {
        let anthropic = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\n\
event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n";
        let responses = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n\
event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"busy\"}\n\n";
        for (kind, stream) in [
            (FrontKind::Anthropic, anthropic),
            (FrontKind::Responses, responses),
        ] {
            let mut r = reader(kind);
            assert_eq!(run(&mut r, &[stream.as_bytes()]), stream.as_bytes());
            assert!(r.reader.done(), "{kind}");
        }
    }
}
