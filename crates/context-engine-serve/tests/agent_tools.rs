#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The agent's own view of its budget and its own compactions, through the
//! proxy on all three APIs: a model that calls `context_status` gets the
//! figures of the request it answered, and one that calls
//! `context_compact` with a focus sees the client's next request compacted
//! with a summary that names the focus. The client never sees either call.

mod common;

use std::sync::Arc;

use context_engine::compressor::SUMMARY_PREFIX;
use context_engine::message::Message;
use context_engine::tokens::TokenCounter;
use serde_json::{Value, json};

use common::{
    Api, Reply, Script, compressor_context, counter, options, start_proxy, start_upstream,
};

const WINDOW: u64 = 64_000;

fn output(i: usize) -> String {
    (0..40)
        .map(|j| format!("line {j} of file {i}: let x{j} = compute({j});\n"))
        .collect()
}

async fn post(addr: std::net::SocketAddr, api: Api, body: &Value, session: &str) -> Value {
    let (status, answer) = api.send(addr, body, session).await;
    assert_eq!(status, 200, "{api:?}");
    serde_json::from_slice(&answer).unwrap()
}

fn bodies(script: &Script) -> Vec<Value> {
    script
        .received()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

async fn status_reports_the_request_the_model_answered(api: Api) {
    let script = Arc::new(Script::default());
    script.push(Reply::Json(api.tool_call_reply(
        "st_1",
        "context_status",
        &json!({}),
    )));
    script.push(Reply::Json(api.text_reply("done", (100, 1))));
    let url = start_upstream(Arc::clone(&script)).await;
    let counter = counter();
    let (addr, _) = start_proxy(
        options(&url),
        compressor_context(Arc::clone(&counter), WINDOW),
    )
    .await;
    let id = format!("status-{api:?}");
    let answer = post(addr, api, &api.session(6, output, true), &id).await;
    assert!(
        !answer.to_string().contains("context_status"),
        "{api:?}: the client never sees the engine's call: {answer}"
    );

    let sent = bodies(&script);
    assert_eq!(sent.len(), 2, "{api:?}: the call resolved in one round");
    let status: Value = serde_json::from_str(
        &Api::tool_answer(&sent[1], "st_1").unwrap_or_else(|| panic!("{api:?}: an answer")),
    )
    .unwrap();
    let tokens = status["request_tokens"].as_u64().expect("request tokens");
    // The proxy's own count of the request it sent, which `ctx replay`
    // reports for the same traffic (tests/replay_predicts_serve.rs).
    let s = api.stats(addr, &id).await;
    assert_eq!(s["last_request_tokens"], tokens, "{api:?}: {s}");
    assert_eq!(status["context_length"], WINDOW);
    assert!(status["threshold_tokens"].as_u64() > Some(tokens));
    assert_eq!(status["compactions"], 0);
    if api == Api::Chat {
        // Counted again from what went upstream: within 1%.
        let messages: Vec<Message> = serde_json::from_value(sent[0]["messages"].clone()).unwrap();
        let recount = counter.count_messages(&messages) as f64;
        let off = (recount - tokens as f64).abs() / recount;
        assert!(off <= 0.01, "{tokens} vs {recount}");
    }
}

async fn an_ask_compacts_the_next_request_with_its_focus(api: Api) {
    let script = Arc::new(Script::default());
    script.push(Reply::Json(api.tool_call_reply(
        "cp_1",
        "context_compact",
        &json!({"focus": "src/file3.rs"}),
    )));
    *script.otherwise.lock().unwrap() = Some(Reply::With(Arc::new(|body: &Value| {
        Api::of(body).text_reply("ok", (500, 1))
    })));
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(options(&url), compressor_context(counter(), WINDOW)).await;
    let id = format!("compact-{api:?}");
    post(addr, api, &api.session(10, output, true), &id).await;
    let sent = bodies(&script);
    let scheduled: Value = serde_json::from_str(
        &Api::tool_answer(&sent[1], "cp_1").unwrap_or_else(|| panic!("{api:?}: an answer")),
    )
    .unwrap();
    assert_eq!(scheduled["scheduled"], true, "{api:?}: {scheduled}");
    assert_eq!(api.stats(addr, &id).await["compactions"], 0);

    // Far under the threshold, the next request is compacted all the same,
    // with the focus in its summary.
    post(addr, api, &api.session(11, output, true), &id).await;
    let next = script.received().last().cloned().unwrap();
    let next = String::from_utf8(next.body.to_vec()).unwrap();
    assert!(next.contains(SUMMARY_PREFIX), "{api:?}: compacted: {next}");
    assert!(
        next.contains("Focus topic: src/file3.rs"),
        "{api:?}: the focus is in the summary: {next}"
    );
    assert!(
        next.contains("Fix the parser bug"),
        "{api:?}: the task stays"
    );
    assert_eq!(api.stats(addr, &id).await["compactions"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_compact_on_chat_completions() {
    status_reports_the_request_the_model_answered(Api::Chat).await;
    an_ask_compacts_the_next_request_with_its_focus(Api::Chat).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_compact_on_messages() {
    status_reports_the_request_the_model_answered(Api::Messages).await;
    an_ask_compacts_the_next_request_with_its_focus(Api::Messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_compact_on_responses() {
    status_reports_the_request_the_model_answered(Api::Responses).await;
    an_ask_compacts_the_next_request_with_its_focus(Api::Responses).await;
}
