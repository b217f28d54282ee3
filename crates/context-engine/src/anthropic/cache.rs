//! Prompt-cache breakpoints (`cache_control`) of a request.
//!
//! The API caches a request's prefix up to each block marked with
//! `cache_control`, and accepts at most [`MAX_BREAKPOINTS`] of them (tools,
//! system and messages together). A client such as Claude Code marks its
//! system prompt and moves one breakpoint to the newest message on every
//! call. After a compaction the blocks of the summarized span are gone, and
//! with them their breakpoints; [`mark_prefix_end`] puts one on the end of
//! the managed prefix (the summary), which stays byte-identical from call to
//! call, when the limit leaves room. Nothing else is ever added or moved.

use serde_json::{Map, Value};

use super::{Block, Content, Request};

/// The most `cache_control` breakpoints one request may carry.
pub const MAX_BREAKPOINTS: usize = 4;

fn marked(map: &Map<String, Value>) -> usize {
    usize::from(map.get("cache_control").is_some_and(|v| !v.is_null()))
}

fn block_breakpoints(block: &Block) -> usize {
    let map = block.as_map();
    let nested = match map.get("content") {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_object).map(marked).sum(),
        _ => 0,
    };
    marked(map) + nested
}

fn content_breakpoints(content: Option<&Content>) -> usize {
    content.map_or(0, |c| c.blocks().iter().map(block_breakpoints).sum())
}

/// The breakpoints of `request`: in `tools`, the system prompt and the
/// messages' blocks (tool results' inner blocks included).
pub fn breakpoints(request: &Request) -> usize {
    let tools = match request.extra.get("tools") {
        Some(Value::Array(tools)) => tools.iter().filter_map(Value::as_object).map(marked).sum(),
        _ => 0,
    };
    tools
        + content_breakpoints(request.system.as_ref())
        + request
            .messages
            .iter()
            .map(|m| content_breakpoints(m.content.as_ref()))
            .sum::<usize>()
}

/// Marks the text block whose text is `prefix_end` (the last one, searching
/// from the end) with an ephemeral `cache_control`, when the request has
/// fewer than [`MAX_BREAKPOINTS`] and that block has none. Returns whether
/// it did.
pub fn mark_prefix_end(request: &mut Request, prefix_end: &str) -> bool {
    mark_prefix_end_at(request, prefix_end).is_some()
}

/// [`mark_prefix_end`], answering which message it marked.
pub fn mark_prefix_end_at(request: &mut Request, prefix_end: &str) -> Option<usize> {
    if breakpoints(request) >= MAX_BREAKPOINTS {
        return None;
    }
    for (i, m) in request.messages.iter_mut().enumerate().rev() {
        // A new message may be plain text: it becomes one text block.
        if let Some(Content::Text(text)) = m.content.as_ref()
            && text == prefix_end
        {
            m.content = Some(Content::Blocks(vec![Block::new_text(text.clone())]));
        }
        let Some(Content::Blocks(blocks)) = m.content.as_mut() else {
            continue;
        };
        if let Some(block) = blocks
            .iter_mut()
            .rev()
            .find(|b| b.text() == Some(prefix_end))
        {
            if marked(block.as_map()) > 0 {
                return None;
            }
            let mut control = Map::new();
            control.insert("type".to_owned(), Value::String("ephemeral".to_owned()));
            block
                .as_map_mut()
                .insert("cache_control".to_owned(), Value::Object(control));
            return Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_marks_within_the_limit() {
        let mut r = Request::parse(
            r#"{"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],
            "tools":[{"name":"Bash","cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":"[summary]"},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}]}]}"#,
        )
        .unwrap();
        assert_eq!(breakpoints(&r), 3);
        assert!(mark_prefix_end(&mut r, "[summary]"));
        assert_eq!(breakpoints(&r), 4);
        assert!(!mark_prefix_end(&mut r, "[summary]"), "never a fifth");
        assert!(!mark_prefix_end(&mut r, "absent"));
    }
}
