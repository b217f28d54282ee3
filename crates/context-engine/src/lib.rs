//! context-engine: keep an LLM agent's context window valid and small.
//!
//! Start from [`message::Message`], the lossless chat-completions message;
//! load files with [`transcript`], count with [`tokens`], check provider rules
//! and find safe cut points with [`validate`], mask secrets with [`redact`],
//! and implement or drive an engine through [`engine::ContextEngine`].
//!
//! ```
//! use context_engine::tokens::{BpeCounter, Encoding, TokenCounter};
//! use context_engine::transcript::Transcript;
//! use context_engine::validate::{CutPoints, Profile, TextActions, validate};
//!
//! let text = r#"[
//!   {"role": "user", "content": "list the files"},
//!   {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
//!     "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
//!   {"role": "tool", "tool_call_id": "c1", "content": "README.md\nsrc"},
//!   {"role": "assistant", "content": "Two entries."}
//! ]"#;
//! let transcript = Transcript::parse(text, "inline.json")?;
//! let counter = BpeCounter::new(Encoding::O200kBase);
//! assert!(counter.count_messages(&transcript.messages) > 20);
//! assert!(validate(&transcript.messages, Profile::OpenAi).is_empty());
//! // A kept tail may start at the user turn or the final answer, never on
//! // the tool result (index 2): the call and its result are one group.
//! let cuts = CutPoints::new(&transcript.messages, &TextActions::auto());
//! assert!(!cuts.is_safe(2));
//! assert_eq!(cuts.at_or_before(2), 1);
//! # Ok::<(), context_engine::transcript::LoadError>(())
//! ```

pub mod builder;
mod chain;
pub mod compressor;
pub mod config;
pub mod control;
pub mod digest;
mod duration_ms;
pub mod engine;
mod error;
pub mod front;
pub mod host;
pub mod plugin;
pub mod pricing;
pub mod prune;
pub mod recall;
pub mod redact;
pub mod replay;
pub mod request_map;
pub mod retention;
pub mod retry;
pub mod schedule;
pub mod store;
pub mod summarize;
pub mod summary_text;
pub mod tool_output;

// The wire formats and provider rules live in their own crate (no
// engine, no store, no HTTP); their paths stay `context_engine::…`.
pub use context_engine_wire::{
    anthropic, bridge, message, responses, tokens, transcript, validate,
};

pub use chain::chain as error_chain;
pub use error::{Error, Result};
pub use message::{Content, ContentPart, FunctionCall, Message, Role, ToolCall};

/// What a multi-threaded host (a tokio proxy moving a session into
/// `spawn_blocking`, or holding it in a `Mutex` shared between tasks)
/// relies on, checked at compile time: sessions and engines move between
/// threads, errors and reports cross them.
const _: () = {
    const fn send<T: Send + ?Sized>() {}
    const fn send_sync<T: Send + Sync + ?Sized>() {}
    send::<host::Session>();
    send::<compressor::Compressor>();
    send::<Box<dyn engine::ContextEngine>>();
    send::<Box<dyn engine::ContextEngine + Send>>();
    send::<Box<dyn summarize::Summarizer>>();
    send_sync::<std::sync::Arc<dyn tokens::TokenCounter>>();
    send_sync::<std::sync::Arc<redact::Redactor>>();
    send_sync::<engine::EngineError>();
    send_sync::<Error>();
    send_sync::<engine::Compaction>();
    send_sync::<host::Update>();
    send_sync::<transcript::Transcript>();
    send_sync::<Message>();
};
