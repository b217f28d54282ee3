//! Responses input ⇄ chat messages, so the engine works on a Codex-style
//! request and hands back a Responses request.
//!
//! [`to_chat`] turns the input into chat messages, each remembering the input
//! items it carries ([`Bridged::origins`]):
//! - `instructions` (top level) → a `system` message;
//! - a string `input` → one `user` message;
//! - a `message` item → a message of its role, its text parts as content;
//! - a run of client tool calls (`function_call`, `custom_tool_call`,
//!   `local_shell_call`…) → one `assistant` message with those tool calls;
//!   an assistant `message` item right before the run (reasoning between
//!   them allowed) is the same model turn, as one response outputs them:
//!   its text is that message's content, so the turn is one chat message
//!   as in chat completions and Anthropic (one model call for a replay,
//!   and a summary the engine merges into a tool-calling turn reads back
//!   as the message it wrote);
//! - `reasoning` items go with the call or assistant message they precede
//!   (their summary text as `reasoning_content`), so a cut never separates
//!   them;
//! - a call output → a `tool` message answering its `call_id`;
//! - any other item (server-run tool calls, unknown types) travels with the
//!   chat message before it (or, at the start, the one after it).
//!
//! [`from_chat`] rebuilds the input from the engine's result: the items of an
//! unchanged chat message are emitted as read (byte-identical), a changed one
//! patches only what changed (a message's text, an output, a call's
//! arguments; reasoning with its `encrypted_content` untouched), the items of
//! a left-out message are removed, and new messages become `message` items.
//!
//! **Invariant:** a no-op pass gives back the exact request.

use serde_json::{Map, Value};

use super::{Input, Item, ItemKind, Request, value_text};
use crate::bridge::{Step, align};
use crate::message::{self as chat, ContentPart, Role, ToolCall};

/// Where one chat message came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The top-level `instructions`.
    Instructions,
    /// A string `input`.
    InputText,
    /// These input items, in order.
    Items(Vec<usize>),
}

/// A request converted to chat messages, with the way back.
#[derive(Clone, Debug, PartialEq)]
pub struct Bridged {
    pub messages: Vec<chat::Message>,
    pub origins: Vec<Origin>,
}

fn message_content(content: &Value) -> chat::Content {
    match content {
        Value::String(s) => chat::Content::Text(s.clone()),
        Value::Array(parts) => chat::Content::Parts(
            parts
                .iter()
                .map(|p| {
                    let text = p.get("text").and_then(Value::as_str);
                    let image = p.get("image_url").and_then(Value::as_str);
                    match (text, image) {
                        (Some(t), _) => ContentPart::new_text(t),
                        (None, Some(url)) => ContentPart::new_image_url(url),
                        _ => ContentPart::new_text(p.to_string()),
                    }
                })
                .collect(),
        ),
        other => chat::Content::Text(other.to_string()),
    }
}

fn reasoning_text(item: &Item) -> Option<String> {
    let summary = item.as_map().get("summary")?;
    let t = value_text(summary);
    (!t.is_empty()).then_some(t)
}

/// The `arguments` a call item contributes: `arguments`, a custom call's
/// `input`, or the JSON of a built-in call's `action`.
fn call_arguments(item: &Item) -> String {
    let m = item.as_map();
    match (m.get("arguments"), m.get("input"), m.get("action")) {
        (Some(Value::String(a)), _, _) => a.clone(),
        (_, Some(Value::String(i)), _) => i.clone(),
        (_, _, Some(action)) => action.to_string(),
        _ => String::new(),
    }
}

/// Converts a request's instructions and input to chat messages.
pub fn to_chat(request: &Request) -> Bridged {
    let mut out = Bridged {
        messages: Vec::new(),
        origins: Vec::new(),
    };
    if let Some(Value::String(i)) = request.extra.get("instructions") {
        out.messages.push(chat::Message::system(i.clone()));
        out.origins.push(Origin::Instructions);
    }
    let items = match &request.input {
        Input::Text(t) => {
            out.messages.push(chat::Message::user(t.clone()));
            out.origins.push(Origin::InputText);
            return out;
        }
        Input::Items(items) => items,
    };
    convert_items(items, 0, &mut out);
    out
}

/// [`to_chat`] of `request` reusing `prev`, the conversion of a request
/// with the same top-level fields whose first `from` input items were the
/// same. A chat message's items can depend on the items after it (a
/// trailing reasoning or server item joins the message before it, a run
/// of calls grows), so the last chat message made only of those items is
/// converted again too, with everything after it; the ones before are
/// final. Returns the conversion and how many of `prev`'s chat messages it
/// kept.
pub fn to_chat_from(request: &Request, mut prev: Bridged, from: usize) -> (Bridged, usize) {
    let items = match &request.input {
        Input::Items(items) if !prev.origins.contains(&Origin::InputText) => items,
        _ => return (to_chat(request), 0),
    };
    // Chat messages made only of the first `from` items, less the last.
    let covered = prev
        .origins
        .iter()
        .position(|o| match o {
            Origin::Items(list) => list.iter().any(|&i| i >= from),
            _ => false,
        })
        .unwrap_or(prev.origins.len());
    let first_items = prev
        .origins
        .iter()
        .position(|o| matches!(o, Origin::Items(_)))
        .unwrap_or(prev.origins.len());
    let kept = covered.saturating_sub(1).max(first_items).min(covered);
    let restart = prev.origins[..kept]
        .iter()
        .filter_map(|o| match o {
            Origin::Items(list) => list.iter().max().map(|&i| i + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    prev.messages.truncate(kept);
    prev.origins.truncate(kept);
    convert_items(items, restart, &mut prev);
    (prev, kept)
}

/// Whether `items[from..]`, past any reasoning, starts with a tool call:
/// an assistant message item before `from` is that call's turn.
fn calls_follow(items: &[Item], from: usize) -> bool {
    items
        .get(from..)
        .unwrap_or_default()
        .iter()
        .find(|item| !matches!(item.kind(), ItemKind::Reasoning { .. }))
        .is_some_and(|item| matches!(item.kind(), ItemKind::Call { .. }))
}

/// Converts `items[start..]`, appending to `out` (which holds the chat
/// messages of the items before `start`).
fn convert_items(items: &[Item], start: usize, out: &mut Bridged) {
    // Items waiting for the chat message they belong to.
    let mut pending: Vec<usize> = Vec::new();
    let mut reasoning: Vec<String> = Vec::new();
    // The text of an assistant message item whose turn goes on with calls.
    let mut turn_text: Option<chat::Content> = None;
    let mut i = start;
    while i < items.len() {
        let item = &items[i];
        match item.kind() {
            ItemKind::Message { role, content }
                if role == "assistant" && turn_text.is_none() && calls_follow(items, i + 1) =>
            {
                turn_text = Some(message_content(content));
                pending.push(i);
                i += 1;
            }
            ItemKind::Reasoning { .. } => {
                pending.push(i);
                reasoning.extend(reasoning_text(item));
                i += 1;
            }
            ItemKind::Other(_) => {
                // Travels with the previous message, or the next one.
                match out.origins.last_mut() {
                    Some(Origin::Items(list)) if pending.is_empty() => list.push(i),
                    _ => pending.push(i),
                }
                i += 1;
            }
            ItemKind::Message { role, content } => {
                let mut m = chat::Message::new(Role::parse(role), message_content(content));
                if !reasoning.is_empty() {
                    m.reasoning_content = Some(reasoning.join("\n"));
                }
                reasoning.clear();
                pending.push(i);
                out.messages.push(m);
                out.origins
                    .push(Origin::Items(std::mem::take(&mut pending)));
                i += 1;
            }
            ItemKind::Call { .. } => {
                let mut calls = Vec::new();
                while i < items.len() {
                    match items[i].kind() {
                        ItemKind::Call { call_id, name } => {
                            calls.push(ToolCall::function(
                                call_id,
                                name.unwrap_or(items[i].item_type().unwrap_or("")),
                                call_arguments(&items[i]),
                            ));
                            pending.push(i);
                        }
                        ItemKind::Reasoning { .. } => {
                            reasoning.extend(reasoning_text(&items[i]));
                            pending.push(i);
                        }
                        _ => break,
                    }
                    i += 1;
                }
                let mut m = chat::Message::assistant_tool_calls("", calls);
                if let Some(text) = turn_text.take() {
                    m.content = text;
                }
                if !reasoning.is_empty() {
                    m.reasoning_content = Some(reasoning.join("\n"));
                }
                reasoning.clear();
                out.messages.push(m);
                out.origins
                    .push(Origin::Items(std::mem::take(&mut pending)));
            }
            ItemKind::Output { call_id, output } => {
                let content = output.map_or(chat::Content::Text(String::new()), message_content);
                let mut m = chat::Message::new(Role::Tool, content);
                m.tool_call_id = Some(call_id.to_owned());
                pending.push(i);
                out.messages.push(m);
                out.origins
                    .push(Origin::Items(std::mem::take(&mut pending)));
                i += 1;
            }
        }
    }
    if !pending.is_empty() {
        match out.origins.last_mut() {
            Some(Origin::Items(list)) => list.extend(pending),
            _ => {
                let mut m = chat::Message::assistant("");
                if !reasoning.is_empty() {
                    m.reasoning_content = Some(reasoning.join("\n"));
                }
                out.messages.push(m);
                out.origins.push(Origin::Items(pending));
            }
        }
    }
}

/// Rebuilds the request from the engine's `output` (see the module docs).
/// `bridged` must be `to_chat(original)`.
pub fn from_chat(original: &Request, bridged: &Bridged, output: &[chat::Message]) -> Request {
    from_chat_traced(original, bridged, output).0
}

/// [`from_chat`], also answering for each item of the rebuilt input the
/// index of the source item it is unchanged from (`None`: patched or new),
/// so a caller may send that item as the client's own bytes.
pub fn from_chat_traced(
    original: &Request,
    bridged: &Bridged,
    output: &[chat::Message],
) -> (Request, Vec<Option<usize>>) {
    let steps = align(&bridged.messages, output);
    let mut request = Request {
        input: Input::Items(Vec::new()),
        extra: original.extra.clone(),
        layout: original.layout.clone(),
    };
    let source = original.items();
    let mut items: Vec<Item> = Vec::with_capacity(source.len());
    let mut sources: Vec<Option<usize>> = Vec::with_capacity(source.len());
    let mut instructions_seen = false;
    let mut input_text: Option<String> = None;
    for step in &steps {
        let (j, now) = match *step {
            Step::Same(j) => (j, None),
            Step::Changed(j, m) => (j, Some(m)),
            Step::New(m) => {
                for item in new_items(m) {
                    items.push(item);
                    sources.push(None);
                }
                continue;
            }
        };
        match &bridged.origins[j] {
            Origin::Instructions => {
                instructions_seen = true;
                if let Some(m) = now {
                    request
                        .extra
                        .insert("instructions".into(), Value::String(m.text().into_owned()));
                }
            }
            Origin::InputText => {
                input_text = Some(match now {
                    Some(m) => m.text().into_owned(),
                    None => match &original.input {
                        Input::Text(t) => t.clone(),
                        Input::Items(_) => String::new(),
                    },
                });
            }
            Origin::Items(list) => {
                // Text the engine gave a turn that has no message item (a
                // summary merged into a tool-calling turn) becomes an
                // assistant message item before the turn's items, so the
                // reasoning stays with the call it precedes.
                if let Some(m) = now {
                    let carries_text = list.iter().any(|&i| {
                        source.get(i).is_some_and(|it| {
                            matches!(
                                it.kind(),
                                ItemKind::Message { .. } | ItemKind::Output { .. }
                            )
                        })
                    });
                    let text = m.text();
                    if !carries_text && bridged.messages[j].content != m.content && !text.is_empty()
                    {
                        items.push(Item::new_message(m.role.as_str(), text.into_owned()));
                        sources.push(None);
                    }
                }
                for &i in list {
                    let Some(item) = source.get(i) else { continue };
                    match now {
                        None => {
                            items.push(item.clone());
                            sources.push(Some(i));
                        }
                        Some(m) => match patch(item, &bridged.messages[j], m) {
                            Some(patched) => {
                                items.push(patched);
                                sources.push(None);
                            }
                            None => {
                                items.push(item.clone());
                                sources.push(Some(i));
                            }
                        },
                    }
                }
            }
        }
    }
    if !instructions_seen {
        request.extra.shift_remove("instructions");
    }
    request.input = match (&original.input, input_text) {
        (Input::Text(_), Some(t)) if items.is_empty() => Input::Text(t),
        (Input::Text(_), Some(t)) => {
            let mut all = vec![Item::new_message("user", t)];
            all.extend(items);
            sources.insert(0, None);
            Input::Items(all)
        }
        _ => Input::Items(items),
    };
    (request, sources)
}

/// One item of a changed chat message with the engine's rewrite applied;
/// `None` when the rewrite leaves this item as it was.
pub fn patch(item: &Item, was: &chat::Message, now: &chat::Message) -> Option<Item> {
    match item.kind() {
        ItemKind::Message { content, .. } => {
            if was.content != now.content {
                let new = rewrite_content(content, &now.content);
                let mut item = item.clone();
                item.as_map_mut().insert("content".into(), new);
                return Some(item);
            }
        }
        ItemKind::Output { output, .. } => {
            if was.content != now.content {
                let new = match output {
                    Some(v) => rewrite_content(v, &now.content),
                    None => Value::String(now.text().into_owned()),
                };
                let mut item = item.clone();
                item.as_map_mut().insert("output".into(), new);
                return Some(item);
            }
        }
        ItemKind::Call { call_id, .. } => {
            let new = now
                .tool_calls()
                .iter()
                .find(|c| c.id.as_deref() == Some(call_id))
                .and_then(|c| c.function.as_ref())
                .map(|f| f.arguments.clone());
            if let Some(args) = new
                && args != call_arguments(item)
            {
                let key = if item.as_map().contains_key("arguments") {
                    "arguments"
                } else {
                    "input"
                };
                if item.as_map().get(key).is_some_and(Value::is_string) {
                    let mut item = item.clone();
                    item.as_map_mut().insert(key.into(), Value::String(args));
                    return Some(item);
                }
            }
        }
        ItemKind::Reasoning { .. } | ItemKind::Other(_) => {}
    }
    None
}

/// New content in the shape of the old: a string stays a string; a list of
/// parts keeps its first text part's type and keys with the new text, and its
/// non-text parts when the new content still has them.
fn rewrite_content(old: &Value, new: &chat::Content) -> Value {
    let text = new.text().into_owned();
    let Value::Array(parts) = old else {
        return Value::String(text);
    };
    let template = parts
        .iter()
        .find(|p| p.get("text").is_some())
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_else(|| {
            let mut m = Map::new();
            m.insert("type".into(), "input_text".into());
            m
        });
    let keeps_binary = new.parts().iter().any(ContentPart::is_binary);
    let mut out = Vec::new();
    let mut placed = false;
    for p in parts {
        if p.get("text").is_some() {
            if !placed {
                let mut t = template.clone();
                t.insert("text".into(), Value::String(text.clone()));
                out.push(Value::Object(t));
                placed = true;
            }
        } else if keeps_binary {
            out.push(p.clone());
        }
    }
    if !placed {
        let mut t = template;
        t.insert("text".into(), Value::String(text));
        out.push(Value::Object(t));
    }
    Value::Array(out)
}

/// Items for a chat message the engine added.
fn new_items(m: &chat::Message) -> Vec<Item> {
    match m.role {
        Role::Tool | Role::Function => {
            let mut o = Map::new();
            o.insert("type".into(), "function_call_output".into());
            o.insert(
                "call_id".into(),
                m.tool_call_id.clone().unwrap_or_default().into(),
            );
            o.insert("output".into(), Value::String(m.text().into_owned()));
            vec![Item::from_map(o)]
        }
        Role::Assistant if m.has_tool_calls() => {
            let mut out = Vec::new();
            let text = m.text();
            if !text.is_empty() {
                out.push(Item::new_message("assistant", text.into_owned()));
            }
            for c in m.tool_calls() {
                let mut o = Map::new();
                o.insert("type".into(), "function_call".into());
                o.insert("call_id".into(), c.id.clone().unwrap_or_default().into());
                o.insert("name".into(), c.name().unwrap_or_default().into());
                o.insert(
                    "arguments".into(),
                    c.function
                        .as_ref()
                        .map(|f| f.arguments.clone())
                        .unwrap_or_default()
                        .into(),
                );
                out.push(Item::from_map(o));
            }
            out
        }
        _ => vec![Item::new_message(m.role.as_str(), m.text().into_owned())],
    }
}
