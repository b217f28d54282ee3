//! Clipping the long string leaves of old tool-call arguments (file bodies
//! written by `create`, long `new_str`s, heredoc scripts): the call stays
//! readable and valid JSON, the bulk goes.

use serde_json::Value;

/// How a clipped leaf ends (after `…[N`).
const CLIPPED_TAIL: &str = " chars clipped]";

/// `arguments` with every string leaf longer than `leaf_chars` characters
/// cut to that many and marked `…[N chars clipped]`; `None` when the text
/// is not JSON (left alone: it is not ours to repair) or nothing was long.
pub(crate) fn clip_arguments(arguments: &str, leaf_chars: usize) -> Option<String> {
    let mut value: Value = serde_json::from_str(arguments).ok()?;
    if !clip_leaves(&mut value, leaf_chars) {
        return None;
    }
    serde_json::to_string(&value).ok()
}

/// Clips in place; whether anything was clipped.
fn clip_leaves(value: &mut Value, leaf_chars: usize) -> bool {
    match value {
        // Already clipped: clipping again would only rewrite the mark.
        Value::String(s) if s.ends_with(CLIPPED_TAIL) => false,
        Value::String(s) => match s.char_indices().nth(leaf_chars) {
            Some((cut, _)) => {
                let dropped = s[cut..].chars().count();
                s.truncate(cut);
                s.push_str(&format!("…[{dropped}{CLIPPED_TAIL}"));
                true
            }
            None => false,
        },
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |acc, v| clip_leaves(v, leaf_chars) | acc),
        Value::Object(map) => map
            .values_mut()
            .fold(false, |acc, v| clip_leaves(v, leaf_chars) | acc),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_leaves_are_clipped_and_json_stays_json() {
        let args = serde_json::json!({
            "path": "/a.py",
            "file_text": "é".repeat(300),
            "nested": [{"s": "x".repeat(50)}, 7],
        })
        .to_string();
        let out = clip_arguments(&args, 40).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["path"], "/a.py");
        assert_eq!(
            v["file_text"],
            format!("{}…[260 chars clipped]", "é".repeat(40))
        );
        assert_eq!(
            v["nested"][0]["s"],
            format!("{}…[10 chars clipped]", "x".repeat(40))
        );
        assert_eq!(v["nested"][1], 7);
        // Key order is kept.
        assert!(out.starts_with(r#"{"path":"#));
    }

    #[test]
    fn short_or_invalid_arguments_are_left_alone() {
        assert_eq!(clip_arguments(r#"{"a": "short"}"#, 40), None);
        let once = clip_arguments(&serde_json::json!({"a": "y".repeat(99)}).to_string(), 40);
        assert_eq!(clip_arguments(&once.unwrap(), 40), None);
        let broken = format!("{{\"a\": \"{}", "x".repeat(900));
        assert_eq!(clip_arguments(&broken, 40), None);
    }
}
