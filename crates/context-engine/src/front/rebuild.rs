//! Rebuilding the client's request from the engine's output: the fields
//! to replace, the client's own bytes kept for what the engine left
//! unchanged, refused when it would break a rule of the API.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::value::RawValue;
use xxhash_rust::xxh3::Xxh3Default;

use crate::anthropic::{self};
use crate::message::Message;
use crate::responses;
use crate::summary_text::is_summary;
use crate::validate::{self, Violation};

use super::{FrontRequest, Inner, Memo, Rebuilt};

impl FrontRequest {
    /// The client's request rebuilt from the engine's `output` (chat
    /// messages): the fields to replace. Empty when `output` is the chat
    /// view unchanged (the body goes upstream as it came). `Err` when the
    /// rebuilt request would add a violation of its API's rules.
    pub fn rebuild(&self, output: &[Message]) -> Result<Rebuilt, Violation> {
        self.rebuild_whole(output, None, None)
    }

    /// [`rebuild`](Self::rebuild), writing each message (item) the engine
    /// left unchanged as its text in `raw`: the conversation this request
    /// was read from, one entry per message (item), as the client wrote
    /// it (ignored when its length differs).
    ///
    /// When the engine rewrote messages in place (each chat message came
    /// back at its position, changed or not: a digest, a clip), a request
    /// read by [`parse_parts`](Self::parse_parts) is rebuilt message by
    /// message: a rewritten message the previous rebuild saw come back the
    /// same way reuses the JSON it became then, the others are patched
    /// alone; the API's rules are judged by shape (a rewrite that keeps
    /// every message's role, blocks, tool ids and thinking keeps the
    /// client's request's violations), and anything else takes the whole
    /// rebuild.
    ///
    /// `stable` is how many leading messages of `output` the engine expects
    /// the next request to carry as they are (`output.len()` when all:
    /// see [`crate::host::Session::stable_prefix`]). When the rest are
    /// the client's own newest messages and it marked a breakpoint on
    /// them, the breakpoint moves to the message before them
    /// ([`anthropic::cache::move_tail_breakpoints`]): an entry written
    /// on messages the next request changes is never read.
    pub fn rebuild_with(
        &mut self,
        output: &[Message],
        raw: Option<&[&RawValue]>,
        stable: usize,
    ) -> Result<Rebuilt, Violation> {
        let tail = self.breakpoint_tail(output, stable);
        if output == self.chat() && tail.is_none() {
            return Ok(Rebuilt::default());
        }
        // A summary the engine added marks the end of the managed
        // prefix: the whole rebuild places its breakpoint.
        if let Some(raw) = raw
            && last_new(self.chat(), output).is_none()
            && let Some(rebuilt) = self.rebuild_in_place(output, raw, tail)
        {
            return Ok(rebuilt);
        }
        self.memo.clear();
        self.rebuild_whole(output, raw, tail)
    }

    /// How many messages at the end of this Anthropic request the next
    /// call changes, when the client marked a breakpoint on them: the
    /// messages past `output`'s first `stable` are the client's own (the
    /// engine left them as they came), they start a message, and an
    /// assistant message comes before them.
    fn breakpoint_tail(&self, output: &[Message], stable: usize) -> Option<usize> {
        let Inner::Anthropic { request, bridged } = &self.inner else {
            return None;
        };
        let chat = self.chat();
        let after = output.len().checked_sub(stable).filter(|&t| t > 0)?;
        let first = chat.len().checked_sub(after)?;
        if output.get(stable..)? != chat.get(first..)? {
            return None;
        }
        let anthropic::bridge::Origin::Message { index, .. } = *bridged.origins.get(first)? else {
            return None;
        };
        // The chat message before the tail comes from the message before.
        let starts_message = first == 0
            || !matches!(bridged.origins.get(first - 1),
                Some(anthropic::bridge::Origin::Message { index: i, .. }) if *i == index);
        let before = index.checked_sub(1).and_then(|i| request.messages.get(i))?;
        let tail = &request.messages[index..];
        let marked = tail
            .iter()
            .map(anthropic::cache::message_breakpoints)
            .sum::<usize>()
            > 0;
        (starts_message && marked && before.role == "assistant").then_some(tail.len())
    }

    /// The in-place rebuild of [`rebuild_with`](Self::rebuild_with), with
    /// the client's breakpoints on the last `tail` messages moved; `None`
    /// when it does not apply.
    fn rebuild_in_place(
        &mut self,
        output: &[Message],
        raw: &[&RawValue],
        tail: Option<usize>,
    ) -> Option<Rebuilt> {
        let hashes = &self.hashes.as_ref()?.1;
        if hashes.len() != raw.len() || output.len() != self.chat().len() {
            return None;
        }
        let steps = crate::bridge::align(self.chat(), output);
        let in_place = steps.iter().enumerate().all(|(k, s)| s.source() == Some(k));
        if !in_place || steps.len() != output.len() {
            return None;
        }
        let mut json =
            String::with_capacity(raw.iter().map(|r| r.get().len() + 1).sum::<usize>() + 2);
        json.push('[');
        let mut w = InPlace {
            steps: &steps,
            output,
            raw,
            hashes,
            memo: std::mem::take(&mut self.memo),
            next: HashMap::new(),
            json,
        };
        let field = match &self.inner {
            Inner::Anthropic { request, bridged } => {
                anthropic_in_place(request, bridged, tail, &mut w)?;
                "messages"
            }
            Inner::Responses { request, bridged } => {
                responses_in_place(request, bridged, &mut w)?;
                "input"
            }
        };
        w.json.push(']');
        self.memo = w.next;
        Some(Rebuilt {
            fields: vec![(field, w.json)],
            marked_prefix: false,
        })
    }

    /// The whole rebuild: the engine's output through the bridge, the
    /// API's rules on the result.
    fn rebuild_whole(
        &self,
        output: &[Message],
        raw: Option<&[&RawValue]>,
        tail: Option<usize>,
    ) -> Result<Rebuilt, Violation> {
        if output == self.chat() && tail.is_none() {
            return Ok(Rebuilt::default());
        }
        let prefix_end = last_new(self.chat(), output);
        match &self.inner {
            Inner::Anthropic { request, bridged } => {
                let raw = raw.filter(|r| r.len() == request.messages.len());
                let (mut out, mut sources) =
                    anthropic::bridge::from_chat_traced(request, bridged, output);
                let after = validate::anthropic::validate(&out);
                if !after.is_empty()
                    && let Some(v) = introduced(validate::anthropic::validate(request), after)
                {
                    return Err(v);
                }
                if let Some(v) = validate::anthropic::thinking_changed(request, &out)
                    .into_iter()
                    .next()
                {
                    return Err(v);
                }
                let marked =
                    prefix_end.and_then(|t| anthropic::cache::mark_prefix_end_at(&mut out, &t));
                if let Some(s) = marked.and_then(|i| sources.get_mut(i)) {
                    *s = None;
                }
                if let Some(n) = tail {
                    for i in anthropic::cache::move_tail_breakpoints(&mut out.messages, n) {
                        if let Some(s) = sources.get_mut(i) {
                            *s = None;
                        }
                    }
                }
                let mut fields = Vec::with_capacity(2);
                if out.system != request.system {
                    fields.push(("system", to_json(&out.system)));
                }
                fields.push(("messages", splice(&out.messages, &sources, raw)));
                let marked_prefix = marked.is_some();
                Ok(Rebuilt {
                    fields,
                    marked_prefix,
                })
            }
            Inner::Responses { request, bridged } => {
                let raw = raw.filter(|r| r.len() == request.items().len());
                let (out, sources) = responses::bridge::from_chat_traced(request, bridged, output);
                let after = validate::responses::validate(&out);
                if !after.is_empty()
                    && let Some(v) = introduced(validate::responses::validate(request), after)
                {
                    return Err(v);
                }
                let mut fields = Vec::with_capacity(2);
                let instructions = out.extra.get("instructions");
                if instructions != request.extra.get("instructions")
                    && let Some(v) = instructions
                {
                    fields.push(("instructions", to_json(v)));
                }
                match &out.input {
                    responses::Input::Items(items) => {
                        fields.push(("input", splice(items, &sources, raw)));
                    }
                    text => fields.push(("input", to_json(text))),
                }
                Ok(Rebuilt {
                    fields,
                    marked_prefix: false,
                })
            }
        }
    }
}

/// The text of the summary the engine put in `output` (a message carrying
/// one that the client never sent): the end of the managed prefix.
fn last_new(input: &[Message], output: &[Message]) -> Option<String> {
    output
        .iter()
        .rev()
        .find(|m| is_summary(m) && !input.contains(m))
        .map(|m| m.content.text().into_owned())
        .filter(|t| !t.is_empty())
}

/// The first violation of `after` beyond those `before` already had (by
/// rule).
fn introduced(before: Vec<Violation>, after: Vec<Violation>) -> Option<Violation> {
    let mut budget: HashMap<_, usize> = HashMap::new();
    for v in before {
        *budget.entry(v.rule).or_default() += 1;
    }
    after.into_iter().find(|v| match budget.get_mut(&v.rule) {
        Some(n) if *n > 0 => {
            *n -= 1;
            false
        }
        _ => true,
    })
}

fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    // The models serialize without failing (string keys only).
    serde_json::to_string(value).unwrap_or_default()
}

/// The JSON array of `values`: an entry whose source (`sources[k]`) is
/// unchanged goes out as the client's text of that source (`raw`), the
/// others are serialized.
fn splice<T: Serialize>(
    values: &[T],
    sources: &[Option<usize>],
    raw: Option<&[&RawValue]>,
) -> String {
    let Some(raw) = raw else {
        return to_json(values);
    };
    let mut out = Vec::with_capacity(raw.iter().map(|r| r.get().len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (k, v) in values.iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        match sources.get(k).copied().flatten().and_then(|i| raw.get(i)) {
            Some(r) => out.extend_from_slice(r.get().as_bytes()),
            // The models serialize without failing (string keys only).
            None => {
                let _ = serde_json::to_writer(&mut out, v);
            }
        }
    }
    out.push(b']');
    String::from_utf8(out).unwrap_or_default()
}

/// What an in-place rebuild reads (the alignment, the engine's output, the
/// client's raw messages and their hashes) and writes (the output array's
/// text, the memo for the next rebuild).
struct InPlace<'a> {
    steps: &'a [crate::bridge::Step<'a>],
    output: &'a [Message],
    raw: &'a [&'a RawValue],
    hashes: &'a [u128],
    memo: HashMap<u128, Memo>,
    next: HashMap<u128, Memo>,
    json: String,
}

/// The Anthropic messages of an in-place rebuild, written into `w`, the
/// client's breakpoints on the last `tail` messages moved; `None` when it
/// does not apply.
fn anthropic_in_place(
    request: &anthropic::Request,
    bridged: &anthropic::bridge::Bridged,
    tail: Option<usize>,
    w: &mut InPlace<'_>,
) -> Option<()> {
    // The messages the moved breakpoints change, as they go out.
    let mut moved = HashMap::new();
    if let Some(n) = tail {
        let from = request.messages.len().checked_sub(n + 1)?;
        let mut last: Vec<anthropic::Message> = request.messages[from..].to_vec();
        for k in anthropic::cache::move_tail_breakpoints(&mut last, n) {
            moved.insert(from + k, to_json(&last[k]));
        }
    }
    // The system prompt comes first and must come back as it was.
    let system = usize::from(matches!(
        bridged.origins.first(),
        Some(anthropic::bridge::Origin::System)
    ));
    if system == 1 && w.steps[0] != crate::bridge::Step::Same(0) {
        return None;
    }
    let mut k = system;
    for (i, source) in request.messages.iter().enumerate() {
        let start = k;
        while matches!(bridged.origins.get(k), Some(anthropic::bridge::Origin::Message { index, .. }) if *index == i)
        {
            k += 1;
        }
        if start == k {
            return None;
        }
        if i > 0 {
            w.json.push(',');
        }
        let changes: Vec<(usize, &Message)> = w.steps[start..k]
            .iter()
            .filter_map(|s| match *s {
                crate::bridge::Step::Changed(j, m) => Some((j, m)),
                _ => None,
            })
            .collect();
        if let Some(text) = moved.remove(&i) {
            // The engine left it as it came (the tail is the
            // client's own): only its breakpoints differ.
            if !changes.is_empty() {
                return None;
            }
            w.json.push_str(&text);
            continue;
        }
        if changes.is_empty() {
            w.json.push_str(w.raw[i].get());
            continue;
        }
        let now = &w.output[start..k];
        let entry = match w.memo.remove(&w.hashes[i]) {
            Some(m) if m.output == now => m,
            _ => {
                let m = anthropic::bridge::patch_message(request, bridged, i, &changes)?;
                if !validate::anthropic::same_shape(source, &m) {
                    return None;
                }
                Memo {
                    output: now.to_vec(),
                    json: to_json(&m).into(),
                }
            }
        };
        w.json.push_str(&entry.json);
        w.next.insert(w.hashes[i], entry);
    }
    if k != bridged.origins.len() {
        return None;
    }
    Some(())
}

/// The Responses input items of an in-place rebuild, written into `w`;
/// `None` when it does not apply.
fn responses_in_place(
    request: &responses::Request,
    bridged: &responses::bridge::Bridged,
    w: &mut InPlace<'_>,
) -> Option<()> {
    let source = request.items();
    let mut first = true;
    let mut count = 0;
    for (j, step) in w.steps.iter().enumerate() {
        let list = match &bridged.origins[j] {
            responses::bridge::Origin::Items(list) => list,
            responses::bridge::Origin::Instructions if *step == crate::bridge::Step::Same(j) => {
                continue;
            }
            _ => return None,
        };
        count += list.len();
        let mut push = |json: &mut String, text: &str| {
            if !first {
                json.push(',');
            }
            first = false;
            json.push_str(text);
        };
        let crate::bridge::Step::Changed(_, now) = *step else {
            for &i in list {
                push(&mut w.json, w.raw.get(i)?.get());
            }
            continue;
        };
        let was = &bridged.messages[j];
        // Text for a turn with no message item adds an item.
        let carries_text = list.iter().any(|&i| {
            source.get(i).is_some_and(|it| {
                matches!(
                    it.kind(),
                    responses::ItemKind::Message { .. } | responses::ItemKind::Output { .. }
                )
            })
        });
        if !carries_text && was.content != now.content && !now.text().is_empty() {
            return None;
        }
        let mut key = Xxh3Default::new();
        for &i in list {
            key.update(&w.hashes.get(i)?.to_le_bytes());
        }
        let key = key.digest128();
        let entry = match w.memo.remove(&key) {
            Some(m) if m.output.len() == 1 && m.output[0] == *now => m,
            _ => {
                let mut text = String::new();
                for (n, &i) in list.iter().enumerate() {
                    if n > 0 {
                        text.push(',');
                    }
                    let item = source.get(i)?;
                    match responses::bridge::patch(item, was, now) {
                        Some(p) => {
                            if !validate::responses::same_shape(item, &p) {
                                return None;
                            }
                            text.push_str(&to_json(&p));
                        }
                        None => text.push_str(w.raw.get(i)?.get()),
                    }
                }
                Memo {
                    output: vec![now.clone()],
                    json: text.into(),
                }
            }
        };
        push(&mut w.json, &entry.json);
        w.next.insert(key, entry);
    }
    if count != source.len() {
        return None;
    }
    Some(())
}
