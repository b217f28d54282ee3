//! Prompt-cache breakpoints (`cache_control`) of a request.
//!
//! The API caches a request's prefix up to each block marked with
//! `cache_control`, and accepts at most [`MAX_BREAKPOINTS`] of them (tools,
//! system and messages together). A client such as Claude Code marks its
//! system prompt and moves one breakpoint to the newest message on every
//! call. After a compaction the blocks of the summarized span are gone, and
//! with them their breakpoints; [`mark_prefix_end`] puts one on the end of
//! the managed prefix (the summary), which stays byte-identical from call to
//! call, when the limit leaves room.
//!
//! The API stores a prefix only at a breakpoint, and a later request reads
//! it only by carrying that whole prefix. When the engine will change the
//! newest messages on the next call (the digest shortens the newest tool
//! results once a newer batch arrives), a breakpoint on them writes an
//! entry no request reads again, at the cache-write price.
//! [`move_tail_breakpoints`] moves the client's breakpoints from those
//! messages to the end of the message before them, which the next request
//! carries as it is. Nothing else is ever added or moved.

use serde_json::{Map, Value};

use super::{Block, Content, Message, Request};

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

/// The breakpoints of one message (tool results' inner blocks included).
pub fn message_breakpoints(message: &Message) -> usize {
    content_breakpoints(message.content.as_ref())
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

/// `value` (a request, a message, a block) without its `cache_control`
/// fields: what the API's cache compares, wherever the breakpoints sit.
pub fn without_cache_control(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| *k != "cache_control")
                .map(|(k, v)| (k.clone(), without_cache_control(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_cache_control).collect()),
        other => other.clone(),
    }
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

/// Moves the breakpoints of the last `tail` messages of `messages` (on
/// their blocks and a tool result's inner blocks) to the last block of the
/// message before them that can carry one (not a thinking block), keeping
/// the first moved `cache_control` as it was (its `ttl` included). Nothing
/// changes when the tail has no breakpoint, or when no block before it can
/// take one. Returns the indices of the messages it changed.
pub fn move_tail_breakpoints(messages: &mut [Message], tail: usize) -> Vec<usize> {
    let Some(from) = messages
        .len()
        .checked_sub(tail)
        .filter(|&f| f > 0 && tail > 0)
    else {
        return Vec::new();
    };
    let markable = |b: &Block| !b.is_thinking();
    let target = &messages[from - 1];
    let has_target = match target.content.as_ref() {
        Some(Content::Text(_)) => true,
        Some(Content::Blocks(blocks)) => blocks.iter().any(markable),
        None => false,
    };
    if !has_target {
        return Vec::new();
    }
    let mut control = None;
    let mut changed = Vec::new();
    for (i, m) in messages.iter_mut().enumerate().skip(from) {
        let Some(Content::Blocks(blocks)) = m.content.as_mut() else {
            continue;
        };
        let mut removed = false;
        for block in blocks.iter_mut() {
            let map = block.as_map_mut();
            if let Some(Value::Array(items)) = map.get_mut("content") {
                for item in items.iter_mut().filter_map(Value::as_object_mut) {
                    if let Some(c) = item.remove("cache_control") {
                        removed = true;
                        control = control.or(Some(c).filter(|c| !c.is_null()));
                    }
                }
            }
            if let Some(c) = map.remove("cache_control") {
                removed = true;
                control = control.or(Some(c).filter(|c| !c.is_null()));
            }
        }
        if removed {
            changed.push(i);
        }
    }
    let Some(control) = control else {
        return changed;
    };
    let target = &mut messages[from - 1];
    if let Some(Content::Text(text)) = target.content.as_ref() {
        target.content = Some(Content::Blocks(vec![Block::new_text(text.clone())]));
    }
    if let Some(Content::Blocks(blocks)) = target.content.as_mut()
        && let Some(block) = blocks.iter_mut().rev().find(|b| markable(b))
        && marked(block.as_map()) == 0
    {
        block
            .as_map_mut()
            .insert("cache_control".to_owned(), control);
        changed.insert(0, from - 1);
    }
    changed
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

    #[test]
    fn tail_breakpoints_move_to_the_message_before_the_tail() {
        let text = r#"{"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":"go"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"x"},{"type":"tool_use","id":"t","name":"Bash","input":{}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"big","cache_control":{"type":"ephemeral","ttl":"1h"}}]},
                {"type":"text","text":"note","cache_control":{"type":"ephemeral"}}]}]}"#;
        let mut r = Request::parse(text).unwrap();
        assert_eq!(breakpoints(&r), 3);
        assert_eq!(move_tail_breakpoints(&mut r.messages, 1), vec![1, 2]);
        assert_eq!(breakpoints(&r), 2, "two moved onto one block");
        let v = r.to_value();
        let call = &v["messages"][1]["content"][1];
        assert_eq!(call["cache_control"]["ttl"], "1h", "{call}");
        assert!(
            v["messages"][1]["content"][0]
                .get("cache_control")
                .is_none()
        );
        assert!(!v["messages"][2].to_string().contains("cache_control"));
        // Again: nothing left in the tail to move.
        assert!(move_tail_breakpoints(&mut r.messages, 1).is_empty());
        // A tail without breakpoints, no tail, or the whole request: nothing.
        let mut plain = Request::parse(text).unwrap();
        assert!(move_tail_breakpoints(&mut plain.messages, 0).is_empty());
        assert!(move_tail_breakpoints(&mut plain.messages, 3).is_empty());
        assert_eq!(breakpoints(&plain), 3);
        // A message of thinking only takes none: the tail keeps its own.
        let mut thinking = Request::parse(&text.replace(
            r#",{"type":"tool_use","id":"t","name":"Bash","input":{}}"#,
            "",
        ))
        .unwrap();
        assert!(move_tail_breakpoints(&mut thinking.messages, 1).is_empty());
        assert_eq!(breakpoints(&thinking), 3);
    }
}
