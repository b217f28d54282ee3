#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Every corpus transcript replayed through the proxy as a client would
//! (full history on every call) against a scripted upstream, and compared
//! call by call with `context_engine::replay` at the same window: without
//! a store, and with each kind of store (in memory, a SQLite file), the
//! replay archiving into the same kind. `ctx replay` predicts `ctx serve`
//! whichever store the proxy keeps sessions in.

mod common;

use std::sync::Arc;

use context_engine::host::{HostOptions, Session};
use context_engine::message::{Message, Role};
use context_engine::plugin::EngineContext;
use context_engine::pricing::PromptCache;
use context_engine::replay::{ReplayOptions, check_replayable, replay};
use context_engine::store::{MemoryStore, SessionStore, SqliteStore};
use context_engine::tokens::TokenCounter;
use context_engine::transcript::Transcript;
use context_engine::validate::{Profile, introduced_violation};
use serde_json::value::RawValue;

use common::{
    Reply, Script, completion, compressor_context, counter, options, start_proxy, start_upstream,
};

/// A window that makes the transcript compact at least once: a third of
/// its size, but never below 8k.
fn window_for(messages: &[Message], counter: &dyn TokenCounter) -> u64 {
    (counter.count_messages(messages) as u64 / 3).max(8_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_through_the_proxy_matches_the_replay() {
    let Some(files) = common::corpus_files() else {
        return;
    };
    let mut replayed = 0;
    let mut compactions = 0;
    let mut sizes = std::collections::HashMap::new();
    let dir = std::env::temp_dir().join(format!("ctx-corpus-replay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (kind, file) in ["none", "memory", "sqlite"]
        .into_iter()
        .flat_map(|k| files.iter().map(move |f| (k, f.clone())))
    {
        // A fresh store of `kind` each for the replay and the proxy.
        let store = |side: &str| -> Option<Arc<dyn SessionStore>> {
            match kind {
                "memory" => Some(Arc::new(MemoryStore::new())),
                "sqlite" => {
                    let name = format!("{side}-{}.db", file.file_name().unwrap().to_string_lossy());
                    Some(Arc::new(SqliteStore::open(&dir.join(name)).unwrap()))
                }
                _ => None,
            }
        };
        let Ok(transcript) = Transcript::load(&file) else {
            continue;
        };
        let recording = transcript.messages.clone();
        if check_replayable(&recording).is_err() {
            eprintln!("{}: not replayable, skipped", file.display());
            continue;
        }
        let counter = counter();
        let window = window_for(&recording, counter.as_ref());
        let name = file.file_name().unwrap().to_string_lossy().into_owned();

        // The reference: the library's replay at the same window.
        let engine = EngineContext::new(Arc::clone(&counter), window).into_compressor();
        let mut session = Session::new("replay", Box::new(engine), Arc::clone(&counter))
            .with_options(HostOptions::default());
        if let Some(store) = store("replay") {
            session = session.with_store(store).unwrap();
        }
        let report = replay(
            &recording,
            &mut session,
            counter.as_ref(),
            &ReplayOptions::default(),
            |_, _| {},
        )
        .unwrap();

        // The scripted upstream answers each call with the recorded
        // assistant message and the usage the replay fed its engine.
        let script = Arc::new(Script::default());
        let url = start_upstream(Arc::clone(&script)).await;
        let (addr, _state) = start_proxy(
            options(&url).with_store(store("proxy")),
            compressor_context(Arc::clone(&counter), window),
        )
        .await;
        let name = format!("{name} ({kind} store)");
        let client = common::client();
        let calls: Vec<usize> = recording
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::Assistant)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(calls.len(), report.calls.len());
        let mut previous: Vec<Box<RawValue>> = Vec::new();
        let mut previous_parsed: Vec<Message> = Vec::new();
        // The provider's prompt cache, simulated as the replay does.
        let mut cache = PromptCache::new(ReplayOptions::default().price.cache);
        for (k, (&index, record)) in calls.iter().zip(&report.calls).enumerate() {
            let answer = serde_json::to_value(&recording[index]).unwrap();
            let c = Arc::clone(&counter);
            let (recorded, unmanaged, completion_tokens) = (
                record.recorded_prompt_tokens,
                record.tokens_without_engine,
                record.completion_tokens,
            );
            script.push(Reply::With(Arc::new(move |req: &serde_json::Value| {
                let msgs: Vec<Message> = serde_json::from_value(req["messages"].clone()).unwrap();
                let with_engine = c.count_messages(&msgs) as u64;
                let prompt = match recorded {
                    Some(r) if unmanaged > 0 => {
                        (r as f64 * with_engine as f64 / unmanaged as f64).round() as u64
                    }
                    _ => with_engine,
                };
                completion(answer.clone(), prompt, completion_tokens)
            })));
            let body = serde_json::json!({"model": "scripted", "messages": &recording[..index], "temperature": 0});
            let resp = client
                .post(format!("http://{addr}/v1/chat/completions"))
                .header("x-ctx-session", &name)
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).unwrap())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{name} call {k}");
            let got = resp.bytes().await.unwrap();
            let received = script.received();
            let upstream = received.last().unwrap();
            assert_eq!(
                got, upstream.reply,
                "{name} call {k}: the client gets exactly the upstream's reply"
            );

            // Unknown fields untouched, our header not forwarded.
            assert!(upstream.headers.get("x-ctx-session").is_none());
            #[derive(serde::Deserialize)]
            struct Sent<'a> {
                #[serde(borrow)]
                messages: Vec<&'a RawValue>,
                temperature: serde_json::Value,
            }
            let sent: Sent<'_> = serde_json::from_slice(&upstream.body).unwrap();
            assert_eq!(sent.temperature, 0);
            let parsed: Vec<Message> = sent
                .messages
                .iter()
                .map(|m| serde_json::from_str(m.get()).unwrap())
                .collect();
            assert!(
                introduced_violation(&recording[..index], &parsed, Profile::OpenAi).is_none(),
                "{name} call {k}: the upstream request breaks a rule the client's kept"
            );
            // The same request the replay made: same size, same messages.
            assert_eq!(
                counter.count_messages(&parsed) as u64,
                record.tokens_with_engine,
                "{name} call {k}: request tokens differ from the replay's"
            );
            assert_eq!(parsed.len(), record.messages_with_engine, "{name} call {k}");
            // The prefix repeats byte for byte wherever the message did.
            let same_messages = previous_parsed
                .iter()
                .zip(&parsed)
                .take_while(|(a, b)| a == b)
                .count();
            let same_bytes = previous
                .iter()
                .zip(&sent.messages)
                .take_while(|(a, b)| a.get() == b.get())
                .count();
            assert_eq!(
                same_bytes, same_messages,
                "{name} call {k}: an unchanged message was re-serialized"
            );
            // The cache serves the proxy's requests what the replay
            // counted.
            let hit = cache.lookup_and_store(&parsed, &[], record.sent_at, counter.as_ref());
            assert_eq!(
                hit.hit_tokens, record.cache_hit_tokens,
                "{name} call {k}: cacheable prefix differs"
            );
            if record.compaction.is_some() {
                compactions += 1;
            }
            previous = sent
                .messages
                .iter()
                .map(|m| RawValue::from_string(m.get().to_owned()).unwrap())
                .collect();
            previous_parsed = parsed;
        }
        // The proxy compacted exactly where the replay did, no more.
        let status: serde_json::Value = serde_json::from_slice(
            &client
                .get(format!("http://{addr}/ctx/sessions/{name}"))
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap(),
        )
        .unwrap();
        let expected = report
            .calls
            .iter()
            .filter(|c| c.compaction.is_some())
            .count();
        assert_eq!(
            status["stats"]["compactions"], expected,
            "{name}: compactions"
        );
        assert_eq!(
            status["stats"]["fallbacks"], 0,
            "{name}: nothing sent unmanaged"
        );
        sizes.insert(
            (kind, file.clone()),
            report
                .calls
                .iter()
                .map(|c| c.tokens_with_engine)
                .collect::<Vec<_>>(),
        );
        replayed += 1;
    }
    // Whichever kind of store keeps the session, the same requests go out.
    for ((kind, file), calls) in &sizes {
        if *kind == "sqlite" {
            assert_eq!(
                Some(calls),
                sizes.get(&("memory", file.clone())),
                "{}: the SQLite and in-memory stores send different requests",
                file.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("replayed {replayed} transcripts through the proxy, {compactions} compactions");
    assert!(replayed > 0, "no corpus transcript was replayable");
    assert!(
        compactions > 0,
        "the windows chosen should make the corpus compact"
    );
}
