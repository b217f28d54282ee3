use super::*;
use crate::compressor::wrap_summary;
use crate::message::ToolCall;

fn bash(id: &str, command: &str) -> Message {
    let args = serde_json::json!({ "command": command }).to_string();
    Message::assistant_tool_calls("", vec![ToolCall::function(id, "bash", &args)])
}

fn of_kind(probes: &[Probe], kind: ProbeKind) -> Vec<&str> {
    probes
        .iter()
        .filter(|p| p.kind == kind)
        .map(|p| p.text.as_str())
        .collect()
}

#[test]
fn user_asks_are_normalised_and_clipped_and_summaries_skipped() {
    let long = format!("Please fix   the\nparser. {}", "é".repeat(300));
    let messages = vec![
        Message::system("be careful"),
        Message::user(long.as_str()),
        Message::assistant("ok"),
        Message::user(wrap_summary("the user asked for X").as_str()),
        Message::user("   "),
        Message::user("[/bash ls]\nREADME.md\n[END TOOL RESULTS]"),
        Message::user("now add a test"),
    ];
    let probes = extract_probes(&messages, crate::validate::auto_text_actions());
    let asks: Vec<&Probe> = probes
        .iter()
        .filter(|p| p.kind == ProbeKind::UserAsk)
        .collect();
    assert_eq!(asks.len(), 2, "{asks:?}");
    assert!(asks[0].text.starts_with("Please fix the parser. é"));
    assert!(asks[0].text.len() <= ASK_MAX_BYTES && asks[0].text.len() > ASK_MAX_BYTES - 4);
    assert_eq!(asks[0].source_index, 1);
    assert_eq!(asks[1].text, "now add a test");
    assert_eq!(asks[1].source_index, 6);
}

#[test]
fn file_paths_from_json_arguments_editors_and_shell_deduped() {
    let messages = vec![
        Message::user("go"),
        Message::assistant_tool_calls(
            "",
            vec![
                ToolCall::function(
                    "c1",
                    "str_replace_editor",
                    r#"{"command": "view", "path": "/testbed/src/a.py"}"#,
                ),
                ToolCall::function("c2", "read_file", r#"{"file_path": "docs/b.md"}"#),
            ],
        ),
        Message::tool_result("c1", "a"),
        Message::tool_result("c2", "b"),
        bash(
            "c3",
            "cd /testbed && cat src/c.py && grep -n foo src/d.py > hits.txt",
        ),
        Message::tool_result("c3", "x"),
        bash("c4", "cat src/c.py"),
        Message::tool_result("c4", "x"),
    ];
    let probes = extract_probes(&messages, crate::validate::auto_text_actions());
    assert_eq!(
        of_kind(&probes, ProbeKind::FilePath),
        vec![
            "/testbed/src/a.py",
            "docs/b.md",
            "src/c.py",
            "hits.txt",
            "src/d.py"
        ]
    );
}

#[test]
fn commands_carry_their_exit_status_and_failures_their_error() {
    let mut failing = Message::tool_result(
        "c2",
        "Traceback (most recent call last):\n  File \"t.py\", line 3\nKeyError: 'x'\n",
    );
    failing
        .extra
        .insert("returncode".into(), serde_json::json!(1));
    let messages = vec![
        Message::user("go"),
        bash("c1", "ls\necho two"),
        Message::tool_result("c1", "<returncode>0</returncode>\n<output>a</output>"),
        bash("c2", "python t.py"),
        failing,
        bash("c3", "python t.py"),
        Message::tool_result("c3", "KeyError: 'x'\n[exit 1]"),
        bash("c4", "cargo build"),
        Message::tool_result("c4", "error[E0308]: mismatched types\nexit code: 101"),
        bash("c5", "cat notes.txt"),
        Message::tool_result("c5", "<returncode>0</returncode>\nError: only a note"),
    ];
    let probes = extract_probes(&messages, crate::validate::auto_text_actions());
    let commands: Vec<(&str, Option<i64>)> = probes
        .iter()
        .filter(|p| p.kind == ProbeKind::Command)
        .map(|p| (p.text.as_str(), p.exit_status))
        .collect();
    assert_eq!(
        commands,
        vec![
            ("ls", Some(0)),
            ("python t.py", Some(1)),
            ("python t.py", Some(1)),
            ("cargo build", Some(101)),
            ("cat notes.txt", Some(0)),
        ]
    );
    let errors: Vec<(&str, usize)> = probes
        .iter()
        .filter(|p| p.kind == ProbeKind::ErrorMessage)
        .map(|p| (p.text.as_str(), p.source_index))
        .collect();
    // The repeated KeyError once, at its last occurrence; an explicit exit 0
    // is no failure.
    assert_eq!(
        errors,
        vec![("KeyError: 'x'", 6), ("error[E0308]: mismatched types", 8)]
    );
}

#[test]
fn text_action_commands_and_their_observations() {
    let messages = vec![
        Message::system("one bash block per reply"),
        Message::user("Please solve this issue: the build breaks"),
        Message::assistant("THOUGHT: read it\n\n```mswea_bash_command\ncat src/main.py\n```"),
        Message::user(
            "<returncode>1</returncode>\n<output>\ncat: src/main.py: No such file or directory\n</output>",
        ),
        Message::assistant("Use the right place.\n\n```bash\npython app/main.py --check\n```"),
        Message::user("<returncode>0</returncode>\n<output>\nok\n</output>"),
        Message::user("thanks, now update the docs"),
    ];
    let probes = extract_probes(&messages, crate::validate::auto_text_actions());
    assert_eq!(
        of_kind(&probes, ProbeKind::UserAsk),
        vec![
            "Please solve this issue: the build breaks",
            "thanks, now update the docs"
        ]
    );
    assert_eq!(
        of_kind(&probes, ProbeKind::FilePath),
        vec!["src/main.py", "app/main.py"]
    );
    let commands: Vec<Option<i64>> = probes
        .iter()
        .filter(|p| p.kind == ProbeKind::Command)
        .map(|p| p.exit_status)
        .collect();
    assert_eq!(commands, vec![Some(1), Some(0)]);
    assert!(of_kind(&probes, ProbeKind::ErrorMessage).is_empty());
}

fn probe(kind: ProbeKind, text: &str) -> Probe {
    Probe {
        kind,
        text: text.to_owned(),
        source_index: 0,
        exit_status: None,
    }
}

#[test]
fn check_finds_verbatim_summary_recallable_and_lost() {
    let stored = vec![
        Message::user("fix the bug"),
        bash("c1", "cat big.py"),
        Message::tool_result("c1", "def   secret_helper():\n    return 42\n"),
        bash("c2", "cat gone.py"),
        Message::tool_result("c2", "def vanished(): pass"),
    ];
    let view = vec![
        Message::user(
            format!(
                "{}\nthe asks: fix the bug",
                wrap_summary("User asked: repair the parser")
            )
            .as_str(),
        ),
        bash("c1", "cat big.py"),
        Message::tool_result(
            "c1",
            r#"[digested] bash {"command": "cat big.py"} → ok; full output: context_recall {"handle":"c1"}"#,
        ),
    ];
    let probes = vec![
        probe(ProbeKind::UserAsk, "fix the bug"),
        probe(ProbeKind::UserAsk, "repair   the parser"),
        probe(ProbeKind::FilePath, "big.py"),
        probe(ProbeKind::ErrorMessage, "def secret_helper(): return 42"),
        probe(ProbeKind::ErrorMessage, "def vanished(): pass"),
        probe(ProbeKind::FilePath, "gone.py"),
    ];
    assert_eq!(
        statuses(&probes, &view, &stored),
        vec![
            ProbeStatus::Verbatim,
            ProbeStatus::InSummary,
            ProbeStatus::Verbatim,
            ProbeStatus::Recallable,
            ProbeStatus::Lost,
            ProbeStatus::Lost,
        ]
    );
    let report = check(&probes, &view, &stored);
    assert_eq!(
        (
            report.probes,
            report.verbatim,
            report.in_summary,
            report.recallable,
            report.lost
        ),
        (6, 2, 1, 1, 2)
    );
    assert_eq!(report.lost_probes, probes[4..].to_vec());
    // Without its handle in the view, a stored result is not recallable.
    let report = check(&probes, &view[..1], &stored);
    assert_eq!(report.recallable, 0);
    // An archived message the view reaches is recallable for an agent
    // with tools; an agent without (text actions) can reach neither it nor
    // the stored result: both are lost.
    let archived = [Message::tool_result("c2", "def vanished(): pass")];
    let tools = check_with_archive(&probes, &view, &stored, &archived, ToolChannel::Tools);
    assert_eq!((tools.recallable, tools.lost), (2, 1));
    let text = check_with_archive(&probes, &view, &stored, &archived, ToolChannel::TextActions);
    assert_eq!((text.verbatim, text.in_summary), (2, 1));
    assert_eq!((text.recallable, text.lost), (0, 3));
}

#[test]
fn a_summary_alone_is_not_verbatim_and_matches_never_span_messages() {
    let view = vec![
        Message::user(wrap_summary("asked to fix the bug").as_str()),
        Message::assistant("fix the"),
        Message::user("bug report"),
    ];
    let probes = vec![probe(ProbeKind::UserAsk, "fix the bug")];
    assert_eq!(
        statuses(&probes, &view, &view),
        vec![ProbeStatus::InSummary]
    );
    assert_eq!(
        statuses(&probes, &view[1..], &view),
        vec![ProbeStatus::Lost]
    );
}

#[test]
fn report_serializes_with_snake_case_kinds() {
    let report = check(
        &[probe(ProbeKind::ErrorMessage, "nowhere")],
        &[Message::user("x")],
        &[],
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["lost"], 1);
    assert_eq!(json["lost_probes"][0]["kind"], "error_message");
    assert!(json["lost_probes"][0].get("exit_status").is_none());
}
