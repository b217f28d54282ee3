//! context-engine: keep an LLM agent's context window valid and small.
//!
//! Start from [`message::Message`], the lossless chat-completions message;
//! load files with [`transcript`], count with [`tokens`], check provider rules
//! and find safe cut points with [`validate`], and implement or drive an
//! engine through [`engine::ContextEngine`].

pub mod engine;
pub mod message;
pub mod redact;
pub mod tokens;
pub mod transcript;
pub mod validate;

pub use message::{Content, ContentPart, FunctionCall, Message, Role, ToolCall};
