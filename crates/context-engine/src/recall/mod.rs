//! The engine tools that bring back what the request no longer shows, in
//! one place: `context_recall` (the exact original text behind a handle),
//! `context_search` (full-text search with handles) and `context_expand`
//! (a summary's underlying messages, or a digested result's full body, a
//! page at a time).
//!
//! Every answer comes from the live history first (a digested result is
//! still there whole), then from the session store's archive (what a
//! compaction or prune removed). Answers are JSON strings; bad arguments,
//! unknown handles and empty queries are `{"error": …}` that say what to
//! do, and large answers are bounded ([`MAX_ANSWER_BYTES`]) with the handle
//! to continue from.

mod error;
mod history;

use serde_json::{Value, json};

use crate::message::Message;
use crate::store::text::index_text;
use crate::store::{
    Entry, EntryKind, MatchedLine, SearchHit, SessionStore, Terms, message_handle, message_hash,
};

pub use error::RecallError;
pub use history::{LineRange, recall};

/// The names of the tools (words the digest, prune and archive notes
/// show, so they live with those).
pub use crate::tool_output::{EXPAND_TOOL, RECALL_TOOL, SEARCH_TOOL};

/// Largest `content` (or page of messages) one answer carries, in bytes;
/// the rest comes with the continuation the answer names.
pub const MAX_ANSWER_BYTES: usize = 32 * 1024;
/// Hits a search returns when the call does not say.
pub const DEFAULT_SEARCH_LIMIT: usize = 10;
/// Most hits a search returns.
pub const MAX_SEARCH_LIMIT: usize = 50;

/// Where the tools look: the live history, then the session's archive.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    /// The stored history (not a request view).
    pub history: &'a [Message],
    /// The session store, when one is attached.
    pub store: Option<&'a dyn SessionStore>,
    /// The session whose archive is searched.
    pub session: &'a str,
}

impl<'a> Sources<'a> {
    /// The live history alone.
    pub fn history(history: &'a [Message]) -> Sources<'a> {
        Sources {
            history,
            store: None,
            session: "",
        }
    }

    /// The history, then `store`'s archive of `session`.
    pub fn with_store(mut self, store: &'a dyn SessionStore, session: &'a str) -> Sources<'a> {
        self.store = Some(store);
        self.session = session;
        self
    }
}

/// Whether `name` is one of these tools.
pub fn is_tool(name: &str) -> bool {
    matches!(name, RECALL_TOOL | SEARCH_TOOL | EXPAND_TOOL)
}

/// The schemas of the three tools (for a host with a store).
pub fn tool_schemas() -> Vec<Value> {
    vec![
        recall_tool_schema(),
        search_tool_schema(),
        expand_tool_schema(),
    ]
}

/// Answers a call to one of the tools (see the module docs); an unknown
/// name is an error answer.
pub fn handle_tool_call(name: &str, args: &Value, sources: Sources<'_>) -> String {
    let answer = match name {
        RECALL_TOOL => recall_answer(args, sources),
        SEARCH_TOOL => search_answer(args, sources),
        EXPAND_TOOL => expand_answer(args, sources),
        _ => Err(RecallError::UnknownTool {
            name: name.to_owned(),
        }),
    };
    match answer {
        Ok(v) => v.to_string(),
        Err(e) => json!({ "error": e.to_string() }).to_string(),
    }
}

/// Answers a `context_recall` call from the live history alone: a JSON
/// string with `handle`, `content`, `total_lines` and the `lines` returned,
/// or `{"error": …}`. An engine's `handle_tool_call` delegates here.
pub fn handle_recall_call(messages: &[Message], args: &Value) -> String {
    handle_tool_call(RECALL_TOOL, args, Sources::history(messages))
}

/// The chat-completions schema of `context_recall`.
pub fn recall_tool_schema() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": RECALL_TOOL,
            "description": "Return the exact original text behind a handle: an earlier tool result \
    the conversation shows only as a one-line digest or pruned line, or a span of messages a \
    context summary replaced (the summary names its handle). Optionally a 1-based inclusive line \
    range to read part of a long text.",
            "parameters": {
                "type": "object",
                "properties": {
                    "handle": {
                        "type": "string",
                        "description": "The handle from the digest line or the summary (a tool call id, an h… or m… hash, or an s… span handle)."
                    },
                    "start_line": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "First line to return (1-based). Default: 1."
                    },
                    "end_line": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Last line to return, inclusive. Default: the last line."
                    },
                    "lines": {
                        "type": "string",
                        "description": "The line range as text instead: \"120-180\" or \"120\"."
                    }
                },
                "required": ["handle"],
                "additionalProperties": false
            }
        }
    })
}

/// The chat-completions schema of `context_search`.
pub fn search_tool_schema() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": SEARCH_TOOL,
            "description": "Search this conversation, including the parts compacted away, for \
    words (file names, error text, commands). Returns, per message found (best first), the lines \
    that hold the words with their line numbers, and a handle: context_recall with it returns the \
    whole message (start_line/end_line: part of it), context_expand pages it.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "Words to find; all must match (each word as written, e.g. test_io.py)."
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_SEARCH_LIMIT,
                        "description": "Most hits to return. Default: 10."
                    }
                },
                "required": ["query"],
                "additionalProperties": false
            }
        }
    })
}

/// The chat-completions schema of `context_expand`.
pub fn expand_tool_schema() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": EXPAND_TOOL,
            "description": "Show what a handle stands for: the messages a context summary replaced \
    (its s… handle), or the full body of a digested tool result, one page at a time. A long \
    answer names the handle to pass next.",
            "parameters": {
                "type": "object",
                "properties": {
                    "handle": {
                        "type": "string",
                        "description": "A handle from a summary, a digest line, a search hit, or a previous answer's `next`."
                    }
                },
                "required": ["handle"],
                "additionalProperties": false
            }
        }
    })
}

/// The text behind `handle`, and where it was found.
struct Found {
    text: String,
    source: &'static str,
    entry: Option<Entry>,
}

fn handle_arg(args: &Value) -> Result<&str, RecallError> {
    match args.get("handle").and_then(Value::as_str).map(str::trim) {
        Some(h) if !h.is_empty() => Ok(h),
        _ => Err(RecallError::MissingHandle),
    }
}

/// Looks `handle` up in the live history, then the archive.
fn find(handle: &str, sources: Sources<'_>) -> Result<Found, RecallError> {
    let live = history::find(sources.history, handle);
    let live = match live {
        Ok(text) => {
            return Ok(Found {
                text,
                source: "history",
                entry: None,
            });
        }
        Err(e) => e,
    };
    let Some(store) = sources.store else {
        return Err(live);
    };
    let entry = store
        .resolve(Some(sources.session), handle)?
        .ok_or_else(|| RecallError::NotArchived {
            handle: handle.to_owned(),
        })?;
    let text = match entry.kind {
        EntryKind::Message => history::find(&entry.messages, handle)
            .unwrap_or_else(|_| entry.messages.iter().map(render_one).collect()),
        EntryKind::Span => render(&entry.messages),
    };
    Ok(Found {
        text,
        source: "archive",
        entry: Some(entry),
    })
}

/// One message as text: its role, content and tool calls.
fn render_one(m: &Message) -> String {
    let mut out = format!("[{}", m.role.as_str());
    if let Some(id) = &m.tool_call_id {
        out.push_str(&format!(" result of {id}"));
    }
    out.push_str("]\n");
    out.push_str(&m.text());
    for call in m.tool_calls() {
        if let Some(f) = &call.function {
            out.push_str(&format!("\n→ {} {}", f.name, f.arguments));
        }
    }
    out
}

fn render(messages: &[Message]) -> String {
    messages
        .iter()
        .map(render_one)
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn line_arg(args: &Value, key: &'static str) -> Result<Option<usize>, RecallError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or(RecallError::NotPositive { key }),
    }
}

/// The line range of a recall call: `start_line`/`end_line`, or `lines`
/// as `"a-b"` or `"a"`.
fn range_arg(args: &Value) -> Result<Option<LineRange>, RecallError> {
    let (mut start, mut end) = (line_arg(args, "start_line")?, line_arg(args, "end_line")?);
    if let Some(lines) = args.get("lines").filter(|v| !v.is_null()) {
        let bad = || RecallError::BadLines {
            given: lines.to_string(),
        };
        let text = lines.as_str().ok_or_else(bad)?;
        let (a, b) = text.split_once('-').unwrap_or((text, text));
        let parse = |s: &str| s.trim().parse::<usize>().ok().filter(|n| *n > 0);
        start = Some(parse(a).ok_or_else(bad)?);
        end = if b.trim().is_empty() {
            None
        } else {
            Some(parse(b).ok_or_else(bad)?)
        };
    }
    Ok((start.is_some() || end.is_some()).then_some(LineRange {
        start: start.unwrap_or(1),
        end,
    }))
}

/// Lines `from..` (1-based) of `lines` that fit in [`MAX_ANSWER_BYTES`]
/// (at least one, clipped at a character boundary if it alone is larger):
/// the text and the last line included.
fn page(lines: &[&str], from: usize, until: usize) -> (String, usize, bool) {
    let mut out = String::new();
    let mut last = from.saturating_sub(1);
    let mut clipped = false;
    for (k, line) in lines.iter().enumerate().take(until).skip(from - 1) {
        if !out.is_empty() && out.len() + line.len() > MAX_ANSWER_BYTES {
            break;
        }
        if line.len() > MAX_ANSWER_BYTES {
            let mut cut = MAX_ANSWER_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            out.push_str(&line[..cut]);
            clipped = true;
        } else {
            out.push_str(line);
        }
        last = k + 1;
    }
    (out, last, clipped)
}

fn recall_answer(args: &Value, sources: Sources<'_>) -> Result<Value, RecallError> {
    let handle = handle_arg(args)?;
    let range = range_arg(args)?;
    let found = find(handle, sources)?;
    let lines: Vec<&str> = found.text.split_inclusive('\n').collect();
    let total = lines.len();
    let (first, until) = match range {
        None => (1, total),
        Some(r) => {
            let last = r.end.unwrap_or(total).min(total);
            if r.start == 0 || r.start > last {
                return Err(RecallError::BadRange {
                    handle: handle.to_owned(),
                    start: r.start,
                    end: r.end.unwrap_or(total),
                    lines: total,
                });
            }
            (r.start, last)
        }
    };
    let (content, last, clipped) = page(&lines, first.max(1), until);
    let mut answer = json!({
        "handle": handle,
        "source": found.source,
        "total_lines": total,
        "lines": [first.min(total), last],
        "content": content,
    });
    if last < until || clipped {
        answer["truncated"] = json!(true);
        answer["next"] = json!({ "handle": handle, "start_line": last + 1 });
    }
    Ok(answer)
}

fn search_answer(args: &Value, sources: Sources<'_>) -> Result<Value, RecallError> {
    let query = args
        .get("query")
        .and_then(Value::as_str)
        .ok_or(RecallError::MissingQuery)?;
    let terms = Terms::new(query);
    if terms.is_empty() {
        return Err(RecallError::EmptyQuery);
    }
    let limit = match args.get("limit") {
        None | Some(Value::Null) => DEFAULT_SEARCH_LIMIT,
        Some(v) => v
            .as_u64()
            .filter(|n| *n > 0)
            .map(|n| {
                usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .min(MAX_SEARCH_LIMIT)
            })
            .ok_or(RecallError::NotPositive { key: "limit" })?,
    };
    // The live history (newest first) and the archive share the limit:
    // live text is mostly in the request already, so it gets at most half
    // while the archive has hits.
    let mut live = Vec::new();
    for (i, m) in sources.history.iter().enumerate().rev() {
        if live.len() == limit {
            break;
        }
        let text = index_text(m);
        if terms.matches(&text, true) {
            let mut hit = json!({
                "source": "history",
                "message": i,
                "role": m.role.as_str(),
            });
            if let Some(h) = crate::store::handle::result_handles(m).into_iter().next() {
                hit["handle"] = json!(h);
            }
            hit["lines"] = shown_lines(&terms.lines(&text));
            live.push(hit);
        }
    }
    let archived: Vec<Value> = match sources.store {
        Some(store) => store
            .search(Some(sources.session), query, limit)?
            .iter()
            .map(archived_hit)
            .collect(),
        None => Vec::new(),
    };
    let live_share = if archived.is_empty() {
        limit
    } else {
        limit.div_ceil(2).max(limit.saturating_sub(archived.len()))
    };
    let mut hits: Vec<Value> = live.into_iter().take(live_share).collect();
    let room = limit - hits.len();
    hits.extend(archived.into_iter().take(room));
    Ok(json!({ "query": query, "hits": hits }))
}

/// An archive hit as the agent reads it: the handle that recalls the whole
/// message, where it was archived, and the lines that matched.
fn archived_hit(hit: &SearchHit) -> Value {
    json!({
        "source": hit.source,
        "handle": hit.handle,
        "role": hit.role,
        "spans": hit.spans,
        "lines": shown_lines(&hit.lines),
    })
}

/// Matched lines as the agent reads them: number and text (the byte
/// ranges are for a page that highlights them).
fn shown_lines(lines: &[MatchedLine]) -> Value {
    lines
        .iter()
        .map(|l| json!({ "line": l.line, "text": l.text }))
        .collect()
}

fn expand_answer(args: &Value, sources: Sources<'_>) -> Result<Value, RecallError> {
    let raw = handle_arg(args)?;
    // A continuation is `handle#n`: message n (a span) or line n (a body).
    let (handle, from) = match raw.rsplit_once('#') {
        Some((h, n)) => (
            h,
            n.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
                RecallError::BadContinuation {
                    asked: raw.to_owned(),
                }
            })?,
        ),
        None => (raw, 1),
    };
    let found = find(handle, sources)?;
    match &found.entry {
        Some(entry) if entry.kind == EntryKind::Span => {
            expand_span(handle, from, entry, found.source)
        }
        _ => {
            let lines: Vec<&str> = found.text.split_inclusive('\n').collect();
            let total = lines.len();
            if from > total.max(1) {
                return Err(RecallError::PastEnd {
                    asked: raw.to_owned(),
                    what: "text",
                    total,
                    unit: "line",
                });
            }
            let (content, last, clipped) = page(&lines, from, total);
            let mut answer = json!({
                "handle": handle,
                "kind": "body",
                "source": found.source,
                "total_lines": total,
                "lines": [from, last],
                "content": content,
            });
            if last < total || clipped {
                answer["next"] = json!(format!("{handle}#{}", last + 1));
            }
            Ok(answer)
        }
    }
}

fn expand_span(
    handle: &str,
    from: usize,
    entry: &Entry,
    source: &str,
) -> Result<Value, RecallError> {
    let total = entry.messages.len();
    if from > total {
        return Err(RecallError::PastEnd {
            asked: format!("{handle}#{from}"),
            what: "span",
            total,
            unit: "message",
        });
    }
    let mut used = 0;
    let mut shown = Vec::new();
    let mut next = None;
    for (k, m) in entry.messages.iter().enumerate().skip(from - 1) {
        let text = render_one(m);
        if !shown.is_empty() && used + text.len() > MAX_ANSWER_BYTES {
            next = Some(k + 1);
            break;
        }
        used += text.len();
        let mut item = json!({ "n": k + 1, "role": m.role.as_str() });
        if text.len() > MAX_ANSWER_BYTES {
            let (clip, _, _) = page(
                &text.split_inclusive('\n').collect::<Vec<_>>(),
                1,
                usize::MAX,
            );
            item["text"] = json!(clip);
            item["clipped"] = json!(true);
            item["recall"] = json!(message_handle(&message_hash(m)));
        } else {
            item["text"] = json!(text);
        }
        shown.push(item);
    }
    let mut answer = json!({
        "handle": handle,
        "kind": "span",
        "source": source,
        "total_messages": total,
        "messages": shown,
    });
    if let (Some(s), Some(e)) = (entry.start, entry.end) {
        answer["span"] = json!([s, e]);
    }
    if let Some(n) = next {
        answer["next"] = json!(format!("{handle}#{n}"));
    }
    Ok(answer)
}

#[cfg(test)]
mod tests;
