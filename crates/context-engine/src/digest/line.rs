//! The pieces of a digest line: the writ, the outcome (ok or the first error
//! line), one line per dropped binary part, and the host's notes.

use serde_json::Value;

use crate::message::{ContentPart, PartKind};

/// The ellipsis that marks a clipped writ, error line or note.
pub(crate) const ELLIPSIS: &str = "…";

/// `s` clipped to at most `max` bytes (ellipsis included) at a character
/// boundary, so a digest line has a known worst-case size.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(ELLIPSIS.len());
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ELLIPSIS}", &s[..end])
}

/// Runs of whitespace (newlines included) collapsed to one space, so a writ
/// always fits on one line.
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

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

/// What a digested body reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Non-zero exit code found in the body or the message's fields.
    pub exit: Option<i64>,
    /// The first error line, unclipped.
    pub error_line: Option<String>,
    /// The message carries an explicit error flag.
    pub flagged: bool,
}

impl Outcome {
    /// Whether the call failed.
    pub fn failed(&self) -> bool {
        self.exit.is_some() || self.error_line.is_some() || self.flagged
    }

    /// `ok, N bytes omitted` or `failed (exit 2) — <first error line>`.
    pub fn render(&self, omitted: usize, error_max: usize) -> String {
        if !self.failed() {
            return format!("ok, {omitted} bytes omitted");
        }
        let why = match self.exit {
            Some(code) => format!("failed (exit {code})"),
            None => "failed".to_owned(),
        };
        match &self.error_line {
            Some(line) => format!("{why} — {}", clip(line.trim(), error_max)),
            None => format!("{why}, {omitted} bytes omitted"),
        }
    }
}

/// Reads the outcome of a tool body. An explicit exit code of 0 in the body
/// means the command succeeded, whatever its output says (a `cat` of a file
/// that contains `Error:` lines is not a failure); otherwise the first error
/// line wins.
pub(crate) fn outcome(body: &str, flags: Flags) -> Outcome {
    let exit = flags.exit.or_else(|| exit_code(body));
    let succeeded = exit == Some(0) && !flags.error;
    let error_line = if succeeded {
        None
    } else {
        first_error_line(body).map(str::to_owned).or(flags.reason)
    };
    Outcome {
        exit: exit.filter(|&c| c != 0),
        error_line,
        flagged: flags.error,
    }
}

/// Error signals carried by the message itself rather than its body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    /// `is_error: true`, `error: true` / a message, `status: "error"`.
    pub error: bool,
    /// The message of a string `error` field, shown when the body has no
    /// error line.
    pub reason: Option<String>,
    /// `returncode` / `exit_code` / `exit_status` as a number.
    pub exit: Option<i64>,
}

impl Flags {
    /// Looks for flags in a message's extra fields and, one level down, in
    /// an `extra` object (mini-swe-agent keeps `returncode` there).
    pub fn of(extra: &serde_json::Map<String, Value>) -> Flags {
        let mut flags = Flags::default();
        let nested = extra.get("extra").and_then(Value::as_object);
        for map in std::iter::once(extra).chain(nested) {
            flags.error |= map.get("is_error").and_then(Value::as_bool) == Some(true)
                || matches!(map.get("error"), Some(Value::Bool(true)))
                || matches!(map.get("error"), Some(Value::String(s)) if !s.trim().is_empty())
                || matches!(
                    map.get("status").and_then(Value::as_str),
                    Some("error" | "failed" | "failure")
                );
            if flags.reason.is_none() {
                flags.reason = map
                    .get("error")
                    .and_then(Value::as_str)
                    .and_then(|s| s.lines().find(|l| !l.trim().is_empty()))
                    .map(str::to_owned);
            }
            if flags.exit.is_none() {
                flags.exit = ["returncode", "exit_code", "exit_status"]
                    .iter()
                    .find_map(|k| map.get(*k).and_then(Value::as_i64));
            }
        }
        flags
    }
}

/// The first line that reports an error: `ERR:`, `Error…`/`ERROR…`,
/// `error:` (or rustc's `error[E…]`), `fatal:` (git), `FAILED ` (pytest's
/// summary), `FAIL:` (unittest), a Python exception line
/// (`ValueError: …`), or, for a traceback, the exception line that ends it.
pub(crate) fn first_error_line(body: &str) -> Option<&str> {
    let mut lines = body.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("Traceback (most recent call last)") {
            // The exception is the first unindented line after the frames.
            let exception = lines
                .clone()
                .find(|l| !l.is_empty() && !l.starts_with(char::is_whitespace));
            return Some(exception.unwrap_or(line));
        }
        if is_error_line(line) {
            return Some(line);
        }
    }
    None
}

fn is_error_line(line: &str) -> bool {
    let word_end = |rest: &str| {
        rest.chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    };
    const PREFIXES: [&str; 5] = ["ERR:", "error:", "fatal:", "FAILED ", "FAIL:"];
    if PREFIXES.iter().any(|p| line.starts_with(p)) {
        return true;
    }
    if let Some(rest) = line.strip_prefix("error[") {
        return rest.starts_with('E');
    }
    if let Some(rest) = line
        .strip_prefix("Error")
        .or_else(|| line.strip_prefix("ERROR"))
    {
        return word_end(rest);
    }
    exception_line(line)
}

/// `SomeError: …` / `pkg.SomeException: …` at the start of a line.
fn exception_line(line: &str) -> bool {
    let Some((head, _)) = line.split_once(": ") else {
        return false;
    };
    !head.is_empty()
        && head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && head.starts_with(|c: char| c.is_ascii_alphabetic())
        && (head.ends_with("Error") || head.ends_with("Exception"))
}

/// The first exit code the body reports: `<returncode>1</returncode>` or
/// `[exit 2]` anywhere in a line, or a line starting `exit code: 127`,
/// `exit status 1`, `returncode: 1` (case-insensitive).
pub(crate) fn exit_code(body: &str) -> Option<i64> {
    body.lines().find_map(line_exit_code)
}

fn line_exit_code(line: &str) -> Option<i64> {
    if let Some(at) = line.find("<returncode>") {
        let rest = &line[at + "<returncode>".len()..];
        let inner = rest.split("</returncode>").next()?;
        return leading_int(inner.trim());
    }
    if let Some(at) = line.find("[exit ") {
        let rest = &line[at + "[exit ".len()..];
        if let Some((num, _)) = rest.split_once(']') {
            return num.trim().parse().ok();
        }
    }
    let lower = line.trim_start().to_ascii_lowercase();
    for key in ["exit code", "exit status", "exit_code", "returncode"] {
        if let Some(rest) = lower.strip_prefix(key) {
            return leading_int(rest.trim_start_matches([':', '=', ' ', '\t']));
        }
    }
    None
}

/// The integer at the start of `s` (an optional `-` and digits).
fn leading_int(s: &str) -> Option<i64> {
    let digits = s
        .char_indices()
        .take_while(|&(i, c)| c.is_ascii_digit() || (i == 0 && c == '-'))
        .map(|(i, c)| i + c.len_utf8())
        .last()?;
    s[..digits].parse().ok()
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
    fn clip_respects_bytes_and_char_boundaries() {
        assert_eq!(clip("short", 240), "short");
        let long = "é".repeat(200); // 400 bytes
        let c = clip(&long, 240);
        assert!(c.len() <= 240, "{}", c.len());
        assert!(c.ends_with(ELLIPSIS));
        assert_eq!(clip("abcdef", 4), "a…");
    }

    #[test]
    fn error_lines() {
        assert_eq!(
            first_error_line("a\nERR: boom\nError: x"),
            Some("ERR: boom")
        );
        assert_eq!(first_error_line("ok\n  ERR: indented"), None);
        assert_eq!(first_error_line("x ERR: mid-line"), None);
        assert_eq!(first_error_line("ErrorHandler.java\nok"), None);
        assert_eq!(
            first_error_line("Error 404 not found"),
            Some("Error 404 not found")
        );
        assert_eq!(
            first_error_line("error[E0308]: mismatched types"),
            Some("error[E0308]: mismatched types")
        );
        let tb = "run\nTraceback (most recent call last):\n  File \"x.py\", line 1\n    f()\nValueError: bad\n";
        assert_eq!(first_error_line(tb), Some("ValueError: bad"));
        assert_eq!(
            first_error_line("ModuleNotFoundError: No module named 'x'"),
            Some("ModuleNotFoundError: No module named 'x'")
        );
        assert_eq!(first_error_line("Note: fine\nWarning: meh"), None);
        assert_eq!(
            first_error_line("E   AssertionError: x\nFAILED t.py::a - AssertionError: x"),
            Some("FAILED t.py::a - AssertionError: x")
        );
        assert_eq!(
            first_error_line("ERROR: test_a (m.T)"),
            Some("ERROR: test_a (m.T)")
        );
        assert_eq!(first_error_line("ERRORS_SEEN = 0"), None);
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code("<returncode>1</returncode>\n<output>"), Some(1));
        assert_eq!(exit_code("<returncode>0</returncode>"), Some(0));
        assert_eq!(exit_code("done\n[exit 2]"), Some(2));
        assert_eq!(exit_code("Exit code: 127"), Some(127));
        assert_eq!(exit_code("returncode: 1"), Some(1));
        assert_eq!(exit_code("exit status 3"), Some(3));
        assert_eq!(exit_code("the exit code of ls"), None);
        assert_eq!(exit_code("[exit now]"), None);
        assert_eq!(exit_code("nothing here"), None);
    }

    #[test]
    fn explicit_success_overrides_error_lines() {
        let o = outcome(
            "<returncode>0</returncode>\nError: in file",
            Flags::default(),
        );
        assert!(!o.failed());
        let o = outcome("<returncode>1</returncode>\nError: x", Flags::default());
        assert_eq!(o.render(10, 200), "failed (exit 1) — Error: x");
        let o = outcome(
            "plain",
            Flags {
                error: true,
                ..Flags::default()
            },
        );
        assert_eq!(o.render(5, 200), "failed, 5 bytes omitted");
        let v = serde_json::json!({"error": "\npermission denied\nmore"});
        let o = outcome("plain", Flags::of(v.as_object().unwrap()));
        assert_eq!(o.render(5, 200), "failed — permission denied");
    }

    #[test]
    fn flags_from_extra() {
        let v = serde_json::json!({"is_error": true});
        assert!(Flags::of(v.as_object().unwrap()).error);
        let v = serde_json::json!({"extra": {"returncode": 2}});
        assert_eq!(Flags::of(v.as_object().unwrap()).exit, Some(2));
        let v = serde_json::json!({"error": ""});
        assert_eq!(Flags::of(v.as_object().unwrap()), Flags::default());
    }

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
