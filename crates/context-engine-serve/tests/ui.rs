#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The page's rules without a browser (ctx `tests/browser_ui.rs` drives it
//! in one): loopback only unless `remote`, the site rule, 404 when off, no
//! session list without an identity, and no call kept when the page is off.

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
