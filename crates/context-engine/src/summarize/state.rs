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
//! It is the session's ledger: [`StateRecord::carry_over`] merges the
//! record of the previous summary into the new one entry by entry (asks,
//! files, commands with their runs and latest status, failing tests, error
//! lines), so repeated compactions carry it forward verbatim instead of
//! re-summarizing it.
//!
//! [`StateRecord::render`] fits it in a character budget. It is compact
//! first: one line per command, a file that a listed command names
//! verbatim is not listed again, a failing test that a listed error line
//! names neither, and empty sections are left out. When it still does not
//! fit, the oldest entries of the longest lists collapse into a count, and
//! the count names the span's archive handle when the caller has one and
//! the agent can call `context_expand` on it (a text-action agent reads
//! only that they were archived, [`Collapsed`]); the asks give way last.

use std::fmt::Write as _;

use serde_json::json;

use crate::digest::ToolChannel;
use crate::message::{Message, Role};
use crate::summary_text::{is_summary, without_summary};
use crate::tool_output::{self, EXPAND_TOOL, Flags, clip, one_line};
use crate::validate::{TextActions, is_real_user_turn};

/// The heading the record starts with; also how a summary is known to
/// carry one.
pub const STATE_RECORD_HEADING: &str =
    "## State record (extracted from the messages, not written by a model)";

/// Longest ask kept, in bytes (the latest ask gets 4x).
const ASK_MAX: usize = 600;
/// An older ask's length when the record is short of room: its opening,
/// which says what was asked.
const ASK_SHORT: usize = 260;
/// Longest command line: the first [`COMMAND_MAX_BYTES`] bytes that
/// identify a command (what a retention probe looks for), and the ellipsis
/// of a longer one.
///
/// [`COMMAND_MAX_BYTES`]: crate::retention::COMMAND_MAX_BYTES
const COMMAND_MAX: usize = crate::retention::COMMAND_MAX_BYTES + crate::tool_output::ELLIPSIS.len();
/// The ledger's sections, by title: asks, files, commands, failing tests,
/// errors (the order [`StateRecord::render`] keeps them in).
const TITLES: [&str; 5] = [
    "User asks",
    "Files read or written",
    "Commands (latest exit status; exit 0 where none is shown)",
    "Failing tests",
    "Errors (latest occurrence)",
];
/// Longest error line.
const ERROR_MAX: usize = 200;
/// Longest "next" line.
const NEXT_MAX: usize = 400;
/// The "next" line when the record is short of room.
const NEXT_SHORT: usize = 160;

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

impl CommandState {
    /// The command's ledger line (without the bullet): `` `cmd` `` when
    /// its latest run exited 0 (the section's heading says so), else
    /// `` `cmd` → status``, the status one of `ok` (no code reported),
    /// `ok, exit N`, `failed, exit N`, `failed`, `no output in this span`;
    /// `N runs` added when it ran more than once.
    pub fn line(&self) -> String {
        let mut parts = Vec::new();
        match (self.failed, self.exit) {
            (None, _) => parts.push("no output in this span".to_owned()),
            (Some(false), Some(0)) => {}
            (Some(false), Some(code)) => parts.push(format!("ok, exit {code}")),
            (Some(false), None) => parts.push("ok".to_owned()),
            (Some(true), Some(code)) => parts.push(format!("failed, exit {code}")),
            (Some(true), None) => parts.push("failed".to_owned()),
        }
        if self.runs > 1 {
            parts.push(format!("{} runs", self.runs));
        }
        match parts.is_empty() {
            true => format!("`{}`", self.command),
            false => format!("`{}` → {}", self.command, parts.join(", ")),
        }
    }

    /// Reads a ledger line back ([`line`](Self::line), and the older
    /// `` `cmd` → ok (exit 0), ran 2 times`` form); `None` when it is not
    /// one.
    pub fn parse(line: &str) -> Option<CommandState> {
        let rest = line.strip_prefix('`')?;
        let (command, status) = match rest.rfind("` → ") {
            Some(at) => (&rest[..at], &rest[at + "` → ".len()..]),
            None => (rest.strip_suffix('`')?, ""),
        };
        let number_after = |word: &str| -> Option<i64> {
            let i = status.find(word)? + word.len();
            let digits: String = status[i..]
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '-')
                .collect();
            digits.parse().ok()
        };
        let (failed, exit) = if status.starts_with("no output") {
            (None, number_after("exit"))
        } else if status.starts_with("failed") {
            (Some(true), number_after("exit"))
        } else if status.starts_with("ok") {
            (Some(false), number_after("exit"))
        } else {
            (Some(false), Some(0))
        };
        let runs = number_after("ran")
            .or_else(|| {
                let end = status.find(" runs")?;
                let start = status[..end].rfind(' ').map_or(0, |i| i + 1);
                status[start..end].parse().ok()
            })
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(1)
            .max(1);
        (!command.is_empty()).then(|| CommandState {
            command: command.to_owned(),
            exit,
            failed,
            runs,
        })
    }
}

/// Where the entries of a state record that do not fit went (what its
/// count lines say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collapsed<'a> {
    /// Nowhere the record can name: `(N earlier files not listed)`.
    NotListed,
    /// Into the span's archive, which the agent has no tool to read (a
    /// text-action agent): `(N earlier files archived)`.
    Archived,
    /// Into the span's archive under this handle, which the agent reads
    /// with `context_expand`: the first count line names the call.
    Expand(&'a str),
}

impl<'a> Collapsed<'a> {
    /// Into the archive under `handle`, named as `channel` allows.
    pub fn archived(handle: &'a str, channel: ToolChannel) -> Collapsed<'a> {
        match channel {
            ToolChannel::Tools => Collapsed::Expand(handle),
            ToolChannel::TextActions => Collapsed::Archived,
        }
    }
}

impl StateRecord {
    /// Reads the record out of `turns` (text actions as `actions`).
    pub fn build(turns: &[Message], actions: &TextActions) -> StateRecord {
        StateRecord::build_focused(turns, None, actions)
    }

    /// [`build`](Self::build), with the asks that mention `focus`
    /// (lowercase) kept at the latest ask's larger size.
    pub fn build_focused(
        turns: &[Message],
        focus: Option<&str>,
        actions: &TextActions,
    ) -> StateRecord {
        let mut record = StateRecord::default();
        // A summary merged into an ask: the ask's own words.
        let own = |m: &Message| match is_summary(m) {
            true => without_summary(&m.text()),
            false => m.text().into_owned(),
        };
        let asks: Vec<usize> = (0..turns.len())
            .filter(|&i| is_real_user_turn(turns, i, actions) && !own(&turns[i]).trim().is_empty())
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
        for call in tool_output::calls(turns, actions) {
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
        // The agent's own words: a summary merged into its turn is not.
        record.next = turns
            .iter()
            .rev()
            .filter(|m| m.role == Role::Assistant)
            .map(own)
            .find(|text| !text.trim().is_empty())
            .map(|text| clip(&one_line(last_paragraph(text.trim())), NEXT_MAX));
        record
    }

    /// Merges the record of a previous summary into this one (the
    /// ledger carried forward): its asks, files, commands, failing tests
    /// and error lines come first, as older entries; an entry this span
    /// has too stays once, at its newer place (a command keeps this span's
    /// status and adds up the runs). Files the previous record did not list
    /// because a listed command named them come back from those commands.
    /// `previous` is the previous summary's text; without a record in it
    /// nothing changes.
    ///
    /// A `previous` that holds several records (the summaries of more than
    /// one earlier compaction, oldest first) carries them all, in order.
    pub fn carry_over(&mut self, previous: &str) {
        let starts: Vec<usize> = previous
            .match_indices(STATE_RECORD_HEADING)
            .map(|(at, _)| at)
            .collect();
        // Newest first: each carried record goes before what is there.
        for (k, &at) in starts.iter().enumerate().rev() {
            let end = starts.get(k + 1).copied().unwrap_or(previous.len());
            self.carry_one(&previous[at..end]);
        }
    }

    /// [`carry_over`](Self::carry_over) of one record, `record` starting at
    /// its heading.
    fn carry_one(&mut self, record: &str) {
        let old = parse_sections(record);
        let items = |title: &str| -> Vec<String> {
            old.iter()
                .find(|(t, _)| t.starts_with(title))
                .map(|(_, items)| items.clone())
                .unwrap_or_default()
        };
        let merge = |mine: &mut Vec<String>, older: Vec<String>| {
            let mut merged: Vec<String> = older.into_iter().filter(|i| !mine.contains(i)).collect();
            merged.dedup();
            merged.append(mine);
            *mine = merged;
        };
        let commands: Vec<CommandState> = items("Commands")
            .iter()
            .filter_map(|line| CommandState::parse(line))
            .collect();
        let mut files = items("Files");
        for c in &commands {
            for path in tool_output::shell_paths(&c.command) {
                if !files.contains(&path) {
                    files.push(path);
                }
            }
        }
        merge(&mut self.asks, items("User asks"));
        merge(&mut self.files, files);
        merge(&mut self.failing_tests, items("Failing tests"));
        merge(&mut self.errors, items("Errors"));
        let mut merged: Vec<CommandState> = Vec::with_capacity(commands.len());
        for c in commands {
            match self.commands.iter_mut().find(|m| m.command == c.command) {
                Some(newer) => newer.runs += c.runs,
                None => match merged.iter_mut().find(|m| m.command == c.command) {
                    Some(same) => *same = c,
                    None => merged.push(c),
                },
            }
        }
        merged.append(&mut self.commands);
        self.commands = merged;
    }

    /// The record a rendered one holds (what [`carry_over`](Self::carry_over)
    /// reads, and its next step), so it can be rendered again in less room;
    /// `None` when `text` holds no record.
    pub fn parse(text: &str) -> Option<StateRecord> {
        let at = text.find(STATE_RECORD_HEADING)?;
        let mut record = StateRecord::default();
        record.carry_over(&text[at..]);
        record.next = parse_sections(&text[at..])
            .into_iter()
            .find(|(title, _)| title == "Next")
            .and_then(|(_, items)| items.into_iter().next())
            .filter(|n| n != "not stated");
        Some(record)
    }

    /// The record as Markdown within about `budget` bytes (see the module
    /// docs). `collapsed` says where the entries that do not fit went.
    pub fn render(&self, budget: usize, collapsed: Collapsed<'_>) -> String {
        let mut keep = [
            self.asks.len(),
            self.files.len(),
            self.commands.len(),
            self.failing_tests.len(),
            self.errors.len(),
        ];
        // The asks give way last: first the older asks are cut to their
        // opening (which says what was asked; the latest keeps its
        // details, within a quarter of the budget), then the other lists collapse (oldest entries of the
        // longest first, down to their count), then the older asks
        // collapse (the first, the task, and the latest stay).
        let mut asks = self.asks.clone();
        let mut next = self.next.clone().unwrap_or_else(|| "not stated".into());
        let mut shortened = false;
        loop {
            let (text, shown) = self.render_keeping(&asks, &keep, &next, collapsed);
            if text.len() <= budget {
                return text;
            }
            let last = asks.len().saturating_sub(1);
            if !shortened {
                for ask in &mut asks[..last] {
                    *ask = clip(ask, ASK_SHORT);
                }
                // The latest keeps its details, but not more than a
                // quarter of the room (a pasted demonstration or log would
                // leave none for the other lists).
                if let Some(ask) = asks.last_mut() {
                    *ask = clip_middle(ask, ASK_MAX.max(budget / 4));
                }
                next = clip(&next, NEXT_SHORT);
                shortened = true;
                continue;
            }
            // The list that shows the most entries gives one up (a file a
            // kept command names is not shown, so it does not count).
            if let Some(k) = (1..keep.len())
                .filter(|&k| shown[k] > 0)
                .max_by_key(|&k| (shown[k], usize::MAX - k))
            {
                keep[k] = shown[k] - 1;
                continue;
            }
            if keep[0] > 2 {
                keep[0] -= 1;
                continue;
            }
            return clip(&text, budget.max(STATE_RECORD_HEADING.len() + 64));
        }
    }

    /// The record's lists (what a left-out note carries: its asks and
    /// next step are left to the caller) in at most `room` bytes, under a
    /// line of its own, without the heading and the next step, entries
    /// collapsing as in [`render`](Self::render); `None` when no entry
    /// fits.
    pub fn render_entries(&self, room: usize) -> Option<String> {
        const LEAD: &str = "Their state record:";
        let next = "### Next\n- not stated";
        let record = StateRecord {
            asks: Vec::new(),
            next: None,
            ..self.clone()
        };
        let extra = STATE_RECORD_HEADING.len() + next.len() + 2;
        let text = record.render(
            (room + extra).saturating_sub(LEAD.len() + 1),
            Collapsed::NotListed,
        );
        let body = text
            .strip_prefix(STATE_RECORD_HEADING)?
            .trim_start()
            .strip_suffix(next)?
            .trim_end();
        let entry = body
            .lines()
            .any(|l| l.starts_with("- ") && !l.starts_with("- ("));
        (entry && body.len() + LEAD.len() < room).then(|| format!("{LEAD}\n{body}"))
    }

    /// The record keeping the newest `keep[k]` entries of each list, and
    /// how many each list shows.
    fn render_keeping(
        &self,
        asks: &[String],
        keep: &[usize; 5],
        next: &str,
        collapsed: Collapsed<'_>,
    ) -> (String, [usize; 5]) {
        let mut out = String::from(STATE_RECORD_HEADING);
        out.push('\n');
        let kept = |len: usize, k: usize| len.saturating_sub(k);
        // Compact first: a file a kept command names verbatim, a failing
        // test a kept error line names, need no line of their own.
        let commands: Vec<String> = self.commands.iter().map(CommandState::line).collect();
        let kept_commands = &self.commands[kept(self.commands.len(), keep[2])..];
        let kept_errors = &self.errors[kept(self.errors.len(), keep[4])..];
        let files: Vec<String> = self
            .files
            .iter()
            .filter(|f| !kept_commands.iter().any(|c| names(&c.command, f)))
            .cloned()
            .collect();
        let tests: Vec<String> = self
            .failing_tests
            .iter()
            .filter(|t| !kept_errors.iter().any(|e| e.contains(t.as_str())))
            .cloned()
            .collect();
        let nouns = ["asks", "files", "commands", "tests", "error lines"];
        let lists: [&[String]; 5] = [asks, &files, &commands, &tests, &self.errors];
        let mut shown = [0; 5];
        // The handle is named once, on the first count line.
        let mut named = false;
        for (k, items) in lists.iter().enumerate() {
            let dropped = items.len().saturating_sub(keep[k]);
            shown[k] = items.len() - dropped;
            if items.is_empty() {
                continue;
            }
            let _ = writeln!(out, "### {}", TITLES[k]);
            // Asks keep the first (the task) ahead of the collapsed ones.
            let lead = usize::from(k == 0 && dropped > 0);
            for item in &items[..lead] {
                let _ = writeln!(out, "- {}", item.replace('\n', "\n  "));
            }
            if dropped > 0 {
                let noun = nouns[k];
                let _ = match collapsed {
                    Collapsed::Expand(_) if named => {
                        writeln!(out, "- ({dropped} earlier {noun} archived there too)")
                    }
                    Collapsed::Expand(h) => writeln!(
                        out,
                        "- ({dropped} earlier {noun} archived: {EXPAND_TOOL} {})",
                        json!({ "handle": h })
                    ),
                    Collapsed::Archived => writeln!(out, "- ({dropped} earlier {noun} archived)"),
                    Collapsed::NotListed => {
                        writeln!(out, "- ({dropped} earlier {noun} not listed)")
                    }
                };
                named = true;
            }
            for item in &items[(dropped + lead).min(items.len())..] {
                let _ = writeln!(out, "- {}", item.replace('\n', "\n  "));
            }
        }
        let _ = writeln!(out, "### Next");
        let _ = writeln!(out, "- {next}");
        (out.trim_end().to_owned(), shown)
    }
}

/// Whether `command` names `path` as a word of its own (not inside a
/// longer path), so the command's line shows the file.
fn names(command: &str, path: &str) -> bool {
    let boundary = |c: Option<char>| {
        c.is_none_or(|c| {
            c.is_whitespace()
                || matches!(
                    c,
                    '\'' | '"' | '=' | ':' | ';' | '>' | '<' | '|' | '(' | ')' | ','
                )
        })
    };
    command.match_indices(path).any(|(i, _)| {
        boundary(command[..i].chars().next_back())
            && boundary(command[i + path.len()..].chars().next())
    })
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
        let r = StateRecord::build(&span(), crate::validate::auto_text_actions());
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
        let text = r.render(10_000, Collapsed::NotListed);
        assert!(text.starts_with(STATE_RECORD_HEADING), "{text}");
        assert!(
            text.contains("- `python -m pytest -q` → 2 runs\n"),
            "{text}"
        );
    }

    #[test]
    fn over_budget_the_oldest_entries_collapse_into_counts_with_the_handle() {
        let mut turns = vec![Message::user("do it")];
        for k in 0..40 {
            turns.extend(mini(
                &format!("cat src/a/long/folder/file{k}.py | head -n 50"),
                0,
                "x",
            ));
        }
        let r = StateRecord::build(&turns, crate::validate::auto_text_actions());
        let full = r.render(100_000, Collapsed::NotListed);
        let small = r.render(1_200, Collapsed::Expand("s-12-57"));
        assert!(small.len() <= 1_200, "{}", small.len());
        assert!(small.len() < full.len());
        // The handle is named once, on the first count line; the others
        // point there.
        assert_eq!(
            small
                .matches("context_expand {\"handle\":\"s-12-57\"}")
                .count(),
            1,
            "{small}"
        );
        assert!(
            small.contains("earlier files archived: context_expand {\"handle\":\"s-12-57\"}"),
            "{small}"
        );
        assert!(
            small.contains("earlier commands archived there too)"),
            "{small}"
        );
        assert!(small.contains("file39.py"), "the newest stays: {small}");
        assert!(small.contains("- do it"));
        let mut again = StateRecord::build(
            &[Message::user("then ship it")],
            crate::validate::auto_text_actions(),
        );
        again.carry_over(&format!("[summary]\n{full}"));
        assert_eq!(again.asks, vec!["do it", "then ship it"]);
        assert_eq!(again.files.len(), 40);
        // A file whose command collapsed is listed on its own again.
        assert!(small.contains("- src/a/long/folder/file"), "{small}");
        assert!(
            small.contains("src/a/long/folder/file39.py | head"),
            "{small}"
        );
        let bare = r.render(1_200, Collapsed::NotListed);
        assert!(bare.contains("earlier commands not listed"), "{bare}");
        assert!(!bare.contains("omitted"));
        // A text-action agent, which has no tool to call: archived, no call.
        let text = r.render(
            1_200,
            Collapsed::archived("s-12-57", ToolChannel::TextActions),
        );
        assert!(text.contains("earlier files archived)"), "{text}");
        assert!(
            !text.contains(EXPAND_TOOL) && !text.contains("s-12-57"),
            "{text}"
        );
        let parsed = StateRecord::parse(&text).expect("record");
        assert!(
            parsed.files.iter().all(|f| f.starts_with("src/")),
            "the counts are not entries: {:?}",
            parsed.files
        );
    }

    #[test]
    fn the_entries_alone_fit_their_room_or_are_none() {
        let r = StateRecord::build(&span(), crate::validate::auto_text_actions());
        let all = r.render_entries(10_000).unwrap();
        assert!(all.starts_with("Their state record:\n### Files"), "{all}");
        assert!(
            !all.contains("User asks") && !all.contains("### Next"),
            "{all}"
        );
        assert!(all.contains("`python -m pytest -q` → 2 runs"), "{all}");
        for room in [120, 200, 300] {
            if let Some(some) = r.render_entries(room) {
                assert!(some.len() <= room, "{room}: {some}");
            }
        }
        assert_eq!(StateRecord::default().render_entries(10_000), None);
    }

    #[test]
    fn command_lines_read_back_in_both_forms() {
        for (failed, exit, runs) in [
            (Some(false), Some(0), 1),
            (Some(false), Some(0), 5),
            (Some(false), Some(1), 3),
            (Some(false), None, 1),
            (Some(true), Some(2), 2),
            (Some(true), None, 1),
            (None, None, 4),
        ] {
            let c = CommandState {
                command: "grep -n \"a` b\" src/x.py".into(),
                exit,
                failed,
                runs,
            };
            assert_eq!(
                CommandState::parse(&c.line()),
                Some(c.clone()),
                "{}",
                c.line()
            );
        }
        let old = CommandState::parse("`python -m pytest -q` → ok (exit 0), ran 2 times").unwrap();
        assert_eq!((old.exit, old.failed, old.runs), (Some(0), Some(false), 2));
        assert_eq!(CommandState::parse("not a command"), None);
    }

    #[test]
    fn the_ledger_is_carried_through_repeated_compactions() {
        // Three compactions in a row, each over a new span and the previous
        // summary: every file, command and error line of the first span is
        // still in the third summary, a rerun command once with its latest
        // status and its runs added up.
        let first = {
            let mut v = vec![Message::user("Please fix tests/test_io.py")];
            v.extend(mini("cat src/io.py", 0, "def read(): pass"));
            v.extend(mini(
                "python -m pytest -q",
                1,
                "FAILED tests/test_io.py::test_read - KeyError: 'x'",
            ));
            v
        };
        let summary1 = StateRecord::build(&first, crate::validate::auto_text_actions())
            .render(10_000, Collapsed::Expand("s1"));
        assert!(
            !summary1.contains("- src/io.py"),
            "named by its command: {summary1}"
        );
        let mut second = StateRecord::build(
            &mini("sed -i 's/a/b/' src/io.py", 0, ""),
            crate::validate::auto_text_actions(),
        );
        second.carry_over(&summary1);
        let summary2 = second.render(10_000, Collapsed::Expand("s2"));
        let mut third = StateRecord::build(
            &mini("python -m pytest -q", 0, "1 passed"),
            crate::validate::auto_text_actions(),
        );
        third.carry_over(&summary2);
        assert_eq!(third.asks, vec!["Please fix tests/test_io.py"]);
        assert_eq!(third.files, vec!["src/io.py"]);
        let commands: Vec<String> = third.commands.iter().map(CommandState::line).collect();
        assert_eq!(
            commands,
            vec![
                "`cat src/io.py`",
                "`sed -i 's/a/b/' src/io.py`",
                "`python -m pytest -q` → 2 runs",
            ]
        );
        assert_eq!(
            third.errors,
            vec!["FAILED tests/test_io.py::test_read - KeyError: 'x'"]
        );
        let text = third.render(10_000, Collapsed::NotListed);
        assert!(text.contains("- `cat src/io.py`\n"), "{text}");
        // The failing test is in the error line: not listed twice.
        assert!(!text.contains("### Failing tests"), "{text}");
        assert!(
            !text.contains("- none"),
            "empty sections are left out: {text}"
        );
    }
}

#[cfg(test)]
mod codex_tests {
    use super::*;
    use crate::message::ToolCall;

    #[test]
    fn codex_shell_calls_enter_the_ledger_with_their_files() {
        let mut v = vec![
            Message::system("sys"),
            Message::user("Read every file and report the checksums"),
        ];
        for k in 0..20 {
            let id = format!("call_{k}");
            v.push(Message::assistant_tool_calls(
                "",
                vec![ToolCall::function(
                    id.clone(),
                    "exec_command",
                    format!("{{\"cmd\":\"cat file_{k}.txt\"}}"),
                )],
            ));
            v.push(Message::tool_result(
                &id,
                format!("Chunk ID: 0e1d96\nProcess exited with code 0\nOutput:\nFILE {k}\n"),
            ));
        }
        let r = StateRecord::build(&v, crate::validate::auto_text_actions());
        assert_eq!(r.commands.len(), 20);
        let text = r.render(3000, Collapsed::Expand("h123"));
        for k in 0..20 {
            assert!(text.contains(&format!("file_{k}.txt")), "{text}");
        }
    }
}
