//! The files a shell command reads or writes.
//!
//! Paths are kept as the command wrote them (not resolved against a `cd`):
//! a probe must be found word for word in the view, and the view holds the
//! command as written.

use super::shell::{is_assignment, logical_lines, pipelines, sed_files, split_redirect};

/// Commands whose non-flag arguments are files they read or write
/// (`open` and `create` are SWE-agent's editor commands; a line number
/// after the file is not a path, see [`looks_like_path`]).
const FILE_ARGS: &[&str] = &[
    "cat", "less", "more", "nl", "wc", "tac", "touch", "rm", "cp", "mv", "tee", "truncate", "diff",
    "stat", "open", "create",
];

/// Flags of `head`/`tail` that take a value.
const VALUE_FLAGS: &[&str] = &["-n", "-c", "--lines", "--bytes"];

/// Prefixes that run the command after them.
const WRAPPERS: &[&str] = &["sudo", "env", "time", "nohup", "exec", "command"];

/// The files a shell command reads or writes, as written, in order (may
/// repeat). `cd` changes no file; anything with a glob or a variable is not
/// a path yet.
pub(crate) fn shell_paths(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in logical_lines(command) {
        let Some(words) = shlex::split(&line) else {
            continue;
        };
        for pipeline in pipelines(words) {
            for stage in &pipeline {
                stage_paths(stage, &mut out);
            }
        }
    }
    out.retain(|p| looks_like_path(p) && command.contains(p.as_str()));
    out
}

fn stage_paths(stage: &[String], out: &mut Vec<String>) {
    let mut words = Vec::new();
    let mut it = stage.iter();
    while let Some(w) = it.next() {
        match split_redirect(w) {
            (Some(op), target) => {
                let target = target.map(str::to_owned).or_else(|| it.next().cloned());
                // `<<` and `<<<` take text, not a file; `>&2` a descriptor.
                if let Some(t) = target
                    && !op.ends_with("<<")
                    && !op.ends_with("<<<")
                    && !t.starts_with('&')
                {
                    out.push(t);
                }
            }
            (None, _) => words.push(w.as_str()),
        }
    }
    let start = words
        .iter()
        .position(|w| !is_assignment(w) && !WRAPPERS.contains(w))
        .unwrap_or(words.len());
    let Some((cmd, args)) = words[start..].split_first() else {
        return;
    };
    let cmd = cmd.rsplit('/').next().unwrap_or(cmd);
    let plain = |args: &[&str]| -> Vec<String> {
        args.iter()
            .filter(|a| !a.starts_with('-'))
            .map(|a| (*a).to_owned())
            .collect()
    };
    match cmd {
        c if FILE_ARGS.contains(&c) => out.extend(plain(args)),
        "head" | "tail" => {
            let mut it = args.iter();
            while let Some(a) = it.next() {
                if VALUE_FLAGS.contains(a) {
                    it.next();
                } else if !a.starts_with('-') && !a.starts_with('+') {
                    out.push((*a).to_owned());
                }
            }
        }
        "sed" => {
            let owned: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            out.extend(sed_files(&owned).into_iter().map(str::to_owned));
        }
        "grep" | "egrep" | "fgrep" | "rg" => out.extend(grep_files(args)),
        // SWE-agent's editor: `str_replace_editor view|create|str_replace|
        // insert|undo_edit <path> [--flag value …]`; `search_file <term>
        // [<file>]`.
        "str_replace_editor" => out.extend(args.get(1).map(|a| (*a).to_owned())),
        "search_file" => out.extend(args.get(1).map(|a| (*a).to_owned())),
        c if c.starts_with("python") => {
            // `python x.py args`: the script; `python -m mod`, `-c code`: none.
            for a in args {
                if *a == "-m" || *a == "-c" {
                    break;
                }
                if !a.starts_with('-') {
                    out.push((*a).to_owned());
                    break;
                }
            }
        }
        _ => {}
    }
}

/// The files of a `grep`: the words after the pattern (the first non-flag
/// word, unless `-e`/`-f` gave it).
fn grep_files(args: &[&str]) -> Vec<String> {
    let mut pattern_given = false;
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if matches!(*a, "-e" | "-f" | "--regexp" | "--file") {
            pattern_given = true;
            it.next();
        } else if matches!(*a, "-A" | "-B" | "-C" | "-m" | "--include" | "--exclude") {
            it.next();
        } else if a.starts_with('-') {
            continue;
        } else if !pattern_given {
            pattern_given = true;
        } else {
            out.push((*a).to_owned());
        }
    }
    out
}

/// Whether a word can be a file path: not empty, not `.`/`..`, not a
/// number, no glob, variable, command substitution or descriptor, not
/// `/dev/…`.
fn looks_like_path(p: &str) -> bool {
    !p.is_empty()
        && !p.bytes().all(|b| b.is_ascii_digit() || b == b':')
        && p != "."
        && p != ".."
        && !p.starts_with('-')
        && !p.starts_with("/dev/")
        && !p.contains(['*', '?', '[', '$', '`', '{', '(', '\n'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_writes_and_scripts() {
        assert_eq!(
            shell_paths("cd /testbed && cat astropy/modeling/separable.py | head -50"),
            vec!["astropy/modeling/separable.py"]
        );
        assert_eq!(
            shell_paths("sed -n '10,20p' src/a.py && head -n 5 b.txt && tail -3 c.log"),
            vec!["src/a.py", "b.txt", "c.log"]
        );
        assert_eq!(
            shell_paths("grep -rn 'def foo' src/pkg tests/test_x.py"),
            vec!["src/pkg", "tests/test_x.py"]
        );
        assert_eq!(
            shell_paths("echo hi > out.txt; echo more >> log.txt 2>&1"),
            vec!["out.txt", "log.txt"]
        );
        assert_eq!(
            shell_paths("python reproduce.py --fast && python -m pytest -q"),
            vec!["reproduce.py"]
        );
        assert_eq!(
            shell_paths("cat > fix.py <<'EOF'\nprint(open('x').read())\nEOF\npython fix.py"),
            vec!["fix.py", "fix.py"]
        );
        assert_eq!(
            shell_paths("open src/big.py 120\ncreate reproduce.py"),
            vec!["src/big.py", "reproduce.py"]
        );
        // A SWE-agent editor block is file content, not commands: its
        // lines name no file (`rm = cat > x` would give `=` and `x`).
        assert!(
            shell_paths("edit 287:295\n    rm = cat > x\n    echo = 1 > y\nend_of_edit").is_empty()
        );
        assert_eq!(
            shell_paths("insert 3\ncat = tee > z\nend_of_insert\ncat notes.txt"),
            vec!["notes.txt"]
        );
        assert_eq!(
            shell_paths("str_replace_editor create /repo/fix.py --file_text 'x = 1'"),
            vec!["/repo/fix.py"]
        );
        assert_eq!(
            shell_paths("search_file \"def _hash\" src/hash.c\nsubmit"),
            vec!["src/hash.c"]
        );
        // Without its end line, `edit` is a word like any other.
        assert_eq!(shell_paths("edit\ncat a.txt"), vec!["a.txt"]);
        assert!(shell_paths("cd /testbed && ls -la").is_empty());
        assert!(shell_paths("cat *.py $HOME/x 2>/dev/null").is_empty());
        assert!(shell_paths("grep -e foo").is_empty());
    }
}
