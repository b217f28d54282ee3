//! YAML text to a JSON tree plus the position of every node.
//!
//! The layers are merged as `serde_json::Value`s and deserialized once, so
//! that a wrong type coming from a file, a variable or a flag is reported the
//! same way; this module keeps the file's line and column of each node so
//! that the report (and the unknown-key warning) can point into the file.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use serde_saphyr::Spanned;

/// Line and column (1-based) of a node in a YAML text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: u64,
    pub column: u64,
}

/// A YAML node as deserialized by `serde-saphyr`, positions kept.
#[derive(Debug)]
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<String>, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::UInt(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            let value = map.next_value::<Spanned<Node>>()?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

/// A parsed YAML document: the value and the position of each node, keyed
/// by dotted path (see [`join`]); for a mapping entry the position is the
/// key's, which is where a reader looks.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    pub value: Value,
    pub positions: BTreeMap<String, Pos>,
}

/// A YAML syntax error with its position, when known.
#[derive(Debug)]
pub(crate) struct SyntaxError {
    pub pos: Option<Pos>,
    pub message: String,
}

/// YAML 1.2 booleans only: `no`, `y` or `off` stay strings (a model or
/// engine name must not turn into `false`).
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! { strict_booleans: true }
}

/// Parses one YAML document.
pub(crate) fn parse(text: &str) -> Result<Tree, SyntaxError> {
    let root: Spanned<Node> =
        serde_saphyr::from_str_with_options(text, options()).map_err(|e| SyntaxError {
            pos: e.location().and_then(|l| {
                (l.line() > 0).then_some(Pos {
                    line: l.line(),
                    column: l.column(),
                })
            }),
            message: strip_position(e.without_snippet().to_string()),
        })?;
    let mut tree = Tree::default();
    let pos = pos_of(&root);
    tree.value = convert(root.value, &mut Vec::new(), pos, &mut tree.positions);
    Ok(tree)
}

/// Parses a variable's or a flag's value as a YAML value; text that is not
/// valid YAML is taken as a plain string.
pub(crate) fn parse_scalar(text: &str) -> Value {
    match serde_saphyr::from_str_with_options::<Node>(text, options()) {
        Ok(node) => convert_plain(node),
        Err(_) => Value::String(text.to_owned()),
    }
}

/// The parser ends its message with the position, which the error already
/// gives as `FILE:LINE:COLUMN`.
fn strip_position(message: String) -> String {
    match message.rfind(" at line ") {
        Some(i) if message[i..].contains(", column ") => message[..i].to_owned(),
        _ => message,
    }
}

fn pos_of<T>(s: &Spanned<T>) -> Pos {
    Pos {
        line: s.referenced.line(),
        column: s.referenced.column(),
    }
}

fn convert(
    node: Node,
    path: &mut Vec<String>,
    pos: Pos,
    positions: &mut BTreeMap<String, Pos>,
) -> Value {
    if !path.is_empty() {
        positions.insert(join(path), pos);
    }
    match node {
        Node::Seq(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                path.push(i.to_string());
                let p = pos_of(&item);
                out.push(convert(item.value, path, p, positions));
                path.pop();
            }
            Value::Array(out)
        }
        Node::Map(entries) => {
            let mut out = Map::new();
            for (key, value) in entries {
                let p = pos_of(&key);
                path.push(key.value.clone());
                let v = convert(value.value, path, p, positions);
                path.pop();
                out.insert(key.value, v);
            }
            Value::Object(out)
        }
        scalar => convert_plain(scalar),
    }
}

fn convert_plain(node: Node) -> Value {
    match node {
        Node::Null => Value::Null,
        Node::Bool(b) => Value::Bool(b),
        Node::Int(i) => Value::from(i),
        Node::UInt(u) => Value::from(u),
        Node::Float(f) => {
            Number::from_f64(f).map_or_else(|| Value::String(f.to_string()), Value::Number)
        }
        Node::Str(s) => Value::String(s),
        Node::Seq(items) => {
            Value::Array(items.into_iter().map(|i| convert_plain(i.value)).collect())
        }
        Node::Map(entries) => Value::Object(
            entries
                .into_iter()
                .map(|(k, v)| (k.value, convert_plain(v.value)))
                .collect(),
        ),
    }
}

/// Dotted form of a path: segments joined by `.`, a segment that contains
/// a `.`, a `"` or is empty written in double quotes (`context.model_thresholds."gpt-4.1"`),
/// the form `--set` accepts back.
pub(crate) fn join<S: AsRef<str>>(path: &[S]) -> String {
    let mut out = String::new();
    for (i, seg) in path.iter().enumerate() {
        let seg = seg.as_ref();
        if i > 0 {
            out.push('.');
        }
        if seg.is_empty() || seg.contains(['.', '"', '=']) {
            out.push('"');
            out.push_str(&seg.replace('"', "\\\""));
            out.push('"');
        } else {
            out.push_str(seg);
        }
    }
    out
}

/// Splits a dotted path written by a user (`a.b."c.d"`); `None` when a
/// quote is not closed or a segment is empty.
pub(crate) fn split(path: &str) -> Option<Vec<String>> {
    let mut segs = Vec::new();
    let mut chars = path.chars().peekable();
    loop {
        let mut seg = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' if chars.peek() == Some(&'"') => {
                        chars.next();
                        seg.push('"');
                    }
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => seg.push(c),
                }
            }
            if !closed {
                return None;
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                seg.push(c);
                chars.next();
            }
            if seg.is_empty() {
                return None;
            }
        }
        segs.push(seg);
        match chars.next() {
            None => return Some(segs),
            Some('.') => {}
            Some(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_of_keys_and_items() {
        let t = parse("a:\n  b: 1\n  c:\n    - x\n    - y\nd: true\n").unwrap();
        assert_eq!(t.value["a"]["c"][1], "y");
        assert_eq!(t.positions["a.b"], Pos { line: 2, column: 3 });
        assert_eq!(t.positions["a.c.1"].line, 5);
        assert_eq!(t.positions["d"].line, 6);
    }

    #[test]
    fn scalars_typed_like_yaml() {
        assert_eq!(parse_scalar("0.6"), serde_json::json!(0.6));
        assert_eq!(parse_scalar("true"), serde_json::json!(true));
        assert_eq!(parse_scalar("openai"), serde_json::json!("openai"));
        assert_eq!(parse_scalar("no"), serde_json::json!("no"));
        assert_eq!(parse_scalar("[a, b]"), serde_json::json!(["a", "b"]));
        assert_eq!(parse_scalar("\"12\""), serde_json::json!("12"));
    }

    #[test]
    fn syntax_error_has_line() {
        let e = parse("a: 1\nb: [1, 2\n").unwrap_err();
        assert_eq!(e.pos.map(|p| p.line), Some(2), "{e:?}");
        assert!(!e.message.contains("at line"), "{}", e.message);
    }

    #[test]
    fn dotted_paths_round_trip() {
        let p = vec![
            "context".to_owned(),
            "model_thresholds".into(),
            "gpt-4.1".into(),
        ];
        let s = join(&p);
        assert_eq!(s, "context.model_thresholds.\"gpt-4.1\"");
        assert_eq!(split(&s).unwrap(), p);
        assert_eq!(split("a..b"), None);
        assert_eq!(split("a.\"b"), None);
    }
}
