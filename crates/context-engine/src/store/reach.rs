//! What of the archive a request can reach: the archived messages behind
//! every handle the request names, and behind the handles those messages
//! name in turn (a span holds the previous summary, which names older
//! spans). Retention counts a fact `recallable` only there.

use std::collections::HashSet;

use aho_corasick::AhoCorasick;

use super::{SessionStore, StoreError};
use crate::message::Message;

/// The archived messages of `session` reachable from `view` through the
/// handles it names (in message text, tool-call ids or arguments),
/// transitively; each message once, in the order found.
pub fn reachable(
    store: &dyn SessionStore,
    session: &str,
    view: &[Message],
) -> Result<Vec<Message>, StoreError> {
    let handles = store.handles(session)?;
    if handles.is_empty() {
        return Ok(Vec::new());
    }
    let Ok(finder) = AhoCorasick::new(&handles) else {
        return Ok(Vec::new());
    };
    let mut queue: Vec<usize> = Vec::new();
    let mut named: HashSet<usize> = HashSet::new();
    let mut scan = |m: &Message, queue: &mut Vec<usize>| {
        let mut text = crate::retention::searchable(m, &m.text());
        if let Some(id) = &m.tool_call_id {
            text.push(' ');
            text.push_str(id);
        }
        for hit in finder.find_overlapping_iter(&text) {
            let i = hit.pattern().as_usize();
            // Whole handles only: `call_1` must not match inside `call_12`.
            let before = text[..hit.start()].chars().next_back();
            let after = text[hit.end()..].chars().next();
            let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
            if boundary(before) && boundary(after) && named.insert(i) {
                queue.push(i);
            }
        }
    };
    for m in view {
        scan(m, &mut queue);
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    while let Some(i) = queue.pop() {
        let Some(entry) = store.resolve(Some(session), &handles[i])? else {
            continue;
        };
        for m in entry.messages {
            let hash = super::message_hash(&m);
            if seen.insert(hash) {
                scan(&m, &mut queue);
                out.push(m);
            }
        }
    }
    Ok(out)
}
