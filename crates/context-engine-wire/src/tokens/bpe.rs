//! The exact counter, on `bpe-openai`'s embedded vocabularies (or, under
//! `compact-vocab`, the same tables built at run time: `vocab.rs`).

use serde_json::Value;

use super::{CountOptions, Encoding, TokenCounter, message_cost, scale, tools_cost};
use crate::message::Message;

/// Exact BPE token counts for OpenAI encodings.
///
/// Texts are encoded as ordinary text: special-token strings such as
/// `<|endoftext|>` inside a message count as the characters they are, as the
/// API treats them. For a model of unknown vocabulary (see
/// [`BpeCounter::for_model`]) every count is scaled by
/// [`CountOptions::unknown_model_factor`].
#[derive(Clone, Debug)]
pub struct BpeCounter {
    encoding: Encoding,
    options: CountOptions,
    factor: f64,
}

impl BpeCounter {
    /// An exact counter for `encoding` with default options.
    pub fn new(encoding: Encoding) -> BpeCounter {
        BpeCounter::with_options(encoding, CountOptions::default())
    }

    /// An exact counter for `encoding` with the given options.
    pub fn with_options(encoding: Encoding, options: CountOptions) -> BpeCounter {
        BpeCounter {
            encoding,
            options,
            factor: 1.0,
        }
    }

    /// The counter for `model` with default options (see
    /// [`BpeCounter::for_model_with`]).
    pub fn for_model(model: &str) -> BpeCounter {
        BpeCounter::for_model_with(model, CountOptions::default())
    }

    /// The counter for `model`: its own encoding when known
    /// ([`Encoding::for_model`]), else `o200k_base` with counts scaled by
    /// `options.unknown_model_factor`, since another vendor's tokenizer may
    /// split text more finely.
    pub fn for_model_with(model: &str, options: CountOptions) -> BpeCounter {
        match Encoding::for_model(model) {
            Some(encoding) => BpeCounter::with_options(encoding, options),
            None => {
                let factor = options.unknown_model_factor;
                BpeCounter {
                    encoding: Encoding::O200kBase,
                    options,
                    factor,
                }
            }
        }
    }

    /// The vocabulary used.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// The factor applied to counts (1.0 for a known model).
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// The options the counter was built with.
    pub fn options(&self) -> &CountOptions {
        &self.options
    }

    /// Exact token count of `text`, unscaled.
    pub fn raw_count(&self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
        tokenizer(self.encoding).count(text)
    }
}

/// The tokenizer of `encoding`: `bpe-openai`'s precomputed tables, or under
/// the `compact-vocab` feature the same tables built from the embedded
/// vocabulary on first use.
pub(super) fn tokenizer(encoding: Encoding) -> &'static bpe_openai::Tokenizer {
    #[cfg(feature = "compact-vocab")]
    {
        super::vocab::tokenizer(encoding)
    }
    #[cfg(not(feature = "compact-vocab"))]
    match encoding {
        Encoding::O200kBase => bpe_openai::o200k_base(),
        Encoding::Cl100kBase => bpe_openai::cl100k_base(),
    }
}

impl TokenCounter for BpeCounter {
    fn count_text(&self, text: &str) -> usize {
        scale(self.raw_count(text), self.factor)
    }

    fn count_message(&self, message: &Message) -> usize {
        scale(
            message_cost(message, &self.options, &|t| self.raw_count(t)),
            self.factor,
        )
    }

    fn request_overhead(&self) -> usize {
        scale(self.options.per_request, self.factor)
    }

    fn count_tools(&self, tools: &[Value]) -> usize {
        scale(
            tools_cost(tools, &self.options, &|t| self.raw_count(t)),
            self.factor,
        )
    }
}
