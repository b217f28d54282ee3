#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The chat path applies the engine's request view (the digest) to the
//! managed history in place instead of copying every message per call: the
//! bytes sent must be those of the view, the client's own text for every
//! message the view keeps, and the same as the copying path's.

mod common;

use std::sync::Arc;

use context_engine::engine::Usage;
use context_engine_serve::session::Managed;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use common::{compressor_context, counter};

/// A coding session whose old tool results the digest shortens: `n`
/// messages, with the client's own spacing (so a re-serialized message
/// would show).
fn history(n: usize) -> Vec<String> {
    let mut m = vec![
        r#"{"role": "system", "content": "You are a coding agent."}"#.to_owned(),
        r#"{"role": "user", "content": "Fix the failing parser test."}"#.to_owned(),
    ];
    let mut i = 0;
    while m.len() < n {
        m.push(format!(
            r#"{{"role": "assistant", "content": null, "tool_calls": [{{"id": "call_{i}", "type": "function", "function": {{"name": "bash", "arguments": "{{\"command\":\"cat src/f{i}.py\"}}"}}}}]}}"#
        ));
        let out: String = (0..40)
            .map(|j| format!("{j:>4}     token = self.lexer.next_token({i}, {j})\\n"))
            .collect();
        m.push(format!(
            r#"{{"role": "tool", "tool_call_id": "call_{i}", "content": "{out}"}}"#
        ));
        i += 1;
    }
    m.truncate(n);
    m
}

#[test]
fn the_view_applied_in_place_sends_the_same_bytes_as_the_copied_one() {
    let ctx = Arc::new(compressor_context(counter(), 16_000));
    let mut in_place = Managed::new(Arc::clone(&ctx), "p").unwrap();
    let mut copied = Managed::new(Arc::clone(&ctx), "c").unwrap();
    let texts = history(140);
    let (mut digested, mut compacted, mut applied) = (0, 0, 0);
    for n in (20..texts.len()).step_by(2) {
        let raw: Vec<Box<RawValue>> = texts[..n]
            .iter()
            .map(|t| RawValue::from_string(t.clone()).unwrap())
            .collect();
        let refs: Vec<&RawValue> = raw.iter().map(AsRef::as_ref).collect();
        let a = in_place.prepare_json(&refs).unwrap();
        let b = copied.prepare(&refs).unwrap();
        assert_eq!(a.messages_json, b.messages_json, "call {n}");
        assert_eq!(a.reused_bytes, b.reused_bytes, "call {n}");
        // The bytes are the view's.
        let sent: Value = serde_json::from_str(&a.messages_json).unwrap();
        assert!(
            sent == serde_json::to_value(&b.request).unwrap(),
            "call {n}: the bytes are not the view's"
        );
        // Every message the view keeps goes out as the client wrote it.
        let managed: Vec<String> = in_place
            .history()
            .iter()
            .map(|m| serde_json::to_string(m).unwrap())
            .collect();
        let kept = b
            .request
            .iter()
            .zip(in_place.history())
            .filter(|(r, h)| r == h)
            .count();
        digested += usize::from(kept < b.request.len());
        compacted += usize::from(a.compaction.is_some());
        // Applied in place (no copy: `request` left empty), every message
        // the view keeps goes out as the client wrote it. (A request fitted
        // to the window takes the copying way, where `render` matches by
        // position.)
        applied += usize::from(a.request.is_empty());
        for t in texts[..n]
            .iter()
            .rev()
            .take(4)
            .filter(|_| a.request.is_empty())
        {
            assert!(
                a.messages_json.contains(t.as_str()),
                "call {n}: recent message verbatim: {t:.200} in {}",
                &a.messages_json[a.messages_json.len().saturating_sub(3000)..]
            );
        }
        assert_eq!(managed.len(), in_place.managed_messages());
        let prompt: u64 = (n as u64) * 180;
        let usage =
            Usage::from_openai(&json!({"prompt_tokens": prompt, "completion_tokens": 1})).unwrap();
        in_place.after_response(&usage);
        copied.after_response(&usage);
    }
    assert!(digested > 0, "the digest shortened old results");
    assert!(
        applied > 10,
        "most calls apply the view in place: {applied}"
    );
    assert!(compacted > 0, "a compaction took the copying way");
    assert_eq!(in_place.stats.compactions, copied.stats.compactions);
    let v: Value = serde_json::to_value(&in_place.stats).unwrap();
    assert_eq!(v["new_lineages"], 0);
}
