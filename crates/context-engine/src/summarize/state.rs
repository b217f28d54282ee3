//! The state record that ends every summary: built mechanically from the
//! span, so what a model's prose leaves out is still there.
//!
//! [`StateRecord::build`] reads the span with the tool-output module
//! ([`crate::tool_output`]) and `validate`'s notion of a user ask, the same
//! readers a digest line and a retention probe use, so a summary never
//! disagrees with them on whether a command failed. It holds:
//!
//! - the user's asks, verbatim (a long one clipped in the middle);
//! - every file read or written (paths as the calls wrote them);
//! - each command with its latest exit status (deduplicated: a command run
//!   three times is listed once, with the last outcome);
//! - the failing tests the outputs reported;
//! - the distinct error lines, each at its latest occurrence;
//! - what the agent last said it would do next.
//!
//! [`StateRecord::render`] fits it in a character budget: when it does not
//! fit, the oldest entries of the longest lists collapse into a count, and
//! the count names the span's archive handle when the caller has one.

use std::fmt::Write as _;

use serde_json::json;

use crate::compressor::{is_summary, without_summary};
use crate::message::{Message, Role};
use crate::tool_output::{self, Flags, clip, one_line};
use crate::validate::is_real_user_turn;

/// The heading the record starts with; also how a summary is known to
/// carry one.
pub const STATE_RECORD_HEADING: &str =
    "## State record (extracted from the messages, not written by a model)";

/// Longest ask kept, in bytes (the latest ask gets 4x).
const ASK_MAX: usize = 600;
/// An older ask's length when the record is short of room: its opening,
/// which says what was asked.
const ASK_SHORT: usize = 260;
/// Longest command line.
const COMMAND_MAX: usize = 160;
/// Longest error line.
const ERROR_MAX: usize = 200;
/// Longest "next" line.
const NEXT_MAX: usize = 400;

/// One command and its latest outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandState {
    /// The command's first line, as written.
    pub command: String,
    /// The exit code of its latest run, when the output said.
    pub exit: Option<i64>,
    /// Whether its latest run failed; `None` when its output is not in the
    /// span.
    pub failed: Option<bool>,
    /// How many times it ran in the span.
    pub runs: usize,
}

/// The facts of a span (see the module docs). Lists are oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateRecord {
    /// The user's asks, clipped.
    pub asks: Vec<String>,
    /// Files read or written.
    pub files: Vec<String>,
    /// Commands, deduplicated, ordered by their latest run.
    pub commands: Vec<CommandState>,
    /// Tests reported failing.
    pub failing_tests: Vec<String>,
    /// Distinct error lines, ordered by their latest occurrence.
    pub errors: Vec<String>,
    /// What the agent said it would do next.
    pub next: Option<String>,
}

impl StateRecord {
    /// Reads the record out of `turns`.
    pub fn build(turns: &[Message]) -> StateRecord {
        StateRecord::build_focused(turns, None)
    }

    /// [`build`](Self::build), with the asks that mention `focus`
    /// (lowercase) kept at the latest ask's larger size.
    pub fn build_focused(turns: &[Message], focus: Option<&str>) -> StateRecord {
        let mut record = StateRecord::default();
        // A summary merged into an ask: the ask's own words.
        let own = |m: &Message| match is_summary(m) {
            true => without_summary(&m.text()),
            false => m.text().into_owned(),
        };
        let asks: Vec<usize> = (0..turns.len())
            .filter(|&i| is_real_user_turn(turns, i) && !own(&turns[i]).trim().is_empty())
            .collect();
        for (k, &i) in asks.iter().enumerate() {
            let text = own(&turns[i]);
            let focused = focus.is_some_and(|f| text.to_lowercase().contains(f));
            let max = if k + 1 == asks.len() || focused {
                ASK_MAX * 4
            } else {
                ASK_MAX
            };
            record.asks.push(clip_middle(text.trim(), max));
        }
        for call in tool_output::calls(turns) {
            for path in call.paths {
                let path = path.trim();
                if !path.is_empty()
                    && !path.contains('\n')
                    && !record.files.iter().any(|f| f == path)
                {
                    record.files.push(path.to_owned());
                }
            }
            let reading = call
                .result
                .and_then(|r| turns.get(r))
                .map(|m| tool_output::read(&m.text(), &Flags::of(&m.extra)));
            if let Some(r) = &reading {
                for test in &r.failing_tests {
                    let test = clip(test, COMMAND_MAX);
                    record.failing_tests.retain(|t| *t != test);
                    record.failing_tests.push(test);
                }
                if r.failed
                    && let Some(line) = &r.first_error
                {
                    let line = clip(line.trim(), ERROR_MAX);
                    record.errors.retain(|e| *e != line);
                    record.errors.push(line);
                }
            }
            let Some(first) = call
                .command
                .as_deref()
                .and_then(|c| c.lines().find(|l| !l.trim().is_empty()))
            else {
                continue;
            };
            let command = clip(first.trim(), COMMAND_MAX);
            let runs = match record.commands.iter().position(|c| c.command == command) {
                Some(k) => record.commands.remove(k).runs,
                None => 0,
            };
            record.commands.push(CommandState {
                command,
                exit: reading.as_ref().and_then(|r| r.exit),
                failed: reading.as_ref().map(|r| r.failed),
                runs: runs + 1,
            });
        }
        record.next = turns
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant && !m.text().trim().is_empty())
            .map(|m| clip(&one_line(last_paragraph(m.text().trim())), NEXT_MAX));
        record
    }

    /// Prepends what the record of a previous summary held (its asks,
    /// files, failing tests and error lines, as older entries), so a second
    /// compaction does not drop what the first one recorded. `previous` is
    /// the previous summary's text; without a record in it nothing changes.
    pub fn carry_over(&mut self, previous: &str) {
        let Some(at) = previous.find(STATE_RECORD_HEADING) else {
            return;
        };
        let old = parse_sections(&previous[at..]);
        let merge = |mine: &mut Vec<String>, title: &str| {
            let Some(items) = old.iter().find(|(t, _)| t.starts_with(title)) else {
                return;
            };
            let mut merged: Vec<String> = items
                .1
                .iter()
                .filter(|i| !mine.contains(i))
                .cloned()
                .collect();
            merged.append(mine);
            *mine = merged;
        };
        merge(&mut self.asks, "User asks");
        merge(&mut self.files, "Files");
        merge(&mut self.failing_tests, "Failing tests");
        merge(&mut self.errors, "Errors");
    }

    /// The record as Markdown within about `budget` bytes (see the module
    /// docs). `handle` is the span's archive handle: collapsed entries
    /// point to it.
    pub fn render(&self, budget: usize, handle: Option<&str>) -> String {
        let mut keep = [
            self.asks.len(),
            self.files.len(),
            self.commands.len(),
            self.failing_tests.len(),
            self.errors.len(),
        ];
        // The asks give way last: first the other lists collapse (oldest
        // entries of the longest first, down to their count), then
        // the older asks are cut to their opening, then they collapse (the
        // first, the task, and the latest stay).
        let mut asks = self.asks.clone();
        let mut shortened = false;
        loop {
            let text = self.render_keeping(&asks, &keep, handle);
            if text.len() <= budget {
                return text;
            }
            if let Some(k) = (1..keep.len())
                .filter(|&k| keep[k] > 0)
                .max_by_key(|&k| (keep[k], usize::MAX - k))
            {
                keep[k] -= 1;
                continue;
            }
            let last = asks.len().saturating_sub(1);
            if !shortened && last > 0 {
                for ask in &mut asks[..last] {
                    *ask = clip(ask, ASK_SHORT);
                }
                shortened = true;
                continue;
            }
            if keep[0] > 2 {
                keep[0] -= 1;
                continue;
            }
            return clip(&text, budget.max(STATE_RECORD_HEADING.len() + 64));
        }
    }

    fn render_keeping(&self, asks: &[String], keep: &[usize; 5], handle: Option<&str>) -> String {
        let mut out = String::from(STATE_RECORD_HEADING);
        out.push('\n');
        let commands: Vec<String> = self
            .commands
            .iter()
            .map(|c| {
                let status = match (c.failed, c.exit) {
                    (None, _) => "no output in this span".to_owned(),
                    (Some(false), Some(code)) => format!("ok (exit {code})"),
                    (Some(false), None) => "ok".to_owned(),
                    (Some(true), Some(code)) => format!("failed (exit {code})"),
                    (Some(true), None) => "failed".to_owned(),
                };
                let runs = if c.runs > 1 {
                    format!(", ran {} times", c.runs)
                } else {
                    String::new()
                };
                format!("`{}` → {status}{runs}", c.command)
            })
            .collect();
        let sections: [(&str, &str, &[String]); 5] = [
            ("User asks", "asks", asks),
            ("Files read or written", "files", &self.files),
            ("Commands (latest exit status)", "commands", &commands),
            ("Failing tests", "tests", &self.failing_tests),
            ("Errors (latest occurrence)", "error lines", &self.errors),
        ];
        for ((title, noun, items), &kept) in sections.iter().zip(keep) {
            let _ = writeln!(out, "### {title}");
            if items.is_empty() {
                out.push_str("- none\n");
                continue;
            }
            let dropped = items.len() - kept.min(items.len());
            // Asks keep the first (the task) ahead of the collapsed ones.
            let lead = usize::from(*noun == "asks" && dropped > 0);
            for item in &items[..lead] {
                let _ = writeln!(out, "- {}", item.replace('\n', "\n  "));
            }
            if dropped > 0 {
                let _ = match handle {
                    Some(h) => writeln!(
                        out,
                        "- ({dropped} earlier {noun} archived: context_expand {})",
                        json!({ "handle": h })
                    ),
                    None => writeln!(out, "- ({dropped} earlier {noun} not listed)"),
                };
            }
            for item in &items[(dropped + lead).min(items.len())..] {
                let _ = writeln!(out, "- {}", item.replace('\n', "\n  "));
            }
        }
        let _ = writeln!(out, "### Next");
        let _ = writeln!(out, "- {}", self.next.as_deref().unwrap_or("not stated"));
        out.trim_end().to_owned()
    }
}

/// The `### title` sections of a rendered record and their `- item` lines
/// (continuation lines joined back; count lines and `none` left out).
fn parse_sections(record: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in record.lines() {
        if let Some(title) = line.strip_prefix("### ") {
            out.push((title.to_owned(), Vec::new()));
        } else if let Some((_, items)) = out.last_mut() {
            if let Some(item) = line.strip_prefix("- ") {
                let count = item.starts_with('(') && item.contains(" earlier ");
                if !count && item != "none" {
                    items.push(item.to_owned());
                }
            } else if let Some(more) = line.strip_prefix("  ")
                && let Some(last) = items.last_mut()
            {
                last.push('\n');
                last.push_str(more);
            }
        }
    }
    out
}

/// The last paragraph of an assistant text (where its plan usually sits),
/// code blocks left out.
pub(crate) fn last_paragraph(text: &str) -> &str {
    let prose = text.split("```").next().unwrap_or(text).trim();
    let prose = if prose.is_empty() { text } else { prose };
    prose
        .rsplit("\n\n")
        .find(|p| !p.trim().is_empty())
        .unwrap_or(prose)
}

/// At most `max` bytes of `s`: its head and tail around a `[…]` (a long ask
/// states the goal first and the details or constraints last).
pub(crate) fn clip_middle(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let marker = " […] ";
    let keep = max.saturating_sub(marker.len());
    let mut head = keep * 2 / 3;
    while head > 0 && !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - (keep - head);
    while tail < s.len() && !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}{marker}{}", &s[..head], &s[tail..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;

    fn mini(command: &str, code: i64, output: &str) -> [Message; 2] {
        [
            Message::assistant(format!(
                "THOUGHT: go\n\n```mswea_bash_command\n{command}\n```"
            )),
            Message::user(format!(
                "<returncode>{code}</returncode>\n<output>\n{output}\n</output>"
            )),
        ]
    }

    fn span() -> Vec<Message> {
        let mut v = vec![
            Message::system("sys"),
            Message::user("Please fix tests/test_io.py"),
        ];
        v.extend(mini("cat src/io.py", 0, "def read(): pass"));
        v.extend(mini(
            "python -m pytest -q",
            1,
            "FAILED tests/test_io.py::test_read - KeyError: 'x'",
        ));
        v.extend(mini("sed -i 's/a/b/' src/io.py", 0, ""));
        v.extend(mini("python -m pytest -q", 0, "1 passed"));
        v.push(Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "c1",
                "read_file",
                r#"{"path": "README.md"}"#,
            )],
        ));
        v.push(Message::tool_result("c1", "readme"));
        v.push(Message::assistant(
            "Tests pass.\n\nNext I will update the changelog.",
        ));
        v
    }

    #[test]
    fn the_record_reads_text_actions_and_tool_calls_alike() {
        let r = StateRecord::build(&span());
        assert_eq!(r.asks, vec!["Please fix tests/test_io.py"]);
        assert_eq!(r.files, vec!["src/io.py", "README.md"]);
        let pytest = r
            .commands
            .iter()
            .find(|c| c.command == "python -m pytest -q")
            .unwrap();
        assert_eq!(
            (pytest.exit, pytest.failed, pytest.runs),
            (Some(0), Some(false), 2)
        );
        assert_eq!(r.failing_tests, vec!["tests/test_io.py::test_read"]);
        assert_eq!(
            r.errors,
            vec!["FAILED tests/test_io.py::test_read - KeyError: 'x'"]
        );
        assert_eq!(r.next.as_deref(), Some("Next I will update the changelog."));
        // The observations are not asks.
        assert_eq!(r.asks.len(), 1);
        let text = r.render(10_000, None);
        assert!(text.starts_with(STATE_RECORD_HEADING), "{text}");
        assert!(
            text.contains("`python -m pytest -q` → ok (exit 0), ran 2 times"),
            "{text}"
        );
    }

    #[test]
    fn over_budget_the_oldest_entries_collapse_into_counts_with_the_handle() {
        let mut turns = vec![Message::user("do it")];
        for k in 0..40 {
            turns.extend(mini(&format!("cat file{k}.py"), 0, "x"));
        }
        let r = StateRecord::build(&turns);
        let full = r.render(100_000, None);
        let small = r.render(1_200, Some("s-12-57"));
        assert!(small.len() <= 1_200, "{}", small.len());
        assert!(small.len() < full.len());
        assert!(
            small.contains("earlier files archived: context_expand {\"handle\":\"s-12-57\"}"),
            "{small}"
        );
        assert!(small.contains("file39.py"), "the newest stays: {small}");
        assert!(small.contains("- do it"));
        let mut again = StateRecord::build(&[Message::user("then ship it")]);
        again.carry_over(&format!("[summary]\n{full}"));
        assert_eq!(again.asks, vec!["do it", "then ship it"]);
        assert_eq!(again.files.len(), 40);
        let bare = r.render(1_200, None);
        assert!(bare.contains("earlier files not listed"), "{bare}");
        assert!(!bare.contains("omitted"));
    }
}
