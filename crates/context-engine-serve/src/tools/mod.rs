//! Engine tools (`context_recall`, …) offered to the model and resolved in
//! the proxy, so the client never sees them.
//!
//! Offered only when the client did not pin `tool_choice`. The engine's
//! schemas are appended to the client's own `tools` text (whose bytes stay
//! as they came).
//!
//! **Streams**: text passes through at once; from the event whose tool
//! call names an engine tool the rest of the stream is held
//! ([`crate::sse::Relay::watch`]). When the stream ends, calls that are
//! all engine calls are resolved and the request re-sent as a stream
//! whose events continue the client's response ([`StreamTools`]); else
//! the held events go to the client with the engine calls removed, by the
//! same rule as below.
//!
//! A response whose tool calls are all engine calls is resolved here and
//! the request re-sent with the exchange appended, for at most
//! `max_tool_rounds` rounds; the last round goes out without the engine
//! tools, so the model answers or calls the client's. **Mixed calls**: the
//! client's calls go to the client unchanged and the engine calls are
//! removed from that response (their ids vanish with them, so the client's
//! next request stays valid); the model can ask again on its next turn. No
//! client call is ever dropped and the client never receives a call it
//! cannot execute. The exchange is not added to the managed history: the
//! client's history does not contain it.

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use serde_json::Value;

use crate::AppState;
use crate::body::ChatBody;
use crate::error::ServeError;
use crate::handlers::chat::send_collect;
use crate::session::Managed;
use crate::session::key::tool_names;
use crate::sse::Held;

pub mod anthropic;

/// The engine tools offered on one request.
#[derive(Debug, Clone)]
pub struct EngineTools {
    /// The `tools` array: the client's text, then the engine's schemas.
    pub tools_json: String,
    /// The engine tools' names.
    pub names: Vec<String>,
}

/// The engine's tools to offer with this request, if any.
pub fn schemas(m: &Managed, body: &ChatBody<'_>) -> Option<EngineTools> {
    if let Some(choice) = body.field("tool_choice")
        && choice.get().trim() != "\"auto\""
    {
        return None;
    }
    let client = tool_names(body);
    let added: Vec<Value> = m
        .host()
        .tools(&[])
        .into_iter()
        .filter(|t| name_of(t).is_some_and(|n| !client.iter().any(|c| c == n)))
        .collect();
    if added.is_empty() {
        return None;
    }
    let names = added
        .iter()
        .filter_map(|t| name_of(t).map(str::to_owned))
        .collect();
    let tools_json = appended(body, &added);
    Some(EngineTools { tools_json, names })
}

/// The request's `tools` text (its bytes as they came) with `engine`'s
/// schemas appended.
pub(crate) fn appended(body: &ChatBody<'_>, engine: &[Value]) -> String {
    let engine = engine
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join(",");
    match body.field("tools").map(|t| t.get().trim_end()) {
        Some(raw)
            if raw.ends_with(']')
                && raw.len() > 2
                && raw[..raw.len() - 1].trim_start_matches('[').trim() != "" =>
        {
            format!("{},{engine}]", &raw[..raw.len() - 1])
        }
        _ => format!("[{engine}]"),
    }
}

fn str_at<'v>(value: &'v Value, pointer: &str) -> Option<&'v str> {
    value.pointer(pointer).and_then(Value::as_str)
}

pub(crate) fn name_of(tool: &Value) -> Option<&str> {
    tool.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
}

/// The engine's answers to `calls` (`(id, name, arguments)`), as `tool`
/// messages of the exchange.
fn answer_calls<'c>(
    guard: &mut Option<Managed>,
    calls: impl Iterator<Item = (&'c str, &'c str, &'c str)>,
) -> Vec<String> {
    calls
        .map(|(id, name, args)| {
            let result = answer(guard, name, args);
            serde_json::json!({ "role": "tool", "tool_call_id": id, "content": result }).to_string()
        })
        .collect()
}

/// The engine's answer to one call of its tool `name` with `args` (JSON).
pub(crate) fn answer(guard: &mut Option<Managed>, name: &str, args: &str) -> String {
    guard
        .as_mut()
        .and_then(|m| m.handle_tool_call(name, args))
        .unwrap_or_else(|| context_engine::engine::unknown_tool(name))
}

/// The request again: `messages` with the `exchange` appended, `tools` as
/// given (empty: removed), the other overrides kept.
pub(crate) fn request_with(
    body: &ChatBody<'_>,
    overrides: &[(&str, String)],
    messages: &str,
    exchange: &[String],
    tools: &str,
) -> Bytes {
    let with_exchange = if exchange.is_empty() {
        messages.to_owned()
    } else {
        let open = messages.trim_end().strip_suffix(']').unwrap_or(messages);
        let sep = if open.trim_end().ends_with('[') {
            ""
        } else {
            ","
        };
        format!("{open}{sep}{}]", exchange.join(","))
    };
    let mut fields: Vec<(&str, &str)> = overrides
        .iter()
        .filter(|(k, _)| *k != "messages" && *k != "tools")
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    fields.push(("messages", &with_exchange));
    fields.push(("tools", tools));
    Bytes::from(body.write(&fields))
}

/// The messages text a request goes out with: the managed one, else the
/// client's.
pub(crate) fn messages_of(body: &ChatBody<'_>, overrides: &[(&str, String)]) -> String {
    overrides
        .iter()
        .find(|(k, _)| *k == "messages")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| {
            body.field("messages")
                .map_or("[]".into(), |m| m.get().to_owned())
        })
}

/// A stream's engine-tool rounds: what the proxy needs to re-send it.
#[derive(Debug)]
pub struct StreamTools {
    /// The tools offered.
    pub tools: EngineTools,
    body: Bytes,
    overrides: Vec<(&'static str, String)>,
    exchange: Vec<String>,
    round: u32,
    max_rounds: u32,
}

impl StreamTools {
    /// The rounds of a stream sent with `overrides` over the client's
    /// `body`, at most `max_rounds`.
    pub fn new(
        tools: EngineTools,
        body: Bytes,
        overrides: Vec<(&'static str, String)>,
        max_rounds: u32,
    ) -> StreamTools {
        StreamTools {
            tools,
            body,
            overrides,
            exchange: Vec::new(),
            round: 0,
            max_rounds,
        }
    }

    /// Whether another round may resolve calls (else the held calls go to
    /// the client, engine calls removed).
    pub fn may_resolve(&self) -> bool {
        self.round < self.max_rounds
    }

    /// Resolves `held`'s calls (all engine calls) and returns the next
    /// request's body: the exchange so far appended, the engine tools
    /// offered again unless it is the last round.
    pub fn next_request(&mut self, guard: &mut Option<Managed>, held: &Held) -> Bytes {
        self.round += 1;
        let calls: Vec<Value> = held
            .calls
            .iter()
            .map(|c| serde_json::json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        let content = if held.text.is_empty() {
            Value::Null
        } else {
            Value::String(held.text.clone())
        };
        self.exchange.push(
            serde_json::json!({"role": "assistant", "content": content, "tool_calls": calls})
                .to_string(),
        );
        let answers = answer_calls(
            guard,
            held.calls
                .iter()
                .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())),
        );
        self.exchange.extend(answers);
        let Ok(body) = ChatBody::parse(&self.body) else {
            return self.body.clone();
        };
        let client_tools = body.field("tools").map(|t| t.get()).unwrap_or_default();
        let tools = if self.may_resolve() {
            self.tools.tools_json.as_str()
        } else {
            client_tools
        };
        let messages = messages_of(&body, &self.overrides);
        request_with(&body, &self.overrides, &messages, &self.exchange, tools)
    }
}

/// Sends the request, resolving engine-only tool calls in up to
/// `max_tool_rounds` round trips, and returns the answer for the client.
pub async fn resolve(
    state: &AppState,
    guard: &mut Option<Managed>,
    body: &ChatBody<'_>,
    overrides: &[(&str, String)],
    tools: &EngineTools,
    headers: HeaderMap,
    url: &str,
) -> Result<(StatusCode, HeaderMap, Bytes), ServeError> {
    let messages = messages_of(body, overrides);
    let client_tools = body
        .field("tools")
        .map(|t| t.get().to_owned())
        .unwrap_or_default();
    let mut exchange: Vec<String> = Vec::new();
    let rounds = state.options().max_tool_rounds;
    let mut round = 0;
    loop {
        let last = round >= rounds;
        // Empty removes the field (the client sent no tools).
        let offered = if last {
            &client_tools
        } else {
            &tools.tools_json
        };
        let sent = request_with(body, overrides, &messages, &exchange, offered);
        let (status, resp_headers, bytes) = send_collect(state, headers.clone(), url, sent).await?;
        if !status.is_success() {
            return Ok((status, resp_headers, bytes));
        }
        let Ok(mut answer) = serde_json::from_slice::<Value>(&bytes) else {
            return Ok((status, resp_headers, bytes));
        };
        let Some(message) = answer.pointer("/choices/0/message").cloned() else {
            return Ok((status, resp_headers, bytes));
        };
        let calls = message
            .get("tool_calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let is_engine = |c: &Value| {
            c.pointer("/function/name")
                .and_then(Value::as_str)
                .is_some_and(|n| tools.names.iter().any(|t| t == n))
        };
        let engine_calls = calls.iter().filter(|c| is_engine(c)).count();
        if engine_calls == 0 {
            return Ok((status, resp_headers, bytes));
        }
        if engine_calls == calls.len() && !last {
            state.metrics().tool_round();
            round += 1;
            exchange.push(message.to_string());
            let answers = answer_calls(
                guard,
                calls.iter().map(|c| {
                    (
                        str_at(c, "/id").unwrap_or_default(),
                        str_at(c, "/function/name").unwrap_or_default(),
                        str_at(c, "/function/arguments").unwrap_or("{}"),
                    )
                }),
            );
            exchange.extend(answers);
            continue;
        }
        // Mixed, or engine calls on the last round: the client gets its
        // own calls only.
        strip_engine_calls(&mut answer, &is_engine);
        let bytes = Bytes::from(answer.to_string());
        let mut resp_headers = resp_headers;
        resp_headers.remove(axum::http::header::CONTENT_LENGTH);
        return Ok((status, resp_headers, bytes));
    }
}

/// Removes engine calls from every choice; a choice left without calls
/// ends as `stop` with its text (never `null`).
fn strip_engine_calls(answer: &mut Value, is_engine: &dyn Fn(&Value) -> bool) {
    let Some(choices) = answer.get_mut("choices").and_then(Value::as_array_mut) else {
        return;
    };
    for choice in choices {
        let Some(message) = choice.get_mut("message").and_then(Value::as_object_mut) else {
            continue;
        };
        let Some(Value::Array(calls)) = message.get_mut("tool_calls") else {
            continue;
        };
        calls.retain(|c| !is_engine(c));
        if calls.is_empty() {
            message.remove("tool_calls");
            if message.get("content").is_none_or(Value::is_null) {
                message.insert("content".into(), Value::String(String::new()));
            }
            if let Some(c) = choice.as_object_mut() {
                c.insert("finish_reason".into(), Value::String("stop".into()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_calls_keep_the_clients_only() {
        let mut answer: Value = serde_json::from_str(
            r#"{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"tool_calls":[
                {"id":"a","type":"function","function":{"name":"context_recall","arguments":"{}"}},
                {"id":"b","type":"function","function":{"name":"bash","arguments":"{}"}}]}}]}"#,
        )
        .unwrap();
        let is_engine = |c: &Value| {
            c.pointer("/function/name").and_then(Value::as_str) == Some("context_recall")
        };
        strip_engine_calls(&mut answer, &is_engine);
        let calls = answer
            .pointer("/choices/0/message/tool_calls")
            .unwrap()
            .as_array()
            .unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["id"], "b");
        assert_eq!(
            answer.pointer("/choices/0/finish_reason").unwrap(),
            "tool_calls"
        );
        strip_engine_calls(&mut answer, &|_: &Value| true);
        assert!(answer.pointer("/choices/0/message/tool_calls").is_none());
        assert_eq!(answer.pointer("/choices/0/message/content").unwrap(), "");
        assert_eq!(answer.pointer("/choices/0/finish_reason").unwrap(), "stop");
    }
}
