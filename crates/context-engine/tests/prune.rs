#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The proactive prune, rule by rule: each rule positive and negative, the
//! two gates, the protected tail, and the input left as it was.

use std::borrow::Cow;

use context_engine::digest::{DigestOptions, digest};
use context_engine::prune::{
    PRUNE_MARK, PruneOptions, PruneReason, PruneSkip, protected_from, prune,
};
use context_engine::tokens::{BpeCounter, Encoding};
use context_engine::validate::{Profile, validate};
use context_engine::{Message, ToolCall};
use serde_json::Value;

fn counter() -> BpeCounter {
    BpeCounter::new(Encoding::O200kBase)
}

/// Prune everything outside a tail of `protect` messages, whatever it frees.
fn eager(protect: usize) -> PruneOptions {
    PruneOptions {
        proactive_prune_tokens: 1,
        min_reclaim_tokens: 0,
        protect_last_n: protect,
        ..PruneOptions::default()
    }
}

fn call(id: &str, name: &str, args: &str) -> Message {
    Message::assistant_tool_calls("", vec![ToolCall::function(id, name, args)])
}

fn bash(id: &str, command: &str) -> Message {
    call(
        id,
        "bash",
        &serde_json::json!({ "command": command }).to_string(),
    )
}

/// A distinct body of about 2000 bytes (under the digest's 4096).
fn body(tag: &str) -> String {
    (0..80)
        .map(|i| format!("{tag} line {i}: some output\n"))
        .collect()
}

fn run(m: &[Message], opts: &PruneOptions) -> Vec<Message> {
    let out = prune(m, None, opts, &counter());
    assert_eq!(validate(&out.messages, Profile::OpenAi), vec![]);
    out.messages.into_owned()
}

fn is_marker(m: &Message) -> bool {
    m.text().starts_with(PRUNE_MARK)
}

#[test]
fn off_and_below_threshold_return_the_input_borrowed() {
    let m = vec![
        bash("c1", "cat a.py"),
        Message::tool_result("c1", body("a")),
        bash("c2", "cat a.py"),
        Message::tool_result("c2", body("a")),
    ];
    let off = prune(&m, Some(1_000_000), &PruneOptions::default(), &counter());
    assert_eq!(off.skipped, Some(PruneSkip::Disabled));
    assert!(matches!(off.messages, Cow::Borrowed(p) if std::ptr::eq(p, m.as_slice())));

    let opts = PruneOptions {
        proactive_prune_tokens: 10_000,
        ..eager(0)
    };
    let below = prune(&m, Some(10_000), &opts, &counter());
    assert_eq!(below.skipped, Some(PruneSkip::BelowThreshold));
    assert_eq!((below.pruned, below.reclaimed_tokens), (0, 0));
    assert!(matches!(below.messages, Cow::Borrowed(_)));
    // Above it, the same transcript is pruned; counted when not given.
    let above = prune(&m, Some(10_001), &opts, &counter());
    assert_eq!(above.skipped, None);
    assert_eq!(above.pruned, 1);
    assert_eq!(above.tokens_before, 10_001);
    assert_eq!(above.tokens_after, 10_001 - above.reclaimed_tokens);
    let counted = prune(&m, None, &eager(0), &counter());
    assert!(counted.tokens_before > 800, "{}", counted.tokens_before);
}

#[test]
fn min_reclaim_gate_returns_the_input_borrowed() {
    let m = vec![
        bash("c1", "cat a.py"),
        Message::tool_result("c1", body("a")),
        bash("c2", "cat a.py"),
        Message::tool_result("c2", body("a")),
    ];
    let reclaimable = prune(&m, None, &eager(0), &counter()).reclaimed_tokens;
    assert!(reclaimable > 0);
    let opts = PruneOptions {
        min_reclaim_tokens: reclaimable + 1,
        ..eager(0)
    };
    let out = prune(&m, None, &opts, &counter());
    assert_eq!(out.skipped, Some(PruneSkip::TooLittle { reclaimable }));
    assert_eq!((out.pruned, out.reclaimed_tokens), (0, 0));
    assert!(matches!(out.messages, Cow::Borrowed(p) if std::ptr::eq(p, m.as_slice())));
    let opts = PruneOptions {
        min_reclaim_tokens: reclaimable,
        ..eager(0)
    };
    assert_eq!(prune(&m, None, &opts, &counter()).pruned, 1);
}

#[test]
fn duplicate_outputs_become_a_marker_naming_the_newer_call() {
    let m = vec![
        Message::user("go"),
        bash("c1", "python -m pytest tests/a"),
        Message::tool_result("c1", body("same")),
        bash("c2", "python -m pytest tests/b"),
        Message::tool_result("c2", body("other")),
        bash("c3", "python -m pytest tests/c"),
        Message::tool_result("c3", body("same")),
    ];
    let out = prune(&m, None, &eager(0), &counter());
    assert!(
        matches!(out.messages, std::borrow::Cow::Owned(_)),
        "committed"
    );
    assert_eq!(out.counts.duplicates, 1);
    assert_eq!(out.pruned, 1);
    let text = out.messages[2].text();
    assert_eq!(
        text,
        r#"[pruned] bash {"command":"python -m pytest tests/a"} → same output as call c3; full output: context_recall {"handle":"c1"}"#
    );
    assert_eq!(out.messages[2].tool_call_id.as_deref(), Some("c1"));
    // Different outputs (c2) and the newest copy (c3) stay.
    assert_eq!(out.messages[4], m[4]);
    assert_eq!(out.messages[6], m[6]);
}

#[test]
fn a_read_is_superseded_by_a_later_edit_or_full_read_of_the_same_file() {
    let m = vec![
        bash("c1", "cd /t && cat a.py"),
        Message::tool_result("c1", body("a v1")),
        bash("c2", "cat /t/b.py"),
        Message::tool_result("c2", body("b")),
        call(
            "c3",
            "str_replace_editor",
            r#"{"command":"str_replace","path":"/t/a.py","old_str":"x","new_str":"y"}"#,
        ),
        Message::tool_result("c3", "The file /t/a.py has been edited."),
        bash("c4", "sed -n '1,20p' /t/b.py"),
        Message::tool_result("c4", body("b part")),
        bash("c5", "head -n 5 /t/b.py"),
        Message::tool_result("c5", body("b head")),
        call(
            "c6",
            "str_replace_editor",
            r#"{"command":"view","path":"/t/b.py"}"#,
        ),
        Message::tool_result("c6", body("b v2")),
    ];
    let out = prune(&m, None, &eager(0), &counter());
    let t = |i: usize| out.messages[i].text().into_owned();
    assert!(
        t(1).contains("superseded by call c3 (edit of /t/a.py)"),
        "{}",
        t(1)
    );
    // c2 read all of b.py; the partial reads c4, c5 do not cover it, the
    // full view c6 does; the partial reads are covered by c6 too.
    assert!(
        t(3).contains("superseded by call c6 (later read of /t/b.py)"),
        "{}",
        t(3)
    );
    assert!(t(7).contains("superseded by call c6"), "{}", t(7));
    assert!(t(9).contains("superseded by call c6"), "{}", t(9));
    assert_eq!(out.counts.superseded_reads, 4);
    assert_eq!(out.messages[11], m[11]);
}

#[test]
fn reads_of_other_files_or_other_parts_are_not_superseded() {
    let m = vec![
        bash("c1", "cat /t/a.py"),
        Message::tool_result("c1", body("a")),
        bash("c2", "sed -n '1,20p' /t/b.py"),
        Message::tool_result("c2", body("b1")),
        call(
            "c3",
            "str_replace_editor",
            r#"{"command":"create","path":"/t/c.py","file_text":"x"}"#,
        ),
        Message::tool_result("c3", "created"),
        bash("c4", "sed -n '40,60p' /t/b.py"),
        Message::tool_result("c4", body("b2")),
        // A read that also runs something is not only a read.
        bash("c5", "cat /t/d.py && python /t/d.py"),
        Message::tool_result("c5", body("d")),
        bash("c6", "cat /t/d.py"),
        Message::tool_result("c6", body("d2")),
    ];
    let out = prune(&m, None, &eager(0), &counter());
    assert_eq!(out.pruned, 0, "{:?}", out.changes);
    assert!(matches!(out.messages, Cow::Borrowed(_)));
}

#[test]
fn a_rerun_supersedes_the_older_output_but_not_other_arguments() {
    let m = vec![
        bash("c1", "python reproduce.py"),
        Message::tool_result("c1", body("run 1")),
        bash("c2", "python reproduce.py --verbose"),
        Message::tool_result("c2", body("run v")),
        call("c3", "scroll_down", "{}"),
        Message::tool_result("c3", body("window 1")),
        call("c4", "scroll_down", "{}"),
        Message::tool_result("c4", body("window 2")),
        bash("c5", "python reproduce.py"),
        Message::tool_result("c5", body("run 2")),
    ];
    let out = prune(&m, None, &eager(0), &counter());
    assert_eq!(
        out.messages[1].text(),
        r#"[pruned] bash {"command":"python reproduce.py"} → superseded by re-run call c5; full output: context_recall {"handle":"c1"}"#
    );
    assert_eq!(out.counts.reruns, 1);
    assert_eq!(out.pruned, 1, "{:?}", out.changes);
    // Same tool, other arguments; and argument-less calls (a re-run shows
    // something new) stay.
    assert_eq!(out.messages[3], m[3]);
    assert_eq!(out.messages[5], m[5]);
}

#[test]
fn edits_repeated_with_the_same_arguments_are_not_reruns() {
    let edit = r#"{"command":"str_replace","path":"/t/a.py","old_str":"x","new_str":"y"}"#;
    let m = vec![
        call("c1", "str_replace_editor", edit),
        Message::tool_result("c1", body("edited snippet")),
        call("c2", "str_replace_editor", edit),
        Message::tool_result("c2", body("no match")),
    ];
    assert_eq!(prune(&m, None, &eager(0), &counter()).pruned, 0);
}

#[test]
fn large_results_are_digested_exactly_as_the_digest_does() {
    let big: String = (0..400)
        .map(|i| format!("row {i} of the table\n"))
        .collect();
    let m = vec![
        bash("c1", "python dump.py"),
        Message::tool_result("c1", big.clone()),
        bash("c2", "python other.py"),
        Message::tool_result("c2", body("small")),
        bash("c3", "ls"),
        Message::tool_result("c3", "a.py"),
    ];
    let out = prune(&m, None, &eager(2), &counter());
    let digested = digest(
        &m,
        &DigestOptions {
            keep_batches: 0,
            ..DigestOptions::default()
        },
    );
    assert_eq!(out.messages[1], digested[1]);
    assert!(out.messages[1].text().starts_with("[digested] bash"));
    assert_eq!(out.counts.digested, 1);
    // Under `min_bytes`: whole.
    assert_eq!(out.messages[3], m[3]);
    // The same large result inside the protected tail stays whole.
    let out = prune(&m, None, &eager(5), &counter());
    assert_eq!(out.pruned, 0);
}

#[test]
fn long_arguments_are_clipped_and_stay_valid_json() {
    let file_text = "def f():\n    return 1\n".repeat(100);
    let args =
        serde_json::json!({"command": "create", "path": "/t/new.py", "file_text": file_text})
            .to_string();
    let broken = format!(r#"{{"command": "create", "path": "/t/x.py", "file_text": "{file_text}"#);
    let m = vec![
        call("c1", "str_replace_editor", &args),
        Message::tool_result("c1", "File created successfully at: /t/new.py"),
        call("c2", "str_replace_editor", &broken),
        Message::tool_result("c2", "invalid arguments"),
        call("c3", "str_replace_editor", &args),
        Message::tool_result("c3", "File already exists"),
    ];
    let out = prune(&m, None, &eager(2), &counter());
    assert_eq!(out.counts.args_clipped, 1, "{:?}", out.changes);
    let clipped = &out.messages[0].tool_calls()[0]
        .function
        .as_ref()
        .unwrap()
        .arguments;
    let v: Value = serde_json::from_str(clipped).unwrap();
    assert_eq!(v["path"], "/t/new.py");
    assert_eq!(v["command"], "create");
    let leaf = v["file_text"].as_str().unwrap();
    assert!(leaf.ends_with(" chars clipped]"), "{leaf}");
    assert!(file_text.starts_with(leaf.split('…').next().unwrap()));
    assert!(clipped.len() < args.len() / 4);
    // Invalid JSON is left alone; the protected tail (c3) too.
    assert_eq!(out.messages[2], m[2]);
    assert_eq!(out.messages[4], m[4]);
    assert_eq!(out.messages[0].tool_calls()[0].id.as_deref(), Some("c1"));
}

#[test]
fn the_protected_tail_is_untouched_and_never_splits_a_batch() {
    let m = vec![
        Message::user("go"),
        bash("c1", "cat a.py"),
        Message::tool_result("c1", body("a")),
        Message::assistant_tool_calls(
            "",
            vec![
                ToolCall::function("c2", "bash", r#"{"command":"cat a.py"}"#),
                ToolCall::function("c3", "bash", r#"{"command":"cat a.py"}"#),
            ],
        ),
        Message::tool_result("c2", body("a")),
        Message::tool_result("c3", body("a")),
        Message::assistant("done"),
    ];
    // Two messages from the end would start on the result c3: the tail
    // moves back to the batch's call.
    assert_eq!(
        protected_from(&m, 2, context_engine::validate::auto_text_actions()),
        3
    );
    let out = prune(&m, None, &eager(2), &counter());
    assert_eq!(&out.messages[3..], &m[3..]);
    assert!(is_marker(&out.messages[2]));
    assert_eq!(out.pruned, 1);
    // Nothing protected: c2 duplicates c3 as well.
    let out = prune(&m, None, &eager(0), &counter());
    assert_eq!(out.pruned, 2);
    assert!(is_marker(&out.messages[4]) && !is_marker(&out.messages[5]));
}

#[test]
fn pruning_twice_changes_nothing_more() {
    let m = vec![
        bash("c1", "cat a.py"),
        Message::tool_result("c1", body("a")),
        bash("c2", "cat a.py"),
        Message::tool_result("c2", body("a2")),
        bash("c3", "cat a.py"),
        Message::tool_result("c3", body("a2")),
    ];
    let once = run(&m, &eager(0));
    assert_eq!(once.iter().filter(|m| is_marker(m)).count(), 2);
    let twice = prune(&once, None, &eager(0), &counter());
    assert_eq!(twice.pruned, 0);
    let reasons: Vec<PruneReason> = prune(&m, None, &eager(0), &counter())
        .changes
        .iter()
        .map(|c| c.reason)
        .collect();
    // The older copy of the same text is a duplicate first.
    assert_eq!(
        reasons,
        vec![PruneReason::SupersededRead, PruneReason::Duplicate]
    );
}

#[test]
fn reused_call_ids_answer_the_nearest_call() {
    // Some SWE-agent trajectories reuse one id for several calls.
    let m = vec![
        bash("c1", "python r.py"),
        Message::tool_result("c1", body("run 1")),
        bash("c1", "ls -F"),
        Message::tool_result("c1", body("listing")),
        bash("c1", "python r.py"),
        Message::tool_result("c1", body("run 2")),
    ];
    let out = prune(&m, None, &eager(0), &counter());
    assert_eq!(out.pruned, 1, "{:?}", out.changes);
    assert!(
        out.messages[1]
            .text()
            .starts_with(r#"[pruned] bash {"command":"python r.py"} → superseded by re-run"#)
    );
    assert_eq!(out.messages[3], m[3]);
}

#[test]
fn options_deserialize_with_defaults() {
    let opts: PruneOptions = serde_json::from_str(
        r#"{"proactive_prune_tokens": 50000, "protect_last_n": 10, "digest": {"min_bytes": 1024}}"#,
    )
    .unwrap();
    assert_eq!(opts.proactive_prune_tokens, 50_000);
    assert_eq!(opts.protect_last_n, 10);
    assert_eq!(opts.min_reclaim_tokens, 4096);
    assert_eq!(opts.args_max_chars, 500);
    assert_eq!(opts.digest.min_bytes, 1024);
    assert_eq!(
        opts.digest.keep_batches,
        DigestOptions::default().keep_batches
    );
    let empty: PruneOptions = serde_json::from_str("{}").unwrap();
    assert_eq!(empty, PruneOptions::default());
}

/// A text action (mini-swe-agent) and its observation.
fn mini(command: &str, output: &str) -> [Message; 2] {
    [
        Message::assistant(format!("THOUGHT: next\n\n```bash\n{command}\n```")),
        Message::user(format!(
            "<returncode>0</returncode>\n<output>\n{output}</output>"
        )),
    ]
}

#[test]
fn text_actions_are_pruned_like_tool_calls_in_the_agents_shape() {
    let mut m = vec![Message::user("fix a.py")];
    m.extend(mini("cat a.py", &body("old a")));
    m.extend(mini("python -m pytest -q", &body("first run")));
    m.extend(mini("cat a.py", &body("new a")));
    m.extend(mini("python -m pytest -q", &body("second run")));
    m.extend(mini("ls", "a.py\n"));
    let out = run(&m, &eager(2));
    // The stale read and the re-run: markers inside the observation
    // template, so the agent's parser still reads them.
    for (i, why) in [
        (2, "superseded by call at message 5 (later read of a.py)"),
        (4, "superseded by re-run call at message 7"),
    ] {
        let t = out[i].text();
        assert!(
            t.starts_with(&format!(
                "<returncode>0</returncode>\n<output>\n{PRUNE_MARK} "
            )),
            "{t}"
        );
        assert!(t.contains(why), "{t}");
        assert!(t.ends_with("\n</output>"), "{t}");
        // No recall hint: the agent has no tool to call it with.
        assert!(!t.contains("context_recall"), "{t}");
    }
    // The newer outputs and the ask stay.
    assert_eq!(out[0], m[0]);
    assert_eq!(out[6], m[6]);
    assert_eq!(out[8], m[8]);
    // A user ask in the same shape but after no action is never pruned.
    let mut asked = vec![Message::assistant("Done.")];
    asked.push(m[2].clone());
    asked.extend(mini("cat a.py", &body("old a")));
    asked.extend(mini("cat a.py", &body("old a")));
    asked.extend(mini("ls", "a.py\n"));
    let out = run(&asked, &eager(2));
    assert_eq!(out[1], asked[1]);
}
