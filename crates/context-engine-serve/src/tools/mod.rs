//! Engine tools (`context_recall`, …) offered to the model and resolved in
//! the proxy, so the client never sees them.
//!
//! Offered only to a request with an identity (a
//! [`Reader`]: an anonymous request never reads an archive, see
//! [`identity`](crate::identity)) and only when the client did not pin
//! `tool_choice`. The engine's schemas are appended to the client's own `tools` text (whose bytes stay
//! as they came).
//!
//! **Streams**: text passes through at once; from the event whose tool
//! call names an engine tool the rest of the stream is held
//! ([`crate::sse::Watch`]). When the stream ends, calls that are
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
//!
//! **Streamed or not, the client gets the same answer**: what a stream
//! shows of a resolved round (its text, the part before the first engine
//! call) comes before the final answer's content in a non-streamed answer
//! too, in each front's format.

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use serde_json::Value;
use serde_json::value::RawValue;

use context_engine::front::FrontKind;

use crate::body::ChatBody;
use crate::error::ServeError;
use crate::identity::Reader;
use crate::session::Managed;
use crate::session::key::tool_names;
use crate::session::requests::Wire;
use crate::sse::{Event, Held, Watch};
use crate::state::AppState;
use anthropic::Messages;
use front::FrontAnswers;
use responses::Responses;

pub mod anthropic;
pub mod front;
pub mod responses;

/// The engine tools offered on one request.
#[derive(Debug, Clone)]
pub struct EngineTools {
    /// The `tools` array: the client's text, then the engine's schemas.
    pub tools_json: String,
    /// The engine tools' names.
    pub names: Vec<String>,
}

/// The engine's tools to offer with this request, if any.
pub fn schemas(reader: Reader, m: &Managed, body: &ChatBody<'_>) -> Option<EngineTools> {
    if let Some(choice) = body.field("tool_choice")
        && choice.get().trim() != "\"auto\""
    {
        return None;
    }
    offer(reader, m, body, |t| Some(t.clone()))
}

/// The engine's tools the client does not name already, in the request's
/// format (`format` turns a chat-completions schema into it), appended to
/// the client's `tools`; `None` when there are none. Only a request with
/// an identity (its [`Reader`]) is offered them: their calls are resolved
/// only on what an offer returns.
pub(crate) fn offer(
    _reader: Reader,
    m: &Managed,
    body: &ChatBody<'_>,
    format: impl Fn(&Value) -> Option<Value>,
) -> Option<EngineTools> {
    // A client without tools of its own (a text-action agent) gets its
    // request as it sent it.
    let has_tools = body
        .field("tools")
        .and_then(|t| serde_json::from_str::<Vec<&RawValue>>(t.get()).ok())
        .is_some_and(|t| !t.is_empty());
    if !has_tools {
        return None;
    }
    let client = tool_names(body);
    let added: Vec<Value> = m
        .host()
        .tools(&[])
        .iter()
        .filter_map(format)
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

impl EngineTools {
    /// Whether `name` is one of the engine tools offered.
    pub(crate) fn is_engine(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

/// The request's `tools` text (its bytes as they came) with `engine`'s
/// schemas appended.
fn appended(body: &ChatBody<'_>, engine: &[Value]) -> String {
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
    request_with_list(body, overrides, ("messages", messages), exchange, tools)
}

/// The request again: the conversation `list` (`(field, its text)`: chat's
/// and Anthropic's `messages`, Responses' `input`) with the `exchange`
/// appended, `tools` as given (empty: removed), the other overrides kept.
pub(crate) fn request_with_list(
    body: &ChatBody<'_>,
    overrides: &[(&str, String)],
    (field, list): (&str, &str),
    exchange: &[String],
    tools: &str,
) -> Bytes {
    let with_exchange = if exchange.is_empty() {
        list.to_owned()
    } else {
        let open = list.trim_end().strip_suffix(']').unwrap_or(list);
        let sep = if open.trim_end().ends_with('[') {
            ""
        } else {
            ","
        };
        format!("{open}{sep}{}]", exchange.join(","))
    };
    let mut fields: Vec<(&str, &str)> = overrides
        .iter()
        .filter(|(k, _)| *k != field && *k != "tools")
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    fields.push((field, &with_exchange));
    fields.push(("tools", tools));
    Bytes::from(body.write(&fields))
}

/// The messages text a request goes out with: the managed one, else the
/// client's.
pub(crate) fn messages_of(body: &ChatBody<'_>, overrides: &[(&str, String)]) -> String {
    list_of(body, overrides, "messages")
}

/// The text of the conversation `field` a request goes out with: the
/// managed one, else the client's.
pub(crate) fn list_of(body: &ChatBody<'_>, overrides: &[(&str, String)], field: &str) -> String {
    overrides
        .iter()
        .find(|(k, _)| *k == field)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| {
            body.field(field)
                .map_or("[]".into(), |m| m.get().to_owned())
        })
}

/// The client's `tools` text, for a last round (empty: the field is
/// removed).
pub(crate) fn client_tools(body: &ChatBody<'_>) -> String {
    body.field("tools")
        .map(|t| t.get().to_owned())
        .unwrap_or_default()
}

/// What a front's stream needs to re-send its request, round after round.
#[derive(Debug)]
pub(crate) struct Resend {
    body: Bytes,
    overrides: Vec<(&'static str, String)>,
    /// The conversation's field: `messages` or `input`.
    list: &'static str,
    exchange: Vec<String>,
    round: u32,
    max_rounds: u32,
}

impl Resend {
    /// The rounds of the client's `body` sent with `overrides`, at most
    /// `max_rounds`, its conversation in the field `list`.
    pub(crate) fn new(
        body: Bytes,
        overrides: Vec<(&'static str, String)>,
        list: &'static str,
        max_rounds: u32,
    ) -> Resend {
        Resend {
            body,
            overrides,
            list,
            exchange: Vec::new(),
            round: 0,
            max_rounds,
        }
    }

    /// Whether another round may resolve calls.
    pub(crate) fn may_resolve(&self) -> bool {
        self.round < self.max_rounds
    }

    /// Whether the current stream is a continuation.
    pub(crate) fn continuing(&self) -> bool {
        self.round > 0
    }

    /// Appends one resolved round's `items` to the exchange and returns the
    /// next request: the engine's tools (`offered`) again, unless it is the
    /// last round.
    pub(crate) fn next(&mut self, items: Vec<String>, offered: &str) -> Bytes {
        self.round += 1;
        self.exchange.extend(items);
        let Ok(body) = ChatBody::parse_object(&self.body) else {
            return self.body.clone();
        };
        let tools = if self.may_resolve() {
            offered.to_owned()
        } else {
            client_tools(&body)
        };
        let list = list_of(&body, &self.overrides, self.list);
        request_with_list(
            &body,
            &self.overrides,
            (self.list, &list),
            &self.exchange,
            &tools,
        )
    }
}

/// Engine tools offered on a managed request, in its client's format:
/// chat completions, Anthropic Messages ([`anthropic`]), Responses
/// ([`responses`]). One loop resolves their rounds whatever the API:
/// [`resolve_with`] for an answer read whole, [`Rounds`] for a stream.
#[derive(Debug, Clone)]
pub enum ApiTools {
    /// Chat completions.
    Chat(EngineTools),
    /// Anthropic Messages (Claude Code).
    Anthropic(EngineTools),
    /// OpenAI Responses (Codex).
    Responses(EngineTools),
}

impl ApiTools {
    /// The engine's tools to offer with this request of `api`.
    pub fn offer(reader: Reader, api: Wire, m: &Managed, body: &ChatBody<'_>) -> Option<ApiTools> {
        match api {
            Wire::Chat => schemas(reader, m, body).map(ApiTools::Chat),
            Wire::Front(FrontKind::Anthropic) => {
                anthropic::schemas(reader, m, body).map(ApiTools::Anthropic)
            }
            Wire::Front(FrontKind::Responses) => {
                responses::schemas(reader, m, body).map(ApiTools::Responses)
            }
        }
    }

    /// The request's `tools` with the engine's appended.
    pub fn tools_json(&self) -> &str {
        match self {
            ApiTools::Chat(t) | ApiTools::Anthropic(t) | ApiTools::Responses(t) => &t.tools_json,
        }
    }

    /// Sends a non-streamed request, resolving engine-only answers; the
    /// answer for the client.
    #[allow(clippy::too_many_arguments)]
    pub async fn resolve(
        &self,
        state: &AppState,
        guard: &mut Option<Managed>,
        body: &ChatBody<'_>,
        overrides: &[(&str, String)],
        headers: HeaderMap,
        url: &str,
    ) -> Result<(StatusCode, HeaderMap, Bytes), ServeError> {
        let client = client_tools(body);
        match self {
            ApiTools::Chat(t) => {
                let api = ChatAnswers {
                    body,
                    overrides,
                    messages: messages_of(body, overrides),
                    tools: t,
                };
                resolve_with(state, guard, &api, t, &client, headers, url).await
            }
            ApiTools::Anthropic(t) => {
                let api = FrontAnswers::<Messages>::new(body, overrides, t);
                resolve_with(state, guard, &api, t, &client, headers, url).await
            }
            ApiTools::Responses(t) => {
                let api = FrontAnswers::<Responses>::new(body, overrides, t);
                resolve_with(state, guard, &api, t, &client, headers, url).await
            }
        }
    }

    /// The rounds of a stream sent with `overrides` over the client's
    /// `body`, at most `max_rounds`.
    pub fn stream(
        self,
        body: Bytes,
        overrides: Vec<(&'static str, String)>,
        max_rounds: u32,
    ) -> Box<dyn Rounds> {
        match self {
            ApiTools::Chat(t) => Box::new(ChatRounds::new(StreamTools::new(
                t, body, overrides, max_rounds,
            ))),
            ApiTools::Anthropic(t) => {
                Box::new(anthropic::StreamRounds::new(t, body, overrides, max_rounds))
            }
            ApiTools::Responses(t) => {
                Box::new(responses::StreamRounds::new(t, body, overrides, max_rounds))
            }
        }
    }
}

/// One held event of a front's stream, as [`replay_held`] reads it.
pub(crate) enum HeldEvent<'a> {
    /// An event of the round's block or item `index`, closed up over the
    /// removed ones before it.
    Indexed {
        kind: String,
        event: Value,
        index: usize,
    },
    /// An event of the whole message or response.
    Whole {
        kind: String,
        event: Value,
        raw: &'a [u8],
    },
    /// Not an event of the API (a comment, a keep-alive): as it came.
    Raw(&'a [u8]),
}

/// Replays `held` events for the client: those of the blocks or items in
/// `removed` (their indices under `index_key`) dropped, the later indices
/// closed up; each event left goes to `write`.
pub(crate) fn replay_held(
    held: Vec<Event>,
    index_key: &str,
    removed: &std::collections::BTreeSet<usize>,
    mut write: impl FnMut(HeldEvent<'_>, &mut Vec<u8>),
) -> Vec<u8> {
    let mut out = Vec::new();
    for held in &held {
        let raw = &held.raw[..];
        let Some(event) = held.object().cloned() else {
            write(HeldEvent::Raw(raw), &mut out);
            continue;
        };
        let kind = held.kind().to_owned();
        let index = event
            .get(index_key)
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok());
        match index {
            Some(i) if removed.contains(&i) => {}
            Some(i) => {
                let index = i - removed.range(..i).count();
                write(HeldEvent::Indexed { kind, event, index }, &mut out);
            }
            None => write(HeldEvent::Whole { kind, event, raw }, &mut out),
        }
    }
    out
}

/// A stream under engine tools, in one API's format: reads each round's
/// stream, holds a round from its first engine call, and writes what the
/// client gets. The relay of the handlers drives it.
pub trait Rounds: Send {
    /// Reads one event of the current stream (one the reader lets
    /// through); writes what the client gets of it now to `out`.
    fn event(&mut self, event: &Event, out: &mut Vec<u8>);
    /// Whether events are being held (an engine tool was called).
    fn holding(&self) -> bool;
    /// Whether the current round's stream has ended.
    fn ended(&self) -> bool;
    /// Whether the held round's calls may be resolved here.
    fn resolvable(&self) -> bool;
    /// Resolves the held calls; the continuation's request body.
    fn next_request(&mut self, guard: &mut Option<Managed>) -> Bytes;
    /// The held events for the client, the engine's calls removed.
    fn release_held(&mut self) -> Vec<u8>;
    /// The stream broke off ([`crate::cut`]): drops what the round held
    /// and returns the events that end the client's stream as failed with
    /// `message`, in its numbering.
    fn fail(&mut self, message: &str) -> Vec<u8>;
}

/// Chat completions' stream under engine tools: a [`Watch`] over the
/// events the client gets, and the rounds' requests.
#[derive(Debug)]
pub struct ChatRounds {
    tools: StreamTools,
    watch: Watch,
    /// `[DONE]` went by in this round.
    done: bool,
}

impl ChatRounds {
    /// The rounds of `tools`.
    pub fn new(tools: StreamTools) -> ChatRounds {
        let watch = Watch::new(tools.tools.names.clone());
        ChatRounds {
            tools,
            watch,
            done: false,
        }
    }
}

impl Rounds for ChatRounds {
    fn event(&mut self, event: &Event, out: &mut Vec<u8>) {
        if event.is_done() {
            self.done = true;
        }
        if self.watch.pass(event) {
            out.extend_from_slice(&event.raw);
        }
    }

    fn holding(&self) -> bool {
        self.watch.holding()
    }

    fn ended(&self) -> bool {
        self.done
    }

    fn resolvable(&self) -> bool {
        self.tools.may_resolve()
            && self
                .watch
                .held()
                .is_some_and(|h| h.only_engine_calls(&self.tools.tools.names))
    }

    fn next_request(&mut self, guard: &mut Option<Managed>) -> Bytes {
        let held = self.watch.take_held().unwrap_or_default();
        self.watch = Watch::new(self.tools.tools.names.clone());
        self.done = false;
        self.tools.next_request(guard, &held)
    }

    fn release_held(&mut self) -> Vec<u8> {
        self.watch
            .take_held()
            .map(|h| h.for_client(&self.tools.tools.names).to_vec())
            .unwrap_or_default()
    }

    fn fail(&mut self, message: &str) -> Vec<u8> {
        drop(self.watch.take_held());
        crate::cut::chat_event(message).to_vec()
    }
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

/// How many calls of each kind a non-streamed answer makes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Calls {
    /// Calls of the engine's tools.
    pub(crate) engine: usize,
    /// Calls the client has to run.
    pub(crate) client: usize,
}

/// One API's non-streamed answers, as the rounds loop ([`resolve_with`])
/// reads and writes them.
pub(crate) trait Answers {
    /// The request of a round: the exchange so far appended, `tools`
    /// offered (empty: the field removed).
    fn request(&self, exchange: &[String], tools: &str) -> Bytes;
    /// The calls `answer` makes; `None` for an answer this API's reader
    /// does not know, which goes to the client as it came.
    fn calls(&self, answer: &Value) -> Option<Calls>;
    /// The exchange of a resolved round: the answer as the model wrote it,
    /// then the engine's answer to each of its calls.
    fn exchange(&self, guard: &mut Option<Managed>, answer: &Value) -> Vec<String>;
    /// What a stream shows the client of a resolved round.
    fn shown(&self, answer: &Value) -> Vec<Value>;
    /// The answer for the client: what it was shown of the resolved rounds
    /// first, the engine's calls removed.
    fn finish(&self, answer: &mut Value, shown: Vec<Value>);
}

/// Sends the request, resolving answers whose calls are all the engine's
/// in up to `max_tool_rounds` round trips (the last without the engine's
/// tools: `client_tools`), and returns the answer for the client.
pub(crate) async fn resolve_with(
    state: &AppState,
    guard: &mut Option<Managed>,
    api: &(dyn Answers + Sync),
    tools: &EngineTools,
    client_tools: &str,
    headers: HeaderMap,
    url: &str,
) -> Result<(StatusCode, HeaderMap, Bytes), ServeError> {
    let mut exchange: Vec<String> = Vec::new();
    // What the client was not shown yet of the resolved rounds (a stream
    // shows it as it comes).
    let mut shown: Vec<Value> = Vec::new();
    let rounds = state.options().max_tool_rounds;
    let mut round = 0;
    loop {
        let last = round >= rounds;
        let offered = if last {
            client_tools
        } else {
            &tools.tools_json
        };
        let sent = api.request(&exchange, offered);
        let (status, resp_headers, bytes) =
            state.upstream().collect(url, headers.clone(), sent).await?;
        if !status.is_success() {
            return Ok((status, resp_headers, bytes));
        }
        let Ok(mut answer) = serde_json::from_slice::<Value>(&bytes) else {
            return Ok((status, resp_headers, bytes));
        };
        let Some(calls) = api.calls(&answer) else {
            return Ok((status, resp_headers, bytes));
        };
        if calls.engine == 0 && shown.is_empty() {
            return Ok((status, resp_headers, bytes));
        }
        if calls.engine > 0 && calls.client == 0 && !last {
            state.metrics().tool_round();
            // A resolved round is billed like any call: its usage to the
            // metrics and the session's stats (the engine learns the
            // prompt size from the last round's, when it is released).
            if let Some(usage) = crate::usage::usage_of(&bytes) {
                crate::usage::settle(state, &usage);
                if let Some(m) = guard.as_mut() {
                    m.bill(&usage);
                }
            }
            round += 1;
            shown.extend(api.shown(&answer));
            exchange.extend(api.exchange(guard, &answer));
            continue;
        }
        // Mixed, engine calls on the last round, or an answer after
        // resolved rounds: the client gets its own calls only, after what
        // it was not shown yet.
        api.finish(&mut answer, shown);
        let mut resp_headers = resp_headers;
        resp_headers.remove(axum::http::header::CONTENT_LENGTH);
        return Ok((status, resp_headers, Bytes::from(answer.to_string())));
    }
}

/// Chat completions' answers.
struct ChatAnswers<'a, 'b> {
    body: &'a ChatBody<'b>,
    overrides: &'a [(&'a str, String)],
    messages: String,
    tools: &'a EngineTools,
}

impl ChatAnswers<'_, '_> {
    fn is_engine(&self, call: &Value) -> bool {
        str_at(call, "/function/name").is_some_and(|n| self.tools.is_engine(n))
    }
}

impl Answers for ChatAnswers<'_, '_> {
    fn request(&self, exchange: &[String], tools: &str) -> Bytes {
        request_with(self.body, self.overrides, &self.messages, exchange, tools)
    }

    fn calls(&self, answer: &Value) -> Option<Calls> {
        let message = answer.pointer("/choices/0/message")?;
        let calls = message.get("tool_calls").and_then(Value::as_array);
        let all = calls.map_or(0, Vec::len);
        let engine = calls.map_or(0, |c| c.iter().filter(|c| self.is_engine(c)).count());
        Some(Calls {
            engine,
            client: all - engine,
        })
    }

    fn exchange(&self, guard: &mut Option<Managed>, answer: &Value) -> Vec<String> {
        let Some(message) = answer.pointer("/choices/0/message") else {
            return Vec::new();
        };
        let calls = message
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut out = vec![message.to_string()];
        out.extend(answer_calls(
            guard,
            calls.iter().map(|c| {
                (
                    str_at(c, "/id").unwrap_or_default(),
                    str_at(c, "/function/name").unwrap_or_default(),
                    str_at(c, "/function/arguments").unwrap_or("{}"),
                )
            }),
        ));
        out
    }

    fn shown(&self, answer: &Value) -> Vec<Value> {
        answer
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(|t| Value::String(t.to_owned()))
            .into_iter()
            .collect()
    }

    fn finish(&self, answer: &mut Value, shown: Vec<Value>) {
        strip_engine_calls(answer, &|c| self.is_engine(c));
        let text: String = shown.iter().filter_map(Value::as_str).collect();
        with_shown_text(answer, &text);
    }
}

/// Puts `shown` (the text of resolved rounds) before the text of choice 0.
fn with_shown_text(answer: &mut Value, shown: &str) {
    if shown.is_empty() {
        return;
    }
    let Some(message) = answer
        .pointer_mut("/choices/0/message")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    match message.get_mut("content") {
        Some(Value::String(t)) => t.insert_str(0, shown),
        Some(Value::Array(parts)) => {
            parts.insert(0, serde_json::json!({"type": "text", "text": shown}))
        }
        _ => {
            message.insert("content".into(), Value::String(shown.to_owned()));
        }
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

/// Rounds fed raw chunks, as the relay feeds them (tests).
#[cfg(test)]
pub(crate) struct Fed<R> {
    frames: crate::sse::Frames,
    rounds: R,
}

#[cfg(test)]
impl<R: Rounds> Fed<R> {
    pub(crate) fn new(rounds: R) -> Fed<R> {
        Fed {
            frames: crate::sse::Frames::default(),
            rounds,
        }
    }

    /// What the client gets of `chunk`.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let run = self.frames.push(Bytes::copy_from_slice(chunk));
        let mut out = Vec::new();
        for event in crate::sse::events(&run) {
            self.rounds.event(&event, &mut out);
        }
        out
    }

    /// What the client gets of an unterminated last event.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(rest) = self.frames.rest() {
            self.rounds.event(&Event::parse(rest), &mut out);
        }
        out
    }
}

#[cfg(test)]
impl<R> std::ops::Deref for Fed<R> {
    type Target = R;
    fn deref(&self) -> &R {
        &self.rounds
    }
}

#[cfg(test)]
impl<R> std::ops::DerefMut for Fed<R> {
    fn deref_mut(&mut self) -> &mut R {
        &mut self.rounds
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
