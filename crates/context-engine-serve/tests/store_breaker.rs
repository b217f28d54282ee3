#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A Postgres that accepts connections and never answers: the first
//! request waits for the store's timeout and goes unmanaged, the breaker
//! opens, and the requests after it go unmanaged at once without calling
//! the store; a probe in the background finds the database back and the
//! session is managed again. The database is reached through a TCP relay
//! the test controls: "hanging" is the relay holding every connection
//! open and passing nothing on.

mod common;
use context_engine_testkit::postgres as pg;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use context_engine::store::{
    Batch, CompactionRecord, Entry, HistoryWrite, SearchHit, SessionStore, Since, StoreError,
};
use context_engine_postgres::{PgOptions, PgStore};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use common::{
    Script, compressor_context, counter, eventually, metric, options, settled, start_proxy,
    start_upstream,
};

/// A relay to `to` on a port of its own; `true` on the returned sender
/// makes it hang (every connection, new or open, held open with nothing
/// passed on), `false` relays again (the held connections are closed).
async fn hanging_relay(to: SocketAddr) -> (u16, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                break;
            };
            let mut rx = rx.clone();
            tokio::spawn(async move {
                if *rx.borrow() {
                    // Accepted, never answered, until the database is back.
                    let _ = rx.wait_for(|hang| !*hang).await;
                    return;
                }
                let Ok(mut out) = TcpStream::connect(to).await else {
                    return;
                };
                let hung = tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => false,
                    _ = rx.wait_for(|hang| *hang) => true,
                };
                if hung {
                    let _ = rx.wait_for(|hang| !*hang).await;
                }
            });
        }
    });
    (port, tx)
}

/// The Postgres store, counting the calls made for a session (the
/// breaker's probe reads the version of no session: not counted).
struct Counting {
    inner: PgStore,
    calls: AtomicUsize,
}

impl Counting {
    fn count(&self, session: &str) {
        if !session.is_empty() {
            self.calls.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl SessionStore for Counting {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn commit(&self, session: &str, batch: &Batch) -> Result<(), StoreError> {
        self.count(session);
        self.inner.commit(session, batch)
    }
    fn load_state(&self, session: &str) -> Result<Option<Value>, StoreError> {
        self.count(session);
        self.inner.load_state(session)
    }
    fn resolve(&self, session: Option<&str>, handle: &str) -> Result<Option<Entry>, StoreError> {
        self.count(session.unwrap_or("*"));
        self.inner.resolve(session, handle)
    }
    fn search(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        self.count(session.unwrap_or("*"));
        self.inner.search(session, query, limit)
    }
    fn compactions(&self, session: &str) -> Result<Vec<CompactionRecord>, StoreError> {
        self.count(session);
        self.inner.compactions(session)
    }
    fn handles(&self, session: &str) -> Result<Vec<String>, StoreError> {
        self.count(session);
        self.inner.handles(session)
    }
    fn delete_session(&self, session: &str) -> Result<(), StoreError> {
        self.count(session);
        self.inner.delete_session(session)
    }
    fn version(&self, session: &str) -> Result<Option<u64>, StoreError> {
        self.count(session);
        self.inner.version(session)
    }
    fn load_versioned(
        &self,
        session: &str,
    ) -> Result<Option<context_engine::store::Versioned>, StoreError> {
        self.count(session);
        self.inner.load_versioned(session)
    }
    fn load_versioned_since(&self, session: &str, known: u64) -> Result<Since, StoreError> {
        self.count(session);
        self.inner.load_versioned_since(session, known)
    }
    fn load_versioned_after(
        &self,
        session: &str,
        known: u64,
        segments: usize,
    ) -> Result<Since, StoreError> {
        self.count(session);
        self.inner.load_versioned_after(session, known, segments)
    }
    fn commit_versioned(
        &self,
        session: &str,
        expected: u64,
        batches: &[Batch],
        state: &Value,
        history: Option<HistoryWrite<'_>>,
    ) -> Result<u64, StoreError> {
        self.count(session);
        self.inner
            .commit_versioned(session, expected, batches, state, history)
    }
    fn try_claim(
        &self,
        session: &str,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.count(session);
        self.inner.try_claim(session, job, owner, ttl)
    }
    fn release(&self, session: &str, job: &str, owner: &str) -> Result<(), StoreError> {
        self.count(session);
        self.inner.release(session, job, owner)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_never_answers_is_skipped_until_a_probe_finds_it_back() {
    let Some(db) = pg::TestDb::create() else {
        return;
    };
    let (port, hang) = hanging_relay("127.0.0.1:5432".parse().unwrap()).await;
    let dbname = db.url.rsplit('/').next().unwrap().to_owned();
    let opts = PgOptions::new(format!("postgres://postgres@127.0.0.1:{port}/{dbname}"))
        .with_timeout(Duration::from_secs(1));
    let store = tokio::task::spawn_blocking(move || PgStore::connect(&opts))
        .await
        .unwrap()
        .unwrap();
    let store = Arc::new(Counting {
        inner: store,
        calls: AtomicUsize::new(0),
    });
    let script = Arc::new(Script::default());
    let upstream = start_upstream(Arc::clone(&script)).await;
    let (proxy, state) = start_proxy(
        options(&upstream).with_store(Some(Arc::clone(&store) as Arc<dyn SessionStore>)),
        compressor_context(counter(), 128_000),
    )
    .await;
    let client = reqwest::Client::new();
    let send = |text: &'static str| {
        let client = client.clone();
        async move {
            let body = serde_json::json!({"model": "m", "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": text}
            ]});
            let t = Instant::now();
            let r = client
                .post(format!("http://{proxy}/v1/chat/completions"))
                .header("x-ctx-session", "breaker")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).unwrap())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "the proxy keeps answering");
            r.bytes().await.unwrap();
            t.elapsed()
        }
    };
    let healthz = || {
        let client = client.clone();
        async move {
            client
                .get(format!("http://{proxy}/healthz"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let fallbacks = || metric(&state.metrics().encode(), "ctx_fallbacks_total");
    let calls = || store.calls.load(Ordering::SeqCst);

    let took = send("first").await;
    eprintln!(
        "managed, store answering: {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    assert_eq!(fallbacks(), 0, "managed while the store answers");
    // The usage is written after the response.
    assert!(settled(&state).await, "the usage is written");

    // The database accepts and never answers: the first request waits for
    // the store's timeout, then goes unmanaged; the breaker opens.
    hang.send(true).unwrap();
    let took = send("first").await;
    eprintln!(
        "store hanging, first request: {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    assert_eq!(fallbacks(), 1, "unmanaged");
    assert!(
        healthz()
            .await
            .starts_with("degraded: session store unavailable")
    );
    // The unmanaged request's session is released before counting.
    assert!(settled(&state).await, "the session is released");
    let before = calls();
    for k in 0..8 {
        let took = send("first").await;
        eprintln!(
            "store hanging, breaker open, request {k}: {:.1} ms",
            took.as_secs_f64() * 1e3
        );
    }
    assert_eq!(fallbacks(), 9, "every request went unmanaged");
    assert_eq!(
        calls(),
        before,
        "with the breaker open, requests do not call the store"
    );

    // The database answers again: a probe closes the breaker (polled
    // through /healthz, which never waits for the store).
    hang.send(false).unwrap();
    let t = Instant::now();
    let health = eventually(Duration::from_secs(60), || async {
        let health = healthz().await;
        (health == "ok\n").then_some(health)
    })
    .await;
    assert_eq!(
        health.as_deref(),
        Some("ok\n"),
        "a probe found the database back"
    );
    eprintln!(
        "breaker closed {:.1} s after the database came back",
        t.elapsed().as_secs_f64()
    );
    let before = calls();
    let took = send("first").await;
    eprintln!("managed again: {:.1} ms", took.as_secs_f64() * 1e3);
    assert_eq!(fallbacks(), 9, "managed again");
    assert!(calls() > before, "the store is used again");
    drop(db);
}
