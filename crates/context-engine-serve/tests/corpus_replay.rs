#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `ctx replay` predicts `ctx serve`: every corpus transcript replayed
//! through the proxy as a client would (full history on every call)
//! against a scripted upstream, and compared call by call with
//! `context_engine::replay` at the same window (driver:
//! `common/front_replay.rs`): through each front (chat completions,
//! Anthropic Messages, Responses, the session converted with the wire
//! crate's bridges), without a store and with each kind of store (in
//! memory, a SQLite file, PostgreSQL when a server answers), the replay
//! archiving into the same kind. Memory, SQLite and Postgres send the
//! same requests.
//!
//! The matrix, kept cheap (the sessions run unoptimized): chat
//! completions runs every transcript with every kind of store; the
//! Anthropic and Responses fronts run every transcript without a store
//! and the two longest (by tokens: with the shared corpus, the text-action
//! session `mini_astropy12907` and the tool-calling `sweagent_pydicom`,
//! the two that compact) with each kind of store.

mod common;
#[path = "corpus_replay/front_replay.rs"]
mod front_replay;
use context_engine_testkit::postgres as pg;

use front_replay::{Front, check};

/// How many transcripts the Anthropic and Responses fronts run with each
/// kind of store (the longest).
const FRONT_STORED: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_through_the_proxy_matches_the_replay() {
    let Some(files) = common::corpus_files() else {
        return;
    };
    check(Front::Chat, &files, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_through_the_anthropic_front_matches_the_replay() {
    let Some(files) = common::corpus_files() else {
        return;
    };
    check(Front::Anthropic, &files, Some(FRONT_STORED)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_through_the_responses_front_matches_the_replay() {
    let Some(files) = common::corpus_files() else {
        return;
    };
    check(Front::Responses, &files, Some(FRONT_STORED)).await;
}
