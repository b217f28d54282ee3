#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Background summaries in `ctx serve`: with a summary model that blocks
//! until the test lets it go, requests crossing the threshold go out
//! without waiting for it (the digest, or the extractive summary once the
//! request would not fit), and a summary that is ready is swapped in.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use context_engine::engine::ContextEngine;
use context_engine::host::HostOptions;
use context_engine::message::Message;
use context_engine::plugin::EngineContext;
use context_engine::summarize::{SummarizeError, Summarizer, SummaryRequest};
use context_engine::tokens::TokenCounter;
use context_engine::validate::{Profile, validate};
use context_engine_serve::SessionContext;
use serde_json::{Value, json};

use common::{
    Reply, Script, completion, counter, long_history, options, start_proxy, start_upstream,
};

/// A summary model that does not answer until the gate opens.
#[derive(Default)]
struct Gated {
    open: Mutex<bool>,
    turn: Condvar,
    entered: AtomicUsize,
    answered: AtomicUsize,
}

impl Gated {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.turn.notify_all();
    }
}

impl Summarizer for Gated {
    fn name(&self) -> &str {
        "gated-model"
    }
    fn summarize(&self, request: &SummaryRequest<'_>) -> Result<String, SummarizeError> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let open = self.open.lock().unwrap();
        // Bounded, so a broken test cannot hang the suite.
        let (_open, _) = self
            .turn
            .wait_timeout_while(open, Duration::from_secs(120), |open| !*open)
            .unwrap();
        self.answered.fetch_add(1, Ordering::SeqCst);
        Ok(format!(
            "SLOW MODEL SUMMARY of {} turns",
            request.turns.len()
        ))
    }
}

const WINDOW: u64 = 8_000;

fn context(gate: &Arc<Gated>, counter: Arc<dyn TokenCounter>) -> SessionContext {
    let (c, g) = (Arc::clone(&counter), Arc::clone(gate));
    let factory =
        move |_id: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
            Ok(Box::new(
                EngineContext::new(Arc::clone(&c), WINDOW)
                    .into_compressor()
                    .with_summarizer(Box::new(Arc::clone(&g))),
            ))
        };
    SessionContext {
        factory: Arc::new(factory),
        counter,
        host: HostOptions::default().with_summary_watermark(Some(0.6)),
        blocking: false,
    }
}

/// The upstream answers with the exact prompt size it received.
fn exact_usage(script: &Script, counter: &Arc<dyn TokenCounter>) {
    let c = Arc::clone(counter);
    script.push(Reply::With(Arc::new(move |req: &Value| {
        let messages: Vec<Message> = serde_json::from_value(req["messages"].clone()).unwrap();
        let tokens = c.count_messages(&messages) as u64;
        completion(json!({"role": "assistant", "content": "ok"}), tokens, 1)
    })));
}

struct Sent {
    messages: Vec<Message>,
    tokens: u64,
}

/// Posts the first `n` messages of `h` in session `id`; what went upstream.
async fn send(
    addr: std::net::SocketAddr,
    script: &Script,
    counter: &Arc<dyn TokenCounter>,
    h: &[Value],
    id: &str,
) -> Sent {
    exact_usage(script, counter);
    let resp = common::client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("x-ctx-session", id)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"model": "m", "messages": h})).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let body = script.last_body();
    let messages: Vec<Message> = serde_json::from_value(body["messages"].clone()).unwrap();
    let tokens = counter.count_messages(&messages) as u64;
    Sent { messages, tokens }
}

async fn stats(addr: std::net::SocketAddr, id: &str) -> Value {
    let r = common::client()
        .get(format!("http://{addr}/ctx/sessions/{id}"))
        .send()
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    v["stats"].clone()
}

fn has_summary(messages: &[Message], text: &str) -> bool {
    messages
        .iter()
        .any(|m| context_engine::compressor::is_summary(m) && m.text().contains(text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_never_wait_for_the_summary_model() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let counter = counter();
    let gate = Arc::new(Gated::default());
    let (addr, _) = start_proxy(options(&url), context(&gate, Arc::clone(&counter))).await;
    let h = long_history(80);
    let threshold = 6_000;
    // Up to the watermark: the job starts and blocks in the summary model.
    let mut n = 4;
    while stats(addr, "a").await["background_started"] != 1 || n == 4 {
        send(addr, &script, &counter, &h[..n], "a").await;
        n += 2;
        assert!(n < h.len(), "the watermark is never reached");
    }
    for _ in 0..100 {
        if gate.entered.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gate.entered.load(Ordering::SeqCst), 1, "the job runs");
    // Past the threshold with the model still blocked: every request is
    // answered (nothing waits for the summary), whole and valid, until one
    // would not fit the window: that one carries the extractive summary.
    let mut over_threshold = 0;
    let extractive = loop {
        let sent = send(addr, &script, &counter, &h[..n], "a").await;
        assert!(validate(&sent.messages, Profile::OpenAi).is_empty());
        assert_eq!(gate.answered.load(Ordering::SeqCst), 0);
        if sent.messages.len() < n {
            break sent;
        }
        assert!(sent.tokens <= WINDOW, "a whole request fits the window");
        if sent.tokens > threshold {
            over_threshold += 1;
        }
        n += 2;
        assert!(n <= h.len(), "the window is never reached");
    };
    assert!(over_threshold > 0, "requests went out past the threshold");
    assert!(!has_summary(&extractive.messages, "SLOW MODEL SUMMARY"));
    assert!(
        extractive
            .messages
            .iter()
            .any(context_engine::compressor::is_summary),
        "the extractive summary"
    );
    assert!(extractive.tokens < threshold);
    let s = stats(addr, "a").await;
    assert_eq!(s["compactions"], 1);
    assert_eq!(s["background_started"], 1, "one job per session at a time");
    // The model answers late; its summary describes a history that has
    // been compacted since, so it is never used.
    gate.open();
    for _ in 0..100 {
        if gate.answered.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = send(addr, &script, &counter, &h[..n + 2], "a").await;
    assert!(!has_summary(&sent.messages, "SLOW MODEL SUMMARY"));
    assert!(validate(&sent.messages, Profile::OpenAi).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_summary_is_swapped_in_at_the_threshold() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let counter = counter();
    let gate = Arc::new(Gated::default());
    gate.open();
    let (addr, _) = start_proxy(options(&url), context(&gate, Arc::clone(&counter))).await;
    let h = long_history(80);
    let mut n = 4;
    let compacted = loop {
        let sent = send(addr, &script, &counter, &h[..n], "b").await;
        if sent.messages.len() < n {
            break sent;
        }
        if stats(addr, "b").await["background_started"] == 1 {
            // Let the job finish before the next request, as a slow
            // client would.
            for _ in 0..100 {
                if gate.answered.load(Ordering::SeqCst) == 1 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        n += 2;
        assert!(n <= h.len(), "never compacted");
    };
    assert_eq!(gate.entered.load(Ordering::SeqCst), 1);
    assert!(has_summary(&compacted.messages, "SLOW MODEL SUMMARY"));
    assert!(validate(&compacted.messages, Profile::OpenAi).is_empty());
    // Everything after the prepared cut went out verbatim: the client's
    // last messages end the request.
    let tail: Vec<Message> = serde_json::from_value(json!(&h[n - 6..n])).unwrap();
    assert!(compacted.messages.ends_with(&tail));
    let s = stats(addr, "b").await;
    assert_eq!(s["compactions"], 1);
    assert_eq!(s["background_summaries"], 1);
}
