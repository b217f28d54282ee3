//! context-engine-plugin-host: the process host of `context-engine`'s
//! engine plugins. [`ProcessEngine`] is a
//! [`ContextEngine`](context_engine::engine::ContextEngine) whose policy
//! runs in a child process, in any language, speaking JSON-RPC 2.0 over
//! stdin/stdout (`docs/plugin-protocol.md`); the protocol itself (manifest,
//! wire types, answer checks) is the core's (`context_engine::plugin`),
//! which spawns nothing. [`Host`] is the
//! [`PluginHost`] the engine builder is given (by
//! `context-engine-adapters`).
//!
//! `rpc.rs` the connection (pipes, reader threads, timeouts),
//! `supervisor.rs` the process's life (start, restart with the core's
//! backoff, failure count), `process.rs` the engine adapter.

mod process;
mod rpc;
mod supervisor;

use context_engine::engine::ContextEngine;
use context_engine::plugin::{EngineContext, PluginHost, PluginManifest, Unstarted};

pub use process::{HOOKS, ProcessEngine};

/// Starts plugins as [`ProcessEngine`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct Host;

impl PluginHost for Host {
    fn start(
        &self,
        manifest: PluginManifest,
        ctx: EngineContext,
    ) -> Result<Box<dyn ContextEngine>, Box<Unstarted>> {
        let mut engine = ProcessEngine::new(manifest, ctx);
        match engine.start() {
            Ok(()) => Ok(Box::new(engine)),
            Err(error) => Err(Box::new(Unstarted::new(error, engine.take_builtin()))),
        }
    }
}

/// A threaded host moves a plugin engine between threads.
const _: () = {
    const fn send<T: Send + ?Sized>() {}
    send::<ProcessEngine>();
};
