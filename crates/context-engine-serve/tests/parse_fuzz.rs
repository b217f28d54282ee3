#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The request parsers of all three fronts under arbitrary and
//! structure-aware mutated bodies: realistic chat, Anthropic Messages and
//! Responses requests with values replaced by arbitrary JSON (wrong types),
//! fields removed, values nested hundreds deep, numbers past any range,
//! escapes that are not UTF-16, invalid UTF-8, cut short; and raw bytes.
//!
//! Each goes through the parse path the proxy takes for its front (the
//! body split, the session key, the front request's parse and bridge both
//! ways, with one session's cache reused across cases as a proxy reuses
//! it), and then through the proxy itself. Nothing may panic (not even
//! where the proxy would catch it and fail open), and bad input gets an
//! error that says something.
//!
//! The cargo-fuzz targets in `fuzz/fuzz_targets/front_*.rs` drive the same
//! paths with coverage guidance, for those who run nightly.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use axum::http::{HeaderMap, HeaderValue};
use context_engine::front::{self as lib, FrontCache, FrontKind, FrontRequest};
use context_engine::message::Message;
use context_engine_serve::body::{ChatBody, with_include_usage};
use context_engine_serve::identity::{Identity, Rules};
use context_engine_serve::session::key::{front_session_key, session_key, tool_names};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value, json};

use common::{compressor_context, counter, options, start_proxy};

// Generators.

/// Keys the three formats know, and any other.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "role",
            "content",
            "type",
            "text",
            "tool_calls",
            "id",
            "function",
            "name",
            "arguments",
            "tool_call_id",
            "tool_use_id",
            "input",
            "thinking",
            "signature",
            "cache_control",
            "call_id",
            "output",
            "summary",
            "encrypted_content",
            "messages",
            "system",
            "model",
            "stream",
            "tools",
            "metadata",
            "user_id",
            "session_id",
            "prompt_cache_key",
            "previous_response_id",
            "instructions",
            "stream_options",
            "include_usage",
            "tool_choice",
            "parameters",
            "reasoning_content",
            "is_error",
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,10}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,24}".prop_map(Value::String),
        prop::sample::select(vec![
            "user",
            "assistant",
            "system",
            "tool",
            "developer",
            "text",
            "tool_use",
            "tool_result",
            "thinking",
            "redacted_thinking",
            "image",
            "message",
            "function_call",
            "function_call_output",
            "reasoning",
            "custom_tool_call",
            "local_shell_call",
            "input_text",
            "output_text",
            "function",
            "",
        ])
        .prop_map(|s| json!(s)),
    ]
}

/// Any JSON value, a few levels deep.
fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A realistic chat-completions request of `turns` tool turns.
fn chat_request(turns: usize, stream: bool) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": [{"type": "text", "text": "Fix the bug"}]}),
    ];
    for i in 0..turns {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{i}"), "type": "function",
             "function": {"name": "bash", "arguments": format!("{{\"cmd\":\"cat f{i}\"}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"),
                             "content": format!("line 1 of f{i}\nline 2\n")}));
    }
    messages.push(json!({"role": "assistant", "content": "Done.", "reasoning_content": "ok"}));
    messages.push(json!({"role": "user", "content": "thanks"}));
    json!({"model": "gpt-4o", "stream": stream, "stream_options": {"include_usage": false},
           "metadata": {"session_id": "s1"}, "messages": messages, "tool_choice": "auto",
           "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]})
}

/// A realistic Anthropic Messages request (Claude Code's shape).
fn anthropic_request(turns: usize, stream: bool) -> Value {
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "Fix the bug", "cache_control": {"type": "ephemeral"}}]})];
    for i in 0..turns {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "look", "signature": "sig"},
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Bash", "input": {"cmd": format!("cat f{i}")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{i}"),
             "content": [{"type": "text", "text": format!("line 1 of f{i}")}], "is_error": false}]}));
    }
    messages.push(json!({"role": "assistant", "content": "Done."}));
    messages.push(json!({"role": "user", "content": "thanks"}));
    json!({"model": "claude-sonnet-4", "max_tokens": 1024, "stream": stream,
           "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
           "metadata": {"user_id": "{\"session_id\":\"abc\"}"}, "messages": messages,
           "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]})
}

/// A realistic Responses request (Codex's shape).
fn responses_request(turns: usize, stream: bool) -> Value {
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the bug"}]}),
    ];
    for i in 0..turns {
        input.push(json!({"type": "reasoning", "id": format!("rs_{i}"), "summary": [], "encrypted_content": "gAAA"}));
        input.push(
            json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": format!("call_{i}"),
                          "name": "shell", "arguments": format!("{{\"cmd\":\"cat f{i}\"}}")}),
        );
        input.push(
            json!({"type": "function_call_output", "call_id": format!("call_{i}"),
                          "output": format!("line 1 of f{i}")}),
        );
    }
    input.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}));
    input.push(json!({"type": "message", "role": "user", "content": "thanks"}));
    json!({"model": "gpt-5-codex", "instructions": "You are Codex.", "stream": stream,
           "prompt_cache_key": "thread-1", "input": input, "store": false,
           "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]})
}

/// A change at one node of a request.
#[derive(Clone, Debug)]
enum Mutation {
    /// The node becomes this value (often of the wrong type).
    Replace(Value),
    /// The node leaves its object or array.
    Remove,
    /// The node becomes text no JSON value encodes as: `Literal`.
    Literal(Literal),
}

/// Text spliced in where a value was.
#[derive(Clone, Debug)]
enum Literal {
    /// A number past f64 and u64.
    Huge(&'static str),
    /// A string with an escape that is no UTF-16 (a lone surrogate, …).
    BadEscape(&'static str),
    /// Arrays or objects nested this deep.
    Deep(usize, bool),
}

impl Literal {
    fn text(&self) -> String {
        match self {
            Literal::Huge(n) | Literal::BadEscape(n) => (*n).to_owned(),
            Literal::Deep(depth, arrays) => {
                let (open, close) = if *arrays {
                    ("[", "]")
                } else {
                    ("{\"a\":", "}")
                };
                format!("{}1{}", open.repeat(*depth), close.repeat(*depth))
            }
        }
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => value().prop_map(Mutation::Replace),
        2 => Just(Mutation::Remove),
        1 => prop::sample::select(vec![
            "1e999999", "-1e400", "123456789012345678901234567890", "18446744073709551616",
            "-9223372036854775809", "0.000000000000000000000000000000000000000000001e-400",
        ]).prop_map(|n| Mutation::Literal(Literal::Huge(n))),
        1 => prop::sample::select(vec![
            r#""\ud800""#, r#""a\udc00b""#, r#""\ud83d\u0041""#, r#""\u00""#, r#""\x41""#,
            r#""\uDFFF\uD800""#,
        ]).prop_map(|e| Mutation::Literal(Literal::BadEscape(e))),
        1 => (1usize..400, any::<bool>()).prop_map(|(d, a)| Mutation::Literal(Literal::Deep(d, a))),
    ]
}

/// How many nodes `v` has (itself included).
fn nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(nodes).sum(),
        Value::Object(o) => o.values().map(nodes).sum(),
        _ => 0,
    }
}

/// Applies `m` to the node of `v` numbered `at` (pre-order); a literal
/// goes in as a placeholder string, `literals` keeping its text.
fn apply(v: &mut Value, mut at: usize, m: &Mutation, literals: &mut Vec<String>) {
    fn walk(v: &mut Value, at: &mut usize, m: &Mutation, literals: &mut Vec<String>) -> bool {
        let children: Vec<String> = match v {
            Value::Object(o) => o.keys().cloned().collect(),
            Value::Array(a) => (0..a.len()).map(|i| i.to_string()).collect(),
            _ => Vec::new(),
        };
        for child in children {
            if *at == 0 {
                match m {
                    Mutation::Remove => match v {
                        Value::Object(o) => {
                            o.shift_remove(&child);
                        }
                        Value::Array(a) => {
                            a.remove(child.parse::<usize>().unwrap());
                        }
                        _ => {}
                    },
                    Mutation::Replace(new) => *slot(v, &child) = new.clone(),
                    Mutation::Literal(l) => {
                        *slot(v, &child) = json!(format!("@@LITERAL{}@@", literals.len()));
                        literals.push(l.text());
                    }
                }
                return true;
            }
            *at -= 1;
            if walk(slot(v, &child), at, m, literals) {
                return true;
            }
        }
        false
    }
    fn slot<'v>(v: &'v mut Value, child: &str) -> &'v mut Value {
        match v {
            Value::Object(o) => o.get_mut(child).unwrap(),
            Value::Array(a) => &mut a[child.parse::<usize>().unwrap()],
            _ => unreachable!(),
        }
    }
    at %= nodes(v).saturating_sub(1).max(1);
    walk(v, &mut at, m, literals);
}

/// A byte-level change to the written body.
#[derive(Clone, Debug)]
enum Damage {
    None,
    /// Cut at this fraction of the length.
    Truncate(f64),
    /// These bytes (often not UTF-8) inserted at this fraction.
    Insert(f64, Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        6 => Just(Damage::None),
        1 => (0.0..1.0f64).prop_map(Damage::Truncate),
        1 => (0.0..1.0f64, prop::collection::vec(any::<u8>(), 1..6)).prop_map(|(at, b)| Damage::Insert(at, b)),
    ]
}

/// A body of format `base` (`turns`, `stream`) mutated at a few nodes and
/// maybe damaged, written as bytes.
fn mutated(
    base: fn(usize, bool) -> Value,
) -> impl Strategy<Value = (Vec<u8>, Vec<(usize, Mutation)>, Damage)> {
    (
        0usize..4,
        any::<bool>(),
        prop::collection::vec((any::<usize>(), mutation()), 0..4),
        damage(),
    )
        .prop_map(move |(turns, stream, muts, dmg)| {
            let mut v = base(turns, stream);
            let mut literals = Vec::new();
            for (at, m) in &muts {
                apply(&mut v, *at, m, &mut literals);
            }
            let mut text = v.to_string();
            for (i, l) in literals.iter().enumerate() {
                text = text.replace(&format!("\"@@LITERAL{i}@@\""), l);
            }
            let mut bytes = text.into_bytes();
            match &dmg {
                Damage::None => {}
                Damage::Truncate(f) => bytes.truncate((bytes.len() as f64 * f) as usize),
                Damage::Insert(f, b) => {
                    let at = (bytes.len() as f64 * f) as usize;
                    bytes.splice(at..at, b.iter().copied());
                }
            }
            (bytes, muts, dmg)
        })
}

/// A body: a mutated request of `base`'s format, or arbitrary bytes.
fn body(base: fn(usize, bool) -> Value) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => mutated(base).prop_map(|(b, _, _)| b),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => value().prop_map(|v| v.to_string().into_bytes()),
    ]
}

// The parse paths.

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("authorization", HeaderValue::from_static("Bearer k"));
    h
}

/// An error that says something.
fn clear(error: impl std::fmt::Display) {
    let text = error.to_string();
    assert!(
        text.trim().len() > 4,
        "an error says what went wrong: {text:?}"
    );
}

/// The chat front's parse path: the body, the session key, each message
/// as the engine reads it.
fn chat_path(bytes: &[u8]) {
    let body = match ChatBody::parse(bytes) {
        Ok(body) => body,
        Err(e) => return clear(e),
    };
    let _ = session_key(
        &Identity::of(&headers(), &Rules::default()),
        &headers(),
        &body,
    );
    let _ = session_key(&Identity::Anonymous, &HeaderMap::new(), &body);
    let _ = (body.stream(), body.include_usage(), body.model());
    let _ = tool_names(&body);
    let usage = with_include_usage(body.field("stream_options"));
    assert!(serde_json::from_str::<Value>(&usage).is_ok(), "{usage}");
    for m in body.messages() {
        if let Err(e) = serde_json::from_str::<Message>(m.get()) {
            clear(e);
        }
    }
    let _ = body.write(&[("messages", "[]"), ("stream_options", &usage)]);
}

/// A front's parse path, `cache` being the session's as a proxy keeps it:
/// the body split, why it would pass unmanaged, the session key, the
/// request read through its model and bridge (reusing the cache), and the
/// bridge back (the chat view unchanged, and with messages dropped).
fn front_path(kind: FrontKind, bytes: &[u8], cache: &mut FrontCache) {
    let split = match ChatBody::parse_object(bytes) {
        Ok(split) => split,
        Err(e) => return clear(e),
    };
    let field = |name: &str| serde_json::from_str(split.field(name)?.get()).ok();
    let _ = lib::unmanaged(kind, field);
    let _ = front_session_key(
        &Identity::of(&headers(), &Rules::default()),
        &headers(),
        kind,
        &split,
    );
    let _ = front_session_key(&Identity::Anonymous, &HeaderMap::new(), kind, &split);
    let fields = split.fields();
    let items = lib::split_items(kind, &fields);
    let mut front = match FrontRequest::parse_parts(kind, &fields, items.as_deref(), cache) {
        Ok(front) => front,
        Err(e) => return clear(e),
    };
    let chat = front.chat().to_vec();
    let json = front.chat_json().len();
    assert_eq!(json, chat.len(), "one chat JSON per chat message");
    let whole = std::str::from_utf8(bytes)
        .ok()
        .map(|t| FrontRequest::parse(kind, t));
    if let Some(Ok(whole)) = &whole {
        assert_eq!(
            whole.chat(),
            &chat[..],
            "a cached read gives what a whole read gives"
        );
    }
    if let Err(v) = front.rebuild(&chat) {
        clear(v);
    }
    match front.rebuild_with(&chat, items.as_deref(), chat.len()) {
        Ok(r) => {
            for (_, text) in &r.fields {
                assert!(is_json(text), "{text}");
            }
        }
        Err(v) => clear(v),
    }
    if chat.len() > 2 {
        // As a compaction would: the first message, then the last.
        let shorter = [chat[0].clone(), chat[chat.len() - 1].clone()];
        match front.rebuild(&shorter) {
            Ok(r) => {
                for (_, text) in &r.fields {
                    assert!(is_json(text), "{text}");
                }
            }
            Err(v) => clear(v),
        }
    }
    cache.keep(front);
}

/// Whether `text` is one JSON value. Read without `serde_json`'s default
/// nesting limit (128): a rebuilt field may nest as deep as the client's
/// body did, plus the level a merge of same-role neighbours adds, and that
/// is still valid JSON for the provider.
fn is_json(text: &str) -> bool {
    use serde::Deserialize;
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    Value::deserialize(&mut de).is_ok() && de.end().is_ok()
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn chat_bodies_parse_or_say_why(bytes in body(chat_request)) {
        chat_path(&bytes);
    }

    #[test]
    fn anthropic_bodies_parse_or_say_why(bytes in body(anthropic_request)) {
        thread_local!(static CACHE: std::cell::RefCell<FrontCache> = Default::default());
        CACHE.with(|c| front_path(FrontKind::Anthropic, &bytes, &mut c.borrow_mut()));
    }

    #[test]
    fn responses_bodies_parse_or_say_why(bytes in body(responses_request)) {
        thread_local!(static CACHE: std::cell::RefCell<FrontCache> = Default::default());
        CACHE.with(|c| front_path(FrontKind::Responses, &bytes, &mut c.borrow_mut()));
    }
}

// The proxy itself.

/// Panics anywhere in the process (the proxy catches an engine's and fails
/// open: counted here all the same).
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// A proxy (on a runtime of its own) in front of an upstream that answers
/// every path with a small JSON body.
fn proxy() -> &'static (tokio::runtime::Runtime, SocketAddr) {
    static PROXY: OnceLock<(tokio::runtime::Runtime, SocketAddr)> = OnceLock::new();
    PROXY.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let addr = rt.block_on(async {
            let app = axum::Router::new().fallback(|| async {
                axum::Json(json!({"id": "x", "object": "chat.completion", "choices": [],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}))
            });
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/v1", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            let (addr, _) = start_proxy(
                options(&url).with_engine_tools(true),
                compressor_context(counter(), 4_000),
            )
            .await;
            addr
        });
        (rt, addr)
    })
}

/// Posts `bytes` to `path`; the status.
fn through_proxy(path: &str, bytes: Vec<u8>) -> u16 {
    static SERIAL: Mutex<()> = Mutex::new(());
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (rt, addr) = proxy();
    let before = PANICS.load(Ordering::SeqCst);
    let status = rt.block_on(async {
        let resp = reqwest::Client::new()
            .post(format!("http://{addr}{path}"))
            .header("content-type", "application/json")
            .header("x-ctx-session", "fuzz")
            .body(bytes)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let _ = resp.bytes().await;
        status
    });
    assert_eq!(PANICS.load(Ordering::SeqCst), before, "nothing panicked");
    status
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn the_proxy_serves_any_chat_body(bytes in body(chat_request)) {
        prop_assert!(through_proxy("/v1/chat/completions", bytes) < 500);
    }

    #[test]
    fn the_proxy_serves_any_anthropic_body(bytes in body(anthropic_request)) {
        prop_assert!(through_proxy("/v1/messages", bytes.clone()) < 500);
        prop_assert!(through_proxy("/v1/messages/count_tokens", bytes) < 500);
    }

    #[test]
    fn the_proxy_serves_any_responses_body(bytes in body(responses_request)) {
        prop_assert!(through_proxy("/v1/responses", bytes) < 500);
    }
}
