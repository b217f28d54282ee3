//! What of the archive a request can reach: the archived messages behind
//! every handle the request names, and behind the handles those messages
//! name in turn (a span holds the previous summary, which names older
//! spans). Retention counts a fact `recallable` only there.

use std::collections::{HashMap, HashSet};

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
    Reach::new(store, session)?.from(view)
}

/// [`reachable`] for many views of one session's archive (a replay checks
/// the request after each compaction): the handles are read and their
/// finder built once, and each handle is resolved once.
pub struct Reach<'s> {
    store: &'s dyn SessionStore,
    session: String,
    handles: Vec<String>,
    finder: Option<AhoCorasick>,
    resolved: HashMap<usize, Vec<(String, Message)>>,
}

impl<'s> Reach<'s> {
    /// The archive of `session` as it is now (handles added later are not
    /// followed).
    pub fn new(store: &'s dyn SessionStore, session: &str) -> Result<Reach<'s>, StoreError> {
        let handles = store.handles(session)?;
        let finder = (!handles.is_empty())
            .then(|| AhoCorasick::new(&handles).ok())
            .flatten();
        Ok(Reach {
            store,
            session: session.to_owned(),
            handles,
            finder,
            resolved: HashMap::new(),
        })
    }

    /// The archived messages reachable from `view` (see [`reachable`]).
    pub fn from(&mut self, view: &[Message]) -> Result<Vec<Message>, StoreError> {
        let Some(finder) = &self.finder else {
            return Ok(Vec::new());
        };
        let mut queue: Vec<usize> = Vec::new();
        let mut named: HashSet<usize> = HashSet::new();
        let scan = |m: &Message, queue: &mut Vec<usize>, named: &mut HashSet<usize>| {
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
                let boundary =
                    |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                if boundary(before) && boundary(after) && named.insert(i) {
                    queue.push(i);
                }
            }
        };
        for m in view {
            scan(m, &mut queue, &mut named);
        }
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        while let Some(i) = queue.pop() {
            if !self.resolved.contains_key(&i) {
                let messages = match self.store.resolve(Some(&self.session), &self.handles[i])? {
                    Some(entry) => entry
                        .messages
                        .into_iter()
                        .map(|m| (super::message_hash(&m), m))
                        .collect(),
                    None => Vec::new(),
                };
                self.resolved.insert(i, messages);
            }
            for (hash, m) in self.resolved.get(&i).into_iter().flatten() {
                if seen.insert(hash.clone()) {
                    scan(m, &mut queue, &mut named);
                    out.push(m.clone());
                }
            }
        }
        Ok(out)
    }
}
