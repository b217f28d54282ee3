#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The session store driven through `host::Session`: the same lifecycle on
//! every backend, a restart that resumes with the same decisions, a store
//! that cannot write (nothing is lost: the compaction is not applied), and
//! SIGKILL at many points (the store reopens consistent and resumes).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use context_engine::Message;
use context_engine::compressor::Compressor;
use context_engine::engine::Usage;
use context_engine::host::Session;
use context_engine::message::Role;
use context_engine::store::{
    Batch, CompactionRecord, Entry, MemoryStore, SearchHit, SessionStore, StoreError,
    parse_archive_note,
};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::validate::is_tool_reentry;
use context_engine_sqlite::SqliteStore;
use serde_json::{Value, json};

fn example() -> Vec<Message> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/coding-session.json");
    Transcript::load(&path).unwrap().messages
}

fn counter() -> Arc<dyn TokenCounter> {
    Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)))
}

fn session(id: &str, window: u64) -> Session {
    let counter = counter();
    Session::new(
        id,
        Box::new(Compressor::new(Arc::clone(&counter), window)),
        counter,
    )
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ctx-store-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

/// The recorded model calls: index of each assistant message.
fn calls(recording: &[Message]) -> Vec<usize> {
    recording
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Assistant)
        .map(|(i, _)| i)
        .collect()
}

/// Drives `session` over the calls `range` of `recording`, as an agent
/// would (tool results → after_tools, request, response), continuing the
/// caller-owned `history` and `cursor`; returns each request sent.
fn drive(
    session: &mut Session,
    recording: &[Message],
    range: std::ops::Range<usize>,
    history: &mut Vec<Message>,
    cursor: &mut usize,
) -> Vec<Vec<Message>> {
    drive_observed(session, recording, range, history, cursor, &mut || {})
}

/// [`drive`], calling `after_call` once each call is answered.
fn drive_observed(
    session: &mut Session,
    recording: &[Message],
    range: std::ops::Range<usize>,
    history: &mut Vec<Message>,
    cursor: &mut usize,
    after_call: &mut dyn FnMut(),
) -> Vec<Vec<Message>> {
    let counter = counter();
    let mut requests = Vec::new();
    for index in calls(recording)[range].iter().copied() {
        let segment = &recording[*cursor..index];
        let tools = segment
            .iter()
            .position(|m| !(m.is_tool_result() || is_tool_reentry(m)))
            .unwrap_or(segment.len());
        history.extend_from_slice(&segment[..tools]);
        if tools > 0 {
            let update = session.after_tools(history);
            if let Some(new) = update.new_history {
                *history = new;
            }
        }
        history.extend_from_slice(&segment[tools..]);
        let prepared = session.before_request(history);
        for n in &prepared.update.notices {
            assert!(!n.text.contains("session store"), "{}", n.text);
        }
        if let Some(new) = prepared.update.new_history {
            *history = new;
        }
        history.push(recording[index].clone());
        let prompt = counter.count_messages(&prepared.request) as u64;
        session.after_response(&Usage::new(prompt, 50));
        requests.push(prepared.request);
        *cursor = index + 1;
        after_call();
    }
    requests
}

/// The same lifecycle on a backend: compactions archive, the summaries
/// name handles that resolve, the tools answer from the archive.
fn lifecycle(store: Arc<dyn SessionStore>) {
    let recording = example();
    let mut s = session("story", 8_000)
        .with_store(Arc::clone(&store))
        .unwrap();
    let (mut history, mut cursor) = (Vec::new(), 0);
    let n = calls(&recording).len();
    let requests = drive(&mut s, &recording, 0..n, &mut history, &mut cursor);
    let records = store.compactions("story").unwrap();
    assert!(records.len() >= 2, "{} compactions", records.len());
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=records.len() as u64).collect::<Vec<_>>());
    // Every record's span resolves to the messages it archived.
    for r in &records {
        let entry = store.resolve(Some("story"), &r.handle).unwrap().unwrap();
        assert!(!entry.messages.is_empty());
        assert_eq!((entry.start, entry.end), (Some(r.start), Some(r.end)));
    }
    // The last request names the latest span, and that handle resolves.
    let last = requests.last().unwrap();
    let named = last
        .iter()
        .find_map(|m| parse_archive_note(&m.text()))
        .expect("the summary names its span");
    assert_eq!(named.2, records.last().unwrap().handle);
    // The tools, as the agent would call them.
    let tools = s.tools(&[]);
    for name in ["context_recall", "context_search", "context_expand"] {
        assert!(
            tools.iter().any(|t| t["function"]["name"] == name),
            "{name} offered"
        );
    }
    let call = |s: &mut Session, name: &str, args: Value| -> Value {
        let out = s
            .handle_tool_call(name, &args.to_string(), &history)
            .unwrap();
        serde_json::from_str(&out).unwrap()
    };
    let expanded = call(&mut s, "context_expand", json!({"handle": named.2}));
    assert_eq!(expanded["kind"], "span", "{expanded}");
    let first_ask = "Add jitter to the retry backoff";
    let found = call(
        &mut s,
        "context_search",
        json!({"query": "jitter RetryPolicy", "limit": 5}),
    );
    assert!(
        !found["hits"].as_array().unwrap().is_empty(),
        "{found} ({first_ask})"
    );
    let hit = found["hits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["source"] == "archive")
        .and_then(|h| h["handle"].as_str())
        .expect("an archived hit")
        .to_owned();
    let recalled = call(&mut s, "context_recall", json!({"handle": hit}));
    assert!(recalled["content"].is_string(), "{recalled}");
    let bad = call(&mut s, "context_recall", json!({"handle": "s000000000000"}));
    assert!(bad["error"].is_string());
    let bad = s
        .handle_tool_call("context_search", "{not json", &history)
        .unwrap();
    assert!(bad.contains("error"));
}

#[test]
fn lifecycle_on_memory() {
    lifecycle(Arc::new(MemoryStore::new()));
}

#[test]
fn lifecycle_on_sqlite() {
    let path = temp("lifecycle.db");
    lifecycle(Arc::new(SqliteStore::open(&path).unwrap()));
    SqliteStore::open(&path).unwrap().check().unwrap();
}

#[test]
fn a_restarted_host_sends_the_same_requests() {
    let recording = example();
    let n = calls(&recording).len();
    // Uninterrupted.
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let mut s = session("r", 8_000).with_store(store).unwrap();
    let (mut history, mut cursor) = (Vec::new(), 0);
    let whole = drive(&mut s, &recording, 0..n, &mut history, &mut cursor);

    // Half, drop the host (and the store handle), reopen from the file,
    // the rest. The caller keeps its history, as an agent persists it.
    for split in [n / 3, n / 2, 2 * n / 3] {
        let path = temp(&format!("restart-{split}.db"));
        let (mut history, mut cursor) = (Vec::new(), 0);
        let mut first = {
            let store: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&path).unwrap());
            let mut s = session("r", 8_000).with_store(store).unwrap();
            drive(&mut s, &recording, 0..split, &mut history, &mut cursor)
        };
        let store: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&path).unwrap());
        let mut s = session("r", 8_000).with_store(store).unwrap();
        first.extend(drive(
            &mut s,
            &recording,
            split..n,
            &mut history,
            &mut cursor,
        ));
        assert_eq!(first.len(), whole.len());
        for (k, (a, b)) in first.iter().zip(&whole).enumerate() {
            assert!(
                a == b,
                "split {split}: request {k} differs after the restart"
            );
        }
    }
}

/// A store whose writes fail (a full disk, a lost lock).
struct Failing(MemoryStore);

impl SessionStore for Failing {
    fn location(&self) -> String {
        "failing".into()
    }
    fn commit(&self, _: &str, batch: &Batch) -> Result<(), StoreError> {
        if batch.messages().is_empty() {
            return Ok(()); // state saves pass; archiving fails
        }
        Err(StoreError::Backend {
            location: "failing".into(),
            detail: "disk full".into(),
        })
    }
    fn load_state(&self, s: &str) -> Result<Option<Value>, StoreError> {
        self.0.load_state(s)
    }
    fn resolve(&self, s: Option<&str>, h: &str) -> Result<Option<Entry>, StoreError> {
        self.0.resolve(s, h)
    }
    fn search(&self, s: Option<&str>, q: &str, l: usize) -> Result<Vec<SearchHit>, StoreError> {
        self.0.search(s, q, l)
    }
    fn compactions(&self, s: &str) -> Result<Vec<CompactionRecord>, StoreError> {
        self.0.compactions(s)
    }
    fn handles(&self, s: &str) -> Result<Vec<String>, StoreError> {
        self.0.handles(s)
    }
    fn delete_session(&self, s: &str) -> Result<(), StoreError> {
        self.0.delete_session(s)
    }
}

#[test]
fn a_compaction_the_store_cannot_archive_is_not_applied() {
    let recording = example();
    let mut s = session("f", 8_000)
        .with_store(Arc::new(Failing(MemoryStore::new())))
        .unwrap();
    let history: Vec<Message> = recording[..recording.len() / 2].to_vec();
    let update = s.compact_now(&history, None);
    assert!(update.new_history.is_none(), "history unchanged");
    assert!(update.compaction.is_none());
    assert!(
        update
            .notices
            .iter()
            .any(|n| n.text.contains("cannot archive") && n.text.contains("disk full")),
        "{:?}",
        update.notices
    );
    assert_eq!(
        s.engine().state().compression_count,
        0,
        "engine rolled back"
    );
}

#[test]
fn a_store_from_another_engine_or_a_broken_state_is_an_error() {
    let store = Arc::new(MemoryStore::new());
    let mut batch = Batch::new();
    batch.set_state(json!({"engine": "compressor", "engine_state": {"state": 7}, "host": {}}));
    store.commit("x", &batch).unwrap();
    let err = session("x", 8_000).with_store(store).unwrap_err();
    assert!(err.to_string().contains("state of session `x`"), "{err}");
}

// ---- crash safety ----------------------------------------------------

const CHILD_DB: &str = "CTX_STORE_CRASH_DB";

/// Run as a child process by `sigkill_at_many_points_leaves_a_consistent_store`:
/// drives sessions with frequent compactions into the store until killed,
/// printing [`CALLED`] on standard output after each call.
#[test]
#[ignore = "run as a child process by the crash test"]
fn crash_child() {
    let Some(path) = std::env::var_os(CHILD_DB) else {
        return;
    };
    let recording = example();
    let n = calls(&recording).len();
    let store: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(Path::new(&path)).unwrap());
    loop {
        let mut s = session("crash", 6_000)
            .with_store(Arc::clone(&store))
            .unwrap();
        let (mut history, mut cursor) = (Vec::new(), 0);
        drive_observed(
            &mut s,
            &recording,
            0..n,
            &mut history,
            &mut cursor,
            &mut || {
                println!("{CALLED}");
            },
        );
    }
}

/// What the crash child prints after each call.
const CALLED: &str = "ctx-crash-child: called";

/// The store after a kill: sound file, every record and handle resolves,
/// and the saved state agrees with the records (nothing half-recorded).
fn consistent(path: &Path) -> usize {
    let store = SqliteStore::open(path).unwrap();
    store.check().unwrap();
    let records = store.compactions("crash").unwrap();
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=records.len() as u64).collect::<Vec<_>>());
    for h in store.handles("crash").unwrap() {
        let entry = store.resolve(Some("crash"), &h).unwrap().unwrap();
        assert!(!entry.messages.is_empty(), "{h}");
    }
    for r in &records {
        assert!(store.resolve(Some("crash"), &r.handle).unwrap().is_some());
    }
    let saved = store.load_state("crash").unwrap();
    match &saved {
        Some(state) => assert_eq!(
            state["host"]["recorded"].as_u64().unwrap() as usize,
            records.len(),
            "the state and the records commit together"
        ),
        None => assert!(records.is_empty()),
    }
    // And a host resumes from it, with the engine's saved counters.
    let store: Arc<dyn SessionStore> = Arc::new(store);
    let s = session("crash", 6_000).with_store(store).unwrap();
    if let Some(state) = saved {
        assert_eq!(
            s.engine().state().compression_count,
            state["engine_state"]["state"]["compression_count"]
                .as_u64()
                .unwrap()
        );
    }
    records.len()
}

#[test]
fn sigkill_at_many_points_leaves_a_consistent_store() {
    let path = temp("crash.db");
    let mut compactions = 0;
    for round in 0..12u64 {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_child", "--include-ignored", "--nocapture"])
            .env(CHILD_DB, &path)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Spread the kills over startup, replay and compaction: after a
        // different number of calls each round (of a session's 37, the
        // first or the second session), while the next call runs.
        let after = (round * 13) % 40;
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut called = 0;
        for line in std::io::BufRead::lines(stdout) {
            if called >= after {
                break;
            }
            if line.unwrap() == CALLED {
                called += 1;
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let now = consistent(&path);
        assert!(now >= compactions, "records never go away");
        compactions = now;
    }
    assert!(
        compactions > 0,
        "the children made progress across the kills"
    );
}
