//! The lossless OpenAI chat-completions message model.
//!
//! Every engine reads and writes [`Message`]. Agents put far more into their
//! transcripts than the wire format names (SWE-agent's `thought`/`action`,
//! mini-swe-agent's `extra` with the raw provider response, `role: "exit"`),
//! and an engine that drops what it does not understand corrupts the user's
//! history. So each type has typed fields for what the engines reason about
//! and keeps everything else, in its original key order, in `extra`: parsing
//! then serializing gives back the same JSON, key for key.
//!
//! A known key whose value does not have the expected type (say
//! `"tool_calls": null`) is kept verbatim in `extra` and the typed field stays
//! unset; `validate` is the place that judges such messages, not the parser.
//!
//! This module knows nothing of files: other formats convert at the edge, in
//! [`crate::transcript`].

pub(crate) mod layout;
pub mod summary_marks;

use std::borrow::Cow;
use std::fmt;

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use layout::{Layout, Record, emit_opt, object, string};

/// The four [`Record`] accessors of a struct with `extra` and `layout` fields.
macro_rules! record_storage {
    () => {
        fn extra(&self) -> &Extra {
            &self.extra
        }
        fn extra_mut(&mut self) -> &mut Extra {
            &mut self.extra
        }
        fn layout(&self) -> &Layout {
            &self.layout
        }
        fn layout_mut(&mut self) -> &mut Layout {
            &mut self.layout
        }
    };
}
pub(crate) use record_storage;

/// Unknown fields of a record, in their original order.
pub type Extra = Map<String, Value>;

/// Who wrote a message. Unknown roles (real transcripts contain `"exit"`) are
/// kept as they are.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    /// The legacy result of a `function_call`.
    Function,
    Other(String),
}

impl Role {
    pub fn parse(s: &str) -> Role {
        match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "function" => Role::Function,
            other => Role::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Function => "function",
            Role::Other(s) => s,
        }
    }

    /// System and developer messages both carry instructions.
    pub fn is_instruction(&self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Role {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A message's `content`, distinguishing absent from `null`.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Content {
    /// No `content` key at all.
    #[default]
    Absent,
    /// `"content": null` (assistant messages that only call tools).
    Null,
    Text(String),
    Parts(Vec<ContentPart>),
}

impl Content {
    /// The text of the content: the string, or the text parts joined by
    /// newlines. Borrowed when there is a single piece.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Absent | Content::Null => Cow::Borrowed(""),
            Content::Text(s) => Cow::Borrowed(s),
            Content::Parts(parts) => {
                let mut texts = parts.iter().filter_map(ContentPart::text);
                match (texts.next(), texts.next()) {
                    (None, _) => Cow::Borrowed(""),
                    (Some(one), None) => Cow::Borrowed(one),
                    (Some(a), Some(b)) => {
                        let mut s = format!("{a}\n{b}");
                        for t in texts {
                            s.push('\n');
                            s.push_str(t);
                        }
                        Cow::Owned(s)
                    }
                }
            }
        }
    }

    /// The parts, or an empty slice for string or missing content.
    pub fn parts(&self) -> &[ContentPart] {
        match self {
            Content::Parts(p) => p,
            _ => &[],
        }
    }

    fn take(value: Value) -> Result<Content, Value> {
        match value {
            Value::Null => Ok(Content::Null),
            Value::String(s) => Ok(Content::Text(s)),
            Value::Array(items) if items.iter().all(Value::is_object) => Ok(Content::Parts(
                items
                    .into_iter()
                    .filter_map(|v| object(v).ok())
                    .map(ContentPart)
                    .collect(),
            )),
            other => Err(other),
        }
    }
}

/// One element of a content list. Kept as the JSON object it was, so unknown
/// part types and fields survive; [`ContentPart::kind`] gives the typed view.
#[derive(Clone, Debug, PartialEq)]
pub struct ContentPart(Extra);

/// Typed view of a [`ContentPart`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartKind<'a> {
    Text(&'a str),
    ImageUrl {
        url: &'a str,
        detail: Option<&'a str>,
    },
    InputAudio {
        data: &'a str,
        format: Option<&'a str>,
    },
    File {
        file_id: Option<&'a str>,
        filename: Option<&'a str>,
        file_data: Option<&'a str>,
    },
    Refusal(&'a str),
    /// A part type this crate does not model (or a malformed known one); its
    /// `type` when it has one.
    Unknown(Option<&'a str>),
}

impl ContentPart {
    /// `{"type": "text", "text": text}`.
    pub fn new_text(text: impl Into<String>) -> ContentPart {
        let mut m = Map::new();
        m.insert("type".into(), "text".into());
        m.insert("text".into(), Value::String(text.into()));
        ContentPart(m)
    }

    /// `{"type": "image_url", "image_url": {"url": url}}`.
    pub fn new_image_url(url: impl Into<String>) -> ContentPart {
        let mut inner = Map::new();
        inner.insert("url".into(), Value::String(url.into()));
        let mut m = Map::new();
        m.insert("type".into(), "image_url".into());
        m.insert("image_url".into(), Value::Object(inner));
        ContentPart(m)
    }

    pub fn from_map(map: Extra) -> ContentPart {
        ContentPart(map)
    }

    pub fn as_map(&self) -> &Extra {
        &self.0
    }

    pub fn into_map(self) -> Extra {
        self.0
    }

    /// The part's `type` field.
    pub fn part_type(&self) -> Option<&str> {
        self.0.get("type").and_then(Value::as_str)
    }

    pub fn kind(&self) -> PartKind<'_> {
        fn s(v: Option<&Value>) -> Option<&str> {
            v.and_then(Value::as_str)
        }
        let inner = |key: &str| self.0.get(key).and_then(Value::as_object);
        let ty = self.part_type();
        let typed = match ty {
            Some("text") => s(self.0.get("text")).map(PartKind::Text),
            Some("refusal") => s(self.0.get("refusal")).map(PartKind::Refusal),
            Some("image_url") => inner("image_url").and_then(|o| {
                Some(PartKind::ImageUrl {
                    url: s(o.get("url"))?,
                    detail: s(o.get("detail")),
                })
            }),
            Some("input_audio") => inner("input_audio").and_then(|o| {
                Some(PartKind::InputAudio {
                    data: s(o.get("data"))?,
                    format: s(o.get("format")),
                })
            }),
            Some("file") => inner("file").map(|o| PartKind::File {
                file_id: s(o.get("file_id")),
                filename: s(o.get("filename")),
                file_data: s(o.get("file_data")),
            }),
            _ => None,
        };
        typed.unwrap_or(PartKind::Unknown(ty))
    }

    /// The text of a text part.
    pub fn text(&self) -> Option<&str> {
        match self.kind() {
            PartKind::Text(t) => Some(t),
            _ => None,
        }
    }

    /// Whether the part carries an image, audio or a file rather than text.
    pub fn is_binary(&self) -> bool {
        matches!(
            self.kind(),
            PartKind::ImageUrl { .. } | PartKind::InputAudio { .. } | PartKind::File { .. }
        )
    }
}

impl Serialize for ContentPart {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// The `function` of a tool call, or a legacy `function_call`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    /// JSON-encoded arguments, exactly as the model produced them (possibly
    /// invalid JSON: that is the model's output and is kept).
    pub arguments: String,
    pub extra: Extra,
    layout: Layout,
}

impl FunctionCall {
    pub fn new(name: impl Into<String>, arguments: impl Into<String>) -> FunctionCall {
        FunctionCall {
            name: name.into(),
            arguments: arguments.into(),
            ..FunctionCall::default()
        }
    }

    /// Builds a function call from an object that has string `name` and
    /// `arguments`, or gives the object back.
    fn take(value: Value) -> Result<FunctionCall, Value> {
        let fits = |v: &Value| {
            v.as_object().is_some_and(|o| {
                o.get("name").is_some_and(Value::is_string)
                    && o.get("arguments").is_some_and(Value::is_string)
            })
        };
        if !fits(&value) {
            return Err(value);
        }
        let mut call = FunctionCall::default();
        layout::fill(&mut call, object(value)?);
        Ok(call)
    }
}

impl Record for FunctionCall {
    const FIELDS: &'static [&'static str] = &["name", "arguments"];

    fn take(&mut self, index: usize, value: Value) -> Result<(), Value> {
        match index {
            0 => self.name = string(value)?,
            _ => self.arguments = string(value)?,
        }
        Ok(())
    }

    fn emit<M: SerializeMap>(&self, index: usize, map: &mut M) -> Result<bool, M::Error> {
        match index {
            0 => map.serialize_entry("name", &self.name)?,
            _ => map.serialize_entry("arguments", &self.arguments)?,
        }
        Ok(true)
    }

    fn is_set(&self, _index: usize) -> bool {
        true
    }

    record_storage!();
}

impl Serialize for FunctionCall {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        layout::serialize(self, s)
    }
}

/// One entry of an assistant message's `tool_calls`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolCall {
    /// The id the tool result must answer with. Optional here because some
    /// transcripts omit it; `validate` reports that.
    pub id: Option<String>,
    /// The `type` field (`"function"` on the wire).
    pub kind: Option<String>,
    pub function: Option<FunctionCall>,
    pub extra: Extra,
    layout: Layout,
}

impl ToolCall {
    /// A `type: "function"` call.
    pub fn function(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> ToolCall {
        ToolCall {
            id: Some(id.into()),
            kind: Some("function".into()),
            function: Some(FunctionCall::new(name, arguments)),
            ..ToolCall::default()
        }
    }

    /// The called function's name, if the call has one.
    pub fn name(&self) -> Option<&str> {
        self.function.as_ref().map(|f| f.name.as_str())
    }
}

impl Record for ToolCall {
    const FIELDS: &'static [&'static str] = &["id", "type", "function"];

    fn take(&mut self, index: usize, value: Value) -> Result<(), Value> {
        match index {
            0 => self.id = Some(string(value)?),
            1 => self.kind = Some(string(value)?),
            _ => self.function = Some(FunctionCall::take(value)?),
        }
        Ok(())
    }

    fn emit<M: SerializeMap>(&self, index: usize, map: &mut M) -> Result<bool, M::Error> {
        match index {
            0 => emit_opt(map, "id", self.id.as_ref()),
            1 => emit_opt(map, "type", self.kind.as_ref()),
            _ => emit_opt(map, "function", self.function.as_ref()),
        }
    }

    fn is_set(&self, index: usize) -> bool {
        match index {
            0 => self.id.is_some(),
            1 => self.kind.is_some(),
            _ => self.function.is_some(),
        }
    }

    record_storage!();
}

impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        layout::serialize(self, s)
    }
}

/// Why a JSON value is not a message. The transcript loader adds the file and
/// message index.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("expected a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    #[error("missing field `role`")]
    MissingRole,
    #[error("field `role` must be a string, found {found}")]
    RoleNotString { found: &'static str },
}

impl ShapeError {
    /// The offending field, if the error is about one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            ShapeError::NotAnObject { .. } => None,
            ShapeError::MissingRole | ShapeError::RoleNotString { .. } => Some("role"),
        }
    }
}

/// Names the JSON type of `value`, for error messages.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One chat-completions message, lossless (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Content,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub tool_call_id: Option<String>,
    /// Legacy single function call of older assistant messages.
    pub function_call: Option<FunctionCall>,
    /// Reasoning text some providers (DeepSeek, Qwen, vLLM) return and agents
    /// re-send.
    pub reasoning_content: Option<String>,
    pub extra: Extra,
    layout: Layout,
}

impl Message {
    pub fn new(role: Role, content: Content) -> Message {
        Message {
            role,
            content,
            name: None,
            tool_calls: None,
            tool_call_id: None,
            function_call: None,
            reasoning_content: None,
            extra: Extra::new(),
            layout: Layout::default(),
        }
    }

    pub fn system(text: impl Into<String>) -> Message {
        Message::new(Role::System, Content::Text(text.into()))
    }

    pub fn user(text: impl Into<String>) -> Message {
        Message::new(Role::User, Content::Text(text.into()))
    }

    pub fn assistant(text: impl Into<String>) -> Message {
        Message::new(Role::Assistant, Content::Text(text.into()))
    }

    /// An assistant turn that calls tools (`content: null` when `text` is
    /// empty, as providers send it).
    pub fn assistant_tool_calls(text: impl Into<String>, calls: Vec<ToolCall>) -> Message {
        let text = text.into();
        let content = if text.is_empty() {
            Content::Null
        } else {
            Content::Text(text)
        };
        let mut m = Message::new(Role::Assistant, content);
        m.tool_calls = Some(calls);
        m
    }

    /// A `role: "tool"` result answering `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, text: impl Into<String>) -> Message {
        let mut m = Message::new(Role::Tool, Content::Text(text.into()));
        m.tool_call_id = Some(tool_call_id.into());
        m
    }

    /// Parses one message from a JSON value.
    pub fn from_value(value: Value) -> Result<Message, ShapeError> {
        let object = match value {
            Value::Object(o) => o,
            other => {
                return Err(ShapeError::NotAnObject {
                    found: json_type(&other),
                });
            }
        };
        let role = match object.get("role") {
            Some(Value::String(r)) => Role::parse(r),
            Some(other) => {
                return Err(ShapeError::RoleNotString {
                    found: json_type(other),
                });
            }
            None => return Err(ShapeError::MissingRole),
        };
        let mut message = Message::new(role, Content::Absent);
        layout::fill(&mut message, object);
        Ok(message)
    }

    /// The message as a JSON value, in its original key order.
    pub fn to_value(&self) -> Value {
        // Serializing into a `Value` cannot fail: every key is a string and
        // every leaf is already JSON.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The text of the content (see [`Content::text`]).
    pub fn text(&self) -> Cow<'_, str> {
        self.content.text()
    }

    /// The tool calls, or an empty slice.
    pub fn tool_calls(&self) -> &[ToolCall] {
        self.tool_calls.as_deref().unwrap_or(&[])
    }

    /// Whether this is an assistant message that calls at least one tool.
    pub fn has_tool_calls(&self) -> bool {
        !self.tool_calls().is_empty()
    }

    /// Whether this message is a structured tool result (`role: "tool"` or the
    /// legacy `role: "function"`).
    pub fn is_tool_result(&self) -> bool {
        matches!(self.role, Role::Tool | Role::Function)
    }
}

impl Record for Message {
    const FIELDS: &'static [&'static str] = &[
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "function_call",
        "reasoning_content",
    ];

    fn take(&mut self, index: usize, value: Value) -> Result<(), Value> {
        match index {
            0 => self.role = Role::parse(&string(value)?),
            1 => self.content = Content::take(value)?,
            2 => self.name = Some(string(value)?),
            3 => self.tool_calls = Some(take_tool_calls(value)?),
            4 => self.tool_call_id = Some(string(value)?),
            5 => self.function_call = Some(FunctionCall::take(value)?),
            _ => self.reasoning_content = Some(string(value)?),
        }
        Ok(())
    }

    fn emit<M: SerializeMap>(&self, index: usize, map: &mut M) -> Result<bool, M::Error> {
        match index {
            0 => {
                map.serialize_entry("role", &self.role)?;
                Ok(true)
            }
            1 => match &self.content {
                Content::Absent => Ok(false),
                Content::Null => {
                    map.serialize_entry("content", &Value::Null)?;
                    Ok(true)
                }
                Content::Text(t) => {
                    map.serialize_entry("content", t)?;
                    Ok(true)
                }
                Content::Parts(p) => {
                    map.serialize_entry("content", p)?;
                    Ok(true)
                }
            },
            2 => emit_opt(map, "name", self.name.as_ref()),
            3 => emit_opt(map, "tool_calls", self.tool_calls.as_ref()),
            4 => emit_opt(map, "tool_call_id", self.tool_call_id.as_ref()),
            5 => emit_opt(map, "function_call", self.function_call.as_ref()),
            _ => emit_opt(map, "reasoning_content", self.reasoning_content.as_ref()),
        }
    }

    fn is_set(&self, index: usize) -> bool {
        match index {
            0 => true,
            1 => self.content != Content::Absent,
            2 => self.name.is_some(),
            3 => self.tool_calls.is_some(),
            4 => self.tool_call_id.is_some(),
            5 => self.function_call.is_some(),
            _ => self.reasoning_content.is_some(),
        }
    }

    record_storage!();
}

fn take_tool_calls(value: Value) -> Result<Vec<ToolCall>, Value> {
    match value {
        Value::Array(items) if items.iter().all(Value::is_object) => Ok(items
            .into_iter()
            .filter_map(|v| object(v).ok())
            .map(|o| {
                let mut call = ToolCall::default();
                layout::fill(&mut call, o);
                call
            })
            .collect()),
        other => Err(other),
    }
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        layout::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Message, D::Error> {
        let value = Value::deserialize(d)?;
        Message::from_value(value).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
