use serde_json::{Value, json};

use super::*;
use crate::store::{Batch, MemoryStore, SessionStore, archive_note, span_handle};
use crate::{Message, ToolCall};

fn call(name: &str, args: Value, sources: Sources<'_>) -> Value {
    serde_json::from_str(&handle_tool_call(name, &args, sources)).expect("json answer")
}

fn archived() -> (MemoryStore, Vec<Message>, String) {
    let span = vec![
        Message::user("port the lexer to src/lex.rs"),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "c1",
                "bash",
                r#"{"command": "cargo test"}"#,
            )],
        ),
        Message::tool_result("c1", "error[E0425]: cannot find value `tok`\nline two\n"),
    ];
    let store = MemoryStore::new();
    let mut batch = Batch::new();
    let handle = batch.archive_span(&span, 1, 4);
    store.commit("s", &batch).expect("commit");
    let history = vec![
        Message::system("sys"),
        Message::user(format!("summary. {}", archive_note(1, 4, &handle))),
        Message::tool_result(
            "c9",
            "[pruned] bash → re-run; full output: context_recall {\"handle\":\"c9\"}",
        ),
    ];
    (store, history, handle)
}

#[test]
fn recall_reads_the_history_then_the_archive() {
    let (store, history, span) = archived();
    let src = Sources::history(&history).with_store(&store, "s");
    let a = call(RECALL_TOOL, json!({"handle": "c1"}), src);
    assert_eq!(a["source"], "archive");
    assert_eq!(
        a["content"],
        "error[E0425]: cannot find value `tok`\nline two\n"
    );
    let a = call(RECALL_TOOL, json!({"handle": "c1", "lines": "2"}), src);
    assert_eq!(a["content"], "line two\n");
    let a = call(RECALL_TOOL, json!({"handle": span}), src);
    assert!(
        a["content"]
            .as_str()
            .expect("text")
            .contains("port the lexer"),
        "{a}"
    );
    // Without the store, the same handle is unknown: a clear error.
    let a = call(
        RECALL_TOOL,
        json!({"handle": "c1"}),
        Sources::history(&history),
    );
    assert!(a["error"].as_str().expect("error").contains("c1"), "{a}");
    // A pruned line in the history is not the body.
    let a = call(RECALL_TOOL, json!({"handle": "c9"}), src);
    assert!(a["error"].is_string(), "{a}");
}

#[test]
fn bad_input_gets_clear_errors_never_a_panic() {
    let (store, history, _) = archived();
    let src = Sources::history(&history).with_store(&store, "s");
    for (tool, args) in [
        (RECALL_TOOL, json!({})),
        (RECALL_TOOL, json!({"handle": ""})),
        (RECALL_TOOL, json!({"handle": 7})),
        (RECALL_TOOL, json!({"handle": "nope"})),
        (RECALL_TOOL, json!({"handle": "c1", "lines": "x-y"})),
        (RECALL_TOOL, json!({"handle": "c1", "start_line": 0})),
        (RECALL_TOOL, json!({"handle": "c1", "start_line": 99})),
        (SEARCH_TOOL, json!({})),
        (SEARCH_TOOL, json!({"query": "   "})),
        (SEARCH_TOOL, json!({"query": "-- ::"})),
        (SEARCH_TOOL, json!({"query": "lexer", "limit": 0})),
        (SEARCH_TOOL, json!({"query": "lexer", "limit": "many"})),
        (EXPAND_TOOL, json!({"handle": "s000000000000"})),
        (EXPAND_TOOL, json!({"handle": "c1#zero"})),
        (EXPAND_TOOL, json!({"handle": "c1#99"})),
        ("context_nothing", json!({})),
    ] {
        let a = call(tool, args.clone(), src);
        let e = a["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{tool} {args}: {a}"));
        assert!(!e.is_empty());
    }
}

#[test]
fn search_finds_live_and_archived_text_with_handles() {
    let (store, history, span) = archived();
    let src = Sources::history(&history).with_store(&store, "s");
    let a = call(SEARCH_TOOL, json!({"query": "E0425", "limit": 500}), src);
    let hits = a["hits"].as_array().expect("hits");
    assert_eq!(hits.len(), 1, "{a}");
    assert_eq!(hits[0]["handle"], "c1");
    assert_eq!(hits[0]["spans"], json!([span]));
    assert_eq!(
        hits[0]["lines"],
        json!([{"line": 1, "text": "error[E0425]: cannot find value `tok`"}])
    );
    let a = call(SEARCH_TOOL, json!({"query": "pruned"}), src);
    assert_eq!(a["hits"][0]["source"], "history");
}

#[test]
fn expand_pages_large_answers_with_a_continuation() {
    let big: Vec<Message> = (0..40)
        .map(|i| Message::assistant(format!("step {i}: {}", "x".repeat(2000))))
        .collect();
    let store = MemoryStore::new();
    let mut batch = Batch::new();
    let handle = batch.archive_span(&big, 0, 40);
    assert_eq!(handle, span_handle(&big));
    store.commit("s", &batch).expect("commit");
    let src = Sources::history(&[]).with_store(&store, "s");
    let mut next = Some(handle.clone());
    let mut seen = 0;
    let mut pages = 0;
    while let Some(h) = next {
        let a = call(EXPAND_TOOL, json!({"handle": h}), src);
        assert!(a.to_string().len() < MAX_ANSWER_BYTES + 4096, "bounded");
        seen += a["messages"].as_array().expect("messages").len();
        next = a["next"].as_str().map(str::to_owned);
        pages += 1;
    }
    assert_eq!(seen, 40);
    assert!(pages > 1);
    // A huge single body is paged by lines.
    let body = "line\n".repeat(20_000);
    let history = vec![Message::tool_result("c1", body.clone())];
    let a = call(
        EXPAND_TOOL,
        json!({"handle": "c1"}),
        Sources::history(&history),
    );
    assert_eq!(a["next"], "c1#6554");
    let a = call(
        RECALL_TOOL,
        json!({"handle": "c1"}),
        Sources::history(&history),
    );
    assert_eq!(a["truncated"], true);
    assert_eq!(a["next"]["start_line"], 6554);
}

/// The issue's example: a long pytest output with one failing assertion
/// among hundreds of PASSED lines. The hit shows that line, by number,
/// with the handle that recalls the whole output; live hits show their
/// lines too.
#[test]
fn search_hits_show_the_line_that_matched_not_the_lines_around_it() {
    let mut output = String::new();
    for i in 0..300 {
        output.push_str(&format!("tests/test_main.py::test_{i} PASSED in 0.01s\n"));
    }
    output.push_str("E   AssertionError: expected 38 got 136 in test_11_6\n");
    for i in 0..40 {
        output.push_str(&format!("tests/test_io.py::test_{i} PASSED\n"));
    }
    let span = vec![
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function("p1", "bash", r#"{"command": "pytest"}"#)],
        ),
        Message::tool_result("p1", output.clone()),
    ];
    let store = MemoryStore::new();
    let mut batch = Batch::new();
    let handle = batch.archive_span(&span, 1, 3);
    store.commit("s", &batch).expect("commit");
    let live = vec![Message::tool_result(
        "p2",
        "ok\nrerun: expected 38 got 136 in test_11_6 again\n",
    )];
    let src = Sources::history(&live).with_store(&store, "s");
    let a = call(
        SEARCH_TOOL,
        json!({"query": "expected 38 got 136 in test_11_6"}),
        src,
    );
    assert_eq!(
        a["hits"],
        json!([
            {"source": "history", "message": 0, "role": "tool", "handle": "p2",
             "lines": [{"line": 2, "text": "rerun: expected 38 got 136 in test_11_6 again"}]},
            {"source": "archive", "handle": "p1", "role": "tool", "spans": [handle],
             "lines": [{"line": 301, "text": "E   AssertionError: expected 38 got 136 in test_11_6"}]},
        ]),
        "{a}"
    );
    // The handle recalls the whole output, and the line number reads it.
    let r = call(
        RECALL_TOOL,
        json!({"handle": "p1", "start_line": 301, "end_line": 301}),
        src,
    );
    assert_eq!(
        r["content"],
        "E   AssertionError: expected 38 got 136 in test_11_6\n"
    );
}
