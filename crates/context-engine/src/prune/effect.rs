//! What a tool call did to files: which it showed (read) and which it
//! changed (edit). The superseded-read rule needs nothing more, and guessing
//! wrong must only ever mean pruning less: anything not recognised is
//! `other`, and a result with `other` in it is never taken for a read.

use serde_json::{Map, Value};

use crate::tool_output::shell::{
    is_assignment, is_shell_tool, logical_lines, pipelines, sed_files, split_redirect,
};

/// How much of a file a read showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The whole file (`cat f`, a `view` without a range).
    Full,
    /// A part named by the rest of the command (`sed -n 10,20p`, `head -n
    /// 5`, a `view_range`): only the same part, a full read or an edit
    /// supersedes it.
    Part(String),
}

impl Scope {
    /// Whether a later read of this scope shows all that `earlier` showed.
    pub(crate) fn covers(&self, earlier: &Scope) -> bool {
        match (self, earlier) {
            (Scope::Full, _) => true,
            (Scope::Part(a), Scope::Part(b)) => a == b,
            (Scope::Part(_), Scope::Full) => false,
        }
    }
}

/// The file effects of one call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Effect {
    /// Files the output shows, by resolved path.
    pub reads: Vec<(String, Scope)>,
    /// Files the call changed, by resolved path.
    pub edits: Vec<String>,
    /// The call did something else too (or was not understood): its output
    /// is more than file content.
    pub other: bool,
}

impl Effect {
    fn other() -> Effect {
        Effect {
            other: true,
            ..Effect::default()
        }
    }

    /// Whether the output is file content only, so later reads or edits of
    /// those files can make it stale.
    pub(crate) fn is_pure_read(&self) -> bool {
        !self.other && !self.reads.is_empty()
    }
}

/// The effect of a call named `name` with `arguments` (the raw JSON text).
/// `current` is the file a windowed editor (SWE-agent's `open`/`edit`) has
/// open; calls that open or create a file update it.
pub(crate) fn of_call(name: &str, arguments: &str, current: &mut Option<String>) -> Effect {
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else {
        return Effect::other();
    };
    let path = ["path", "file_path", "filename"]
        .iter()
        .find_map(|k| args.get(*k).and_then(Value::as_str))
        .filter(|p| !p.is_empty());
    let command = ["command", "cmd"]
        .iter()
        .find_map(|k| args.get(*k).and_then(Value::as_str));
    match (path, command) {
        (None, Some(cmd)) if is_shell_tool(name) => of_shell(cmd),
        (Some(p), _) => of_file_tool(name, &args, p, current),
        (None, _) => of_windowed_edit(name, current),
    }
}

/// The effect of a text action (a command the assistant wrote as text):
/// SWE-agent's editor commands (`open path [line]`, `create path`, `edit`,
/// `insert`, `goto`, `scroll_*`) as its file tools, anything else as a
/// shell command.
pub(crate) fn of_text_action(command: &str, current: &mut Option<String>) -> Effect {
    let first_line = command.lines().next().unwrap_or("");
    let words: Vec<&str> = first_line.split_whitespace().collect();
    let Some((&verb, rest)) = words.split_first() else {
        return Effect::other();
    };
    match verb {
        "open" | "create" => {
            let Some(path) = rest.first() else {
                return Effect::other();
            };
            let path = path.trim_matches(['"', '\'']);
            let mut args = serde_json::json!({ "path": path });
            if let Some(line) = rest.get(1) {
                args["line_number"] = Value::String((*line).to_owned());
            }
            of_call(verb, &args.to_string(), current)
        }
        "edit" | "insert" | "goto" | "scroll_up" | "scroll_down" => of_windowed_edit(verb, current),
        _ => of_shell(command),
    }
}

/// Names of file tools (or `command` values of `str_replace_editor`-style
/// tools) that show a file.
const READ_OPS: &[&str] = &[
    "view",
    "read",
    "read_file",
    "open",
    "open_file",
    "view_file",
    "cat",
];

/// Names or `command` values that change a file.
const EDIT_OPS: &[&str] = &[
    "edit",
    "create",
    "write",
    "write_file",
    "edit_file",
    "create_file",
    "insert",
    "str_replace",
    "replace",
    "append",
    "undo_edit",
    "delete",
    "delete_file",
];

/// Arguments that make a read partial.
const RANGE_KEYS: &[&str] = &[
    "view_range",
    "line_number",
    "offset",
    "limit",
    "start_line",
    "end_line",
    "lines",
    "range",
];

fn of_file_tool(
    name: &str,
    args: &Map<String, Value>,
    path: &str,
    current: &mut Option<String>,
) -> Effect {
    let name = name.to_ascii_lowercase();
    let op = args
        .get("command")
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase)
        .unwrap_or_else(|| name.clone());
    let path = resolve(None, path);
    if READ_OPS.contains(&op.as_str()) {
        let range: Vec<String> = RANGE_KEYS
            .iter()
            .filter_map(|k| args.get(*k).map(|v| format!("{k}={v}")))
            .collect();
        // SWE-agent's `open` shows a window, never the whole file.
        let scope = if range.is_empty() && name != "open" {
            Scope::Full
        } else {
            Scope::Part(format!("{name} {}", range.join(" ")))
        };
        if name == "open" {
            *current = Some(path.clone());
        }
        return Effect {
            reads: vec![(path, scope)],
            ..Effect::default()
        };
    }
    if EDIT_OPS.contains(&op.as_str()) {
        if name == "create" {
            *current = Some(path.clone());
        }
        return Effect {
            edits: vec![path],
            ..Effect::default()
        };
    }
    Effect::other()
}

/// SWE-agent's windowed `edit`/`insert` change the open file.
fn of_windowed_edit(name: &str, current: &Option<String>) -> Effect {
    match current {
        Some(path) if matches!(name, "edit" | "insert") => Effect {
            edits: vec![path.clone()],
            ..Effect::default()
        },
        _ => Effect::other(),
    }
}

/// `base` joined with `path` and normalised (`.`, `..`, repeated `/`), so
/// `cd /testbed && cat a/b.py` and `view /testbed/a/b.py` name one file.
pub(crate) fn resolve(base: Option<&str>, path: &str) -> String {
    let joined = match base {
        Some(b) if !path.starts_with('/') && !path.starts_with('~') => format!("{b}/{path}"),
        _ => path.to_owned(),
    };
    let absolute = joined.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            _ => parts.push(c),
        }
    }
    let body = parts.join("/");
    if absolute { format!("/{body}") } else { body }
}

/// The effect of a shell command: each line (heredoc bodies skipped) is
/// split into words with `shlex`, then into pipelines at `&&`, `||`, `;`,
/// `&`, and each pipeline is classified.
pub(crate) fn of_shell(command: &str) -> Effect {
    let mut effect = Effect::default();
    let mut cwd: Option<String> = None;
    for line in logical_lines(command) {
        let Some(words) = shlex::split(&line) else {
            effect.other = true;
            continue;
        };
        for pipeline in pipelines(words) {
            pipeline_effect(&pipeline, &mut cwd, &mut effect);
        }
    }
    effect
}

/// Filters a read may be piped through and still only show (part of) the
/// file.
const FILTERS: &[&str] = &[
    "head", "tail", "grep", "egrep", "fgrep", "nl", "wc", "sort", "uniq", "cut", "cat", "less",
    "more", "tr", "column",
];

/// Output redirections of a stage: the files written, and the stage's words
/// without them. `2>&1`, `>/dev/null` and input redirections write nothing.
fn split_redirects(stage: &[String]) -> (Vec<String>, Vec<String>, bool) {
    let mut written = Vec::new();
    let mut words = Vec::new();
    let mut redirected = false;
    let mut it = stage.iter().peekable();
    while let Some(w) = it.next() {
        let (op, target) = split_redirect(w);
        match op {
            Some(op) => {
                let target = match target {
                    Some(t) => Some(t.to_owned()),
                    None => it.next().cloned(),
                };
                if op.ends_with('>')
                    && let Some(t) = target
                    && !t.starts_with('&')
                    && t != "/dev/null"
                {
                    written.push(t);
                    if !op.starts_with('2') {
                        redirected = true;
                    }
                }
            }
            None => words.push(w.clone()),
        }
    }
    (written, words, redirected)
}

fn pipeline_effect(stages: &[Vec<String>], cwd: &mut Option<String>, effect: &mut Effect) {
    let mut piped_out = false;
    let mut parsed = Vec::new();
    for stage in stages {
        let (written, words, redirected) = split_redirects(stage);
        for w in written {
            effect.edits.push(resolve(cwd.as_deref(), &w));
        }
        piped_out |= redirected;
        // `VAR=value cmd`: the assignment is not the command.
        let start = words
            .iter()
            .position(|w| !is_assignment(w))
            .unwrap_or(words.len());
        parsed.push(words[start..].to_vec());
    }
    let Some(first) = parsed.first() else {
        return;
    };
    let Some(cmd) = first.first().map(String::as_str) else {
        return; // only redirections, e.g. `> file`
    };
    let args = &first[1..];
    match cmd {
        "cd" if parsed.len() == 1 => {
            if let Some(dir) = args.first() {
                *cwd = Some(resolve(cwd.as_deref(), dir));
            }
            return;
        }
        "sed" if has_flag(args, "-i") => {
            for f in sed_files(args) {
                effect.edits.push(resolve(cwd.as_deref(), f));
            }
            return;
        }
        "tee" => {
            for f in args.iter().filter(|a| !a.starts_with('-')) {
                effect.edits.push(resolve(cwd.as_deref(), f));
            }
            return;
        }
        "rm" | "touch" | "mv" | "cp" | "truncate" => {
            let files: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
            let changed = if cmd == "cp" {
                files.last().copied().into_iter().collect()
            } else {
                files
            };
            for f in changed {
                effect.edits.push(resolve(cwd.as_deref(), f));
            }
            return;
        }
        _ => {}
    }
    let read = if piped_out { None } else { read_of(cmd, args) };
    let filters_only = parsed[1..]
        .iter()
        .all(|s| s.first().is_some_and(|c| FILTERS.contains(&c.as_str())));
    match read {
        Some((files, scope)) if filters_only && !files.is_empty() => {
            let scope = if parsed.len() > 1 {
                let tail: Vec<String> = parsed[1..].iter().map(|s| s.join(" ")).collect();
                let base = match scope {
                    Scope::Full => cmd.to_owned(),
                    Scope::Part(p) => p,
                };
                Scope::Part(format!("{base} | {}", tail.join(" | ")))
            } else {
                scope
            };
            for f in files {
                effect
                    .reads
                    .push((resolve(cwd.as_deref(), f), scope.clone()));
            }
        }
        _ => {
            // Output redirected into files only (`cat > f <<EOF`) shows
            // nothing; anything else is more than a read.
            if !(piped_out && matches!(cmd, "cat" | "echo" | "printf")) {
                effect.other = true;
            }
        }
    }
}

fn has_flag(args: &[String], flag: &str) -> bool {
    args.iter()
        .any(|a| a == flag || (a.starts_with(flag) && !a.starts_with("--")))
}

/// The files a read command shows and how much of them, or `None` when
/// `cmd` is not a plain read.
fn read_of<'w>(cmd: &str, args: &'w [String]) -> Option<(Vec<&'w str>, Scope)> {
    match cmd {
        "cat" => {
            let flags: Vec<&String> = args.iter().filter(|a| a.starts_with('-')).collect();
            let files = args
                .iter()
                .filter(|a| !a.starts_with('-'))
                .map(String::as_str)
                .collect();
            // Line numbers (`-n`) still show every line.
            let scope = if flags.iter().all(|f| *f == "-n") {
                Scope::Full
            } else {
                Scope::Part(format!("cat {}", join(&flags)))
            };
            Some((files, scope))
        }
        "sed" if has_flag(args, "-n") => {
            let files = sed_files(args);
            let rest: Vec<&String> = args
                .iter()
                .filter(|a| !files.contains(&a.as_str()))
                .collect();
            Some((files, Scope::Part(format!("sed {}", join(&rest)))))
        }
        "head" | "tail" | "nl" => {
            if args
                .iter()
                .any(|a| a == "-f" || a == "-F" || a == "--follow")
            {
                return None;
            }
            let mut files = Vec::new();
            let mut flags = Vec::new();
            let mut it = args.iter();
            while let Some(a) = it.next() {
                if a == "-n" || a == "-c" {
                    flags.push(a);
                    if let Some(v) = it.next() {
                        flags.push(v);
                    }
                } else if a.starts_with('-') || a.starts_with('+') {
                    flags.push(a);
                } else {
                    files.push(a.as_str());
                }
            }
            let scope = if cmd == "nl" && flags.is_empty() {
                Scope::Full
            } else {
                Scope::Part(format!("{cmd} {}", join(&flags)))
            };
            Some((files, scope))
        }
        _ => None,
    }
}

fn join(words: &[&String]) -> String {
    words
        .iter()
        .map(|w| w.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(cmd: &str) -> Vec<(String, Scope)> {
        of_shell(cmd).reads
    }

    #[test]
    fn cat_after_cd_is_a_full_read_of_the_joined_path() {
        let e = of_shell("cd /testbed && cat astropy/modeling/separable.py");
        assert!(e.is_pure_read());
        assert_eq!(
            e.reads,
            vec![(
                "/testbed/astropy/modeling/separable.py".to_owned(),
                Scope::Full
            )]
        );
    }

    #[test]
    fn partial_reads_carry_their_range() {
        let r = reads("sed -n '10,20p' src/a.py");
        assert_eq!(
            r,
            vec![("src/a.py".into(), Scope::Part("sed -n 10,20p".into()))]
        );
        assert_ne!(r, reads("sed -n '30,40p' src/a.py"));
        let r = reads("head -n 20 ./src//a.py");
        assert_eq!(
            r,
            vec![("src/a.py".into(), Scope::Part("head -n 20".into()))]
        );
        let r = reads("cat a.py | head -5");
        assert_eq!(
            r,
            vec![("a.py".into(), Scope::Part("cat | head -5".into()))]
        );
    }

    #[test]
    fn commands_that_do_more_are_not_reads() {
        for cmd in [
            "cat a.py && python a.py",
            "grep -n foo a.py",
            "cat a.py | python -",
            "tail -f log.txt",
            "sed 's/a/b/' a.py",
            "cat 'unbalanced",
        ] {
            assert!(!of_shell(cmd).is_pure_read(), "{cmd}");
        }
    }

    #[test]
    fn edits_are_found_in_redirects_sed_i_and_heredocs() {
        let e = of_shell("cd /w && cat > b.py << 'EOF'\nprint(1)\ncat x.py\nEOF\n");
        assert_eq!(e.edits, vec!["/w/b.py".to_owned()]);
        assert!(e.reads.is_empty() && !e.other, "{e:?}");
        assert_eq!(
            of_shell("sed -i 's/a/b/g' x.py y.py").edits,
            vec!["x.py", "y.py"]
        );
        assert_eq!(of_shell("echo hi >> notes.txt").edits, vec!["notes.txt"]);
        assert!(of_shell("python t.py 2>&1 > /dev/null").edits.is_empty());
    }

    #[test]
    fn file_tools_read_and_edit_by_path() {
        let mut cur = None;
        let e = of_call(
            "str_replace_editor",
            r#"{"command":"view","path":"/t/a.py"}"#,
            &mut cur,
        );
        assert_eq!(e.reads, vec![("/t/a.py".into(), Scope::Full)]);
        let e = of_call(
            "str_replace_editor",
            r#"{"command":"view","path":"/t/a.py","view_range":[1,5]}"#,
            &mut cur,
        );
        assert!(matches!(e.reads[0].1, Scope::Part(_)));
        let e = of_call(
            "str_replace_editor",
            r#"{"command":"str_replace","path":"/t/a.py","old_str":"a","new_str":"b"}"#,
            &mut cur,
        );
        assert_eq!(e.edits, vec!["/t/a.py"]);
        // SWE-agent: `open` sets the file a later path-less `edit` changes.
        let e = of_call("open", r#"{"path":"src/f.py","line_number":9}"#, &mut cur);
        assert!(e.is_pure_read());
        let e = of_call("edit", r#"{"text":"x"}"#, &mut cur);
        assert_eq!(e.edits, vec!["src/f.py"]);
        assert!(of_call("bash", "not json", &mut cur).other);
        assert!(of_call("find_file", r#"{"file_name":"a.py"}"#, &mut cur).other);
    }

    #[test]
    fn text_actions_as_file_tools_or_shell() {
        let mut current = None;
        let open = of_text_action("open pydicom/handler.py 293", &mut current);
        assert!(open.is_pure_read());
        assert_eq!(current.as_deref(), Some("pydicom/handler.py"));
        let edit = of_text_action("edit 287:295\n    x = 1\nend_of_edit", &mut current);
        assert_eq!(edit.edits, vec!["pydicom/handler.py"]);
        let cat = of_text_action("cat tests/missing_colon.py", &mut current);
        assert!(cat.is_pure_read());
        assert!(of_text_action("python reproduce.py", &mut current).other);
    }

    #[test]
    fn scopes_cover_what_they_show() {
        let part = Scope::Part("sed -n 1,5p".into());
        assert!(Scope::Full.covers(&part));
        assert!(part.covers(&part.clone()));
        assert!(!part.covers(&Scope::Full));
        assert!(!Scope::Part("head".into()).covers(&part));
    }

    #[test]
    fn paths_normalise() {
        assert_eq!(resolve(Some("/a/b"), "../c/./d.py"), "/a/c/d.py");
        assert_eq!(resolve(Some("/a"), "/x//y"), "/x/y");
        assert_eq!(resolve(None, "./x"), "x");
    }
}
