//! Reading tool output: the one place that says what a tool's output
//! reported.
//!
//! Every consumer that needs to know whether a command failed asks here, so
//! a digest line, a prune marker, a retention probe and a summary's state
//! record never disagree:
//!
//! - [`outcome`] / [`read`]: ok or failed, the exit code (`<returncode>1</returncode>`,
//!   `[exit 2]`, `exit code: 127`, `exit status 1`, `returncode: 1`, or a
//!   message field such as `returncode`, `is_error`, `status: "error"`),
//!   the first and last error lines (a traceback reports its final
//!   exception line), the failing tests (pytest, unittest, cargo, go);
//!   an explicit exit code 0 means success whatever the output says. A
//!   body that is already a digest line (`[digested] … → failed (exit 1) —
//!   …`) is read back from the line, so a summary of a digested span still
//!   knows which commands failed.
//! - [`calls`]: every call of a transcript (tool calls and the text actions
//!   of agents that write their action as text) with the files it touches
//!   and the message that holds its output.
//! - `shell_paths`: the files a shell command reads or writes.
//! - [`gist`]: the lines of an output worth reading in a summary (errors,
//!   failing tests, the result line), its noise (banners, progress, headers,
//!   rows of passing-test dots) left out.
//! - [`clip`] / [`one_line`]: how long texts are bounded (at a character
//!   boundary, `…` included in the bound).

mod calls;
mod gist;
mod paths;
pub(crate) mod shell;

use serde_json::Value;

pub(crate) use calls::string_leaves;
pub use calls::{Call, calls};
pub use gist::gist;
pub(crate) use paths::shell_paths;

/// How the first line of a digested tool result starts; also how a digest
/// recognizes its own output, so digesting twice changes nothing.
pub const DIGEST_MARK: &str = "[digested]";

/// How a tool result replaced by the prune pass starts.
pub const PRUNE_MARK: &str = "[pruned]";

/// The name of the recall tool, as digest and prune lines name it (the
/// tool itself is [`crate::recall`]'s).
pub const RECALL_TOOL: &str = "context_recall";

/// The name of the search tool, as archive notes name it.
pub const SEARCH_TOOL: &str = "context_search";

/// The name of the expand tool, as archive notes and a state record's
/// counts name it.
pub const EXPAND_TOOL: &str = "context_expand";

/// The name of the tool that reports the agent's context budget.
pub const STATUS_TOOL: &str = "context_status";

/// The name of the tool through which the agent asks for a compaction.
pub const COMPACT_TOOL: &str = "context_compact";

/// The ellipsis that marks a clipped writ, error line or note.
pub(crate) const ELLIPSIS: &str = "…";

/// `s` clipped to at most `max` bytes (ellipsis included) at a character
/// boundary, so a digest line has a known worst-case size.
pub fn clip(s: &str, max: usize) -> String {
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
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What a digested body reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
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
pub fn outcome(body: &str, flags: Flags) -> Outcome {
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
pub struct Flags {
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
pub fn first_error_line(body: &str) -> Option<&str> {
    error_lines(body).next()
}

/// Every line that reports an error, in order (a traceback by the
/// exception line that ends it).
fn error_lines(body: &str) -> impl Iterator<Item = &str> {
    let mut lines = body.lines();
    std::iter::from_fn(move || {
        while let Some(line) = lines.next() {
            if line.starts_with("Traceback (most recent call last)") {
                // The exception is the first unindented line after the
                // frames; the scan resumes after it.
                let mut frames = lines.clone();
                let exception =
                    frames.find(|l| !l.is_empty() && !l.starts_with(char::is_whitespace));
                if exception.is_some() {
                    lines = frames;
                }
                return Some(exception.unwrap_or(line));
            }
            if is_error_line(line) {
                return Some(line);
            }
        }
        None
    })
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
pub fn exit_code(body: &str) -> Option<i64> {
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

/// Everything one tool output says about its call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The exit code the output or the message reports, 0 included.
    pub exit: Option<i64>,
    /// Whether the call failed (a non-zero exit, an error line or an error
    /// flag; an explicit 0 wins over error-looking lines).
    pub failed: bool,
    /// The first line that reports an error (unclipped), when failed.
    pub first_error: Option<String>,
    /// The last such line: what the command finally died of.
    pub last_error: Option<String>,
    /// Tests the output reports as failing, as named there, in order.
    pub failing_tests: Vec<String>,
}

/// Reads a tool output `body` whose message carries `flags` (see the
/// module docs).
pub fn read(body: &str, flags: &Flags) -> Reading {
    if let Some(reading) = read_marker_line(body) {
        return reading;
    }
    let exit = flags.exit.or_else(|| exit_code(body));
    let o = outcome(body, flags.clone());
    let failed = o.failed();
    let last_error = if failed {
        last_error_line(body)
            .map(str::to_owned)
            .or(o.error_line.clone())
    } else {
        None
    };
    Reading {
        exit,
        failed,
        first_error: o.error_line,
        last_error,
        failing_tests: failing_tests(body),
    }
}

/// [`read`] on a message: its text and the flags its fields carry.
pub fn read_message(message: &crate::message::Message) -> Reading {
    read(&message.text(), &Flags::of(&message.extra))
}

/// A digest line or a prune marker, read back: `… → ok, N bytes omitted;`
/// or `… → failed (exit 2) — <error line>; full output: …`.
fn read_marker_line(body: &str) -> Option<Reading> {
    let first = body.lines().next()?;
    let marked = [DIGEST_MARK, PRUNE_MARK]
        .iter()
        .any(|m| first.starts_with(m))
        || first.contains("] → ok, ")
        || first.contains("] → failed");
    if !marked {
        return None;
    }
    let (_, outcome) = first.split_once(" → ")?;
    let outcome = outcome.split("; full output").next().unwrap_or(outcome);
    let Some(rest) = outcome.strip_prefix("failed") else {
        return Some(Reading {
            exit: None,
            failed: false,
            first_error: None,
            last_error: None,
            failing_tests: Vec::new(),
        });
    };
    let exit = rest
        .strip_prefix(" (exit ")
        .and_then(|r| r.split_once(')'))
        .and_then(|(n, _)| n.trim().parse().ok());
    let line = rest.split_once(" — ").map(|(_, l)| l.to_owned());
    Some(Reading {
        exit,
        failed: true,
        first_error: line.clone(),
        last_error: line.clone(),
        failing_tests: line.as_deref().map(failing_tests).unwrap_or_default(),
    })
}

/// The last line that reports an error (see [`first_error_line`]); a
/// traceback counts by its final exception line.
pub fn last_error_line(body: &str) -> Option<&str> {
    error_lines(body).last()
}

/// The tests an output reports as failing, once each, in order: pytest's
/// `FAILED path::test - …` and `path::test FAILED`, unittest's `FAIL:` /
/// `ERROR: test (module.Class)`, cargo's `test name ... FAILED`, go's
/// `--- FAIL: TestName`.
pub fn failing_tests(body: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in body.lines() {
        let line = line.trim_end();
        let name = if let Some(rest) = line.strip_prefix("FAILED ") {
            rest.split(" - ").next().map(str::trim)
        } else if let Some(rest) = line
            .strip_prefix("FAIL: ")
            .or_else(|| line.strip_prefix("ERROR: "))
        {
            rest.contains(" (").then(|| rest.trim())
        } else if let Some(rest) = line.trim_start().strip_prefix("--- FAIL: ") {
            rest.split_whitespace().next()
        } else if let Some(rest) = line.strip_prefix("test ") {
            rest.strip_suffix(" ... FAILED").map(str::trim)
        } else if let Some(test) = line.strip_suffix(" FAILED") {
            test.contains("::")
                .then(|| test.split_whitespace().next().unwrap_or(test))
        } else {
            None
        };
        if let Some(name) = name.filter(|n| !n.is_empty())
            && !out.iter().any(|o| o == name)
        {
            out.push(name.to_owned());
        }
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
    fn read_reports_last_error_and_failing_tests() {
        let body = "<returncode>1</returncode>\n<output>\nFAILED tests/t.py::test_a - AssertionError: x\nFAILED tests/t.py::test_b - KeyError: 'k'\nERROR: boom\n</output>";
        let r = read(body, &Flags::default());
        assert!(r.failed);
        assert_eq!(r.exit, Some(1));
        assert_eq!(
            r.first_error.as_deref(),
            Some("FAILED tests/t.py::test_a - AssertionError: x")
        );
        assert_eq!(r.last_error.as_deref(), Some("ERROR: boom"));
        assert_eq!(
            r.failing_tests,
            vec!["tests/t.py::test_a", "tests/t.py::test_b"]
        );
        let r = read(
            "test io::reads ... FAILED\n--- FAIL: TestX (0.1s)\nFAIL: test_y (m.T)",
            &Flags::default(),
        );
        assert_eq!(r.failing_tests, vec!["io::reads", "TestX", "test_y (m.T)"]);
        // `[exit N]` and `exit status` are read the same by every consumer.
        assert_eq!(read("done\n[exit 2]", &Flags::default()).exit, Some(2));
        assert!(read("done\nexit status 3", &Flags::default()).failed);
        assert!(
            !read(
                "<returncode>0</returncode>\nError: in a file",
                &Flags::default()
            )
            .failed
        );
    }

    #[test]
    fn digest_lines_are_read_back() {
        let r = read(
            "[digested] bash {\"command\": \"make\"} → failed (exit 2) — error: no rule; full output: context_recall {\"handle\":\"c1\"}",
            &Flags::default(),
        );
        assert!(r.failed);
        assert_eq!(r.exit, Some(2));
        assert_eq!(r.last_error.as_deref(), Some("error: no rule"));
        let r = read(
            "[digested] bash ls → ok, 5000 bytes omitted; full output: x",
            &Flags::default(),
        );
        assert!(!r.failed);
    }
}
