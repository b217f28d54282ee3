//! The chat-completions request body, read without re-serializing it: the
//! top-level fields are kept as raw JSON text, in order, so that every field
//! the proxy does not change (unknown ones included) goes upstream byte for
//! byte, and each message's own text is what the session hashes.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::ServeError;

/// A request body's top-level fields, in order, as raw JSON.
#[derive(Debug)]
pub struct ChatBody<'a> {
    fields: Vec<(String, &'a RawValue)>,
    messages: Vec<&'a RawValue>,
}

impl<'a> ChatBody<'a> {
    /// Reads `bytes` as a JSON object with a `messages` array.
    pub fn parse(bytes: &'a [u8]) -> Result<ChatBody<'a>, ServeError> {
        let ChatBody { fields, .. } = ChatBody::parse_object(bytes)?;
        let messages = match fields.iter().find(|(k, _)| k == "messages") {
            Some((_, raw)) => serde_json::from_str::<Vec<&RawValue>>(raw.get())
                .map_err(|e| ServeError::BadRequest(format!("`messages` is not an array: {e}")))?,
            None => return Err(ServeError::BadRequest("`messages` is missing".into())),
        };
        Ok(ChatBody { fields, messages })
    }

    /// Reads `bytes` as a JSON object, whatever its fields (the Anthropic
    /// and Responses fronts, which rebuild their own fields); `messages`
    /// is left empty.
    ///
    /// A key twice in one object is [`ServeError::DuplicateKey`] (see
    /// [`unique`](crate::unique)), which the handlers answer with a 400
    /// instead of forwarding.
    pub fn parse_object(bytes: &'a [u8]) -> Result<ChatBody<'a>, ServeError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| ServeError::BadRequest(format!("body is not UTF-8: {e}")))?;
        let mut de = serde_json::Deserializer::from_str(text);
        let fields = de
            .deserialize_map(FieldsVisitor)
            .and_then(|f| de.end().map(|()| f))
            .map_err(|e| ServeError::BadRequest(format!("body is not a JSON object: {e}")))?;
        // JSON, read: now one reading of it.
        if let Some(d) = crate::unique::duplicate_key(text) {
            return Err(ServeError::DuplicateKey {
                key: d.key,
                at: d.at,
            });
        }
        Ok(ChatBody {
            fields,
            messages: Vec::new(),
        })
    }

    /// The top-level fields, in order, each as the client wrote it.
    pub fn fields(&self) -> Vec<(&str, &'a RawValue)> {
        self.fields.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    /// The messages, each as the client wrote it.
    pub fn messages(&self) -> &[&'a RawValue] {
        &self.messages
    }

    /// A top-level field's raw JSON.
    pub fn field(&self, key: &str) -> Option<&'a RawValue> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// The `model` the request names, if it is a string.
    pub fn model(&self) -> Option<String> {
        serde_json::from_str(self.field("model")?.get()).ok()
    }

    /// Whether the client asked for a stream (`"stream": true`).
    pub fn stream(&self) -> bool {
        self.field("stream").is_some_and(|v| v.get() == "true")
    }

    /// Whether the client asked for the usage chunk of a stream.
    pub fn include_usage(&self) -> bool {
        self.field("stream_options")
            .and_then(|v| serde_json::from_str::<serde_json::Value>(v.get()).ok())
            .and_then(|v| v.get("include_usage").and_then(serde_json::Value::as_bool))
            .unwrap_or(false)
    }

    /// The body again, with `overrides` replacing (or, when absent, added
    /// after) the fields they name, an empty override removing its field;
    /// every other field is copied verbatim.
    pub fn write(&self, overrides: &[(&str, &str)]) -> Vec<u8> {
        let extra: usize = overrides.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
        let mut out = String::with_capacity(
            self.fields
                .iter()
                .map(|(k, v)| k.len() + v.get().len() + 4)
                .sum::<usize>()
                + extra
                + 2,
        );
        out.push('{');
        let mut first = true;
        let mut push = |out: &mut String, key: &str, value: &str| {
            if !first {
                out.push(',');
            }
            first = false;
            push_key(out, key);
            out.push_str(value);
        };
        for (k, v) in &self.fields {
            match overrides.iter().find(|(o, _)| o == k) {
                Some((_, "")) => {}
                Some((_, value)) => push(&mut out, k, value),
                None => push(&mut out, k, v.get()),
            }
        }
        for (k, v) in overrides {
            if !v.is_empty() && !self.fields.iter().any(|(f, _)| f == k) {
                push(&mut out, k, v);
            }
        }
        out.push('}');
        out.into_bytes()
    }
}

fn push_key(out: &mut String, key: &str) {
    // A key is a JSON string; serializing a &str cannot fail.
    out.push_str(&serde_json::to_string(key).unwrap_or_else(|_| "\"\"".into()));
    out.push(':');
}

/// `stream_options` with `include_usage` set, keeping the client's other
/// options.
pub fn with_include_usage(stream_options: Option<&RawValue>) -> String {
    let mut map = stream_options
        .and_then(|v| {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(v.get()).ok()
        })
        .unwrap_or_default();
    map.insert("include_usage".into(), serde_json::Value::Bool(true));
    serde_json::Value::Object(map).to_string()
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Vec<(String, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
            out.push((k, v));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_spacing_survive() {
        let body = br#"{"model": "m", "messages": [ {"role": "user", "content": "hi"} ], "x_vendor": {"a": [1, 2.50]}}"#;
        let b = ChatBody::parse(body).unwrap();
        assert_eq!(b.messages().len(), 1);
        assert_eq!(
            b.messages()[0].get(),
            r#"{"role": "user", "content": "hi"}"#
        );
        let out = String::from_utf8(b.write(&[])).unwrap();
        assert_eq!(
            out,
            r#"{"model":"m","messages":[ {"role": "user", "content": "hi"} ],"x_vendor":{"a": [1, 2.50]}}"#
        );
        let out =
            String::from_utf8(b.write(&[("messages", "[]"), ("stream_options", "{}")])).unwrap();
        assert_eq!(
            out,
            r#"{"model":"m","messages":[],"x_vendor":{"a": [1, 2.50]},"stream_options":{}}"#
        );
    }

    #[test]
    fn bad_bodies_say_what_is_wrong() {
        assert!(
            ChatBody::parse(b"[1]")
                .unwrap_err()
                .to_string()
                .contains("JSON object")
        );
        assert!(
            ChatBody::parse(b"{}")
                .unwrap_err()
                .to_string()
                .contains("`messages` is missing")
        );
        assert!(
            ChatBody::parse(br#"{"messages": 3}"#)
                .unwrap_err()
                .to_string()
                .contains("not an array")
        );
        assert!(ChatBody::parse(b"{\"messages\": []} x").is_err());
    }

    #[test]
    fn stream_flags() {
        let b = ChatBody::parse(
            br#"{"messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert!(b.stream() && b.include_usage());
        assert_eq!(
            with_include_usage(b.field("stream_options")),
            r#"{"include_usage":true}"#
        );
        let b = ChatBody::parse(br#"{"messages":[],"stream":false}"#).unwrap();
        assert!(!b.stream() && !b.include_usage());
    }
}
