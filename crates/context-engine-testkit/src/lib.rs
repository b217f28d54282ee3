//! Test support for the workspace's suites, one implementation each (a
//! `publish = false` crate the suites take as a dev-dependency):
//!
//! - [`prereq`]: the skip rule (a missing prerequisite fails under CI and
//!   is skipped with a printed reason elsewhere) and the shared corpus;
//! - [`postgres`]: a throwaway database on the test server;
//! - [`upstream`], [`raw`], [`raw_upstream`]: scripted providers (JSON and
//!   streams, a recorder of every path, a raw TCP server that misbehaves)
//!   and requests written byte for byte;
//! - `proxy` (feature `serve`): a proxy in process in front of an
//!   upstream, and a client with an identity;
//! - [`serve`]: one spawner of the real `ctx serve` that waits for its
//!   readiness;
//! - [`secrets`], [`sqlite_scan`]: planted secrets and the scans of what a
//!   store left behind;
//! - [`requests`]: client requests in the shapes Claude Code and Codex send;
//! - [`util`]: temporary directories, free ports, bounded waits in short
//!   steps ([`eventually`]) and connection signals from `/proc/net`;
//! - `store_contract` (feature `engine`): the behaviour every session store
//!   backend shares.
//!
//! Test code: a failed setup panics with what failed (the lints' `unwrap`
//! and `expect` denials are for production paths).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "serve")]
pub mod api;
pub mod postgres;
pub mod prereq;
#[cfg(feature = "serve")]
pub mod proxy;
pub mod raw;
pub mod raw_upstream;
pub mod requests;
pub mod secrets;
pub mod serve;
pub mod sqlite_scan;
#[cfg(feature = "engine")]
pub mod store_contract;
pub mod upstream;
pub mod util;

pub use prereq::{corpus_dir, corpus_files, find_shared, in_ci, name, python, shared, skip};
pub use util::{
    Rng, STEP, TempDir, connected_to, eventually, eventually_blocking, free_port,
    run_child_with_env, server_connections_closed, tls_provider,
};

/// The token counter the tests and the proxy share (BPE, `o200k_base`,
/// cached).
#[cfg(feature = "engine")]
pub fn counter() -> std::sync::Arc<dyn context_engine::tokens::TokenCounter> {
    use context_engine::tokens::{BpeCounter, CachedCounter, Encoding};
    std::sync::Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)))
}
