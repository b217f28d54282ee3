#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `examples/coding-session.json`, the long example session: it validates
//! under the strict profile, is big enough to make a 32k-window replay
//! compact, and both example sessions are hand-kept fixtures in the exact
//! form the library writes.

mod common;
use common::*;

const FILE: &str = "examples/coding-session.json";

#[test]
fn coding_session_validates_strictly() {
    let o = ctx(&["validate", FILE, "--profile", "strict"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

#[test]
fn coding_session_peaks_above_the_default_threshold_of_a_32k_window() {
    let o = ctx(&["inspect", FILE, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let messages = r["messages"].as_u64().unwrap();
    assert!((60..=90).contains(&messages), "{messages} messages");
    let tokens = r["tokens"].as_u64().unwrap();
    // 75% of 32,000 is 24,000: the replay must cross it, with room to spare.
    assert!((40_000..=60_000).contains(&tokens), "{tokens} tokens");
}

/// The example sessions are hand-kept fixtures (their Python generator is
/// gone): an edit must leave them loadable and in the exact form the
/// library writes, so that a load-and-write round trip (what `ctx compact
/// -o` does to an unchanged file) gives back the same bytes.
#[test]
fn example_sessions_are_in_the_form_the_library_writes() {
    for name in ["coding-session.json", "bugfix-session.json"] {
        let path = root().join("examples").join(name);
        let committed = std::fs::read_to_string(&path).unwrap();
        let transcript = context_engine::transcript::Transcript::load(&path).unwrap();
        assert!(transcript.warnings().is_empty(), "{name}");
        assert_eq!(
            format!("{}\n", transcript.to_json_string_pretty().trim_end()),
            committed,
            "examples/{name} is not in the library's pretty form"
        );
    }
}
