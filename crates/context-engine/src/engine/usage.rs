//! Token usage reported by a provider for one API call.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::message::json_type;

/// Token usage of one LLM call, as handed to
/// [`ContextEngine::update_from_response`](super::ContextEngine::update_from_response).
///
/// The three chat-completions totals are always present. The canonical
/// buckets are optional because older hosts (and some providers) do not
/// report them; `None` means "not reported", never zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Every input token of the request, cached or not.
    pub prompt_tokens: u64,
    /// Every generated token, reasoning included.
    pub completion_tokens: u64,
    /// What the provider billed in total (normally prompt + completion).
    pub total_tokens: u64,
    /// Input tokens that were neither read from nor written to the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Generated tokens (same as `completion_tokens` where reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Input tokens served from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u64>,
    /// Input tokens written to the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    /// Hidden reasoning tokens, part of `completion_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

/// Why a provider `usage` object could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UsageError {
    /// `usage` must be a JSON object.
    #[error("usage must be an object, found {found}")]
    NotAnObject {
        /// JSON type found instead (e.g. "an array").
        found: &'static str,
    },
    /// Neither the OpenAI (`prompt_tokens`) nor the Anthropic
    /// (`input_tokens`) input count is present.
    #[error("usage has no `{field}` (nor an Anthropic-style alternative)")]
    MissingField {
        /// The OpenAI name of the missing count.
        field: &'static str,
    },
    /// A count that is not a non-negative integer.
    #[error("usage field `{field}` must be a non-negative integer, found {found}")]
    NotACount {
        /// Dotted path of the offending field.
        field: &'static str,
        /// The offending value, as JSON.
        found: String,
    },
}

impl Usage {
    /// Usage with only the chat-completions totals; `total = prompt + completion`.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            ..Usage::default()
        }
    }

    /// Reads a provider `usage` object into canonical buckets.
    ///
    /// Hosts receive usage in several dialects and engines should not care
    /// which: OpenAI chat completions (`prompt_tokens`,
    /// `prompt_tokens_details.cached_tokens`,
    /// `completion_tokens_details.reasoning_tokens`), the OpenAI Responses API
    /// (`input_tokens` with `input_tokens_details`), DeepSeek
    /// (`prompt_cache_hit_tokens`), and Anthropic (`input_tokens`,
    /// `output_tokens`, `cache_read_input_tokens`,
    /// `cache_creation_input_tokens`, where `input_tokens` excludes cached
    /// tokens). `null` counts and `null` detail objects count as absent.
    /// `prompt_tokens` is always the full input, so compaction thresholds
    /// compare like with like across providers.
    pub fn from_openai(value: &Value) -> Result<Usage, UsageError> {
        let map = value.as_object().ok_or(UsageError::NotAnObject {
            found: json_type(value),
        })?;
        let details = |key: &str, field: &'static str, path: &'static str| match map.get(key) {
            Some(Value::Object(inner)) => count(inner, field, path),
            _ => Ok(None),
        };
        let cached = details(
            "prompt_tokens_details",
            "cached_tokens",
            "prompt_tokens_details.cached_tokens",
        )?;
        let details_write = details(
            "prompt_tokens_details",
            "cache_write_tokens",
            "prompt_tokens_details.cache_write_tokens",
        )?;
        let reasoning = details(
            "completion_tokens_details",
            "reasoning_tokens",
            "completion_tokens_details.reasoning_tokens",
        )?
        .or(details(
            "output_tokens_details",
            "reasoning_tokens",
            "output_tokens_details.reasoning_tokens",
        )?);
        // The Responses API names its counts like Anthropic but, like
        // chat completions, includes cached tokens in `input_tokens`.
        let responses_cached = details(
            "input_tokens_details",
            "cached_tokens",
            "input_tokens_details.cached_tokens",
        )?;
        let responses_api = matches!(map.get("input_tokens_details"), Some(Value::Object(_)));
        let anthropic_read = count(map, "cache_read_input_tokens", "cache_read_input_tokens")?;
        let anthropic_write = count(
            map,
            "cache_creation_input_tokens",
            "cache_creation_input_tokens",
        )?;
        let deepseek_hit = count(map, "prompt_cache_hit_tokens", "prompt_cache_hit_tokens")?;
        let cache_read = cached
            .or(responses_cached)
            .or(anthropic_read)
            .or(deepseek_hit);
        let cache_write = details_write.or(anthropic_write);

        let openai_prompt = count(map, "prompt_tokens", "prompt_tokens")?;
        let anthropic_input = count(map, "input_tokens", "input_tokens")?;
        let inclusive = openai_prompt.or(if responses_api { anthropic_input } else { None });
        let (prompt, input) = match (inclusive, anthropic_input) {
            // OpenAI: prompt includes the cached part.
            (Some(prompt), _) => {
                let cached_part = cache_read
                    .unwrap_or(0)
                    .saturating_add(cache_write.unwrap_or(0));
                (prompt, prompt.saturating_sub(cached_part))
            }
            // Anthropic: input excludes the cached part.
            (None, Some(input)) => {
                let prompt = input
                    .saturating_add(cache_read.unwrap_or(0))
                    .saturating_add(cache_write.unwrap_or(0));
                (prompt, input)
            }
            (None, None) => {
                return Err(UsageError::MissingField {
                    field: "prompt_tokens",
                });
            }
        };
        let completion = match count(map, "completion_tokens", "completion_tokens")? {
            Some(n) => n,
            None => {
                count(map, "output_tokens", "output_tokens")?.ok_or(UsageError::MissingField {
                    field: "completion_tokens",
                })?
            }
        };
        let total = count(map, "total_tokens", "total_tokens")?
            .unwrap_or_else(|| prompt.saturating_add(completion));
        Ok(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: total,
            input_tokens: Some(input),
            output_tokens: Some(completion),
            cache_read_tokens: cache_read,
            cache_write_tokens: cache_write,
            reasoning_tokens: reasoning,
        })
    }
}

/// Reads an optional non-negative integer; `null` is absent.
fn count(
    map: &Map<String, Value>,
    key: &str,
    path: &'static str,
) -> Result<Option<u64>, UsageError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_u64() {
            Some(n) => Ok(Some(n)),
            None => Err(UsageError::NotACount {
                field: path,
                found: value.to_string(),
            }),
        },
    }
}
