//! The proxy's three client APIs (chat completions, Anthropic Messages,
//! Responses) for tests that run one scenario on each: the path, the
//! credential, a coding session in the API's shape, and the upstream's
//! replies in it (text, or one tool call).

use serde_json::{Value, json};

use crate::upstream::completion;

/// One of the APIs `ctx serve` fronts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// Anthropic's `/v1/messages`.
    Messages,
    /// `/v1/responses`.
    Responses,
}

impl Api {
    /// All three.
    pub const ALL: [Api; 3] = [Api::Chat, Api::Messages, Api::Responses];

    /// The path the client posts to.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
        }
    }

    /// A client carrying only this API's credential (the kit's client
    /// sends an `Authorization` of its own).
    pub fn client(self) -> reqwest::Client {
        match self {
            Api::Messages => reqwest::Client::new(),
            _ => crate::proxy::client(),
        }
    }

    /// The credential header and its value.
    pub fn credential(self) -> (&'static str, &'static str) {
        match self {
            Api::Messages => ("x-api-key", "sk-ant-client"),
            _ => ("authorization", "Bearer sk-client"),
        }
    }

    /// The model the session's requests name.
    pub fn model(self) -> &'static str {
        match self {
            Api::Messages => "claude-agent",
            _ => "gpt-agent",
        }
    }

    /// A coding session of `turns` `bash` calls in this API's shape, the
    /// `i`th answered with `output(i)`; with `tools`, the request offers
    /// the agent's `bash` tool.
    pub fn session(self, turns: usize, output: impl Fn(usize) -> String, tools: bool) -> Value {
        let ask = "Fix the parser bug in src/parse.rs";
        let args = |i: usize| format!("{{\"cmd\":\"cat src/file{i}.rs\"}}");
        let mut body = match self {
            Api::Chat => {
                let mut m = vec![
                    json!({"role": "system", "content": "You are a coding agent."}),
                    json!({"role": "user", "content": ask}),
                ];
                for i in 0..turns {
                    m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"), "type": "function", "function": {"name": "bash", "arguments": args(i)}}]}));
                    m.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": output(i)}));
                }
                json!({"model": self.model(), "messages": m})
            }
            Api::Messages => {
                let mut m = vec![json!({"role": "user", "content": ask})];
                for i in 0..turns {
                    m.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("toolu_{i}"), "name": "bash", "input": {"cmd": format!("cat src/file{i}.rs")}}]}));
                    m.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": output(i)}]}));
                }
                json!({"model": self.model(), "max_tokens": 1024, "system": "You are a coding agent.", "messages": m})
            }
            Api::Responses => {
                let mut m = vec![json!({"role": "user", "content": ask})];
                for i in 0..turns {
                    m.push(json!({"type": "function_call", "call_id": format!("call_{i}"), "name": "bash", "arguments": args(i)}));
                    m.push(json!({"type": "function_call_output", "call_id": format!("call_{i}"), "output": output(i)}));
                }
                json!({"model": self.model(), "instructions": "You are a coding agent.", "input": m})
            }
        };
        if tools {
            body["tools"] = match self {
                Api::Chat => {
                    json!([{"type": "function", "function": {"name": "bash", "description": "Run a command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}])
                }
                Api::Messages => {
                    json!([{"name": "bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}])
                }
                Api::Responses => {
                    json!([{"type": "function", "name": "bash", "description": "Run a command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}])
                }
            };
        }
        body
    }

    /// Posts `body` to the proxy at `addr` as session `session`, with this
    /// API's credential: the status and the body of the answer.
    pub async fn send(
        self,
        addr: std::net::SocketAddr,
        body: &Value,
        session: &str,
    ) -> (u16, axum::body::Bytes) {
        let (name, value) = self.credential();
        let r = self
            .client()
            .post(format!("http://{addr}{}", self.path()))
            .header("content-type", "application/json")
            .header("x-ctx-session", session)
            .header(name, value)
            .body(body.to_string())
            .send()
            .await
            .expect("the proxy answers");
        let status = r.status().as_u16();
        (status, r.bytes().await.expect("an answer body"))
    }

    /// The session's figures (`/ctx/sessions/{id}`'s `stats`), asked with
    /// this API's credential.
    pub async fn stats(self, addr: std::net::SocketAddr, id: &str) -> Value {
        let (name, value) = self.credential();
        let r = self
            .client()
            .get(format!("http://{addr}/ctx/sessions/{id}"))
            .header(name, value)
            .send()
            .await
            .expect("the proxy answers");
        let v: Value = serde_json::from_slice(&r.bytes().await.expect("an answer body"))
            .expect("the session as JSON");
        v["stats"].clone()
    }

    /// Which API a request body the upstream received is in.
    pub fn of(body: &Value) -> Api {
        if body.get("input").is_some() {
            Api::Responses
        } else if body.get("max_tokens").is_some() && body.get("system").is_some() {
            Api::Messages
        } else {
            Api::Chat
        }
    }

    /// An answer in this API's shape: `text`, with `usage` (prompt,
    /// completion).
    pub fn text_reply(self, text: &str, (prompt, completion_tokens): (u64, u64)) -> Value {
        match self {
            Api::Responses => {
                json!({"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}], "usage": {"input_tokens": prompt, "output_tokens": completion_tokens}})
            }
            Api::Messages => {
                json!({"type": "message", "role": "assistant", "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": {"input_tokens": prompt, "output_tokens": completion_tokens}})
            }
            Api::Chat => completion(
                json!({"role": "assistant", "content": text}),
                prompt,
                completion_tokens,
            ),
        }
    }

    /// An answer in this API's shape that calls tool `name` with `args`.
    pub fn tool_call_reply(self, id: &str, name: &str, args: &Value) -> Value {
        match self {
            Api::Responses => {
                json!({"output": [{"type": "function_call", "call_id": id, "name": name, "arguments": args.to_string()}], "usage": {"input_tokens": 10, "output_tokens": 5}})
            }
            Api::Messages => {
                json!({"type": "message", "role": "assistant", "content": [{"type": "tool_use", "id": id, "name": name, "input": args}], "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 5}})
            }
            Api::Chat => {
                let mut reply = completion(
                    json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}]}),
                    10,
                    5,
                );
                reply["choices"][0]["finish_reason"] = json!("tool_calls");
                reply
            }
        }
    }

    /// The text of the engine's answer to tool call `id` in a request the
    /// upstream received (the proxy appends it as the exchange's result).
    pub fn tool_answer(body: &Value, id: &str) -> Option<String> {
        let texts: Vec<String> = match Api::of(body) {
            Api::Chat => body["messages"]
                .as_array()?
                .iter()
                .filter(|m| m["role"] == "tool" && m["tool_call_id"] == id)
                .filter_map(|m| m["content"].as_str().map(str::to_owned))
                .collect(),
            Api::Messages => body["messages"]
                .as_array()?
                .iter()
                .filter_map(|m| m["content"].as_array())
                .flatten()
                .filter(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)
                .map(|b| match &b["content"] {
                    Value::String(s) => s.clone(),
                    other => other
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p["text"].as_str())
                        .collect(),
                })
                .collect(),
            Api::Responses => body["input"]
                .as_array()?
                .iter()
                .filter(|m| m["type"] == "function_call_output" && m["call_id"] == id)
                .filter_map(|m| m["output"].as_str().map(str::to_owned))
                .collect(),
        };
        texts.into_iter().next()
    }
}
