//! Shell command text at the word level: which tools take a command, its
//! logical lines, pipelines and redirections (what [`crate::prune`] reads
//! a call's file effect from, and where the paths a command names are
//! found).

/// Tools that take a shell command in `command` or `cmd`.
pub(crate) fn is_shell_tool(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "bash",
        "shell",
        "sh",
        "exec",
        "execute",
        "execute_bash",
        "execute_command",
        "run",
        "run_command",
        "run_shell_command",
        "terminal",
        "cmd",
        "command",
        // Codex's shell tools (`cmd` / `command`).
        "exec_command",
        "local_shell",
        "container.exec",
        "run_terminal_cmd",
        "run_in_terminal",
    ]
    .contains(&n.as_str())
        || n.contains("bash")
        || n.contains("shell")
}

/// Lines of a script with `\` continuations joined and heredoc bodies
/// dropped (the line that opens a heredoc stays: it says where the text
/// goes).
pub(crate) fn logical_lines(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut heredoc: Option<String> = None;
    for raw in command.lines() {
        if let Some(marker) = &heredoc {
            if raw.trim() == marker {
                heredoc = None;
            }
            continue;
        }
        if let Some(stripped) = raw.strip_suffix('\\') {
            pending.push_str(stripped);
            pending.push(' ');
            continue;
        }
        pending.push_str(raw);
        heredoc = heredoc_marker(&pending).or_else(|| editor_block_marker(&pending, command));
        out.push(std::mem::take(&mut pending));
    }
    if !pending.is_empty() {
        out.push(pending);
    }
    out
}

/// The end marker of a SWE-agent editor block opened on `line`: `edit
/// 287:295` (or `insert 12`, `append`) followed by the new text and a line
/// `end_of_edit` (`end_of_insert`, …); the text between is file content, not
/// commands. Only when `command` has that end line.
fn editor_block_marker(line: &str, command: &str) -> Option<String> {
    let word = line.split_whitespace().next()?;
    if !word.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
        return None;
    }
    let marker = format!("end_of_{word}");
    command
        .lines()
        .any(|l| l.trim() == marker)
        .then_some(marker)
}

/// The end marker of a heredoc opened on `line` (`<< 'EOF'`, `<<-EOF`).
fn heredoc_marker(line: &str) -> Option<String> {
    let at = line.find("<<")?;
    let rest = line[at + 2..].trim_start_matches(['-', '~']).trim_start();
    if rest.starts_with('<') {
        return None; // a here-string `<<<`
    }
    let word: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && !matches!(c, ';' | '&' | '|' | '>' | ')'))
        .filter(|c| !matches!(c, '\'' | '"'))
        .collect();
    (!word.is_empty()).then_some(word)
}

/// Words split into pipelines (at `&&`, `||`, `;`, `&`), each a list of
/// stages (at `|`).
pub(crate) fn pipelines(words: Vec<String>) -> Vec<Vec<Vec<String>>> {
    let mut out = Vec::new();
    let mut stages: Vec<Vec<String>> = Vec::new();
    let mut stage: Vec<String> = Vec::new();
    for mut w in words {
        let mut ends_list = false;
        if w.len() > 1 && w.ends_with(';') {
            w.pop();
            ends_list = true;
        }
        match w.as_str() {
            "&&" | "||" | ";" | "&" => {
                stages.push(std::mem::take(&mut stage));
                out.push(std::mem::take(&mut stages));
                continue;
            }
            "|" | "|&" => {
                stages.push(std::mem::take(&mut stage));
                continue;
            }
            _ => stage.push(w),
        }
        if ends_list {
            stages.push(std::mem::take(&mut stage));
            out.push(std::mem::take(&mut stages));
        }
    }
    stages.push(stage);
    out.push(stages);
    out.into_iter()
        .map(|p| p.into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>())
        .filter(|p| !p.is_empty())
        .collect()
}

/// `>`, `>>`, `2>`, `&>`, `<`, `<<`, `<<<` at the start of a word, and what
/// follows it in the same word.
pub(crate) fn split_redirect(word: &str) -> (Option<&str>, Option<&str>) {
    let digits = word.bytes().take_while(u8::is_ascii_digit).count();
    let start = if word[digits..].starts_with('&') {
        digits + 1
    } else {
        digits
    };
    let rest = &word[start..];
    let len = rest
        .bytes()
        .take_while(|b| matches!(b, b'>' | b'<'))
        .count();
    if len == 0 {
        return (None, None);
    }
    let op = &word[..start + len];
    let target = &word[start + len..];
    (Some(op), (!target.is_empty()).then_some(target))
}

pub(crate) fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// The files of a `sed` command: the words after the script (the first
/// non-flag word, unless `-e`/`-f` gave it).
pub(crate) fn sed_files(args: &[String]) -> Vec<&str> {
    let mut script_given = false;
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "-e" || a == "-f" {
            script_given = true;
            it.next();
        } else if a.starts_with('-') {
            continue;
        } else if !script_given {
            script_given = true;
        } else {
            out.push(a.as_str());
        }
    }
    out
}
