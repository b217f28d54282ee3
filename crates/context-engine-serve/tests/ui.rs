#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The page's rules without a browser (ctx `tests/browser_ui.rs` drives it
//! in one): loopback only unless `remote`, the site rule, 404 when off, no
//! session list without an identity, no call kept when the page is off, and
//! a call's request shown message by message to its own identity only.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use context_engine_serve::accept::LocalAddr;
use context_engine_serve::{AppState, UiOptions, app};
use serde_json::json;
use tower::ServiceExt;

use common::{Script, client, compressor_context, counter, options, start_proxy, start_upstream};

async fn get(state: &AppState, path: &str, local: &str, host: &str) -> StatusCode {
    let mut req = Request::get(path)
        .header(header::HOST, host)
        .header(header::AUTHORIZATION, "Bearer sk-test")
        .body(Body::empty())
        .unwrap();
    req.extensions_mut()
        .insert(LocalAddr(local.parse::<SocketAddr>().unwrap()));
    app(state.clone()).oneshot(req).await.unwrap().status()
}

fn state(ui: UiOptions) -> AppState {
    let o = options("http://127.0.0.1:9/v1")
        .with_listen("127.0.0.1:8787".parse().unwrap())
        .with_ui(ui);
    AppState::new(o, compressor_context(counter(), 8000)).unwrap()
}

#[tokio::test]
async fn the_page_answers_on_loopback_to_its_own_host_and_not_when_off() {
    let on = state(UiOptions::default());
    assert_eq!(
        get(&on, "/ui", "127.0.0.1:8787", "127.0.0.1:8787").await,
        StatusCode::OK
    );
    assert_eq!(
        get(&on, "/ui/api/sessions", "127.0.0.1:8787", "127.0.0.1:8787").await,
        StatusCode::OK
    );
    // A connection that arrived on another address: refused unless remote.
    assert_eq!(
        get(&on, "/ui", "10.1.2.3:8787", "10.1.2.3:8787").await,
        StatusCode::FORBIDDEN
    );
    let remote = state(UiOptions::default().with_remote(true));
    assert_eq!(
        get(&remote, "/ui", "10.1.2.3:8787", "10.1.2.3:8787").await,
        StatusCode::OK
    );
    // A name the proxy does not answer to (DNS rebinding).
    assert_eq!(
        get(&on, "/ui/api/overview", "127.0.0.1:8787", "evil.example").await,
        StatusCode::FORBIDDEN
    );
    let off = state(UiOptions::off());
    for path in ["/ui", "/ui/api/overview", "/ui/api/sessions"] {
        assert_eq!(
            get(&off, path, "127.0.0.1:8787", "127.0.0.1:8787").await,
            StatusCode::NOT_FOUND
        );
    }
}

#[tokio::test]
async fn the_page_sets_its_policy_and_lists_nothing_without_an_identity() {
    let on = state(UiOptions::default());
    let mut req = Request::get("/ui").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(LocalAddr("127.0.0.1:8787".parse().unwrap()));
    let resp = app(on.clone()).oneshot(req).await.unwrap();
    let csp = resp.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    // Scripts by hash only: no inline-script allowance.
    let script_src = csp
        .split(';')
        .find(|d| d.trim().starts_with("script-src"))
        .unwrap();
    assert!(
        script_src.contains("'sha256-") && !script_src.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-store");
    let mut req = Request::get("/ui/api/sessions")
        .body(Body::empty())
        .unwrap();
    req.extensions_mut()
        .insert(LocalAddr("127.0.0.1:8787".parse().unwrap()));
    let resp = app(on).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

async fn calls_kept(ui: UiOptions) -> u64 {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, state) = start_proxy(
        options(&url).with_ui(ui),
        compressor_context(counter(), 8000),
    )
    .await;
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
    ]});
    let resp = client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-ctx-session", "s1")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    state
        .sessions()
        .list()
        .iter()
        .map(|(_, slot)| slot.calls.lock().unwrap().total())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_kept_for_the_page_only_when_it_is_on() {
    assert_eq!(calls_kept(UiOptions::default()).await, 1);
    assert_eq!(calls_kept(UiOptions::off()).await, 0);
}

/// A coding session whose old tool results the digest shortens, a secret
/// in one of them.
fn coding_session(steps: usize) -> Vec<serde_json::Value> {
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "fix the failing parser test"}),
    ];
    for i in 0..steps {
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{i}"), "type": "function",
            "function": {"name": "bash", "arguments": format!("{{\"command\":\"cat src/part{i}.py\"}}")}}]}));
        let mut out: String = (0..120)
            .map(|j| format!("{j:>4}  value_{i}_{j} = compute({j})  # a line of the file\n"))
            .collect();
        if i == 0 {
            out.push_str("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n");
        }
        m.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": out}));
    }
    m.push(json!({"role": "user", "content": "now run the tests"}));
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_request_shows_each_message_kept_or_changed_redacted_to_its_identity_only() {
    let script = Arc::new(Script::default());
    let url = start_upstream(Arc::clone(&script)).await;
    let (addr, _state) = start_proxy(
        options(&url).with_ui(UiOptions::default()),
        compressor_context(counter(), 128_000),
    )
    .await;
    let sent = coding_session(6);
    let resp = client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-ctx-session", "view")
        .body(json!({"model": "m", "messages": sent}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let base = format!("http://{addr}");
    let get_json = |path: String| async move {
        let r = client().get(path).send().await.unwrap();
        serde_json::from_slice::<serde_json::Value>(&r.bytes().await.unwrap()).unwrap()
    };
    let listed = get_json(format!("{base}/ui/api/sessions")).await;
    let scope = listed["sessions"][0]["scope"].as_str().unwrap().to_owned();
    let session = get_json(format!("{base}/ui/api/sessions/{scope}/view")).await;
    assert_eq!(session["requests"], json!([1]));

    let path = format!("{base}/ui/api/sessions/{scope}/view/calls/1");
    let view = get_json(path.clone()).await;
    let client_side = view["client"].as_array().unwrap();
    let upstream = view["upstream"].as_array().unwrap();
    assert_eq!(view["format"], "chat");
    assert_eq!(client_side.len(), sent.len());
    // What went upstream is what the upstream received.
    let received: serde_json::Value =
        serde_json::from_slice(&script.received.lock().unwrap()[0].body).unwrap();
    assert_eq!(
        upstream.len(),
        received["messages"].as_array().unwrap().len()
    );
    // The old results were digested in place; the task and the last ask kept.
    let fate = |i: usize| client_side[i]["fate"].as_str().unwrap().to_owned();
    assert_eq!(fate(1), "kept");
    assert_eq!(fate(sent.len() - 1), "kept");
    assert_eq!(fate(3), "changed", "{:#}", client_side[3]);
    assert_eq!(upstream[3]["kind"], "changed");
    assert_eq!(upstream[3]["client"], 3);
    assert!(
        upstream[3]["tokens"].as_u64().unwrap() < client_side[3]["tokens"].as_u64().unwrap(),
        "a digested result is smaller"
    );
    // Texts are redacted, whatever was sent.
    let text = view.to_string();
    assert!(
        !text.contains("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        "the secret is shown"
    );

    // Another identity does not see it; a call not kept says why.
    let other = reqwest::Client::new()
        .get(&path)
        .header("authorization", "Bearer sk-other")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    let missing = client()
        .get(format!("{base}/ui/api/sessions/{scope}/view/calls/7"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let why = missing.text().await.unwrap();
    assert!(why.contains("serve.ui.request_bytes"), "{why}");
}

/// The overview names the store's location (a file path; for Postgres a
/// host) to the operator only: not to an identity, not to nobody.
#[tokio::test]
async fn the_overview_names_the_store_location_to_the_operator_only() {
    let dir = std::env::temp_dir().join(format!("ctx-ui-location-{}", std::process::id()));
    let path = dir.join("secret-place.db");
    let store = context_engine_sqlite::SqliteStore::open(&path).unwrap();
    let o = options("http://127.0.0.1:9/v1")
        .with_listen("127.0.0.1:8787".parse().unwrap())
        .with_store(Some(Arc::new(store)))
        .with_ui(UiOptions::default().with_operator_token(Some("op-token".into())));
    let state = AppState::new(o, compressor_context(counter(), 8000)).unwrap();
    let overview = |headers: Vec<(&'static str, &'static str)>| {
        let state = state.clone();
        async move {
            let mut req = Request::get("/ui/api/overview").header(header::HOST, "127.0.0.1:8787");
            for (k, v) in headers {
                req = req.header(k, v);
            }
            let mut req = req.body(Body::empty()).unwrap();
            req.extensions_mut()
                .insert(LocalAddr("127.0.0.1:8787".parse().unwrap()));
            let resp = app(state).oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            serde_json::from_slice::<serde_json::Value>(&body).unwrap()
        }
    };
    for who in [vec![("authorization", "Bearer sk-test")], vec![]] {
        let seen = overview(who.clone()).await;
        assert_eq!(seen["store"]["kind"], "ok", "{seen}");
        assert!(
            !seen.to_string().contains("secret-place"),
            "{who:?} learns the store's location: {seen}"
        );
    }
    let operator = overview(vec![("x-ctx-operator-token", "op-token")]).await;
    assert!(
        operator["store"]["location"]
            .as_str()
            .is_some_and(|l| l.contains("secret-place")),
        "{operator}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
