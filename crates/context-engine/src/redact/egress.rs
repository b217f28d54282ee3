//! [`Egress`]: the one helper every text leaving the process goes through
//! (the summarizer's input and the summary reply in the compressor, every
//! message, argument and memory text sent to a plugin, plugin log lines).
//!
//! It redacts with the user's redactor (the built-in rules plus
//! `security.redact_patterns`) when one is given, the built-in rules
//! otherwise, and always with `force`: the user's opt-out
//! (`security.redact_secrets: false`, `CTX_REDACT_SECRETS=0`) governs what
//! `ctx` prints locally, never what leaves the process.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;
use serde_json::value::RawValue;

use super::{RedactOptions, Redactor, redact};
use crate::message::{Content, ContentPart, Message};

/// Redaction for text that leaves the process (see the module docs).
/// Cheap to clone: it shares the redactor.
#[derive(Clone, Debug, Default)]
pub struct Egress {
    redactor: Option<Arc<Redactor>>,
}

impl Egress {
    /// Egress with `redactor` (the user's), or the built-in rules when
    /// `None`.
    pub fn new(redactor: Option<Arc<Redactor>>) -> Egress {
        Egress { redactor }
    }

    /// Egress with the built-in rules only.
    pub fn builtin() -> Egress {
        Egress::default()
    }

    /// The user's redactor, when one was given.
    pub fn redactor(&self) -> Option<&Arc<Redactor>> {
        self.redactor.as_ref()
    }

    /// The options every egress call uses: forced (no opt-out), URL
    /// credentials included.
    pub fn options() -> RedactOptions {
        RedactOptions {
            force: true,
            url_credentials: true,
            ..RedactOptions::default()
        }
    }

    /// `text` redacted; borrowed when nothing was masked.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match &self.redactor {
            Some(r) => r.redact(text, &Egress::options()),
            None => redact(text, &Egress::options()),
        }
    }

    /// `text` redacted, owned.
    pub fn string(&self, text: &str) -> String {
        self.text(text).into_owned()
    }

    /// A copy of `message` with every text a model or plugin could read
    /// redacted: content (text parts), tool-call arguments, reasoning. Other
    /// fields (roles, ids, names) are kept as they are.
    pub fn message(&self, message: &Message) -> Message {
        self.masked_message(message, false)
            .unwrap_or_else(|| message.clone())
    }

    /// What a session store keeps of `message` (see
    /// [`store::AtRest`](crate::store::AtRest)): [`message`](Self::message)'s
    /// redaction, plus the legacy `function_call` arguments and every
    /// string of the fields the model does not know (`extra`), except
    /// identifiers and provider-signed blobs ([`opaque_key`]). `None` when
    /// nothing is masked (the message is kept as it is, byte for byte).
    pub fn message_at_rest(&self, message: &Message) -> Option<Message> {
        self.masked_message(message, true)
    }

    /// The redacted copy of `message`, `None` when nothing changed;
    /// `all`: also the legacy function call and the unknown fields.
    fn masked_message(&self, message: &Message, all: bool) -> Option<Message> {
        let mut out: Option<Message> = None;
        let mut edit =
            |f: &mut dyn FnMut(&mut Message)| f(out.get_or_insert_with(|| message.clone()));
        // Only a changed text is written back.
        let changed = |text: &str| match self.text(text) {
            Cow::Owned(r) => Some(r),
            Cow::Borrowed(_) => None,
        };
        match &message.content {
            Content::Text(text) => {
                if let Some(r) = changed(text) {
                    edit(&mut |m| m.content = Content::Text(r.clone()));
                }
            }
            Content::Parts(parts) => {
                for (i, part) in parts.iter().enumerate() {
                    if let Some(text) = part.text()
                        && let Some(r) = changed(text)
                    {
                        edit(&mut |m| {
                            if let Content::Parts(parts) = &mut m.content {
                                parts[i] = ContentPart::new_text(r.clone());
                            }
                        });
                    }
                }
            }
            Content::Absent | Content::Null => {}
        }
        for (i, call) in message.tool_calls.iter().flatten().enumerate() {
            if let Some(function) = &call.function
                && let Some(r) = changed(&function.arguments)
            {
                edit(&mut |m| {
                    if let Some(f) = m
                        .tool_calls
                        .as_mut()
                        .and_then(|calls| calls.get_mut(i))
                        .and_then(|c| c.function.as_mut())
                    {
                        f.arguments = r.clone();
                    }
                });
            }
        }
        if let Some(reasoning) = &message.reasoning_content
            && let Some(r) = changed(reasoning)
        {
            edit(&mut |m| m.reasoning_content = Some(r.clone()));
        }
        if all {
            if let Some(call) = &message.function_call
                && let Some(r) = changed(&call.arguments)
            {
                edit(&mut |m| {
                    if let Some(f) = &mut m.function_call {
                        f.arguments = r.clone();
                    }
                });
            }
            for (key, value) in &message.extra {
                if opaque_key(key) {
                    continue;
                }
                if let Some(v) = self.value_at_rest(value) {
                    edit(&mut |m| {
                        if let Some(slot) = m.extra.get_mut(key) {
                            *slot = v.clone();
                        }
                    });
                }
            }
        }
        out
    }

    /// [`message`](Self::message) for each of `messages`.
    pub fn messages(&self, messages: &[Message]) -> Vec<Message> {
        messages.iter().map(|m| self.message(m)).collect()
    }

    /// `value` as a session store keeps it: every string in it redacted
    /// except those under an [`opaque_key`] (and keys); `None` when nothing
    /// is masked.
    pub fn value_at_rest(&self, value: &Value) -> Option<Value> {
        match value {
            Value::String(s) => match self.text(s) {
                Cow::Owned(r) => Some(Value::String(r)),
                Cow::Borrowed(_) => None,
            },
            Value::Array(items) => {
                let masked: Vec<Option<Value>> =
                    items.iter().map(|v| self.value_at_rest(v)).collect();
                masked.iter().any(Option::is_some).then(|| {
                    Value::Array(
                        masked
                            .into_iter()
                            .zip(items)
                            .map(|(m, v)| m.unwrap_or_else(|| v.clone()))
                            .collect(),
                    )
                })
            }
            Value::Object(map) => {
                let redacted_thinking = is_redacted_thinking(map.get("type"));
                let masked: Vec<Option<Value>> = map
                    .iter()
                    .map(|(k, v)| {
                        if opaque_key(k) || (redacted_thinking && k == "data") {
                            None
                        } else {
                            self.value_at_rest(v)
                        }
                    })
                    .collect();
                masked.iter().any(Option::is_some).then(|| {
                    Value::Object(
                        masked
                            .into_iter()
                            .zip(map)
                            .map(|(m, (k, v))| (k.clone(), m.unwrap_or_else(|| v.clone())))
                            .collect(),
                    )
                })
            }
            _ => None,
        }
    }

    /// A JSON text as a session store keeps it: every string value in it
    /// redacted as [`value_at_rest`](Self::value_at_rest) does. The text is
    /// kept byte for byte (spacing, key order, escapes) wherever nothing
    /// is masked: only an object or array that holds a masked string is
    /// written again, compactly. Borrowed when nothing is masked; an error
    /// when `text` is not JSON.
    pub fn json_at_rest<'a>(&self, text: &'a str) -> Result<Cow<'a, str>, serde_json::Error> {
        Ok(match self.json_masked(text)? {
            Some(masked) => Cow::Owned(masked),
            None => Cow::Borrowed(text),
        })
    }

    /// The masked JSON text of `raw`, `None` when nothing in it changed.
    fn json_masked(&self, raw: &str) -> Result<Option<String>, serde_json::Error> {
        match raw.trim_start().as_bytes().first() {
            Some(b'"') => {
                let s: String = serde_json::from_str(raw)?;
                match self.text(&s) {
                    Cow::Owned(r) => serde_json::to_string(&r).map(Some),
                    Cow::Borrowed(_) => Ok(None),
                }
            }
            Some(b'[') => {
                let items: Vec<&RawValue> = serde_json::from_str(raw)?;
                let masked = items
                    .iter()
                    .map(|v| self.json_masked(v.get()))
                    .collect::<Result<Vec<_>, _>>()?;
                if masked.iter().all(Option::is_none) {
                    return Ok(None);
                }
                let mut out = String::with_capacity(raw.len());
                out.push('[');
                for (i, (m, v)) in masked.iter().zip(&items).enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(m.as_deref().unwrap_or(v.get()));
                }
                out.push(']');
                Ok(Some(out))
            }
            Some(b'{') => {
                let Fields(fields) = serde_json::from_str(raw)?;
                let redacted_thinking = fields.iter().any(|(k, v)| {
                    k == "type"
                        && serde_json::from_str::<Value>(v.get())
                            .is_ok_and(|t| is_redacted_thinking(Some(&t)))
                });
                let masked = fields
                    .iter()
                    .map(|(k, v)| {
                        if opaque_key(k) || (redacted_thinking && k == "data") {
                            Ok(None)
                        } else {
                            self.json_masked(v.get())
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if masked.iter().all(Option::is_none) {
                    return Ok(None);
                }
                let mut out = String::with_capacity(raw.len());
                out.push('{');
                for (i, (m, (k, v))) in masked.iter().zip(&fields).enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k)?);
                    out.push(':');
                    out.push_str(m.as_deref().unwrap_or(v.get()));
                }
                out.push('}');
                Ok(Some(out))
            }
            // Numbers, booleans, null: checked by the parse, never masked.
            _ => serde_json::from_str::<serde::de::IgnoredAny>(raw).map(|_| None),
        }
    }

    /// A copy of `value` with every string in it (keys excepted) redacted.
    pub fn value(&self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.string(s)),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.value(v)).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), self.value(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// Whether the strings under `key` are never masked at rest: identifiers
/// a later message refers to (a tool call's id, its result's) and blobs a
/// provider signed or encrypted (a thinking block's signature, Responses'
/// `encrypted_content`), which must come back unchanged or the provider
/// refuses the request.
pub fn opaque_key(key: &str) -> bool {
    matches!(
        key,
        "id" | "tool_call_id" | "call_id" | "tool_use_id" | "signature" | "encrypted_content"
    )
}

/// Whether a `type` field names Anthropic's `redacted_thinking` block (its
/// `data` is the provider's ciphertext).
fn is_redacted_thinking(kind: Option<&Value>) -> bool {
    kind.and_then(Value::as_str) == Some("redacted_thinking")
}

/// An object's fields in order, each value as its own JSON text.
struct Fields<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Fields<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Fields<'a>, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<String>()? {
                    let v: &'a RawValue = map.next_value()?;
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";

    fn user_patterns() -> Egress {
        let redactor = Redactor::builder()
            .enabled(false)
            .pattern("ACME-[0-9]{6}")
            .build()
            .unwrap();
        Egress::new(Some(Arc::new(redactor)))
    }

    #[test]
    fn user_patterns_and_builtin_rules_apply_despite_the_opt_out() {
        let egress = user_patterns();
        let out = egress.string(&format!("ticket ACME-123456 token {TOKEN}"));
        assert!(!out.contains("ACME-123456"), "{out}");
        assert!(!out.contains(TOKEN), "{out}");
        assert!(out.starts_with("ticket "), "{out}");
    }

    #[test]
    fn a_json_text_at_rest_changes_only_what_holds_a_secret() {
        let egress = user_patterns();
        // Untouched: borrowed, byte for byte (spacing, escapes, order).
        let clean = r#"{"b": 1,  "a": ["x\u00e9", null, true]}"#;
        assert!(matches!(
            egress.json_at_rest(clean).unwrap(),
            Cow::Borrowed(_)
        ));
        let text = format!(
            r#"{{"keep": {{"z": "as is" , "y": 2}}, "messages": [{{"role": "tool", "tool_call_id": "ACME-111111", "content": "token {TOKEN} ACME-222222"}}], "signature": "ACME-333333", "n": 1.50}}"#
        );
        let out = egress.json_at_rest(&text).unwrap();
        assert!(
            !out.contains(TOKEN) && !out.contains("ACME-222222"),
            "{out}"
        );
        // Identifiers and signed blobs are never rewritten.
        assert!(
            out.contains("ACME-111111") && out.contains("ACME-333333"),
            "{out}"
        );
        // What held no secret keeps its bytes.
        assert!(out.contains(r#"{"z": "as is" , "y": 2}"#), "{out}");
        assert!(out.ends_with(r#""n":1.50}"#), "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["messages"][0]["role"], "tool");
        assert!(egress.json_at_rest("{not json").is_err());
    }

    #[test]
    fn a_message_at_rest_masks_the_fields_a_model_does_not_know() {
        let egress = user_patterns();
        let m: Message = serde_json::from_str(&format!(
            r#"{{"role": "assistant", "content": "ok", "thought": "use {TOKEN}", "id": "ACME-444444"}}"#
        ))
        .unwrap();
        let out = egress.message_at_rest(&m).expect("masked");
        let wire = serde_json::to_string(&out).unwrap();
        assert!(
            !wire.contains(TOKEN) && wire.contains("ACME-444444"),
            "{wire}"
        );
        assert!(egress.message_at_rest(&Message::user("plain")).is_none());
    }

    #[test]
    fn messages_values_and_plain_text_are_covered() {
        let egress = user_patterns();
        let mut m = Message::assistant_tool_calls(
            "see ACME-000001",
            vec![crate::message::ToolCall::function(
                "c1",
                "bash",
                format!("{{\"command\": \"curl -H 'Authorization: token {TOKEN}'\"}}"),
            )],
        );
        m.reasoning_content = Some("remember ACME-999999".into());
        let out = egress.message(&m);
        let wire = out.to_value().to_string();
        assert!(!wire.contains(TOKEN) && !wire.contains("ACME-"), "{wire}");
        assert_eq!(out.role, m.role);
        let v = egress.value(&serde_json::json!({"args": ["ACME-424242", 3], "ACME-1": true}));
        assert_eq!(v["args"][1], 3);
        assert!(!v["args"][0].as_str().unwrap().contains("ACME-424242"));
        assert!(v.get("ACME-1").is_some(), "keys are not text");
        // Unchanged text is borrowed.
        assert!(matches!(egress.text("plain words"), Cow::Borrowed(_)));
    }
}
