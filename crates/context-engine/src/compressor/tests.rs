use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use std::borrow::Cow;

use serde_json::json;

use crate::engine::CompactionStatusContext;
use crate::engine::{
    BlockReason, CompressRequest, ContextEngine, EngineError, ModelInfo, SelectRequest,
    ToolCallContext, Usage,
};
use crate::message::{Content, Message};
use crate::message::{Role, ToolCall};
use crate::recall::RECALL_TOOL;
use crate::schedule::ScheduleOptions;
use crate::summarize::{SummarizeError, Summarizer, SummaryRequest};
use crate::tokens::TokenCounter;
use crate::tokens::{CountOptions, EstimateCounter};
use crate::validate::Profile;
use crate::validate::validate;

const SECRET: &str = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";

fn counter() -> Arc<dyn TokenCounter> {
    Arc::new(EstimateCounter::new(CountOptions::default()))
}

/// System, task, then `turns` tool-calling turns with ~250-token results,
/// then a final answer and a new user ask.
fn session(turns: usize) -> Vec<Message> {
    let mut m = vec![
        Message::system("You are a coding agent."),
        Message::user("Fix the bug in src/lib.rs; do not change the public API."),
    ];
    for i in 0..turns {
        let id = format!("c{i}");
        m.push(Message::assistant_tool_calls(
            format!("Step {i}: reading."),
            vec![ToolCall::function(
                id.clone(),
                "bash",
                format!(r#"{{"command": "cat src/file{i}.rs"}}"#),
            )],
        ));
        m.push(Message::tool_result(id, format!("line {i}\n").repeat(120)));
    }
    m.push(Message::assistant("I found the bug in parse()."));
    m.push(Message::user("Great, now also add a test."));
    m
}

/// A summarizer whose replies are scripted; records what it was asked.
struct Stub {
    replies: Mutex<Vec<Result<String, SummarizeError>>>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Stub {
    fn new(replies: Vec<Result<String, SummarizeError>>) -> (Box<Stub>, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut replies = replies;
        replies.reverse();
        (
            Box::new(Stub {
                replies: Mutex::new(replies),
                seen: seen.clone(),
            }),
            seen,
        )
    }
}

impl Summarizer for Stub {
    fn name(&self) -> &str {
        "stub"
    }
    fn summarize(&self, request: &SummaryRequest<'_>) -> Result<String, SummarizeError> {
        let mut all = String::new();
        for t in request.turns {
            all.push_str(&serde_json::to_string(t).unwrap());
        }
        all.push_str(request.previous_summary.unwrap_or(""));
        all.push_str(request.focus_topic.unwrap_or(""));
        all.push_str(request.memory_context.unwrap_or(""));
        self.seen.lock().unwrap().push(all);
        self.replies
            .lock()
            .unwrap()
            .pop()
            .unwrap_or_else(|| Ok("model summary".into()))
    }
}

fn engine_with(replies: Vec<Result<String, SummarizeError>>) -> (Compressor, ManualClock) {
    let clock = ManualClock::new();
    let (stub, _) = Stub::new(replies);
    let engine = Compressor::new(counter(), 20_000)
        .with_summarizer(stub)
        .with_clock(Arc::new(clock.clone()));
    (engine, clock)
}

fn server_error() -> SummarizeError {
    SummarizeError::Server {
        status: 500,
        message: "boom".into(),
    }
}

fn summaries(messages: &[Message]) -> usize {
    messages.iter().filter(|m| is_summary(m)).count()
}

#[test]
fn threshold_subtracts_the_reserve_and_stays_below_small_windows() {
    assert_eq!(compaction_threshold(100_000, 0.75, None), 75_000);
    assert_eq!(compaction_threshold(100_000, 0.75, Some(20_000)), 60_000);
    assert_eq!(compaction_threshold(1_000, 1.0, None), 850);
    assert_eq!(compaction_threshold(1_000, 0.75, Some(2_000)), 850);
    assert_eq!(compaction_threshold(0, 0.75, None), 0);
    let engine = Compressor::with_options(
        counter(),
        100_000,
        CompressorOptions::default().with_max_tokens(20_000),
    );
    assert_eq!(engine.state().threshold_tokens, 60_000);
}

#[test]
fn compacts_keeping_system_head_tail_and_latest_user_message() {
    let history = session(40);
    let mut engine = Compressor::new(counter(), 20_000);
    let out = engine
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    assert!(validate(&out, Profile::OpenAi).is_empty());
    assert!(counter().count_messages(&out) < counter().count_messages(&history));
    // System prompt kept byte for byte (the provider's cached prefix): the
    // summary's own prefix tells the model what it is.
    assert_eq!(out[0], history[0]);
    // With the schedule off, the one-time note goes into the system prompt.
    let options = CompressorOptions::default().with_schedule(ScheduleOptions::every_call());
    let noted = Compressor::with_options(counter(), 20_000, options)
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    assert!(noted[0].text().starts_with("You are a coding agent."));
    assert!(noted[0].text().ends_with(SYSTEM_NOTE));
    // Head: the task and the first call group (protect_first_n = 3).
    assert_eq!(out[1], history[1]);
    assert_eq!(out[2], history[2]);
    assert_eq!(out[3], history[3]);
    assert_eq!(summaries(&out), 1);
    assert_eq!(out.last(), history.last());
    assert!(out.contains(&history[history.len() - 2]));
    let report = engine.last_report().unwrap();
    assert_eq!(report.outcome, Outcome::Compacted);
    assert_eq!(report.summarizer.as_deref(), Some("extractive"));
    assert_eq!(report.head, Some(Span { start: 0, end: 4 }));
    assert_eq!(engine.state().compression_count, 1);
    // Status shows 0 while awaiting real usage, never a stale count.
    let status = engine.status();
    assert!(status.awaiting_real_usage);
    assert_eq!(status.last_prompt_tokens, 0);
    // The summary names what happened in the middle.
    let summary = out.iter().find(|m| is_summary(m)).unwrap().text();
    assert!(summary.contains("## Completed actions"));
    assert!(summary.contains("cat src/file20.rs"));
    assert!(summary.contains(SUMMARY_END));
}

#[test]
fn too_short_is_unchanged_and_says_why() {
    let history = session(1);
    let mut engine = Compressor::new(counter(), 20_000);
    assert!(!engine.has_content_to_compress(&history));
    let err = engine
        .compress(&history, &CompressRequest::new())
        .unwrap_err();
    assert!(
        matches!(err, EngineError::NothingToCompress { .. }),
        "{err}"
    );
    let report = engine.last_report().unwrap();
    assert_eq!(report.outcome, Outcome::NothingToCompress);
    assert!(
        report
            .reason
            .as_deref()
            .unwrap()
            .contains("nothing between")
    );
    assert_eq!(engine.state().compression_count, 0);
}

#[test]
fn second_compaction_updates_the_previous_summary_and_decays_the_head() {
    // With the schedule off: the one-time note is in the system prompt.
    let options = CompressorOptions::default().with_schedule(ScheduleOptions::every_call());
    let mut engine = Compressor::with_options(counter(), 20_000, options);
    let first = engine
        .compress(&session(40), &CompressRequest::new())
        .unwrap()
        .messages;
    let mut grown = first.clone();
    grown.extend(session(40).into_iter().skip(2));
    let (stub, seen) = Stub::new(vec![Ok("updated summary".into())]);
    let mut engine = engine.with_summarizer(stub);
    let second = engine
        .compress(&grown, &CompressRequest::new())
        .unwrap()
        .messages;
    let report = engine.last_report().unwrap();
    assert!(report.iterative);
    // Only the system prompt is protected now (plus the pinned ask).
    assert_eq!(report.head, Some(Span { start: 0, end: 1 }));
    assert_eq!(summaries(&second), 1);
    assert!(second.iter().any(|m| m.text().contains("updated summary")));
    // The previous summary was passed as such, not as a turn.
    let asked = seen.lock().unwrap()[0].clone();
    assert!(asked.contains("## Completed actions"));
    assert!(!asked.contains(SUMMARY_PREFIX));
    assert_eq!(second[0].text().matches(SYSTEM_NOTE).count(), 1);
    assert!(validate(&second, Profile::OpenAi).is_empty());
}

#[test]
fn previous_summary_is_recovered_from_the_transcript_after_a_restart() {
    let mut engine = Compressor::new(counter(), 20_000);
    let mut history = engine
        .compress(&session(40), &CompressRequest::new())
        .unwrap()
        .messages;
    history.extend(session(40).into_iter().skip(2));
    // A fresh engine (restart): compression_count is 0.
    let (stub, seen) = Stub::new(vec![]);
    let mut fresh = Compressor::new(counter(), 20_000).with_summarizer(stub);
    let out = fresh
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    assert!(fresh.last_report().unwrap().iterative);
    assert_eq!(summaries(&out), 1);
    assert!(seen.lock().unwrap()[0].contains("Extractive summary of"));
}

#[test]
fn strict_profile_output_validates() {
    let mut history = vec![Message::system("sys"), Message::user("first ask")];
    for i in 0..30 {
        history.push(Message::assistant(format!(
            "answer {i} {}",
            "x ".repeat(300)
        )));
        history.push(Message::user(format!("ask {i} {}", "y ".repeat(300))));
    }
    history.push(Message::assistant("final"));
    assert!(validate(&history, Profile::Strict).is_empty());
    let mut engine = Compressor::with_options(
        counter(),
        20_000,
        CompressorOptions::default().with_profile(Profile::Strict),
    );
    let out = engine
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    assert!(
        validate(&out, Profile::Strict).is_empty(),
        "{:?}",
        validate(&out, Profile::Strict)
    );
    assert_eq!(summaries(&out), 1);
}

#[test]
fn summary_role_is_user_right_after_the_system_prompt() {
    let mut history = vec![Message::system("sys")];
    for i in 0..30 {
        history.push(Message::user(format!("ask {i} {}", "y ".repeat(300))));
        history.push(Message::assistant(format!(
            "answer {i} {}",
            "x ".repeat(300)
        )));
    }
    let mut engine = Compressor::with_options(
        counter(),
        20_000,
        CompressorOptions::default()
            .with_profile(Profile::Strict)
            .with_protect_first_n(0),
    );
    let out = engine
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    assert!(validate(&out, Profile::Strict).is_empty());
    let placement = engine.last_report().unwrap().placement.unwrap();
    // Right after the system prompt the summary is the user's turn (or is
    // merged into the first kept message when that is a user message).
    match placement {
        Placement::User => assert!(is_summary(&out[1]) && out[1].role == Role::User),
        Placement::Merged => assert!(is_summary(&out[1])),
        Placement::Assistant => panic!("assistant right after the system prompt"),
    }
}

#[test]
fn abort_leaves_the_transcript_unchanged_and_starts_a_cooldown() {
    let (mut engine, clock) = engine_with(vec![Err(SummarizeError::Auth {
        status: 401,
        message: "bad key".into(),
    })]);
    let history = session(40);
    let err = engine
        .compress(&history, &CompressRequest::new())
        .unwrap_err();
    assert!(matches!(err, EngineError::Summarizer { .. }), "{err}");
    let report = engine.last_report().unwrap();
    assert_eq!(report.outcome, Outcome::Aborted);
    assert!(report.reason.as_deref().unwrap().contains("401"));
    assert_eq!(report.cooldown_seconds, Some(60));
    assert_eq!(engine.state().compression_count, 0);
    assert_eq!(
        engine.should_compress_info(Some(1_000_000)).block_reason,
        Some(BlockReason::Cooldown { seconds_left: 60 })
    );
    assert!(!engine.should_compress(Some(1_000_000)));
    clock.advance(Duration::from_secs(59));
    assert_eq!(engine.cooldown_seconds_left(), Some(1));
    // Unforced compaction is blocked; force bypasses the cooldown.
    let blocked = engine.compress(&history, &CompressRequest::new());
    assert!(matches!(blocked, Err(EngineError::Blocked { .. })));
    let forced = engine
        .compress(&history, &CompressRequest::new().with_force(true))
        .unwrap()
        .messages;
    assert!(forced.iter().any(|m| m.text().contains("model summary")));
    // Success clears the cooldown.
    assert_eq!(engine.cooldown_seconds_left(), None);
    assert!(engine.should_compress(Some(1_000_000)));
}

#[test]
fn network_failure_aborts() {
    let (mut engine, _) = engine_with(vec![Err(SummarizeError::Network("refused".into()))]);
    let err = engine.compress(&session(40), &CompressRequest::new());
    assert!(matches!(err, Err(EngineError::Summarizer { .. })));
    assert_eq!(engine.last_report().unwrap().outcome, Outcome::Aborted);
}

#[test]
fn fallbacks_insert_the_extractive_summary_with_escalating_cooldowns() {
    let (mut engine, clock) = engine_with(vec![
        Err(server_error()),
        Err(SummarizeError::Timeout(Duration::from_secs(30))),
        Err(SummarizeError::RateLimited { retry_after: None }),
    ]);
    let history = session(40);
    let out = engine
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    let report = engine.last_report().unwrap().clone();
    assert_eq!(report.outcome, Outcome::Fallback);
    assert_eq!(report.summarizer.as_deref(), Some("extractive"));
    assert!(report.reason.unwrap().contains("HTTP 500"));
    assert_eq!(report.cooldown_seconds, Some(60));
    assert!(
        out.iter()
            .any(|m| m.text().contains("## Completed actions"))
    );
    assert!(validate(&out, Profile::OpenAi).is_empty());

    clock.advance(Duration::from_secs(60));
    engine.compress(&history, &CompressRequest::new()).unwrap();
    assert_eq!(engine.last_report().unwrap().cooldown_seconds, Some(300));
    // Two fallbacks in a row: anti-thrash, even after the cooldown.
    clock.advance(Duration::from_secs(300));
    assert_eq!(
        engine.block_reason(),
        Some(BlockReason::Ineffective {
            attempts: 2,
            last_savings_percent: 0.0
        })
    );
    engine
        .compress(&history, &CompressRequest::new().with_force(true))
        .unwrap();
    assert_eq!(engine.last_report().unwrap().cooldown_seconds, Some(900));
}

#[test]
fn cooldown_lengths_by_failure_kind() {
    for (error, seconds) in [
        (SummarizeError::Malformed("no choices".into()), 30),
        (SummarizeError::Empty, 30),
        (SummarizeError::NotConfigured("no base url".into()), 600),
    ] {
        let (mut engine, _) = engine_with(vec![Err(error)]);
        engine
            .compress(&session(40), &CompressRequest::new())
            .unwrap();
        let report = engine.last_report().unwrap();
        assert_eq!(report.outcome, Outcome::Fallback);
        assert_eq!(report.cooldown_seconds, Some(seconds));
    }
    // A whitespace reply is a failure too.
    let (mut engine, _) = engine_with(vec![Ok("  \n ".into())]);
    engine
        .compress(&session(40), &CompressRequest::new())
        .unwrap();
    assert_eq!(engine.last_report().unwrap().outcome, Outcome::Fallback);
    assert_eq!(engine.last_report().unwrap().cooldown_seconds, Some(30));
}

#[test]
fn ineffective_is_decided_only_by_real_usage_after_a_compaction() {
    let mut engine = Compressor::new(counter(), 20_000);
    let threshold = engine.state().threshold_tokens;
    let history = session(40);
    engine.compress(&history, &CompressRequest::new()).unwrap();
    // Rough estimates say nothing about effectiveness.
    assert!(engine.should_compress(Some(threshold + 1)));
    engine.update_from_response(&Usage::new(threshold + 10, 5));
    assert_eq!(engine.block_reason(), None);
    // A later usage (not the first after a compaction) does not count.
    engine.update_from_response(&Usage::new(threshold + 10, 5));
    assert_eq!(engine.block_reason(), None);
    engine.compress(&history, &CompressRequest::new()).unwrap();
    engine.update_from_response(&Usage::new(threshold + 10, 5));
    let Some(BlockReason::Ineffective { attempts, .. }) = engine.block_reason() else {
        panic!("expected ineffective, got {:?}", engine.block_reason());
    };
    assert_eq!(attempts, 2);
    assert!(!engine.should_compress(Some(threshold + 10)));
    assert!(
        engine
            .should_compress_info(Some(threshold + 10))
            .block_reason
            .is_some()
    );
    // Force bypasses; an effective compaction clears the streak.
    engine
        .compress(&history, &CompressRequest::new().with_force(true))
        .unwrap();
    engine.update_from_response(&Usage::new(threshold / 2, 5));
    assert_eq!(engine.block_reason(), None);
    // Session reset clears everything.
    engine.on_session_reset();
    assert_eq!(engine.state().compression_count, 0);
}

#[test]
fn preflight_defers_to_recent_real_usage() {
    let mut engine = Compressor::new(counter(), 20_000);
    let threshold = engine.state().threshold_tokens; // 15k
    // No real usage yet: nothing to defer to.
    assert!(!engine.should_defer_preflight_to_real_usage(threshold + 1));
    engine.update_from_response(&Usage::new(10_000, 10));
    let slack = preflight_slack(threshold);
    assert_eq!(slack, 1500, "10% of a 15k threshold, under the 4096 floor");
    assert_eq!(preflight_slack(96_000), 4800);
    assert_eq!(preflight_slack(60_000), 4096);
    assert!(engine.should_defer_preflight_to_real_usage(10_000 + slack));
    assert!(!engine.should_defer_preflight_to_real_usage(10_000 + slack + 1));
    // Last real count over the threshold: do not defer.
    engine.update_from_response(&Usage::new(threshold, 10));
    assert!(!engine.should_defer_preflight_to_real_usage(threshold));
    // Awaiting real usage after a compaction: defer.
    engine
        .compress(&session(40), &CompressRequest::new())
        .unwrap();
    assert!(engine.should_defer_preflight_to_real_usage(u64::MAX));
    assert_eq!(engine.status().usage_percent, 0.0);
}

#[test]
fn everything_crossing_to_the_summarizer_is_redacted() {
    let mut history = session(40);
    history[10] = Message::tool_result("c4", format!("export GITHUB_TOKEN={SECRET}\n"));
    let (stub, seen) = Stub::new(vec![Ok(format!("the token is {SECRET}"))]);
    let mut engine = Compressor::new(counter(), 20_000).with_summarizer(stub);
    let request = CompressRequest::new()
        .with_focus_topic(format!("token {SECRET}"))
        .with_memory_context(format!("remember GITHUB_TOKEN={SECRET}"));
    let out = engine.compress(&history, &request).unwrap().messages;
    let asked = seen.lock().unwrap()[0].clone();
    assert!(!asked.contains(SECRET), "secret reached the summarizer");
    assert!(asked.contains("remember"));
    let summary = out
        .iter()
        .find(|m| is_summary(m))
        .unwrap()
        .text()
        .into_owned();
    assert!(!summary.contains(SECRET), "secret came back in the summary");
}

#[test]
fn the_users_redaction_patterns_apply_to_what_leaves() {
    const INTERNAL: &str = "ACME-7731-ZZQX-0042";
    let mut history = session(40);
    history[10] = Message::tool_result("c4", format!("ticket key {INTERNAL}\n"));
    let redactor = crate::redact::Redactor::builder()
        .pattern(r"ACME-\d{4}-[A-Z]{4}-\d{4}")
        .build()
        .unwrap();
    // Without the pattern the built-in rules do not know this key.
    let (stub, seen) = Stub::new(vec![Ok("summary".into())]);
    let mut engine = Compressor::new(counter(), 20_000).with_summarizer(stub);
    engine.compress(&history, &CompressRequest::new()).unwrap();
    assert!(seen.lock().unwrap()[0].contains(INTERNAL));
    // With it, the key never reaches the summarizer.
    let (stub, seen) = Stub::new(vec![Ok(format!("saw {INTERNAL}"))]);
    let mut engine = Compressor::new(counter(), 20_000)
        .with_summarizer(stub)
        .with_redactor(Arc::new(redactor));
    let out = engine
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    assert!(!seen.lock().unwrap()[0].contains(INTERNAL));
    let summary = out
        .iter()
        .find(|m| is_summary(m))
        .unwrap()
        .text()
        .into_owned();
    assert!(!summary.contains(INTERNAL), "{summary}");
}

#[test]
fn summarizer_input_is_digested() {
    let mut history = session(40);
    history[10] = Message::tool_result("c4", "big output\n".repeat(1000));
    let (stub, seen) = Stub::new(vec![]);
    let mut engine = Compressor::new(counter(), 20_000).with_summarizer(stub);
    engine.compress(&history, &CompressRequest::new()).unwrap();
    let asked = seen.lock().unwrap()[0].clone();
    assert!(asked.contains("[digested]"));
    assert!(asked.matches("big output").count() < 5);
}

#[test]
fn no_internal_markers_on_the_wire() {
    let mut engine = Compressor::new(counter(), 20_000);
    let out = engine
        .compress(&session(40), &CompressRequest::new())
        .unwrap()
        .messages;
    for m in &out {
        assert!(m.extra.keys().all(|k| !k.starts_with('_')));
    }
}

#[test]
fn select_context_returns_the_digest_only_when_it_changes_something() {
    let mut engine = Compressor::new(counter(), 20_000);
    let small = session(3);
    assert_eq!(
        engine.select_context(&SelectRequest::new(&small, &small)),
        None
    );
    let mut big = session(3);
    big[3] = Message::tool_result("c0", "x\n".repeat(5000));
    let view = engine
        .select_context(&SelectRequest::new(&big, &big))
        .unwrap();
    assert!(view[3].text().starts_with("[digested]"));
}

#[test]
fn the_schedule_keeps_wall_clock_times_that_another_process_can_read() {
    // Without a host time, the last request's time is the wall clock's
    // (seconds since the Unix epoch), not this process's uptime: a session
    // persisted here and resumed elsewhere compares like with like.
    let mut engine = Compressor::new(counter(), 20_000);
    let history = session(3);
    let _ = engine.select_context(&SelectRequest::new(&history, &history));
    let snapshot = engine.snapshot();
    let at = snapshot["compressor"]["schedule"]["last_request_unix"]
        .as_f64()
        .unwrap();
    let wall = crate::schedule::now().unwrap();
    assert!((wall - at).abs() < 60.0, "{at} against {wall}");
    // A host time (a replay's) wins, and is what a resumed copy reads.
    engine.set_call_time(Some(1_750_000_000.0));
    let _ = engine.select_context(&SelectRequest::new(&history, &history));
    let mut resumed = Compressor::new(counter(), 20_000);
    resumed.restore(&engine.snapshot()).unwrap();
    assert_eq!(
        resumed.schedule_state().last_request_at,
        Some(1_750_000_000.0)
    );
}

#[test]
fn offers_context_recall() {
    let mut engine = Compressor::new(counter(), 20_000);
    let schemas = engine.tool_schemas();
    assert_eq!(schemas[0]["function"]["name"], RECALL_TOOL);
    let history = session(2);
    let ctx = ToolCallContext::default().with_messages(&history);
    let answer =
        engine.handle_tool_call(RECALL_TOOL, &json!({"handle": "c1", "end_line": 1}), &ctx);
    assert!(answer.contains("line 1\\n"), "{answer}");
    let none = engine.handle_tool_call(
        RECALL_TOOL,
        &json!({"handle": "c1"}),
        &ToolCallContext::default(),
    );
    assert!(none.contains("error"));
    assert!(
        engine
            .handle_tool_call("nope", &json!({}), &ctx)
            .contains("Unknown context engine tool")
    );
    let _ = CompactionStatusContext::default();
}

#[test]
fn update_model_keeps_the_reply_reserve() {
    let mut engine = Compressor::with_options(
        counter(),
        100_000,
        CompressorOptions::default().with_max_tokens(10_000),
    );
    engine.update_model(&ModelInfo::new("gpt-4o", 200_000));
    assert_eq!(engine.state().threshold_tokens, 142_500);
}

#[test]
fn tail_keeps_a_floor_of_messages_and_starts_at_a_safe_cut() {
    // Every tool result is far over the tail budget on its own.
    let mut history = session(30);
    for m in history.iter_mut().filter(|m| m.is_tool_result()) {
        m.content = Content::Text("z ".repeat(20_000));
    }
    let engine = Compressor::new(counter(), 20_000);
    let plan = engine.plan(&history).unwrap();
    let n = history.len();
    assert!(n - plan.tail_start >= 3, "{plan:?}");
    assert!(!history[plan.tail_start].is_tool_result());
    assert!(
        crate::validate::CutPoints::new(&history, crate::validate::auto_text_actions())
            .is_safe(plan.tail_start)
    );
    // The latest assistant text and user ask are in the tail.
    assert!(plan.tail_start <= n - 2);
}

#[test]
fn protections_come_from_the_state() {
    let mut engine = Compressor::new(counter(), 20_000);
    engine.state_mut().protect_first_n = 0;
    let plan = engine.plan(&session(40)).unwrap();
    // Only the system prompt; the first task is summarized (the latest ask
    // is in the tail, so nothing is pinned).
    assert_eq!(plan.head_end, 1);
    assert_eq!(plan.pinned, None);
    assert_eq!(plan.middle().next(), Some(1));
}

#[test]
fn report_says_whether_the_result_fits() {
    let mut engine = Compressor::new(counter(), 20_000);
    engine
        .compress(&session(40), &CompressRequest::new())
        .unwrap();
    let report = engine.last_report().unwrap();
    assert!(report.within_budget);
    assert!(report.tokens_after <= report.threshold_tokens);
}

#[test]
fn proactive_prune_is_off_by_default_and_prunes_when_configured() {
    // Every turn reads the same file: older reads are superseded.
    let mut messages = vec![Message::system("s"), Message::user("Fix src/lib.rs.")];
    for i in 0..12 {
        let id = format!("r{i}");
        messages.push(Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                id.clone(),
                "bash",
                r#"{"command": "cat src/lib.rs"}"#,
            )],
        ));
        messages.push(Message::tool_result(
            id,
            format!("fn v{i}() {{}}\n").repeat(400),
        ));
    }
    messages.push(Message::assistant("Done."));

    let mut off = Compressor::new(counter(), 200_000);
    let (out, pruned) = off.prune_tool_results_only(&messages, None);
    assert_eq!(pruned, 0);
    assert!(matches!(out, Cow::Borrowed(_)));

    let mut options = CompressorOptions::default();
    options.prune.proactive_prune_tokens = 1;
    options.prune.min_reclaim_tokens = 1;
    let mut on = Compressor::with_options(counter(), 200_000, options);
    let (out, pruned) = on.prune_tool_results_only(&messages, None);
    assert!(pruned >= 5, "pruned {pruned}");
    assert!(validate(&out, Profile::OpenAi).is_empty());
    assert!(on.counter.count_messages(&out) < on.counter.count_messages(&messages));
    // Only contents change: as many messages, same roles and ids, and
    // exactly the reported number of messages differ.
    assert_eq!(out.len(), messages.len());
    for (a, b) in messages.iter().zip(out.iter()) {
        assert_eq!((&a.role, &a.tool_call_id), (&b.role, &b.tool_call_id));
    }
    let changed = messages.iter().zip(out.iter()).filter(|(a, b)| a != b);
    assert_eq!(changed.count(), pruned);
}

#[test]
fn a_summary_merged_into_a_tool_call_turn_keeps_the_calls_for_the_next_summary() {
    // The previous compaction merged its summary into an assistant turn
    // that calls a tool (the double-collision placement): the next
    // compaction must summarise that call, not drop the turn with the
    // summary text.
    let mut history = vec![
        Message::system("You are a coding agent."),
        Message::user("Fix the bug in src/lib.rs; do not change the public API."),
        Message::assistant_tool_calls(
            wrap_summary("Earlier: read the parser."),
            vec![ToolCall::function(
                "n3",
                "bash",
                r#"{"command": "cat notes_3.txt"}"#,
            )],
        ),
        Message::tool_result("n3", "note three\n".repeat(50)),
    ];
    history.extend(session(40).into_iter().skip(2));
    let (stub, seen) = Stub::new(vec![Ok("updated summary".into())]);
    let mut engine = Compressor::new(counter(), 20_000).with_summarizer(stub);
    let out = engine
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    assert!(engine.last_report().unwrap().iterative);
    let asked = seen.lock().unwrap()[0].clone();
    assert!(
        asked.contains("notes_3.txt"),
        "the call was dropped: {asked}"
    );
    assert!(validate(&out, Profile::OpenAi).is_empty());
}
