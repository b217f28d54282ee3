//! Anthropic Messages ⇄ chat messages, so the engine (digest, prune,
//! compaction, fit, replay) works on a Claude request, and what it hands back
//! is a Claude request again.
//!
//! [`to_chat`] maps each source part to one chat message and remembers where
//! it came from ([`Bridged`]):
//! - the top-level `system` → a `system` message (text blocks joined);
//! - a `system` entry in `messages` → a `system` message;
//! - a user message → one `tool` message per `tool_result` block (in order,
//!   `tool_call_id` = `tool_use_id`; a block of an unknown type after a
//!   result belongs to that result's message, so no cut or removal ever
//!   separates them — its tokens are then not counted), then one `user`
//!   message with the other blocks as parts (text → text part, image →
//!   `image_url`, anything else → a text part holding the block's JSON, so
//!   tokens are counted);
//! - an assistant message → one `assistant` message: text blocks joined as
//!   content, `tool_use` blocks as tool calls (arguments = the input's JSON),
//!   thinking text as `reasoning_content`.
//!
//! [`from_chat`] lines the engine's result up with those messages
//! ([`crate::bridge::align`]) and rebuilds the request: a source message
//! whose chat messages all came back unchanged is emitted as it was read
//! (byte-identical); a changed one is patched block by block, every block the
//! engine did not touch (thinking with its signature, `cache_control`,
//! images, server-tool blocks, unknown types) kept as it was; blocks whose
//! chat message was left out are removed, and a message left with no block
//! is removed; new messages (a summary) become text messages. Finally,
//! consecutive same-role messages are merged (tool results first), as the
//! API requires alternation.
//!
//! **Invariant:** `from_chat(req, &to_chat(req), &to_chat(req).messages)`
//! serializes to exactly the bytes `req` was read from (as compact JSON).

use serde_json::{Map, Value};

use super::{Block, BlockKind, Content, Message, Request};
use crate::bridge::{Step, align};
use crate::message::{self as chat, ContentPart, Role, ToolCall};

/// Where one chat message came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The top-level `system`.
    System,
    /// `messages[index]`; `blocks` are the block indexes this chat message
    /// carries (empty for string content: the whole message).
    Message { index: usize, blocks: Vec<usize> },
}

/// A request converted to chat messages, with the way back.
#[derive(Clone, Debug, PartialEq)]
pub struct Bridged {
    pub messages: Vec<chat::Message>,
    pub origins: Vec<Origin>,
}

/// The text a block contributes to a chat part, for blocks the chat model
/// has no part for.
fn opaque_part(block: &Block) -> ContentPart {
    ContentPart::new_text(serde_json::to_string(block).unwrap_or_default())
}

fn block_part(block: &Block) -> ContentPart {
    match block.kind() {
        BlockKind::Text(t) => ContentPart::new_text(t),
        BlockKind::Image => {
            let source = block.as_map().get("source");
            let field = |k: &str| source.and_then(|s| s.get(k)).and_then(Value::as_str);
            match (field("type"), field("url"), field("data")) {
                (Some("url"), Some(url), _) => ContentPart::new_image_url(url),
                (_, _, Some(data)) => ContentPart::new_image_url(format!(
                    "data:{};base64,{data}",
                    field("media_type").unwrap_or("image/png")
                )),
                _ => opaque_part(block),
            }
        }
        _ => opaque_part(block),
    }
}

/// The chat content of a `tool_result`'s `content`.
fn result_content(content: Option<&Value>) -> chat::Content {
    match content {
        None | Some(Value::Null) => chat::Content::Text(String::new()),
        Some(Value::String(s)) => chat::Content::Text(s.clone()),
        Some(Value::Array(items)) => {
            let parts: Vec<ContentPart> = items
                .iter()
                .filter_map(|v| v.as_object())
                .map(|o| block_part(&Block::from_map(o.clone())))
                .collect();
            if parts.iter().all(|p| p.text().is_some()) {
                chat::Content::Text(
                    parts
                        .iter()
                        .filter_map(ContentPart::text)
                        .collect::<Vec<_>>()
                        .join("\n"),
                )
            } else {
                chat::Content::Parts(parts)
            }
        }
        Some(other) => chat::Content::Text(other.to_string()),
    }
}

fn system_text(content: &Content) -> String {
    content.text()
}

/// Converts a request's system prompt and messages to chat messages.
pub fn to_chat(request: &Request) -> Bridged {
    let mut out = Bridged {
        messages: Vec::new(),
        origins: Vec::new(),
    };
    if let Some(system) = &request.system {
        out.messages
            .push(chat::Message::system(system_text(system)));
        out.origins.push(Origin::System);
    }
    for (index, m) in request.messages.iter().enumerate() {
        convert_message(index, m, &mut out);
    }
    out
}

/// [`to_chat`] of `request` reusing `prev`, the conversion of a request
/// with the same system prompt whose first `from` messages were the same:
/// their chat messages are kept (each message converts on its own) and
/// only `request.messages[from..]` are converted. Returns the conversion
/// and how many of `prev`'s chat messages it kept.
pub fn to_chat_from(request: &Request, mut prev: Bridged, from: usize) -> (Bridged, usize) {
    let kept = prev
        .origins
        .iter()
        .position(|o| matches!(o, Origin::Message { index, .. } if *index >= from))
        .unwrap_or(prev.origins.len());
    prev.messages.truncate(kept);
    prev.origins.truncate(kept);
    for (index, m) in request.messages.iter().enumerate().skip(from) {
        convert_message(index, m, &mut prev);
    }
    (prev, kept)
}

fn convert_message(index: usize, m: &Message, out: &mut Bridged) {
    let mut push = |message: chat::Message, blocks: Vec<usize>| {
        out.messages.push(message);
        out.origins.push(Origin::Message { index, blocks });
    };
    let role = Role::parse(&m.role);
    let Some(content) = &m.content else {
        push(chat::Message::new(role, chat::Content::Absent), Vec::new());
        return;
    };
    let blocks = match content {
        Content::Text(t) => {
            push(
                chat::Message::new(role, chat::Content::Text(t.clone())),
                Vec::new(),
            );
            return;
        }
        Content::Blocks(b) => b,
    };
    match role {
        Role::Assistant => {
            let mut text = Vec::new();
            let mut reasoning = Vec::new();
            let mut calls = Vec::new();
            for b in blocks {
                match b.kind() {
                    BlockKind::Text(t) => text.push(t),
                    BlockKind::Thinking { thinking, .. } => reasoning.push(thinking),
                    BlockKind::ToolUse { id, name, input } => calls.push(ToolCall::function(
                        id,
                        name,
                        serde_json::to_string(input).unwrap_or_default(),
                    )),
                    _ => {}
                }
            }
            let text = text.join("\n");
            let mut message = if calls.is_empty() {
                chat::Message::assistant(text)
            } else {
                chat::Message::assistant_tool_calls(text, calls)
            };
            if !reasoning.is_empty() {
                message.reasoning_content = Some(reasoning.join("\n"));
            }
            push(message, (0..blocks.len()).collect());
        }
        Role::User => {
            // A block of a type this crate does not know, after a tool
            // result, travels with that result: never cut apart from it.
            let mut rest = Vec::new();
            let mut results: Vec<(chat::Message, Vec<usize>)> = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                match b.kind() {
                    BlockKind::ToolResult {
                        tool_use_id,
                        content,
                        ..
                    } => {
                        let mut tool = chat::Message::new(Role::Tool, result_content(content));
                        tool.tool_call_id = Some(tool_use_id.to_owned());
                        results.push((tool, vec![i]));
                    }
                    BlockKind::Unknown(_) if !results.is_empty() => {
                        if let Some((_, owned)) = results.last_mut() {
                            owned.push(i);
                        }
                    }
                    _ => rest.push(i),
                }
            }
            for (tool, owned) in results {
                push(tool, owned);
            }
            if !rest.is_empty() || blocks.is_empty() {
                let parts = rest.iter().map(|&i| block_part(&blocks[i])).collect();
                push(chat::Message::new(role, chat::Content::Parts(parts)), rest);
            }
        }
        _ => {
            let text = content.text();
            push(
                chat::Message::new(role, chat::Content::Text(text)),
                (0..blocks.len()).collect(),
            );
        }
    }
}

/// One source message being rebuilt: its blocks, each kept, replaced or
/// removed.
struct Rebuild {
    index: usize,
    /// `None`: removed. Filled from the source on the first change.
    blocks: Vec<Option<Block>>,
    /// String content replaced (string-content messages).
    text: Option<Option<String>>,
    changed: bool,
}

/// Rebuilds a request in Anthropic form from the engine's `output` (see the
/// module docs). `bridged` must be `to_chat(original)`.
pub fn from_chat(original: &Request, bridged: &Bridged, output: &[chat::Message]) -> Request {
    from_chat_traced(original, bridged, output).0
}

/// [`from_chat`], also answering for each rebuilt message the index of the
/// source message it is unchanged from (`None`: patched, merged or new),
/// so a caller may send that message as the client's own bytes.
pub fn from_chat_traced(
    original: &Request,
    bridged: &Bridged,
    output: &[chat::Message],
) -> (Request, Vec<Option<usize>>) {
    let steps = align(&bridged.messages, output);
    let mut request = Request {
        system: original.system.clone(),
        messages: Vec::new(),
        extra: original.extra.clone(),
        layout: original.layout.clone(),
    };
    let mut messages: Vec<(Message, Option<usize>, bool)> = Vec::new();
    let mut current: Option<Rebuild> = None;
    let mut seen = vec![false; bridged.messages.len()];
    let mut system_seen = false;
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); original.messages.len()];
    for (j, origin) in bridged.origins.iter().enumerate() {
        if let Origin::Message { index, .. } = origin
            && let Some(list) = members.get_mut(*index)
        {
            list.push(j);
        }
    }
    let mut new_system: Vec<String> = Vec::new();

    let flush = |current: &mut Option<Rebuild>,
                 messages: &mut Vec<(Message, Option<usize>, bool)>,
                 seen: &[bool]| {
        if let Some(r) = current.take() {
            let index = r.index;
            if let Some((m, unchanged)) = finish(original, bridged, &members, r, seen) {
                messages.push((m, Some(index), unchanged));
            }
        }
    };

    for step in &steps {
        let (j, changed) = match *step {
            Step::Same(j) => (j, None),
            Step::Changed(j, m) => (j, Some(m)),
            Step::New(m) => {
                if m.role.is_instruction() {
                    new_system.push(m.text().into_owned());
                } else {
                    flush(&mut current, &mut messages, &seen);
                    messages.push((new_message(m), None, false));
                }
                continue;
            }
        };
        seen[j] = true;
        match &bridged.origins[j] {
            Origin::System => {
                system_seen = true;
                if let Some(m) = changed {
                    request.system = patch_system(original.system.as_ref(), &m.text());
                }
            }
            Origin::Message { index, blocks } => {
                if current.as_ref().is_none_or(|r| r.index != *index) {
                    flush(&mut current, &mut messages, &seen);
                    current = Some(start(*index));
                }
                if let (Some(r), Some(m)) = (current.as_mut(), changed) {
                    patch(original, r, blocks, &bridged.messages[j], m);
                }
            }
        }
    }
    flush(&mut current, &mut messages, &seen);
    if !system_seen && original.system.is_some() {
        request.system = None;
    }
    if !new_system.is_empty() {
        let note = new_system.join("\n\n");
        request.system = Some(match request.system.take() {
            None => Content::Text(note),
            Some(Content::Text(t)) => Content::Text(format!("{t}\n\n{note}")),
            Some(Content::Blocks(mut b)) => {
                b.push(Block::new_text(note));
                Content::Blocks(b)
            }
        });
    }
    let (merged, sources) = merge_same_role(messages);
    request.messages = merged;
    (request, sources)
}

/// Source message `index` of `original` with the engine's rewrites
/// `changes` (a chat message's index in `bridged` and its new form)
/// applied, as [`from_chat`] rebuilds a message none of whose chat
/// messages was left out; `None` when nothing of it remains.
pub fn patch_message(
    original: &Request,
    bridged: &Bridged,
    index: usize,
    changes: &[(usize, &chat::Message)],
) -> Option<Message> {
    original.messages.get(index)?;
    let mut r = start(index);
    for &(j, now) in changes {
        if let (Some(Origin::Message { blocks, .. }), Some(was)) =
            (bridged.origins.get(j), bridged.messages.get(j))
        {
            patch(original, &mut r, blocks, was, now);
        }
    }
    build(original, r).map(|(m, _)| m)
}

fn start(index: usize) -> Rebuild {
    Rebuild {
        index,
        blocks: Vec::new(),
        text: None,
        changed: false,
    }
}

impl Rebuild {
    /// Marks the message changed, copying its blocks on the first change.
    fn change(&mut self, original: &Request) {
        if !self.changed {
            self.changed = true;
            self.blocks = original.messages[self.index]
                .blocks()
                .iter()
                .cloned()
                .map(Some)
                .collect();
        }
    }
}

/// The rebuilt message; blocks whose chat message the engine left out
/// (`seen` false) are removed.
fn finish(
    original: &Request,
    bridged: &Bridged,
    members: &[Vec<usize>],
    mut r: Rebuild,
    seen: &[bool],
) -> Option<(Message, bool)> {
    for &j in members.get(r.index).map_or(&[][..], Vec::as_slice) {
        if let Origin::Message { blocks, .. } = &bridged.origins[j]
            && !seen[j]
        {
            r.change(original);
            for &i in blocks {
                if let Some(slot) = r.blocks.get_mut(i) {
                    *slot = None;
                }
            }
        }
    }
    build(original, r)
}

/// The message `r` rebuilds: the source itself (`true`) when unchanged;
/// `None` when nothing of it remains.
fn build(original: &Request, r: Rebuild) -> Option<(Message, bool)> {
    let source = &original.messages[r.index];
    if !r.changed {
        return Some((source.clone(), true));
    }
    let content = match r.text {
        Some(Some(t)) => Content::Text(t),
        Some(None) => return None,
        None => {
            let blocks: Vec<Block> = r.blocks.into_iter().flatten().collect();
            if blocks.is_empty() {
                return None;
            }
            Content::Blocks(blocks)
        }
    };
    Some((
        Message {
            role: source.role.clone(),
            content: Some(content),
            extra: source.extra.clone(),
            layout: source.layout.clone(),
        },
        false,
    ))
}

/// Applies the engine's rewrite `now` of chat message `was` (carrying
/// `blocks` of the source message) to `r`.
fn patch(
    original: &Request,
    r: &mut Rebuild,
    blocks: &[usize],
    was: &chat::Message,
    now: &chat::Message,
) {
    r.change(original);
    let source = &original.messages[r.index];
    if let Some(Content::Text(_)) = &source.content {
        r.text = Some(Some(now.text().into_owned()));
        return;
    }
    // A tool result (with the unknown blocks that travel with it): replace
    // its content.
    if let Some(i) = blocks.iter().copied().find(|&i| {
        r.blocks
            .get(i)
            .and_then(Option::as_ref)
            .is_some_and(|b| matches!(b.kind(), BlockKind::ToolResult { .. }))
    }) && let Some(Some(block)) = r.blocks.get_mut(i)
        && let BlockKind::ToolResult { content, .. } = block.kind()
    {
        let new = match (content, &now.content) {
            (Some(Value::String(_)) | None, chat::Content::Text(t)) => Value::String(t.clone()),
            _ => Value::Array(
                parts_to_blocks(now, &[])
                    .into_iter()
                    .map(|b| Value::Object(b.into_map()))
                    .collect(),
            ),
        };
        block.as_map_mut().insert("content".into(), new);
        return;
    }
    match now.role {
        Role::Assistant => patch_assistant(r, blocks, was, now),
        _ => patch_parts(r, blocks, was, now),
    }
}

/// Text blocks replaced by the new text (in the first one, keeping its other
/// keys); tool-use inputs replaced where the arguments changed; thinking and
/// every other block kept.
fn patch_assistant(r: &mut Rebuild, blocks: &[usize], was: &chat::Message, now: &chat::Message) {
    // Text the message had no text block for (a summary prepended to a
    // tool-calling turn): a new text block after the thinking, added last
    // so the block indexes below stay those of the source.
    let mut added: Option<String> = None;
    if was.text() != now.text() {
        let text = now.text().into_owned();
        let mut first = true;
        for &i in blocks {
            if let Some(slot) = r.blocks.get_mut(i)
                && slot.as_ref().and_then(Block::text).is_some()
            {
                if first && !text.is_empty() {
                    if let Some(b) = slot.as_mut() {
                        b.as_map_mut()
                            .insert("text".into(), Value::String(text.clone()));
                    }
                    first = false;
                } else {
                    *slot = None;
                }
            }
        }
        if first && !text.is_empty() {
            added = Some(text);
        }
    }
    for call in now.tool_calls() {
        let (Some(id), Some(f)) = (call.id.as_deref(), call.function.as_ref()) else {
            continue;
        };
        let unchanged = was
            .tool_calls()
            .iter()
            .any(|c| c.id.as_deref() == Some(id) && c.function.as_ref() == Some(f));
        if unchanged {
            continue;
        }
        let Ok(input) = serde_json::from_str::<Value>(&f.arguments) else {
            continue;
        };
        for &i in blocks {
            if let Some(Some(b)) = r.blocks.get_mut(i)
                && matches!(b.kind(), BlockKind::ToolUse { id: bid, .. } if bid == id)
            {
                b.as_map_mut().insert("input".into(), input.clone());
            }
        }
    }
    if let Some(text) = added {
        let at = r
            .blocks
            .iter()
            .position(|b| b.as_ref().is_some_and(|b| !b.is_thinking()))
            .unwrap_or(r.blocks.len());
        r.blocks.insert(at, Some(Block::new_text(text)));
    }
}

/// The user message's non-result blocks: a part equal to the one it was
/// converted from keeps its block; a changed text part rewrites its text
/// block. When the number of parts changed, the blocks are replaced by the
/// new parts' text.
fn patch_parts(r: &mut Rebuild, blocks: &[usize], was: &chat::Message, now: &chat::Message) {
    let (old, new) = (was.content.parts(), now.content.parts());
    if old.len() == new.len() && !new.is_empty() {
        for ((&i, o), n) in blocks.iter().zip(old).zip(new) {
            if o == n {
                continue;
            }
            if let (Some(Some(b)), Some(t)) = (r.blocks.get_mut(i), n.text()) {
                if b.text().is_some() {
                    b.as_map_mut()
                        .insert("text".into(), Value::String(t.to_owned()));
                } else {
                    *b = Block::new_text(t);
                }
            }
        }
        return;
    }
    let mut replacement = parts_to_blocks(now, &[]).into_iter();
    for &i in blocks {
        if let Some(slot) = r.blocks.get_mut(i) {
            *slot = replacement.next();
        }
    }
    if let Some(&last) = blocks.last() {
        let rest: Vec<Block> = replacement.collect();
        if !rest.is_empty() {
            // Appended after the last of this message's blocks.
            let at = last + 1;
            let tail = r.blocks.split_off(at.min(r.blocks.len()));
            r.blocks.extend(rest.into_iter().map(Some));
            r.blocks.extend(tail);
        }
    }
}

/// Text blocks for a chat message's content.
fn parts_to_blocks(m: &chat::Message, _keep: &[Block]) -> Vec<Block> {
    match &m.content {
        chat::Content::Parts(parts) => parts
            .iter()
            .filter_map(ContentPart::text)
            .map(Block::new_text)
            .collect(),
        other => {
            let t = other.text();
            if t.is_empty() {
                Vec::new()
            } else {
                vec![Block::new_text(t.into_owned())]
            }
        }
    }
}

/// A changed system prompt: when the new text extends the old one, the
/// original blocks stay and the addition is one more text block (so a cached
/// prefix survives); otherwise the text blocks are replaced.
fn patch_system(original: Option<&Content>, text: &str) -> Option<Content> {
    let Some(content) = original else {
        return Some(Content::Text(text.to_owned()));
    };
    match content {
        Content::Text(_) => Some(Content::Text(text.to_owned())),
        Content::Blocks(blocks) => {
            let old = content.text();
            if let Some(extra) = text.strip_prefix(old.as_str()) {
                let mut blocks = blocks.clone();
                let extra = extra.trim_start_matches('\n');
                if !extra.is_empty() {
                    blocks.push(Block::new_text(extra));
                }
                return Some(Content::Blocks(blocks));
            }
            let mut out: Vec<Block> = Vec::new();
            let mut placed = false;
            for b in blocks {
                if b.text().is_some() {
                    if !placed {
                        let mut nb = b.clone();
                        nb.as_map_mut()
                            .insert("text".into(), Value::String(text.to_owned()));
                        out.push(nb);
                        placed = true;
                    }
                } else {
                    out.push(b.clone());
                }
            }
            if !placed {
                out.push(Block::new_text(text));
            }
            Some(Content::Blocks(out))
        }
    }
}

/// A chat message the engine added, in Anthropic form.
fn new_message(m: &chat::Message) -> Message {
    match m.role {
        Role::Assistant if m.has_tool_calls() => {
            let mut blocks = Vec::new();
            let text = m.text();
            if !text.is_empty() {
                blocks.push(Block::new_text(text.into_owned()));
            }
            for c in m.tool_calls() {
                let mut b = Map::new();
                b.insert("type".into(), "tool_use".into());
                b.insert("id".into(), c.id.clone().unwrap_or_default().into());
                b.insert("name".into(), c.name().unwrap_or_default().into());
                let input = c
                    .function
                    .as_ref()
                    .and_then(|f| serde_json::from_str(&f.arguments).ok())
                    .unwrap_or_else(|| Value::Object(Map::new()));
                b.insert("input".into(), input);
                blocks.push(Block::from_map(b));
            }
            Message::new("assistant", Content::Blocks(blocks))
        }
        Role::Tool | Role::Function => {
            let mut b = Map::new();
            b.insert("type".into(), "tool_result".into());
            b.insert(
                "tool_use_id".into(),
                m.tool_call_id.clone().unwrap_or_default().into(),
            );
            b.insert("content".into(), Value::String(m.text().into_owned()));
            Message::new("user", Content::Blocks(vec![Block::from_map(b)]))
        }
        Role::Assistant => Message::new("assistant", Content::Text(m.text().into_owned())),
        _ => Message::new("user", Content::Text(m.text().into_owned())),
    }
}

/// Merges consecutive messages of the same role (user or assistant) that
/// the engine brought together (a new message, or two source messages that
/// were not adjacent), tool results first in a user message. Pairs that were
/// adjacent in the source stay as they were: repairing the client's own
/// request is not the bridge's job.
fn merge_same_role(
    messages: Vec<(Message, Option<usize>, bool)>,
) -> (Vec<Message>, Vec<Option<usize>>) {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    let mut sources: Vec<Option<usize>> = Vec::with_capacity(messages.len());
    let mut last_source: Option<usize> = None;
    for (m, source, unchanged) in messages {
        let adjacent = matches!((last_source, source), (Some(a), Some(b)) if b == a + 1);
        last_source = source;
        let mergeable = |a: &Message| {
            !adjacent && a.role == m.role && matches!(m.role.as_str(), "user" | "assistant")
        };
        match out.last_mut() {
            Some(prev) if mergeable(prev) => {
                append_blocks(prev, m);
                if let Some(s) = sources.last_mut() {
                    *s = None;
                }
            }
            _ => {
                out.push(m);
                sources.push(source.filter(|_| unchanged));
            }
        }
    }
    (out, sources)
}

/// Appends `next`'s content to `prev` as blocks, tool results first in a
/// user message (how the API reads two same-role messages).
pub(crate) fn append_blocks(prev: &mut Message, next: Message) {
    let mut blocks = into_blocks(prev.content.take());
    blocks.extend(into_blocks(next.content));
    if prev.role == "user" {
        let (results, rest): (Vec<Block>, Vec<Block>) = blocks
            .into_iter()
            .partition(|b| b.block_type() == Some("tool_result"));
        blocks = results;
        blocks.extend(rest);
    }
    prev.content = Some(Content::Blocks(blocks));
}

fn into_blocks(content: Option<Content>) -> Vec<Block> {
    match content {
        None => Vec::new(),
        Some(Content::Text(t)) if t.is_empty() => Vec::new(),
        Some(Content::Text(t)) => vec![Block::new_text(t)],
        Some(Content::Blocks(b)) => b,
    }
}
