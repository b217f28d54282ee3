//! The lines of a tool output worth reading in a summary: what it
//! reported (errors, failing tests, the result line, an exit code), not
//! its noise (banners, progress, platform and collection headers, rows of
//! passing-test dots, separators, blank lines).

use super::{exit_code, failing_tests, is_error_line};

/// The output's telling lines, in order, each trimmed, at most `max` of
/// them: error lines, failing tests, result and exit lines first; where
/// the output has none of those, its first and last lines that are not
/// noise. Empty when the whole output is noise.
pub fn gist(body: &str, max: usize) -> Vec<&str> {
    let lines: Vec<&str> = body
        .lines()
        .map(|l| l.trim())
        .filter(|l| !is_noise(l))
        .collect();
    let failing = failing_tests(body);
    let telling: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            is_error_line(l)
                || is_result_line(l)
                || exit_code(l).is_some()
                || failing.iter().any(|t| l.contains(t.as_str()))
        })
        .collect();
    let mut out = if telling.is_empty() {
        match lines.as_slice() {
            [] => Vec::new(),
            [one] => vec![*one],
            [first, .., last] => vec![*first, *last],
        }
    } else {
        telling
    };
    out.dedup();
    if out.len() > max {
        // The newest lines say how it ended: keep the first, then the end.
        let tail = out.split_off(out.len() - max.saturating_sub(1));
        out.truncate(1.min(max));
        out.extend(tail);
    }
    out
}

/// A line that reports how a run ended: pytest's and cargo's totals
/// (`3 passed, 1 failed in 0.2s`, `test result: FAILED. 3 passed; 1
/// failed`), go's `ok`/`FAIL` package lines, unittest's `Ran N tests` /
/// `OK` / `FAILED (failures=1)`.
fn is_result_line(line: &str) -> bool {
    let bare = line.trim_matches(|c: char| c == '=' || c == '-' || c.is_whitespace());
    let lower = bare.to_ascii_lowercase();
    let counted = |word: &str| {
        lower.match_indices(word).any(|(i, _)| {
            lower[..i]
                .trim_end()
                .rsplit(|c: char| !c.is_ascii_digit())
                .next()
                .is_some_and(|n| !n.is_empty())
        })
    };
    lower.starts_with("test result:")
        || lower.starts_with("ran ") && lower.contains(" test")
        || lower == "ok"
        || lower.starts_with("failed (")
        || counted(" passed")
        || counted(" failed")
        || counted(" error")
        || counted(" tests")
        || counted(" warnings")
}

/// Output that says nothing about the result: blank lines, separators and
/// banners (`===== test session starts =====`), progress (`[ 45%]`, rows
/// of test-status characters, bars), and the headers a test runner or a
/// build tool prints before it starts.
fn is_noise(line: &str) -> bool {
    if line.is_empty() {
        return true;
    }
    let decoration = |c: char| matches!(c, '=' | '-' | '*' | '#' | '_' | '~' | '+' | '>' | '<');
    let decorated = line.chars().filter(|c| decoration(*c)).count();
    // A separator, or a banner: a short title between runs of decoration.
    if decorated * 2 >= line.chars().count() && !is_result_line(line) && !is_error_line(line) {
        return true;
    }
    let bare = line.trim_matches(|c: char| decoration(c) || c.is_whitespace());
    if bare.is_empty() {
        return true;
    }
    let lower = bare.to_ascii_lowercase();
    if lower.ends_with("test session starts")
        || [
            "platform ",
            "rootdir:",
            "cachedir:",
            "plugins:",
            "configfile:",
            "collecting",
        ]
        .iter()
        .any(|h| lower.starts_with(h))
        || (lower.starts_with("collected ") && lower.contains(" item"))
    {
        return true;
    }
    // Progress: `[ 45%]` at the end, a bar, or a row of status marks
    // (`tests/test_x.py ....s..x`).
    let without_percent = match bare.rfind('[') {
        Some(at) if bare.ends_with("%]") => bare[..at].trim_end(),
        _ => bare,
    };
    let marks = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| matches!(c, '.' | 's' | 'x' | 'X' | 'F' | 'E'))
    };
    let last_word = without_percent.rsplit(' ').next().unwrap_or("");
    if without_percent.len() < bare.len() && (marks(last_word) || without_percent.is_empty()) {
        return true;
    }
    if marks(without_percent) && without_percent.contains('.') {
        return true;
    }
    let bar = bare
        .chars()
        .filter(|c| matches!(c, '█' | '▏' | '▎' | '▍' | '▌' | '▋' | '▊' | '▉' | '#' | '|'))
        .count();
    bar * 2 >= bare.chars().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pytest_run_is_its_failures_and_its_totals() {
        let run = "============================= test session starts ==============================\n\
                   platform linux -- Python 3.11.4, pytest-7.4.0, pluggy-1.2.0\n\
                   rootdir: /work/tinyq\n\
                   plugins: anyio-3.7.1\n\
                   collected 24 items\n\
                   \n\
                   tests/test_queue.py ........                                             [ 33%]\n\
                   tests/test_retry.py ..F.....                                             [ 66%]\n\
                   tests/test_worker.py ........                                            [100%]\n\
                   \n\
                   =================================== FAILURES ===================================\n\
                   ________________________ test_backoff_caps_at_max_delay ________________________\n\
                   E       assert 512.0 == 30\n\
                   =========================== short test summary info ============================\n\
                   FAILED tests/test_retry.py::test_backoff_caps_at_max_delay - assert 512.0 == 30\n\
                   ========================= 1 failed, 23 passed in 0.41s =========================\n";
        assert_eq!(
            gist(run, 6),
            vec![
                "FAILED tests/test_retry.py::test_backoff_caps_at_max_delay - assert 512.0 == 30",
                "========================= 1 failed, 23 passed in 0.41s =========================",
            ]
        );
        let passing = "============ test session starts ============\ncollected 3 items\n\ntests/test_a.py ...  [100%]\n\n============ 3 passed in 0.01s ============\n";
        assert_eq!(
            gist(passing, 6),
            vec!["============ 3 passed in 0.01s ============"]
        );
    }

    #[test]
    fn other_outputs_keep_their_errors_or_their_ends() {
        let cargo = "   Compiling tinyq v0.1.0\nerror[E0308]: mismatched types\n --> src/lib.rs:3:5\nerror: could not compile `tinyq`\n";
        assert_eq!(
            gist(cargo, 6),
            vec![
                "error[E0308]: mismatched types",
                "error: could not compile `tinyq`"
            ]
        );
        let listing = "README.md\nsrc\ntests\n";
        assert_eq!(gist(listing, 6), vec!["README.md", "tests"]);
        assert!(gist("\n-----\n\n", 6).is_empty());
        let many: String = (0..20).map(|i| format!("ERROR: case {i}\n")).collect();
        let kept = gist(&many, 4);
        assert_eq!(
            kept,
            vec![
                "ERROR: case 0",
                "ERROR: case 17",
                "ERROR: case 18",
                "ERROR: case 19"
            ]
        );
    }
}
