use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::message::ToolCall;

/// Implements only the required methods, so every other hook is the default.
#[derive(Default)]
struct Minimal {
    state: EngineState,
}

impl ContextEngine for Minimal {
    fn name(&self) -> &str {
        "minimal"
    }
    fn state(&self) -> &EngineState {
        &self.state
    }
    fn state_mut(&mut self) -> &mut EngineState {
        &mut self.state
    }
    fn update_from_response(&mut self, usage: &Usage) {
        self.state.record_usage(usage);
    }
    fn should_compress(&self, prompt_tokens: Option<u64>) -> bool {
        self.state.exceeds_threshold(prompt_tokens)
    }
    fn compress(
        &mut self,
        messages: &[Message],
        _request: &CompressRequest,
    ) -> Result<Compaction, EngineError> {
        self.state.record_compression();
        let out = messages.iter().rev().take(2).rev().cloned().collect();
        let counter = crate::tokens::BpeCounter::new(crate::tokens::Encoding::O200kBase);
        Ok(Compaction::from_diff(
            messages,
            out,
            &counter,
            self.state.threshold_tokens,
        ))
    }
}

/// Overrides the status message hook to exercise trimming and suppression.
struct Chatty {
    state: EngineState,
    message: Option<String>,
}

impl ContextEngine for Chatty {
    fn name(&self) -> &str {
        "chatty"
    }
    fn state(&self) -> &EngineState {
        &self.state
    }
    fn state_mut(&mut self) -> &mut EngineState {
        &mut self.state
    }
    fn update_from_response(&mut self, usage: &Usage) {
        self.state.record_usage(usage);
    }
    fn should_compress(&self, _prompt_tokens: Option<u64>) -> bool {
        false
    }
    fn compress(
        &mut self,
        messages: &[Message],
        _request: &CompressRequest,
    ) -> Result<Compaction, EngineError> {
        let counter = crate::tokens::BpeCounter::new(crate::tokens::Encoding::O200kBase);
        Ok(Compaction::from_diff(
            messages,
            messages.to_vec(),
            &counter,
            0,
        ))
    }
    fn automatic_compaction_status(
        &self,
        _phase: CompactionPhase,
        _default_message: &str,
        _context: &CompactionStatusContext,
    ) -> Option<String> {
        self.message.clone()
    }
}

fn convo() -> Vec<Message> {
    vec![
        Message::system("sys"),
        Message::user("hi"),
        Message::assistant_tool_calls("", vec![ToolCall::function("c1", "ls", "{}")]),
        Message::tool_result("c1", "a b c"),
        Message::assistant("done"),
    ]
}

#[test]
fn state_defaults_match_the_reference_design() {
    let s = EngineState::default();
    assert_eq!(s.last_prompt_tokens, PromptTokens::Known(0));
    assert_eq!(s.last_completion_tokens, 0);
    assert_eq!(s.last_total_tokens, 0);
    assert_eq!(s.threshold_tokens, 0);
    assert_eq!(s.context_length, 0);
    assert_eq!(s.compression_count, 0);
    assert_eq!(s.threshold_percent, 0.75);
    assert_eq!(s.protect_first_n, 3);
    assert_eq!(s.protect_last_n, 6);
    assert!(s.emit_automatic_compaction_status);
    assert!(s.model_thresholds.is_empty());
    assert_eq!(s.config_threshold_percent, None);
}

#[test]
fn optional_hooks_default_to_no_ops() {
    let mut e = Minimal::default();
    let msgs = convo();

    e.state.threshold_tokens = 100;
    assert!(e.should_compress(Some(100)));
    assert_eq!(
        e.should_compress_info(Some(100)),
        CompressDecision::plain(true)
    );
    assert_eq!(
        e.should_compress_info(Some(99)),
        CompressDecision::plain(false)
    );

    let (pruned, n) = e.prune_tool_results_only(&msgs, Some(10));
    assert!(matches!(pruned, Cow::Borrowed(p) if std::ptr::eq(p, msgs.as_slice())));
    assert_eq!(n, 0);

    assert_eq!(
        e.select_context(
            &SelectRequest::new(&msgs, &msgs)
                .with_incoming_message(&msgs[0])
                .with_budget_tokens(1000)
        ),
        None
    );
    assert!(!e.should_compress_preflight(&msgs));
    assert!(!e.should_defer_preflight_to_real_usage(1_000_000));
    assert!(e.has_content_to_compress(&[]));
    assert!(e.tool_schemas().is_empty());

    // Lifecycle observers leave the state alone.
    let before = e.state.clone();
    e.on_turn_complete(&msgs, None, &TurnInfo::default().with_interrupted(true));
    e.on_session_start("s1", &SessionInfo::default().with_platform("cli"));
    e.on_session_end("s1", &msgs);
    assert_eq!(e.state, before);

    assert_eq!(
        e.automatic_compaction_status(
            CompactionPhase::Preflight,
            "Compacting…",
            &CompactionStatusContext::default()
        ),
        Some("Compacting…".to_owned())
    );
}

#[test]
fn engines_work_as_trait_objects() {
    let mut boxed: Box<dyn ContextEngine> = Box::new(Minimal::default());
    boxed.update_from_response(&Usage::new(10, 5));
    let out = boxed
        .compress(&convo(), &CompressRequest::new())
        .unwrap()
        .messages;
    assert_eq!(out.len(), 2);
    assert_eq!(boxed.status().compression_count, 1);
    assert_eq!(boxed.name(), "minimal");
}

#[test]
fn unknown_tool_call_returns_a_parsable_json_error() {
    let mut e = Minimal::default();
    let msgs = convo();
    let out = e.handle_tool_call(
        "lcm_grep",
        &json!({"q": "x"}),
        &ToolCallContext::default().with_messages(&msgs),
    );
    let parsed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        parsed,
        json!({"error": "Unknown context engine tool: lcm_grep"})
    );
    // Names are escaped, not spliced into JSON.
    let parsed: Value = serde_json::from_str(&unknown_tool("a\"b")).unwrap();
    assert_eq!(parsed["error"], "Unknown context engine tool: a\"b");
}

#[test]
fn reset_zeroes_counters_but_keeps_configuration() {
    let mut e = Minimal::default();
    e.update_model(&ModelInfo::new("gpt-4o", 128_000));
    e.update_from_response(&Usage::new(90_000, 1_000));
    e.compress(&convo(), &CompressRequest::new()).unwrap();
    e.update_from_response(&Usage::new(20_000, 500));
    assert_eq!(e.state.compression_count, 1);

    e.on_session_reset();
    assert_eq!(e.state.last_prompt_tokens, PromptTokens::Known(0));
    assert_eq!(e.state.last_completion_tokens, 0);
    assert_eq!(e.state.last_total_tokens, 0);
    assert_eq!(e.state.compression_count, 0);
    assert_eq!(e.state.context_length, 128_000);
    assert_eq!(e.state.threshold_tokens, 96_000);
}

#[test]
fn reset_also_clears_the_awaiting_state() {
    let mut e = Minimal::default();
    e.compress(&convo(), &CompressRequest::new()).unwrap();
    assert_eq!(e.state.last_prompt_tokens, PromptTokens::AwaitingRealUsage);
    e.on_session_reset();
    assert_eq!(e.state.last_prompt_tokens, PromptTokens::Known(0));
}

#[test]
fn status_reports_usage_percent() {
    let mut e = Minimal::default();
    e.update_model(&ModelInfo::new("m", 200_000));
    e.update_from_response(&Usage::new(50_000, 10));
    let st = e.status();
    assert_eq!(st.last_prompt_tokens, 50_000);
    assert_eq!(st.usage_percent, 25.0);
    assert_eq!(st.threshold_tokens, 150_000);
    assert!(!st.awaiting_real_usage);
}

#[test]
fn status_clamps_to_100() {
    let mut e = Minimal::default();
    e.update_model(&ModelInfo::new("m", 1_000));
    e.update_from_response(&Usage::new(5_000, 10));
    assert_eq!(e.status().usage_percent, 100.0);
    assert_eq!(e.status().last_prompt_tokens, 5_000);
}

#[test]
fn status_is_zero_while_awaiting_real_usage() {
    let mut e = Minimal::default();
    e.update_model(&ModelInfo::new("m", 1_000));
    e.update_from_response(&Usage::new(900, 10));
    e.compress(&convo(), &CompressRequest::new()).unwrap();
    let st = e.status();
    assert!(st.awaiting_real_usage);
    assert_eq!(st.last_prompt_tokens, 0);
    assert_eq!(st.usage_percent, 0.0);
    assert_eq!(st.compression_count, 1);
    // Awaiting real usage never triggers compaction on a stale count...
    assert!(!e.should_compress(None));
    // ...and the next real report ends the state.
    e.update_from_response(&Usage::new(300, 10));
    assert!(!e.status().awaiting_real_usage);
    assert_eq!(e.status().usage_percent, 30.0);
}

#[test]
fn status_is_zero_when_context_length_unknown() {
    let mut e = Minimal::default();
    e.update_from_response(&Usage::new(5_000, 10));
    let st = e.status();
    assert_eq!(st.context_length, 0);
    assert_eq!(st.usage_percent, 0.0);
    assert_eq!(st.last_prompt_tokens, 5_000);
}

#[test]
fn status_serializes_with_the_reference_field_names() {
    let mut st = EngineState::default().status();
    st.extra.insert("dag_nodes".into(), json!(3));
    let v = serde_json::to_value(&st).unwrap();
    for key in [
        "last_prompt_tokens",
        "threshold_tokens",
        "context_length",
        "usage_percent",
        "compression_count",
        "awaiting_real_usage",
        "dag_nodes",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
}

fn overrides(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

#[test]
fn threshold_longest_substring_wins() {
    let o = overrides(&[("claude", 0.6), ("claude-3-5", 0.5), ("gpt", 0.9)]);
    assert_eq!(
        resolve_model_threshold("claude-3-5-sonnet", "", &o, 0.75),
        0.5
    );
    assert_eq!(resolve_model_threshold("claude-3-opus", "", &o, 0.75), 0.6);
    assert_eq!(resolve_model_threshold("llama-3", "", &o, 0.75), 0.75);
    // Case-insensitive.
    assert_eq!(resolve_model_threshold("Claude-3-Opus", "", &o, 0.75), 0.6);
}

#[test]
fn threshold_provider_scoped_beats_bare() {
    let o = overrides(&[("claude-3-5-sonnet", 0.5), ("openrouter:claude", 0.4)]);
    assert_eq!(
        resolve_model_threshold("anthropic/claude-3-5-sonnet", "openrouter", &o, 0.75),
        0.4
    );
    // Another provider only sees the bare key.
    assert_eq!(
        resolve_model_threshold("claude-3-5-sonnet", "anthropic", &o, 0.75),
        0.5
    );
    // Longest among scoped keys.
    let o = overrides(&[("openrouter:claude", 0.4), ("openrouter:claude-3-5", 0.3)]);
    assert_eq!(
        resolve_model_threshold("claude-3-5-haiku", "openrouter", &o, 0.75),
        0.3
    );
}

#[test]
fn threshold_keys_with_colons_are_bare_for_other_providers() {
    let o = overrides(&[("qwen2.5:7b", 0.5)]);
    assert_eq!(
        resolve_model_threshold("qwen2.5:7b", "ollama", &o, 0.75),
        0.5
    );
}

#[test]
fn threshold_ignores_invalid_overrides() {
    let o = overrides(&[("gpt", f64::NAN), ("gpt-4", -1.0)]);
    assert_eq!(resolve_model_threshold("gpt-4o", "", &o, 0.75), 0.75);
}

#[test]
fn repeated_model_switches_fall_back_to_configured_percent() {
    let mut e = Minimal::default();
    e.state.threshold_percent = 0.8;
    e.state.model_thresholds = overrides(&[("small", 0.5)]);

    e.update_model(&ModelInfo::new("small-model", 10_000));
    assert_eq!(e.state.threshold_percent, 0.5);
    assert_eq!(e.state.threshold_tokens, 5_000);
    assert_eq!(e.state.config_threshold_percent, Some(0.8));

    // Not the previous model's 0.5: the configured 0.8.
    e.update_model(&ModelInfo::new("big-model", 100_000));
    assert_eq!(e.state.threshold_percent, 0.8);
    assert_eq!(e.state.threshold_tokens, 80_000);

    e.update_model(&ModelInfo::new("small-model", 10_000).with_provider("x"));
    assert_eq!(e.state.threshold_tokens, 5_000);
    e.update_model(&ModelInfo::new("other", 10_000));
    assert_eq!(e.state.threshold_percent, 0.8);
}

#[test]
fn threshold_tokens_floor() {
    assert_eq!(threshold_tokens(1_001, 0.75), 750);
    assert_eq!(threshold_tokens(0, 0.75), 0);
    assert_eq!(threshold_tokens(1_000, f64::NAN), 0);
    let mut e = Minimal::default();
    e.update_model(&ModelInfo::new("m", 131_073));
    assert_eq!(e.state.threshold_tokens, 98_304); // floor(98304.75)
}

#[test]
fn model_info_debug_hides_the_api_key() {
    let info = ModelInfo::new("m", 1).with_api_key("sk-secret-value-123456");
    let dbg = format!("{info:?}");
    assert!(!dbg.contains("secret"), "{dbg}");
    assert!(dbg.contains("***"));
}

#[test]
fn status_message_suppressed_when_disabled() {
    let mut e = Minimal::default();
    let ctx = CompactionStatusContext::default()
        .with_approx_tokens(120)
        .with_threshold_tokens(100);
    assert_eq!(
        automatic_compaction_status_message(&e, CompactionPhase::Compress, "Compacting", &ctx),
        Some("Compacting".to_owned())
    );
    e.state.emit_automatic_compaction_status = false;
    assert_eq!(
        e.automatic_compaction_status(CompactionPhase::Compress, "Compacting", &ctx),
        None
    );
    assert_eq!(
        automatic_compaction_status_message(&e, CompactionPhase::Compress, "Compacting", &ctx),
        None
    );
}

#[test]
fn status_message_is_trimmed_and_blank_means_none() {
    let ctx = CompactionStatusContext::default();
    let mut e = Chatty {
        state: EngineState::default(),
        message: Some("  custom status \n".to_owned()),
    };
    let dynamic: &dyn ContextEngine = &e;
    assert_eq!(
        automatic_compaction_status_message(dynamic, CompactionPhase::Preflight, "default", &ctx),
        Some("custom status".to_owned())
    );
    e.message = Some(" \n\t".to_owned());
    assert_eq!(
        automatic_compaction_status_message(&e, CompactionPhase::Preflight, "default", &ctx),
        None
    );
    e.message = None;
    assert_eq!(
        automatic_compaction_status_message(&e, CompactionPhase::Preflight, "default", &ctx),
        None
    );
    // The switch wins over an overriding hook.
    e.message = Some("custom".to_owned());
    e.state.emit_automatic_compaction_status = false;
    assert_eq!(
        automatic_compaction_status_message(&e, CompactionPhase::Preflight, "default", &ctx),
        None
    );
    // A blank default message is no message either.
    assert_eq!(
        automatic_compaction_status_message(
            &Minimal::default(),
            CompactionPhase::Compress,
            "   ",
            &ctx
        ),
        None
    );
}

#[test]
fn compress_request_builder() {
    let r = CompressRequest::new()
        .with_current_tokens(5)
        .with_focus_topic("auth")
        .with_force(true)
        .with_memory_context("mem");
    assert_eq!(r.current_tokens, Some(5));
    assert_eq!(r.focus_topic.as_deref(), Some("auth"));
    assert!(r.force);
    assert_eq!(r.memory_context, "mem");
    let d = CompressRequest::default();
    assert_eq!(d.current_tokens, None);
    assert!(!d.force);
    assert!(d.memory_context.is_empty());
}

#[test]
fn block_reasons_display_and_serialize() {
    let d = CompressDecision::blocked(BlockReason::Cooldown { seconds_left: 42 });
    assert!(!d.should_compress);
    let v = serde_json::to_value(&d).unwrap();
    assert_eq!(
        v["block_reason"],
        json!({"kind": "cooldown", "seconds_left": 42})
    );
    assert_eq!(
        BlockReason::Cooldown { seconds_left: 42 }.to_string(),
        "summarizer cooling down, retry in 42s"
    );
    let r = BlockReason::Ineffective {
        attempts: 2,
        last_savings_percent: 3.25,
    };
    assert!(r.to_string().contains("3.2"), "{r}");
}

#[test]
fn errors_carry_context() {
    let e = EngineError::InvalidOutput {
        engine: "dag".into(),
        violation: crate::validate::Violation::new(
            4,
            crate::validate::Rule::OrphanToolResult,
            "tool result without a matching call",
        ),
    };
    assert_eq!(
        e.to_string(),
        "engine `dag` produced an invalid transcript at message 4: orphan-tool-result: tool result without a matching call"
    );
    assert_eq!(e.engine(), "dag");
    match &e {
        EngineError::InvalidOutput { violation, .. } => {
            assert_eq!(violation.rule, crate::validate::Rule::OrphanToolResult);
        }
        other => panic!("{other:?}"),
    }
    let io = std::io::Error::other("timeout");
    let e = EngineError::Summarizer {
        engine: "compressor".into(),
        reason: "summary call failed".into(),
        cooldown_seconds: Some(60),
        source: Some(Box::new(io)),
    };
    let source = std::error::Error::source(&e).map(ToString::to_string);
    assert_eq!(source.as_deref(), Some("timeout"));
}

// -- Usage ------------------------------------------------------------------

#[test]
fn usage_from_openai_with_details() {
    let u = Usage::from_openai(&json!({
        "prompt_tokens": 1689, "completion_tokens": 76, "total_tokens": 1765,
        "completion_tokens_details": {"reasoning_tokens": 30},
        "prompt_tokens_details": {"cached_tokens": 1664}
    }))
    .unwrap();
    assert_eq!(u.prompt_tokens, 1689);
    assert_eq!(u.completion_tokens, 76);
    assert_eq!(u.total_tokens, 1765);
    assert_eq!(u.cache_read_tokens, Some(1664));
    assert_eq!(u.cache_write_tokens, None);
    assert_eq!(u.input_tokens, Some(25));
    assert_eq!(u.output_tokens, Some(76));
    assert_eq!(u.reasoning_tokens, Some(30));
}

#[test]
fn usage_null_details_are_absent() {
    let u = Usage::from_openai(&json!({
        "prompt_tokens": 10, "completion_tokens": 2,
        "completion_tokens_details": null, "prompt_tokens_details": null
    }))
    .unwrap();
    assert_eq!(u.total_tokens, 12);
    assert_eq!(u.reasoning_tokens, None);
    assert_eq!(u.cache_read_tokens, None);
    assert_eq!(u.input_tokens, Some(10));
}

#[test]
fn usage_from_anthropic_adds_cache_to_prompt() {
    let u = Usage::from_openai(&json!({
        "input_tokens": 100, "output_tokens": 20,
        "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 50
    }))
    .unwrap();
    assert_eq!(u.prompt_tokens, 1150);
    assert_eq!(u.input_tokens, Some(100));
    assert_eq!(u.cache_read_tokens, Some(1000));
    assert_eq!(u.cache_write_tokens, Some(50));
    assert_eq!(u.completion_tokens, 20);
    assert_eq!(u.total_tokens, 1170);
}

#[test]
fn usage_from_responses_api_input_includes_cache() {
    let u = Usage::from_openai(&json!({
        "input_tokens": 500, "output_tokens": 40, "total_tokens": 540,
        "input_tokens_details": {"cached_tokens": 300},
        "output_tokens_details": {"reasoning_tokens": 10}
    }))
    .unwrap();
    assert_eq!(u.prompt_tokens, 500);
    assert_eq!(u.input_tokens, Some(200));
    assert_eq!(u.cache_read_tokens, Some(300));
    assert_eq!(u.reasoning_tokens, Some(10));
}

#[test]
fn usage_errors_name_the_field() {
    assert_eq!(
        Usage::from_openai(&json!([1])),
        Err(UsageError::NotAnObject { found: "an array" })
    );
    assert_eq!(
        Usage::from_openai(&json!({"completion_tokens": 1})),
        Err(UsageError::MissingField {
            field: "prompt_tokens"
        })
    );
    let err =
        Usage::from_openai(&json!({"prompt_tokens": -3, "completion_tokens": 1})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "usage field `prompt_tokens` must be a non-negative integer, found -3"
    );
    let err = Usage::from_openai(&json!({
        "prompt_tokens": 3, "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": "x"}
    }))
    .unwrap_err();
    assert!(matches!(
        err,
        UsageError::NotACount {
            field: "prompt_tokens_details.cached_tokens",
            ..
        }
    ));
}

#[test]
fn usage_serde_round_trip_skips_absent_buckets() {
    let u = Usage::new(3, 4);
    let v = serde_json::to_value(u).unwrap();
    assert_eq!(
        v,
        json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})
    );
    let back: Usage = serde_json::from_value(v).unwrap();
    assert_eq!(back, u);
}

#[test]
fn usage_from_corpus_provider_responses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/mini_astropy12907.traj.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("skipping: corpus file {} not found", path.display());
        return;
    };
    let doc: Value = serde_json::from_str(&text).unwrap();
    let mut seen = 0;
    for msg in doc["messages"].as_array().unwrap() {
        let usage = &msg["extra"]["response"]["usage"];
        if usage.is_null() {
            continue;
        }
        let u = Usage::from_openai(usage).unwrap();
        assert_eq!(u.prompt_tokens, usage["prompt_tokens"].as_u64().unwrap());
        assert_eq!(u.total_tokens, u.prompt_tokens + u.completion_tokens);
        let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64();
        assert_eq!(u.cache_read_tokens, cached);
        assert!(u.input_tokens.unwrap() <= u.prompt_tokens);
        seen += 1;
    }
    assert!(seen > 0, "no usage found in {}", path.display());
}

// -- Memory context -----------------------------------------------------------

#[test]
fn sanitize_short_context_is_trimmed_and_redacted() {
    let out = sanitize_memory_context("  token sk-abcdefghijklmnopqrstuvwx  \n");
    assert_eq!(out, "token sk-abc...uvwx");
    // URL credentials are always masked here: the password goes, the user
    // name, host and path stay; a bare token as user name goes whole.
    let out = sanitize_memory_context("db postgres://u:pw@h/db");
    assert_eq!(out, "db postgres://u:***@h/db");
    let out = sanitize_memory_context("git https://ghp_abcdef0123456789@github.com/a/b");
    assert!(!out.contains("ghp_abcdef0123456789"), "{out}");
    assert!(out.ends_with("@github.com/a/b"), "{out}");
}

#[test]
fn sanitize_keeps_exactly_max_chars() {
    let text = "x".repeat(MEMORY_CONTEXT_MAX_CHARS);
    assert_eq!(sanitize_memory_context(&text), text);
}

#[test]
fn sanitize_truncates_head_and_tail() {
    let text = format!(
        "{}{}{}",
        "h".repeat(MEMORY_CONTEXT_HEAD_CHARS),
        "m".repeat(1_000),
        "t".repeat(MEMORY_CONTEXT_TAIL_CHARS)
    );
    let out = sanitize_memory_context(&text);
    let expected = format!(
        "{}{}{}",
        "h".repeat(4_000),
        MEMORY_CONTEXT_TRUNCATION_MARKER,
        "t".repeat(1_500)
    );
    assert_eq!(out, expected);
}

#[test]
fn sanitize_counts_characters_not_bytes() {
    // 7000 chars of 1-4 byte characters: over the limit in chars and bytes.
    let alphabet = ['a', 'é', '中', '🦀'];
    let text: String = (0..7_000).map(|i| alphabet[i % 4]).collect();
    let out = sanitize_memory_context(&text);
    let (head, tail) = out.split_once(MEMORY_CONTEXT_TRUNCATION_MARKER).unwrap();
    assert_eq!(head.chars().count(), 4_000);
    assert_eq!(tail.chars().count(), 1_500);
    let chars: Vec<char> = text.chars().collect();
    assert_eq!(head, chars[..4_000].iter().collect::<String>());
    assert_eq!(tail, chars[7_000 - 1_500..].iter().collect::<String>());

    // 3000 four-byte chars = 12000 bytes but only 3000 chars: untouched.
    let wide = "🦀".repeat(3_000);
    assert_eq!(sanitize_memory_context(&wide), wide);
}

proptest::proptest! {
    // Long inputs are slow in debug builds; 64 cases still cover the cut.
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn sanitize_is_bounded_and_utf8_safe(text in "\\PC{0,7000}") {
        let out = sanitize_memory_context(&text);
        let max = MEMORY_CONTEXT_HEAD_CHARS
            + MEMORY_CONTEXT_TRUNCATION_MARKER.chars().count()
            + MEMORY_CONTEXT_TAIL_CHARS;
        proptest::prop_assert!(out.chars().count() <= max.max(MEMORY_CONTEXT_MAX_CHARS));
        if text.trim().chars().count() <= MEMORY_CONTEXT_MAX_CHARS {
            proptest::prop_assert!(!out.contains(MEMORY_CONTEXT_TRUNCATION_MARKER));
        }
    }
}

/// A third-party engine that keeps the default `update_model` and the
/// built-in compressor compute the same threshold, reply reserve and
/// small-window rule included.
#[test]
fn default_update_model_and_the_compressor_share_the_threshold_policy() {
    use crate::compressor::{Compressor, CompressorOptions};
    use crate::tokens::{BpeCounter, Encoding};
    use std::sync::Arc;

    let mut overrides = BTreeMap::new();
    overrides.insert("mini".to_owned(), 0.5);
    let mut options = CompressorOptions::default().with_max_tokens(4_096);
    options.model_thresholds = overrides.clone();
    let counter = Arc::new(BpeCounter::new(Encoding::O200kBase));
    let mut compressor = Compressor::with_options(counter, 0, options);
    let mut third = Minimal {
        state: EngineState::new(0, DEFAULT_THRESHOLD_PERCENT, Some(4_096))
            .with_model_thresholds(overrides),
    };
    // Large window, a small one where the reserve eats it (85% rule), an
    // override, and back.
    for model in [
        ModelInfo::new("gpt-4o", 128_000),
        ModelInfo::new("tiny", 4_096),
        ModelInfo::new("gpt-4o-mini", 32_000),
        ModelInfo::new("gpt-4o", 128_000),
    ] {
        compressor.update_model(&model);
        third.update_model(&model);
        assert_eq!(
            third.state().threshold_tokens,
            compressor.state().threshold_tokens,
            "{}",
            model.model
        );
    }
    assert_eq!(
        third.state().threshold_tokens,
        compaction_threshold(128_000, DEFAULT_THRESHOLD_PERCENT, Some(4_096))
    );
    third.update_model(&ModelInfo::new("tiny", 4_096));
    assert_eq!(
        third.state().threshold_tokens,
        3_481,
        "85% of a reserve-eaten window"
    );
    third.update_model(&ModelInfo::new("gpt-4o-mini", 32_000));
    assert_eq!(third.state().threshold_tokens, (32_000 - 4_096) / 2);
}

/// The report derived from input and output names the kept head and tail
/// and the replaced span, by input index.
#[test]
fn compaction_from_diff_names_the_summarized_span() {
    let counter = crate::tokens::BpeCounter::new(crate::tokens::Encoding::O200kBase);
    let input: Vec<Message> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                Message::user(format!("ask {i}"))
            } else {
                Message::assistant(format!("answer {i}"))
            }
        })
        .collect();
    let mut output = input[..2].to_vec();
    output.push(Message::user("summary of 2..6"));
    output.extend_from_slice(&input[6..]);
    let c = Compaction::from_diff(&input, output.clone(), &counter, 1_000);
    assert_eq!(c.messages, output);
    let r = &c.report;
    assert_eq!(r.outcome, Outcome::Compacted);
    assert_eq!(r.head, Some(Span::new(0, 2)));
    assert_eq!(r.tail, Some(Span::new(6, 8)));
    assert_eq!(r.summarized, Some(Span::new(2, 6)));
    assert_eq!(r.summarized_messages, 4);
    assert_eq!((r.messages_before, r.messages_after), (8, 5));
    assert!(r.tokens_after < r.tokens_before);
    // A prefix and suffix never overlap, even when the output repeats.
    let same = Compaction::from_diff(&input, input[..3].to_vec(), &counter, 0);
    assert_eq!(same.report.summarized, Some(Span::new(3, 8)));
    assert_eq!(same.report.tail, Some(Span::new(8, 8)));
}

/// A failure becomes a report of the unchanged input, its reason without
/// the engine prefix the error's own text carries.
#[test]
fn failed_report_keeps_the_input_and_the_reason() {
    let counter = crate::tokens::BpeCounter::new(crate::tokens::Encoding::O200kBase);
    let err = EngineError::Summarizer {
        engine: "compressor".into(),
        reason: "cannot reach the summarizer".into(),
        cooldown_seconds: Some(60),
        source: None,
    };
    let r = CompactionReport::failed(&err, &convo(), &counter, 10);
    assert_eq!(r.outcome, Outcome::Aborted);
    assert_eq!(r.messages_before, r.messages_after);
    assert_eq!(r.tokens_before, r.tokens_after);
    assert_eq!(r.reason.as_deref(), Some("cannot reach the summarizer"));
    assert_eq!(r.cooldown_seconds, Some(60));
    assert!(!r.outcome.changed());
}

#[test]
fn model_windows_match_like_thresholds() {
    let windows: BTreeMap<String, u64> = [
        ("gpt-4o".to_owned(), 128_000),
        ("gpt-4o-mini".to_owned(), 64_000),
        ("openrouter:gpt".to_owned(), 32_000),
        ("zero".to_owned(), 0),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        resolve_model_window("GPT-4o-2024", "", &windows),
        Some(128_000)
    );
    assert_eq!(
        resolve_model_window("gpt-4o-mini", "", &windows),
        Some(64_000)
    );
    assert_eq!(
        resolve_model_window("gpt-4o", "openrouter", &windows),
        Some(32_000)
    );
    assert_eq!(resolve_model_window("zero-model", "", &windows), None);
    assert_eq!(resolve_model_window("llama", "", &windows), None);
}
