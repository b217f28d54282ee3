//! Server-sent events of the Anthropic Messages and OpenAI Responses
//! streams, relayed unchanged: every chunk goes to the client as it
//! arrived (nothing is dropped or rewritten), and a copy is read event by
//! event for the usage and the end of the stream.
//!
//! Anthropic reports usage in `message_start` (`message.usage`: input,
//! cache read and cache creation tokens) and `message_delta` (`usage`: the
//! output tokens, sometimes the input counts again); the two are merged,
//! later fields winning. The stream ends at `message_stop` (or `error`).
//! Responses reports it in `response.completed` (`response.usage`), which
//! ends the stream like `response.failed`, `response.incomplete` and
//! `error`.

use context_engine::engine::Usage;
use context_engine::front::FrontKind;
use memchr::memmem;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::sse::{data_of, first_event_end};

/// The reader's state across chunks.
#[derive(Debug)]
pub struct WireRelay {
    kind: FrontKind,
    buf: Vec<u8>,
    usage: Map<String, Value>,
    done: bool,
}

impl WireRelay {
    /// A reader for a stream of format `kind`.
    pub fn new(kind: FrontKind) -> WireRelay {
        WireRelay {
            kind,
            buf: Vec::new(),
            usage: Map::new(),
            done: false,
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

    /// Reads a chunk (which the caller forwards unchanged).
    pub fn push(&mut self, chunk: &[u8]) {
        if self.done {
            return;
        }
        self.buf.extend_from_slice(chunk);
        let mut consumed = 0;
        while let Some(len) = first_event_end(&self.buf[consumed..]) {
            let event = self.buf[consumed..consumed + len].to_vec();
            consumed += len;
            self.read(&event);
        }
        self.buf.drain(..consumed);
    }

    /// The end of the stream: reads an unterminated last event.
    pub fn finish(&mut self) {
        let rest = std::mem::take(&mut self.buf);
        if !rest.is_empty() {
            self.read(&rest);
        }
    }

    fn read(&mut self, event: &[u8]) {
        let interesting = match self.kind {
            FrontKind::Anthropic => {
                memmem::find(event, b"\"usage\"").is_some()
                    || memmem::find(event, b"message_stop").is_some()
                    || memmem::find(event, b"error").is_some()
            }
            FrontKind::Responses => memmem::find(event, b"response.").is_some(),
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
        }
        #[derive(Deserialize)]
        struct Inner {
            usage: Option<Value>,
        }
        let data = data_of(event);
        let Ok(e) = serde_json::from_slice::<Event>(&data) else {
            return;
        };
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

/// An SSE event carrying an error in the client's format, for a stream
/// that broke off after it started.
pub fn error_event(kind: FrontKind, message: &str) -> bytes::Bytes {
    let (name, body) = match kind {
        FrontKind::Anthropic => (
            "error",
            serde_json::json!({"type": "error", "error": {"type": "api_error", "message": message}}),
        ),
        FrontKind::Responses => (
            "error",
            serde_json::json!({"type": "error", "code": "upstream_error", "message": message, "param": null}),
        ),
    };
    bytes::Bytes::from(format!("event: {name}\ndata: {body}\n\n"))
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

    #[test]
    fn anthropic_usage_is_merged_at_any_cut() {
        for cut in 1..ANTHROPIC.len() {
            let (a, b) = ANTHROPIC.as_bytes().split_at(cut);
            let mut r = WireRelay::new(FrontKind::Anthropic);
            r.push(a);
            r.push(b);
            r.finish();
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
        r.push(RESPONSES.as_bytes());
        let u = r.usage().unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cache_read_tokens, u.completion_tokens),
            (300, Some(256), 9)
        );
        assert!(r.done());
    }
}
