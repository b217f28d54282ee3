//! context-engine-openai: [`OpenAiSummarizer`], a `Summarizer` backed by
//! any OpenAI-compatible chat-completions endpoint (OpenAI, OpenRouter,
//! vLLM, llama.cpp server, Ollama): the HTTP half of
//! `context_engine::summarize::openai`, whose settings
//! ([`OpenAiConfig`]), prompt and reply checks stay in the core.
//!
//! The client is blocking ([`ureq`]) because a summary is one call per
//! compaction and the `Summarizer` trait is blocking. 429 and 5xx are
//! retried by the core's one policy (`context_engine::retry`), honouring
//! `Retry-After`. [`Factory`] is the
//! [`SummarizerFactory`] the engine builder is given (by
//! `context-engine-adapters`).
//!
//! ```no_run
//! use std::time::Duration;
//! use context_engine::summarize::openai::OpenAiConfig;
//! use context_engine::summarize::{Summarizer, SummaryRequest};
//! use context_engine::Message;
//! use context_engine_openai::OpenAiSummarizer;
//!
//! let config = OpenAiConfig::new("http://127.0.0.1:8080/v1", "qwen2.5-7b-instruct")
//!     .with_api_key_env("LLAMA_API_KEY")
//!     .with_timeout(Duration::from_secs(60));
//! let summarizer = OpenAiSummarizer::with_env(config, |name| std::env::var(name).ok())?;
//! let turns = [Message::user("port the lexer to Rust")];
//! let summary = summarizer.summarize(&SummaryRequest::new(&turns, 500))?;
//! # Ok::<(), context_engine::summarize::SummarizeError>(())
//! ```

mod client;
mod discover;

use std::sync::Arc;

use context_engine::redact::Redactor;
use context_engine::summarize::openai::OpenAiConfig;
use context_engine::summarize::{ModelSummarizer, SummarizeError, SummarizerFactory};

pub use client::OpenAiSummarizer;

/// Makes [`OpenAiSummarizer`]s for the engine builder.
#[derive(Clone, Copy, Debug, Default)]
pub struct Factory;

impl SummarizerFactory for Factory {
    fn openai(
        &self,
        config: OpenAiConfig,
        var: &dyn Fn(&str) -> Option<String>,
        redactor: Arc<Redactor>,
    ) -> Result<Arc<dyn ModelSummarizer>, SummarizeError> {
        let client = OpenAiSummarizer::with_env(config, var)?.with_redactor(redactor);
        Ok(Arc::new(client))
    }
}
