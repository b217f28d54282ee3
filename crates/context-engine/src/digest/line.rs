//! The pieces of a digest line: the writ, the outcome (ok or the first error
//! line), one line per dropped binary part, and the host's notes.

use serde_json::Value;

use crate::message::{ContentPart, PartKind};
use crate::tool_output::{clip, one_line};

/// The writ of an OpenAI tool call: its name and its arguments as the model
/// wrote them, on one line. Empty arguments (`""`, `{}`) are left out.
pub(crate) fn call_writ(name: &str, arguments: &str) -> String {
    let args = one_line(arguments);
    let name = if name.is_empty() { "tool" } else { name };
    if args.is_empty() || args == "{}" {
        name.to_owned()
    } else {
        format!("{name} {args}")
    }
}

/// Whether a part is dropped by a digest and replaced by a line: images,
/// audio, files, and unknown part types that carry no `text`.
pub(crate) fn is_binary(part: &ContentPart) -> bool {
    part.is_binary()
        || matches!(part.kind(), PartKind::Unknown(_))
            && !part.as_map().get("text").is_some_and(Value::is_string)
}

/// Whether a digest may drop the part: text (its bytes are counted and
/// recalled) or binary. Anything else (a refusal, an unknown part with
/// text) would be lost silently, so such a result is left whole.
pub(crate) fn is_accounted(part: &ContentPart) -> bool {
    matches!(part.kind(), PartKind::Text(_)) || is_binary(part)
}

/// One line standing in for a dropped binary part:
/// `[image omitted — image/png, 5120 bytes]`, or the URL of a remote image.
pub(crate) fn binary_line(part: &ContentPart, url_max: usize) -> String {
    match part.kind() {
        PartKind::ImageUrl { url, .. } => match data_url(url) {
            Some((mime, bytes)) => format!("[image omitted — {mime}, {bytes} bytes]"),
            None => format!("[image omitted — {}]", clip(&one_line(url), url_max)),
        },
        PartKind::InputAudio { data, format } => format!(
            "[audio omitted — {}, {} bytes]",
            format.unwrap_or("audio"),
            base64_len(data)
        ),
        PartKind::File {
            file_id,
            filename,
            file_data,
        } => {
            let name = filename.or(file_id).unwrap_or("file");
            match file_data {
                Some(data) => {
                    let bytes = data_url(data).map_or_else(|| base64_len(data), |(_, n)| n);
                    format!("[file omitted — {}, {bytes} bytes]", clip(name, url_max))
                }
                None => format!("[file omitted — {}]", clip(name, url_max)),
            }
        }
        PartKind::Unknown(ty) => format!("[{} part omitted]", clip(ty.unwrap_or("binary"), 64)),
        PartKind::Text(_) | PartKind::Refusal(_) => String::new(),
    }
}

/// The media type and decoded size of a `data:` URL.
fn data_url(url: &str) -> Option<(&str, usize)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, payload) = rest.split_once(',')?;
    let mime = meta.split(';').next().filter(|m| !m.is_empty());
    let bytes = if meta.ends_with(";base64") {
        base64_len(payload)
    } else {
        payload.len()
    };
    Some((mime.unwrap_or("application/octet-stream"), bytes))
}

/// Decoded size of base64 text, without decoding it.
fn base64_len(data: &str) -> usize {
    let symbols = data
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'=')
        .count();
    symbols * 3 / 4
}

/// The notes a host or engine injected into a result, in order:
/// `[PRESENCE: …]…[END PRESENCE]` and `[LOOP DETECTED]…[END LOOP DETECTED]`
/// blocks and `[TOOL RESULTS TRUNCATED…]` / `[TOOL RESULTS CANCELLED]`
/// banners. Kept word for word up to `max` bytes, clipped beyond.
pub(crate) fn notes(text: &str, max: usize) -> Vec<String> {
    const BLOCKS: [(&str, &str); 2] = [
        ("[PRESENCE:", "[END PRESENCE]"),
        ("[LOOP DETECTED]", "[END LOOP DETECTED]"),
    ];
    const BANNERS: [&str; 2] = ["[TOOL RESULTS TRUNCATED", "[TOOL RESULTS CANCELLED]"];
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < text.len() {
        let rest = &text[pos..];
        let line_end = rest.find('\n').map_or(rest.len(), |n| n + 1);
        let line = rest[..line_end].trim_end_matches(['\n', '\r']);
        let trimmed = line.trim_start();
        let lead = line.len() - trimmed.len();
        if let Some((_, end)) = BLOCKS.iter().find(|(start, _)| trimmed.starts_with(start)) {
            let from = pos + lead;
            let block = match text[from..].find(end) {
                Some(at) => &text[from..from + at + end.len()],
                None => trimmed,
            };
            out.push(clip(block, max));
            pos = from + block.len().max(1);
            // Continue after the block's last line.
            pos = text[pos..].find('\n').map_or(text.len(), |n| pos + n + 1);
            continue;
        }
        if BANNERS.iter().any(|b| trimmed.starts_with(b)) {
            out.push(clip(trimmed.trim_end(), max));
        }
        pos += line_end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_lines() {
        let png = ContentPart::new_image_url("data:image/png;base64,AAAABBBB");
        assert_eq!(
            binary_line(&png, 240),
            "[image omitted — image/png, 6 bytes]"
        );
        let remote = ContentPart::new_image_url("https://example.test/a.png");
        assert_eq!(
            binary_line(&remote, 240),
            "[image omitted — https://example.test/a.png]"
        );
    }

    #[test]
    fn notes_are_kept_in_order() {
        let text = "body\n[PRESENCE: alice]\nis here\n[END PRESENCE]\nmore\n[TOOL RESULTS TRUNCATED: 3 more]\n[LOOP DETECTED] same call [END LOOP DETECTED]\n";
        assert_eq!(
            notes(text, 1000),
            vec![
                "[PRESENCE: alice]\nis here\n[END PRESENCE]".to_owned(),
                "[TOOL RESULTS TRUNCATED: 3 more]".to_owned(),
                "[LOOP DETECTED] same call [END LOOP DETECTED]".to_owned(),
            ]
        );
    }
}
