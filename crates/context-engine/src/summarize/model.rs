//! What every model summarizer does around its HTTP call, whichever API it
//! speaks: the prompt bounded by the summary model's window
//! ([`bounded_prompt`]), the reply read in its API's shape
//! ([`parse_reply`], [`error_message`], [`parse_retry_after`]) and the
//! checks and state record a reply gets before it is a summary
//! ([`finish`]). The clients (`context-engine-openai`'s chat-completions
//! client, `ctx serve`'s upstream summarizer) own only their transport.

use std::time::Duration;

use serde_json::Value;

use super::openai::{ERROR_EXCERPT_CHARS, OpenAiConfig};
use super::prompt::{self, Limits, Prompt, TokenBound};
use super::quality;
use super::state::StateRecord;
use super::window::Window;
use super::{SummarizeError, SummaryRequest};
use crate::tokens::TokenCounter;

/// The API a summary request is written in, and its reply read in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyShape {
    /// OpenAI chat completions: `choices[0].message.content`.
    Chat,
    /// Anthropic Messages: the `text` blocks of `content`.
    Messages,
    /// OpenAI Responses: the `output_text` parts of the `message` items.
    Responses,
}

/// A reply's summary text and the usage its server reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The text, trimmed, a leading `<think>` block dropped.
    pub text: String,
    /// Prompt (input) tokens the server reported.
    pub prompt_tokens: Option<u64>,
    /// Reply (output) tokens the server reported.
    pub completion_tokens: Option<u64>,
}

/// The prompt for `request` and what it counts (margin and template
/// included), bounded by `window` when it is known, with the reply
/// reserve `config` asks for; `who` names the summarizer in the error a
/// window too small for any prompt gets.
pub fn bounded_prompt(
    config: &OpenAiConfig,
    counter: &dyn TokenCounter,
    request: &SummaryRequest<'_>,
    window: Window,
    who: &str,
) -> Result<(Prompt, usize), SummarizeError> {
    let limits = Limits {
        max_input_chars: config.max_input_chars,
        max_message_chars: config.max_message_chars,
    };
    let reserve = config.output_reserve_for(window.tokens);
    let mut request = *request;
    if let Some(reserve) = reserve {
        // Asking for more than the reply may hold gets a cut-off summary.
        let cap = usize::try_from(reserve).unwrap_or(usize::MAX) * 3 / 4;
        request.target_tokens = request.target_tokens.min(cap.max(1));
    }
    let bound = |max_prompt_tokens| TokenBound {
        counter,
        factor: config.token_margin,
        max_prompt_tokens,
    };
    let Some(tokens) = window.tokens else {
        let p = prompt::build(&request, limits);
        let counted = bound(usize::MAX).prompt_cost(&p);
        return Ok((p, counted));
    };
    let tokens = usize::try_from(tokens).unwrap_or(usize::MAX);
    let reserve = reserve.map_or(0, |r| usize::try_from(r).unwrap_or(usize::MAX));
    let bound = bound(tokens.saturating_sub(reserve));
    let p = prompt::build_bounded(&request, limits, bound).map_err(|e| {
        SummarizeError::NotConfigured(format!(
            "{who}: a context length of {tokens} tokens ({}) with {reserve} reserved for the \
             reply leaves {} for the prompt, which needs at least {}",
            window.source.describe(),
            e.available,
            e.needed
        ))
    })?;
    let counted = bound.prompt_cost(&p);
    Ok((p, counted))
}

/// A model's reply made a summary: rejected when degenerate (a loop, an
/// echo of the transcript's markup, only headings), else followed, with
/// `deterministic_sections`, by the state record built from the turns
/// themselves (a model's prose may miss the asks, files and errors).
pub fn finish(
    text: &str,
    request: &SummaryRequest<'_>,
    counter: &dyn TokenCounter,
    deterministic_sections: bool,
) -> Result<String, SummarizeError> {
    if let Some(defect) = quality::degenerate(text, request, counter) {
        return Err(SummarizeError::Degenerate(defect));
    }
    if !deterministic_sections {
        return Ok(text.to_owned());
    }
    let budget = request.target_tokens.saturating_mul(2).clamp(1_200, 8_000);
    let budget = request.ledger_room(budget, 4);
    let mut record = StateRecord::build(request.turns, request.text_actions);
    if let Some(previous) = request.previous_summary {
        record.carry_over(previous);
    }
    let record = record.render(budget, request.collapsed());
    Ok(format!("{}\n\n{record}", text.trim_end()))
}

/// The summary text and usage of a successful reply body in `shape`; a
/// refusal is [`SummarizeError::Degenerate`] naming it, no text
/// [`SummarizeError::Empty`].
pub fn parse_reply(shape: ReplyShape, bytes: &[u8]) -> Result<Reply, SummarizeError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| SummarizeError::Malformed(format!("not JSON ({e}): {}", excerpt(bytes))))?;
    if !value.is_object() {
        return Err(SummarizeError::Malformed(format!(
            "the reply is {}, not an object",
            crate::message::json_type(&value)
        )));
    }
    let text = match shape {
        ReplyShape::Chat => chat_text(&value, bytes)?,
        ReplyShape::Messages => messages_text(&value, bytes)?,
        ReplyShape::Responses => responses_text(&value, bytes)?,
    };
    let text = strip_think(&text).trim();
    if text.is_empty() {
        return Err(SummarizeError::Empty);
    }
    let usage = value.get("usage");
    let field = |keys: [&str; 2]| {
        keys.iter()
            .find_map(|k| usage.and_then(|u| u.get(*k)).and_then(Value::as_u64))
    };
    Ok(Reply {
        text: text.to_owned(),
        prompt_tokens: field(["prompt_tokens", "input_tokens"]),
        completion_tokens: field(["completion_tokens", "output_tokens"]),
    })
}

fn no_field(value: &Value, bytes: &[u8], what: &str) -> SummarizeError {
    if value.get("error").is_some() {
        return SummarizeError::Malformed(format!(
            "error object instead of a completion: {}",
            error_message(bytes)
        ));
    }
    SummarizeError::Malformed(format!("no {what} in the reply"))
}

fn refused(text: &str) -> SummarizeError {
    SummarizeError::Degenerate(format!(
        "the model refused: {}",
        prompt::clip_middle(text.trim(), ERROR_EXCERPT_CHARS)
    ))
}

fn chat_text(value: &Value, bytes: &[u8]) -> Result<String, SummarizeError> {
    let Some(choices) = value.get("choices") else {
        return Err(no_field(value, bytes, "`choices`"));
    };
    let first = choices
        .as_array()
        .and_then(|c| c.first())
        .ok_or_else(|| SummarizeError::Malformed("`choices` is not a non-empty array".into()))?;
    let message = first
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| SummarizeError::Malformed("`choices[0].message` missing".into()))?;
    if let Some(refusal) = message.get("refusal").and_then(Value::as_str)
        && !refusal.trim().is_empty()
    {
        return Err(refused(refusal));
    }
    match message.get("content") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n")),
        Some(other) => Err(SummarizeError::Malformed(format!(
            "`choices[0].message.content` is {}",
            crate::message::json_type(other)
        ))),
    }
}

fn messages_text(value: &Value, bytes: &[u8]) -> Result<String, SummarizeError> {
    let Some(content) = value.get("content") else {
        return Err(no_field(value, bytes, "`content`"));
    };
    let blocks = content
        .as_array()
        .ok_or_else(|| SummarizeError::Malformed("`content` is not an array".into()))?;
    let text = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n");
    if value.get("stop_reason").and_then(Value::as_str) == Some("refusal") {
        return Err(refused(&text));
    }
    Ok(text)
}

fn responses_text(value: &Value, bytes: &[u8]) -> Result<String, SummarizeError> {
    let Some(output) = value.get("output") else {
        return Err(no_field(value, bytes, "`output`"));
    };
    let items = output
        .as_array()
        .ok_or_else(|| SummarizeError::Malformed("`output` is not an array".into()))?;
    let mut text = Vec::new();
    for part in items
        .iter()
        .filter(|i| i.get("type").and_then(Value::as_str) == Some("message"))
        .filter_map(|i| i.get("content").and_then(Value::as_array))
        .flatten()
    {
        match part.get("type").and_then(Value::as_str) {
            Some("output_text") => text.extend(part.get("text").and_then(Value::as_str)),
            Some("refusal") => {
                let why = part.get("refusal").and_then(Value::as_str).unwrap_or("");
                return Err(refused(why));
            }
            _ => {}
        }
    }
    Ok(text.join("\n"))
}

/// Drops a leading `<think>...</think>` block that some reasoning models
/// (served by Ollama or vLLM) put in their text.
fn strip_think(text: &str) -> &str {
    let trimmed = text.trim_start();
    if let Some(rest) = trimmed.strip_prefix("<think>")
        && let Some(end) = rest.find("</think>")
    {
        return &rest[end + "</think>".len()..];
    }
    text
}

/// The message of an error body (`{"error": {"message": ..}}`, `{"error":
/// ".."}`, `{"message": ..}`), or an excerpt of the raw body.
pub fn error_message(bytes: &[u8]) -> String {
    let from_json = serde_json::from_slice::<Value>(bytes).ok().and_then(|v| {
        let error = v.get("error");
        error
            .and_then(|e| e.get("message"))
            .or(error)
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let text = from_json.unwrap_or_else(|| excerpt(bytes));
    prompt::clip_middle(&text, ERROR_EXCERPT_CHARS).into_owned()
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    prompt::clip_middle(text.trim(), ERROR_EXCERPT_CHARS).into_owned()
}

/// `Retry-After` in seconds (the HTTP-date form is rare on these APIs and
/// is treated as absent, which falls back to the backoff).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    value
        .parse::<f64>()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(shape: ReplyShape, body: &str) -> Result<Reply, SummarizeError> {
        parse_reply(shape, body.as_bytes())
    }

    #[test]
    fn each_api_reply_gives_its_text_and_usage() {
        let chat = parse(
            ReplyShape::Chat,
            r#"{"choices":[{"message":{"role":"assistant","content":"<think>x</think> Done."}}],
                "usage":{"prompt_tokens":10,"completion_tokens":3}}"#,
        );
        let messages = parse(
            ReplyShape::Messages,
            r#"{"type":"message","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"Done."}],
                "stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":3}}"#,
        );
        let responses = parse(
            ReplyShape::Responses,
            r#"{"output":[{"type":"reasoning","summary":[]},{"type":"message","role":"assistant",
                "content":[{"type":"output_text","text":"Done."}]}],
                "usage":{"input_tokens":10,"output_tokens":3}}"#,
        );
        for reply in [chat, messages, responses] {
            let reply = reply.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(reply.text, "Done.");
            assert_eq!(
                (reply.prompt_tokens, reply.completion_tokens),
                (Some(10), Some(3))
            );
        }
    }

    #[test]
    fn refusals_errors_and_empty_replies_are_named() {
        let cases = [
            (
                ReplyShape::Chat,
                r#"{"choices":[{"message":{"content":null,"refusal":"I can't help with that."}}]}"#,
                "refused: I can't help",
            ),
            (
                ReplyShape::Messages,
                r#"{"content":[{"type":"text","text":"No."}],"stop_reason":"refusal"}"#,
                "refused: No.",
            ),
            (
                ReplyShape::Responses,
                r#"{"output":[{"type":"message","content":[{"type":"refusal","refusal":"Nope"}]}]}"#,
                "refused: Nope",
            ),
            (
                ReplyShape::Messages,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                "Overloaded",
            ),
            (ReplyShape::Responses, r#"{"output":[]}"#, "empty summary"),
            (ReplyShape::Chat, "[1]", "not an object"),
        ];
        for (shape, body, says) in cases {
            let err = parse(shape, body).expect_err(body).to_string();
            assert!(err.contains(says), "{shape:?} {body}: {err}");
        }
    }

    fn chat_reply(bytes: &[u8]) -> Result<String, SummarizeError> {
        parse_reply(ReplyShape::Chat, bytes).map(|r| r.text)
    }

    #[test]
    fn retry_after_seconds_are_parsed() {
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn replies_are_parsed_or_classified() {
        let ok = br#"{"choices":[{"message":{"role":"assistant","content":"  ## Summary\n"}}]}"#;
        assert_eq!(chat_reply(ok).unwrap(), "## Summary");
        let parts = br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#;
        assert_eq!(chat_reply(parts).unwrap(), "a\nb");
        let think = br#"{"choices":[{"message":{"content":"<think>hmm</think>\nthe summary"}}]}"#;
        assert_eq!(chat_reply(think).unwrap(), "the summary");
        for empty in [
            &br#"{"choices":[{"message":{"content":" \n "}}]}"#[..],
            br#"{"choices":[{"message":{"content":null}}]}"#,
            br#"{"choices":[{"message":{"content":"<think>only thoughts</think>"}}]}"#,
        ] {
            assert!(matches!(chat_reply(empty), Err(SummarizeError::Empty)));
        }
        for bad in [
            &b"<html>oops</html>"[..],
            br#"{"choices":[]}"#,
            br#"{"choices":[{"text":"legacy"}]}"#,
            br#"{"choices":[{"message":{"content":7}}]}"#,
            br#"{"error":{"message":"model overloaded"}}"#,
        ] {
            assert!(matches!(chat_reply(bad), Err(SummarizeError::Malformed(_))));
        }
    }

    #[test]
    fn error_bodies_give_their_message() {
        assert_eq!(
            error_message(br#"{"error":{"message":"Invalid API key","type":"auth"}}"#),
            "Invalid API key"
        );
        assert_eq!(error_message(br#"{"error":"nope"}"#), "nope");
        assert_eq!(error_message(b"  Bad Gateway\n"), "Bad Gateway");
        assert!(error_message(&vec![b'x'; 5000]).len() < 400);
    }
}
