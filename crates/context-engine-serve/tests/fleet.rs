#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Sessions kept in a session store, served by two proxy instances in turn.
//!
//! A real corpus transcript is replayed as a client would (full history
//! each call, a window small enough to compact) first through one proxy
//! with a store of its own (the reference), then alternately through two proxies
//! sharing one store: every upstream request must be byte for byte the
//! reference's, so each move to the other instance carries the managed
//! history (frozen texts included), the engine state and the compactions
//! over exactly. Run on the memory store, a SQLite file and, when a server
//! answers, Postgres (`context-engine-postgres`; a skip with the reason
//! elsewhere, a failure under `CI=true`).

mod common;
use context_engine_testkit::postgres as pg;

use std::sync::Arc;

use context_engine::message::{Message, Role};
use context_engine::store::{
    Batch, CompactionRecord, Entry, HistoryWrite, MemoryStore, SearchHit, SessionStore, Since,
    StoreError, Versioned,
};
use context_engine::tokens::TokenCounter;
use context_engine::transcript::Transcript;
use context_engine::validate::{Profile, introduced_violation};
use context_engine_postgres::{PgOptions, PgStore};
use context_engine_sqlite::SqliteStore;

use common::{
    Reply, Script, completion, compressor_context, counter, metric, options, start_proxy,
    start_upstream,
};

/// The first replayable corpus transcript of at least `min` messages.
fn transcript(min: usize) -> Option<Vec<Message>> {
    let files = common::corpus_files()?;
    for file in files {
        let Ok(t) = Transcript::load(&file) else {
            continue;
        };
        if t.messages.len() >= min && context_engine::replay::check_replayable(&t.messages).is_ok()
        {
            return Some(t.messages);
        }
    }
    // A corpus without such a transcript is a failure, not a skip.
    common::corpus_files().map(|_| panic!("no replayable corpus transcript of {min} messages"))
}

/// Everything the upstream received and the client got, per call.
struct Run {
    requests: Vec<bytes::Bytes>,
    replies: Vec<bytes::Bytes>,
    compactions: u64,
    fallbacks: u64,
    /// The prompt tokens the replies reported, summed.
    reported: u64,
}

/// Replays `recording` through `instances` proxies (taking turns of
/// `turn` calls each), each with `store` when given; streamed when
/// `stream` (usage included, so the client gets the upstream's bytes).
async fn run(
    recording: &[Message],
    window: u64,
    counter: Arc<dyn TokenCounter>,
    store: Option<Arc<dyn SessionStore>>,
    instances: usize,
    turn: usize,
    stream: bool,
) -> Run {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let mut proxies = Vec::new();
    for _ in 0..instances {
        let opts = options(&url).with_store(store.clone());
        proxies.push(start_proxy(opts, compressor_context(Arc::clone(&counter), window)).await);
    }
    let client = reqwest::Client::new();
    let mut replies = Vec::new();
    for (k, index) in recording
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Assistant)
        .map(|(i, _)| i)
        .enumerate()
    {
        let c = Arc::clone(&counter);
        let answer = serde_json::to_value(&recording[index]).unwrap();
        script.push(Reply::With(Arc::new(move |req: &serde_json::Value| {
            let msgs: Vec<Message> = serde_json::from_value(req["messages"].clone()).unwrap();
            completion(answer.clone(), c.count_messages(&msgs) as u64, 50)
        })));
        let mut body = serde_json::json!({"model": "scripted", "messages": &recording[..index]});
        if stream {
            body["stream"] = true.into();
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        let (addr, _) = &proxies[(k / turn.max(1)) % instances];
        let resp = client
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("x-ctx-session", "fleet")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "call {k}");
        replies.push(resp.bytes().await.unwrap());
        let sent = script.received().last().unwrap().body.clone();
        let parsed: Vec<Message> = serde_json::from_value(
            serde_json::from_slice::<serde_json::Value>(&sent).unwrap()["messages"].clone(),
        )
        .unwrap();
        assert!(
            introduced_violation(&recording[..index], &parsed, Profile::OpenAi).is_none(),
            "call {k}: the upstream request breaks a rule the client's kept"
        );
    }
    let (mut compactions, mut fallbacks) = (0, 0);
    for (_, state) in &proxies {
        let text = state.metrics().encode();
        compactions += metric(&text, "ctx_compactions_total");
        fallbacks += metric(&text, "ctx_fallbacks_total");
    }
    let received = script.received();
    assert_eq!(received.len(), replies.len());
    for (r, got) in received.iter().zip(&replies) {
        assert_eq!(
            &r.reply, got,
            "the client gets exactly the upstream's reply"
        );
    }
    let reported = replies.iter().map(|r| prompt_tokens(r)).sum();
    Run {
        requests: received.into_iter().map(|r| r.body).collect(),
        reported,
        replies,
        compactions,
        fallbacks,
    }
}

/// The prompt tokens a reply reports: a completion's, or a stream's
/// usage chunk's.
fn prompt_tokens(reply: &[u8]) -> u64 {
    let text = std::str::from_utf8(reply).unwrap();
    let usage = |v: &serde_json::Value| v["usage"]["prompt_tokens"].as_u64();
    if !text.starts_with("data:") {
        return usage(&serde_json::from_str(text).unwrap()).unwrap();
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .find_map(|d| usage(&serde_json::from_str(d).unwrap()))
        .expect("a usage chunk")
}

async fn check_fleet(store: Arc<dyn SessionStore>) {
    check_fleet_turns(store, 1, false).await;
}

/// A fleet whose instances take turns of `turn` calls replays exactly
/// as one instance does.
async fn check_fleet_turns(store: Arc<dyn SessionStore>, turn: usize, stream: bool) {
    let Some(recording) = transcript(60) else {
        return;
    };
    let counter = counter();
    let window = (counter.count_messages(&recording) as u64 / 3).max(8_000);
    // The reference: one instance with a store of its own (a store adds
    // the archive note to summaries and the recall tools).
    let own: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let reference = run(
        &recording,
        window,
        Arc::clone(&counter),
        Some(own),
        1,
        1,
        stream,
    )
    .await;
    assert!(reference.compactions > 0, "the window must make it compact");
    let fleet = run(
        &recording,
        window,
        counter,
        Some(Arc::clone(&store)),
        2,
        turn,
        stream,
    )
    .await;
    assert_eq!(
        fleet.fallbacks, 0,
        "no request fell back to the unmanaged history"
    );
    assert_eq!(fleet.compactions, reference.compactions, "compactions");
    assert_eq!(fleet.requests.len(), reference.requests.len());
    for (k, (a, b)) in fleet.requests.iter().zip(&reference.requests).enumerate() {
        if a != b {
            let dir = std::env::temp_dir();
            std::fs::write(dir.join("fleet-a.json"), a).unwrap();
            std::fs::write(dir.join("fleet-b.json"), b).unwrap();
        }
        assert!(
            a == b,
            "call {k}: the upstream request differs from a single instance's"
        );
    }
    assert_eq!(fleet.replies.len(), reference.replies.len());
    // Every response's usage reached the session, whichever instance
    // served the next call (the last one is written after its response).
    let stored = settled(&store, "-:fleet").await;
    assert_eq!(
        stored.pointer("/serve/stats/prompt_tokens"),
        Some(&serde_json::json!(fleet.reported)),
        "the usage of every response is in the stored session"
    );
    // Every compaction is archived once, in the store.
    let records = store.compactions("-:fleet").unwrap();
    assert_eq!(records.len() as u64, reference.compactions, "{records:?}");
    for r in &records {
        assert!(store.resolve(Some("-:fleet"), &r.handle).unwrap().is_some());
    }
}

/// The stored state of `sid` once no response's usage is awaited.
async fn settled(store: &Arc<dyn SessionStore>, sid: &str) -> serde_json::Value {
    for _ in 0..500 {
        let s = Arc::clone(store);
        let id = sid.to_owned();
        let record = tokio::task::spawn_blocking(move || s.load_versioned(&id))
            .await
            .unwrap()
            .unwrap()
            .expect("the session is stored");
        if record.state.pointer("/serve/awaiting").is_none() {
            return record.state;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the last response of `{sid}` was never settled in the store");
}

/// A store whose usage writes (a record without history or batches)
/// take `delay` more: the client's next call reaches the other instance
/// before the usage of its last answer is written.
struct SlowUsage {
    inner: MemoryStore,
    delay: std::time::Duration,
}

impl SessionStore for SlowUsage {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn commit(&self, s: &str, b: &Batch) -> Result<(), StoreError> {
        self.inner.commit(s, b)
    }
    fn load_state(&self, s: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.inner.load_state(s)
    }
    fn resolve(&self, s: Option<&str>, h: &str) -> Result<Option<Entry>, StoreError> {
        self.inner.resolve(s, h)
    }
    fn search(&self, s: Option<&str>, q: &str, n: usize) -> Result<Vec<SearchHit>, StoreError> {
        self.inner.search(s, q, n)
    }
    fn compactions(&self, s: &str) -> Result<Vec<CompactionRecord>, StoreError> {
        self.inner.compactions(s)
    }
    fn handles(&self, s: &str) -> Result<Vec<String>, StoreError> {
        self.inner.handles(s)
    }
    fn delete_session(&self, s: &str) -> Result<(), StoreError> {
        self.inner.delete_session(s)
    }
    fn version(&self, s: &str) -> Result<Option<u64>, StoreError> {
        self.inner.version(s)
    }
    fn load_versioned(&self, s: &str) -> Result<Option<Versioned>, StoreError> {
        self.inner.load_versioned(s)
    }
    fn load_versioned_since(&self, s: &str, known: u64) -> Result<Since, StoreError> {
        self.inner.load_versioned_since(s, known)
    }
    fn load_versioned_after(&self, s: &str, known: u64, held: usize) -> Result<Since, StoreError> {
        self.inner.load_versioned_after(s, known, held)
    }
    fn commit_versioned(
        &self,
        s: &str,
        v: u64,
        b: &[Batch],
        st: &serde_json::Value,
        h: Option<HistoryWrite<'_>>,
    ) -> Result<u64, StoreError> {
        if h.is_none() && b.is_empty() {
            std::thread::sleep(self.delay);
        }
        self.inner.commit_versioned(s, v, b, st, h)
    }
    fn try_claim(
        &self,
        s: &str,
        job: &str,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.inner.try_claim(s, job, owner, ttl)
    }
    fn release(&self, s: &str, job: &str, owner: &str) -> Result<(), StoreError> {
        self.inner.release(s, job, owner)
    }
}

/// The usage of an answer is written after the client has it; when the
/// client's next call reaches the other instance first, that instance
/// waits for the write instead of stepping without the usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_waits_for_the_usage_the_other_is_writing() {
    check_fleet(Arc::new(SlowUsage {
        inner: MemoryStore::new(),
        delay: std::time::Duration::from_millis(20),
    }))
    .await;
}

/// The same with streamed calls: the usage arrives at the stream's end
/// and is written after the client's `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_call_waits_for_the_usage_the_other_is_writing() {
    check_fleet_turns(
        Arc::new(SlowUsage {
            inner: MemoryStore::new(),
            delay: std::time::Duration::from_millis(20),
        }),
        1,
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_a_memory_store_act_as_one() {
    check_fleet(Arc::new(MemoryStore::new())).await;
}

/// Turns of three calls: an instance's copy, found current by its last
/// check, skips the check on its next call; back after the other
/// instance's turn, that copy is stale, its step's compare-and-swap
/// fails, and the step runs again on the record the other one wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_taking_turns_of_three_act_as_one() {
    check_fleet_turns(Arc::new(MemoryStore::new()), 3, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_a_sqlite_store_act_as_one() {
    let dir = std::env::temp_dir().join(format!("ctx-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    check_fleet(Arc::new(SqliteStore::open(&dir.join("store.db")).unwrap())).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_postgres_act_as_one() {
    let Some(db) = tokio::task::spawn_blocking(pg::TestDb::create)
        .await
        .unwrap()
    else {
        return;
    };
    let url = db.url.clone();
    let store = tokio::task::spawn_blocking(move || PgStore::connect(&PgOptions::new(url)))
        .await
        .unwrap()
        .unwrap();
    check_fleet(Arc::new(store)).await;
    tokio::task::spawn_blocking(move || drop(db)).await.unwrap();
}
