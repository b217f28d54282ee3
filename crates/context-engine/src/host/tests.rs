use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::*;
use crate::engine::{EngineError, EngineState, PromptTokens, SelectRequest};
use crate::message::ToolCall;
use crate::tokens::{BpeCounter, Encoding};
use crate::validate::Profile;

/// What the scripted engine returns from `compress`.
#[derive(Clone, Copy, PartialEq)]
enum CompressMode {
    /// Keep the first and the last message (a valid, much shorter result).
    KeepEnds,
    /// Drop only the oldest non-system message (saves little).
    DropOne,
    /// A tool result without its call.
    Orphan,
    /// Nothing at all.
    Empty,
    /// An error.
    Fail,
}

/// An engine that logs every hook it sees and does what the test says.
struct Scripted {
    state: EngineState,
    log: Arc<Mutex<Vec<String>>>,
    preflight: bool,
    mode: CompressMode,
    select: Option<Vec<Message>>,
    prune: bool,
    /// Over the threshold, hold compaction back with a cooldown.
    blocked: bool,
}

impl Scripted {
    fn new(log: &Arc<Mutex<Vec<String>>>) -> Scripted {
        let state = EngineState {
            context_length: 1000,
            threshold_tokens: 100,
            ..EngineState::default()
        };
        Scripted {
            state,
            log: Arc::clone(log),
            preflight: false,
            mode: CompressMode::KeepEnds,
            select: None,
            prune: false,
            blocked: false,
        }
    }

    fn note(&self, what: impl Into<String>) {
        self.log.lock().unwrap().push(what.into());
    }
}

impl ContextEngine for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn state(&self) -> &EngineState {
        &self.state
    }
    fn state_mut(&mut self) -> &mut EngineState {
        &mut self.state
    }
    fn update_from_response(&mut self, usage: &Usage) {
        self.note(format!("update_from_response {}", usage.prompt_tokens));
        self.state.record_usage(usage);
    }
    fn should_compress(&self, prompt_tokens: Option<u64>) -> bool {
        self.state.exceeds_threshold(prompt_tokens)
    }
    fn should_compress_info(&self, prompt_tokens: Option<u64>) -> crate::engine::CompressDecision {
        self.note(format!("should_compress_info {prompt_tokens:?}"));
        if self.blocked && self.should_compress(prompt_tokens) {
            return crate::engine::CompressDecision::blocked(
                crate::engine::BlockReason::Cooldown { seconds_left: 42 },
            );
        }
        crate::engine::CompressDecision::plain(self.should_compress(prompt_tokens))
    }
    fn compress(
        &mut self,
        messages: &[Message],
        request: &CompressRequest,
    ) -> Result<crate::engine::Compaction, EngineError> {
        self.note(format!("compress force={}", request.force));
        let out = match self.mode {
            CompressMode::KeepEnds => {
                vec![messages[0].clone(), messages[messages.len() - 1].clone()]
            }
            CompressMode::DropOne => {
                let mut out = messages.to_vec();
                out.remove(1);
                out
            }
            CompressMode::Orphan => vec![Message::tool_result("nobody", "x")],
            CompressMode::Empty => Vec::new(),
            CompressMode::Fail => {
                return Err(EngineError::Summarizer {
                    engine: "scripted".into(),
                    reason: "server down".into(),
                    cooldown_seconds: None,
                    source: None,
                });
            }
        };
        self.state.record_compression();
        let counter = BpeCounter::new(Encoding::O200kBase);
        let threshold = self.state.threshold_tokens;
        Ok(crate::engine::Compaction::from_diff(
            messages, out, &counter, threshold,
        ))
    }
    fn prune_tool_results_only<'a>(
        &mut self,
        messages: &'a [Message],
        current_tokens: Option<u64>,
    ) -> (Cow<'a, [Message]>, usize) {
        self.note(format!("prune {current_tokens:?}"));
        if !self.prune {
            return (Cow::Borrowed(messages), 0);
        }
        let out: Vec<Message> = messages
            .iter()
            .map(|m| {
                if m.is_tool_result() {
                    let mut m = m.clone();
                    m.content = crate::message::Content::Text("[pruned]".into());
                    m
                } else {
                    m.clone()
                }
            })
            .collect();
        (Cow::Owned(out), 1)
    }
    fn select_context(&mut self, _request: &SelectRequest<'_>) -> Option<Vec<Message>> {
        self.note("select_context");
        self.select.clone()
    }
    fn on_turn_complete(&mut self, _messages: &[Message], usage: Option<&Usage>, turn: &TurnInfo) {
        self.note(format!(
            "on_turn_complete usage={} calls={}",
            usage.is_some(),
            turn.api_call_count
        ));
    }
    fn should_compress_preflight(&self, _messages: &[Message]) -> bool {
        self.note("should_compress_preflight");
        self.preflight
    }
    fn should_defer_preflight_to_real_usage(&self, _rough: u64) -> bool {
        self.note("should_defer_preflight_to_real_usage");
        false
    }
    fn on_session_start(&mut self, session_id: &str, _info: &SessionInfo) {
        self.note(format!("on_session_start {session_id}"));
    }
    fn on_session_end(&mut self, session_id: &str, messages: &[Message]) {
        self.note(format!("on_session_end {session_id} {}", messages.len()));
    }
    fn tool_schemas(&self) -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "context_recall", "parameters": {}}}),
            json!({"type": "function", "function": {"name": "bash", "parameters": {}}}),
        ]
    }
    fn handle_tool_call(&mut self, name: &str, args: &Value, ctx: &ToolCallContext<'_>) -> String {
        json!({"tool": name, "args": args, "seen": ctx.messages.map(<[Message]>::len)}).to_string()
    }
}

fn history(tool_bytes: usize) -> Vec<Message> {
    vec![
        Message::system("You are a coding agent."),
        Message::user("Fix the failing test in parser.rs."),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "c1",
                "bash",
                r#"{"command":"cat parser.rs"}"#,
            )],
        ),
        Message::tool_result("c1", "fn parse() {}\n".repeat(tool_bytes / 15 + 1)),
        Message::assistant("The parser ignores trailing commas."),
        Message::user("Then fix it."),
    ]
}

fn session(engine: Scripted) -> Session {
    Session::new(
        "s1",
        Box::new(engine),
        Arc::new(BpeCounter::new(Encoding::O200kBase)),
    )
}

fn take(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[test]
fn a_quiet_turn_calls_the_hooks_in_the_reference_order() {
    let log = Arc::default();
    let mut s = session(Scripted::new(&log));
    let h = history(10);
    s.start(&SessionInfo::default());
    s.start(&SessionInfo::default());
    let prepared = s.before_request(&h);
    assert_eq!(prepared.request, h);
    assert!(!prepared.selected);
    assert!(prepared.update.new_history.is_none());
    s.after_response(&Usage::new(50, 5));
    let update = s.after_tools(&h);
    assert!(update.new_history.is_none());
    s.turn_complete(&h, &TurnInfo::default());
    s.end(&h);
    s.end(&h);
    let rough = BpeCounter::new(Encoding::O200kBase).count_messages(&h);
    assert_eq!(
        take(&log),
        [
            "on_session_start s1",
            "select_context",
            "should_compress_preflight",
            "should_defer_preflight_to_real_usage",
            &format!("should_compress_info Some({rough})"),
            "update_from_response 50",
            "should_compress_info None",
            "prune Some(50)",
            "on_turn_complete usage=true calls=1",
            "on_session_end s1 6",
        ]
    );
}

#[test]
fn preflight_compaction_is_returned_not_applied_and_not_repeated_before_real_usage() {
    let log = Arc::default();
    let mut engine = Scripted::new(&log);
    engine.preflight = true;
    let mut s = session(engine);
    let h = history(4000);
    let prepared = s.before_request(&h);
    let new = prepared.update.new_history.clone().unwrap();
    assert_eq!(new.len(), 2);
    assert_eq!(new[0], h[0], "the system prompt is kept verbatim");
    assert_eq!(prepared.request, new);
    let c = prepared.update.compaction.unwrap();
    assert_eq!(c.trigger, Trigger::Preflight);
    assert_eq!(c.passes, 1, "the result fits: no second pass");
    assert!(c.tokens_after < c.tokens_before);
    assert_eq!(prepared.update.notices.len(), 1);
    assert_eq!(prepared.update.notices[0].kind, NoticeKind::Status);
    let log_after_compaction = take(&log);
    assert!(log_after_compaction.contains(&"compress force=false".to_string()));

    // Right after a compaction, neither the next preflight nor the
    // post-tool check may compact again: the numbers are stale.
    let again = s.before_request(&h);
    assert!(again.update.compaction.is_none());
    let update = s.after_tools(&h);
    assert!(update.compaction.is_none());
    let log_now = take(&log);
    assert!(
        !log_now.iter().any(|l| l.starts_with("compress")),
        "{log_now:?}"
    );
    assert!(
        !log_now.iter().any(|l| l.starts_with("should_compress")),
        "{log_now:?}"
    );

    // Real usage over the threshold re-arms the post-tool check.
    s.after_response(&Usage::new(500, 5));
    let update = s.after_tools(&h);
    assert_eq!(update.compaction.unwrap().trigger, Trigger::PostTool);
}

#[test]
fn passes_stop_at_three_or_when_a_pass_saves_under_five_percent() {
    let log = Arc::default();
    let mut engine = Scripted::new(&log);
    engine.preflight = true;
    engine.mode = CompressMode::DropOne;
    // Many equally sized messages: each pass drops one of 40, under 5%.
    let mut h = vec![Message::system("sys")];
    for i in 0..40 {
        h.push(Message::user(format!(
            "message number {i} {}",
            "word ".repeat(40)
        )));
        h.push(Message::assistant(format!(
            "answer {i} {}",
            "word ".repeat(40)
        )));
    }
    let mut s = session(engine);
    let c = s.before_request(&h).update.compaction.unwrap();
    assert_eq!(c.passes, 1);

    // Each pass drops one of three big messages: a third each time, still
    // over the threshold, so the cap of three passes applies.
    let log2 = Arc::default();
    let mut engine = Scripted::new(&log2);
    engine.preflight = true;
    engine.mode = CompressMode::DropOne;
    engine.state.threshold_tokens = 1;
    let h = vec![
        Message::system("sys"),
        Message::user("a ".repeat(300)),
        Message::assistant("b ".repeat(300)),
        Message::user("c ".repeat(300)),
        Message::assistant("d ".repeat(300)),
        Message::user("e"),
    ];
    let mut s = session(engine);
    let c = s.before_request(&h).update.compaction.unwrap();
    assert_eq!(c.passes, 3);
    assert_eq!(c.messages_after, 3);
    let compress_calls = take(&log2)
        .iter()
        .filter(|l| l.starts_with("compress"))
        .count();
    assert_eq!(compress_calls, 3);
}

#[test]
fn invalid_empty_or_failed_results_leave_everything_as_it_was() {
    for mode in [
        CompressMode::Orphan,
        CompressMode::Empty,
        CompressMode::Fail,
    ] {
        let log = Arc::default();
        let mut engine = Scripted::new(&log);
        engine.preflight = true;
        engine.mode = mode;
        let mut s = session(engine);
        let h = history(4000);
        let prepared = s.before_request(&h);
        assert!(prepared.update.new_history.is_none());
        assert!(prepared.update.compaction.is_none());
        // The history as it was, only fitted under the 1,000-token window
        // (a view): the engine's output was ignored.
        assert_eq!(prepared.request.first(), h.first());
        assert_eq!(prepared.request.last(), h.last());
        assert!(prepared.request_tokens <= 1000);
        assert!(!prepared.fit.is_empty());
        assert_eq!(prepared.update.notices.len(), 1);
        assert_eq!(prepared.update.notices[0].kind, NoticeKind::Warning);
        assert!(prepared.update.notices[0].text.contains("unchanged"));
        // The missed compaction is typed, with the reason.
        let missed = prepared.update.missed.unwrap();
        assert_eq!(missed.trigger, Trigger::Preflight);
        let expected = match mode {
            CompressMode::Fail => MissedKind::Failed,
            _ => MissedKind::Refused,
        };
        assert_eq!(missed.kind, expected, "{missed:?}");
        assert!(!missed.reason.is_empty());
    }
}

#[test]
fn a_held_back_compaction_is_reported_as_blocked() {
    let log = Arc::default();
    let mut engine = Scripted::new(&log);
    engine.blocked = true;
    engine.update_from_response(&Usage::new(5000, 10));
    let mut s = session(engine);
    let update = s.after_tools(&history(4000));
    assert!(update.compaction.is_none());
    let missed = update.missed.unwrap();
    assert_eq!(missed.kind, MissedKind::Blocked);
    assert_eq!(missed.trigger, Trigger::PostTool);
    assert!(missed.reason.contains("42"), "{}", missed.reason);
    // Under the threshold nothing is missed.
    let log = Arc::default();
    let mut s = session(Scripted::new(&log));
    assert!(s.after_tools(&history(10)).missed.is_none());
}

#[test]
fn a_bad_selection_is_ignored_and_a_good_one_is_request_only() {
    let log = Arc::default();
    let mut engine = Scripted::new(&log);
    engine.select = Some(vec![Message::tool_result("c9", "orphan")]);
    let mut s = session(engine);
    let h = history(10);
    let prepared = s.before_request(&h);
    assert!(!prepared.selected);
    assert_eq!(prepared.request, h);
    assert_eq!(prepared.update.notices[0].kind, NoticeKind::Warning);

    let log = Arc::default();
    let mut engine = Scripted::new(&log);
    let view = vec![h[0].clone(), h[5].clone()];
    engine.select = Some(view.clone());
    let mut s = session(engine);
    let prepared = s.before_request(&h);
    assert!(prepared.selected);
    assert_eq!(prepared.request, view);
    assert!(
        prepared.update.new_history.is_none(),
        "a view is never persisted"
    );
}

#[test]
fn silent_engines_stay_silent_but_manual_compaction_always_reports() {
    let log = Arc::default();
    let mut engine = Scripted::new(&log);
    engine.preflight = true;
    engine.state.emit_automatic_compaction_status = false;
    let mut s = session(engine);
    let h = history(4000);
    let prepared = s.before_request(&h);
    assert!(prepared.update.compaction.is_some());
    assert!(prepared.update.notices.is_empty());

    let update = s.compact_now(&h, Some("parser"));
    assert!(update.compaction.is_some());
    assert_eq!(update.notices[0].kind, NoticeKind::Manual);
    assert!(take(&log).contains(&"compress force=true".to_string()));
}

#[test]
fn proactive_prune_is_returned_as_new_history() {
    let log = Arc::default();
    let mut engine = Scripted::new(&log);
    engine.prune = true;
    let mut s = session(engine);
    let h = history(10);
    s.after_response(&Usage::new(50, 5));
    let update = s.after_tools(&h);
    assert_eq!(update.pruned, 1);
    assert_eq!(update.new_history.unwrap()[3].text(), "[pruned]");
}

#[test]
fn engine_tools_merge_without_duplicates_and_route_calls() {
    let log = Arc::default();
    let mut s = session(Scripted::new(&log));
    let agent = vec![json!({"type": "function", "function": {"name": "bash"}})];
    let tools = s.tools(&agent);
    let names: Vec<_> = tools.iter().filter_map(tool_name).collect();
    assert_eq!(names, ["bash", "context_recall"]);
    let h = history(10);
    assert!(s.handle_tool_call("edit", "{}", &h).is_none());
    let out = s
        .handle_tool_call("context_recall", r#"{"handle":"c1"}"#, &h)
        .unwrap();
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["args"]["handle"], "c1");
    assert_eq!(out["seen"], 6);
    let bad = s
        .handle_tool_call("context_recall", "{not json", &h)
        .unwrap();
    assert!(bad.contains("not JSON"));
}

#[test]
fn the_built_in_compressor_digests_and_compacts_through_the_driver() {
    let counter: Arc<dyn TokenCounter> = Arc::new(BpeCounter::new(Encoding::O200kBase));
    let engine = crate::compressor::Compressor::new(Arc::clone(&counter), 8000);
    let mut s = Session::new("s2", Box::new(engine), Arc::clone(&counter));
    let mut h = vec![Message::system("You are a coding agent.")];
    for i in 0..12 {
        h.push(Message::user(format!("step {i}: look at file_{i}.py")));
        let id = format!("call{i}");
        h.push(Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                &id,
                "bash",
                format!(r#"{{"command":"cat file_{i}.py"}}"#),
            )],
        ));
        h.push(Message::tool_result(
            &id,
            format!("value_{i} = compute(alpha, beta, gamma)\n").repeat(120),
        ));
        h.push(Message::assistant(format!("file_{i}.py sets x to {i}.")));
    }
    // The digested request fits: no compaction, the history stays whole.
    let prepared = s.before_request(&h);
    assert!(prepared.selected);
    assert!(prepared.update.compaction.is_none());
    let full = counter.count_messages(&h) as u64;
    assert!(full > 8000 && prepared.request_tokens < 6000);

    // Without the digest the same request is over the threshold.
    let options =
        crate::compressor::CompressorOptions::default().with_digest(crate::digest::DigestOptions {
            enabled: false,
            ..Default::default()
        });
    let engine = crate::compressor::Compressor::with_options(Arc::clone(&counter), 8000, options);
    let mut s = Session::new("s3", Box::new(engine), counter);
    let prepared = s.before_request(&h);
    let new = prepared
        .update
        .new_history
        .expect("over the threshold: compacted");
    let c = prepared.update.compaction.clone().unwrap();
    assert!(c.tokens_before > 8000 && c.tokens_after < 6000, "{c:?}");
    assert_eq!(prepared.request_tokens, c.tokens_after);
    assert!(new.len() < h.len());
    assert_eq!(s.status().compression_count, 1);
    assert_eq!(
        s.engine().state().last_prompt_tokens,
        PromptTokens::AwaitingRealUsage
    );
    // The engine's report of the pass names the input messages the summary
    // replaced, so a store can archive exactly those.
    assert_eq!(c.reports.len() as u32, c.passes);
    let span = c.reports[0].summarized.expect("a summarized span");
    assert!(span.start >= 1 && span.end <= h.len() && !span.is_empty());
    assert_eq!(c.reports[0].messages_before, h.len());
    let kept = h.len() - span.len() + usize::from(c.reports[0].pinned.is_some());
    let own_message = c.reports[0].placement != Some(crate::compressor::Placement::Merged);
    assert_eq!(
        kept + usize::from(own_message),
        c.reports[0].messages_after,
        "kept + the summary"
    );
}

#[test]
fn a_request_that_cannot_fit_is_flagged_and_not_fitted() {
    let log = Arc::default();
    let engine = Scripted::new(&log);
    let mut s = session(engine);
    let h = vec![
        Message::system("rules ".repeat(3000)),
        Message::user("Fix the failing test."),
    ];
    let prepared = s.before_request(&h);
    let e = prepared.unfittable.unwrap();
    assert_eq!(e.window, 1000);
    assert!(e.system_tokens > 1000);
    assert!(e.to_string().contains("> window 1,000"), "{e}");
    assert_eq!(prepared.request, h);
    assert!(
        prepared.update.notices[0]
            .text
            .contains("the request cannot fit the window")
    );
}

/// A summary model that counts its calls.
struct CountingModel(Arc<std::sync::atomic::AtomicUsize>);

impl crate::summarize::Summarizer for CountingModel {
    fn name(&self) -> &str {
        "background-model"
    }
    fn summarize(
        &self,
        request: &crate::summarize::SummaryRequest<'_>,
    ) -> Result<String, crate::summarize::SummarizeError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(format!("MODEL SUMMARY of {} turns", request.turns.len()))
    }
}

fn group(i: usize) -> Vec<Message> {
    let id = format!("call{i}");
    vec![
        Message::user(format!("step {i}: look at file_{i}.py")),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                &id,
                "bash",
                format!(r#"{{"command":"cat file_{i}.py"}}"#),
            )],
        ),
        Message::tool_result(
            &id,
            format!("value_{i} = compute(alpha, beta)\n").repeat(40),
        ),
        Message::assistant(format!("file_{i}.py sets x to {i}.")),
    ]
}

fn background_session(calls: &Arc<std::sync::atomic::AtomicUsize>) -> Session {
    let counter: Arc<dyn TokenCounter> = Arc::new(BpeCounter::new(Encoding::O200kBase));
    let options =
        crate::compressor::CompressorOptions::default().with_digest(crate::digest::DigestOptions {
            enabled: false,
            ..Default::default()
        });
    let engine = crate::compressor::Compressor::with_options(Arc::clone(&counter), 8000, options)
        .with_summarizer(Box::new(CountingModel(Arc::clone(calls))));
    Session::new("bg", Box::new(engine), counter)
        .with_options(HostOptions::default().with_summary_watermark(Some(0.6)))
}

/// One model call on `h`: the request, then the provider's usage (its
/// counted size).
fn call(s: &mut Session, h: &mut Vec<Message>) -> Prepared {
    let prepared = s.before_request(h);
    if let Some(new) = &prepared.update.new_history {
        *h = new.clone();
    }
    s.after_response(&Usage::new(prepared.request_tokens, 10));
    prepared
}

#[test]
fn a_summary_prepared_at_the_watermark_is_used_at_the_threshold_and_never_awaited() {
    use std::sync::atomic::Ordering;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut s = background_session(&calls);
    let threshold = s.engine().state().threshold_tokens;
    let mut h = vec![Message::system("You are a coding agent.")];
    let mut i = 0;
    // Up to the watermark: no job, then one.
    let job = loop {
        h.extend(group(i));
        i += 1;
        let p = call(&mut s, &mut h);
        assert!(p.update.compaction.is_none());
        if let Some(job) = s.summary_job(&h) {
            assert!(p.request_tokens >= threshold * 6 / 10 && p.request_tokens < threshold);
            break job;
        }
        assert!(i < 50, "the watermark is never reached");
    };
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the job has not run yet");
    // Over the threshold while the job has not run: no compaction, no
    // summary model call on the request path; the request goes out whole.
    let crossed = loop {
        h.extend(group(i));
        i += 1;
        let p = call(&mut s, &mut h);
        assert!(
            p.update.compaction.is_none(),
            "nothing waits for the summary"
        );
        if p.update.missed.is_some() {
            break p;
        }
        assert!(i < 50, "compaction never comes due");
    };
    assert_eq!(crossed.update.missed.unwrap().kind, MissedKind::Deferred);
    assert!(crossed.request_tokens > threshold);
    assert!(crossed.unfittable.is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // The job runs (elsewhere), its result is adopted, and the next request
    // compacts with it: the prepared cut, everything after it verbatim.
    let cut = job.messages();
    let done = job.run();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    s.adopt_summary(done);
    let before = h.clone();
    h.extend(group(i));
    let input = {
        let mut x = before.clone();
        x.extend(group(i));
        x
    };
    let p = call(&mut s, &mut h);
    let c = p
        .update
        .compaction
        .expect("compacted with the prepared summary");
    let report = &c.reports[0];
    assert_eq!(report.outcome, crate::engine::Outcome::Compacted);
    assert_eq!(report.summarizer.as_deref(), Some("background-model"));
    assert_eq!(report.summarized_messages, cut);
    let span = report.summarized.unwrap();
    assert!(
        h.ends_with(&input[span.end..]),
        "the tail after the cut is verbatim"
    );
    assert!(
        h.iter()
            .any(|m| m.text().contains("MODEL SUMMARY") && crate::compressor::is_summary(m))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no second model call");
}

#[test]
fn a_stale_prepared_summary_is_dropped_and_an_overflow_gets_the_extractive_one() {
    use std::sync::atomic::Ordering;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut s = background_session(&calls);
    let mut h = vec![Message::system("You are a coding agent.")];
    let mut i = 0;
    let job = loop {
        h.extend(group(i));
        i += 1;
        call(&mut s, &mut h);
        if let Some(job) = s.summary_job(&h) {
            break job;
        }
        assert!(i < 50);
    };
    s.adopt_summary(job.run());
    // The client edited a message inside the summarized span: the
    // prepared summary no longer describes this history.
    h[1] = Message::user("step 0: look at other.py instead");
    let window = s.engine().state().context_length;
    let p = loop {
        h.extend(group(i));
        i += 1;
        let p = call(&mut s, &mut h);
        if p.update.compaction.is_some() {
            break p;
        }
        assert!(i < 80);
    };
    let c = p.update.compaction.unwrap();
    assert!(c.tokens_before > window, "compacted only past the window");
    let report = &c.reports[0];
    assert_eq!(report.outcome, crate::engine::Outcome::Fallback);
    assert_eq!(report.summarizer.as_deref(), Some("extractive"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the model ran only in the job"
    );
    assert!(crate::validate::validate(&p.request, Profile::OpenAi).is_empty());
}

/// A conversation over the 1,000-token window of [`Scripted`]: two older
/// asks with long exchanges, then the latest ask.
fn over_the_window() -> Vec<Message> {
    let mut h = vec![Message::system("You are a coding agent.")];
    for (k, ask) in [
        "Rename the Backoff class to RetryPolicy everywhere.",
        "Then add jitter to the retry delay, off by default.",
    ]
    .iter()
    .enumerate()
    {
        h.push(Message::user(*ask));
        h.push(Message::assistant(format!(
            "step {k}: {}",
            "reasoning ".repeat(900)
        )));
    }
    h.push(Message::user("Now update the docs."));
    h
}

#[test]
fn a_fitted_request_names_what_it_left_out_and_the_store_archives_it() {
    let log = Arc::default();
    let store = Arc::new(crate::store::MemoryStore::new());
    let mut s = session(Scripted::new(&log))
        .with_store(store.clone())
        .unwrap();
    let h = over_the_window();
    let prepared = s.before_request(&h);
    assert!(!prepared.fit.is_empty(), "the request was fitted");
    assert!(prepared.request_tokens <= 1000);
    let text: String = prepared.request.iter().map(|m| m.text()).collect();
    // The note names a span handle the store resolves to the originals.
    let handle = store
        .handles("s1")
        .unwrap()
        .into_iter()
        .find(|h| h.starts_with('s') && text.contains(&format!("(handle {h})")));
    let handle = handle.expect("the request names an archived span");
    let entry = store.resolve(Some("s1"), &handle).unwrap().unwrap();
    assert!(
        entry.messages.iter().any(|m| m == &h[2]),
        "the original, uncut"
    );
    // The asks it left out are repeated in the request.
    for ask in [&h[1], &h[3]] {
        assert!(text.contains(&*ask.text()), "{}", ask.text());
    }
    assert!(crate::validate::validate(&prepared.request, s.options().profile).is_empty());

    // Without a store there is no note: its handle would name nothing.
    let mut bare = session(Scripted::new(&log));
    let prepared = bare.before_request(&h);
    assert!(!prepared.fit.is_empty());
    assert!(
        prepared
            .request
            .iter()
            .all(|m| !m.text().contains("left out of this request"))
    );
}

/// A request whose system prompt and latest ask fit the window but not
/// the compaction threshold, too tight for a note naming what it left out:
/// fitted under the window, never called unfittable against the threshold
/// (`ctx replay` counted SWE-agent calls unfittable at 1,650 "window"
/// tokens, the threshold of a 2,200-token window).
#[test]
fn a_request_that_fits_the_window_but_not_the_threshold_is_fitted_not_unfittable() {
    let log = Arc::default();
    let store = Arc::new(crate::store::MemoryStore::new());
    let mut s = session(Scripted::new(&log))
        .with_store(store.clone())
        .unwrap();
    let counter = BpeCounter::new(Encoding::O200kBase);
    let ask = Message::user(format!("Fix the parser. {}", "Details follow. ".repeat(60)));
    // System prompt and ask 10 tokens under the 1,000-token window, far
    // over the 100-token threshold.
    let mut words = 600usize;
    let mut system = Message::system("rules ".repeat(words));
    for _ in 0..8 {
        let n = counter.count_messages(&[system.clone(), ask.clone()]) as i64;
        words = (words as i64 + 990 - n).max(1) as usize;
        system = Message::system("rules ".repeat(words));
    }
    let core = counter.count_messages(&[system.clone(), ask.clone()]) as u64;
    assert!((980..=1000).contains(&core), "{core}");
    let h = vec![
        system,
        Message::user("Look at the parser first."),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function(
                "c1",
                "bash",
                r#"{"cmd":"cat src/parse.rs"}"#,
            )],
        ),
        Message::tool_result("c1", "fn parse() {}\n".repeat(400)),
        Message::assistant("The parser ignores trailing commas."),
        ask,
    ];
    let prepared = s.before_request(&h);
    assert!(
        prepared.unfittable.is_none(),
        "it fits the window: {:?}",
        prepared.unfittable
    );
    assert!(!prepared.fit.is_empty(), "the request was fitted");
    assert!(
        prepared.request_tokens <= 1000,
        "{}",
        prepared.request_tokens
    );

    // Over the window itself, it is unfittable, against the window.
    let mut big = h.clone();
    big[0] = Message::system("rules ".repeat(words + 100));
    let prepared = s.before_request(&big);
    let e = prepared.unfittable.expect("over the window");
    assert_eq!(e.window, 1000, "{e}");
}

#[test]
fn a_request_view_applied_in_place_is_the_same_request_with_the_same_decisions() {
    let counter: Arc<dyn TokenCounter> = Arc::new(BpeCounter::new(Encoding::O200kBase));
    let engine = |c: &Arc<dyn TokenCounter>| {
        Box::new(crate::compressor::Compressor::new(Arc::clone(c), 8000))
    };
    let mut copied = Session::new("c", engine(&counter), Arc::clone(&counter));
    let mut in_place = Session::new("p", engine(&counter), Arc::clone(&counter));
    let mut h = vec![Message::system("You are a coding agent.")];
    let mut mine = h.clone();
    let (mut applied, mut edited, mut compacted) = (0, 0, 0);
    for i in 0..90 {
        let id = format!("call{i}");
        let turn = [
            Message::user(format!("step {i}: look at file_{i}.py")),
            Message::assistant_tool_calls(
                "",
                vec![ToolCall::function(
                    &id,
                    "bash",
                    format!(r#"{{"command":"cat file_{i}.py"}}"#),
                )],
            ),
            Message::tool_result(
                &id,
                format!("value_{i} = compute(alpha, beta, gamma)\n").repeat(120),
            ),
            Message::assistant(format!("file_{i}.py sets x to {i}.")),
        ];
        h.extend(turn.iter().cloned());
        mine.extend(turn);
        let want = copied.before_request(&h);
        let tokens = match in_place.before_request_in_place(&mut mine) {
            InPlace::Applied(a) => {
                assert_eq!(mine, want.request, "the history is the request, call {i}");
                assert_eq!(a.request_tokens, want.request_tokens);
                assert_eq!(a.selected, want.selected);
                assert!(want.update.compaction.is_none() && want.update.new_history.is_none());
                applied += 1;
                edited += usize::from(!a.originals.is_empty());
                let tokens = a.request_tokens;
                let view = a.restore(&mut mine);
                assert!(view.iter().all(|(i, m)| want.request[*i] == *m));
                assert_eq!(mine, h, "restored, call {i}");
                tokens
            }
            InPlace::Prepared(p) => {
                assert_eq!(mine, h, "untouched, call {i}");
                assert_eq!(p.request, want.request);
                assert_eq!(p.request_tokens, want.request_tokens);
                assert_eq!(
                    p.update.compaction.is_some(),
                    want.update.compaction.is_some()
                );
                if let Some(new) = p.update.new_history {
                    compacted += 1;
                    assert_eq!(Some(&new), want.update.new_history.as_ref());
                    mine = new;
                }
                p.request_tokens
            }
        };
        if let Some(new) = want.update.new_history {
            h = new;
        }
        let usage = Usage {
            prompt_tokens: tokens,
            completion_tokens: 5,
            ..Usage::default()
        };
        copied.after_response(&usage);
        in_place.after_response(&usage);
    }
    assert!(
        applied > 0 && edited > 0,
        "digested views applied in place: {applied} applied, {edited} edited, {compacted} compacted"
    );
    assert!(compacted > 0, "a compaction takes the full way");
    assert_eq!(
        copied.engine().state().compression_count,
        in_place.engine().state().compression_count
    );
}

/// A counter that records the length of every request it counts whole.
struct Recording {
    inner: BpeCounter,
    counted: Mutex<Vec<usize>>,
}

impl TokenCounter for Recording {
    fn count_text(&self, text: &str) -> usize {
        self.inner.count_text(text)
    }
    fn count_message(&self, message: &Message) -> usize {
        self.inner.count_message(message)
    }
    fn request_overhead(&self) -> usize {
        self.inner.request_overhead()
    }
    fn count_messages(&self, messages: &[Message]) -> usize {
        self.counted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(messages.len());
        self.inner.count_messages(messages)
    }
    fn count_tools(&self, tools: &[Value]) -> usize {
        self.inner.count_tools(tools)
    }
}

/// The preflight decision counts the request once: the driver's count is
/// the one the built-in compressor decides with (counting is the costly
/// part of the hot path).
#[test]
fn the_preflight_path_counts_the_request_once() {
    let counter = Arc::new(Recording {
        inner: BpeCounter::new(Encoding::O200kBase),
        counted: Mutex::new(Vec::new()),
    });
    let shared: Arc<dyn TokenCounter> = counter.clone();
    let engine = crate::compressor::Compressor::new(Arc::clone(&shared), 128_000);
    let mut s = Session::new("once", Box::new(engine), Arc::clone(&shared));
    let h = history(200);
    // Real usage known (not awaiting it), so the preflight runs.
    s.after_response(&crate::engine::Usage::new(1000, 10));
    counter.counted.lock().unwrap().clear();
    let _ = s.before_request(&h);
    let whole = counter
        .counted
        .lock()
        .unwrap()
        .iter()
        .filter(|&&n| n == h.len())
        .count();
    assert_eq!(whole, 1, "{:?}", counter.counted.lock().unwrap());
}
