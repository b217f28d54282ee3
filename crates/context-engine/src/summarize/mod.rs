//! Summarizers: turn a span of conversation into a handoff summary.
//!
//! The compressor decides *what* to summarise and owns the policy around it
//! (redaction before and after, fallbacks, cooldowns); a [`Summarizer`] only
//! turns a [`SummaryRequest`] into text or says precisely why it could not,
//! so that the caller can choose between aborting (transcript unchanged) and
//! a deterministic fallback. Implementations: the offline extractive one
//! (embedded default and fallback) and an OpenAI-compatible HTTP client.
//!
//! The trait is blocking (see ARCHITECTURE.md, "Sync and async"): a
//! summary is one call per compaction, seconds long, and implementations
//! enforce their own timeouts.

pub mod extractive;
// What every model summarizer (chat completions, the proxy's upstream in
// any API) does around its HTTP call.
pub mod model;

use std::time::Duration;

use crate::message::Message;

pub mod openai;
// What a model summarizer's client (`context-engine-openai`) builds its
// prompts with and checks replies by: the policy stays here, the HTTP there.
pub mod prompt;
pub mod quality;
pub mod state;
pub mod window;

/// What to summarise. Everything here has already been redacted and, for
/// tool results, digested by the caller: a summarizer never sees a secret
/// or a second copy of a file body.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct SummaryRequest<'a> {
    /// The span being compacted, in order.
    pub turns: &'a [Message],
    /// The summary from the previous compaction, to be updated with `turns`
    /// rather than summarised again.
    pub previous_summary: Option<&'a str>,
    /// What the user asked to keep in full detail (manual compaction).
    pub focus_topic: Option<&'a str>,
    /// Provider memory text, quoted as source material, never instructions.
    pub memory_context: Option<&'a str>,
    /// Size the summary should aim for, in tokens.
    pub target_tokens: usize,
    /// Room the state record (the ledger) may take when it needs more
    /// than the target leaves it, in tokens: the summary then grows past
    /// `target_tokens` by what the ledger holds, up to this (0: the ledger
    /// stays within the target). The ledger's literal paths, commands and
    /// error lines are worth more per byte than prose.
    pub ledger_tokens: usize,
    /// The archive handle of the span, when the caller archived it: the
    /// state record's collapsed entries point to it.
    pub archive_handle: Option<&'a str>,
    /// Whether the agent calls tools: only then do the state record's
    /// collapsed entries name `context_expand` ([`SummaryRequest::collapsed`]).
    pub tool_channel: crate::digest::ToolChannel,
    /// Which user messages of `turns` are a text-action agent's tool
    /// output (`context.text_actions`; the built-in shapes by default).
    pub text_actions: &'a crate::validate::TextActions,
}

impl<'a> SummaryRequest<'a> {
    /// A request for `turns` with no previous summary, focus or memory.
    pub fn new(turns: &'a [Message], target_tokens: usize) -> SummaryRequest<'a> {
        SummaryRequest {
            turns,
            previous_summary: None,
            focus_topic: None,
            memory_context: None,
            target_tokens,
            ledger_tokens: 0,
            archive_handle: None,
            tool_channel: crate::digest::ToolChannel::Tools,
            text_actions: crate::validate::auto_text_actions(),
        }
    }

    /// Sets [`tool_channel`](Self::tool_channel).
    pub fn with_tool_channel(mut self, channel: crate::digest::ToolChannel) -> SummaryRequest<'a> {
        self.tool_channel = channel;
        self
    }

    /// Where the state record's collapsed entries point: the archive handle
    /// as the agent's channel allows, else nowhere.
    pub fn collapsed(&self) -> state::Collapsed<'a> {
        self.archive_handle
            .map_or(state::Collapsed::NotListed, |h| {
                state::Collapsed::archived(h, self.tool_channel)
            })
    }

    /// Sets [`text_actions`](Self::text_actions).
    pub fn with_text_actions(
        mut self,
        actions: &'a crate::validate::TextActions,
    ) -> SummaryRequest<'a> {
        self.text_actions = actions;
        self
    }

    /// Sets [`previous_summary`](Self::previous_summary).
    pub fn with_previous_summary(mut self, summary: &'a str) -> SummaryRequest<'a> {
        self.previous_summary = Some(summary);
        self
    }

    /// Sets [`focus_topic`](Self::focus_topic).
    pub fn with_focus_topic(mut self, topic: &'a str) -> SummaryRequest<'a> {
        self.focus_topic = Some(topic);
        self
    }

    /// Sets [`ledger_tokens`](Self::ledger_tokens).
    pub fn with_ledger_tokens(mut self, tokens: usize) -> SummaryRequest<'a> {
        self.ledger_tokens = tokens;
        self
    }

    /// The ledger's room in bytes when it needs it: `ledger_tokens` at
    /// `chars_per_token`, at least `base` (what the target leaves it).
    pub fn ledger_room(&self, base: usize, chars_per_token: usize) -> usize {
        base.max(self.ledger_tokens.saturating_mul(chars_per_token))
    }

    /// Sets [`archive_handle`](Self::archive_handle).
    pub fn with_archive_handle(mut self, handle: &'a str) -> SummaryRequest<'a> {
        self.archive_handle = Some(handle);
        self
    }

    /// Sets [`memory_context`](Self::memory_context).
    pub fn with_memory_context(mut self, memory: &'a str) -> SummaryRequest<'a> {
        self.memory_context = Some(memory);
        self
    }
}

/// Why a summary could not be made. The variants are the distinctions the
/// compressor's failure policy needs (abort vs fallback, cooldown length).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SummarizeError {
    /// No summarizer is configured (e.g. `openai` without a base URL or key).
    #[error("no summarizer configured: {0}")]
    NotConfigured(String),
    /// The endpoint refused the credentials or the account (401/402/403).
    #[error("summarizer refused the request (HTTP {status}): {message}")]
    Auth { status: u16, message: String },
    /// The endpoint could not be reached or the connection broke.
    #[error("cannot reach the summarizer: {0}")]
    Network(String),
    /// No complete reply within the timeout.
    #[error("summarizer timed out after {0:?}")]
    Timeout(Duration),
    /// 429 after the retries were spent.
    #[error("summarizer rate-limited (HTTP 429){}", retry_after.map(|d| format!(", retry after {d:?}")).unwrap_or_default())]
    RateLimited { retry_after: Option<Duration> },
    /// 5xx (or another unexpected status) after the retries were spent.
    #[error("summarizer failed (HTTP {status}): {message}")]
    Server { status: u16, message: String },
    /// The reply was not the expected JSON shape.
    #[error("malformed summarizer reply: {0}")]
    Malformed(String),
    /// The reply had no text, or only whitespace.
    #[error("summarizer returned an empty summary")]
    Empty,
    /// The reply is not a usable summary: a repetition loop, an echo of the
    /// transcript's markup, only headings, or longer than the span.
    #[error("degenerate summary rejected: {0}")]
    Degenerate(String),
}

/// What the caller should do after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureAction {
    /// Leave the transcript unchanged and report: retrying with a fallback
    /// would hide a configuration problem (bad key, no network).
    Abort,
    /// Insert the deterministic extractive summary instead.
    Fallback,
}

impl SummarizeError {
    /// Auth/quota errors and network failures abort; the rest fall back.
    pub fn action(&self) -> FailureAction {
        match self {
            SummarizeError::Auth { .. } | SummarizeError::Network(_) => FailureAction::Abort,
            SummarizeError::NotConfigured(_)
            | SummarizeError::Timeout(_)
            | SummarizeError::RateLimited { .. }
            | SummarizeError::Server { .. }
            | SummarizeError::Malformed(_)
            | SummarizeError::Empty
            | SummarizeError::Degenerate(_) => FailureAction::Fallback,
        }
    }
}

/// Turns a span of conversation into a summary.
pub trait Summarizer: Send + Sync {
    /// Short name for reports (`extractive`, `openai:gpt-4o-mini`, ...).
    fn name(&self) -> &str;

    /// Writes the summary body (without the engine's wrapper and markers).
    fn summarize(&self, request: &SummaryRequest<'_>) -> Result<String, SummarizeError>;
}

/// A [`Summarizer`] backed by a model (a client of its own, such as
/// `context_engine_openai::OpenAiSummarizer`): a server prepares its
/// summaries in the background, and a report can show its last call.
pub trait ModelSummarizer: Summarizer {
    /// What the last call did (attempts, latency, tokens, window).
    fn last_call(&self) -> openai::CallStats;
}

/// Makes the model summarizer `summarizer.kind` names, for
/// [`EngineBuilder`](crate::builder::EngineBuilder): the core holds no HTTP
/// client; `context-engine-adapters` gives the builder the default one.
pub trait SummarizerFactory: Send + Sync {
    /// The OpenAI-compatible client for `config`, its key read through
    /// `var` (the caller's environment snapshot), its prompts redacted with
    /// `redactor`.
    fn openai(
        &self,
        config: openai::OpenAiConfig,
        var: &dyn Fn(&str) -> Option<String>,
        redactor: std::sync::Arc<crate::redact::Redactor>,
    ) -> Result<std::sync::Arc<dyn ModelSummarizer>, SummarizeError>;
}

impl<S: Summarizer + ?Sized> Summarizer for Box<S> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn summarize(&self, request: &SummaryRequest<'_>) -> Result<String, SummarizeError> {
        (**self).summarize(request)
    }
}

impl<S: Summarizer + ?Sized> Summarizer for std::sync::Arc<S> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn summarize(&self, request: &SummaryRequest<'_>) -> Result<String, SummarizeError> {
        (**self).summarize(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_and_network_abort_the_rest_fall_back() {
        let abort = [
            SummarizeError::Auth {
                status: 401,
                message: "bad key".into(),
            },
            SummarizeError::Network("refused".into()),
        ];
        assert!(abort.iter().all(|e| e.action() == FailureAction::Abort));
        let fallback = [
            SummarizeError::NotConfigured("no base url".into()),
            SummarizeError::Timeout(Duration::from_secs(30)),
            SummarizeError::RateLimited { retry_after: None },
            SummarizeError::Server {
                status: 503,
                message: "busy".into(),
            },
            SummarizeError::Malformed("no choices".into()),
            SummarizeError::Empty,
            SummarizeError::Degenerate("loop".into()),
        ];
        assert!(
            fallback
                .iter()
                .all(|e| e.action() == FailureAction::Fallback)
        );
    }

    #[test]
    fn rate_limit_message_names_the_wait() {
        let e = SummarizeError::RateLimited {
            retry_after: Some(Duration::from_secs(7)),
        };
        assert_eq!(
            e.to_string(),
            "summarizer rate-limited (HTTP 429), retry after 7s"
        );
    }
}
