//! The summary model's window: where it comes from when the user did not
//! give one.
//!
//! An OpenAI-compatible server rarely says its window in the completion
//! API, but most say it somewhere: llama.cpp's `GET /props`
//! (`default_generation_settings.n_ctx`, or `n_ctx`), vLLM's and others'
//! `GET {base}/models` (`max_model_len`, `context_length`, llama.cpp's
//! `meta.n_ctx_train`). The client (`context-engine-openai`) asks both, in that order; the answer
//! (found or not) is cached per base URL and model for the process, so a
//! session asks once. When a request still overflows, the server's HTTP 400
//! usually names the limit ([`limit_from_error`]); the client learns it
//! from there and retries once.

use serde::Serialize;
use serde_json::Value;

/// Where the summary model's window came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowSource {
    /// No window known: only the character caps bound the prompt.
    #[default]
    Unknown,
    /// Given by the user (`--summarizer-context-length`,
    /// `summarizer.context_length`).
    Configured,
    /// The server's `GET /props` (llama.cpp).
    ServerProps,
    /// The server's `GET {base}/models` entry for the model.
    ModelsList,
    /// A context-overflow error named it.
    LearnedFromError,
    /// The window the session is managed against (`ctx serve`'s upstream
    /// summarizer: the agent's own model writes the summary).
    Session,
}

impl WindowSource {
    /// A few words for reports.
    pub fn describe(self) -> &'static str {
        match self {
            WindowSource::Unknown => "unknown",
            WindowSource::Configured => "configured",
            WindowSource::ServerProps => "server /props",
            WindowSource::ModelsList => "server /models",
            WindowSource::LearnedFromError => "learned from an overflow error",
            WindowSource::Session => "the session's window",
        }
    }
}

/// A window and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Tokens; `None` when unknown.
    pub tokens: Option<u64>,
    /// Its origin.
    pub source: WindowSource,
}

impl Window {
    /// No window.
    pub const UNKNOWN: Window = Window {
        tokens: None,
        source: WindowSource::Unknown,
    };

    /// `tokens` from `source`.
    pub fn known(tokens: u64, source: WindowSource) -> Window {
        Window {
            tokens: Some(tokens),
            source,
        }
    }
}

/// A positive token count.
fn tokens(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64).filter(|&n| n > 0)
}

/// llama.cpp's `/props`: `default_generation_settings.n_ctx`, else `n_ctx`.
pub fn props_n_ctx(props: &Value) -> Option<u64> {
    tokens(props.pointer("/default_generation_settings/n_ctx"))
        .or_else(|| tokens(props.get("n_ctx")))
}

/// The window in a `/models` list: the entry whose `id` is `model` (else
/// the only entry), `max_model_len`, `context_length`, `context_window`,
/// or `meta.n_ctx_train`.
pub fn models_window(list: &Value, model: &str) -> Option<u64> {
    let entries = list.get("data").and_then(Value::as_array)?;
    let entry = entries
        .iter()
        .find(|e| e.get("id").and_then(Value::as_str) == Some(model))
        .or_else(|| (entries.len() == 1).then(|| &entries[0]))?;
    tokens(entry.get("max_model_len"))
        .or_else(|| tokens(entry.get("context_length")))
        .or_else(|| tokens(entry.get("context_window")))
        .or_else(|| tokens(entry.pointer("/meta/n_ctx_train")))
}

/// The window a context-overflow error names, if it does: llama.cpp's
/// `n_ctx` field or "exceeds the available context size (8192 tokens)",
/// OpenAI's and vLLM's "maximum context length is 8192 tokens".
pub fn limit_from_error(body: &[u8]) -> Option<u64> {
    if let Ok(value) = serde_json::from_slice::<Value>(body)
        && let Some(n) = tokens(value.pointer("/error/n_ctx"))
    {
        return Some(n);
    }
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    const PHRASES: [&str; 4] = [
        "available context size (",
        "maximum context length is ",
        "context length of ",
        "context window of ",
    ];
    PHRASES.iter().find_map(|phrase| {
        let at = text.find(phrase)? + phrase.len();
        let span = text[at..]
            .find(|c: char| !(c.is_ascii_digit() || c == ','))
            .unwrap_or(text.len() - at);
        let digits: String = text[at..at + span]
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        let rest = text[at + span..].trim_start_matches([',', ' ']);
        if !rest.starts_with("tokens") && !rest.starts_with("token)") {
            return None;
        }
        digits.parse().ok().filter(|&n: &u64| n > 0)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn props_give_n_ctx() {
        let p = json!({"default_generation_settings": {"n_ctx": 8192}, "n_ctx": 4096});
        assert_eq!(props_n_ctx(&p), Some(8192));
        assert_eq!(props_n_ctx(&json!({"n_ctx": 4096})), Some(4096));
        assert_eq!(props_n_ctx(&json!({"n_ctx": 0})), None);
        assert_eq!(props_n_ctx(&json!({})), None);
    }

    #[test]
    fn models_list_gives_the_models_window() {
        let list = json!({"data": [
            {"id": "a", "max_model_len": 32768},
            {"id": "b", "context_length": 8192},
            {"id": "c", "meta": {"n_ctx_train": 2048}},
        ]});
        assert_eq!(models_window(&list, "a"), Some(32768));
        assert_eq!(models_window(&list, "b"), Some(8192));
        assert_eq!(models_window(&list, "c"), Some(2048));
        assert_eq!(models_window(&list, "z"), None);
        let one = json!({"data": [{"id": "other", "max_model_len": 4096}]});
        assert_eq!(models_window(&one, "alias"), Some(4096));
        assert_eq!(models_window(&json!({"data": []}), "a"), None);
    }

    #[test]
    fn overflow_errors_name_their_limit() {
        let llama = br#"{"error":{"code":400,"message":"the request exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error"}}"#;
        assert_eq!(limit_from_error(llama), Some(8192));
        let llama_field =
            br#"{"error":{"code":400,"message":"too long","n_prompt_tokens":9000,"n_ctx":4096}}"#;
        assert_eq!(limit_from_error(llama_field), Some(4096));
        let openai = br#"{"error":{"message":"This model's maximum context length is 8,192 tokens. However, you requested 9000 tokens."}}"#;
        assert_eq!(limit_from_error(openai), Some(8192));
        assert_eq!(limit_from_error(b"bad request: unknown field"), None);
        assert_eq!(
            limit_from_error(b"maximum context length is exceeded by 12 messages"),
            None
        );
    }
}
