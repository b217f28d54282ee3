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
        let mut out = message.clone();
        // Only a changed text is written back.
        let changed = |text: &str| match self.text(text) {
            Cow::Owned(r) => Some(r),
            Cow::Borrowed(_) => None,
        };
        match &mut out.content {
            Content::Text(text) => {
                if let Some(r) = changed(text) {
                    *text = r;
                }
            }
            Content::Parts(parts) => {
                for part in parts.iter_mut() {
                    if let Some(text) = part.text()
                        && let Some(r) = changed(text)
                    {
                        *part = ContentPart::new_text(r);
                    }
                }
            }
            Content::Absent | Content::Null => {}
        }
        for call in out.tool_calls.iter_mut().flatten() {
            if let Some(function) = &mut call.function
                && let Some(r) = changed(&function.arguments)
            {
                function.arguments = r;
            }
        }
        if let Some(reasoning) = &mut out.reasoning_content
            && let Some(r) = changed(reasoning)
        {
            *reasoning = r;
        }
        out
    }

    /// [`message`](Self::message) for each of `messages`.
    pub fn messages(&self, messages: &[Message]) -> Vec<Message> {
        messages.iter().map(|m| self.message(m)).collect()
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
