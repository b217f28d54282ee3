#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `summarizer.kind: upstream`: the background summary is asked of the
//! proxy's own upstream, in the client's API (chat completions, Anthropic
//! Messages, Responses), with the client's credential and model, its input
//! redacted; the compaction carries the model's summary, and the tokens
//! the summary call spent are counted apart (`/metrics`, the session's
//! figures). A failing summary call leaves the extractive summary in its
//! place, and the reason is kept.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use context_engine::compressor::SUMMARY_PREFIX;
use context_engine::engine::ContextEngine;
use context_engine::host::HostOptions;
use context_engine::plugin::EngineContext;
use context_engine::redact::Egress;
use context_engine::summarize::openai::OpenAiConfig;
use context_engine::tokens::TokenCounter;
use context_engine_serve::{SessionContext, UpstreamSummarizer};
use serde_json::{Value, json};

use common::{
    Api, Reply, Script, completion, counter, metric, metrics_text, options, start_proxy,
    start_upstream,
};

const WINDOW: u64 = 8_000;
/// A secret in a tool result: it must never reach the summary call.
const SECRET: &str = "AKIAZ3MK5Q7R2XWPLB4N";
const SUMMARY_USAGE: (u64, u64) = (1_234, 56);
const INSTRUCTION: &str = "You write handoff summaries";

fn context(counter: Arc<dyn TokenCounter>) -> SessionContext {
    let config = OpenAiConfig::default().with_max_retries(0);
    let summarizer = Arc::new(UpstreamSummarizer::new(config, Egress::builtin()).unwrap());
    let c = Arc::clone(&counter);
    let factory =
        move |_id: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
            Ok(Box::new(
                EngineContext::new(Arc::clone(&c), WINDOW)
                    .into_compressor()
                    .with_summarizer(Box::new(Arc::clone(&summarizer))),
            ))
        };
    SessionContext {
        factory: Arc::new(factory),
        counter,
        host: HostOptions::default().with_summary_watermark(Some(0.6)),
        blocking: false,
    }
}

/// A coding session of `turns` tool calls, a secret in the second result.
fn session(api: Api, turns: usize) -> Value {
    let output = |i: usize| -> String {
        let mut body: String = (0..8)
            .map(|j| format!("line {j} of file {i}: let x{j} = compute({j});\n"))
            .collect();
        if i == 1 {
            body.push_str(&format!("aws_access_key_id = {SECRET}\n"));
        }
        body
    };
    api.session(turns, output, false)
}

/// Whether `body` is a summary call, in any API.
fn is_summary_call(body: &Value) -> bool {
    [
        body.pointer("/messages/0/content"),
        body.get("system"),
        body.get("instructions"),
    ]
    .into_iter()
    .flatten()
    .filter_map(Value::as_str)
    .any(|s| s.starts_with(INSTRUCTION))
}

/// The upstream: a summary call gets `summary` (or fails with `status`),
/// an agent call an answer in its API's shape with its prompt's size as
/// usage.
fn answer_everything(script: &Script, counter: Arc<dyn TokenCounter>, fail: Option<u16>) {
    let reply = move |body: &Value| -> (u16, Value) {
        let text = "MODEL SUMMARY: the agent read src/file0.rs onwards looking for the parser bug in src/parse.rs; no fix yet.";
        let (p, c) = SUMMARY_USAGE;
        if is_summary_call(body) {
            if let Some(status) = fail {
                return (status, json!({"error": {"message": "summaries are down"}}));
            }
            let reply = if body.get("system").is_some() {
                json!({"type": "message", "role": "assistant", "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": {"input_tokens": p, "output_tokens": c}})
            } else if body.get("instructions").is_some() {
                json!({"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}], "usage": {"input_tokens": p, "output_tokens": c}})
            } else {
                completion(json!({"role": "assistant", "content": text}), p, c)
            };
            return (200, reply);
        }
        let tokens = counter.count_text(&body.to_string()) as u64 * 9 / 10;
        let reply = Api::of(body).text_reply("ok", (tokens, 1));
        (200, reply)
    };
    *script.otherwise.lock().unwrap() = Some(Reply::WithStatus(Arc::new(reply)));
}

async fn post(addr: std::net::SocketAddr, api: Api, body: &Value, session: &str) -> u16 {
    api.send(addr, body, session).await.0
}

async fn stats(addr: std::net::SocketAddr, api: Api, id: &str) -> Value {
    api.stats(addr, id).await
}

/// Drives a session of `api` past the watermark, waits for the summary
/// call to have been answered, then on past the threshold: the agent
/// requests that went upstream, and the summary calls.
async fn drive(
    addr: std::net::SocketAddr,
    script: &Script,
    api: Api,
    id: &str,
) -> (Vec<String>, Vec<common::Received>) {
    let mut waited = false;
    for turns in (2..60).step_by(2) {
        assert_eq!(post(addr, api, &session(api, turns), id).await, 200);
        if !waited && stats(addr, api, id).await["background_started"] == 1 {
            // The summary call is answered at once: wait until it has
            // been counted (its result goes to the session right after),
            // so the next requests adopt it.
            let deadline = Instant::now() + Duration::from_secs(30);
            while metric(&metrics_text(addr).await, "ctx_summary_calls_total") == 0 {
                assert!(Instant::now() < deadline, "no summary call");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            waited = true;
        }
        if stats(addr, api, id).await["compactions"].as_u64() > Some(0) {
            break;
        }
    }
    let (agent, summaries): (Vec<_>, Vec<_>) = script
        .received()
        .into_iter()
        .partition(|r| !is_summary_call(&serde_json::from_slice(&r.body).unwrap()));
    let agent = agent
        .iter()
        .map(|r| String::from_utf8(r.body.to_vec()).unwrap())
        .collect();
    (agent, summaries)
}

async fn the_summary_is_asked_of_the_upstream_in_the_clients_api(api: Api) {
    let script = Arc::new(Script::default());
    let counter = counter();
    answer_everything(&script, Arc::clone(&counter), None);
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(options(&url), context(Arc::clone(&counter))).await;
    let id = format!("up-{api:?}");
    let (agent, summaries) = drive(addr, &script, api, &id).await;

    // One summary call, in the client's API, with its credential and model.
    assert!(!summaries.is_empty(), "{api:?}: a background summary");
    let call = &summaries[0];
    let body: Value = serde_json::from_slice(&call.body).unwrap();
    let (name, value) = api.credential();
    assert_eq!(
        call.headers[name], value,
        "{api:?}: the client's credential"
    );
    assert_eq!(body["model"], api.model(), "{api:?}: the request's model");
    assert_eq!(body["stream"], false);
    assert_eq!(body["temperature"], 0);
    match api {
        Api::Messages => assert!(
            body["max_tokens"].as_u64().is_some(),
            "Messages needs max_tokens"
        ),
        Api::Responses => assert_eq!(body["store"], false),
        Api::Chat => {}
    }
    let sent = String::from_utf8(call.body.to_vec()).unwrap();
    assert!(
        sent.contains("src/file3.rs"),
        "{api:?}: the span is summarized: {sent}"
    );
    assert!(
        !sent.contains(SECRET),
        "{api:?}: the summary call is redacted"
    );

    // The compaction carries the model's summary, and its state record.
    let compacted = agent
        .iter()
        .find(|b| b.contains(SUMMARY_PREFIX))
        .unwrap_or_else(|| panic!("{api:?}: compacted"));
    assert!(compacted.contains("MODEL SUMMARY"), "{api:?}: {compacted}");
    assert!(
        compacted.contains("Fix the parser bug"),
        "{api:?}: the task stays"
    );

    // What the summary spent is counted apart.
    let s = stats(addr, api, &id).await;
    assert!(s["summary_calls"].as_u64() >= Some(1), "{api:?}: {s}");
    let counted = s["summary_calls"].as_u64().unwrap();
    assert_eq!(s["summary_prompt_tokens"], SUMMARY_USAGE.0 * counted);
    assert_eq!(s["summary_completion_tokens"], SUMMARY_USAGE.1 * counted);
    assert_eq!(s["last_summary_failure"], Value::Null);
    assert_eq!(s["last_summarizer"], "upstream", "{s}");
    assert_eq!(s["last_summary_fallback"], Value::Null, "{s}");
    let text = metrics_text(addr).await;
    let calls = metric(&text, "ctx_summary_calls_total{outcome=\"ok\"}");
    assert!(
        calls >= counted && calls <= summaries.len() as u64,
        "{text}"
    );
    assert_eq!(
        metric(&text, "ctx_summary_prompt_tokens_total"),
        SUMMARY_USAGE.0 * calls
    );
    assert_eq!(
        metric(&text, "ctx_summary_completion_tokens_total"),
        SUMMARY_USAGE.1 * calls
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_summaries_are_asked_of_the_upstream() {
    the_summary_is_asked_of_the_upstream_in_the_clients_api(Api::Chat).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_summaries_are_asked_of_the_upstream() {
    the_summary_is_asked_of_the_upstream_in_the_clients_api(Api::Messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_summaries_are_asked_of_the_upstream() {
    the_summary_is_asked_of_the_upstream_in_the_clients_api(Api::Responses).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_summary_call_leaves_the_extractive_summary_and_says_why() {
    let script = Arc::new(Script::default());
    let counter = counter();
    answer_everything(&script, Arc::clone(&counter), Some(503));
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(options(&url), context(Arc::clone(&counter))).await;
    let (agent, summaries) = drive(addr, &script, Api::Chat, "failing").await;
    assert!(!summaries.is_empty(), "the summary was asked");
    let compacted = agent
        .iter()
        .find(|b| b.contains(SUMMARY_PREFIX))
        .expect("compacted");
    assert!(!compacted.contains("MODEL SUMMARY"));
    assert!(
        compacted.contains("Fix the parser bug"),
        "the extractive summary keeps the task"
    );
    let s = stats(addr, Api::Chat, "failing").await;
    let why = s["last_summary_failure"].as_str().unwrap_or_default();
    assert!(why.contains("HTTP 503"), "{s}");
    let fallback = s["last_summary_fallback"].as_str().unwrap_or_default();
    assert!(
        fallback.contains("HTTP 503"),
        "the compaction says why: {s}"
    );
    let text = metrics_text(addr).await;
    assert!(
        metric(&text, "ctx_summary_calls_total{outcome=\"failed\"}") >= 1,
        "{text}"
    );
}
