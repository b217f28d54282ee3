//! The wire layer of context-engine: what a request *is*, never what to do
//! with it.
//!
//! The lossless chat-completions model ([`message`]) and the two client
//! formats ([`anthropic`], [`responses`]) with their bridges to chat
//! ([`bridge`]); transcripts in the formats agents write ([`transcript`]);
//! the provider rules and safe cut points ([`validate`]); exact token
//! counts ([`tokens`]). No engine, store, summarizer or network: a program
//! that only parses, counts or validates depends on this crate alone. The
//! engine (`context-engine`) re-exports every module under the same path
//! (`context_engine::message`, …).
//!
//! ```
//! use context_engine_wire::tokens::{BpeCounter, Encoding, TokenCounter};
//! use context_engine_wire::transcript::Transcript;
//! use context_engine_wire::validate::{CutPoints, Profile, TextActions, validate};
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
//! # Ok::<(), context_engine_wire::transcript::LoadError>(())
//! ```

pub mod anthropic;
pub mod bridge;
pub mod message;
pub mod responses;
pub mod tokens;
pub mod transcript;
pub mod validate;

pub use message::{Content, ContentPart, FunctionCall, Message, Role, ToolCall};

/// Client requests in the shapes Claude Code and Codex send (shared with
/// the engine's bridge tests).
#[cfg(test)]
use context_engine_testkit::requests;

/// What a multi-threaded host relies on, checked at compile time.
const _: () = {
    const fn send_sync<T: Send + Sync + ?Sized>() {}
    send_sync::<std::sync::Arc<dyn tokens::TokenCounter>>();
    send_sync::<transcript::Transcript>();
    send_sync::<Message>();
};
