#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Idle sessions sleep (`serve.hibernate_seconds`): only the deflated
//! frozen texts of the managed history and the engine's state stay in
//! memory (with a session store, nothing). A session that slept must wake
//! with the same bytes going out and the same engine decisions as one that
//! never slept. A session idle for longer than the prompt cache lives
//! compacts on its next call when it is past half the threshold.

mod common;

use std::sync::Arc;
use std::time::Duration;

use context_engine::engine::Usage;
use context_engine::store::{MemoryStore, SessionStore};
use context_engine_serve::session::{Managed, SessionKey, Sessions};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use common::{
    Reply, Script, completion, compressor_context, counter, long_history, options,
    short_cache_context, start_proxy, start_upstream, wall_clock,
};

fn raws(messages: &[Value]) -> Vec<Box<RawValue>> {
    messages
        .iter()
        .map(|m| RawValue::from_string(serde_json::to_string(m).unwrap()).unwrap())
        .collect()
}

fn usage(prompt: u64) -> Usage {
    Usage::from_openai(&json!({"prompt_tokens": prompt, "completion_tokens": 1})).unwrap()
}

/// The conversation of call `n`: the long history's first `n` messages
/// (each call adds a tool call and its result to the previous one).
fn conversation(history: &[Value], n: usize) -> Vec<Value> {
    history[..n].to_vec()
}

/// A host snapshot without the clock readings (two sessions never start
/// at the same instant).
fn decisions(mut snapshot: Value) -> Value {
    if let Some(schedule) = snapshot.pointer_mut("/engine_state/compressor/schedule") {
        schedule["last_request_unix"] = Value::Null;
    }
    snapshot
}

#[test]
fn a_session_that_sleeps_between_calls_sends_the_same_bytes_and_decides_the_same() {
    let ctx = Arc::new(compressor_context(counter(), 8_000));
    let mut awake = Managed::new(Arc::clone(&ctx), "a").unwrap();
    let mut sleeper = Managed::new(Arc::clone(&ctx), "b").unwrap();
    let history = long_history(60);
    let (mut compactions, mut digested) = (0, 0);
    for n in (3..history.len()).step_by(2) {
        let messages = conversation(&history, n);
        let raw = raws(&messages);
        let refs: Vec<&RawValue> = raw.iter().map(AsRef::as_ref).collect();
        if sleeper.is_asleep() {
            // A count_tokens look while asleep reads the same history.
            assert_eq!(
                sleeper
                    .peek(&refs)
                    .map(|v| serde_json::to_string(&v).unwrap()),
                awake
                    .peek(&refs)
                    .map(|v| serde_json::to_string(&v).unwrap()),
                "peek while asleep, call {n}"
            );
            assert!(sleeper.is_asleep(), "a peek does not wake the session");
        }
        let a = awake.prepare(&refs).unwrap();
        let b = sleeper.prepare(&refs).unwrap();
        assert!(!sleeper.is_asleep(), "a request wakes the session");
        assert_eq!(a.messages_json, b.messages_json, "bytes sent, call {n}");
        assert_eq!(a.reused_bytes, b.reused_bytes, "reused prefix, call {n}");
        assert_eq!(
            a.compaction.is_some(),
            b.compaction.is_some(),
            "compaction, call {n}"
        );
        compactions += usize::from(a.compaction.is_some());
        digested += usize::from(a.request != awake.history());
        let prompt = messages.len() as u64 * 150;
        awake.after_response(&usage(prompt));
        sleeper.after_response(&usage(prompt));
        let managed = sleeper.managed_messages();
        let heap = sleeper.heap_bytes();
        assert!(sleeper.hibernate(), "an idle session sleeps");
        assert!(sleeper.is_asleep() && sleeper.history().is_empty());
        assert_eq!(sleeper.managed_messages(), managed);
        assert!(sleeper.heap_bytes() < heap, "sleeping holds less");
    }
    assert!(compactions > 0, "the small window compacts");
    assert!(digested > 0 || compactions > 0);
    assert_eq!(
        decisions(awake.host().snapshot()),
        decisions(sleeper.host().snapshot())
    );
    assert_eq!(awake.stats.new_lineages, 0);
    assert_eq!(
        sleeper.stats.sleeps,
        (3..history.len()).step_by(2).count() as u64
    );
}

#[test]
fn a_held_session_stays_awake_and_a_sleeping_one_is_left_alone() {
    let sessions = Sessions::new(
        compressor_context(counter(), 128_000),
        100,
        Duration::from_secs(3600),
    );
    let key = SessionKey {
        scope: "-".into(),
        id: "s".into(),
    };
    let slot = sessions.slot(&key);
    let raw = raws(&long_history(5));
    let refs: Vec<&RawValue> = raw.iter().map(AsRef::as_ref).collect();
    {
        let mut guard = slot.state.try_lock().unwrap();
        let mut m = Managed::new(Arc::clone(sessions.context()), "s").unwrap();
        m.prepare(&refs).unwrap();
        *guard = Some(m);
        assert_eq!(
            sessions.hibernate_idle(Duration::ZERO),
            0,
            "a request holds it"
        );
    }
    assert_eq!(
        sessions.hibernate_idle(Duration::from_secs(600)),
        0,
        "not idle long enough"
    );
    assert_eq!(sessions.hibernate_idle(Duration::ZERO), 1);
    assert_eq!(sessions.hibernate_idle(Duration::ZERO), 0, "asleep already");
    let guard = slot.state.try_lock().unwrap();
    assert!(guard.as_ref().unwrap().is_asleep());
}

async fn post(addr: std::net::SocketAddr, messages: &[Value]) {
    post_as(addr, "h", messages).await;
}

async fn post_as(addr: std::net::SocketAddr, session: &str, messages: &[Value]) {
    let resp = common::client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("x-ctx-session", session)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
}

/// The raw `messages` text of the upstream's last request body.
fn sent_messages(script: &Script) -> String {
    let body = script.received().last().unwrap().body.clone();
    let text = std::str::from_utf8(&body).unwrap();
    let start = text.find("\"messages\":").unwrap() + "\"messages\":".len();
    let value: &RawValue = serde_json::Deserializer::from_str(&text[start..])
        .into_iter::<&RawValue>()
        .next()
        .unwrap()
        .unwrap();
    value.get().to_owned()
}

async fn status(addr: std::net::SocketAddr) -> Value {
    let resp = common::client()
        .get(format!("http://{addr}/ctx/sessions/h"))
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

/// Through the proxy, with and without a session store: the request after
/// a sleep sends the managed prefix byte for byte.
async fn check_wakes_byte_for_byte(store: Option<Arc<dyn SessionStore>>) {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let stored = store.is_some();
    let (addr, state) = start_proxy(
        options(&url)
            .with_hibernation(Some(Duration::from_secs(3600)))
            .with_store(store),
        compressor_context(counter(), 8_000),
    )
    .await;
    let history = long_history(40);
    let grow = |req: &Value| req["messages"].as_array().unwrap().len() as u64 * 150;
    let mut compacted = false;
    let mut n = 3;
    // Until a compaction made engine-made messages, and one call more.
    while n < history.len() {
        script.push(Reply::With(Arc::new(move |req: &Value| {
            completion(json!({"role": "assistant", "content": "ok"}), grow(req), 1)
        })));
        post(addr, &conversation(&history, n)).await;
        let sent = script.last_body()["messages"].as_array().unwrap().len();
        if compacted {
            break;
        }
        compacted = sent < n;
        n += 2;
    }
    assert!(compacted, "the small window compacts");
    let before = sent_messages(&script);
    // The session stays locked until its last answer's usage is written,
    // just after the response with a store: the sweep skips it until then.
    let mut slept = 0;
    for _ in 0..200 {
        slept = state.sessions().hibernate_idle(Duration::ZERO);
        if slept > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(slept, 1);
    let s = status(addr).await;
    if stored {
        // The store holds it; this instance keeps nothing.
        assert_eq!(s["in_store"], true, "{s}");
        assert_eq!(s["asleep"], true, "{s}");
    } else {
        assert_eq!(s["asleep"], true, "{s}");
        assert_eq!(s["stats"]["sleeps"], 1);
    }
    // The client goes on: the prefix sent before goes out unchanged.
    let mut next = conversation(&history, n);
    next.push(json!({"role": "assistant", "content": "ok"}));
    next.push(json!({"role": "user", "content": "after the pause"}));
    post(addr, &next).await;
    let after = sent_messages(&script);
    assert!(
        after.starts_with(&before[..before.len() - 1]),
        "frozen prefix byte for byte after the sleep:\n{before}\n{after}"
    );
    let s = status(addr).await;
    assert_eq!(s["asleep"], false, "{s}");
    assert_eq!(s["stats"]["new_lineages"], 0, "{s}");
    assert!(s["stats"]["compactions"].as_u64().unwrap() >= 1, "{s}");
}

#[tokio::test]
async fn a_sleeping_session_wakes_byte_for_byte() {
    check_wakes_byte_for_byte(None).await;
}

#[tokio::test]
async fn a_stored_session_is_dropped_asleep_and_loaded_byte_for_byte() {
    check_wakes_byte_for_byte(Some(Arc::new(MemoryStore::new()))).await;
}

/// Posts `messages` for `session`; returns how many the upstream got.
async fn sent_for(
    addr: std::net::SocketAddr,
    script: &Script,
    session: &str,
    messages: &[Value],
) -> usize {
    // The usage a provider would report: the request's own count.
    script.push(Reply::With(Arc::new(move |req: &Value| {
        let m: Vec<context_engine::Message> =
            serde_json::from_value(req["messages"].clone()).unwrap();
        let prompt = counter().count_messages(&m) as u64;
        completion(json!({"role": "assistant", "content": "ok"}), prompt, 1)
    })));
    post_as(addr, session, messages).await;
    script.last_body()["messages"].as_array().unwrap().len()
}

/// Through the proxy, with a three-second cache on a clock the test moves
/// (a warm session's calls come at one instant): a session that stays idle longer
/// than the prompt cache lives compacts on its next call once past half
/// the threshold (its request goes out uncached anyway); the same calls
/// without the pause do not.
#[tokio::test]
async fn a_session_idle_past_the_cache_lifetime_compacts_on_its_next_call() {
    use context_engine::engine::ContextEngine;
    let window = 8_000;
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let wall = wall_clock();
    let (addr, _state) = start_proxy(options(&url), short_cache_context(window, 3, &wall)).await;
    let history = long_history(40);
    let c = counter();
    let threshold = context_engine::plugin::EngineContext::new(Arc::clone(&c), window)
        .into_compressor()
        .state()
        .threshold_tokens;
    let tokens = |n: usize| {
        let m: Vec<context_engine::Message> =
            serde_json::from_value(Value::Array(conversation(&history, n))).unwrap();
        c.count_messages(&m) as u64
    };
    // The first call past 65% of the threshold, well short of it.
    let k = (3..history.len())
        .step_by(2)
        .find(|&n| tokens(n) * 100 > threshold * 65)
        .unwrap();
    assert!(
        tokens(k) < threshold * 9 / 10,
        "{} of {threshold}",
        tokens(k)
    );
    for session in ["warm", "cold"] {
        for n in (3..k).step_by(2) {
            let sent = sent_for(addr, &script, session, &conversation(&history, n)).await;
            assert_eq!(sent, n, "{session}: nothing compacts before the pause");
        }
        if session == "cold" {
            // The pause: longer than the cache lives.
            wall.advance(Duration::from_millis(3_500));
        }
        let sent = sent_for(addr, &script, session, &conversation(&history, k)).await;
        if session == "cold" {
            assert!(sent < k, "the cold call compacts: {sent} of {k} messages");
        } else {
            assert_eq!(sent, k, "a warm call under the threshold does not");
        }
    }
}
