#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Text-action agents: the model writes its action as text and the harness
//! sends the output back as a user message (SWE-agent's classic mode,
//! mini-swe-agent's text mode). On the corpus's text-action transcripts and
//! on sessions generated here in both agents' shapes:
//!
//! - every real user ask stays a user ask and every observation is tool
//!   output (no ask misclassified);
//! - digest-only replay (a window larger than the session) saves at least 5%
//!   on every session with 12 or more calls and 15% on average, and the
//!   requests keep their prefix as with tool calls;
//! - every compaction keeps the task verbatim.
//!
//! Run with `--nocapture` to see the figures.

use std::sync::Arc;

use context_engine::compressor::{Compressor, is_summary};
use context_engine::digest::{DigestOptions, digest};
use context_engine::host::Session;
use context_engine::message::Role;
use context_engine::replay::{ReplayOptions, ReplayReport, replay};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::validate::{
    Profile, TextActions, TextActionsConfig, is_real_user_turn, observation_with, reentries_with,
    validate,
};
use context_engine::{Message, ToolCall};

use context_engine_testkit as common;

use common::Rng;

fn counter() -> Arc<dyn TokenCounter> {
    Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)))
}

fn corpus(name: &str) -> Option<Vec<Message>> {
    let dir = common::corpus_dir()?;
    Some(Transcript::load(dir.join(name)).unwrap().messages)
}

const WORDS: &[&str] = &[
    "value", "config", "result", "items", "parser", "token", "offset", "buffer", "handler",
    "record", "schema", "field", "index", "cache", "limit", "retry", "stream", "header",
];

/// One line of plausible Python.
fn code_line(rng: &mut Rng) -> String {
    let a = rng.pick(WORDS);
    let b = rng.pick(WORDS);
    let indent = "    ".repeat(rng.range(0, 3) as usize);
    match rng.range(0, 5) {
        0 => format!("{indent}def {a}_{b}(self, {b}=None):"),
        1 => format!("{indent}{a} = self.{b}.get(\"{a}\", {})", rng.range(0, 99)),
        2 => format!("{indent}if {a} is None or len({b}) > {}:", rng.range(1, 64)),
        3 => format!("{indent}return {a}_{b}({a}, {b}=True)"),
        4 => format!("{indent}# {a} and {b} must stay in sync with the {a} {b}"),
        _ => format!("{indent}raise ValueError(f\"bad {a}: {{{b}!r}}\")"),
    }
}

fn file_body(rng: &mut Rng, lines: usize, numbered_from: Option<usize>) -> String {
    (0..lines)
        .map(|k| match numbered_from {
            Some(start) => format!("{}:{}", start + k, code_line(rng)),
            None => code_line(rng),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn pytest_output(rng: &mut Rng, failing: bool) -> String {
    let mut out = String::from(
        "============================= test session starts ==============================\n",
    );
    out += "collected 24 items\n\ntests/test_core.py ........F.....\ntests/test_io.py ........\n\n";
    if failing {
        out += "=================================== FAILURES ===================================\n";
        out +=
            "______________________________ test_parse_header _______________________________\n\n";
        for _ in 0..rng.range(20, 40) {
            out += &format!("    {}\n", code_line(rng));
        }
        out += "E       AssertionError: assert 'x-token' == 'X-Token'\n\ntests/test_core.py:88: AssertionError\n";
        out += "=========================== short test summary info ============================\n";
        out += "FAILED tests/test_core.py::test_parse_header - AssertionError: assert 'x-token' == 'X-Token'\n";
        out += "========================= 1 failed, 23 passed in 0.41s =========================";
    } else {
        out += "============================== 24 passed in 0.39s ==============================";
    }
    out
}

const TASK: &str = "Please solve this issue: HTTP headers lose their case when parsed.\n\n\
`parse_header(\"X-Token: 1\")` returns `{\"x-token\": \"1\"}` but the documentation promises the \
original case. Keep the public API unchanged and add a regression test.";

/// A mini-swe-agent text-mode session: a ```bash block per assistant turn,
/// `<returncode>` / `<output>` observations.
fn mini_session(seed: u64, steps: usize) -> Vec<Message> {
    let mut rng = Rng(seed);
    let mut m = vec![
        Message::system(
            "You are a helpful assistant that can interact with a computer.\n\nYour response must \
             contain exactly ONE bash code block with ONE command.\nInclude a THOUGHT section \
             before your command.",
        ),
        // mini-swe-agent's instance template: the task, then about 2 KB
        // of workflow and format rules.
        Message::user(format!(
            "{TASK}\n\n## Recommended Workflow\n{}",
            instructions(&mut rng, 2_000)
        )),
    ];
    let files = [
        "src/http/headers.py",
        "src/http/parser.py",
        "src/http/client.py",
        "tests/test_core.py",
    ];
    for step in 0..steps {
        let file = files[step % files.len()];
        let (command, code, output) = match step % 6 {
            0 => (
                format!("cat {file}"),
                0,
                file_body(&mut rng, rng_lines(seed, step, 40, 150), None),
            ),
            1 => (
                format!("grep -rn \"{}\" src/ tests/", WORDS[step % WORDS.len()]),
                0,
                (0..rng_lines(seed, step, 5, 25))
                    .map(|k| format!("{file}:{}:{}", k * 7 + 3, code_line(&mut rng)))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            2 => {
                let failing = step < steps * 2 / 3;
                (
                    "python -m pytest tests -x -q 2>&1 | tail -60".to_owned(),
                    i32::from(failing),
                    pytest_output(&mut rng, failing),
                )
            }
            3 => (
                format!("sed -i 's/lower()/strip()/' {file}"),
                0,
                String::new(),
            ),
            4 => (
                format!("nl -ba {file} | sed -n '40,100p'"),
                0,
                file_body(&mut rng, 60, Some(40)),
            ),
            _ => (
                "python reproduce.py".to_owned(),
                1,
                format!(
                    "Traceback (most recent call last):\n  File \"reproduce.py\", line 3, in <module>\n    {}\nKeyError: 'X-Token'",
                    code_line(&mut rng)
                ),
            ),
        };
        m.push(Message::assistant(format!(
            "THOUGHT: step {step}, next I look at {file}.\n\n```bash\n{command}\n```"
        )));
        m.push(Message::user(format!(
            "<returncode>{code}</returncode>\n<output>\n{output}\n</output>"
        )));
    }
    m.push(Message::assistant(
        "The fix is in place and the tests pass.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
    ));
    m
}

/// About `bytes` of prose and commands: the fixed instructions and
/// demonstrations agents send before the task.
fn instructions(rng: &mut Rng, bytes: usize) -> String {
    let mut out = String::new();
    while out.len() < bytes {
        out += &format!(
            "The {} of the {} is checked before the {} is used; run `{}` to see it.\n",
            rng.pick(WORDS),
            rng.pick(WORDS),
            rng.pick(WORDS),
            code_line(rng).trim()
        );
    }
    out
}

fn rng_lines(seed: u64, step: usize, lo: u64, hi: u64) -> usize {
    Rng(seed ^ (step as u64 * 7919)).range(lo, hi) as usize
}

/// A SWE-agent classic session: `thought`/`action` on the assistant
/// message (when `fields`), a fenced action in its text, and observations
/// with the `(Open file: …)` / `(Current directory: …)` trailer. The editor
/// shows 100-line windows, as SWE-agent does.
fn swe_session(seed: u64, steps: usize, fields: bool) -> Vec<Message> {
    let mut rng = Rng(seed);
    let demo = format!(
        "Here is a demonstration of how to correctly accomplish this task.\n--- DEMONSTRATION ---\n{}\n--- END OF DEMONSTRATION ---",
        instructions(&mut rng, 18_000)
    );
    let mut m = vec![
        Message::system(
            "SETTING: You are an autonomous programmer, and you're working directly in the command \
             line with a special interface.\nCOMMANDS:\nopen <path> [<line_number>]\ngoto <line>\n\
             scroll_down\nedit <start>:<end>\n<text>\nend_of_edit\nsearch_dir <term>\nsubmit",
        ),
        // SWE-agent sends a demonstration trajectory (about 19 KB in the
        // corpus) before the task.
        Message::user(demo),
        Message::user(format!(
            "We're currently solving the following issue within our repository. Here's the issue \
             text:\nISSUE:\n{TASK}\n\nINSTRUCTIONS: edit the files, run the tests.\n\n(Open file: n/a)\n\
             (Current directory: /repo)\nbash-$"
        )),
    ];
    let file = "/repo/src/http/headers.py";
    for step in 0..steps {
        let window = |rng: &mut Rng, at: usize| {
            format!(
                "[File: {file} (412 lines total)]\n({} more lines above)\n{}\n({} more lines below)",
                at - 1,
                file_body(rng, 100, Some(at)),
                412 - at - 99
            )
        };
        let (action, output) = match step % 5 {
            0 => (
                format!("open src/http/headers.py {}", 50 + step * 10),
                window(&mut rng, 1 + step * 10),
            ),
            1 => (
                format!("search_dir \"{}\"", WORDS[step % WORDS.len()]),
                (0..rng_lines(seed, step, 8, 30))
                    .map(|k| format!("/repo/src/http/mod{k}.py (2 matches)"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            2 => (
                format!(
                    "edit {}:{}\n        return key\nend_of_edit",
                    60 + step,
                    62 + step
                ),
                format!(
                    "{}\nFile updated. Please review the changes and make sure they are correct \
                     (correct indentation, no duplicate lines, etc). Edit the file again if necessary.",
                    window(&mut rng, 1 + step * 10)
                ),
            ),
            3 => (
                "pytest tests/test_core.py -q".to_owned(),
                pytest_output(&mut rng, step < steps / 2),
            ),
            _ => ("scroll_down".to_owned(), window(&mut rng, 1 + step * 10)),
        };
        let thought = format!("Step {step}: let me continue with the header parser.");
        let mut a = Message::assistant(format!("{thought}\n\n```\n{action}\n```"));
        if fields {
            a.extra.insert("thought".into(), thought.into());
            a.extra
                .insert("action".into(), format!("{action}\n").into());
        }
        m.push(a);
        m.push(Message::user(format!(
            "{output}\n\n(Open file: {file})\n(Current directory: /repo)\nbash-$"
        )));
    }
    m
}

/// mini_astropy12907 recorded with tool calls, as mini-swe-agent's text
/// mode would have sent it: the command in a fenced block, the observation
/// (already in its `<returncode>` template) as a user message.
fn as_text_actions(messages: &[Message]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    let mut pending: Vec<String> = Vec::new();
    let flush = |out: &mut Vec<Message>, pending: &mut Vec<String>| {
        if !pending.is_empty() {
            out.push(Message::user(pending.join("\n")));
            pending.clear();
        }
    };
    for m in messages {
        if m.is_tool_result() {
            pending.push(m.text().into_owned());
            continue;
        }
        flush(&mut out, &mut pending);
        match m.role {
            Role::Assistant if m.has_tool_calls() => {
                let mut text = m.text().into_owned();
                for call in m.tool_calls() {
                    let args: serde_json::Value =
                        serde_json::from_str(&call.function.as_ref().unwrap().arguments).unwrap();
                    let command = args["command"].as_str().unwrap_or_default();
                    text += &format!("\n\n```bash\n{command}\n```");
                }
                out.push(Message::assistant(text));
            }
            Role::System | Role::User | Role::Assistant => {
                out.push(Message::new(m.role.clone(), m.content.clone()));
            }
            _ => {}
        }
    }
    flush(&mut out, &mut pending);
    out
}

/// The text-action sessions: the corpus's, and generated ones.
fn sessions() -> Vec<(String, Vec<Message>)> {
    let mut out = vec![
        (
            "generated mini-swe-agent (seed 1)".to_owned(),
            mini_session(1, 24),
        ),
        (
            "generated mini-swe-agent (seed 2)".to_owned(),
            mini_session(2, 40),
        ),
        (
            "generated SWE-agent, action fields".to_owned(),
            swe_session(3, 20, true),
        ),
        (
            "generated SWE-agent, live traffic".to_owned(),
            swe_session(4, 30, false),
        ),
    ];
    for name in [
        "sweagent_pydicom.traj",
        "mini_github_issue.traj.json",
        "mini_local.traj.json",
    ] {
        if let Some(m) = corpus(name) {
            out.push((name.to_owned(), m));
        }
    }
    if let Some(m) = corpus("mini_astropy12907.traj.json") {
        out.push((
            "mini_astropy12907 as text actions".to_owned(),
            as_text_actions(&m),
        ));
    }
    out
}

fn run(messages: &[Message], context_length: u64) -> ReplayReport {
    let counter = counter();
    let engine = Compressor::new(Arc::clone(&counter), context_length);
    let mut session = Session::new("text-actions", Box::new(engine), Arc::clone(&counter));
    replay(
        messages,
        &mut session,
        counter.as_ref(),
        &ReplayOptions::default(),
        |_, _| {},
    )
    .unwrap()
}

#[test]
fn corpus_asks_stay_asks_and_observations_are_tool_output() {
    // (file, observations) for every corpus transcript; the tool-calling
    // ones have none.
    let expected = [
        ("mini_astropy12907.traj.json", 0),
        ("mini_github_issue.traj.json", 9),
        ("mini_local.traj.json", 1),
        ("sweagent_fc_replace.traj", 0),
        ("sweagent_fc_replace_from_source.traj", 0),
        ("sweagent_fc_simple.traj", 0),
        ("sweagent_pydicom.traj", 11),
    ];
    let Some(files) = common::corpus_files() else {
        return;
    };
    for path in files {
        let name = common::name(&path);
        let m = Transcript::load(&path).unwrap().messages;
        let flags = reentries_with(&m, context_engine::validate::auto_text_actions());
        for (i, message) in m.iter().enumerate() {
            if message.role != Role::User {
                assert!(!flags[i], "{name}: message {i} is not a user message");
                continue;
            }
            // A user message that does not answer an assistant turn is an
            // ask (the task, a demonstration): never an observation.
            let answers = i > 0 && m[i - 1].role == Role::Assistant;
            if !answers {
                assert!(
                    is_real_user_turn(&m, i, context_engine::validate::auto_text_actions()),
                    "{name}: ask {i} taken for tool output"
                );
            }
            // An observation follows an assistant action and reads as one.
            if flags[i] {
                let obs =
                    observation_with(&m, i, context_engine::validate::auto_text_actions()).unwrap();
                assert!(!obs.action.commands.is_empty(), "{name}: {i}");
            }
        }
        let observations = flags.iter().filter(|f| **f).count();
        if let Some((_, n)) = expected.iter().find(|(f, _)| *f == name) {
            assert_eq!(observations, *n, "{name}");
        }
        let asks = (0..m.len())
            .filter(|&i| is_real_user_turn(&m, i, context_engine::validate::auto_text_actions()))
            .count();
        println!("{name}: {observations} observations, {asks} user turns");
    }
}

#[test]
fn when_in_doubt_a_user_turn() {
    let action = Message::assistant("THOUGHT: look\n\n```bash\nls\n```");
    let answer = Message::assistant("Done, the files are listed above.");
    let obs = Message::user("<returncode>0</returncode>\n<output>\nsrc\n</output>");
    // After an action: an observation.
    assert!(
        observation_with(
            &[action.clone(), obs.clone()],
            1,
            context_engine::validate::auto_text_actions()
        )
        .is_some()
    );
    // The same text after a plain answer (the user pasting output): an ask.
    assert!(is_real_user_turn(
        &[answer.clone(), obs.clone()],
        1,
        context_engine::validate::auto_text_actions()
    ));
    // After an action, a text in no known shape: an ask.
    let ask = Message::user("Stop, don't touch the tests; fix the parser instead.");
    assert!(is_real_user_turn(
        &[action.clone(), ask.clone()],
        1,
        context_engine::validate::auto_text_actions()
    ));
    // `off`: nothing is an observation.
    assert!(observation_with(&[action.clone(), obs.clone()], 1, &TextActions::off()).is_none());
    // Configured patterns replace the built-in shapes.
    let custom = TextActions::from_config(&TextActionsConfig::Patterns(vec![
        r"^EXIT CODE: \d+\n".to_owned(),
    ]))
    .unwrap();
    let mine = Message::user("EXIT CODE: 2\nmake: *** [all] Error 2");
    assert!(observation_with(&[action.clone(), mine.clone()], 1, &custom).is_some());
    assert!(observation_with(&[action.clone(), obs.clone()], 1, &custom).is_none());
    assert!(observation_with(&[answer, mine], 1, &custom).is_none());
    let err = TextActions::from_config(&TextActionsConfig::Patterns(vec![
        "swe-agent".to_owned(),
        "(unclosed".to_owned(),
    ]))
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("context.text_actions[1]: `(unclosed`"),
        "{err}"
    );
}

#[test]
fn digest_only_replay_saves_on_text_action_sessions() {
    let mut ratios = Vec::new();
    for (name, m) in sessions() {
        let r = run(&m, 10_000_000);
        assert_eq!(r.totals.compactions, 0, "{name}");
        for c in &r.calls {
            assert_eq!(c.violations_introduced, 0, "{name}: call {}", c.call);
        }
        let ratio = r.totals.token_ratio;
        println!(
            "{name}: {} calls, {} → {} tokens ({ratio:.3}×)",
            r.totals.calls,
            r.totals.prompt_tokens_without_engine,
            r.totals.prompt_tokens_with_engine
        );
        if r.totals.calls >= 12 {
            assert!(ratio <= 0.95, "{name}: {ratio:.3}");
            ratios.push(ratio);
        }
    }
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    println!(
        "mean over {} sessions with 12+ calls: {mean:.3}×",
        ratios.len()
    );
    assert!(mean <= 0.85, "{mean:.3}");
}

#[test]
fn digested_observations_keep_the_agents_shape_and_the_prefix() {
    let opts = DigestOptions::default();
    for (name, m) in sessions() {
        let mut previous: Option<(Vec<Message>, usize)> = None;
        let mut digested = 0;
        for (at, _) in m
            .iter()
            .enumerate()
            .filter(|(_, x)| x.role == Role::Assistant)
        {
            let request = &m[..at];
            let view = digest(request, &opts);
            assert_eq!(
                validate(&view, Profile::Strict),
                validate(request, Profile::Strict)
            );
            let flags = reentries_with(request, context_engine::validate::auto_text_actions());
            for (i, (v, r)) in view.iter().zip(request).enumerate() {
                if v == r {
                    continue;
                }
                digested += 1;
                assert!(flags[i], "{name}: only tool output is digested ({i})");
                let (v, r) = (v.text(), r.text());
                assert!(v.contains("[digested] "), "{name}: {v}");
                // A text-action agent has no tool to recall it with: the
                // line names no tool it would try to run as a command.
                assert!(!v.contains("context_recall"), "{name}: {v}");
                assert!(
                    v.contains(" bytes omitted") || v.contains("failed"),
                    "{name}: {v}"
                );
                if r.starts_with("<returncode>") {
                    let head = r.lines().next().unwrap();
                    assert!(v.starts_with(&format!("{head}\n<output>\n")), "{name}: {v}");
                    assert!(v.ends_with("\n</output>"), "{name}: {v}");
                }
                if r.trim_end().ends_with("bash-$") {
                    assert!(
                        v.ends_with("(Current directory: /repo)\nbash-$") || v.ends_with("bash-$"),
                        "{name}: {v}"
                    );
                }
                // Still an observation for the agent's parser and for us.
                assert!(
                    reentries_with(&view, context_engine::validate::auto_text_actions())[i],
                    "{name}: {i}"
                );
            }
            // Only the previously newest batch may change from one call to
            // the next (the same rule as for tool calls).
            if let Some((prev, stable)) = &previous {
                for (j, (p, v)) in prev.iter().zip(&view).enumerate().take(*stable) {
                    assert_eq!(p, v, "{name}: message {j} changed");
                }
            }
            let last_batch = flags.iter().rposition(|f| *f).unwrap_or(request.len());
            previous = Some((view, last_batch));
        }
        println!("{name}: {digested} digested observation views");
    }
}

#[test]
fn every_compaction_keeps_the_task_verbatim() {
    for (name, m) in sessions() {
        let counter = counter();
        // The task: the last user ask before the agent's first turn (a
        // demonstration may come before it).
        let first_turn = m.iter().position(|x| x.role == Role::Assistant).unwrap();
        let task_at = (0..first_turn)
            .rev()
            .find(|&i| is_real_user_turn(&m, i, context_engine::validate::auto_text_actions()))
            .unwrap();
        let task = m[task_at].text().into_owned();
        // Windows of a half, a quarter and an eighth of the largest digested
        // request: the longer sessions must compact, some many times.
        let opts = DigestOptions::default();
        let peak = (1..m.len())
            .map(|k| counter.count_messages(&digest(&m[..k], &opts)))
            .max()
            .unwrap() as u64;
        let mut compactions = 0;
        for window in [peak / 2, peak / 4, peak / 8] {
            let r = run(&m, window.max(8_000));
            for view in &r.compaction_views {
                assert!(
                    view.request
                        .iter()
                        .any(|x| !is_summary(x) && x.text() == task),
                    "{name}: the task is not verbatim after the compaction at call {}",
                    view.call
                );
            }
            compactions += r.compaction_views.len();
        }
        if peak > 20_000 {
            assert!(compactions > 0, "{name}: never compacted");
        }
        println!("{name}: {compactions} compactions, the task verbatim after each");
    }
}

#[test]
fn tool_calls_converted_to_text_actions_read_the_same() {
    // The state record of a summary reads commands, exit codes and errors
    // from observations as from tool results.
    let calls = vec![
        Message::user("fix it"),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "c1",
                "bash",
                r#"{"command": "python -m pytest -q"}"#,
            )],
        ),
        Message::tool_result(
            "c1",
            "<returncode>1</returncode>\n<output>\nFAILED t.py::a - KeyError\n</output>",
        ),
    ];
    let text = as_text_actions(&calls);
    let a = context_engine::summarize::state::StateRecord::build(
        &calls,
        context_engine::validate::auto_text_actions(),
    );
    let b = context_engine::summarize::state::StateRecord::build(
        &text,
        context_engine::validate::auto_text_actions(),
    );
    assert_eq!(a.commands, b.commands);
    assert_eq!(a.errors, b.errors);
    assert_eq!(a.failing_tests, vec!["t.py::a"]);
    assert_eq!(a.failing_tests, b.failing_tests);
}

/// A text-action session as the same agent with a tool channel would have
/// written it: each ```bash block a tool call, each observation its result.
fn as_tool_calls(messages: &[Message]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    let mut call = 0;
    for (i, m) in messages.iter().enumerate() {
        let observation =
            observation_with(messages, i, context_engine::validate::auto_text_actions());
        match (&m.role, observation) {
            (Role::User, Some(_)) => {
                out.push(Message::tool_result(format!("call_{call}"), m.text()));
            }
            (Role::Assistant, _) if m.text().contains("```bash\n") => {
                let text = m.text();
                let command = text
                    .split("```bash\n")
                    .nth(1)
                    .and_then(|c| c.split("\n```").next())
                    .unwrap_or_default();
                call += 1;
                out.push(Message::assistant_tool_calls(
                    text.split("```bash").next().unwrap_or_default().trim(),
                    vec![ToolCall::function(
                        format!("call_{call}"),
                        "bash",
                        serde_json::json!({ "command": command }).to_string(),
                    )],
                ));
            }
            _ => out.push(m.clone()),
        }
    }
    out
}

/// Replays `messages` at `window` with a session store: the report, and
/// every request's text.
fn run_stored(messages: &[Message], window: u64) -> (ReplayReport, Vec<String>) {
    let counter = counter();
    let engine = Compressor::new(Arc::clone(&counter), window);
    let store: Arc<dyn context_engine::store::SessionStore> =
        Arc::new(context_engine::store::MemoryStore::new());
    let mut session = Session::new("channel", Box::new(engine), Arc::clone(&counter))
        .with_store(store)
        .unwrap();
    let r = replay(
        messages,
        &mut session,
        counter.as_ref(),
        &ReplayOptions::default(),
        |_, _| {},
    )
    .unwrap();
    let texts = r
        .compaction_views
        .iter()
        .map(|v| &v.request)
        .chain([&r.final_request])
        .flat_map(|request| request.iter().map(|m| m.text().into_owned()))
        .collect();
    (r, texts)
}

/// What the engine writes into a text-action agent's request (the archive
/// note, the state record's collapsed entries, a left-out note, digest
/// lines) names no engine tool, since the agent has none to call; retention
/// counts nothing it cannot see as recallable. The same session with a
/// tool channel is told the tools, and facts only the archive keeps are
/// recallable there.
#[test]
fn a_text_action_agent_is_told_no_tool_it_cannot_call() {
    // More files and errors than a state record keeps: the oldest collapse
    // into counts, and only the archive has them.
    let mut rng = Rng(9);
    let mut text = vec![
        Message::system("Your response must contain exactly ONE bash code block."),
        Message::user(TASK),
    ];
    for k in 0..48 {
        let (command, code, output) = if k % 2 == 0 {
            (
                format!("cat src/pkg_{k}/module_{k}.py"),
                0,
                file_body(&mut rng, 40, None),
            )
        } else {
            (
                format!("python scripts/check_{k}.py --strict"),
                1,
                format!("Traceback (most recent call last):\nKeyError: 'missing_key_{k}'"),
            )
        };
        text.push(Message::assistant(format!(
            "THOUGHT: step {k}.\n\n```bash\n{command}\n```"
        )));
        text.push(Message::user(format!(
            "<returncode>{code}</returncode>\n<output>\n{output}\n</output>"
        )));
    }
    let tools = as_tool_calls(&text);
    assert_eq!(
        context_engine::digest::ToolChannel::of(
            &text,
            context_engine::validate::auto_text_actions()
        ),
        context_engine::digest::ToolChannel::TextActions
    );
    assert_eq!(
        context_engine::digest::ToolChannel::of(
            &tools,
            context_engine::validate::auto_text_actions()
        ),
        context_engine::digest::ToolChannel::Tools
    );
    let names = ["context_expand", "context_search", "context_recall"];
    let (r, texts) = run_stored(&text, 6_000);
    assert!(!r.compaction_views.is_empty(), "the session must compact");
    assert!(
        texts
            .iter()
            .any(|t| t.contains("archived verbatim (handle s")),
        "the summary still says what was archived"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("earlier commands archived)")),
        "the record's counts say where the entries went"
    );
    for t in &texts {
        for name in names {
            assert!(!t.contains(name), "a text-action request names {name}: {t}");
        }
    }
    assert_eq!(r.retention.recallable, 0, "{:?}", r.retention);
    assert!(r.compactions.iter().all(|c| c.retention.recallable == 0));
    let text_lost = r.retention.lost;
    assert!(text_lost > 0, "{:?}", r.retention);

    let (r, texts) = run_stored(&tools, 6_000);
    assert!(!r.compaction_views.is_empty(), "the session must compact");
    assert!(
        texts
            .iter()
            .any(|t| t.contains("context_expand {\"handle\":\"s"))
    );
    assert!(r.retention.recallable > 0, "{:?}", r.retention);
    assert!(r.retention.lost < text_lost, "{:?}", r.retention);
}
