#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Runs the `agent_loop` example's scenario under `cargo test`: a scripted
//! agent on the host driver must digest, compact on its own, recall a
//! digested result byte for byte and send only provider-valid requests.

#[path = "../examples/agent_loop.rs"]
#[allow(dead_code)]
mod agent_loop;

#[test]
fn the_scripted_agent_loop_digests_compacts_and_recalls() {
    let stats = agent_loop::run().unwrap_or_else(|e| panic!("agent loop failed: {e}"));
    assert_eq!(stats.requests, 11, "{stats:?}");
    assert!(stats.digest_views >= 1, "{stats:?}");
    assert!(stats.auto_compactions >= 1, "{stats:?}");
    assert_eq!(stats.exact_recalls, 1, "{stats:?}");
    assert_eq!(stats.manual_compactions, 1, "{stats:?}");
}
