//! Preparing memory-provider text for an LLM egress boundary.

use crate::redact::{RedactOptions, redact};

/// Longest memory context, in characters, passed through whole.
pub const MEMORY_CONTEXT_MAX_CHARS: usize = 6_000;
/// Characters kept from the start of an over-long memory context.
pub const MEMORY_CONTEXT_HEAD_CHARS: usize = 4_000;
/// Characters kept from the end of an over-long memory context.
pub const MEMORY_CONTEXT_TAIL_CHARS: usize = 1_500;
/// Inserted where an over-long memory context was cut.
pub const MEMORY_CONTEXT_TRUNCATION_MARKER: &str = "\n...[memory provider context truncated]...\n";

/// Makes memory-provider text safe and bounded before it leaves for an LLM.
///
/// Memory providers return whatever they stored, secrets included, and
/// without bound; this is the last point before the text reaches a
/// third-party model. So it always redacts (regardless of the user's opt-out,
/// and including credentials inside URLs), then keeps the first 4000 and last
/// 1500 characters of anything longer than 6000. Lengths count characters
/// (Unicode scalar values), never bytes, so the cut never splits UTF-8.
pub fn sanitize_memory_context(memory_context: &str) -> String {
    let opts = RedactOptions {
        force: true,
        url_credentials: true,
        ..RedactOptions::default()
    };
    let sanitized = redact(memory_context.trim(), &opts);
    let chars = sanitized.chars().count();
    if chars <= MEMORY_CONTEXT_MAX_CHARS {
        return sanitized.into_owned();
    }
    let head_end = byte_offset(&sanitized, MEMORY_CONTEXT_HEAD_CHARS);
    let tail_start = byte_offset(&sanitized, chars - MEMORY_CONTEXT_TAIL_CHARS);
    let mut out = String::with_capacity(
        head_end + MEMORY_CONTEXT_TRUNCATION_MARKER.len() + (sanitized.len() - tail_start),
    );
    out.push_str(&sanitized[..head_end]);
    out.push_str(MEMORY_CONTEXT_TRUNCATION_MARKER);
    out.push_str(&sanitized[tail_start..]);
    out
}

/// Byte offset of the `n`th character (the length when `n` is past the end).
fn byte_offset(text: &str, n: usize) -> usize {
    text.char_indices().nth(n).map_or(text.len(), |(i, _)| i)
}
