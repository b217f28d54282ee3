//! One reading of a body: a key twice in one object is refused, so that
//! the proxy (which reads the first) and a provider (which may take the
//! last) cannot answer different requests.
//!
//! [`duplicate_key`] walks the body once, without building it: every
//! object down to [`CHECKED_DEPTH`] levels (the top level, a message or
//! input item, its content blocks and their tool results' blocks, a tool
//! call's `function`) has its keys compared; what lies deeper is skipped
//! unread, as are strings and numbers. The keys are borrowed from the body
//! (an escaped key alone is unescaped); an object of many keys is checked
//! through a set.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Object levels checked, counting arrays: `{"messages": [{"content":
/// [{…}]}]}` holds objects at levels 0, 2 and 4.
pub const CHECKED_DEPTH: usize = 8;

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

/// The first key found twice in one object of `text` (see the module
/// docs); `None` when there is none, or when `text` is not JSON (that is
/// for the parser to say).
pub fn duplicate_key(text: &str) -> Option<DuplicateKey> {
    let found = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let walk = Walk {
        depth: 0,
        path: &Path::Root,
        found: &found,
    };
    let _ = walk.deserialize(&mut de);
    found.into_inner()
}

/// Where a value is: the chain of keys and indices from the top.
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, k) => write!(f, "{k}"),
            Path::Key(up, k) => write!(f, "{up}.{k}"),
            Path::Index(up, i) => write!(f, "{up}[{i}]"),
        }
    }
}

#[derive(Clone, Copy)]
struct Walk<'p, 'f> {
    depth: usize,
    path: &'p Path<'p>,
    found: &'f RefCell<Option<DuplicateKey>>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.depth > CHECKED_DEPTH {
            return d.deserialize_ignored_any(IgnoredAny).map(|_| ());
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            let path = Path::Index(self.path, i);
            let inner = Walk {
                depth: self.depth + 1,
                path: &path,
                found: self.found,
            };
            if seq.next_element_seed(inner)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys: Vec<Cow<'de, str>> = Vec::new();
        let mut set: Option<HashSet<Cow<'de, str>>> = None;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let twice = match &mut set {
                Some(set) => !set.insert(key.clone()),
                None => keys.contains(&key),
            };
            if twice {
                *self.found.borrow_mut() = Some(DuplicateKey {
                    key: key.into_owned(),
                    at: self.path.to_string(),
                });
                return Err(serde::de::Error::custom("duplicate key"));
            }
            let path = Path::Key(self.path, &key);
            map.next_value_seed(Walk {
                depth: self.depth + 1,
                path: &path,
                found: self.found,
            })?;
            match &mut set {
                Some(_) => {}
                None if keys.len() < LINEAR_KEYS => keys.push(key),
                None => {
                    let mut all: HashSet<Cow<'de, str>> = keys.drain(..).collect();
                    all.insert(key);
                    set = Some(all);
                }
            }
        }
        Ok(())
    }
}

/// A key, borrowed from the body unless it holds an escape.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
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
        // Deeper than the checked levels: skipped.
        let deep = format!(
            "{}{{\"x\":1,\"x\":2}}{}",
            "[".repeat(CHECKED_DEPTH + 1),
            "]".repeat(CHECKED_DEPTH + 1)
        );
        assert_eq!(dup(&deep), None);
    }
}
