//! Rules about single messages on the wire: known roles, no internal keys.

use serde_json::Map;
use serde_json::Value;

use super::{Property, Rule, Violation};
use crate::message::{Message, Role};

/// Every role is one the provider knows. The message model keeps unknown
/// roles (mini-swe-agent ends with `role: "exit"`); a provider rejects them.
#[derive(Clone, Copy, Debug, Default)]
pub struct KnownRoles;

impl Property for KnownRoles {
    fn name(&self) -> &'static str {
        "known-roles"
    }

    fn check(&self, messages: &[Message], out: &mut Vec<Violation>) {
        for (i, message) in messages.iter().enumerate() {
            if let Role::Other(role) = &message.role {
                out.push(Violation::new(
                    i,
                    Rule::UnknownRole,
                    format!("role `{role}` is not a chat-completions role"),
                ));
            }
        }
    }
}

/// No key starting with `_` in a message's extra fields, its tool calls' or
/// their functions'. Agents use such keys for their own bookkeeping; sent to
/// a provider they are at best ignored and often rejected.
#[derive(Clone, Copy, Debug, Default)]
pub struct InternalKeys;

/// Reports the `_` keys of `extra`; `path` (built only when there is one)
/// says where they sit inside message `i`.
fn internal_keys(
    i: usize,
    extra: &Map<String, Value>,
    out: &mut Vec<Violation>,
    path: impl Fn() -> String,
) {
    for key in extra.keys().filter(|k| k.starts_with('_')) {
        out.push(Violation::new(
            i,
            Rule::InternalKey,
            format!(
                "internal key `{}{key}` would be sent to the provider",
                path()
            ),
        ));
    }
}

impl Property for InternalKeys {
    fn name(&self) -> &'static str {
        "internal-keys"
    }

    fn check(&self, messages: &[Message], out: &mut Vec<Violation>) {
        for (i, message) in messages.iter().enumerate() {
            internal_keys(i, &message.extra, out, String::new);
            if let Some(call) = &message.function_call {
                internal_keys(i, &call.extra, out, || "function_call.".to_owned());
            }
            for (j, call) in message.tool_calls().iter().enumerate() {
                internal_keys(i, &call.extra, out, || format!("tool_calls[{j}]."));
                if let Some(function) = &call.function {
                    internal_keys(i, &function.extra, out, || {
                        format!("tool_calls[{j}].function.")
                    });
                }
            }
        }
    }
}
