//! The lossless OpenAI Responses request model (`POST /v1/responses`).
//!
//! `input` is a string or a list of items; each [`Item`] is kept as the JSON
//! object it was, with a typed view ([`ItemKind`]): `message` items with
//! `input_text` / `output_text` parts, `function_call` /
//! `function_call_output` by `call_id`, `reasoning` items whose
//! `encrypted_content` is kept verbatim, custom and built-in tool calls, and
//! item types this crate has never heard of all pass through untouched.
//! Everything else of the request (`model`, `instructions`, `tools`,
//! `reasoning`, `prompt_cache_key`…) stays in `extra`, in order.
//!
//! [`bridge`] converts to chat messages and back; provider rules live in
//! [`crate::validate::responses`].

pub mod bridge;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

pub use crate::anthropic::FormatError;
use crate::anthropic::{expect_object, parse_json};
use crate::message::layout::{self, Layout, Record, object};
use crate::message::{Extra, json_type, record_storage};

/// One input item, kept as the JSON object it was.
#[derive(Clone, Debug, PartialEq)]
pub struct Item(Extra);

/// Typed view of an [`Item`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ItemKind<'a> {
    /// A `message` (also an item with a `role` and no `type`, which the API
    /// accepts as the short form).
    Message {
        role: &'a str,
        content: &'a Value,
    },
    /// `function_call`, `custom_tool_call`, `local_shell_call` and the other
    /// client-run calls: answered by an output with the same `call_id`.
    Call {
        call_id: &'a str,
        name: Option<&'a str>,
    },
    /// `function_call_output`, `custom_tool_call_output`,
    /// `local_shell_call_output`, …
    Output {
        call_id: &'a str,
        output: Option<&'a Value>,
    },
    Reasoning {
        encrypted_content: Option<&'a str>,
    },
    /// Server-run tool calls (`web_search_call`, `file_search_call`, …) and
    /// every type this crate does not model.
    Other(Option<&'a str>),
}

impl Item {
    pub fn from_map(map: Extra) -> Item {
        Item(map)
    }

    /// `{"type":"message","role":role,"content":[{"type":"input_text"|"output_text","text":text}]}`.
    pub fn new_message(role: &str, text: impl Into<String>) -> Item {
        let part_type = if role == "assistant" {
            "output_text"
        } else {
            "input_text"
        };
        let mut part = Map::new();
        part.insert("type".into(), part_type.into());
        part.insert("text".into(), Value::String(text.into()));
        let mut m = Map::new();
        m.insert("type".into(), "message".into());
        m.insert("role".into(), role.into());
        m.insert("content".into(), Value::Array(vec![Value::Object(part)]));
        Item(m)
    }

    pub fn as_map(&self) -> &Extra {
        &self.0
    }

    pub fn as_map_mut(&mut self) -> &mut Extra {
        &mut self.0
    }

    pub fn item_type(&self) -> Option<&str> {
        self.0.get("type").and_then(Value::as_str)
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    pub fn kind(&self) -> ItemKind<'_> {
        let ty = self.item_type();
        let typed = match ty {
            Some("message") | None => (|| {
                Some(ItemKind::Message {
                    role: self.str("role")?,
                    content: self.0.get("content")?,
                })
            })(),
            Some("reasoning") => Some(ItemKind::Reasoning {
                encrypted_content: self.str("encrypted_content"),
            }),
            Some(t) if t.ends_with("_call_output") => {
                self.str("call_id").map(|call_id| ItemKind::Output {
                    call_id,
                    output: self.0.get("output"),
                })
            }
            Some(t) if t.ends_with("_call") && self.0.contains_key("call_id") => {
                self.str("call_id").map(|call_id| ItemKind::Call {
                    call_id,
                    name: self.str("name"),
                })
            }
            _ => None,
        };
        typed.unwrap_or(ItemKind::Other(ty))
    }

    /// The text of a message item: its string content or the `text` of its
    /// text parts, joined by newlines.
    pub fn message_text(&self) -> Option<String> {
        match self.kind() {
            ItemKind::Message { content, .. } => Some(value_text(content)),
            _ => None,
        }
    }
}

/// The text of a string, or of a list of parts with `text` (joined by
/// newlines).
pub(crate) fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

impl Serialize for Item {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// The request's `input`.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Text(String),
    Items(Vec<Item>),
}

impl Serialize for Input {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Input::Text(t) => t.serialize(s),
            Input::Items(items) => items.serialize(s),
        }
    }
}

/// A whole `/v1/responses` request body (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub input: Input,
    pub extra: Extra,
    layout: Layout,
}

impl Request {
    pub fn new(items: Vec<Item>) -> Request {
        Request {
            input: Input::Items(items),
            extra: Extra::new(),
            layout: Layout::default(),
        }
    }

    pub fn parse(text: &str) -> Result<Request, FormatError> {
        Request::from_value(parse_json(text)?)
    }

    pub fn from_value(value: Value) -> Result<Request, FormatError> {
        let map = expect_object(value)?;
        match map.get("input") {
            Some(Value::String(_)) => {}
            Some(Value::Array(items)) => {
                if let Some((i, v)) = items.iter().enumerate().find(|(_, v)| !v.is_object()) {
                    return Err(FormatError::At {
                        what: "input item",
                        index: i,
                        error: Box::new(FormatError::NotAnObject {
                            found: json_type(v),
                        }),
                    });
                }
            }
            Some(other) => {
                return Err(FormatError::WrongType {
                    field: "input",
                    expected: "a string or an array",
                    found: json_type(other),
                });
            }
            None => return Err(FormatError::Missing { field: "input" }),
        }
        let mut request = Request::new(Vec::new());
        layout::fill(&mut request, map);
        Ok(request)
    }

    /// The input items (a string input is one user message, not an item).
    pub fn items(&self) -> &[Item] {
        match &self.input {
            Input::Items(items) => items,
            Input::Text(_) => &[],
        }
    }

    /// `previous_response_id`: the request continues server-side state, so
    /// its input is not the whole conversation.
    pub fn previous_response_id(&self) -> Option<&str> {
        self.extra
            .get("previous_response_id")
            .and_then(Value::as_str)
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    pub fn to_json_string(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl Record for Request {
    const FIELDS: &'static [&'static str] = &["input"];

    fn take(&mut self, _index: usize, value: Value) -> Result<(), Value> {
        self.input = match value {
            Value::String(s) => Input::Text(s),
            Value::Array(items) if items.iter().all(Value::is_object) => Input::Items(
                items
                    .into_iter()
                    .filter_map(|v| object(v).ok())
                    .map(Item)
                    .collect(),
            ),
            other => return Err(other),
        };
        Ok(())
    }

    fn emit<M: SerializeMap>(&self, _index: usize, map: &mut M) -> Result<bool, M::Error> {
        map.serialize_entry("input", &self.input)?;
        Ok(true)
    }

    fn is_set(&self, _index: usize) -> bool {
        true
    }

    record_storage!();
}

impl Serialize for Request {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        layout::serialize(self, s)
    }
}

#[cfg(test)]
mod tests;
