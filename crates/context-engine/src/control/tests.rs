use super::*;

#[test]
fn a_focus_is_read_trimmed_and_blank_means_none() {
    let ask = compact_ask(&json!({"focus": "  the parser  "})).unwrap();
    assert_eq!(ask.focus.as_deref(), Some("the parser"));
    assert_eq!(compact_ask(&json!({"focus": " "})).unwrap().focus, None);
    assert_eq!(compact_ask(&json!({})).unwrap().focus, None);
    assert_eq!(compact_ask(&json!({"focus": null})).unwrap().focus, None);
}

#[test]
fn bad_arguments_say_what_is_wrong() {
    let e = compact_ask(&json!({"focus": 3})).unwrap_err().to_string();
    assert!(e.contains("`focus` must be text, not a number"), "{e}");
    let e = compact_ask(&json!({"topic": "x"})).unwrap_err().to_string();
    assert!(e.contains("unknown argument `topic`"), "{e}");
    let e = compact_ask(&json!(["x"])).unwrap_err().to_string();
    assert!(e.contains("must be an object"), "{e}");
    let long = "x".repeat(MAX_FOCUS_CHARS + 1);
    let e = compact_ask(&json!({ "focus": long }))
        .unwrap_err()
        .to_string();
    assert!(e.contains("2001 characters; at most 2000"), "{e}");
}

#[test]
fn the_status_names_the_figures_and_what_is_left() {
    let notes = [CompactionNote {
        number: 1,
        messages_summarized: 12,
        tokens_before: 9000,
        tokens_after: 3000,
        summarizer: Some("extractive".into()),
        focus: None,
        archived: Some("s-1-12".into()),
        asked_by_agent: false,
    }];
    let ask = CompactionAsk {
        focus: Some("io".into()),
    };
    let answer: Value = serde_json::from_str(&status_answer(&Budget {
        context_length: 16000,
        threshold_tokens: 10000,
        request_tokens: Some((4000, "request")),
        compactions: 1,
        notes: &notes,
        pending: Some(&ask),
        blocked: None,
        tool_rules: json!([]),
    }))
    .unwrap();
    assert_eq!(answer["request_tokens"], 4000);
    assert_eq!(answer["window_used_percent"], 25.0);
    assert_eq!(answer["tokens_until_compaction"], 6000);
    assert_eq!(answer["recent_compactions"][0]["archived"], "s-1-12");
    assert_eq!(answer["compaction_pending"]["focus"], "io");
    assert!(answer.get("compaction_blocked").is_none());
}

mod through_the_engine {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use crate::compressor::Compressor;
    use crate::engine::{CompressRequest, ContextEngine, ToolCallContext, Usage};
    use crate::host::{Session, Trigger};
    use crate::message::{Message, ToolCall};
    use crate::store::MemoryStore;
    use crate::tokens::{BpeCounter, Encoding, TokenCounter};

    fn counter() -> Arc<dyn TokenCounter> {
        Arc::new(BpeCounter::new(Encoding::O200kBase))
    }

    /// A coding session of `turns` turns, each reading a file, well under
    /// a 64k window.
    fn history(turns: usize) -> Vec<Message> {
        let mut h = vec![
            Message::system("You are a coding agent."),
            Message::user("Fix the failing parser test in parser.py."),
        ];
        for i in 0..turns {
            let id = format!("call{i}");
            h.push(Message::assistant_tool_calls(
                "",
                vec![ToolCall::function(
                    &id,
                    "bash",
                    format!(r#"{{"command":"cat module_{i}.py"}}"#),
                )],
            ));
            h.push(Message::tool_result(
                &id,
                format!("def f_{i}(x):\n    return x + {i}\n").repeat(30),
            ));
            h.push(Message::assistant(format!("module_{i}.py adds {i}.")));
        }
        h
    }

    fn answer(s: &mut Session, name: &str, args: &str, h: &[Message]) -> Value {
        let text = s
            .handle_tool_call(name, args, h)
            .unwrap_or_else(|| panic!("{name} is an engine tool"));
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn both_tools_are_offered_beside_the_agents_own() {
        let s = Session::new("t", Box::new(Compressor::new(counter(), 64_000)), counter());
        let agent = vec![json!({"type": "function", "function": {"name": "bash"}})];
        let names: Vec<String> = s
            .tools(&agent)
            .iter()
            .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(
            names,
            [
                "bash",
                "context_recall",
                "context_status",
                "context_compact"
            ]
        );
    }

    #[test]
    fn status_reports_the_request_the_host_prepared_and_the_threshold() {
        let counter = counter();
        let engine = Compressor::new(Arc::clone(&counter), 64_000);
        let mut s = Session::new("t", Box::new(engine), Arc::clone(&counter));
        let h = history(8);
        let prepared = s.before_request(&h);
        assert!(prepared.update.compaction.is_none());
        let status = answer(&mut s, "context_status", "{}", &h);
        assert_eq!(status["request_tokens"], prepared.request_tokens);
        assert_eq!(status["request_tokens_source"], "request");
        assert_eq!(status["context_length"], 64_000);
        let threshold = s.engine().state().threshold_tokens;
        assert_eq!(status["threshold_tokens"], threshold);
        assert_eq!(
            status["tokens_until_compaction"],
            threshold - prepared.request_tokens
        );
        assert_eq!(status["compactions"], 0);
        assert!(status.get("compaction_pending").is_none());
    }

    #[test]
    fn an_ask_compacts_the_next_request_with_its_focus_and_is_listed() {
        let counter = counter();
        let engine = Compressor::new(Arc::clone(&counter), 64_000);
        let store = Arc::new(MemoryStore::new());
        let mut s = Session::new("t", Box::new(engine), Arc::clone(&counter))
            .with_store(store)
            .unwrap();
        let h = history(10);
        // Far under the threshold: nothing happens on its own.
        assert!(s.before_request(&h).update.compaction.is_none());
        s.after_response(&Usage::new(counter.count_messages(&h) as u64, 20));

        let bad = answer(&mut s, "context_compact", r#"{"focus": 7}"#, &h);
        assert!(
            bad["error"]
                .as_str()
                .unwrap()
                .contains("`focus` must be text")
        );
        assert!(
            !s.engine().compaction_requested(),
            "a refused ask is no ask"
        );

        let ok = answer(&mut s, "context_compact", r#"{"focus": "module_3.py"}"#, &h);
        assert_eq!(ok["scheduled"], true);
        assert_eq!(ok["focus"], "module_3.py");
        let status = answer(&mut s, "context_status", "{}", &h);
        assert_eq!(status["compaction_pending"]["focus"], "module_3.py");

        let prepared = s.before_request(&h);
        let compaction = prepared.update.compaction.expect("the ask compacts");
        assert_eq!(compaction.trigger, Trigger::Agent);
        let new = prepared.update.new_history.expect("a new history");
        let summary = new
            .iter()
            .map(Message::text)
            .find(|t| t.contains("Focus topic:"))
            .expect("the summary names the focus");
        assert!(summary.contains("Focus topic: module_3.py"), "{summary}");
        assert!(!s.engine().compaction_requested(), "the ask is spent");

        // Asked again on the request just compacted: refused, so a loop
        // (or an instruction planted in a tool result) cannot thrash.
        let again = answer(&mut s, "context_compact", "{}", &new);
        assert!(
            again["error"]
                .as_str()
                .unwrap()
                .contains("compacted for this very request"),
            "{again}"
        );
        assert!(!s.engine().compaction_requested());

        let status = answer(&mut s, "context_status", "{}", &new);
        assert_eq!(status["compactions"], 1);
        let note = &status["recent_compactions"][0];
        assert_eq!(note["number"], 1);
        assert_eq!(note["asked_by_agent"], true);
        assert_eq!(note["focus"], "module_3.py");
        // What it archived expands from the store under that handle.
        let handle = note["archived"].as_str().expect("an archive handle");
        let expanded = answer(
            &mut s,
            "context_expand",
            &json!({ "handle": handle }).to_string(),
            &new,
        );
        assert!(
            expanded.to_string().contains("module_3.py adds 3."),
            "{expanded}"
        );
        assert!(status.get("compaction_pending").is_none());
    }

    #[test]
    fn an_ask_survives_a_snapshot_and_a_reset_clears_it() {
        let counter = counter();
        let mut engine = Compressor::new(Arc::clone(&counter), 64_000);
        let ask = engine.handle_tool_call(
            "context_compact",
            &json!({"focus": "the parser"}),
            &ToolCallContext::default(),
        );
        assert!(ask.contains("scheduled"), "{ask}");
        let snapshot = engine.snapshot();
        let mut resumed = Compressor::new(Arc::clone(&counter), 64_000);
        resumed.restore(&snapshot).unwrap();
        assert!(resumed.compaction_requested());
        assert_eq!(
            resumed.compaction_ask().and_then(|a| a.focus.as_deref()),
            Some("the parser")
        );
        resumed.on_session_reset();
        assert!(!resumed.compaction_requested());
    }

    /// Hermes drives the engine itself: after the tool call,
    /// `should_compress` on the real count says yes, and `compress` without
    /// a focus of its own takes the ask's.
    #[test]
    fn an_engine_driven_without_the_host_takes_the_ask_too() {
        let counter = counter();
        let mut engine = Compressor::new(Arc::clone(&counter), 64_000);
        let h = history(10);
        let tokens = counter.count_messages(&h) as u64;
        engine.update_from_response(&Usage::new(tokens, 10));
        assert!(!engine.should_compress(Some(tokens)));
        let status: Value = serde_json::from_str(&engine.handle_tool_call(
            "context_status",
            &json!({}),
            &ToolCallContext::default().with_messages(&h),
        ))
        .unwrap();
        assert_eq!(status["request_tokens"], tokens);
        assert_eq!(status["request_tokens_source"], "provider usage");

        engine.handle_tool_call(
            "context_compact",
            &json!({"focus": "module_7.py"}),
            &ToolCallContext::default(),
        );
        assert!(engine.should_compress(Some(tokens)));
        let out = engine
            .compress(&h, &CompressRequest::new().with_current_tokens(tokens))
            .unwrap();
        assert!(
            out.messages
                .iter()
                .any(|m| m.text().contains("Focus topic: module_7.py"))
        );
        assert!(!engine.should_compress(Some(tokens)));
        assert_eq!(engine.compaction_notes().len(), 1);
        assert!(engine.compaction_notes()[0].asked_by_agent);
    }

    #[test]
    fn an_ask_that_cannot_be_met_ends_and_is_not_retried() {
        let counter = counter();
        let mut engine = Compressor::new(Arc::clone(&counter), 64_000);
        engine.handle_tool_call("context_compact", &json!({}), &ToolCallContext::default());
        let short = history(0);
        assert!(engine.compress(&short, &CompressRequest::new()).is_err());
        assert!(!engine.compaction_requested(), "the ask ended");
        assert!(!engine.should_compress(Some(10)));
    }

    #[test]
    fn a_secret_in_the_focus_is_redacted_before_it_is_kept() {
        let mut engine = Compressor::new(counter(), 64_000);
        let answer = engine.handle_tool_call(
            "context_compact",
            &json!({"focus": "the key AKIAZ3MK5Q7R2XWPLB4N in config.py"}),
            &ToolCallContext::default(),
        );
        let snapshot = engine.snapshot().to_string();
        for text in [answer.as_str(), snapshot.as_str()] {
            assert!(!text.contains("AKIAZ3MK5Q7R2XWPLB4N"), "{text}");
            assert!(text.contains("config.py"), "{text}");
        }
    }
}
