//! Shared by the proxy's integration tests: the test kit
//! (`context-engine-testkit`: the skip rule, the corpus, the scripted
//! upstreams, a proxy in process), re-exported under one name.
#![allow(unused_imports)]

pub use context_engine_testkit::api::Api;
pub use context_engine_testkit::proxy::*;
pub use context_engine_testkit::upstream::*;
pub use context_engine_testkit::{
    STEP, corpus_files, counter, eventually, raw, raw_upstream, server_connections_closed, skip,
};
