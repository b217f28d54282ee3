//! Python objects <-> JSON values <-> messages.
//!
//! Python hands us plain OpenAI-format dicts. They go through
//! `serde_json::Value` (with `preserve_order`) and the library's lossless
//! message parser, so keys, their order and unknown fields survive a round
//! trip. Bad input is a `ValueError` that names the message index and the
//! field; nothing here panics.
//!
//! JSON to Python is `pythonize`. Python to JSON is read here, value by
//! value, because what it refuses must be refused by name and never crash
//! the interpreter: `depythonize` recurses without bound into a dict that
//! contains itself, reads NaN as `null`, and its errors name no path.

use std::fmt::{self, Write as _};

use context_engine::Message;
use context_engine::message::{ShapeError, json_type};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Deepest nesting accepted from Python: a self-referencing dict would
/// otherwise recurse forever.
const MAX_DEPTH: usize = 128;

/// One step of the path to an offending value.
#[derive(Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

/// A value that cannot become JSON, with the path to it (innermost last).
#[derive(Debug)]
pub struct ConvError {
    path: Vec<Seg>,
    message: String,
}

impl ConvError {
    fn new(message: impl Into<String>) -> ConvError {
        ConvError {
            path: Vec::new(),
            message: message.into(),
        }
    }

    fn at(mut self, seg: Seg) -> ConvError {
        self.path.push(seg);
        self
    }

    /// The path, outermost first: `tool_calls[0].function.arguments`.
    fn field(&self) -> String {
        let mut out = String::new();
        for seg in self.path.iter().rev() {
            match seg {
                Seg::Key(k) if out.is_empty() => out.push_str(k),
                Seg::Key(k) => {
                    let _ = write!(out, ".{k}");
                }
                Seg::Index(i) => {
                    let _ = write!(out, "[{i}]");
                }
            }
        }
        out
    }

    /// The error for argument `what` (e.g. `message 3`, `usage`).
    pub fn into_py(self, what: &str) -> PyErr {
        let field = self.field();
        if field.is_empty() {
            PyValueError::new_err(format!("{what}: {}", self.message))
        } else {
            PyValueError::new_err(format!("{what}, field `{field}`: {}", self.message))
        }
    }
}

impl fmt::Display for ConvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = self.field();
        if field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "field `{field}`: {}", self.message)
        }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// A Python string as Rust text; a lone surrogate is not valid UTF-8.
pub fn py_str(s: &Bound<'_, PyString>) -> Result<String, ConvError> {
    s.to_cow()
        .map(|c| c.into_owned())
        .map_err(|_| ConvError::new("text is not valid UTF-8 (it contains a lone surrogate)"))
}

/// Converts a Python value (dict, list, tuple, str, int, float, bool,
/// None) to JSON.
pub fn to_value(obj: &Bound<'_, PyAny>) -> Result<Value, ConvError> {
    to_value_at(obj, 0)
}

fn to_value_at(obj: &Bound<'_, PyAny>, depth: usize) -> Result<Value, ConvError> {
    if depth > MAX_DEPTH {
        return Err(ConvError::new(format!(
            "nested deeper than {MAX_DEPTH} levels (a dict or list that contains itself?)"
        )));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return py_str(s).map(Value::String);
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let key = match k.cast::<PyString>() {
                Ok(s) => py_str(s)?,
                Err(_) => {
                    return Err(ConvError::new(format!(
                        "dict keys must be strings, found {} key {}",
                        type_name(&k),
                        k.repr().map(|r| r.to_string()).unwrap_or_default()
                    )));
                }
            };
            let value = to_value_at(&v, depth + 1).map_err(|e| e.at(Seg::Key(key.clone())))?;
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.cast::<PyInt>().is_ok() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::Number(i.into()));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::Number(u.into()));
        }
        return Err(ConvError::new("integer out of the 64-bit range"));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| ConvError::new("NaN and infinity are not JSON numbers"));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        let mut out = Vec::with_capacity(l.len());
        for (i, item) in l.iter().enumerate() {
            out.push(to_value_at(&item, depth + 1).map_err(|e| e.at(Seg::Index(i)))?);
        }
        return Ok(Value::Array(out));
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        let mut out = Vec::with_capacity(t.len());
        for (i, item) in t.iter().enumerate() {
            out.push(to_value_at(&item, depth + 1).map_err(|e| e.at(Seg::Index(i)))?);
        }
        return Ok(Value::Array(out));
    }
    Err(ConvError::new(format!(
        "expected a JSON value (dict, list, str, int, float, bool or None), found {}",
        type_name(obj)
    )))
}

/// Converts JSON to Python (`pythonize`): objects become dicts in key
/// order, integers past `i64` stay exact.
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    pythonize::pythonize(py, value).map_err(PyErr::from)
}

/// The JSON values of a message list (a list or tuple of dicts), still
/// unparsed: parsing happens with the interpreter released.
pub fn message_values(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = obj.cast::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        return Err(PyValueError::new_err(format!(
            "messages must be a list of dicts, found {}",
            type_name(obj)
        )));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if item.cast::<PyDict>().is_err() {
            return Err(PyValueError::new_err(format!(
                "message {i}: expected a dict, found {}",
                type_name(item)
            )));
        }
        out.push(to_value(item).map_err(|e| e.into_py(&format!("message {i}")))?);
    }
    Ok(out)
}

/// Why a message value is not a message: index, field and what is wrong.
#[derive(Debug)]
pub struct MessageError {
    pub index: usize,
    pub field: Option<String>,
    pub message: String,
}

impl MessageError {
    pub fn into_py(self) -> PyErr {
        PyValueError::new_err(self.to_string())
    }
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(
                f,
                "message {}, field `{field}`: {}",
                self.index, self.message
            ),
            None => write!(f, "message {}: {}", self.index, self.message),
        }
    }
}

/// Parses message values (no interpreter needed: call it detached).
pub fn parse_messages(values: Vec<Value>) -> Result<Vec<Message>, MessageError> {
    values
        .into_iter()
        .enumerate()
        .map(|(index, value)| parse_message(index, value))
        .collect()
}

/// Parses one message and rejects a known field of the wrong type (the
/// parser keeps such a value verbatim in `extra`; from Python it is a
/// caller's bug worth a clear error). `null` stays allowed for optional
/// fields, as SDKs dump `"tool_calls": None`.
pub fn parse_message(index: usize, value: Value) -> Result<Message, MessageError> {
    let message = Message::from_value(value).map_err(|e| MessageError {
        index,
        field: e.field().map(str::to_owned),
        message: match e {
            ShapeError::MissingRole => "missing field `role`".to_owned(),
            other => other.to_string(),
        },
    })?;
    if let Some((field, message)) = wrong_typed(&message) {
        return Err(MessageError {
            index,
            field: Some(field),
            message,
        });
    }
    Ok(message)
}

/// Expected types of the known fields the parser could not take.
fn wrong_typed(message: &Message) -> Option<(String, String)> {
    const STRINGS: [&str; 3] = ["name", "tool_call_id", "reasoning_content"];
    let found = |v: &Value| json_type(v);
    for (key, value) in &message.extra {
        if value.is_null() {
            continue;
        }
        let expected = match key.as_str() {
            k if STRINGS.contains(&k) => "a string",
            "content" => "a string, null or a list of content-part dicts",
            "function_call" => "a dict with string `name` and `arguments`",
            "tool_calls" => {
                if let Value::Array(items) = value
                    && let Some((i, bad)) = items.iter().enumerate().find(|(_, v)| !v.is_object())
                {
                    return Some((
                        format!("tool_calls[{i}]"),
                        format!("expected a dict, found {}", found(bad)),
                    ));
                }
                "a list of tool-call dicts"
            }
            _ => continue,
        };
        return Some((
            key.clone(),
            format!("expected {expected}, found {}", found(value)),
        ));
    }
    for (i, call) in message.tool_calls().iter().enumerate() {
        for (key, value) in &call.extra {
            if value.is_null() {
                continue;
            }
            let expected = match key.as_str() {
                "id" | "type" => "a string",
                "function" => "a dict with string `name` and `arguments`",
                _ => continue,
            };
            return Some((
                format!("tool_calls[{i}].{key}"),
                format!("expected {expected}, found {}", found(value)),
            ));
        }
    }
    if let Some(Value::Array(parts)) = message.extra.get("content")
        && let Some((i, bad)) = parts.iter().enumerate().find(|(_, v)| !v.is_object())
    {
        return Some((
            format!("content[{i}]"),
            format!("expected a dict, found {}", found(bad)),
        ));
    }
    None
}

/// The messages as JSON values, in their original key order.
pub fn message_values_out(messages: &[Message]) -> Vec<Value> {
    messages.iter().map(Message::to_value).collect()
}

/// JSON values to a Python list of dicts.
pub fn values_to_py<'py>(py: Python<'py>, values: &[Value]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for v in values {
        list.append(to_py(py, v)?)?;
    }
    Ok(list)
}

/// Any serializable report as a Python dict.
pub fn report_to_py<'py, T: serde::Serialize>(
    py: Python<'py>,
    report: &T,
) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(report).map_err(|e| {
        crate::errors::ContextEngineError::new_err(format!("cannot serialize the report: {e}"))
    })?;
    to_py(py, &value)
}
