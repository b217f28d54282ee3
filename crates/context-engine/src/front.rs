//! A request in a client's own wire format, as a proxy front serves it:
//! Anthropic Messages (`POST /v1/messages`, Claude Code) or OpenAI
//! Responses (`POST /v1/responses`, Codex).
//!
//! [`FrontRequest::parse`] reads the body through the lossless model and
//! its bridge, so the engine sees chat messages ([`FrontRequest::chat`]);
//! [`FrontRequest::rebuild`] turns the engine's result back into the
//! client's format and answers with the top-level fields to replace (as
//! JSON text), every other field of the body going upstream as it came.
//! A rebuilt request that would break a rule of its API the client's own
//! request kept (or that changed the thinking of a tool-using turn) is
//! refused with the violation, so the caller sends the client's request
//! instead.
//!
//! Prompt caching: an Anthropic request keeps the breakpoints the client
//! placed on blocks that stay; after a compaction the summary (the end of
//! the managed prefix) gets one when fewer than four remain
//! ([`crate::anthropic::cache`]). A Responses input is append-only for its
//! client: unchanged items go back byte for byte, so the managed prefix is
//! byte-identical from call to call.

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

use crate::anthropic::{self, FormatError};
use crate::compressor::is_summary;
use crate::message::Message;
use crate::responses;
use crate::validate::{self, Violation};

/// The client formats a front serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrontKind {
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Responses.
    Responses,
}

impl FrontKind {
    /// The format's name, for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            FrontKind::Anthropic => "anthropic",
            FrontKind::Responses => "responses",
        }
    }
}

impl fmt::Display for FrontKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a request is passed through without the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unmanaged {
    /// A Responses request continuing server-side state
    /// (`previous_response_id`): its input is not the whole conversation.
    ServerState,
}

impl Unmanaged {
    /// A short stable name (a metrics label).
    pub fn name(self) -> &'static str {
        match self {
            Unmanaged::ServerState => "previous_response_id",
        }
    }
}

enum Inner {
    Anthropic {
        request: anthropic::Request,
        bridged: anthropic::bridge::Bridged,
    },
    Responses {
        request: responses::Request,
        bridged: responses::bridge::Bridged,
    },
}

/// A parsed client request and its chat view.
pub struct FrontRequest {
    inner: Inner,
}

impl fmt::Debug for FrontRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrontRequest")
            .field("kind", &self.kind())
            .field("messages", &self.chat().len())
            .finish_non_exhaustive()
    }
}

/// The top-level fields of a rebuilt request that differ from the
/// client's, each as compact JSON text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// `(field, JSON)` pairs, in the order to write them.
    pub fields: Vec<(&'static str, String)>,
    /// A breakpoint was placed on the end of the managed prefix.
    pub marked_prefix: bool,
}

impl FrontRequest {
    /// Reads a request body of format `kind`.
    pub fn parse(kind: FrontKind, text: &str) -> Result<FrontRequest, FormatError> {
        let inner = match kind {
            FrontKind::Anthropic => {
                let request = anthropic::Request::parse(text)?;
                let bridged = anthropic::bridge::to_chat(&request);
                Inner::Anthropic { request, bridged }
            }
            FrontKind::Responses => {
                let request = responses::Request::parse(text)?;
                let bridged = responses::bridge::to_chat(&request);
                Inner::Responses { request, bridged }
            }
        };
        Ok(FrontRequest { inner })
    }

    /// The request's format.
    pub fn kind(&self) -> FrontKind {
        match self.inner {
            Inner::Anthropic { .. } => FrontKind::Anthropic,
            Inner::Responses { .. } => FrontKind::Responses,
        }
    }

    /// The conversation as chat messages (what the engine works on).
    pub fn chat(&self) -> &[Message] {
        match &self.inner {
            Inner::Anthropic { bridged, .. } => &bridged.messages,
            Inner::Responses { bridged, .. } => &bridged.messages,
        }
    }

    fn extra(&self) -> &crate::message::Extra {
        match &self.inner {
            Inner::Anthropic { request, .. } => &request.extra,
            Inner::Responses { request, .. } => &request.extra,
        }
    }

    /// A top-level field the models keep unparsed (`model`, `stream`,
    /// `metadata`, `prompt_cache_key`…).
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.extra().get(name)
    }

    /// Whether the client asked for a stream.
    pub fn stream(&self) -> bool {
        self.field("stream").and_then(Value::as_bool) == Some(true)
    }

    /// Why the request must go upstream without the engine, if it must.
    pub fn unmanaged(&self) -> Option<Unmanaged> {
        match &self.inner {
            Inner::Responses { request, .. } if request.previous_response_id().is_some() => {
                Some(Unmanaged::ServerState)
            }
            _ => None,
        }
    }

    /// The client's request rebuilt from the engine's `output` (chat
    /// messages): the fields to replace. Empty when `output` is the chat
    /// view unchanged (the body goes upstream as it came). `Err` when the
    /// rebuilt request would add a violation of its API's rules.
    pub fn rebuild(&self, output: &[Message]) -> Result<Rebuilt, Violation> {
        if output == self.chat() {
            return Ok(Rebuilt::default());
        }
        let prefix_end = last_new(self.chat(), output);
        match &self.inner {
            Inner::Anthropic { request, bridged } => {
                let mut out = anthropic::bridge::from_chat(request, bridged, output);
                let after = validate::anthropic::validate(&out);
                if !after.is_empty()
                    && let Some(v) = introduced(validate::anthropic::validate(request), after)
                {
                    return Err(v);
                }
                if let Some(v) = validate::anthropic::thinking_changed(request, &out)
                    .into_iter()
                    .next()
                {
                    return Err(v);
                }
                let marked_prefix =
                    prefix_end.is_some_and(|t| anthropic::cache::mark_prefix_end(&mut out, &t));
                let mut fields = Vec::with_capacity(2);
                if out.system != request.system {
                    fields.push(("system", to_json(&out.system)));
                }
                fields.push(("messages", to_json(&out.messages)));
                Ok(Rebuilt {
                    fields,
                    marked_prefix,
                })
            }
            Inner::Responses { request, bridged } => {
                let out = responses::bridge::from_chat(request, bridged, output);
                let after = validate::responses::validate(&out);
                if !after.is_empty()
                    && let Some(v) = introduced(validate::responses::validate(request), after)
                {
                    return Err(v);
                }
                let mut fields = Vec::with_capacity(2);
                let instructions = out.extra.get("instructions");
                if instructions != request.extra.get("instructions")
                    && let Some(v) = instructions
                {
                    fields.push(("instructions", to_json(v)));
                }
                fields.push(("input", to_json(&out.input)));
                Ok(Rebuilt {
                    fields,
                    marked_prefix: false,
                })
            }
        }
    }
}

/// The text of the summary the engine put in `output` (a message carrying
/// one that the client never sent): the end of the managed prefix.
fn last_new(input: &[Message], output: &[Message]) -> Option<String> {
    output
        .iter()
        .rev()
        .find(|m| is_summary(m) && !input.contains(m))
        .map(|m| m.content.text().into_owned())
        .filter(|t| !t.is_empty())
}

/// The first violation of `after` beyond those `before` already had (by
/// rule).
fn introduced(before: Vec<Violation>, after: Vec<Violation>) -> Option<Violation> {
    let mut budget: HashMap<_, usize> = HashMap::new();
    for v in before {
        *budget.entry(v.rule).or_default() += 1;
    }
    after.into_iter().find(|v| match budget.get_mut(&v.rule) {
        Some(n) if *n > 0 => {
            *n -= 1;
            false
        }
        _ => true,
    })
}

fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    // The models serialize without failing (string keys only).
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;

    const CLAUDE: &str = r#"{"model":"claude","max_tokens":1024,"system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"read the files"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"sig"},{"type":"tool_use","id":"tu_1","name":"Bash","input":{"command":"cat a.txt"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":"alpha"},{"type":"future_block","x":1}]},{"role":"assistant","content":[{"type":"text","text":"ok"}]},{"role":"user","content":[{"type":"text","text":"next","cache_control":{"type":"ephemeral"}}]}],"stream":true}"#;

    #[test]
    fn unchanged_output_replaces_nothing() {
        let r = FrontRequest::parse(FrontKind::Anthropic, CLAUDE).unwrap();
        assert!(r.stream());
        assert_eq!(r.rebuild(r.chat()).unwrap(), Rebuilt::default());
    }

    #[test]
    fn a_summary_replaces_the_span_and_gets_the_prefix_breakpoint() {
        let r = FrontRequest::parse(FrontKind::Anthropic, CLAUDE).unwrap();
        let chat = r.chat();
        // system, summary, the last assistant and user turns.
        let summary = crate::compressor::wrap_summary("the files were read");
        let mut out = vec![chat[0].clone()];
        out.push(Message::new(
            Role::User,
            crate::message::Content::Text(summary.clone()),
        ));
        out.extend_from_slice(&chat[chat.len() - 2..]);
        let rebuilt = r.rebuild(&out).unwrap();
        assert!(rebuilt.marked_prefix, "{rebuilt:?}");
        let (name, messages) = &rebuilt.fields[0];
        assert_eq!(*name, "messages");
        let v: Value = serde_json::from_str(messages).unwrap();
        assert_eq!(v[0]["content"][0]["text"], summary.as_str());
        assert_eq!(v[0]["content"][0]["cache_control"]["type"], "ephemeral");
        // The client's own breakpoint on the newest message stays.
        assert!(messages.ends_with(
            r#"{"role":"user","content":[{"type":"text","text":"next","cache_control":{"type":"ephemeral"}}]}]"#
        ));
    }

    #[test]
    fn a_rebuild_that_breaks_a_rule_is_refused() {
        let r = FrontRequest::parse(FrontKind::Anthropic, CLAUDE).unwrap();
        let chat = r.chat();
        // Dropping the tool result leaves the tool_use unanswered.
        let out: Vec<Message> = chat
            .iter()
            .filter(|m| !m.is_tool_result())
            .cloned()
            .collect();
        assert!(r.rebuild(&out).is_err());
    }

    #[test]
    fn responses_previous_response_id_is_unmanaged() {
        let r = FrontRequest::parse(
            FrontKind::Responses,
            r#"{"model":"m","previous_response_id":"resp_1","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.unmanaged(), Some(Unmanaged::ServerState));
        let r = FrontRequest::parse(FrontKind::Responses, r#"{"model":"m","input":"hi"}"#).unwrap();
        assert_eq!(r.unmanaged(), None);
        assert!(FrontRequest::parse(FrontKind::Responses, r#"{"model":"m"}"#).is_err());
    }
}
