//! One reading of a body: a key twice in one object is refused, so that
//! the proxy (which reads the first) and a provider (which may take the
//! last) cannot answer different requests.
//!
//! [`duplicate_key`] scans a body the parser has already read (valid
//! JSON) once, building nothing: every object's keys, at every level (the
//! top level, a message or input item, its content blocks, a tool call's
//! `function`, …), are compared as the scan passes them. The scan finds
//! every quote in one `memchr` pass and reads only the bytes between
//! strings, so it costs less than the parser skipping the body. The keys are borrowed from the body (an escaped key alone is
//! unescaped); an object of many keys is checked through a set. On text
//! that is not JSON it answers nothing useful, and never panics.

use std::borrow::Cow;
use std::collections::HashSet;

/// Keys compared pairwise in an object before a set takes over.
const LINEAR_KEYS: usize = 16;

/// A key found twice, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuplicateKey {
    /// The key.
    pub key: String,
    /// The object's place in the body, e.g. `messages[3].content[0]`
    /// (empty: the top level).
    pub at: String,
}

/// An open object or array, and where the scan is in it.
enum Frame<'a> {
    Object {
        /// Where the object's keys start in the shared list.
        base: usize,
        /// The object's keys as a set, once it has many.
        set: Option<HashSet<Cow<'a, str>>>,
        /// The next string is a key.
        expect_key: bool,
    },
    Array {
        index: usize,
    },
}

/// The first key found twice in one object of `text` (see the module
/// docs); `None` when there is none.
pub fn duplicate_key(text: &str) -> Option<DuplicateKey> {
    let bytes = text.as_bytes();
    let mut stack: Vec<Frame<'_>> = Vec::with_capacity(16);
    // The keys of every open object, innermost last (no allocation per
    // object).
    let mut keys: Vec<Cow<'_, str>> = Vec::with_capacity(64);
    // Every quote of the body, in one pass: a string runs from a quote to
    // the next one not escaped; between strings only structure is read.
    let mut quotes = memchr::memchr_iter(b'"', bytes);
    let mut outside = 0;
    loop {
        let Some(open) = quotes.next() else {
            structure(
                bytes.get(outside..).unwrap_or_default(),
                &mut stack,
                &mut keys,
            );
            return None;
        };
        structure(bytes.get(outside..open)?, &mut stack, &mut keys);
        let close = loop {
            let q = quotes.next()?;
            // Escaped when an odd run of backslashes stands before it.
            let run = bytes
                .get(open + 1..q)?
                .iter()
                .rev()
                .take_while(|b| **b == b'\\')
                .count();
            if run % 2 == 0 {
                break q;
            }
        };
        outside = close + 1;
        let Some(Frame::Object {
            base,
            set,
            expect_key,
        }) = stack.last_mut()
        else {
            continue;
        };
        if !*expect_key {
            continue;
        }
        let key = key_text(text, open, close)?;
        let own = keys.get(*base..).unwrap_or_default();
        let twice = match set {
            Some(set) => !set.insert(key.clone()),
            None => own.contains(&key),
        };
        if twice {
            return Some(DuplicateKey {
                key: key.into_owned(),
                at: path(&stack, &keys),
            });
        }
        if set.is_none() && own.len() >= LINEAR_KEYS {
            let mut all: HashSet<Cow<'_, str>> = own.iter().cloned().collect();
            all.insert(key.clone());
            *set = Some(all);
        }
        keys.push(key);
        *expect_key = false;
    }
}

/// Reads the structure between two strings: objects and arrays opened and
/// closed, the commas between their members.
fn structure<'a>(between: &[u8], stack: &mut Vec<Frame<'a>>, keys: &mut Vec<Cow<'a, str>>) {
    for &b in between {
        match b {
            b'{' => stack.push(Frame::Object {
                base: keys.len(),
                set: None,
                expect_key: true,
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                if let Some(Frame::Object { base, .. }) = stack.pop() {
                    keys.truncate(base);
                }
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                Some(Frame::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
    }
}

/// The key whose quotes are at `open` and `close`: borrowed, or unescaped
/// when it holds an escape.
fn key_text(text: &str, open: usize, close: usize) -> Option<Cow<'_, str>> {
    let inner = text.get(open + 1..close)?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(text.get(open..=close)?)
        .ok()
        .map(Cow::Owned)
}

/// Where the innermost object is, e.g. `messages[3].content[0]`: the
/// frames around it, each object by the key the scan is in (its last).
fn path(stack: &[Frame<'_>], keys: &[Cow<'_, str>]) -> String {
    let mut out = String::new();
    let around = &stack[..stack.len().saturating_sub(1)];
    for (n, frame) in around.iter().enumerate() {
        match frame {
            Frame::Object { .. } => {
                // The object's last key: the one before the next object's
                // keys start (or the list's end).
                let next_base = around[n + 1..]
                    .iter()
                    .chain(stack.last())
                    .find_map(|f| match f {
                        Frame::Object { base, .. } => Some(*base),
                        Frame::Array { .. } => None,
                    })
                    .unwrap_or(keys.len());
                if let Some(k) = next_base.checked_sub(1).and_then(|at| keys.get(at)) {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
            }
            Frame::Array { index } => {
                out.push('[');
                out.push_str(&index.to_string());
                out.push(']');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(text: &str) -> Option<(String, String)> {
        duplicate_key(text).map(|d| (d.key, d.at))
    }

    #[test]
    fn a_key_twice_is_found_with_its_place() {
        let some = |k: &str, at: &str| Some((k.to_owned(), at.to_owned()));
        assert_eq!(
            dup(r#"{"messages":[],"model":"m","messages":[1]}"#),
            some("messages", "")
        );
        assert_eq!(
            dup(r#"{"messages":[{"role":"user","content":"a","content":"b"}]}"#),
            some("content", "messages[0]")
        );
        assert_eq!(
            dup(
                r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}"#
            ),
            some("text", "messages[0].content[0]")
        );
        // An escaped spelling of the same key is the same key.
        assert_eq!(dup(r#"{"model":"a","mod\u0065l":"b"}"#), some("model", ""));
        // Many keys: the set finds it too.
        let mut many: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{i}")).collect();
        many.push("\"k3\":0".into());
        assert_eq!(dup(&format!("{{{}}}", many.join(","))), some("k3", ""));
        for fine in [
            r#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}"#,
            r#"{"a":{"a":{"a":1}}}"#,
            "not json",
            "[]",
        ] {
            assert_eq!(dup(fine), None, "{fine}");
        }
        // At any depth.
        let deep = format!("{}{{\"x\":1,\"x\":2}}{}", "[".repeat(40), "]".repeat(40));
        assert_eq!(dup(&deep).map(|d| d.0), Some("x".to_owned()));
        // Strings that look like structure are strings.
        assert_eq!(dup(r#"{"a":"\",\"a\":","b":"}{[\\"}"#), None);
        assert_eq!(dup(r#"{"a\\":1,"a":2}"#), None);
        // Broken text: no panic.
        for broken in ["{\"a", "\"", "{\"a\":\"\\", "}}]]", "{\"a\":1,\"a"] {
            let _ = dup(broken);
        }
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    use super::duplicate_key;

    /// Any JSON value, with keys and strings full of quotes, backslashes,
    /// braces and escapes.
    fn value() -> impl Strategy<Value = Value> {
        let text = "[a-c\"\\\\{}\\[\\],:\\n\u{e9}]{0,6}";
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(Value::from),
            text.prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((text, inner), 0..5)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    proptest! {
        /// A value's own text (a map holds a key once) has no duplicate;
        /// the same text with one object's first member written twice has
        /// exactly that key twice.
        #[test]
        fn found_exactly_when_a_key_is_written_twice(v in value()) {
            let text = serde_json::to_string(&v).unwrap_or_default();
            prop_assert_eq!(duplicate_key(&text), None, "{}", text);
            let wrapped = Value::Object(
                [("k\"{".to_owned(), v.clone()), ("z".to_owned(), v)].into_iter().collect(),
            );
            let text = serde_json::to_string(&wrapped).unwrap_or_default();
            // The first member again, at the end of the top level.
            let first = serde_json::to_string(&wrapped["k\"{"]).unwrap_or_default();
            let doubled = format!("{},\"k\\\"{{\":{first}}}", &text[..text.len() - 1]);
            let found = duplicate_key(&doubled);
            prop_assert_eq!(found.map(|d| (d.key, d.at)), Some(("k\"{".to_owned(), String::new())), "{}", doubled);
        }
    }
}
