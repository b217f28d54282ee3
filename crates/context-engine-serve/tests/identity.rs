#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Isolation by identity: a client reads back only what its own identity
//! archived.
//!
//! Client A (its own provider key, `x-ctx-session: my-run`) has a tool
//! output carrying planted secrets (an AWS key, a GitHub token, an RSA
//! private key, and a marker) compacted away into the session store. Then
//! another client, under the same session id, gets a model reply calling
//! `context_recall` on A's tool-call id, `context_search` for the secret
//! and `context_expand` on A's span handle. What must hold:
//!
//! - another credential: every call answers "not found" (or no hits), and
//!   nothing of A's reaches that client or its upstream requests (memory
//!   store, a SQLite file, and Postgres when a server answers: a skip with
//!   the reason elsewhere, a failure under `CI=true`);
//! - no credential: no engine tool is offered, a model's call to one goes
//!   unresolved, and `/ctx/sessions/{id}` is refused with 403;
//! - users of one shared team token: no engine tools unless the gateway's
//!   identity header names them, and then isolated by its value;
//! - two clients without a session header whose conversations start the
//!   same (the fallback hash): no cross-read.
//!
//! A itself recalls, searches and expands its archive in each setup: the
//! attack works where it should, so its failure elsewhere is the
//! isolation's doing.

mod common;
use context_engine_testkit::postgres as pg;

use std::net::SocketAddr;
use std::sync::Arc;

use context_engine::store::{MemoryStore, SessionStore};
use context_engine_postgres::{PgOptions, PgStore};
use context_engine_serve::StartError;
use context_engine_sqlite::SqliteStore;
use serde_json::{Value, json};

use common::{Reply, Script, completion, compressor_context, counter, options, start_proxy};

/// The window A's history overflows, so that it compacts on its first
/// request.
const WINDOW: u64 = 2_000;

/// The planted secrets: assembled here so that no scanner takes this file
/// for a leak.
fn secrets() -> [String; 4] {
    [
        format!("AKIA{}", "Z7Q3XK2M5N8P4R6T"),
        format!("ghp_{}", "R2d9Kx7LmQ4vTn8Wp3Yz6Bc1Fh5Js0Ga9Eu2"),
        format!(
            "MIIEowIBAAKCAQEA{}",
            "u1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0"
        ),
        "MARKER-A-7731".to_owned(),
    ]
}

/// A's conversation: `turns` tool calls whose outputs fill the window,
/// `call_1`'s carrying the secrets.
fn history_of_a(turns: usize) -> Vec<Value> {
    let [aws, gh, key, marker] = secrets();
    let mut m = common::long_history(turns);
    let leaked = format!(
        "{marker}\n[default]\naws_access_key_id = {aws}\nGITHUB_TOKEN={gh}\n\
         -----BEGIN RSA PRIVATE KEY-----\n{key}\n-----END RSA PRIVATE KEY-----\n"
    );
    let at = m
        .iter()
        .position(|x| x["tool_call_id"] == "call_1")
        .unwrap();
    m[at]["content"] = json!(leaked);
    m.push(json!({"role": "user", "content": "go on"}));
    m
}

fn client_tools() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}])
}

/// The attacker's model: a call of engine tool `name` with `args`, then,
/// once the request carries an answer to it, text.
fn attack(name: &str, args: Value) -> Reply {
    let (name, args) = (name.to_owned(), args.to_string());
    Reply::With(Arc::new(move |request: &Value| {
        let last = request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        if last["role"] == "tool" && last["tool_call_id"] == "atk_1" {
            return completion(json!({"role": "assistant", "content": "done"}), 10, 1);
        }
        let mut r = completion(
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "atk_1", "type": "function", "function": {"name": name, "arguments": args}}]}),
            10,
            2,
        );
        r["choices"][0]["finish_reason"] = json!("tool_calls");
        r
    }))
}

/// A proxy with engine tools and `store` in front of a scripted upstream.
async fn proxy_with(
    store: Option<Arc<dyn SessionStore>>,
    configure: impl FnOnce(context_engine_serve::ServeOptions) -> context_engine_serve::ServeOptions,
) -> (SocketAddr, Arc<Script>) {
    let script = Arc::new(Script::default());
    let url = common::start_upstream(Arc::clone(&script)).await;
    let opts = configure(options(&url).with_engine_tools(true).with_store(store));
    let (addr, _) = start_proxy(opts, compressor_context(counter(), WINDOW)).await;
    (addr, script)
}

/// What one client request came to: the answer it got, the upstream
/// requests it caused, and the engine's answer to the model's call (if
/// the proxy resolved it).
struct Outcome {
    status: u16,
    answer: String,
    upstream: Vec<Value>,
    engine_answer: Option<String>,
}

impl Outcome {
    /// The names of the tools the first upstream request offered.
    fn offered(&self) -> Vec<String> {
        self.upstream[0]["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Everything the client and its upstream requests saw, as text.
    fn seen(&self) -> String {
        let mut all = self.answer.clone();
        for u in &self.upstream {
            all.push_str(&u.to_string());
        }
        all
    }
}

/// Sends `messages` with `headers` while the model answers with `reply`
/// (`None`: plain text).
async fn send(
    addr: SocketAddr,
    script: &Script,
    headers: &[(&str, &str)],
    messages: &[Value],
    reply: Option<Reply>,
) -> Outcome {
    script.replies.lock().unwrap().clear();
    if let Some(r) = reply {
        script.push(r.clone());
        script.push(r);
    }
    let before = script.received().len();
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(json!({"model": "m", "messages": messages, "tools": client_tools()}).to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let answer = resp.text().await.unwrap();
    let upstream: Vec<Value> = script.received()[before..]
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    let engine_answer = upstream.iter().find_map(|u| {
        let last = u["messages"].as_array()?.last()?;
        (last["role"] == "tool" && last["tool_call_id"] == "atk_1")
            .then(|| last["content"].as_str().unwrap_or_default().to_owned())
    });
    Outcome {
        status,
        answer,
        upstream,
        engine_answer,
    }
}

/// `GET /ctx/sessions/{id}` with `headers`: status and body.
async fn status_of(addr: SocketAddr, id: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = reqwest::Client::new().get(format!("http://{addr}/ctx/sessions/{id}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let code = resp.status().as_u16();
    let body = resp.bytes().await.unwrap();
    (code, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// A's span handle, from the compaction summary its request went out with.
fn span_handle(outcome: &Outcome) -> String {
    let text = outcome.upstream[0]["messages"].to_string();
    let at = text
        .find("archived verbatim (handle s")
        .expect("A's request was compacted and names its archive");
    let start = at + "archived verbatim (handle ".len();
    text[start..start + 13].to_owned()
}

/// A compacts its history with the secrets into the archive; returns its
/// span handle. Checks that the request was compacted.
async fn seed(addr: SocketAddr, script: &Script, headers: &[(&str, &str)]) -> String {
    let a = send(addr, script, headers, &history_of_a(20), None).await;
    assert_eq!(a.status, 200, "{}", a.answer);
    assert!(
        !a.upstream[0].to_string().contains(&secrets()[3]),
        "call_1's output was compacted away from A's request"
    );
    span_handle(&a)
}

/// The three reads of A's archive by a client with `headers` (its own
/// short conversation, under the same session id): each answer.
async fn read_as(
    addr: SocketAddr,
    script: &Script,
    headers: &[(&str, &str)],
    messages: &[Value],
    span: &str,
) -> Vec<Outcome> {
    let calls = [
        ("context_recall", json!({"handle": "call_1"})),
        ("context_search", json!({"query": "aws_access_key_id"})),
        ("context_expand", json!({"handle": span})),
    ];
    let mut out = Vec::new();
    for (name, args) in calls {
        out.push(send(addr, script, headers, messages, Some(attack(name, args))).await);
    }
    out
}

/// A's own reads find the secrets (the attack's positive control): the
/// whole output for recall and expand, the line that holds the words for
/// search.
fn assert_reads_back(reads: &[Outcome]) {
    for (r, seen) in reads.iter().zip([3, 0, 3]) {
        let answer = r.engine_answer.as_deref().expect("the call was resolved");
        assert!(
            answer.contains(&secrets()[seen]),
            "A reads its own: {answer}"
        );
    }
}

/// Another identity's reads: each resolved as "not found" (no hits for the
/// search), and nothing of A's anywhere.
fn assert_reads_nothing(reads: &[Outcome]) {
    for (r, name) in reads.iter().zip(["recall", "search", "expand"]) {
        assert_eq!(r.status, 200);
        let answer = r.engine_answer.as_deref().expect("the call was resolved");
        let v: Value = serde_json::from_str(answer).unwrap();
        match name {
            "search" => assert_eq!(v["hits"], json!([]), "{answer}"),
            _ => assert!(
                v["error"].as_str().is_some_and(|e| e.contains("no ")),
                "{name}: {answer}"
            ),
        }
        assert_leaks_nothing(r);
    }
}

fn assert_leaks_nothing(r: &Outcome) {
    let seen = r.seen();
    for s in secrets() {
        assert!(!seen.contains(&s), "{s} reached another client");
    }
}

fn b_conversation() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are B's agent."}),
        json!({"role": "user", "content": "what is in the archive?"}),
    ]
}

/// A and B, each with its own provider key, one session id.
async fn another_credential_reads_nothing(store: Arc<dyn SessionStore>) {
    let (addr, script) = proxy_with(Some(store), |o| o).await;
    let a = [
        ("authorization", "Bearer sk-a"),
        ("x-ctx-session", "my-run"),
    ];
    let span = seed(addr, &script, &a).await;
    let a_reads = read_as(addr, &script, &a, &history_of_a(20), &span).await;
    assert_reads_back(&a_reads);

    let b = [
        ("authorization", "Bearer sk-b"),
        ("x-ctx-session", "my-run"),
    ];
    let b_reads = read_as(addr, &script, &b, &b_conversation(), &span).await;
    assert_reads_nothing(&b_reads);
    // The other front-door credentials are identities too.
    let b_reads = read_as(
        addr,
        &script,
        &[("x-api-key", "sk-ant-b"), ("x-ctx-session", "my-run")],
        &b_conversation(),
        &span,
    )
    .await;
    assert_reads_nothing(&b_reads);
    // A's session status is A's alone.
    assert_eq!(status_of(addr, "my-run", &a).await.0, 200);
    let (code, _) = status_of(addr, "my-run", &[("authorization", "Bearer sk-c")]).await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn another_credential_reads_nothing_memory() {
    another_credential_reads_nothing(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn another_credential_reads_nothing_sqlite() {
    let dir = std::env::temp_dir().join(format!("ctx-identity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.db");
    let _ = std::fs::remove_file(&path);
    another_credential_reads_nothing(Arc::new(SqliteStore::open(&path).unwrap())).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_credential_reads_nothing_postgres() {
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
    another_credential_reads_nothing(Arc::new(store)).await;
    tokio::task::spawn_blocking(move || drop(db)).await.unwrap();
}

/// Without a credential: managed (the history compacts), never offered the
/// archive, status refused.
#[tokio::test]
async fn anonymous_clients_are_managed_but_never_read_an_archive() {
    let (addr, script) = proxy_with(Some(Arc::new(MemoryStore::new())), |o| o).await;
    let anonymous = [("x-ctx-session", "my-run")];
    // A without a credential: still compacted.
    seed(addr, &script, &anonymous).await;
    // B, the probe: only the session header, and a model that calls
    // context_recall on A's tool-call id.
    let b = send(
        addr,
        &script,
        &anonymous,
        &b_conversation(),
        Some(attack("context_recall", json!({"handle": "call_1"}))),
    )
    .await;
    assert_eq!(b.status, 200);
    assert_eq!(b.offered(), ["bash"], "no engine tool offered");
    assert_eq!(b.upstream.len(), 1, "the model's call was not resolved");
    assert!(b.engine_answer.is_none());
    assert_leaks_nothing(&b);
    let (code, body) = status_of(addr, "my-run", &[]).await;
    assert_eq!(code, 403);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("identity")),
        "{body}"
    );
    // The same client with its own key is offered the tools (and reads
    // nothing of the anonymous session's).
    let own = send(
        addr,
        &script,
        &[
            ("authorization", "Bearer sk-b"),
            ("x-ctx-session", "my-run"),
        ],
        &b_conversation(),
        Some(attack("context_recall", json!({"handle": "call_1"}))),
    )
    .await;
    assert!(own.offered().iter().any(|n| n == "context_recall"));
    assert!(own.engine_answer.is_some());
    assert_leaks_nothing(&own);
}

/// Behind one team token: no identity without the gateway's header; with
/// it, users are isolated by its value.
#[tokio::test]
async fn a_team_token_is_no_identity_the_gateway_header_is() {
    let team = [
        ("authorization", "Bearer team-token"),
        ("x-ctx-session", "my-run"),
    ];
    // No identity header configured: the token's users have no identity.
    let (addr, script) = proxy_with(Some(Arc::new(MemoryStore::new())), |o| {
        o.with_auth_token(Some("team-token".into()))
    })
    .await;
    seed(addr, &script, &team).await;
    let b = send(
        addr,
        &script,
        &team,
        &b_conversation(),
        Some(attack("context_recall", json!({"handle": "call_1"}))),
    )
    .await;
    assert_eq!(b.offered(), ["bash"]);
    assert!(b.engine_answer.is_none());
    assert_leaks_nothing(&b);
    assert_eq!(status_of(addr, "my-run", &team).await.0, 403);

    // With `x-user` set by the gateway.
    let (addr, script) = proxy_with(Some(Arc::new(MemoryStore::new())), |o| {
        o.with_auth_token(Some("team-token".into()))
            .with_identity_header(Some("x-user"))
            .unwrap()
    })
    .await;
    let alice = [
        ("authorization", "Bearer team-token"),
        ("x-user", "alice"),
        ("x-ctx-session", "my-run"),
    ];
    let span = seed(addr, &script, &alice).await;
    assert_reads_back(&read_as(addr, &script, &alice, &history_of_a(20), &span).await);
    let bob = [
        ("x-ctx-token", "team-token"),
        ("x-user", "bob"),
        ("x-ctx-session", "my-run"),
    ];
    assert_reads_nothing(&read_as(addr, &script, &bob, &b_conversation(), &span).await);
    assert_eq!(status_of(addr, "my-run", &alice).await.0, 200);
    let carol = [("x-ctx-token", "team-token"), ("x-user", "carol")];
    assert_eq!(status_of(addr, "my-run", &carol).await.0, 404);
    let no_header = send(
        addr,
        &script,
        &team,
        &b_conversation(),
        Some(attack("context_recall", json!({"handle": "call_1"}))),
    )
    .await;
    assert_eq!(no_header.offered(), ["bash"]);
    assert_leaks_nothing(&no_header);

    // The header without the token would let anyone claim anyone.
    let url = "http://127.0.0.1:9/v1";
    let open = options(url).with_identity_header(Some("x-user")).unwrap();
    assert!(matches!(
        context_engine_serve::AppState::new(open, compressor_context(counter(), WINDOW)),
        Err(StartError::IdentityHeaderNeedsToken(_))
    ));
    let as_credential = options(url)
        .with_auth_token(Some("t".into()))
        .with_identity_header(Some("x-api-key"))
        .unwrap();
    assert!(matches!(
        context_engine_serve::AppState::new(as_credential, compressor_context(counter(), WINDOW)),
        Err(StartError::BadIdentityHeader(_))
    ));
}

/// No session header: two conversations that start the same share the
/// fallback id, never the session across identities.
#[tokio::test]
async fn the_fallback_hash_never_joins_two_identities() {
    let (addr, script) = proxy_with(Some(Arc::new(MemoryStore::new())), |o| o).await;
    let a = [("authorization", "Bearer sk-a")];
    let span = seed(addr, &script, &a).await;
    let a_reads = read_as(addr, &script, &a, &history_of_a(20), &span).await;
    assert_reads_back(&a_reads);
    // B starts exactly as A did: same system prompt, tools, first message.
    let start = history_of_a(20)[..2].to_vec();
    let b = [("authorization", "Bearer sk-b")];
    assert_reads_nothing(&read_as(addr, &script, &b, &start, &span).await);
    // Anonymous, the same start: nothing offered.
    let anon = send(
        addr,
        &script,
        &[],
        &start,
        Some(attack("context_recall", json!({"handle": "call_1"}))),
    )
    .await;
    assert_eq!(anon.offered(), ["bash"]);
    assert_leaks_nothing(&anon);
}

/// The access token in every form a client may send it, beside the
/// gateway's identity header: the upstream sees neither, on chat
/// completions, Messages, Responses and a passthrough path (embeddings),
/// and no form of the token is an identity (no engine tool offered without `x-user`).
#[tokio::test]
async fn the_access_token_and_the_identity_header_never_go_upstream() {
    const TOKEN: &str = "team-token-Zq81";
    let (addr, script) = proxy_with(Some(Arc::new(MemoryStore::new())), |o| {
        o.with_auth_token(Some(TOKEN.into()))
            .with_identity_header(Some("x-user"))
            .unwrap()
    })
    .await;
    let bearer = format!("Bearer {TOKEN}");
    let upper = format!("BEARER {TOKEN}");
    let spaced = format!("Bearer  {TOKEN}");
    let scheme = format!("Token {TOKEN}");
    let variants: Vec<Vec<(&str, &str)>> = vec![
        vec![("authorization", &bearer)],
        vec![("x-ctx-token", TOKEN), ("authorization", &bearer)],
        vec![("x-ctx-token", TOKEN), ("x-api-key", TOKEN)],
        vec![("x-ctx-token", TOKEN), ("api-key", TOKEN)],
        vec![("authorization", &upper)],
        vec![("authorization", &spaced)],
        vec![("x-ctx-token", TOKEN), ("authorization", &scheme)],
        vec![
            ("x-ctx-token", TOKEN),
            ("authorization", &upper),
            ("x-api-key", &spaced),
        ],
    ];
    let bodies = [
        ("/v1/embeddings", json!({"model": "m", "input": "hi"})),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": client_tools()}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}),
        ),
        ("/v1/responses", json!({"model": "m", "input": "hi"})),
    ];
    let client = reqwest::Client::new();
    for headers in &variants {
        for with_user in [false, true] {
            for (path, body) in &bodies {
                let before = script.received().len();
                let mut req = client
                    .post(format!("http://{addr}{path}"))
                    .header("content-type", "application/json")
                    .header("x-ctx-session", "tok-run")
                    .body(body.to_string());
                for (k, v) in headers {
                    req = req.header(*k, *v);
                }
                if with_user {
                    req = req.header("x-user", "alice-the-user");
                }
                let status = req.send().await.unwrap().status().as_u16();
                let received = script.received();
                assert_eq!(received.len(), before + 1, "{path} {headers:?}: {status}");
                let sent = &received[before];
                for (name, value) in &sent.headers {
                    let value = String::from_utf8_lossy(value.as_bytes());
                    assert!(
                        !value.contains(TOKEN),
                        "{path} {headers:?}: the token went upstream in {name}"
                    );
                    assert!(
                        !value.contains("alice-the-user"),
                        "{path} {headers:?}: the identity header's value went upstream in {name}"
                    );
                }
                assert!(sent.headers.get("x-user").is_none());
                if *path == "/v1/chat/completions" && !with_user {
                    let up: Value = serde_json::from_slice(&sent.body).unwrap();
                    assert_eq!(
                        up["tools"].as_array().map(Vec::len),
                        Some(1),
                        "{headers:?}: the token made an identity"
                    );
                }
            }
        }
        assert_eq!(
            status_of(addr, "tok-run", headers).await.0,
            403,
            "{headers:?}: the token made an identity"
        );
    }
}

/// An empty credential or a bare scheme is no identity: nothing offered,
/// the session status refused, however many clients send it.
#[tokio::test]
async fn an_empty_credential_is_anonymous() {
    let (addr, script) = proxy_with(Some(Arc::new(MemoryStore::new())), |o| o).await;
    for empty in [
        [("authorization", "Bearer "), ("x-ctx-session", "empty-run")],
        [("authorization", "Bearer"), ("x-ctx-session", "empty-run")],
        [("x-api-key", " "), ("x-ctx-session", "empty-run")],
    ] {
        let r = send(
            addr,
            &script,
            &empty,
            &b_conversation(),
            Some(attack("context_recall", json!({"handle": "call_1"}))),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.answer);
        assert_eq!(r.offered(), ["bash"], "{empty:?}");
        assert!(r.engine_answer.is_none());
        assert_eq!(
            status_of(addr, "empty-run", &empty).await.0,
            403,
            "{empty:?}"
        );
    }
}
