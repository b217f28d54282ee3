//! Arbitrary bytes through the Anthropic Messages front's parse path, as `ctx serve`
//! reads a request: the body's fields, why it would pass unmanaged, the
//! session key, the request through its lossless model and bridge (one
//! session's cache reused across inputs, as the proxy keeps it), and the
//! bridge back. Nothing may panic, and a cached read gives what a whole
//! read gives; the property suite
//! `crates/context-engine-serve/tests/parse_fuzz.rs` runs the same path on
//! stable.
//!
//! Run with `cargo fuzz run front_anthropic` (nightly).
#![no_main]

use std::sync::Mutex;

use context_engine::front::{self as lib, FrontCache, FrontKind, FrontRequest};
use context_engine_serve::identity::{Identity, Rules};
use context_engine_serve::body::ChatBody;
use context_engine_serve::session::key::front_session_key;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;

const KIND: FrontKind = FrontKind::Anthropic;

static CACHE: Mutex<Option<FrontCache>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let Ok(split) = ChatBody::parse_object(data) else {
        return;
    };
    let field = |name: &str| serde_json::from_str(split.field(name)?.get()).ok();
    let _ = lib::unmanaged(KIND, field);
    let _ = front_session_key(&Identity::Anonymous, &HeaderMap::new(), KIND, &split);
    let fields = split.fields();
    let items = lib::split_items(KIND, &fields);
    let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = guard.get_or_insert_with(FrontCache::default);
    let Ok(mut front) = FrontRequest::parse_parts(KIND, &fields, items.as_deref(), cache) else {
        return;
    };
    let chat = front.chat().to_vec();
    if let Some(Ok(whole)) = std::str::from_utf8(data)
        .ok()
        .map(|t| FrontRequest::parse(KIND, t))
    {
        assert_eq!(whole.chat(), &chat[..], "a cached read gives what a whole read gives");
    }
    let _ = front.rebuild(&chat);
    let _ = front.rebuild_with(&chat, items.as_deref(), chat.len());
    if chat.len() > 2 {
        let _ = front.rebuild(&[chat[0].clone(), chat[chat.len() - 1].clone()]);
    }
    cache.keep(front);
});
