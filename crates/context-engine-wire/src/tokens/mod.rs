//! Token counting: what a request will cost before it is sent.
//!
//! Engines decide when to compact from these numbers, so they must match what
//! the provider bills, not just the visible text. [`TokenCounter`] is the
//! object-safe interface engines hold (`Arc<dyn TokenCounter>`); it has three
//! implementations:
//!
//! - [`BpeCounter`]: exact BPE counts with the embedded `o200k_base` and
//!   `cl100k_base` vocabularies (via the `bpe-openai` crate, chosen over
//!   `tiktoken-rs` because it gives identical counts on the corpus and was
//!   measured 1.8x (o200k) to 2.8x (cl100k) faster; see `benches/tokens.rs`).
//! - [`EstimateCounter`]: chars/4, for when exactness is not worth the CPU.
//! - [`CachedCounter`]: wraps either and remembers per-message counts by
//!   content hash, so re-counting a growing transcript costs only the new
//!   messages.
//!
//! [`calibrate`] compares our counts with the `prompt_tokens` a provider
//! reported for each call recorded in a transcript.

mod bpe;
mod cache;
mod calibrate;
#[cfg(feature = "compact-vocab")]
mod vocab;

use serde_json::Value;

use crate::message::{Content, ContentPart, FunctionCall, Message, PartKind};

pub use bpe::BpeCounter;
pub use cache::{CacheStats, CachedCounter, message_hash};
pub use calibrate::{
    CalibrationError, CalibrationPoint, CalibrationReport, calibrate, recorded_model,
    recorded_prompt_tokens,
};

/// A token count for people: `12345` → `12,345`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Counts the tokens of texts, messages and requests.
///
/// Object-safe and `Send + Sync` so that engines can share one counter as
/// `Arc<dyn TokenCounter>` across threads.
pub trait TokenCounter: Send + Sync {
    /// Tokens of a bare text, with no message framing.
    fn count_text(&self, text: &str) -> usize;

    /// Tokens one message adds to a request: its framing overhead plus every
    /// billed field (see [`CountOptions`]).
    fn count_message(&self, message: &Message) -> usize;

    /// Tokens a request adds once, whatever its messages (the priming of the
    /// assistant's reply).
    fn request_overhead(&self) -> usize;

    /// Tokens of a request made of `messages` (without tool schemas).
    fn count_messages(&self, messages: &[Message]) -> usize {
        messages
            .iter()
            .map(|m| self.count_message(m))
            .sum::<usize>()
            + self.request_overhead()
    }

    /// Tokens of the tool schemas sent with a request: each element is a
    /// chat-completions tool (`{"type": "function", "function": {...}}`) or a
    /// bare function definition.
    fn count_tools(&self, tools: &[Value]) -> usize;
}

macro_rules! forward_counter {
    ($($ty:ty),*) => {$(
        impl<T: TokenCounter + ?Sized> TokenCounter for $ty {
            fn count_text(&self, text: &str) -> usize {
                (**self).count_text(text)
            }
            fn count_message(&self, message: &Message) -> usize {
                (**self).count_message(message)
            }
            fn request_overhead(&self) -> usize {
                (**self).request_overhead()
            }
            fn count_messages(&self, messages: &[Message]) -> usize {
                (**self).count_messages(messages)
            }
            fn count_tools(&self, tools: &[Value]) -> usize {
                (**self).count_tools(tools)
            }
        }
    )*};
}

forward_counter!(&T, Box<T>, std::sync::Arc<T>);

/// What a message costs beyond its visible text, and what is counted at all.
///
/// The framing defaults follow OpenAI's published recipe for chat models
/// (the "How to count tokens with tiktoken" cookbook): each message is wrapped
/// in `<|start|>{role}…<|end|>`-style markers worth 3 tokens, a `name` adds 1,
/// and every reply is primed with 3 more.
#[derive(Clone, Debug, PartialEq)]
pub struct CountOptions {
    /// Framing tokens around every message (cookbook: 3).
    pub per_message: usize,
    /// Extra token when a message has a `name` (cookbook: 1).
    pub per_name: usize,
    /// Priming tokens added once per request (cookbook: 3).
    pub per_request: usize,
    /// Framing tokens around each tool call (or legacy `function_call`) on
    /// top of its name and arguments. Not published; 3 stands for the
    /// recipient marker and the separators the chat template puts around a
    /// call (`to=functions.`, the arguments' start and end markers).
    pub per_tool_call: usize,
    /// Framing tokens per tool schema in [`TokenCounter::count_tools`], on
    /// top of the schema's compact JSON text; plus `per_tool_call` once for
    /// the wrapper the template puts around all tools.
    pub per_tool_schema: usize,
    /// Flat cost of an image part. The real cost depends on the image size
    /// and `detail`, which a message does not carry; 1600 is about what a
    /// 1024×1024 high-detail image costs on gpt-4o class models, so it rarely
    /// undercounts.
    pub image_part: usize,
    /// Flat cost of an `input_audio` part (its duration is unknown here).
    pub audio_part: usize,
    /// Flat cost of a `file` part (its page count is unknown here).
    pub file_part: usize,
    /// Whether `reasoning_content` is counted: agents on DeepSeek, Qwen or
    /// vLLM hosts re-send it, while OpenAI drops it.
    pub count_reasoning: bool,
    /// Factor applied to counts for models whose tokenizer is unknown (they
    /// are counted with `o200k_base`, which may under-count another vendor's
    /// tokenizer).
    pub unknown_model_factor: f64,
}

impl Default for CountOptions {
    fn default() -> CountOptions {
        CountOptions {
            per_message: 3,
            per_name: 1,
            per_request: 3,
            per_tool_call: 3,
            per_tool_schema: 3,
            image_part: 1600,
            audio_part: 1600,
            file_part: 1600,
            count_reasoning: true,
            unknown_model_factor: 1.1,
        }
    }
}

/// An embedded BPE vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o-series.
    O200kBase,
    /// gpt-4, gpt-3.5-turbo, text-embedding-3.
    Cl100kBase,
}

/// Model name prefixes and their encodings, longest-specific first so that
/// `gpt-4o` wins over `gpt-4`.
const MODEL_PREFIXES: &[(&str, Encoding)] = &[
    ("chatgpt-4o", Encoding::O200kBase),
    ("gpt-4o", Encoding::O200kBase),
    ("gpt-4.1", Encoding::O200kBase),
    ("gpt-4.5", Encoding::O200kBase),
    ("gpt-5", Encoding::O200kBase),
    ("gpt-oss", Encoding::O200kBase),
    ("o1", Encoding::O200kBase),
    ("o3", Encoding::O200kBase),
    ("o4", Encoding::O200kBase),
    ("gpt-4", Encoding::Cl100kBase),
    ("gpt-3.5", Encoding::Cl100kBase),
    ("gpt-35", Encoding::Cl100kBase),
    ("text-embedding-3", Encoding::Cl100kBase),
    ("text-embedding-ada-002", Encoding::Cl100kBase),
];

impl Encoding {
    /// The encoding's tiktoken name.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }

    /// The encoding an OpenAI model uses, or `None` for a model this crate
    /// does not know. Provider prefixes (`openai/gpt-4o`, `azure:gpt-4`) and
    /// fine-tune wrappers (`ft:gpt-4o-mini:org::id`) are looked through.
    pub fn for_model(model: &str) -> Option<Encoding> {
        let lower = model.trim().to_ascii_lowercase();
        let last = lower.rsplit('/').next().unwrap_or(&lower);
        last.split(':').find_map(|segment| {
            MODEL_PREFIXES
                .iter()
                .find(|(prefix, _)| segment.starts_with(prefix))
                .map(|&(_, encoding)| encoding)
        })
    }
}

/// Whether the exact counter's tables are built at run time (the
/// `compact-vocab` feature: about 1.6 s for `o200k_base`, 0.5 s for
/// `cl100k_base`) rather than embedded precomputed (a deserialization of
/// some 50 ms on first use).
pub const TABLES_BUILT_AT_RUN_TIME: bool = cfg!(feature = "compact-vocab");

/// Starts making `encoding`'s tables ready on a background thread, once per
/// process, so that the first count does not pay for it (or waits only for
/// the rest of it). Hosts call it at start (the Python module at import,
/// `ctx` before it reads its input); without it the first count builds them.
pub fn prepare(encoding: Encoding) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static STARTED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    let slot = match encoding {
        Encoding::O200kBase => 0,
        Encoding::Cl100kBase => 1,
    };
    if STARTED[slot].swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name(format!("ctx-tokenizer-{}", encoding.name()))
        .spawn(move || {
            bpe::tokenizer(encoding);
        });
    // No thread to be had: the first count builds the tables instead.
    if spawned.is_err() {
        STARTED[slot].store(false, Ordering::Release);
    }
}

/// Sums the cost of one message with `text` counting each billed text; the
/// options decide the overheads. Shared by every counter so that they differ
/// only in how they count text.
pub(crate) fn message_cost(
    message: &Message,
    options: &CountOptions,
    text: &dyn Fn(&str) -> usize,
) -> usize {
    let mut total = options.per_message + text(message.role.as_str());
    if let Some(name) = &message.name {
        total += options.per_name + text(name);
    }
    total += match &message.content {
        Content::Absent | Content::Null => 0,
        Content::Text(s) => text(s),
        Content::Parts(parts) => parts.iter().map(|p| part_cost(p, options, text)).sum(),
    };
    let call_cost = |f: &FunctionCall| options.per_tool_call + text(&f.name) + text(&f.arguments);
    total += message
        .tool_calls()
        .iter()
        .filter_map(|c| c.function.as_ref())
        .map(call_cost)
        .sum::<usize>();
    if let Some(f) = &message.function_call {
        total += call_cost(f);
    }
    if let Some(id) = &message.tool_call_id {
        total += text(id);
    }
    if options.count_reasoning
        && let Some(r) = &message.reasoning_content
    {
        total += text(r);
    }
    total
}

fn part_cost(part: &ContentPart, options: &CountOptions, text: &dyn Fn(&str) -> usize) -> usize {
    match part.kind() {
        PartKind::Text(s) | PartKind::Refusal(s) => text(s),
        PartKind::ImageUrl { .. } => options.image_part,
        PartKind::InputAudio { .. } => options.audio_part,
        PartKind::File { .. } => options.file_part,
        // Part types of other APIs (`input_text`, …) still carry their text
        // in `text`; anything else is not text we can price.
        PartKind::Unknown(_) => part
            .as_map()
            .get("text")
            .and_then(Value::as_str)
            .map_or(0, text),
    }
}

/// Cost of tool schemas: each schema's compact JSON plus framing. The
/// provider renders schemas into its own template (a TypeScript-like
/// namespace for OpenAI), which is usually a little shorter than the JSON, so
/// this errs on the high side.
pub(crate) fn tools_cost(
    tools: &[Value],
    options: &CountOptions,
    text: &dyn Fn(&str) -> usize,
) -> usize {
    if tools.is_empty() {
        return 0;
    }
    options.per_tool_call
        + tools
            .iter()
            .map(|tool| {
                let def = tool.get("function").unwrap_or(tool);
                options.per_tool_schema + text(&def.to_string())
            })
            .sum::<usize>()
}

/// Scales `n` by `factor`, rounding up (a safety margin must not shrink).
pub(crate) fn scale(n: usize, factor: f64) -> usize {
    if factor == 1.0 {
        return n;
    }
    // Counts are far below 2^52, so the float round trip is exact; only the
    // product's representation error (100 * 1.1 = 110.00000000000001) must
    // not round a whole number up.
    let x = n as f64 * factor;
    let nearest = x.round();
    if (x - nearest).abs() < 1e-6 {
        nearest as usize
    } else {
        x.ceil() as usize
    }
}

/// The usual production counter for `model`: exact BPE (see
/// [`BpeCounter::for_model`]) behind a per-message cache, ready to share.
pub fn counter_for_model(model: &str) -> std::sync::Arc<dyn TokenCounter> {
    std::sync::Arc::new(CachedCounter::new(BpeCounter::for_model(model)))
}

/// The tokenizer for a model the user may or may not have named: the one
/// place that choice is made (every command and engine asks here). A named
/// model gets [`counter_for_model`]; none gets exact `o200k_base` (today's
/// default vocabulary) unscaled, behind the same cache.
pub fn counter_for(model: Option<&str>) -> std::sync::Arc<dyn TokenCounter> {
    match model.map(str::trim).filter(|m| !m.is_empty()) {
        Some(model) => counter_for_model(model),
        None => std::sync::Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase))),
    }
}

/// Fast estimate: one token per 4 characters, rounded up. About right for
/// English prose and code under o200k/cl100k, with no vocabulary to load.
#[derive(Clone, Debug, Default)]
pub struct EstimateCounter {
    options: CountOptions,
}

impl EstimateCounter {
    /// An estimator with the given overheads.
    pub fn new(options: CountOptions) -> EstimateCounter {
        EstimateCounter { options }
    }

    /// The options the estimator was built with.
    pub fn options(&self) -> &CountOptions {
        &self.options
    }
}

impl TokenCounter for EstimateCounter {
    fn count_text(&self, text: &str) -> usize {
        text.chars().count().div_ceil(4)
    }

    fn count_message(&self, message: &Message) -> usize {
        message_cost(message, &self.options, &|t| self.count_text(t))
    }

    fn request_overhead(&self) -> usize {
        self.options.per_request
    }

    fn count_tools(&self, tools: &[Value]) -> usize {
        tools_cost(tools, &self.options, &|t| self.count_text(t))
    }
}

#[cfg(test)]
mod tests;
