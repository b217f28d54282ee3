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

/// A SWE-agent-like text-action session: an ask, then `turns` actions
/// (an assistant text with a fenced command, its observation as a user
/// message).
fn text_action_session(turns: usize, tag: &str) -> Vec<Message> {
    let mut m = vec![
        Message::system("You are an autonomous programmer."),
        Message::user("Fix the crash in pkg/core.py; keep the public API."),
    ];
    for i in 0..turns {
        m.push(Message::assistant(format!(
            "Looking at step {i}.\n\n```\ncat pkg/{tag}_{i}.py\n```"
        )));
        m.push(Message::user(format!(
            "{}\n(Open file: pkg/{tag}_{i}.py)\nbash-$",
            format!("{tag} line {i}\n").repeat(60)
        )));
    }
    m
}

/// The ledger lines (`- …`) of the last summary's state record in
/// `messages`.
fn ledger_of(messages: &[Message]) -> String {
    let (_, body) = find_summary(messages).expect("a summary");
    let at = body
        .find(crate::summarize::state::STATE_RECORD_HEADING)
        .expect("a state record");
    body[at..].to_owned()
}

#[test]
fn a_summary_is_carried_forward_wherever_it_was_merged() {
    let actions = crate::validate::TextActions::auto();
    let options = CompressorOptions::default().with_text_actions(actions.clone());
    let mut engine = Compressor::with_options(counter(), 8_000, options);
    let first = engine
        .compress(&text_action_session(12, "first"), &CompressRequest::new())
        .unwrap()
        .messages;
    let record = ledger_of(&first);
    assert!(record.contains("cat pkg/first_1.py"), "{record}");
    // Move the summary into other messages, as a strict template or a
    // client would: merged into an assistant turn and into an observation.
    let body = find_summary(&first).unwrap().1;
    for holder in [Role::Assistant, Role::User] {
        let mut history: Vec<Message> = first
            .iter()
            .filter_map(|m| match is_summary(m) {
                false => Some(m.clone()),
                true => {
                    let own = without_summary(&m.text());
                    let mut m = m.clone();
                    m.content = Content::Text(own.clone());
                    (!own.is_empty()).then_some(m)
                }
            })
            .collect();
        let mut more = text_action_session(12, "second");
        more.drain(..2);
        let at = more
            .iter()
            .position(|m| m.role == holder)
            .expect("a holder");
        more[at] = insert::prepend_text(&more[at], &wrap_summary(&body));
        history.extend(more);
        // A model is handed it as the previous summary, never as a turn.
        let (stub, seen) = Stub::new(vec![]);
        let options = CompressorOptions::default().with_text_actions(actions.clone());
        let mut model =
            Compressor::with_options(counter(), 8_000, options.clone()).with_summarizer(stub);
        model.compress(&history, &CompressRequest::new()).unwrap();
        let asked = seen.lock().unwrap().concat();
        assert_eq!(
            asked.matches(SUMMARY_PREFIX).count(),
            0,
            "{holder}: {asked}"
        );
        assert!(asked.contains("cat pkg/first_1.py"), "{holder}");
        let mut again = Compressor::with_options(counter(), 8_000, options);
        let out = again
            .compress(&history, &CompressRequest::new())
            .unwrap()
            .messages;
        assert!(again.last_report().unwrap().iterative, "{holder}");
        assert_eq!(summaries(&out), 1, "{holder}");
        // The earlier record is in the new one, entry by entry (what
        // the first kept verbatim is still verbatim).
        let ledger = ledger_of(&out);
        let all: String = out.iter().map(|m| m.text().into_owned()).collect();
        for k in 0..12 {
            let cmd = format!("cat pkg/first_{k}.py");
            assert!(all.contains(&cmd), "{holder}: {cmd}: {ledger}");
            assert!(
                !record.contains(&cmd) || ledger.contains(&cmd),
                "{holder}: {cmd}"
            );
        }
        assert!(ledger.contains("cat pkg/second_0.py"), "{holder}: {ledger}");
        // The old summary's text is not quoted as the agent's own words.
        let body = find_summary(&out).unwrap().1;
        assert!(
            !body.contains(SUMMARY_PREFIX) && !body.contains(SUMMARY_END),
            "{body}"
        );
    }
}

#[test]
fn two_summaries_in_the_span_are_both_carried() {
    let actions = crate::validate::TextActions::auto();
    let record = |tag: &str| {
        crate::summarize::state::StateRecord::build(&text_action_session(3, tag), &actions)
            .render(10_000, crate::summarize::state::Collapsed::NotListed)
    };
    let mut history = vec![
        Message::system("You are an autonomous programmer."),
        Message::user(wrap_summary(&record("alpha"))),
    ];
    let mut rest = text_action_session(10, "gamma");
    rest.drain(..1);
    rest[3] = insert::prepend_text(&rest[3], &wrap_summary(&record("beta")));
    history.extend(rest);
    let options = CompressorOptions::default().with_text_actions(actions.clone());
    let mut engine = Compressor::with_options(counter(), 6_000, options);
    let out = engine
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    let ledger = ledger_of(&out);
    for tag in ["alpha", "beta", "gamma"] {
        assert!(
            ledger.contains(&format!("cat pkg/{tag}_0.py")),
            "{tag}: {ledger}"
        );
    }
    // Oldest first.
    let at = |w: &str| ledger.find(w).unwrap();
    assert!(
        at("alpha_0") < at("beta_0") && at("beta_0") < at("gamma_0"),
        "{ledger}"
    );
}

#[test]
fn a_tight_window_keeps_the_history_state_record_whole() {
    // A window the system prompt and the ask nearly fill: fitting the
    // compacted history under the threshold would cut the state record,
    // so the history keeps it whole (above the threshold if it must).
    let actions = crate::validate::TextActions::auto();
    let mut history = text_action_session(30, "tight");
    history[0] = Message::system("You are an autonomous programmer. ".repeat(120));
    let options = CompressorOptions::default().with_text_actions(actions.clone());
    let mut engine = Compressor::with_options(counter(), 2_400, options);
    let out = engine
        .compress(&history, &CompressRequest::new())
        .unwrap()
        .messages;
    let ledger = ledger_of(&out);
    let all: String = out.iter().map(|m| m.text().into_owned()).collect();
    for k in 0..30 {
        assert!(
            all.contains(&format!("cat pkg/tight_{k}.py")),
            "{k}: {ledger}"
        );
    }
    assert!(
        !ledger.contains("earlier commands"),
        "nothing collapsed: {ledger}"
    );
    let tokens = counter().count_messages(&out) as u64;
    assert!(tokens <= 2_400, "within the window: {tokens}");
    assert!(validate(&out, Profile::OpenAi).is_empty());
}

#[test]
fn compactions_a_call_apart_are_thrash_and_aim_deeper() {
    let mut engine = Compressor::new(counter(), 20_000);
    let first = engine
        .compress(&session(40), &CompressRequest::new())
        .unwrap()
        .messages;
    assert_eq!(engine.last_report().unwrap().thrash, None);
    engine.update_from_response(&Usage::new(8_000, 100));
    let mut grown = first.clone();
    grown.extend(session(40).into_iter().skip(2));
    engine.compress(&grown, &CompressRequest::new()).unwrap();
    let report = engine.last_report().unwrap();
    assert_eq!(report.thrash, Some(1));
    // Deeper: the tail cut to the last group.
    assert!(
        report
            .escalation
            .iter()
            .any(|s| s.step == FitStepKind::ShrinkTail),
        "{report:?}"
    );
    // Three calls later it is not thrash.
    for _ in 0..THRASH_CALLS {
        engine.update_from_response(&Usage::new(8_000, 100));
    }
    let mut later = grown.clone();
    later.extend(session(40).into_iter().skip(2));
    engine.compress(&later, &CompressRequest::new()).unwrap();
    assert_eq!(engine.last_report().unwrap().thrash, None);
}

#[test]
fn strict_output_is_as_small_as_the_default_and_keeps_every_fact() {
    // A long tool-calling session with a new ask every 30 turns: under
    // strict alternation the pinned ask cannot follow the head, so the
    // summary stands between them as the assistant's turn (the head does
    // not grow, the tail does not reach back to the ask).
    let mut history = session(20);
    for part in 0..4 {
        let mut more = session(if part == 3 { 60 } else { 30 });
        more.drain(..2);
        for m in &mut more {
            for call in m.tool_calls.iter_mut().flatten() {
                call.id = call.id.take().map(|id| format!("p{part}{id}"));
            }
            if let Some(id) = &mut m.tool_call_id {
                *id = format!("p{part}{id}");
            }
        }
        // The last part's turns follow the latest ask: it falls in the
        // middle and is pinned.
        if part == 3 {
            more.pop();
        } else if let Some(last) = more.last_mut() {
            *last = Message::user(format!("Part {part} done; now handle case {part} too."));
        }
        history.extend(more);
    }
    assert!(validate(&history, Profile::Strict).is_empty());
    let actions = crate::validate::TextActions::auto();
    let probes = crate::retention::extract_probes(&history, &actions);
    let mut sizes = Vec::new();
    for profile in [Profile::OpenAi, Profile::Strict] {
        let options = CompressorOptions::default().with_profile(profile);
        let mut engine = Compressor::with_options(counter(), 64_000, options);
        let out = engine
            .compress(&history, &CompressRequest::new())
            .unwrap()
            .messages;
        assert!(validate(&out, profile).is_empty(), "{profile:?}");
        let report = engine.last_report().unwrap();
        assert!(report.pinned.is_some(), "{profile:?}: {report:?}");
        let report = crate::retention::check(&probes, &out, &out);
        assert_eq!(
            report.verbatim + report.in_summary,
            report.probes,
            "{profile:?}: {report:?}"
        );
        sizes.push(counter().count_messages(&out) as f64);
    }
    assert!(
        sizes[1] <= 1.1 * sizes[0],
        "strict {} vs default {}",
        sizes[1],
        sizes[0]
    );
}
