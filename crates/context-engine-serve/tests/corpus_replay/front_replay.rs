//! The driver of `corpus_replay.rs`: one recorded session replayed by
//! `context_engine::replay` and driven through the proxy by a client of
//! one front (chat completions, Anthropic Messages, Responses), the
//! session kept in one kind of store, and the two compared call by call.
//!
//! A front's client sends the session in its own format: the recording is
//! converted with the wire crate's bridge (`from_chat` of the recording
//! onto an empty request), and the replay replays that session as
//! `ctx replay` reads it (the bridge's `to_chat` of it), so both sides see
//! the same conversation. Each call sends the session's prefix before the
//! call's assistant turn; the scripted upstream answers in the front's
//! format with that turn and the usage the replay fed its engine (the
//! recorded prompt tokens scaled to the request, as the replay scales
//! them). What the upstream received is read back to chat messages with
//! the same bridge and must be the replay's request: same tokens, same
//! number of messages, the same cache hits, a compaction on the same call;
//! every message the proxy did not change goes out as the bytes it sent
//! last time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use context_engine::anthropic;
use context_engine::host::{HostOptions, Session};
use context_engine::message::{Message, Role};
use context_engine::plugin::EngineContext;
use context_engine::pricing::PromptCache;
use context_engine::replay::{ReplayOptions, check_replayable, replay};
use context_engine::responses;
use context_engine::store::{MemoryStore, SessionStore};
use context_engine::tokens::TokenCounter;
use context_engine::transcript::Transcript;
use context_engine::validate::{Profile, introduced_violation};
use context_engine_postgres::{PgOptions, PgStore};
use context_engine_sqlite::SqliteStore;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::common::{
    Reply, Script, completion, compressor_context, counter, options, start_proxy, start_upstream,
};
use crate::pg;

/// The API a client speaks to the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Front {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/messages`.
    Anthropic,
    /// `POST /v1/responses`.
    Responses,
}

/// A session as one front's client sends it.
struct Conversation {
    /// The whole session as chat messages: what `ctx replay` reads from a
    /// session in this format, and what the replay replays.
    chat: Vec<Message>,
    /// One per model call, in order: the body the client sends and the
    /// call's answer in the front's format (the message or output items).
    calls: Vec<(Value, Value)>,
}

impl Front {
    fn path(self) -> &'static str {
        match self {
            Front::Chat => "/v1/chat/completions",
            Front::Anthropic => "/v1/messages",
            Front::Responses => "/v1/responses",
        }
    }

    /// The top-level field holding the conversation.
    fn items_field(self) -> &'static str {
        match self {
            Front::Chat | Front::Anthropic => "messages",
            Front::Responses => "input",
        }
    }

    /// `recording` (chat messages) as this front's client sends it.
    fn conversation(self, recording: &[Message]) -> Conversation {
        let calls_at = |chat: &[Message]| -> Vec<usize> {
            chat.iter()
                .enumerate()
                .filter(|(_, m)| m.role == Role::Assistant)
                .map(|(i, _)| i)
                .collect()
        };
        match self {
            Front::Chat => Conversation {
                chat: recording.to_vec(),
                calls: calls_at(recording)
                    .into_iter()
                    .map(|i| {
                        let body = json!({"model": "scripted", "messages": &recording[..i], "temperature": 0});
                        (body, serde_json::to_value(&recording[i]).unwrap())
                    })
                    .collect(),
            },
            Front::Anthropic => {
                use anthropic::bridge::{Origin, from_chat, to_chat};
                let empty = anthropic::Request::new(Vec::new());
                let full = from_chat(&empty, &to_chat(&empty), recording);
                let bridged = to_chat(&full);
                let calls = calls_at(&bridged.messages)
                    .into_iter()
                    .map(|i| {
                        let Origin::Message { index, .. } = bridged.origins[i] else {
                            panic!("an assistant turn from the system prompt");
                        };
                        let mut body = json!({"model": "scripted", "max_tokens": 1024, "temperature": 0});
                        if let Some(system) = &full.system {
                            body["system"] = serde_json::to_value(system).unwrap();
                        }
                        body["messages"] = serde_json::to_value(&full.messages[..index]).unwrap();
                        (body, full.messages[index].to_value())
                    })
                    .collect();
                Conversation {
                    chat: bridged.messages,
                    calls,
                }
            }
            Front::Responses => {
                use responses::bridge::{Origin, from_chat, to_chat};
                let empty = responses::Request::new(Vec::new());
                let full = from_chat(&empty, &to_chat(&empty), recording);
                let items = full.items();
                let bridged = to_chat(&full);
                let calls = calls_at(&bridged.messages)
                    .into_iter()
                    .map(|i| {
                        let Origin::Items(list) = &bridged.origins[i] else {
                            panic!("an assistant turn from the instructions");
                        };
                        let body = json!({"model": "scripted", "temperature": 0, "input": &items[..list[0]]});
                        let output: Vec<Value> = list
                            .iter()
                            .map(|&k| serde_json::to_value(&items[k]).unwrap())
                            .collect();
                        (body, Value::Array(output))
                    })
                    .collect();
                Conversation {
                    chat: bridged.messages,
                    calls,
                }
            }
        }
    }

    /// The chat messages of a request body of this front (read as the
    /// proxy reads it).
    fn chat_of(self, body: &[u8]) -> Vec<Message> {
        let text = std::str::from_utf8(body).unwrap();
        match self {
            Front::Chat => {
                #[derive(serde::Deserialize)]
                struct Messages {
                    messages: Vec<Message>,
                }
                serde_json::from_str::<Messages>(text).unwrap().messages
            }
            Front::Anthropic => {
                anthropic::bridge::to_chat(&anthropic::Request::parse(text).unwrap()).messages
            }
            Front::Responses => {
                responses::bridge::to_chat(&responses::Request::parse(text).unwrap()).messages
            }
        }
    }

    /// The upstream's answer carrying `answer` (see
    /// [`Conversation::calls`]) and this usage.
    fn reply(self, answer: &Value, prompt: u64, completion_tokens: u64) -> Value {
        match self {
            Front::Chat => completion(answer.clone(), prompt, completion_tokens),
            Front::Anthropic => {
                let content = match &answer["content"] {
                    Value::String(s) => json!([{"type": "text", "text": s}]),
                    Value::Array(blocks) => Value::Array(blocks.clone()),
                    _ => json!([]),
                };
                json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "scripted",
                       "content": content, "stop_reason": "end_turn", "stop_sequence": null,
                       "usage": {"input_tokens": prompt, "output_tokens": completion_tokens}})
            }
            Front::Responses => {
                json!({"id": "resp_1", "object": "response", "status": "completed", "model": "scripted",
                       "output": answer,
                       "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                                 "output_tokens": completion_tokens,
                                 "total_tokens": prompt + completion_tokens}})
            }
        }
    }
}

/// Where a session is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// No store: the session lives in the proxy's memory only.
    None,
    /// `MemoryStore`.
    Memory,
    /// A SQLite file.
    Sqlite,
    /// A throwaway PostgreSQL database (when a server answers).
    Postgres,
}

/// The stores of one test: a directory for SQLite files and, when a
/// server answers, a throwaway PostgreSQL database (missing: a skip with
/// the reason printed, a failure under `CI=true`).
pub struct Stores {
    dir: PathBuf,
    pg: Option<(pg::TestDb, Arc<PgStore>)>,
}

impl Stores {
    pub async fn new(tag: &str) -> Stores {
        let dir = std::env::temp_dir().join(format!("ctx-corpus-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pg = tokio::task::spawn_blocking(|| {
            let db = pg::TestDb::create()?;
            let store = PgStore::connect(&PgOptions::new(db.url.clone())).unwrap();
            Some((db, Arc::new(store)))
        })
        .await
        .unwrap();
        Stores { dir, pg }
    }

    /// The kinds this test can run: Postgres only when a server answered.
    pub fn kinds(&self) -> Vec<StoreKind> {
        let mut kinds = vec![StoreKind::None, StoreKind::Memory, StoreKind::Sqlite];
        if self.pg.is_some() {
            kinds.push(StoreKind::Postgres);
        }
        kinds
    }

    /// A store of `kind` for `name`: a fresh one (memory, SQLite file) or
    /// the test's database, where each session has an id of its own.
    fn open(&self, kind: StoreKind, name: &str) -> Option<Arc<dyn SessionStore>> {
        match kind {
            StoreKind::None => None,
            StoreKind::Memory => Some(Arc::new(MemoryStore::new())),
            StoreKind::Sqlite => {
                let file: String = name
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect();
                let path = self.dir.join(format!("{file}.db"));
                Some(Arc::new(SqliteStore::open(&path).unwrap()))
            }
            StoreKind::Postgres => self
                .pg
                .as_ref()
                .map(|(_, s)| Arc::clone(s) as Arc<dyn SessionStore>),
        }
    }

    /// Drops the database (off the async workers) and the directory.
    pub async fn close(self) {
        let Stores { dir, pg } = self;
        tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A window that makes the transcript compact at least once: a third of
/// its size, but never below 8k.
fn window_for(messages: &[Message], counter: &dyn TokenCounter) -> u64 {
    (counter.count_messages(messages) as u64 / 3).max(8_000)
}

/// What one session through the proxy came to.
pub struct Driven {
    /// The replay's request tokens, per call.
    pub sizes: Vec<u64>,
    /// Compactions (the replay's, the proxy's the same).
    pub compactions: usize,
}

/// Replays `file` and drives it through a proxy serving `front` with a
/// store of `kind`, asserting call by call that the proxy sends the
/// replay's requests; `None` when the transcript cannot be replayed.
pub async fn drive(front: Front, kind: StoreKind, file: &Path, stores: &Stores) -> Option<Driven> {
    let transcript = Transcript::load(file).ok()?;
    if check_replayable(&transcript.messages).is_err() {
        eprintln!("{}: not replayable, skipped", file.display());
        return None;
    }
    let conversation = front.conversation(&transcript.messages);
    let recording = &conversation.chat;
    let counter = counter();
    let window = window_for(recording, counter.as_ref());
    let name = format!(
        "{} ({front:?} front, {kind:?} store)",
        file.file_name().unwrap().to_string_lossy()
    );

    // The reference: the library's replay at the same window, archiving
    // into the same kind of store.
    let engine = EngineContext::new(Arc::clone(&counter), window).into_compressor();
    let replay_id = format!("replay of {name}");
    let mut session = Session::new(&replay_id, Box::new(engine), Arc::clone(&counter))
        .with_options(HostOptions::default());
    if let Some(store) = stores.open(kind, &replay_id) {
        session = session.with_store(store).unwrap();
    }
    let report = replay(
        recording,
        &mut session,
        counter.as_ref(),
        &ReplayOptions::default(),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(conversation.calls.len(), report.calls.len(), "{name}");

    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _state) = start_proxy(
        options(&url).with_store(stores.open(kind, &name)),
        compressor_context(Arc::clone(&counter), window),
    )
    .await;
    let client = crate::common::client();
    let mut previous: Vec<Box<RawValue>> = Vec::new();
    let mut previous_values: Vec<Value> = Vec::new();
    // The provider's prompt cache, simulated as the replay does.
    let mut cache = PromptCache::new(ReplayOptions::default().price.cache);
    let mut compactions = 0;
    for (k, ((body, answer), record)) in conversation.calls.iter().zip(&report.calls).enumerate() {
        let index = record.message_index;
        let c = Arc::clone(&counter);
        let answer = answer.clone();
        let (recorded, unmanaged, completion_tokens) = (
            record.recorded_prompt_tokens,
            record.tokens_without_engine,
            record.completion_tokens,
        );
        script.push(Reply::With(Arc::new(move |req: &Value| {
            let sent = serde_json::to_vec(req).unwrap();
            let with_engine = c.count_messages(&front.chat_of(&sent)) as u64;
            let prompt = match recorded {
                Some(r) if unmanaged > 0 => {
                    (r as f64 * with_engine as f64 / unmanaged as f64).round() as u64
                }
                _ => with_engine,
            };
            front.reply(&answer, prompt, completion_tokens)
        })));
        let resp = client
            .post(format!("http://{addr}{}", front.path()))
            .header("x-ctx-session", &name)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
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
        let sent: HashMap<&str, &RawValue> = serde_json::from_slice(&upstream.body).unwrap();
        assert_eq!(sent["temperature"].get(), "0", "{name} call {k}");
        let items: Vec<&RawValue> = serde_json::from_str(sent[front.items_field()].get()).unwrap();
        let parsed = front.chat_of(&upstream.body);
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
        let values: Vec<Value> = items
            .iter()
            .map(|m| serde_json::from_str(m.get()).unwrap())
            .collect();
        let same_messages = previous_values
            .iter()
            .zip(&values)
            .take_while(|(a, b)| a == b)
            .count();
        let same_bytes = previous
            .iter()
            .zip(&items)
            .take_while(|(a, b)| a.get() == b.get())
            .count();
        assert_eq!(
            same_bytes, same_messages,
            "{name} call {k}: an unchanged message was re-serialized"
        );
        // The cache serves the proxy's requests what the replay counted.
        let hit = cache.lookup_and_store(&parsed, &[], record.sent_at, counter.as_ref());
        assert_eq!(
            hit.hit_tokens, record.cache_hit_tokens,
            "{name} call {k}: cacheable prefix differs"
        );
        // A compaction on this call, as the replay made one.
        compactions += usize::from(record.compaction.is_some());
        let stats = &status(&client, addr, &name).await["stats"];
        assert_eq!(
            stats["compactions"], compactions,
            "{name} call {k}: compactions"
        );
        assert_eq!(stats["fallbacks"], 0, "{name} call {k}: sent unmanaged");
        previous = items
            .iter()
            .map(|m| RawValue::from_string(m.get().to_owned()).unwrap())
            .collect();
        previous_values = values;
    }
    Some(Driven {
        sizes: report.calls.iter().map(|c| c.tokens_with_engine).collect(),
        compactions,
    })
}

async fn status(client: &reqwest::Client, addr: std::net::SocketAddr, id: &str) -> Value {
    let bytes = client
        .get(format!("http://{addr}/ctx/sessions/{id}"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// Drives each of `files` through `front` without a store, and the
/// `stored` longest of them (by tokens; every one when `None`) with each
/// kind of store the machine has; then checks that every kind of store
/// sent the same requests and that the corpus compacted at all.
pub async fn check(front: Front, files: &[PathBuf], stored: Option<usize>) {
    let stores = Stores::new(&format!("{front:?}")).await;
    let mut longest: Vec<(usize, &Path)> = files
        .iter()
        .map(|f| {
            let tokens = Transcript::load(f).map_or(0, |t| counter().count_messages(&t.messages));
            (tokens, f.as_path())
        })
        .collect();
    longest.sort_by_key(|(tokens, _)| std::cmp::Reverse(*tokens));
    longest.truncate(stored.unwrap_or(files.len()));
    let mut sizes: HashMap<(StoreKind, &Path), Vec<u64>> = HashMap::new();
    let mut compactions = 0;
    for kind in stores.kinds() {
        for file in files {
            if kind != StoreKind::None && !longest.iter().any(|(_, f)| f == file) {
                continue;
            }
            let started = std::time::Instant::now();
            if let Some(driven) = drive(front, kind, file, &stores).await {
                eprintln!(
                    "{} ({front:?}, {kind:?}): {} calls, {} compactions, {:.1}s",
                    file.display(),
                    driven.sizes.len(),
                    driven.compactions,
                    started.elapsed().as_secs_f64()
                );
                compactions += driven.compactions;
                sizes.insert((kind, file.as_path()), driven.sizes);
            }
        }
    }
    // Whichever kind of store keeps the session, the same requests go out.
    for (_, file) in &longest {
        let memory = sizes.get(&(StoreKind::Memory, *file));
        for kind in [StoreKind::Sqlite, StoreKind::Postgres] {
            if let Some(calls) = sizes.get(&(kind, *file)) {
                assert_eq!(
                    Some(calls),
                    memory,
                    "{}: the {kind:?} and in-memory stores send different requests",
                    file.display()
                );
            }
        }
    }
    stores.close().await;
    eprintln!(
        "{front:?}: {} sessions through the proxy, {compactions} compactions",
        sizes.len()
    );
    assert!(!sizes.is_empty(), "no corpus transcript was replayable");
    assert!(
        compactions > 0,
        "the windows chosen should make the corpus compact"
    );
}
