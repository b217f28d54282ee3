//! Server-sent events from the upstream, read once and relayed as they
//! came.
//!
//! [`Frames`] cuts the upstream's body into whole events (an event a chunk
//! cuts waits for the rest of it); each is parsed once into an [`Event`]:
//! its name and its data, as JSON or the `[DONE]` marker. Each API's
//! [`StreamReader`] reads the typed event (usage, the end of the stream)
//! and says whether the client gets it; the engine-tool rounds
//! ([`crate::tools::Rounds`]) match on the same value. What goes to the
//! client is the event's original bytes unless the proxy changes it.
//!
//! Readers: chat completions' [`ChatReader`] ([`chat`]), Anthropic's and
//! Responses' [`WireReader`] ([`wire`]). [`Reading`] puts frames and a
//! reader together, for the relay of the handlers.

use bytes::Bytes;
use context_engine::engine::Usage;
use serde_json::Value;

pub mod chat;
pub mod wire;

pub use chat::{ChatReader, Held, StreamCall, Watch};
pub use wire::WireReader;

/// One whole event of a stream, parsed once.
#[derive(Debug, Clone)]
pub struct Event {
    /// The event as it came (its blank line included).
    pub raw: Bytes,
    /// Its `event:` name, if it has one.
    pub name: Option<String>,
    /// Its `data:`.
    pub data: Data,
}

/// An event's data.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// JSON.
    Json(Value),
    /// `[DONE]`: the end of a chat-completions stream.
    Done,
    /// No data (a comment, a keep-alive) or data that is not JSON.
    Other,
}

impl Event {
    /// Parses the whole event `raw` (its bytes are kept as they came).
    pub fn parse(raw: Bytes) -> Event {
        let mut name = None;
        let mut data: Option<Vec<u8>> = None;
        for line in lines(&raw) {
            if let Some(v) = line.strip_prefix(b"data:") {
                let v = v.strip_prefix(b" ").unwrap_or(v);
                match data.as_mut() {
                    Some(d) => {
                        d.push(b'\n');
                        d.extend_from_slice(v);
                    }
                    None => data = Some(v.to_vec()),
                }
            } else if let Some(v) = line.strip_prefix(b"event:") {
                let v = v.strip_prefix(b" ").unwrap_or(v);
                name = std::str::from_utf8(v).ok().map(str::to_owned);
            }
        }
        let data = match data {
            Some(d) if d.trim_ascii() == b"[DONE]" => Data::Done,
            Some(d) => serde_json::from_slice(&d).map_or(Data::Other, Data::Json),
            None => Data::Other,
        };
        Event { raw, name, data }
    }

    /// The data, when it is JSON.
    pub fn json(&self) -> Option<&Value> {
        match &self.data {
            Data::Json(v) => Some(v),
            _ => None,
        }
    }

    /// The data, when it is a JSON object: an event of the API.
    pub fn object(&self) -> Option<&Value> {
        self.json().filter(|v| v.is_object())
    }

    /// The data's `type` (Anthropic's and Responses' events name their
    /// kind there); empty when it has none.
    pub fn kind(&self) -> &str {
        self.json()
            .and_then(|v| v.get("type"))
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// Whether the data is `[DONE]`.
    pub fn is_done(&self) -> bool {
        self.data == Data::Done
    }

    /// Whether the event is only whitespace (what is left after a
    /// stream's last blank line).
    pub fn is_blank(&self) -> bool {
        self.raw.trim_ascii().is_empty()
    }
}

/// The lines of `raw`, each without its line end (CRLF, LF or CR).
fn lines(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= raw.len() {
            return None;
        }
        let rest = &raw[at..];
        match memchr::memchr2(b'\n', b'\r', rest) {
            Some(i) => {
                let len = if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                at += i + len;
                Some(&rest[..i])
            }
            None => {
                at = raw.len();
                Some(rest)
            }
        }
    })
}

/// Cuts a stream's body, chunk by chunk, into whole events.
#[derive(Debug, Default)]
pub struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    /// The whole events `chunk` completes, as one run of bytes (the
    /// chunk's own when nothing was left over before it).
    pub fn push(&mut self, chunk: Bytes) -> Bytes {
        if self.buf.is_empty() {
            let end = last_event_end(&chunk).unwrap_or(0);
            self.buf.extend_from_slice(&chunk[end..]);
            return chunk.slice(..end);
        }
        self.buf.extend_from_slice(&chunk);
        let end = last_event_end(&self.buf).unwrap_or(0);
        Bytes::from(self.buf.drain(..end).collect::<Vec<u8>>())
    }

    /// What is left at the end of the body: an unterminated last event (or
    /// whitespace), if anything.
    pub fn rest(&mut self) -> Option<Bytes> {
        let rest = std::mem::take(&mut self.buf);
        (!rest.is_empty()).then(|| Bytes::from(rest))
    }

    /// Forgets a partial event (a new stream starts).
    pub fn clear(&mut self) {
        self.buf.clear();
    }
}

/// The whole events of `run` (as [`Frames::push`] returns them), each
/// parsed.
pub fn events(run: &Bytes) -> impl Iterator<Item = Event> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let len = first_event_end(&run[at..])?;
        let event = Event::parse(run.slice(at..at + len));
        at += len;
        Some(event)
    })
}

/// One API's upstream stream as the relay of the handlers reads it, event
/// by event: what the client gets, where the stream ends, the usage it
/// reports, and the events that end it as failed ([`crate::cut`]).
pub trait StreamReader: Send {
    /// Reads one whole event; whether the client gets it.
    fn read(&mut self, event: &Event) -> bool;
    /// The upstream's body has ended, leaving `rest` (an unterminated last
    /// event or whitespace): whether the client gets `rest`, or `None`
    /// when the body may not end here (the stream was cut).
    fn end_of_body(&mut self, rest: Option<&Event>) -> Option<bool>;
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

/// A stream read event by event: its frames and its API's reader.
pub struct Reading<R: ?Sized> {
    frames: Frames,
    /// The API's reader.
    pub reader: Box<R>,
}

impl<R: StreamReader + ?Sized> Reading<R> {
    /// Reads a stream with `reader`.
    pub fn new(reader: Box<R>) -> Reading<R> {
        Reading {
            frames: Frames::default(),
            reader,
        }
    }

    /// Reads a chunk; the whole events the client gets now, as they came
    /// (the chunk's own bytes when it gets them all).
    pub fn push(&mut self, chunk: Bytes) -> Bytes {
        let run = self.frames.push(chunk);
        let mut kept = Vec::new();
        let mut all = true;
        for event in events(&run) {
            if self.reader.read(&event) {
                kept.extend_from_slice(&event.raw);
            } else {
                all = false;
            }
        }
        if all { run } else { Bytes::from(kept) }
    }

    /// Reads a chunk; the events the client gets go through `pass`, which
    /// writes what the client gets of them.
    pub fn push_through(
        &mut self,
        chunk: Bytes,
        mut pass: impl FnMut(&Event, &mut Vec<u8>),
    ) -> Bytes {
        let run = self.frames.push(chunk);
        let mut out = Vec::new();
        for event in events(&run) {
            if self.reader.read(&event) {
                pass(&event, &mut out);
            }
        }
        Bytes::from(out)
    }

    /// The end of the upstream's body: what the client gets of what is
    /// left (through `pass`), or `None` when the body may not end here.
    pub fn end_of_body(&mut self, mut pass: impl FnMut(&Event, &mut Vec<u8>)) -> Option<Bytes> {
        let rest = self.frames.rest().map(Event::parse);
        let forward = self.reader.end_of_body(rest.as_ref())?;
        let mut out = Vec::new();
        if let Some(rest) = rest.filter(|_| forward) {
            pass(&rest, &mut out);
        }
        Some(Bytes::from(out))
    }

    /// Starts over on a new upstream stream.
    pub fn restart(&mut self) {
        self.frames.clear();
        self.reader.restart();
    }
}

/// Writes an event as it came.
pub fn as_it_came(event: &Event, out: &mut Vec<u8>) {
    out.extend_from_slice(&event.raw);
}

/// The ends of the complete events of `buf`, in order: each event ends
/// with an empty line, and a line ends with CRLF, LF or CR, as the
/// server-sent events format has it (so `\n\n`, `\r\n\r\n` and `\r\r` all
/// end one). A CR that is the last byte of `buf` is taken as a line end
/// whole; a LF that follows it in the next chunk is then an empty line of
/// its own, a blank event the readers pass through.
fn event_ends(buf: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let mut line_start = 0;
    let mut at = 0;
    std::iter::from_fn(move || {
        while let Some(i) = memchr::memchr2(b'\n', b'\r', &buf[at..]).map(|i| at + i) {
            let len = if buf[i] == b'\r' && buf.get(i + 1) == Some(&b'\n') {
                2
            } else {
                1
            };
            let empty = i == line_start;
            at = i + len;
            line_start = at;
            if empty {
                return Some(at);
            }
        }
        at = buf.len();
        None
    })
}

/// Length of the first complete event (with its blank line), if any.
pub(crate) fn first_event_end(buf: &[u8]) -> Option<usize> {
    event_ends(buf).next()
}

/// End of the last complete event in `buf`, if any.
pub(crate) fn last_event_end(buf: &[u8]) -> Option<usize> {
    event_ends(buf).last()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_an_empty_line_whatever_the_line_ends() {
        for (stream, first) in [
            (&b"data: 1\n\ndata: 2\n\n"[..], 9),
            (b"data: 1\r\n\r\ndata: 2\r\n\r\n", 11),
            (b"data: 1\r\rdata: 2\r\r", 9),
            (b"data: 1\r\n\ndata: 2\n\r\n", 10),
        ] {
            assert_eq!(first_event_end(stream), Some(first), "{stream:?}");
            assert_eq!(last_event_end(stream), Some(stream.len()), "{stream:?}");
            let run = Bytes::copy_from_slice(stream);
            let data: Vec<Value> = events(&run).filter_map(|e| e.json().cloned()).collect();
            assert_eq!(
                data,
                [serde_json::json!(1), serde_json::json!(2)],
                "{stream:?}"
            );
        }
        // No empty line yet: no event; a CR-only event with a name.
        assert_eq!(first_event_end(b"data: 1\r\ndata: 2\r"), None);
        let e = Event::parse(Bytes::from_static(b"event: ping\rdata: {}\r\r"));
        assert_eq!(e.name.as_deref(), Some("ping"));
        assert!(e.object().is_some());
    }

    #[test]
    fn an_event_is_its_name_and_its_data_once() {
        let e = Event::parse(Bytes::from_static(
            b"event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n",
        ));
        assert_eq!(e.name.as_deref(), Some("message_stop"));
        assert_eq!(e.kind(), "message_stop");
        assert!(e.object().is_some());
        for done in ["data:[DONE]\n\n", "data:  [DONE] \n\n"] {
            assert!(Event::parse(Bytes::from(done)).is_done(), "{done:?}");
        }
        let ping = Event::parse(Bytes::from_static(b": keep-alive\n\n"));
        assert_eq!(ping.data, Data::Other);
        assert_eq!(ping.kind(), "");
        let two = Event::parse(Bytes::from_static(b"data: {\"a\":\ndata: 1}\n\n"));
        assert_eq!(two.json(), Some(&serde_json::json!({"a": 1})));
    }

    #[test]
    fn frames_keep_a_cut_event_for_the_next_chunk() {
        let all = b"data: 1\n\ndata: 2\n\n";
        for cut in 1..all.len() {
            let mut f = Frames::default();
            let mut got = f.push(Bytes::copy_from_slice(&all[..cut])).to_vec();
            got.extend_from_slice(&f.push(Bytes::copy_from_slice(&all[cut..])));
            assert_eq!(got, all, "cut at {cut}");
            assert!(f.rest().is_none());
            let run = Bytes::from_static(all);
            assert_eq!(events(&run).count(), 2);
        }
    }
}
