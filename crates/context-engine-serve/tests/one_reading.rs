#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One reading of a body: a key twice in the top level, a message or a
//! content block is refused with a 400 naming it, on chat completions,
//! Anthropic Messages and Responses; nothing goes upstream, so no provider
//! answers a request other than the one the proxy (and its page) read.

mod common;

use std::sync::Arc;

use serde_json::Value;

use common::{Script, compressor_context, counter, options, start_proxy};

#[tokio::test]
async fn a_key_twice_is_refused_naming_it_on_every_api() {
    let script = Arc::new(Script::default());
    let url = common::start_upstream(Arc::clone(&script)).await;
    let (addr, _) = start_proxy(options(&url), compressor_context(counter(), 100_000)).await;
    let cases = [
        (
            "/v1/messages",
            r#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"first"}],"messages":[{"role":"user","content":"second"}]}"#,
            "messages",
            "the body",
        ),
        (
            "/v1/messages",
            r#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}"#,
            "text",
            "messages[0].content[0]",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"shown","content":"sent"}]}"#,
            "content",
            "messages[0]",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[],"model":"other","messages":[{"role":"user","content":"x"}]}"#,
            "model",
            "the body",
        ),
        (
            "/v1/responses",
            r#"{"model":"m","input":[{"type":"message","role":"user","role":"system","content":"x"}]}"#,
            "role",
            "input[0]",
        ),
        (
            "/v1/responses",
            r#"{"model":"m","input":"a","input":"b"}"#,
            "input",
            "the body",
        ),
        (
            "/v1/messages/count_tokens",
            r#"{"model":"m","messages":[{"role":"user","content":"a"}],"system":"x","system":"y"}"#,
            "system",
            "the body",
        ),
    ];
    let client = reqwest::Client::new();
    for (path, body, key, at) in cases {
        let before = script.received().len();
        let resp = client
            .post(format!("http://{addr}{path}"))
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-a")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{path} {body}");
        let answer: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("`{key}`")) && message.contains(at),
            "{path}: {message}"
        );
        assert_eq!(answer["error"]["code"], "duplicate_key");
        assert_eq!(script.received().len(), before, "{path}: went upstream");
    }
    // The same requests with each key once still go through.
    let resp = client
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","messages":[{"role":"user","content":"once"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}
