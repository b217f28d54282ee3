#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A fleet: two `ctx serve` processes (the real binary) on one Postgres
//! store, a scripted upstream, and a client that replays a real corpus
//! transcript as an agent would (full history each call, a window small
//! enough to compact), alternating between the instances. Mid-session one
//! instance is killed with SIGKILL while a request is in flight; the client
//! retries that request on the other (as a load balancer would) and the
//! session carries on there.
//!
//! Every reply reaches the client unchanged, every upstream request is
//! valid, no request falls back to the unmanaged history, and the store
//! holds exactly the compactions a single instance makes. Needs a
//! PostgreSQL server (see `context_engine_testkit::postgres`): a skip
//! with the reason elsewhere, a failure under `CI=true`.

use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use context_engine::message::{Message, Role};
use context_engine::store::SessionStore;
use context_engine::tokens::TokenCounter;
use context_engine::transcript::Transcript;
use context_engine::validate::{Profile, introduced_violation};
use context_engine_postgres::{PgOptions, PgStore};
use context_engine_testkit::proxy::{compressor_context, options, start_proxy};
use context_engine_testkit::serve::{self, Serve};
use context_engine_testkit::upstream::{
    Reply, Script, completion, long_history, metric, start_upstream,
};
use context_engine_testkit::{counter, postgres as pg};
use tokio::sync::oneshot;

/// The first replayable corpus transcript of at least `min` messages and
/// `tokens` tokens, else (no corpus transcript that long) a generated
/// coding session of that size: the test always replays a session long
/// enough to compact. No corpus at all: [`context_engine_testkit::skip`].
fn transcript(min: usize, tokens: usize, counter: &Arc<dyn TokenCounter>) -> Option<Vec<Message>> {
    for file in context_engine_testkit::corpus_files()? {
        let Ok(t) = Transcript::load(&file) else {
            continue;
        };
        if t.messages.len() >= min
            && counter.count_messages(&t.messages) >= tokens
            && context_engine::replay::check_replayable(&t.messages).is_ok()
        {
            return Some(t.messages);
        }
    }
    eprintln!(
        "no corpus transcript of {min} messages and {tokens} tokens: a generated session instead"
    );
    let mut turns = min / 2;
    loop {
        let generated: Vec<Message> =
            serde_json::from_value(serde_json::Value::Array(long_history(turns))).unwrap();
        if generated.len() >= min && counter.count_messages(&generated) >= tokens {
            assert!(context_engine::replay::check_replayable(&generated).is_ok());
            return Some(generated);
        }
        turns *= 2;
    }
}

/// Starts `ctx serve` on the shared store and waits until it is healthy.
async fn spawn_instance(upstream: &str, store_url: &str, window: u64) -> Serve {
    let serve = serve::Spawn::new(env!("CARGO_BIN_EXE_ctx"))
        .args(["--upstream", upstream, "--store", store_url])
        .args(["--context-length", &window.to_string()])
        .start()
        .await;
    let body = reqwest::get(format!("{}/healthz", serve.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "ok\n", "a fresh instance is healthy");
    serve
}

async fn fallbacks(addr: &str) -> u64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    metric(&text, "ctx_fallbacks_total")
}

/// A call the scripted upstream holds: it says when the call arrived and
/// answers once released (the test kills the instance in between).
struct Hold {
    arrived: Mutex<Option<oneshot::Sender<()>>>,
    release: Mutex<mpsc::Receiver<()>>,
}

/// The reply the scripted upstream gives to call `index` (held by `hold`).
fn reply(
    recording: &[Message],
    index: usize,
    counter: &Arc<dyn TokenCounter>,
    hold: Option<Arc<Hold>>,
) -> Reply {
    let c = Arc::clone(counter);
    let answer = serde_json::to_value(&recording[index]).unwrap();
    Reply::With(Arc::new(move |req: &serde_json::Value| {
        // On the blocking pool (see `Reply::With`): waiting holds no worker.
        if let Some(hold) = &hold {
            if let Some(arrived) = hold.arrived.lock().unwrap().take() {
                let _ = arrived.send(());
            }
            let _ = hold
                .release
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
        }
        let msgs: Vec<Message> = serde_json::from_value(req["messages"].clone()).unwrap();
        completion(answer.clone(), c.count_messages(&msgs) as u64, 50)
    }))
}

fn calls(recording: &[Message]) -> Vec<usize> {
    recording
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Assistant)
        .map(|(i, _)| i)
        .collect()
}

fn body(recording: &[Message], index: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"model": "scripted", "messages": &recording[..index]}))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_sessions_and_survive_a_kill() {
    let counter = counter();
    // Three windows of the smallest window below: the session compacts.
    let Some(recording) = transcript(60, 3 * 8_000, &counter) else {
        return;
    };
    let Some(db) = pg::TestDb::create() else {
        return;
    };
    let window = (counter.count_messages(&recording) as u64 / 3).max(8_000);
    let calls = calls(&recording);

    // The reference: one in-process instance with a store of its own.
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let own: Arc<dyn SessionStore> = Arc::new(context_engine::store::MemoryStore::new());
    let (addr, state) = start_proxy(
        options(&url).with_store(Some(own)),
        compressor_context(Arc::clone(&counter), window),
    )
    .await;
    // After the proxy: it installs the TLS crypto provider reqwest needs.
    let client = reqwest::Client::new();
    for &index in &calls {
        script.push(reply(&recording, index, &counter, None));
        let r = client
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("x-ctx-session", "fleet")
            .header("content-type", "application/json")
            .body(body(&recording, index))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let reference: Vec<_> = script.received().into_iter().map(|r| r.body).collect();
    let single_compactions = metric(&state.metrics().encode(), "ctx_compactions_total");
    assert!(
        single_compactions > 0,
        "the window must make the session compact"
    );

    // The fleet.
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let mut a = Some(spawn_instance(&url, &db.url, window).await);
    let b = spawn_instance(&url, &db.url, window).await;
    let kill_at = calls.len() / 2;
    let mut a_fallbacks = 0;
    let mut retried = None;
    for (k, &index) in calls.iter().enumerate() {
        let on_a = k % 2 == 0 && a.is_some();
        let target = if on_a {
            a.as_ref().unwrap().addr.clone()
        } else {
            b.addr.clone()
        };
        let slow = on_a && k >= kill_at && retried.is_none();
        let (arrived, release) = (oneshot::channel(), mpsc::channel());
        let hold = slow.then(|| {
            Arc::new(Hold {
                arrived: Mutex::new(Some(arrived.0)),
                release: Mutex::new(release.1),
            })
        });
        script.push(reply(&recording, index, &counter, hold));
        let send = {
            let client = client.clone();
            let body = body(&recording, index);
            async move {
                client
                    .post(format!("http://{target}/v1/chat/completions"))
                    .header("x-ctx-session", "fleet")
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
            }
        };
        let resp = if slow {
            // The upstream holds this call; kill instance a while it waits.
            a_fallbacks = fallbacks(&a.as_ref().unwrap().addr).await;
            let pending = tokio::spawn(send);
            tokio::time::timeout(Duration::from_secs(30), arrived.1)
                .await
                .expect("the call reached the upstream")
                .unwrap();
            let mut dead = a.take().unwrap();
            dead.kill(); // SIGKILL
            let _ = release.0.send(());
            assert!(
                pending.await.unwrap().is_err(),
                "the killed instance's request broke off"
            );
            retried = Some(k);
            // The upstream got the killed instance's call; let it finish
            // answering (into the void) so the record stays in order.
            let deadline = Instant::now() + Duration::from_secs(10);
            while script.received().len() < k + 1 {
                assert!(
                    Instant::now() < deadline,
                    "the killed instance never called upstream"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // The client retries on the surviving instance.
            script.push(reply(&recording, index, &counter, None));
            client
                .post(format!("http://{}/v1/chat/completions", b.addr))
                .header("x-ctx-session", "fleet")
                .header("content-type", "application/json")
                .body(body(&recording, index))
                .send()
                .await
                .unwrap()
        } else {
            send.await.unwrap()
        };
        assert_eq!(resp.status(), 200, "call {k}");
        let got = resp.bytes().await.unwrap();
        let received = script.received();
        let last = received.last().unwrap();
        assert_eq!(
            got, last.reply,
            "call {k}: the client gets exactly the upstream's reply"
        );
        let sent: serde_json::Value = serde_json::from_slice(&last.body).unwrap();
        let parsed: Vec<Message> = serde_json::from_value(sent["messages"].clone()).unwrap();
        assert!(
            introduced_violation(&recording[..index], &parsed, Profile::OpenAi).is_none(),
            "call {k}: the upstream request breaks a rule the client's kept"
        );
    }
    let retried = retried.expect("an instance was killed mid-request");
    assert_eq!(
        a_fallbacks, 0,
        "instance a never fell back to the unmanaged history"
    );
    assert_eq!(
        fallbacks(&b.addr).await,
        0,
        "instance b never fell back to the unmanaged history"
    );

    // Before the kill, every request is byte for byte a single instance's;
    // the retried call and the ones after it are too.
    let received = script.received();
    let fleet: Vec<_> = received.iter().map(|r| r.body.clone()).collect();
    assert_eq!(
        fleet.len(),
        reference.len() + 1,
        "one call was sent twice (the retry)"
    );
    let mut same = 0;
    for (k, reference) in reference.iter().enumerate() {
        // The killed attempt is at position `retried`, its retry after it.
        let sent = if k < retried {
            &fleet[k]
        } else {
            &fleet[k + 1]
        };
        if sent == reference {
            same += 1;
        } else {
            assert!(
                k >= retried,
                "call {k} (before the kill) differs from a single instance's"
            );
        }
    }
    eprintln!(
        "fleet: {} calls, {same} byte-identical to a single instance, compactions {single_compactions}",
        reference.len()
    );

    // A compaction happens once: the store holds a single instance's count.
    let url = db.url.clone();
    let records = tokio::task::spawn_blocking(move || {
        PgStore::connect(&PgOptions::new(url))
            .unwrap()
            .compactions("-:fleet")
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        records.len() as u64,
        single_compactions,
        "compactions in the store"
    );
    drop(b);
    drop(db);
}
