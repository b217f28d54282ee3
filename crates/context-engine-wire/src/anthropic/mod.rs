//! The lossless Anthropic Messages request model (`POST /v1/messages`).
//!
//! Like [`crate::message`], every type keeps what it does not model in
//! `extra`, in its original key order, so parsing then serializing gives
//! back the same JSON. Content blocks are kept as the JSON objects they were
//! ([`Block`]) with a typed view ([`BlockKind`]): `thinking` signatures,
//! `redacted_thinking` data, `cache_control` on any block, server-tool blocks
//! and block types this crate has never heard of all pass through untouched.
//!
//! The engine does not work on this model directly: [`bridge`] converts it to
//! chat messages and back, keeping every part the engine did not change
//! byte-identical. Provider rules live in [`crate::validate::anthropic`].

pub mod bridge;
pub mod cache;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::message::layout::{self, Layout, Record, object, string};
use crate::message::{Extra, json_type, record_storage};

/// Why a JSON value is not an Anthropic Messages request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("expected a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    #[error("missing field `{field}`")]
    Missing { field: &'static str },
    #[error("field `{field}` must be {expected}, found {found}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{what} {index}: {error}")]
    At {
        what: &'static str,
        index: usize,
        error: Box<FormatError>,
    },
    #[error("invalid JSON: {0}")]
    Json(String),
}

impl FormatError {
    fn at(what: &'static str, index: usize, error: FormatError) -> FormatError {
        FormatError::At {
            what,
            index,
            error: Box::new(error),
        }
    }
}

/// Parses a request body's JSON.
pub(crate) fn parse_json(text: &str) -> Result<Value, FormatError> {
    serde_json::from_str(text).map_err(|e| FormatError::Json(e.to_string()))
}

/// Takes the object out of `value`, or says what it was.
pub(crate) fn expect_object(value: Value) -> Result<Map<String, Value>, FormatError> {
    object(value).map_err(|v| FormatError::NotAnObject {
        found: json_type(&v),
    })
}

/// One content block, kept as the JSON object it was.
#[derive(Clone, Debug, PartialEq)]
pub struct Block(Extra);

/// Typed view of a [`Block`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlockKind<'a> {
    Text(&'a str),
    Image,
    Document,
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: Option<&'a Value>,
        is_error: bool,
    },
    Thinking {
        thinking: &'a str,
        signature: Option<&'a str>,
    },
    RedactedThinking {
        data: &'a str,
    },
    /// `server_tool_use`, `mcp_tool_use`: a call the server runs itself.
    ServerToolUse {
        id: &'a str,
        name: &'a str,
    },
    /// A server tool's result (`web_search_tool_result`,
    /// `code_execution_tool_result`, `mcp_tool_result`, …), answering `id`.
    ServerToolResult {
        tool_use_id: &'a str,
    },
    /// A type this crate does not model (or a malformed known one).
    Unknown(Option<&'a str>),
}

impl Block {
    /// `{"type": "text", "text": text}`.
    pub fn new_text(text: impl Into<String>) -> Block {
        Block(crate::message::ContentPart::new_text(text).into_map())
    }

    pub fn from_map(map: Extra) -> Block {
        Block(map)
    }

    pub fn as_map(&self) -> &Extra {
        &self.0
    }

    pub fn as_map_mut(&mut self) -> &mut Extra {
        &mut self.0
    }

    pub fn into_map(self) -> Extra {
        self.0
    }

    /// The block's `type`.
    pub fn block_type(&self) -> Option<&str> {
        self.0.get("type").and_then(Value::as_str)
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    pub fn kind(&self) -> BlockKind<'_> {
        let ty = self.block_type();
        let typed = match ty {
            Some("text") => self.str("text").map(BlockKind::Text),
            Some("image") => Some(BlockKind::Image),
            Some("document") => Some(BlockKind::Document),
            Some("tool_use") => (|| {
                Some(BlockKind::ToolUse {
                    id: self.str("id")?,
                    name: self.str("name")?,
                    input: self.0.get("input")?,
                })
            })(),
            Some("tool_result") => self.str("tool_use_id").map(|id| BlockKind::ToolResult {
                tool_use_id: id,
                content: self.0.get("content"),
                is_error: self.0.get("is_error").and_then(Value::as_bool) == Some(true),
            }),
            Some("thinking") => self.str("thinking").map(|t| BlockKind::Thinking {
                thinking: t,
                signature: self.str("signature"),
            }),
            Some("redacted_thinking") => self
                .str("data")
                .map(|data| BlockKind::RedactedThinking { data }),
            Some("server_tool_use" | "mcp_tool_use") => (|| {
                Some(BlockKind::ServerToolUse {
                    id: self.str("id")?,
                    name: self.str("name")?,
                })
            })(),
            Some(t) if t.ends_with("_tool_result") => self
                .str("tool_use_id")
                .map(|id| BlockKind::ServerToolResult { tool_use_id: id }),
            _ => None,
        };
        typed.unwrap_or(BlockKind::Unknown(ty))
    }

    /// The text of a text block.
    pub fn text(&self) -> Option<&str> {
        match self.kind() {
            BlockKind::Text(t) => Some(t),
            _ => None,
        }
    }

    /// Whether this is a `thinking` or `redacted_thinking` block.
    pub fn is_thinking(&self) -> bool {
        matches!(
            self.kind(),
            BlockKind::Thinking { .. } | BlockKind::RedactedThinking { .. }
        )
    }
}

impl Serialize for Block {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// A message's (or the system prompt's) content: a string or blocks.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

impl Content {
    /// The blocks, or an empty slice for string content.
    pub fn blocks(&self) -> &[Block] {
        match self {
            Content::Blocks(b) => b,
            Content::Text(_) => &[],
        }
    }

    /// The text: the string, or the text blocks joined by newlines.
    pub fn text(&self) -> String {
        match self {
            Content::Text(s) => s.clone(),
            Content::Blocks(blocks) => blocks
                .iter()
                .filter_map(Block::text)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Reads content from a string or an array of objects; anything else is
    /// given back.
    pub fn take(value: Value) -> Result<Content, Value> {
        match value {
            Value::String(s) => Ok(Content::Text(s)),
            Value::Array(items) if items.iter().all(Value::is_object) => Ok(Content::Blocks(
                items
                    .into_iter()
                    .filter_map(|v| object(v).ok())
                    .map(Block)
                    .collect(),
            )),
            other => Err(other),
        }
    }
}

impl Serialize for Content {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Content::Text(t) => t.serialize(s),
            Content::Blocks(b) => b.serialize(s),
        }
    }
}

/// One entry of `messages`. `role` is kept as written (Claude Code sends
/// `"system"` entries too); `validate` judges it.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: String,
    /// `None` when `content` is missing or not a string / list of objects
    /// (then it is kept verbatim in `extra`).
    pub content: Option<Content>,
    pub extra: Extra,
    layout: Layout,
}

impl Message {
    pub fn new(role: impl Into<String>, content: Content) -> Message {
        Message {
            role: role.into(),
            content: Some(content),
            extra: Extra::new(),
            layout: Layout::default(),
        }
    }

    pub fn from_value(value: Value) -> Result<Message, FormatError> {
        let map = expect_object(value)?;
        match map.get("role") {
            Some(Value::String(_)) => {}
            Some(other) => {
                return Err(FormatError::WrongType {
                    field: "role",
                    expected: "a string",
                    found: json_type(other),
                });
            }
            None => return Err(FormatError::Missing { field: "role" }),
        }
        let mut m = Message {
            role: String::new(),
            content: None,
            extra: Extra::new(),
            layout: Layout::default(),
        };
        layout::fill(&mut m, map);
        Ok(m)
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The blocks, or an empty slice.
    pub fn blocks(&self) -> &[Block] {
        self.content.as_ref().map(Content::blocks).unwrap_or(&[])
    }
}

impl Record for Message {
    const FIELDS: &'static [&'static str] = &["role", "content"];

    fn take(&mut self, index: usize, value: Value) -> Result<(), Value> {
        match index {
            0 => self.role = string(value)?,
            _ => self.content = Some(Content::take(value)?),
        }
        Ok(())
    }

    fn emit<M: SerializeMap>(&self, index: usize, map: &mut M) -> Result<bool, M::Error> {
        match index {
            0 => {
                map.serialize_entry("role", &self.role)?;
                Ok(true)
            }
            _ => layout::emit_opt(map, "content", self.content.as_ref()),
        }
    }

    fn is_set(&self, index: usize) -> bool {
        index == 0 || self.content.is_some()
    }

    record_storage!();
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        layout::serialize(self, s)
    }
}

/// A whole `/v1/messages` request body: `system` and `messages` typed,
/// everything else (`model`, `max_tokens`, `tools`, `thinking`, `metadata`,
/// `stream`…) kept in order in `extra`.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// The top-level system prompt, text or blocks.
    pub system: Option<Content>,
    pub messages: Vec<Message>,
    pub extra: Extra,
    layout: Layout,
}

impl Request {
    pub fn new(messages: Vec<Message>) -> Request {
        Request {
            system: None,
            messages,
            extra: Extra::new(),
            layout: Layout::default(),
        }
    }

    /// Parses a request body.
    pub fn parse(text: &str) -> Result<Request, FormatError> {
        Request::from_value(parse_json(text)?)
    }

    pub fn from_value(value: Value) -> Result<Request, FormatError> {
        let mut map = expect_object(value)?;
        let messages = match map.get_mut("messages") {
            Some(Value::Array(items)) => std::mem::take(items),
            Some(other) => {
                return Err(FormatError::WrongType {
                    field: "messages",
                    expected: "an array",
                    found: json_type(other),
                });
            }
            None => return Err(FormatError::Missing { field: "messages" }),
        };
        let mut parsed = Vec::with_capacity(messages.len());
        for (i, v) in messages.into_iter().enumerate() {
            parsed.push(Message::from_value(v).map_err(|e| FormatError::at("message", i, e))?);
        }
        let mut request = Request::new(Vec::new());
        layout::fill(&mut request, map);
        request.messages = parsed;
        Ok(request)
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The request as compact JSON.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl Record for Request {
    const FIELDS: &'static [&'static str] = &["system", "messages"];

    fn take(&mut self, index: usize, value: Value) -> Result<(), Value> {
        // The messages are parsed by `from_value`; index 1 only keeps the
        // slot.
        if index == 0 {
            self.system = Some(Content::take(value)?);
        }
        Ok(())
    }

    fn emit<M: SerializeMap>(&self, index: usize, map: &mut M) -> Result<bool, M::Error> {
        match index {
            0 => layout::emit_opt(map, "system", self.system.as_ref()),
            _ => {
                map.serialize_entry("messages", &self.messages)?;
                Ok(true)
            }
        }
    }

    fn is_set(&self, index: usize) -> bool {
        index == 1 || self.system.is_some()
    }

    record_storage!();
}

impl Serialize for Request {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        layout::serialize(self, s)
    }
}

#[cfg(test)]
pub(crate) mod tests;
