//! A proxy in process (the serve crate's library, no binary) in front of
//! an upstream: its options, session contexts with the built-in
//! compressor, and a client with an identity (feature `serve`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use context_engine::compressor::ManualClock;
use context_engine::engine::ContextEngine;
use context_engine::host::HostOptions;
use context_engine::plugin::EngineContext;
use context_engine::tokens::TokenCounter;
use context_engine_serve::{AppState, ServeOptions, SessionContext, UpstreamOptions};
use tokio::net::TcpListener;

use crate::counter;

/// A session context with the built-in compressor at `context_length`.
pub fn compressor_context(counter: Arc<dyn TokenCounter>, context_length: u64) -> SessionContext {
    let c = Arc::clone(&counter);
    let factory =
        move |_id: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
            Ok(Box::new(
                EngineContext::new(Arc::clone(&c), context_length).into_compressor(),
            ))
        };
    SessionContext {
        factory: Arc::new(factory),
        counter,
        host: HostOptions::default(),
        blocking: false,
    }
}

/// A clock for [`short_cache_context`]'s compressors, at a plausible
/// time (seconds since the Unix epoch); a test moves it past the cache's
/// lifetime instead of sleeping.
pub fn wall_clock() -> ManualClock {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_750_000_000));
    clock
}

/// [`compressor_context`] whose compressor prices a prompt cache that
/// lives `lifetime_secs` and reads the calls' times from `wall` (see
/// [`wall_clock`]), so a test can outwait the cache without sleeping.
pub fn short_cache_context(
    context_length: u64,
    lifetime_secs: u64,
    wall: &ManualClock,
) -> SessionContext {
    use context_engine::compressor::CompressorOptions;
    use context_engine::pricing::PriceModel;
    use context_engine::schedule::ScheduleOptions;
    let mut price = PriceModel::default();
    price.cache.lifetime_secs = lifetime_secs;
    let options =
        CompressorOptions::default().with_schedule(ScheduleOptions::default().with_price(price));
    let c = counter();
    let mut ctx = compressor_context(Arc::clone(&c), context_length);
    let wall = wall.clone();
    ctx.factory = Arc::new(
        move |_id: &str| -> Result<Box<dyn ContextEngine>, context_engine_serve::FactoryError> {
            Ok(Box::new(
                EngineContext::new(Arc::clone(&c), context_length)
                    .with_compressor_options(options.clone())
                    .into_compressor()
                    .with_wall_clock(Arc::new(wall.clone())),
            ))
        },
    );
    ctx
}

/// Starts a proxy for `options` and `ctx` on 127.0.0.1:0; returns its
/// address and state.
pub async fn start_proxy(options: ServeOptions, ctx: SessionContext) -> (SocketAddr, AppState) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AppState::new(options, ctx).unwrap();
    let s = state.clone();
    tokio::spawn(async move {
        context_engine_serve::serve(listener, s, std::future::pending())
            .await
            .unwrap()
    });
    (addr, state)
}

/// Waits until no session of `state` is held (at most 10 s, steps of
/// 10 ms): every response's usage is settled and, with a store, written
/// (the session stays locked until it is; see `Sessions::release`). The
/// signal for "usage is written after the response". Whether it came.
pub async fn settled(state: &AppState) -> bool {
    crate::eventually(Duration::from_secs(10), || async {
        let sessions = state.sessions().list();
        sessions
            .iter()
            .all(|(_, slot)| slot.state.try_lock().is_ok())
            .then_some(())
    })
    .await
    .is_some()
}

/// Proxy options for an upstream at `url`.
pub fn options(url: &str) -> ServeOptions {
    ServeOptions::new(UpstreamOptions::new(url))
}

/// The credential [`client`] sends: the tests' clients have an identity
/// (see `context_engine_serve::identity`), as a client with its own
/// provider key does.
pub const TEST_CREDENTIAL: &str = "Bearer sk-test";

/// An HTTP client whose requests carry [`TEST_CREDENTIAL`] in
/// `Authorization` unless they set that header themselves.
pub fn client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        reqwest::header::HeaderValue::from_static(TEST_CREDENTIAL),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// The proxy's `/metrics` text.
pub async fn metrics_text(addr: SocketAddr) -> String {
    client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The store's name of session `id` of a [`client`] (its identity's scope
/// and the id).
pub fn store_id(id: &str) -> String {
    use context_engine_serve::identity::{Identity, Rules};
    let mut h = HeaderMap::new();
    h.insert(
        axum::http::header::AUTHORIZATION,
        axum::http::HeaderValue::from_static(TEST_CREDENTIAL),
    );
    format!("{}:{id}", Identity::of(&h, &Rules::default()).scope())
}
