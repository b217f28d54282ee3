#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `examples/coding-session.json`, the long example session: it validates
//! under the strict profile, is big enough to make a 32k-window replay
//! compact, and is exactly what its generator writes.

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

#[test]
fn coding_session_is_in_sync_with_its_generator() {
    let python = ["python3", "python"].into_iter().find(|p| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok()
    });
    let Some(python) = python else {
        eprintln!("skipped: no python3 to run scripts/make-example-session.py");
        return;
    };
    let dir = std::env::temp_dir().join(format!("ctx-example-session-{}", std::process::id()));
    let o = std::process::Command::new(python)
        .arg(root().join("scripts/make-example-session.py"))
        .arg("--out-dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for name in ["coding-session.json", "bugfix-session.json"] {
        let generated = std::fs::read(dir.join(name)).unwrap();
        let committed = std::fs::read(root().join("examples").join(name)).unwrap();
        assert!(
            generated == committed,
            "examples/{name} differs from what scripts/make-example-session.py writes; re-run it"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
