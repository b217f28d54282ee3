//! Server-sent events from the upstream, relayed event by event: each
//! complete event goes to the client as it arrived (byte for byte), the
//! usage it carries is read, and the usage-only chunk the proxy asked for
//! (`stream_options.include_usage`) is dropped when the client did not ask
//! for it itself.

use bytes::Bytes;
use context_engine::engine::Usage;
use memchr::memmem;
use serde::Deserialize;

/// The relay's state across chunks.
#[derive(Debug)]
pub struct Relay {
    buf: Vec<u8>,
    strip_usage_chunk: bool,
    usage: Option<Usage>,
    done: bool,
}

impl Relay {
    /// A relay; `strip_usage_chunk` when the client did not ask for usage.
    pub fn new(strip_usage_chunk: bool) -> Relay {
        Relay {
            buf: Vec::new(),
            strip_usage_chunk,
            usage: None,
            done: false,
        }
    }

    /// The usage the stream reported, once it did.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether the `[DONE]` event went by.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Takes a chunk; returns the complete events to forward now.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        if self.buf.is_empty() && !chunk.is_empty() {
            // Fast path: a chunk of whole events with no usage in them.
            if let Some(end) = last_event_end(chunk)
                && end == chunk.len()
                && memmem::find(chunk, b"\"usage\"").is_none()
            {
                self.done |= memmem::find(chunk, b"data: [DONE]").is_some();
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

    /// The end of the stream: whatever is left (an unterminated event).
    pub fn finish(&mut self) -> Bytes {
        let rest = std::mem::take(&mut self.buf);
        if !rest.is_empty() && self.keep(&rest) {
            Bytes::from(rest)
        } else {
            Bytes::new()
        }
    }

    /// Reads one event; whether to forward it.
    fn keep(&mut self, event: &[u8]) -> bool {
        let data = data_of(event);
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return true;
        }
        if memmem::find(&data, b"\"usage\"").is_none() {
            return true;
        }
        #[derive(Deserialize)]
        struct Chunk {
            usage: Option<serde_json::Value>,
            choices: Option<Vec<serde_json::Value>>,
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk>(&data) else {
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

/// An SSE event carrying an error in OpenAI's shape, for a stream that
/// broke off after it started.
pub fn error_event(message: &str) -> Bytes {
    let body = serde_json::json!({
        "error": { "message": message, "type": "api_error", "param": null, "code": "upstream_error" }
    });
    Bytes::from(format!("data: {body}\n\n"))
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
}
