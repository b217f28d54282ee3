//! The behaviour every [`SessionStore`] backend shares, as one set of
//! checks run against each (memory and SQLite in the engine's tests,
//! Postgres in `context-engine-postgres`'s): the archive, search, records,
//! the versioned record's compare-and-swap and the claims on background
//! jobs.

use std::time::Duration;

use context_engine::store::{
    Batch, CompactionInfo, EntryKind, HistoryWrite, SessionStore, Since, StoreError, archive_note,
    span_handle,
};
use context_engine::{Message, ToolCall};
use serde_json::{Value, json};

fn history() -> Vec<Message> {
    vec![
        Message::system("You are a coding agent."),
        Message::user("fix the failing parser test in src/parse.rs"),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "c1",
                "bash",
                r#"{"command": "pytest -q tests/test_parse.py"}"#,
            )],
        ),
        Message::tool_result(
            "c1",
            "FAILED tests/test_parse.py::test_empty - KeyError: 'token'\n[exit 1]",
        ),
        Message::assistant("The tokenizer drops empty input; editing src/parse.rs."),
        Message::user("also run the linter"),
    ]
}

fn json_of(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .map(context_engine::store::handle::message_json)
        .collect()
}

/// Archive, resolve, search, records, state, conflict, sharing, delete.
pub fn archive(store: &dyn SessionStore) {
    let input = history();
    let span = &input[1..5];
    let handle = span_handle(span);
    let summary = Message::user(format!(
        "[CONTEXT SUMMARY]\n{}\n[END]",
        archive_note(1, 5, &handle)
    ));
    let output = vec![input[0].clone(), summary, input[5].clone()];
    let mut batch = Batch::new();
    let info = CompactionInfo::new(1, "manual", "compressor")
        .with_summarizer(Some("extractive".into()))
        .with_tokens(500, 200);
    batch.compaction(&input, &output, &info).expect("archived");
    batch.set_state(json!({"compression_count": 1}));
    store.commit("s1", &batch).expect("commit");

    let entry = store
        .resolve(Some("s1"), &handle)
        .expect("resolve")
        .expect("found");
    assert_eq!(entry.kind, EntryKind::Span);
    assert_eq!(json_of(&entry.messages), json_of(span), "verbatim");
    assert_eq!((entry.start, entry.end), (Some(1), Some(5)));
    assert_eq!(entry.session, "s1");
    let result = store.resolve(None, "c1").expect("resolve").expect("found");
    assert_eq!(json_of(&result.messages), json_of(&input[3..4]));
    assert!(
        store
            .resolve(Some("other"), "c1")
            .expect("resolve")
            .is_none()
    );

    // Every word as a phrase first, then any word.
    let hits = store
        .search(Some("s1"), "KeyError test_parse.py", 5)
        .expect("search");
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].handle, "c1");
    assert_eq!(hits[0].spans, vec![handle.clone()]);
    assert_eq!(hits[0].source, "archive");
    // The line that holds the words, with their ranges.
    let line = &hits[0].lines[0];
    assert_eq!(line.line, 1, "{line:?}");
    let marked: Vec<&str> = line
        .ranges
        .iter()
        .map(|[s, e]| &line.text[*s..*e])
        .collect();
    assert_eq!(marked, ["test_parse.py", "KeyError"], "{line:?}");
    let any = store
        .search(Some("s1"), "linter tokenizer", 5)
        .expect("search");
    assert_eq!(any.len(), 1, "falls back to any word: {any:?}");
    assert!(
        store
            .search(Some("s1"), "   ", 5)
            .expect("search")
            .is_empty()
    );
    assert!(
        store
            .search(Some("s1"), "\"\" :", 5)
            .expect("search")
            .is_empty()
    );
    assert!(store.search(Some("s1"), "'); DROP TABLE x; --", 5).is_ok());
    assert!(
        store
            .search(None, "nowhere-to-be-found", 5)
            .expect("search")
            .is_empty()
    );

    let records = store.compactions("s1").expect("records");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].handle, handle);
    assert_eq!(records[0].archived, 4);
    assert_eq!(records[0].summarizer.as_deref(), Some("extractive"));
    assert_eq!(records[0].summary.len(), 1);
    assert_eq!(
        (records[0].tokens_before, records[0].tokens_after),
        (500, 200)
    );
    assert_eq!(
        store.load_state("s1").expect("state"),
        Some(json!({"compression_count": 1}))
    );
    assert_eq!(store.load_state("nobody").expect("state"), None);

    // The same compaction number twice: a clash of records (not a lost
    // race: never retried as one) that changes nothing.
    let mut again = Batch::new();
    again.compaction(&input, &output, &info);
    again.set_state(json!({"compression_count": 99}));
    let err = store.commit("s1", &again).expect_err("recorded twice");
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err}");
    assert!(err.to_string().contains("compaction 1"), "{err}");
    assert_eq!(
        store.load_state("s1").expect("state"),
        Some(json!({"compression_count": 1}))
    );

    // Shared messages are stored once and survive another session's delete.
    let mut other = Batch::new();
    other.archive(&input[3]);
    store.commit("s2", &other).expect("commit");
    assert_eq!(
        store
            .resolve(Some("s2"), "c1")
            .expect("r")
            .expect("f")
            .messages
            .len(),
        1
    );
    store.delete_session("s2").expect("delete");
    assert!(store.resolve(Some("s2"), "c1").expect("r").is_none());
    assert!(store.resolve(Some("s1"), "c1").expect("r").is_some());
    assert!(store.handles("s1").expect("handles").contains(&handle));
}

/// What a reader holding history segments `held` builds from a
/// [`SessionStore::load_versioned_after`] answer: version, state and the
/// whole history (`None`: unchanged or gone).
pub fn read_after(since: Since, held: &[String]) -> Option<(u64, Value, Vec<String>)> {
    match since {
        Since::Unchanged | Since::Changed(None) => None,
        Since::Changed(Some(r)) => Some((r.version, r.state, r.history)),
        Since::Appended {
            version,
            state,
            from,
            segments,
        } => {
            assert!(
                from >= 1 && from <= held.len(),
                "appended after {from} of {}",
                held.len()
            );
            let mut history = held[..from].to_vec();
            history.extend(segments);
            Some((version, state, history))
        }
    }
}

/// The versioned record: compare-and-swap, history segments kept when not
/// given, appended and cut as written, archives committed with the record.
pub fn versioned(store: &dyn SessionStore) {
    assert_eq!(store.version("v1").expect("version"), None);
    assert!(store.load_versioned("v1").expect("load").is_none());
    assert_eq!(
        store.load_versioned_since("v1", 0).expect("since"),
        Since::Unchanged
    );
    let first = vec!["h1".to_owned()];
    let v = store
        .commit_versioned(
            "v1",
            0,
            &[],
            &json!({"n": 1}),
            Some(HistoryWrite::replace(&first)),
        )
        .expect("first");
    assert_eq!(v, 1);
    let rec = store.load_versioned("v1").expect("load").expect("record");
    assert_eq!((rec.version, rec.state.clone()), (1, json!({"n": 1})));
    assert_eq!(rec.history, first);
    assert_eq!(store.version("v1").expect("version"), Some(1));
    assert_eq!(
        store.load_versioned_since("v1", 1).expect("since"),
        Since::Unchanged
    );
    assert_eq!(
        store.load_versioned_since("v1", 0).expect("since"),
        Since::Changed(Some(rec))
    );

    // A stale writer loses and writes nothing, archive and history
    // included.
    let mut batch = Batch::new();
    batch.archive(&Message::user("stale writer's archived message zebra"));
    let stale = vec!["stale".to_owned()];
    let err = store
        .commit_versioned(
            "v1",
            0,
            &[batch],
            &json!({"n": 99}),
            Some(HistoryWrite {
                keep: 1,
                append: &stale,
            }),
        )
        .expect_err("stale");
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    assert!(err.to_string().contains("v1"), "{err}");
    assert_eq!(store.version("v1").expect("version"), Some(1));
    assert!(
        store
            .search(Some("v1"), "zebra", 5)
            .expect("search")
            .is_empty()
    );

    // The current writer wins; history kept when not given; a batch's own
    // state snapshot is superseded by the record.
    let mut batch = Batch::new();
    batch.archive(&Message::user("current writer's archived message giraffe"));
    batch.set_state(json!({"plain": true}));
    let v = store
        .commit_versioned("v1", 1, &[batch], &json!({"n": 2}), None)
        .expect("second");
    assert_eq!(v, 2);
    let rec = store.load_versioned("v1").expect("load").expect("record");
    assert_eq!((rec.version, rec.state.clone()), (2, json!({"n": 2})));
    assert_eq!(store.version("v1").expect("version"), Some(2));
    assert_eq!(rec.history, first);
    assert_eq!(
        store
            .search(Some("v1"), "giraffe", 5)
            .expect("search")
            .len(),
        1
    );

    // Segments append, and a write that keeps fewer drops the rest.
    let more = vec!["h2".to_owned(), "h3".to_owned()];
    store
        .commit_versioned(
            "v1",
            2,
            &[],
            &json!({"n": 3}),
            Some(HistoryWrite {
                keep: 1,
                append: &more,
            }),
        )
        .expect("append");
    let rec = store.load_versioned("v1").expect("load").expect("record");
    assert_eq!(rec.history, ["h1", "h2", "h3"]);
    // A reader holding version 2's one segment reads what follows it (or
    // the whole record); one holding version 3 reads nothing.
    let held = ["h1".to_owned()];
    let after = store.load_versioned_after("v1", 2, 1).expect("after");
    assert_eq!(
        read_after(after, &held),
        Some((3, json!({"n": 3}), rec.history.clone()))
    );
    assert_eq!(
        store.load_versioned_after("v1", 3, 3).expect("after"),
        Since::Unchanged
    );
    let cut = vec!["h2'".to_owned()];
    store
        .commit_versioned(
            "v1",
            3,
            &[],
            &json!({"n": 4}),
            Some(HistoryWrite {
                keep: 1,
                append: &cut,
            }),
        )
        .expect("cut");
    let rec = store.load_versioned("v1").expect("load").expect("record");
    assert_eq!(
        (rec.version, rec.history.clone()),
        (4, vec!["h1".to_owned(), "h2'".to_owned()])
    );
    // Fewer segments stored than the reader holds: a store that answers
    // by what follows cannot here, and the whole record comes back.
    let held: Vec<String> = ["h1", "h2", "h3"].map(String::from).to_vec();
    assert_eq!(
        store.load_versioned_after("v1", 3, 3).expect("after"),
        Since::Changed(Some(rec.clone()))
    );
    assert_eq!(
        read_after(Since::Changed(Some(rec.clone())), &held),
        Some((4, json!({"n": 4}), rec.history.clone()))
    );
    let whole = vec!["all".to_owned()];
    store
        .commit_versioned(
            "v1",
            4,
            &[],
            &json!({"n": 5}),
            Some(HistoryWrite::replace(&whole)),
        )
        .expect("rewrite");
    let rec = store.load_versioned("v1").expect("load").expect("record");
    assert_eq!(rec.history, whole);

    store.delete_session("v1").expect("delete");
    assert_eq!(store.version("v1").expect("version"), None);
    assert!(store.load_versioned("v1").expect("load").is_none());
    // A new record under the same name starts with no history.
    store
        .commit_versioned("v1", 0, &[], &json!({"n": 1}), None)
        .expect("again");
    let rec = store.load_versioned("v1").expect("load").expect("record");
    assert!(rec.history.is_empty(), "{:?}", rec.history);
    store.delete_session("v1").expect("delete");
}

/// Two conversations under one session name: the records of the second
/// are numbered after the first's and kept beside them; a record numbered
/// like a stored one is a clash of records ([`StoreError::Duplicate`], never
/// a [`StoreError::Conflict`]: nobody else wrote, and writing it again
/// clashes again) that writes nothing, record or archive, through either
/// write path.
pub fn records_of_two_conversations(store: &dyn SessionStore) {
    let conversation = |topic: &str| -> (Vec<Message>, Vec<Message>, String) {
        let input = vec![
            Message::system("You are a coding agent."),
            Message::user(format!("fix the {topic} bug")),
            Message::assistant(format!(
                "looked at src/{topic}.rs: the {topic} loop is off by one"
            )),
            Message::user(format!("now test the {topic} fix")),
        ];
        let span = &input[1..3];
        let handle = span_handle(span);
        let summary = Message::user(format!(
            "[CONTEXT SUMMARY]\n{}\n[END]",
            archive_note(1, 3, &handle)
        ));
        let output = vec![input[0].clone(), summary, input[3].clone()];
        (input, output, handle)
    };
    let record = |topic: &str, seq: u64| -> (Batch, String) {
        let (input, output, handle) = conversation(topic);
        let mut batch = Batch::new();
        let info = CompactionInfo::new(seq, "preflight", "compressor");
        batch.compaction(&input, &output, &info).expect("archived");
        (batch, handle)
    };
    let (first, alpha) = record("alpha", 1);
    let v = store
        .commit_versioned("two", 0, &[first], &json!({"n": 1}), None)
        .expect("the first conversation's compaction");
    // The second conversation, its first compaction numbered 1 again: a
    // clash, and nothing of it is written.
    let (clash, _) = record("beta", 1);
    let err = store
        .commit_versioned(
            "two",
            v,
            std::slice::from_ref(&clash),
            &json!({"n": 2}),
            None,
        )
        .expect_err("compaction 1 is recorded");
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err}");
    assert!(err.to_string().contains("compaction 1"), "{err}");
    assert_eq!(store.version("two").expect("version"), Some(v));
    assert!(
        store
            .search(Some("two"), "beta", 5)
            .expect("search")
            .is_empty()
    );
    let err = store
        .commit("two", &clash)
        .expect_err("the plain commit too");
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err}");
    assert!(
        store
            .search(Some("two"), "beta", 5)
            .expect("search")
            .is_empty()
    );
    // Numbered after the stored ones, it is kept beside them.
    let (second, beta) = record("beta", 2);
    store
        .commit_versioned("two", v, &[second], &json!({"n": 2}), None)
        .expect("the second conversation's compaction");
    let records = store.compactions("two").expect("records");
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [1, 2]);
    assert_eq!(records[0].handle, alpha);
    assert_eq!(records[1].handle, beta);
    for (handle, topic) in [(&alpha, "alpha"), (&beta, "beta")] {
        let entry = store
            .resolve(Some("two"), handle)
            .expect("resolve")
            .expect("archived");
        assert!(entry.messages[0].text().contains(topic));
    }
    store.delete_session("two").expect("delete");
}

/// Claims: one owner at a time, renewable, released, expiring.
pub fn claims(store: &dyn SessionStore) {
    let long = Duration::from_secs(60);
    assert!(store.try_claim("c", "summary", "a", long).expect("claim"));
    assert!(!store.try_claim("c", "summary", "b", long).expect("held"));
    assert!(store.try_claim("c", "summary", "a", long).expect("renew"));
    assert!(
        store
            .try_claim("c", "other-job", "b", long)
            .expect("another job")
    );
    assert!(
        store
            .try_claim("d", "summary", "b", long)
            .expect("another session")
    );
    store.release("c", "summary", "b").expect("not b's: no-op");
    assert!(
        !store
            .try_claim("c", "summary", "b", long)
            .expect("still a's")
    );
    store.release("c", "summary", "a").expect("release");
    assert!(store.try_claim("c", "summary", "b", long).expect("free"));
    // A dead owner's claim expires.
    assert!(
        store
            .try_claim("e", "summary", "dead", Duration::from_millis(50))
            .expect("short")
    );
    assert!(
        !store
            .try_claim("e", "summary", "live", long)
            .expect("not yet")
    );
    // Polled: a failed claim changes nothing.
    let taken = crate::eventually_blocking(Duration::from_secs(10), || {
        store
            .try_claim("e", "summary", "live", long)
            .expect("expired")
            .then_some(())
    });
    assert!(taken.is_some(), "the dead owner's claim expired");
}

/// A pytest run whose long output holds one failing assertion among
/// hundreds of `PASSED` lines (the `ctx search` issue's example).
pub fn pytest_output() -> String {
    let mut out = String::from("============ test session starts ============\n");
    for i in 0..300 {
        out.push_str(&format!(
            "tests/test_main.py::test_case_{i} PASSED in 0.01s [{:>3}%]\n",
            i / 3
        ));
    }
    out.push_str("E   AssertionError: expected 38 got 136 in test_11_6\n");
    for i in 0..40 {
        out.push_str(&format!("tests/test_io.py::test_read_{i} PASSED\n"));
    }
    out.push_str("1 failed, 340 passed in 3.20s\n[exit 1]");
    out
}

/// Archives a session `q` whose search the backends must answer alike: the
/// long pytest output, a short failure, messages naming the test.
pub fn search_archive(store: &dyn SessionStore) {
    let span = vec![
        Message::user("make test_11_6 pass; the count is off"),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "p1",
                "bash",
                r#"{"command": "pytest -q tests/"}"#,
            )],
        ),
        Message::tool_result("p1", pytest_output()),
        Message::assistant("test_11_6 expected 38: the counter double counts\nin src/count.py"),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "p2",
                "bash",
                r#"{"command": "python -c 'import count'"}"#,
            )],
        ),
        Message::tool_result(
            "p2",
            "Traceback (most recent call last):\n  File \"src/count.py\", line 3\nKeyError: 'total'\n[exit 1]",
        ),
    ];
    let mut batch = Batch::new();
    batch.archive_span(&span, 1, 7);
    store.commit("q", &batch).expect("commit");
}

/// The queries of [`search_archive`] and each backend's answer, as JSON
/// text: the hits of each query sorted by handle (their order is each
/// backend's rank), byte for byte what the backend returned.
pub fn search_answers(store: &dyn SessionStore) -> String {
    let queries = [
        "expected 38 got 136 in test_11_6",
        "PASSED",
        "test_11_6",
        "KeyError count.py",
        "keyerror TRACEBACK",
        "src/count.py double",
        "nothing-like-this",
    ];
    let answers: Vec<Value> = queries
        .iter()
        .map(|q| {
            let mut hits = store.search(Some("q"), q, 10).expect("search");
            hits.sort_by(|a, b| a.handle.cmp(&b.handle));
            json!({ "query": q, "hits": hits })
        })
        .collect();
    serde_json::to_string_pretty(&answers).expect("json")
}

/// The issue's example on any backend: the hit shows the failing line.
pub fn search_shows_the_matching_line(store: &dyn SessionStore) {
    search_archive(store);
    let hits = store
        .search(Some("q"), "expected 38 got 136 in test_11_6", 5)
        .expect("search");
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].handle, "p1");
    let line = &hits[0].lines[0];
    assert_eq!(
        (line.line, line.text.as_str()),
        (302, "E   AssertionError: expected 38 got 136 in test_11_6")
    );
    assert_eq!(hits[0].terms, 6);
    assert!(
        hits[0].lines.iter().all(|l| !l.text.contains("PASSED")),
        "no PASSED line holds a word of the query: {:?}",
        hits[0].lines
    );
}
