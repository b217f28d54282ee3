use super::*;
use crate::tokens::{BpeCounter, Encoding, thousands};
use crate::validate::validate;

fn counter() -> BpeCounter {
    BpeCounter::new(Encoding::O200kBase)
}

fn session(results: usize, bytes: usize) -> Vec<Message> {
    let mut m = vec![
        Message::system("You are a coding agent."),
        Message::user("Fix the bug in parser.py"),
    ];
    for k in 0..results {
        let id = format!("call_{k}");
        m.push(Message::assistant_tool_calls(
            "",
            vec![crate::message::ToolCall::function(
                id.clone(),
                "bash",
                format!("{{\"command\":\"cat file{k}.py\"}}"),
            )],
        ));
        let body: String = (0..bytes / 16)
            .map(|j| format!("line {j:09} ok\n"))
            .collect();
        m.push(Message::tool_result(&id, body));
    }
    m
}

#[test]
fn the_sizes_are_named_when_nothing_can_fit() {
    let c = counter();
    let m = session(1, 4000);
    let err = fit(
        &m,
        10,
        &c,
        Profile::OpenAi,
        crate::validate::auto_text_actions(),
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("system prompt "), "{err}");
    assert!(err.system_tokens + err.ask_tokens > 10);
    assert_eq!(thousands(7019), "7,019");
    assert_eq!(thousands(6944), "6,944");
    assert_eq!(thousands(1_234_567), "1,234,567");
}

#[test]
fn a_noted_fit_stays_under_each_budget_and_names_the_originals() {
    let c = counter();
    let m = session(6, 6000);
    let total = c.count_messages(&m) as u64;
    let core = c.count_messages(&m[..2]) as u64;
    for budget in [core + 64, core + 300, total / 4, total / 2, total - 1] {
        let fitted = fit_noted(
            &m,
            &m,
            budget,
            &c,
            Profile::Strict,
            crate::validate::auto_text_actions(),
            false,
        )
        .unwrap();
        assert!(fitted.tokens_after <= budget, "{budget}");
        assert_eq!(
            fitted.tokens_after,
            c.count_messages(&fitted.messages) as u64
        );
        assert!(validate(&fitted.messages, Profile::Strict).is_empty());
        assert!(!fitted.left_out.is_empty());
        if let Some(h) = &fitted.archive_handle {
            let gone: Vec<Message> = fitted.left_out.iter().map(|&i| m[i].clone()).collect();
            assert_eq!(*h, crate::store::span_handle(&gone));
            let noted: Vec<usize> = (0..fitted.messages.len())
                .filter(|&i| fitted.messages[i].text().contains(h.as_str()))
                .collect();
            assert_eq!(noted.len(), 1, "one note");
            // Strict alternation leaves no place of its own for a
            // user note after tool results: the system prompt has it.
            assert_eq!(noted[0], 0);
        }
    }
    // With room, the note is there.
    let roomy = fit_noted(
        &m,
        &m,
        total / 2,
        &c,
        Profile::Strict,
        crate::validate::auto_text_actions(),
        true,
    )
    .unwrap();
    assert!(roomy.archive_handle.is_some());
}

#[test]
fn the_room_a_note_leaves_carries_the_commands_it_left_out() {
    // Small results: the ladder leaves whole groups out, and what room
    // the budget leaves after the note lists their commands.
    let c = counter();
    let m = session(12, 400);
    let total = c.count_messages(&m) as u64;
    let fitted = fit_noted(
        &m,
        &m,
        total * 2 / 3,
        &c,
        Profile::OpenAi,
        crate::validate::auto_text_actions(),
        false,
    )
    .unwrap();
    assert!(fitted.tokens_after <= total * 2 / 3);
    assert_eq!(
        fitted.tokens_after,
        c.count_messages(&fitted.messages) as u64
    );
    assert!(validate(&fitted.messages, Profile::OpenAi).is_empty());
    assert!(fitted.archive_handle.is_some());
    assert!(!fitted.left_out.is_empty());
    let text: String = fitted
        .messages
        .iter()
        .map(|m| crate::retention::searchable(m, &m.text()))
        .collect();
    assert!(text.contains("Their state record:"), "{text}");
    // Every command left out is in the request, in its note or its
    // place.
    for k in 0..12 {
        assert!(text.contains(&format!("cat file{k}.py")), "file{k}: {text}");
    }
}

#[test]
fn a_note_stands_after_the_unchanged_prefix_so_the_cached_part_stays() {
    let c = counter();
    let mut m = session(6, 6000);
    // A summary after the ask, as after an earlier compaction.
    m.insert(
        2,
        Message::user(format!("{SUMMARY_PREFIX}\nearlier work{SUMMARY_END}")),
    );
    m.insert(3, Message::assistant("Going on."));
    let total = c.count_messages(&m) as u64;
    for budget in [total / 2, total * 3 / 4] {
        let fitted = fit_noted(
            &m,
            &m,
            budget,
            &c,
            Profile::OpenAi,
            crate::validate::auto_text_actions(),
            false,
        )
        .unwrap();
        let h = fitted.archive_handle.clone().expect("a note fits");
        assert!(fitted.tokens_after <= budget);
        assert_eq!(
            fitted.tokens_after,
            c.count_messages(&fitted.messages) as u64
        );
        assert!(validate(&fitted.messages, Profile::OpenAi).is_empty());
        let at = (0..fitted.messages.len())
            .find(|&i| fitted.messages[i].text().contains(h.as_str()))
            .unwrap();
        // Its own user message; the instructions, the ask and the
        // summary before it unchanged; the request still ends as the
        // agent left it.
        assert_eq!(fitted.messages[at].role, Role::User);
        assert!(at >= 4, "{at}");
        assert_eq!(fitted.messages[..4], m[..4]);
        assert_eq!(fitted.messages.last(), m.last());
    }
}

#[test]
fn each_budget_from_the_core_up_is_met_validly() {
    let c = counter();
    let m = session(6, 6000);
    let total = c.count_messages(&m) as u64;
    let core = c.count_messages(&m[..2]) as u64;
    for budget in [core + 64, core + 300, total / 4, total / 2, total - 1] {
        let fitted = fit(
            &m,
            budget,
            &c,
            Profile::Strict,
            crate::validate::auto_text_actions(),
        )
        .unwrap();
        assert!(
            fitted.tokens_after <= budget,
            "{budget}: {}",
            fitted.tokens_after
        );
        assert_eq!(
            fitted.tokens_after,
            c.count_messages(&fitted.messages) as u64
        );
        assert!(validate(&fitted.messages, Profile::Strict).is_empty());
        assert!(!fitted.steps.is_empty());
        // The latest ask is kept verbatim.
        assert!(fitted.messages.contains(&m[1]));
    }
}

#[test]
fn the_newest_batch_is_digested_first_and_keeps_a_handle() {
    let c = counter();
    let m = session(2, 20_000);
    let total = c.count_messages(&m) as u64;
    let fitted = fit(
        &m,
        total / 2,
        &c,
        Profile::OpenAi,
        crate::validate::auto_text_actions(),
    )
    .unwrap();
    assert_eq!(fitted.steps[0].step, FitStepKind::DigestResults);
    assert_eq!(fitted.messages.len(), m.len());
    let last = fitted.messages.last().unwrap().text();
    assert!(
        last.contains("context_recall {\"handle\":\"call_1\"}"),
        "{last}"
    );
    assert!(last.starts_with("line 000000000 ok"));
}

#[test]
fn a_text_action_observation_is_clipped_without_a_recall_hint() {
    let c = counter();
    let body: String = (0..2_000).map(|j| format!("line {j:09} ok\n")).collect();
    let m = vec![
        Message::system("You are a helpful assistant."),
        Message::user("Fix the bug in a.py."),
        Message::assistant("THOUGHT: read it.\n\n```bash\ncat a.py\n```"),
        Message::user(format!(
            "<returncode>0</returncode>\n<output>\n{body}</output>"
        )),
    ];
    assert!(
        crate::validate::observation_with(&m, 3, crate::validate::auto_text_actions()).is_some()
    );
    let total = c.count_messages(&m) as u64;
    let fitted = fit(
        &m,
        total / 2,
        &c,
        Profile::OpenAi,
        crate::validate::auto_text_actions(),
    )
    .unwrap();
    let last = fitted.messages.last().unwrap().text();
    assert!(last.contains("bytes omitted to fit the window]"), "{last}");
    assert!(!last.contains("context_recall"), "{last}");
}

#[test]
fn a_truncated_request_takes_back_the_summarys_state_record_where_it_fits() {
    // System, ask, a summary between two assistant turns' worth of
    // history, and a last group too big for the budget: the truncation
    // drops the summary, then takes its state record back (before the
    // ask's own words, where it may not stand alone) when that fits.
    let c = counter();
    let record = crate::summarize::state::StateRecord {
        commands: (0..6)
            .map(|k| crate::summarize::state::CommandState {
                command: format!("cat src/file{k}.py"),
                exit: Some(0),
                failed: Some(false),
                runs: 1,
            })
            .collect(),
        ..Default::default()
    }
    .render(10_000, crate::summarize::state::Collapsed::NotListed);
    let narrative = "A long narrative of what happened. ".repeat(80);
    let mut m = vec![
        Message::system("You are a coding agent."),
        Message::user("Fix the bug in parser.py"),
        Message::assistant(crate::summary_text::wrap_summary(&format!(
            "{narrative}\n\n{record}"
        ))),
    ];
    m.extend(session(1, 6000).into_iter().skip(2));
    let full = c.count_messages(&m) as u64;
    // The system prompt, the ask, the last group clipped hard and the
    // record (with the summary's wrapper): no room for the group digested.
    let core = c.count_messages(&m[..2]) as u64;
    let ledger = c.count_text(&crate::summary_text::wrap_summary(&record)) as u64;
    let budget = core + ledger + 160;
    assert!(budget < full);
    let fitted = fit(
        &m,
        budget,
        &c,
        Profile::OpenAi,
        crate::validate::auto_text_actions(),
    )
    .unwrap();
    assert!(fitted.tokens_after <= budget);
    assert!(ledger_kept(&m, &fitted.messages), "{:#?}", fitted.messages);
    assert!(validate(&fitted.messages, Profile::OpenAi).is_empty());
}
