//! Transcript files: loading with format detection, and writing back.
//!
//! Agents store their histories in several shapes. [`Transcript`] reads them
//! all into [`Message`]s and remembers everything around the messages (the
//! *envelope*: other top-level keys, in order), so that writing a transcript
//! in the format it came in gives back the same JSON (key order and
//! null-vs-absent included; whitespace is not kept).
//!
//! | [`Format`] | shape |
//! |---|---|
//! | [`Format::Array`] | `[msg, msg, …]` |
//! | [`Format::MiniSweAgent`] | `{"info": …, "messages": [msg, …], "trajectory_format": …, …}` |
//! | [`Format::SweAgent`] | `{"trajectory": …, "history": [msg, …], "info": …, …}` |
//! | [`Format::JsonLines`] | one message object per line; blank lines are skipped |
//!
//! Detection looks at the content, never at the file name (`.traj` and
//! `.json` files come in all of these shapes):
//! - a top-level array is [`Format::Array`];
//! - a single object with a `messages` array is [`Format::MiniSweAgent`],
//!   otherwise one with a `history` array is [`Format::SweAgent`] (when both
//!   are arrays, `messages` wins and `history` is kept in the envelope);
//! - an object followed by more JSON, or a single object with a `role`, is
//!   [`Format::JsonLines`].
//!
//! Use [`Transcript::parse_as`] / [`Transcript::load_as`] to force a format.
//!
//! ## SWE-agent `tool_call_ids`
//!
//! SWE-agent's tool messages answer with a list, `"tool_call_ids": ["call_1"]`,
//! instead of the standard `"tool_call_id": "call_1"`. On loading (any
//! format), a `role: "tool"` message with no `tool_call_id` key whose
//! `tool_call_ids` holds exactly one string gets that id as its
//! [`Message::tool_call_id`]; `tool_call_ids` itself stays in
//! [`Message::extra`]. With zero ids, more than one, or something else than a
//! list of strings, there is no faithful single id (splitting the message
//! would invent content), so `tool_call_id` stays unset, a [`Warning`] is
//! recorded, and [`crate::validate`] will report the unanswered calls. The
//! same holds when the id is already some tool message's `tool_call_id`:
//! writing back could not tell which of the two was added.
//!
//! Writing in the transcript's own [`Transcript::format`] removes the ids that
//! loading added, so the file round-trips; writing in another format is a
//! conversion to standard messages and keeps them.

mod agents;
mod error;

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::io;
use std::path::Path;
use std::str::FromStr;

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

use crate::message::{Message, Role, json_type};

pub use error::{LoadError, ParseFormatError, WriteError};

/// The file shapes a transcript can have (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// A JSON array of messages.
    Array,
    /// mini-swe-agent 1.x: an object with a `messages` array.
    MiniSweAgent,
    /// SWE-agent `.traj`: an object with a `history` array.
    SweAgent,
    /// JSON Lines: one message object per line.
    JsonLines,
    /// An Anthropic Messages request (`{"system", "messages"}` with content
    /// blocks), or a bare array of Anthropic messages.
    Anthropic,
    /// An OpenAI Responses request (`{"instructions", "input": [items]}`).
    Responses,
    /// A Claude Code session log (`~/.claude/projects/<project>/<session>.jsonl`).
    ClaudeCode,
    /// A Codex rollout (`~/.codex/sessions/**/rollout-*.jsonl`).
    Codex,
}

impl Format {
    /// Every format, for iterating (tests, CLI help).
    pub const ALL: [Format; 8] = [
        Format::Array,
        Format::MiniSweAgent,
        Format::SweAgent,
        Format::JsonLines,
        Format::Anthropic,
        Format::Responses,
        Format::ClaudeCode,
        Format::Codex,
    ];

    /// The formats that hold chat-completions messages as they are: a
    /// transcript converts between them without loss. The others are wire
    /// formats reached through a bridge (fields the chat model carries but
    /// the wire format has no place for, say a message's `extra`, are not
    /// written there).
    pub const CHAT: [Format; 4] = [
        Format::Array,
        Format::MiniSweAgent,
        Format::SweAgent,
        Format::JsonLines,
    ];

    /// The canonical name, accepted back by [`Format::from_str`].
    pub fn name(self) -> &'static str {
        match self {
            Format::Array => "array",
            Format::MiniSweAgent => "mini-swe-agent",
            Format::SweAgent => "swe-agent",
            Format::JsonLines => "jsonl",
            Format::Anthropic => "anthropic",
            Format::Responses => "responses",
            Format::ClaudeCode => "claude-code",
            Format::Codex => "codex",
        }
    }

    /// The top-level key holding the messages, for envelope formats.
    pub fn messages_key(self) -> Option<&'static str> {
        match self {
            Format::MiniSweAgent => Some("messages"),
            Format::SweAgent => Some("history"),
            _ => None,
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Format::Array => "a JSON array of messages",
            Format::MiniSweAgent => "a JSON object with a `messages` array (mini-swe-agent)",
            Format::SweAgent => "a JSON object with a `history` array (SWE-agent)",
            Format::JsonLines => "one JSON message object per line",
            Format::Anthropic => "an Anthropic Messages request (`messages` with content blocks)",
            Format::Responses => "an OpenAI Responses request (an `input` array)",
            Format::ClaudeCode => "a Claude Code session log (JSON Lines)",
            Format::Codex => "a Codex rollout (JSON Lines)",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = ParseFormatError;

    /// Accepts the canonical names and common aliases (`json`, `mini`,
    /// `messages`, `sweagent`, `history`, `traj`, `ndjson`, `json-lines`),
    /// case-insensitively.
    fn from_str(s: &str) -> Result<Format, ParseFormatError> {
        match s.to_ascii_lowercase().as_str() {
            "array" | "json" => Ok(Format::Array),
            "mini-swe-agent" | "mini" | "minisweagent" | "messages" => Ok(Format::MiniSweAgent),
            "swe-agent" | "sweagent" | "history" | "traj" => Ok(Format::SweAgent),
            "jsonl" | "json-lines" | "jsonlines" | "ndjson" => Ok(Format::JsonLines),
            "anthropic" | "anthropic-messages" | "claude" => Ok(Format::Anthropic),
            "responses" | "openai-responses" => Ok(Format::Responses),
            "claude-code" | "claudecode" => Ok(Format::ClaudeCode),
            "codex" | "rollout" => Ok(Format::Codex),
            _ => Err(ParseFormatError(s.to_owned())),
        }
    }
}

/// Something loading noticed but did not treat as an error.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// A tool message's `tool_call_ids` did not hold exactly one usable
    /// string id, so its `tool_call_id` was left unset.
    ToolCallIds {
        /// 0-based message index.
        index: usize,
        /// What is wrong, e.g. `holds 2 ids`.
        problem: String,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::ToolCallIds { index, problem } => write!(
                f,
                "message {index}: `tool_call_ids` {problem}; `tool_call_id` left unset"
            ),
        }
    }
}

/// A loaded transcript: the messages, and what surrounded them in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Transcript {
    /// The messages, in order. Edit freely; the envelope does not depend on
    /// them.
    pub messages: Vec<Message>,
    /// The format the transcript was read in, and the one
    /// [`Transcript::to_json_string`] writes.
    pub format: Format,
    source_name: String,
    /// Top-level keys other than the messages array, in order.
    metadata: Map<String, Value>,
    /// Where the messages key sat among the top-level keys.
    position: usize,
    /// Tool call ids that loading copied from `tool_call_ids`.
    added_ids: HashSet<String>,
    warnings: Vec<Warning>,
    /// The wire-format request the messages were converted from (Anthropic,
    /// Responses, and the session logs of Claude Code and Codex).
    wire: Option<agents::Wire>,
    /// For a session log, when each message was written (see
    /// [`Transcript::message_times`]); empty otherwise.
    times: Vec<Option<f64>>,
}

impl Transcript {
    /// A transcript built in code, as a plain array.
    pub fn from_messages(messages: Vec<Message>) -> Transcript {
        Transcript {
            messages,
            format: Format::Array,
            source_name: "<memory>".to_owned(),
            metadata: Map::new(),
            position: 0,
            added_ids: HashSet::new(),
            warnings: Vec::new(),
            wire: None,
            times: Vec::new(),
        }
    }

    fn from_wire(wire: agents::Wire, format: Format, source_name: String) -> Transcript {
        let mut t = Transcript::from_messages(wire.messages());
        t.format = format;
        t.source_name = source_name;
        t.wire = Some(wire);
        t
    }

    fn from_log((wire, times): agents::Log, format: Format, source_name: String) -> Transcript {
        let chat_times = wire.chat_times(&times);
        let mut t = Transcript::from_wire(wire, format, source_name);
        t.times = chat_times;
        t
    }

    /// When each message was written, in seconds since the Unix epoch, as
    /// far as the file says: for a Claude Code or Codex session log the
    /// time of the entries a message was made of, else the message's own
    /// `timestamp` ([`recorded_time`]). `None` where unknown. Indexed like
    /// [`Transcript::messages`] as loaded.
    pub fn message_times(&self) -> Vec<Option<f64>> {
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                self.times
                    .get(i)
                    .copied()
                    .flatten()
                    .or_else(|| recorded_time(m))
            })
            .collect()
    }

    /// Reads and parses a file, detecting its format.
    pub fn load(path: impl AsRef<Path>) -> Result<Transcript, LoadError> {
        Self::load_impl(path.as_ref(), None)
    }

    /// Reads and parses a file in the given format.
    pub fn load_as(path: impl AsRef<Path>, format: Format) -> Result<Transcript, LoadError> {
        Self::load_impl(path.as_ref(), Some(format))
    }

    fn load_impl(path: &Path, format: Option<Format>) -> Result<Transcript, LoadError> {
        let bytes = fs::read(path).map_err(|error| LoadError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        parse(&bytes, path.display().to_string(), format)
    }

    /// Parses text or bytes, detecting the format. `source_name` (a file
    /// name, `<stdin>`, …) prefixes every error.
    pub fn parse(
        input: impl AsRef<[u8]>,
        source_name: impl Into<String>,
    ) -> Result<Transcript, LoadError> {
        parse(input.as_ref(), source_name.into(), None)
    }

    /// Parses text or bytes in the given format.
    pub fn parse_as(
        input: impl AsRef<[u8]>,
        source_name: impl Into<String>,
        format: Format,
    ) -> Result<Transcript, LoadError> {
        parse(input.as_ref(), source_name.into(), Some(format))
    }

    /// For a transcript read from a wire format (an Anthropic or Responses
    /// request, a Claude Code or Codex session log): that format's own rules
    /// ([`crate::validate::anthropic`], [`crate::validate::responses`]) on
    /// the messages converted back into it, as `(rules name, violations)`,
    /// indexed in the format's messages / input items. `None` for chat
    /// formats.
    pub fn native_violations(&self) -> Option<(&'static str, Vec<crate::validate::Violation>)> {
        self.wire.as_ref().map(|w| w.violations(&self.messages))
    }

    /// The file path or name the transcript was parsed from.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// What loading noticed without failing (see [`Warning`]).
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// The top-level keys other than the messages array (mini-swe-agent's
    /// `info`, `instance_id`…; SWE-agent's `trajectory`, `environment`…), in
    /// file order. Empty for arrays and JSON Lines.
    pub fn metadata(&self) -> &Map<String, Value> {
        &self.metadata
    }

    /// Mutable [`Transcript::metadata`]. New keys are written after the
    /// messages array; a key equal to the messages key is not written.
    pub fn metadata_mut(&mut self) -> &mut Map<String, Value> {
        &mut self.metadata
    }

    /// The transcript in its own [`Transcript::format`], compact: for a
    /// loaded file, the same JSON value as the file.
    pub fn to_json_string(&self) -> String {
        self.render(self.format)
    }

    /// Like [`Transcript::to_json_string`], indented by two spaces (JSON
    /// Lines stay one message per line).
    pub fn to_json_string_pretty(&self) -> String {
        self.render_pretty(self.format)
    }

    /// The messages as JSON Lines, each line ending in `\n` (ids added from
    /// `tool_call_ids` are left out when the transcript was JSON Lines).
    pub fn to_jsonl_string(&self) -> String {
        self.render(Format::JsonLines)
    }

    /// The messages as a compact JSON array. For a transcript loaded as an
    /// array this is its own format, so ids added from `tool_call_ids` are
    /// left out; serialize [`Transcript::messages`] directly to keep them.
    pub fn to_array_string(&self) -> String {
        self.render(Format::Array)
    }

    /// The transcript in `format`, compact (see [`Transcript::write_to`]).
    pub fn render(&self, format: Format) -> String {
        self.render_impl(format, false)
    }

    /// The transcript in `format`, indented by two spaces.
    pub fn render_pretty(&self, format: Format) -> String {
        self.render_impl(format, true)
    }

    fn render_impl(&self, format: Format, pretty: bool) -> String {
        let mut out = Vec::new();
        // Writing into a Vec has no I/O error, and every map key here is a
        // string, so serde_json cannot fail.
        if self.write_to(&mut out, format, pretty).is_err() {
            return String::new();
        }
        // serde_json only writes UTF-8.
        String::from_utf8(out).unwrap_or_default()
    }

    /// Writes the transcript in `format`. Envelope formats write the
    /// metadata around the messages, under that format's key (so a SWE-agent
    /// transcript written as mini-swe-agent keeps `trajectory`, `info`…);
    /// arrays and JSON Lines write the messages only. In the transcript's own
    /// format, ids added from `tool_call_ids` are removed again.
    pub fn write_to<W: io::Write>(
        &self,
        mut writer: W,
        format: Format,
        pretty: bool,
    ) -> io::Result<()> {
        let messages = MessagesOut {
            messages: &self.messages,
            undo: (format == self.format).then_some(&self.added_ids),
        };
        let result = match format {
            Format::Anthropic | Format::Responses | Format::ClaudeCode | Format::Codex => {
                let own = self.wire.as_ref().filter(|w| {
                    matches!(
                        (w, format),
                        (
                            agents::Wire::Anthropic { .. },
                            Format::Anthropic | Format::ClaudeCode
                        ) | (
                            agents::Wire::Responses { .. },
                            Format::Responses | Format::Codex
                        )
                    )
                });
                let empty = agents::Wire::empty(format);
                let value = own
                    .or(empty.as_ref())
                    .map(|w| w.render(&self.messages))
                    .unwrap_or(Value::Null);
                to_writer(&mut writer, &value, pretty)
            }
            Format::JsonLines => {
                for m in messages.iter() {
                    serde_json::to_writer(&mut writer, &m)?;
                    writer.write_all(b"\n")?;
                }
                return Ok(());
            }
            Format::Array => to_writer(&mut writer, &messages, pretty),
            Format::MiniSweAgent | Format::SweAgent => {
                let key = format.messages_key().unwrap_or("messages");
                let envelope = EnvelopeOut {
                    metadata: &self.metadata,
                    position: self.position,
                    key,
                    messages,
                };
                to_writer(&mut writer, &envelope, pretty)
            }
        };
        result.map_err(io::Error::from)?;
        if pretty {
            writer.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Writes the transcript to a file in `format`; JSON formats are
    /// indented, as agents write them.
    pub fn write(&self, path: impl AsRef<Path>, format: Format) -> Result<(), WriteError> {
        let path = path.as_ref();
        let written = fs::File::create(path).and_then(|file| {
            let mut out = io::BufWriter::new(file);
            self.write_to(&mut out, format, true)?;
            io::Write::flush(&mut out)
        });
        written.map_err(|error| WriteError {
            path: path.to_path_buf(),
            error,
        })
    }
}

fn to_writer<W: io::Write, T: Serialize>(
    writer: W,
    value: &T,
    pretty: bool,
) -> serde_json::Result<()> {
    if pretty {
        serde_json::to_writer_pretty(writer, value)
    } else {
        serde_json::to_writer(writer, value)
    }
}

/// JSON whitespace (RFC 8259), which is narrower than Unicode's.
fn is_json_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

fn parse(
    bytes: &[u8],
    source_name: String,
    format: Option<Format>,
) -> Result<Transcript, LoadError> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            return Err(LoadError::NotUtf8 {
                source_name,
                byte: e.valid_up_to(),
            });
        }
    };
    // Editors on Windows add a byte-order mark; JSON forbids it but it is
    // harmless to skip.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let Some(first) = text.trim_start_matches(is_json_ws).chars().next() else {
        return Err(LoadError::Empty { source_name });
    };
    let detected = match format {
        None => agents::detect(text),
        Some(f @ (Format::ClaudeCode | Format::Codex)) => Some(f),
        Some(_) => None,
    };
    match detected.or(format) {
        Some(Format::ClaudeCode) => {
            let log = agents::claude_code(&source_name, text)?;
            return Ok(Transcript::from_log(log, Format::ClaudeCode, source_name));
        }
        Some(Format::Codex) => {
            let log = agents::codex(&source_name, text)?;
            return Ok(Transcript::from_log(log, Format::Codex, source_name));
        }
        _ => {}
    }
    let p = Parser { source_name };
    let wire_format = match format {
        Some(f @ (Format::Anthropic | Format::Responses)) => Some(f),
        Some(_) => None,
        None if first == '{' && text.contains("\"input\"") => {
            let value = p.json(text).ok();
            value
                .filter(agents::is_responses)
                .map(|_| Format::Responses)
        }
        None => None,
    };
    if let Some(f) = wire_format {
        let value = p.json(text)?;
        let wire = if f == Format::Anthropic {
            agents::anthropic_request(&p.source_name, value)?
        } else {
            agents::responses_request(&p.source_name, value)?
        };
        return Ok(Transcript::from_wire(wire, f, p.source_name));
    }
    let (messages, format, metadata, position) = match format {
        Some(Format::JsonLines) => (p.json_lines(text)?, Format::JsonLines, Map::new(), 0),
        Some(f) => {
            let value = p.json(text)?;
            p.whole(value, Some(f))?
        }
        None if first == '{' => p.detect_object(text)?,
        None => {
            let value = p.json(text)?;
            p.whole(value, None)?
        }
    };
    if anthropic_evidence(&messages, &metadata) {
        // Content blocks are Anthropic's: read the file as such.
        let value = p.json(text)?;
        if agents::is_anthropic(&value) {
            let wire = agents::anthropic_request(&p.source_name, value)?;
            return Ok(Transcript::from_wire(
                wire,
                Format::Anthropic,
                p.source_name,
            ));
        }
    }
    let mut transcript = Transcript {
        messages,
        format,
        source_name: p.source_name,
        metadata,
        position,
        added_ids: HashSet::new(),
        warnings: Vec::new(),
        wire: None,
        times: Vec::new(),
    };
    normalise_tool_call_ids(&mut transcript);
    Ok(transcript)
}

/// A message's recorded time in seconds since the Unix epoch: its
/// `timestamp` (a number of seconds, as mini-swe-agent writes in `extra`,
/// or at the top level).
pub fn recorded_time(m: &Message) -> Option<f64> {
    m.extra
        .get("extra")
        .and_then(|e| e.get("timestamp"))
        .or_else(|| m.extra.get("timestamp"))
        .and_then(Value::as_f64)
}

/// What marks `messages` (and the envelope's other keys, `metadata`) as
/// Anthropic Messages rather than OpenAI: a `tool_use`, `tool_result` or
/// thinking content block, or a top-level `system` next to the messages.
fn anthropic_evidence(messages: &[Message], metadata: &Map<String, Value>) -> bool {
    let block = |m: &Message| {
        m.content.parts().iter().any(|p| {
            matches!(
                p.part_type(),
                Some("tool_use" | "tool_result" | "thinking" | "redacted_thinking")
            )
        })
    };
    messages.iter().any(block) || metadata.contains_key("system")
}

type Parsed = (Vec<Message>, Format, Map<String, Value>, usize);

struct Parser {
    source_name: String,
}

impl Parser {
    fn json_error(&self, e: &serde_json::Error, line_in_file: Option<usize>) -> LoadError {
        let full = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
        LoadError::Json {
            source_name: self.source_name.clone(),
            line: line_in_file.unwrap_or(e.line()),
            column: e.column(),
            message,
            truncated: e.is_eof(),
        }
    }

    fn json(&self, text: &str) -> Result<Value, LoadError> {
        serde_json::from_str(text).map_err(|e| self.json_error(&e, None))
    }

    fn message(
        &self,
        index: usize,
        line: Option<usize>,
        value: Value,
    ) -> Result<Message, LoadError> {
        Message::from_value(value).map_err(|error| LoadError::Shape {
            source_name: self.source_name.clone(),
            index,
            line,
            error,
        })
    }

    fn messages(&self, items: Vec<Value>) -> Result<Vec<Message>, LoadError> {
        items
            .into_iter()
            .enumerate()
            .map(|(i, v)| self.message(i, None, v))
            .collect()
    }

    /// An input starting with `{`: an envelope, or JSON Lines.
    fn detect_object(&self, text: &str) -> Result<Parsed, LoadError> {
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        let first = match stream.next() {
            Some(Ok(v)) => v,
            Some(Err(e)) => return Err(self.json_error(&e, None)),
            None => {
                return Err(LoadError::Empty {
                    source_name: self.source_name.clone(),
                });
            }
        };
        let rest = text.get(stream.byte_offset()..).unwrap_or("");
        if !rest.trim_start_matches(is_json_ws).is_empty() {
            drop(first);
            let first_line = text.split('\n').next().unwrap_or("");
            if stream.byte_offset() > first_line.len() {
                // A multi-line object followed by more is not JSON Lines but a
                // JSON file with trailing garbage: say where it starts.
                if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
                    return Err(self.json_error(&e, None));
                }
            }
            return Ok((self.json_lines(text)?, Format::JsonLines, Map::new(), 0));
        }
        let is_single_message = first.as_object().is_some_and(|o| {
            o.contains_key("role") && !o.contains_key("messages") && !o.contains_key("history")
        });
        if is_single_message {
            let message = self.message(0, Some(1), first)?;
            return Ok((vec![message], Format::JsonLines, Map::new(), 0));
        }
        self.whole(first, None)
    }

    /// A whole-file JSON value, in `format` or detected.
    fn whole(&self, value: Value, format: Option<Format>) -> Result<Parsed, LoadError> {
        let map = match value {
            Value::Array(items) if matches!(format, None | Some(Format::Array)) => {
                return Ok((self.messages(items)?, Format::Array, Map::new(), 0));
            }
            Value::Object(map) if format != Some(Format::Array) => map,
            other => {
                return Err(LoadError::UnexpectedTopLevel {
                    source_name: self.source_name.clone(),
                    expected: format.map_or(ANY_EXPECTED, Format::expected),
                    found: describe(&other),
                });
            }
        };
        let format = match format {
            Some(f) => f,
            None => {
                let is_array = |k: &str| map.get(k).is_some_and(Value::is_array);
                if is_array("messages") {
                    Format::MiniSweAgent
                } else if is_array("history") {
                    Format::SweAgent
                } else if map.contains_key("messages") {
                    Format::MiniSweAgent
                } else if map.contains_key("history") {
                    Format::SweAgent
                } else {
                    return Err(LoadError::UnexpectedTopLevel {
                        source_name: self.source_name.clone(),
                        expected: ANY_EXPECTED,
                        found: describe(&Value::Object(map)),
                    });
                }
            }
        };
        let key = format.messages_key().unwrap_or("messages");
        let Some(position) = map.keys().position(|k| k == key) else {
            return Err(LoadError::UnexpectedTopLevel {
                source_name: self.source_name.clone(),
                expected: format.expected(),
                found: describe(&Value::Object(map)),
            });
        };
        let mut metadata = map;
        match metadata.shift_remove(key) {
            Some(Value::Array(items)) => Ok((self.messages(items)?, format, metadata, position)),
            other => Err(LoadError::NotAnArray {
                source_name: self.source_name.clone(),
                field: key,
                found: other.as_ref().map_or("nothing", json_type),
            }),
        }
    }

    /// JSON Lines: one message per non-blank line; errors give the file line.
    fn json_lines(&self, text: &str) -> Result<Vec<Message>, LoadError> {
        let mut messages = Vec::new();
        for (i, line) in text.split('\n').enumerate() {
            let line_no = i + 1;
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.trim_start_matches(is_json_ws).is_empty() {
                continue;
            }
            let value: Value =
                serde_json::from_str(line).map_err(|e| self.json_error(&e, Some(line_no)))?;
            messages.push(self.message(messages.len(), Some(line_no), value)?);
        }
        if messages.is_empty() {
            return Err(LoadError::Empty {
                source_name: self.source_name.clone(),
            });
        }
        Ok(messages)
    }
}

const ANY_EXPECTED: &str =
    "a JSON array of messages, an object with a `messages` or `history` array, or JSON Lines";

/// Names what a top-level value is, listing an object's keys (the usual
/// mistake is a file of another tool, and its keys tell which).
fn describe(value: &Value) -> String {
    const MAX_KEYS: usize = 12;
    const MAX_KEY_CHARS: usize = 40;
    match value {
        Value::Object(map) if map.is_empty() => "an empty object".to_owned(),
        Value::Object(map) => {
            let mut keys: Vec<String> = map
                .keys()
                .take(MAX_KEYS)
                .map(|k| {
                    if k.chars().count() > MAX_KEY_CHARS {
                        let short: String = k.chars().take(MAX_KEY_CHARS).collect();
                        format!("{short}…")
                    } else {
                        k.clone()
                    }
                })
                .collect();
            if map.len() > MAX_KEYS {
                keys.push(format!("… ({} keys in all)", map.len()));
            }
            format!("keys {}", keys.join(", "))
        }
        other => json_type(other).to_owned(),
    }
}

/// Copies SWE-agent's single `tool_call_ids` entry into `tool_call_id` (see
/// the module docs).
fn normalise_tool_call_ids(t: &mut Transcript) {
    // Ids some tool message already answers with a standard `tool_call_id`:
    // adding the same id elsewhere could not be told apart when writing back.
    let present: HashSet<String> = t
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| m.tool_call_id.clone())
        .collect();
    for (index, m) in t.messages.iter_mut().enumerate() {
        if m.role != Role::Tool || m.tool_call_id.is_some() || m.extra.contains_key("tool_call_id")
        {
            continue;
        }
        let Some(ids) = m.extra.get("tool_call_ids") else {
            continue;
        };
        let problem = match ids {
            Value::Array(list) => match list.as_slice() {
                [Value::String(id)] if present.contains(id) => {
                    format!("repeats `{id}`, which another message has as `tool_call_id`")
                }
                [Value::String(id)] => {
                    t.added_ids.insert(id.clone());
                    m.tool_call_id = Some(id.clone());
                    continue;
                }
                [] => "is an empty list".to_owned(),
                many if many.iter().all(Value::is_string) => format!("holds {} ids", many.len()),
                _ => "is not a list of strings".to_owned(),
            },
            other => format!("is {}, not a list", json_type(other)),
        };
        t.warnings.push(Warning::ToolCallIds { index, problem });
    }
}

/// The messages for output, with loading's added ids optionally removed.
struct MessagesOut<'a> {
    messages: &'a [Message],
    undo: Option<&'a HashSet<String>>,
}

impl<'a> MessagesOut<'a> {
    fn iter(&self) -> impl Iterator<Item = MessageOut<'a>> + '_ {
        self.messages.iter().map(|message| MessageOut {
            message,
            undo: self.undo,
        })
    }
}

impl Serialize for MessagesOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.messages.len()))?;
        for m in self.iter() {
            seq.serialize_element(&m)?;
        }
        seq.end()
    }
}

struct MessageOut<'a> {
    message: &'a Message,
    undo: Option<&'a HashSet<String>>,
}

impl MessageOut<'_> {
    /// Whether loading added this message's `tool_call_id`: it is one of the
    /// added ids and still the only entry of its `tool_call_ids`.
    fn has_added_id(&self) -> bool {
        let (Some(undo), Some(id)) = (self.undo, self.message.tool_call_id.as_ref()) else {
            return false;
        };
        self.message.role == Role::Tool
            && undo.contains(id)
            && matches!(
                self.message.extra.get("tool_call_ids"),
                Some(Value::Array(list)) if matches!(list.as_slice(), [Value::String(only)] if only == id)
            )
    }
}

impl Serialize for MessageOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.has_added_id() {
            // Rare (SWE-agent tool results only) and small: a clone is
            // simpler than filtering the serializer.
            let mut original = self.message.clone();
            original.tool_call_id = None;
            original.serialize(s)
        } else {
            self.message.serialize(s)
        }
    }
}

/// The metadata with the messages put back at their position.
struct EnvelopeOut<'a> {
    metadata: &'a Map<String, Value>,
    position: usize,
    key: &'static str,
    messages: MessagesOut<'a>,
}

impl Serialize for EnvelopeOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        let mut written = false;
        for (i, (k, v)) in self.metadata.iter().enumerate() {
            if i == self.position {
                map.serialize_entry(self.key, &self.messages)?;
                written = true;
            }
            if k != self.key {
                map.serialize_entry(k, v)?;
            }
        }
        if !written {
            map.serialize_entry(self.key, &self.messages)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests;
