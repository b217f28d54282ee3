//! Arbitrary bytes through the chat-completions front's parse path, as
//! `ctx serve` reads a request: the body's fields, the session key (with
//! and without a credential), the usage option it rewrites, each message
//! as the engine reads it. Nothing may panic; the property suite
//! `crates/context-engine-serve/tests/parse_fuzz.rs` runs the same path on
//! stable.
//!
//! Run with `cargo fuzz run front_chat` (nightly).
#![no_main]

use context_engine::message::Message;
use context_engine_serve::identity::{Identity, Rules};
use context_engine_serve::body::{ChatBody, with_include_usage};
use context_engine_serve::session::key::{session_key, tool_names};
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = ChatBody::parse(data) else {
        return;
    };
    let mut credential = HeaderMap::new();
    credential.insert("authorization", HeaderValue::from_static("Bearer k"));
    let _ = session_key(&Identity::of(&credential, &Rules::default()), &credential, &body);
    let _ = session_key(&Identity::Anonymous, &HeaderMap::new(), &body);
    let _ = (body.stream(), body.include_usage(), body.model(), tool_names(&body));
    let usage = with_include_usage(body.field("stream_options"));
    assert!(serde_json::from_str::<serde_json::Value>(&usage).is_ok());
    for m in body.messages() {
        let _ = serde_json::from_str::<Message>(m.get());
    }
    let _ = body.write(&[("messages", "[]"), ("stream_options", &usage)]);
});
