//! Archive search among other identities' archives (`LOAD_ONLY=search`).
//!
//! Two other identities' sessions hold `LOAD_SEARCH_FILL` (18,000)
//! archived results with the word `zebracodename`; a third identity's own
//! session (300 results) holds none. Per store (a SQLite file; Postgres at
//! `$CTX_TEST_POSTGRES` or `postgres://postgres@127.0.0.1:5432/test`, in a
//! database of its own, skipped with the reason when no server answers),
//! interleaved in one run: the third identity searching its own session
//! for the word others have, against a word nobody has. Then, through one
//! proxy on the SQLite store: an unrelated identity's one-message chat
//! calls alone and while twenty clients search (the page's search of
//! their own session, in a loop), interleaved in rounds.

use std::sync::Arc;
use std::time::Instant;

use context_engine::message::Message;
use context_engine::store::{Batch, SessionStore};
use context_engine_postgres::{PgOptions, PgStore};
use context_engine_serve::{AppState, ServeOptions, UiOptions, UpstreamOptions};
use context_engine_sqlite::SqliteStore;
use tokio::net::TcpListener;

use super::pct;

/// The word the other identities' archives hold.
const WORD: &str = "zebracodename";
/// A word no archive holds.
const NOBODY: &str = "quokkaunheardof";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Archives `n` tool results into `session`, `per` to a commit; each
/// holds `word` when given.
fn fill(store: &dyn SessionStore, session: &str, word: Option<&str>, n: usize) {
    let per = 100;
    for start in (0..n).step_by(per) {
        let mut batch = Batch::new();
        for i in start..(start + per).min(n) {
            let text = match word {
                Some(w) => {
                    format!("deploy log {i}: {w} rolled out to host-{i} in 3.2 s\nstatus ok")
                }
                None => format!("pytest run {i}: 12 passed in 0.{i} s\nsrc/parser.py ok"),
            };
            batch.archive(&Message::tool_result(format!("call_{session}_{i}"), text));
        }
        store
            .commit(session, &batch)
            .unwrap_or_else(|e| panic!("fill {session}: {e}"));
    }
}

/// Fills `store` as the module docs say: one other identity's session,
/// the searching identity's own, the second other identity's (the own
/// session's documents between theirs: the index seeks past both sides).
fn fill_store(store: &dyn SessionStore, own: &str) {
    let total = env("LOAD_SEARCH_FILL", 18_000);
    fill(store, "0a1b2c3d4e5f6a7b:their-run", Some(WORD), total / 2);
    fill(store, own, None, 300);
    fill(
        store,
        "u9f8e7d6c5b4a3928:other-run",
        Some(WORD),
        total - total / 2,
    );
}

/// One search's time in ms (and that it found nothing).
fn timed(store: &dyn SessionStore, session: &str, query: &str) -> f64 {
    let t = Instant::now();
    let hits = store
        .search(Some(session), query, 10)
        .unwrap_or_else(|e| panic!("search: {e}"));
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(hits.is_empty(), "{query} found in {session}");
    ms
}

/// The searching identity's own search for the others' word and for
/// nobody's, interleaved.
fn compare(name: &str, store: &dyn SessionStore, own: &str) {
    let rounds = env("LOAD_SEARCH_ROUNDS", 300);
    let (mut theirs, mut nobody) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        timed(store, own, WORD);
        timed(store, own, NOBODY);
    }
    for _ in 0..rounds {
        theirs.push(timed(store, own, WORD));
        nobody.push(timed(store, own, NOBODY));
    }
    theirs.sort_by(f64::total_cmp);
    nobody.sort_by(f64::total_cmp);
    let owners = store
        .search(Some("0a1b2c3d4e5f6a7b:their-run"), WORD, 10)
        .map(|h| h.len())
        .unwrap_or_default();
    println!(
        "  {name}: own session, the others' word p50 {:.3} ms p99 {:.3} ms; a word nobody has p50 {:.3} ms p99 {:.3} ms: {:.2}x at p50 (the owners find theirs: {owners} hits)",
        pct(&theirs, 0.5),
        pct(&theirs, 0.99),
        pct(&nobody, 0.5),
        pct(&nobody, 0.99),
        pct(&theirs, 0.5) / pct(&nobody, 0.5).max(1e-9)
    );
}

/// The SQLite file's query plan for the session's full-text query.
fn sqlite_plan(path: &std::path::Path) {
    let Ok(conn) = rusqlite::Connection::open(path) else {
        return;
    };
    let plan: Vec<String> = conn
        .prepare(
            "EXPLAIN QUERY PLAN SELECT rowid FROM archive_fts WHERE archive_fts MATCH ?1 \
             AND rowid BETWEEN ?2 AND ?3 ORDER BY rowid DESC LIMIT 64",
        )
        .and_then(|mut s| {
            s.query_map(rusqlite::params![WORD, 0, 1], |r| r.get::<_, String>(3))?
                .collect()
        })
        .unwrap_or_default();
    println!("  SQLite plan of the session's query: {}", plan.join(" / "));
}

/// A database of its own on the test server, or why not.
async fn pg_database() -> Result<(String, String, tokio_postgres::Client), String> {
    let admin = std::env::var("CTX_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("no PostgreSQL server at {admin}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let db = format!("ctx_bench_search_{}", std::process::id());
    // One statement each: CREATE DATABASE runs outside a transaction.
    for sql in [
        format!("DROP DATABASE IF EXISTS {db}"),
        format!("CREATE DATABASE {db}"),
    ] {
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| format!("cannot create {db}: {e:?}"))?;
    }
    let url = match admin.rfind('/') {
        Some(at) => format!("{}/{db}", &admin[..at]),
        None => return Err(format!("cannot read the database of {admin}")),
    };
    Ok((url, db, client))
}

/// One one-message chat call of the unrelated identity; ms.
async fn chat(client: &reqwest::Client, base: &str, i: usize) -> f64 {
    let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hello {i}"}}]}}"#);
    let t = Instant::now();
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench-unrelated")
        .header("x-ctx-session", format!("unrelated-{i}"))
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = r.bytes().await;
    t.elapsed().as_secs_f64() * 1e3
}

pub(crate) async fn search_cost(direct: &str) {
    println!(
        "archive search, {} results holding `{WORD}` in two other identities' sessions:",
        env("LOAD_SEARCH_FILL", 18_000)
    );
    let dir = std::env::temp_dir().join(format!("ctx-bench-search-{}", std::process::id()));
    let path = dir.join("store.db");
    // The searching identity: its scope is its credential's (the page's
    // search finds its session by it).
    const OWN_KEY: &str = "Bearer sk-bench-searcher";
    let own_scope = {
        let mut h = axum::http::HeaderMap::new();
        h.insert(
            axum::http::header::AUTHORIZATION,
            axum::http::HeaderValue::from_static(OWN_KEY),
        );
        let rules = context_engine_serve::identity::Rules::default();
        context_engine_serve::identity::Identity::of(&h, &rules).scope()
    };
    let own = format!("{own_scope}:mine");
    {
        let (path, own) = (path.clone(), own.clone());
        tokio::task::spawn_blocking(move || {
            let store = SqliteStore::open(&path).unwrap_or_else(|e| panic!("{e}"));
            fill_store(&store, &own);
            compare("SQLite", &store, &own);
            sqlite_plan(&path);
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
    match pg_database().await {
        Err(why) => println!("  Postgres: skipped: {why}"),
        Ok((url, db, admin)) => {
            let own = own.clone();
            tokio::task::spawn_blocking(move || {
                let store =
                    PgStore::connect(&PgOptions::new(url)).unwrap_or_else(|e| panic!("{e}"));
                fill_store(&store, &own);
                compare("Postgres", &store, &own);
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                .await;
        }
    }

    // Through the proxy on the SQLite store.
    let store = SqliteStore::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let options = ServeOptions::new(UpstreamOptions::new(direct))
        .with_store(Some(Arc::new(store)))
        .with_ui(UiOptions::default());
    let state = AppState::new(options, super::session_context()).unwrap_or_else(|e| panic!("{e}"));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        context_engine_serve::serve(listener, state, std::future::pending()).await
    });
    let base = format!("http://{addr}");
    let client = reqwest::Client::new();
    // The searcher's session, so that the page finds it.
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", OWN_KEY)
        .header("x-ctx-session", "mine")
        .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.status().is_success(), "{}", r.status());
    let search_url = format!("{base}/ui/api/sessions/{own_scope}/mine/search/{WORD}");
    let r = client
        .get(&search_url)
        .header("authorization", OWN_KEY)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.status().is_success(), "page search: {}", r.status());

    // Interleaved: a call alone, then a call sent as twenty searches
    // start at once (the issue's case), and so on.
    let calls = env("LOAD_SEARCH_CHAT_CALLS", 300);
    let (mut alone, mut beside, mut burst) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..20 {
        chat(&client, &base, i).await;
    }
    for i in 0..calls {
        alone.push(chat(&client, &base, 100 + i).await);
        let started = Instant::now();
        let searches: Vec<_> = (0..20)
            .map(|_| {
                let (url, client) = (search_url.clone(), client.clone());
                tokio::spawn(async move {
                    let r = client
                        .get(&url)
                        .header("authorization", OWN_KEY)
                        .send()
                        .await;
                    if let Ok(r) = r {
                        let _ = r.bytes().await;
                    }
                })
            })
            .collect();
        beside.push(chat(&client, &base, 100_000 + i).await);
        for s in searches {
            let _ = s.await;
        }
        burst.push(started.elapsed().as_secs_f64() * 1e3);
    }
    for v in [&mut alone, &mut beside, &mut burst] {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "  an unrelated identity's one-message chat call ({calls} each way, interleaved): alone p50 {:.3} ms p99 {:.3} ms; sent as twenty searches start p50 {:.3} ms p99 {:.3} ms: added p50 {:.3} ms p99 {:.3} ms (the twenty searches and the call done in p50 {:.3} ms)",
        pct(&alone, 0.5),
        pct(&alone, 0.99),
        pct(&beside, 0.5),
        pct(&beside, 0.99),
        pct(&beside, 0.5) - pct(&alone, 0.5),
        pct(&beside, 0.99) - pct(&alone, 0.99),
        pct(&burst, 0.5)
    );
    let _ = std::fs::remove_dir_all(dir);
}
