#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `ctx demo`: the bundled session driven through the real proxy against
//! the stand-in model; the proxy saves tokens and compacts, and the demo
//! says where the page is.

use std::process::Command;

#[test]
fn the_demo_drives_the_bundled_session_through_the_proxy_and_compacts() {
    let out = Command::new(env!("CARGO_BIN_EXE_ctx"))
        .args([
            "demo",
            "--exit",
            "--pace-ms",
            "0",
            "--listen",
            "127.0.0.1:0",
        ])
        .env("CTX_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("the page is at http://127.0.0.1:") && stdout.contains("/ui#key=demo"),
        "{stdout}"
    );
    assert!(stdout.contains("driving 37 calls"), "{stdout}");
    // "done: the agent sent N prompt tokens, the proxy M upstream (P% less), C compaction(s)"
    let done = stdout.lines().find(|l| l.contains("done:")).unwrap();
    let numbers: Vec<u64> = done
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let (sent, upstream, compactions) = (numbers[0], numbers[1], numbers[3]);
    assert!(upstream < sent, "{done}");
    assert!(compactions >= 1, "{done}");
}
