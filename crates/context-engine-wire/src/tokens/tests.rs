use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::message::{ContentPart, Message, ToolCall};

fn o200k() -> BpeCounter {
    BpeCounter::new(Encoding::O200kBase)
}

fn cl100k() -> BpeCounter {
    BpeCounter::new(Encoding::Cl100kBase)
}

/// The other crate's count, as an independent reference.
fn tiktoken_count(encoding: Encoding, text: &str) -> usize {
    let bpe = match encoding {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
    };
    bpe.count_ordinary(text)
}

fn msg(v: Value) -> Message {
    Message::from_value(v).unwrap()
}

#[test]
fn hello_world_is_two_tokens_in_both_encodings() {
    assert_eq!(o200k().count_text("hello world"), 2);
    assert_eq!(cl100k().count_text("hello world"), 2);
    assert_eq!(o200k().count_text(""), 0);
}

#[test]
fn bpe_crates_agree_on_tricky_texts() {
    let texts = [
        "tiktoken is great!",
        "antidisestablishmentarianism",
        "  leading spaces and trailing   \n\n\n",
        "def f(x):\n\treturn x**2  # square\r\n",
        "1234567890 3.14159 -42",
        "日本語のテキスト、中文文本, 한국어",
        "emoji 🎉🚀 and combining é (e\u{301})",
        "<|endoftext|> is ordinary text here <|im_start|>",
        "He's, they'll, I'M, WE'D",
        "{\"command\": \"cd /testbed && grep -rn \\\"foo\\\" .\"}",
    ];
    for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let ours = BpeCounter::new(enc);
        for t in texts {
            assert_eq!(ours.count_text(t), tiktoken_count(enc, t), "{enc:?}: {t:?}");
        }
    }
    // Two well-known values, from tiktoken's documentation examples.
    assert_eq!(cl100k().count_text("tiktoken is great!"), 6);
    assert_ne!(
        o200k().count_text("日本語のテキスト"),
        cl100k().count_text("日本語のテキスト"),
        "the encodings differ on CJK"
    );
}

/// The example of OpenAI's "How to count tokens with tiktoken" cookbook, for
/// which the API reported 129 prompt tokens on gpt-4/gpt-3.5-turbo and 124
/// on gpt-4o: the message overhead rules reproduce the provider's numbers.
#[test]
fn cookbook_example_matches_provider_reported_counts() {
    let messages: Vec<Message> = [
        json!({"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."}),
        json!({"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."}),
        json!({"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."}),
        json!({"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."}),
        json!({"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."}),
        json!({"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable."}),
    ]
    .into_iter()
    .map(msg)
    .collect();
    assert_eq!(
        BpeCounter::for_model("gpt-4-0613").count_messages(&messages),
        129
    );
    assert_eq!(
        BpeCounter::for_model("gpt-3.5-turbo").count_messages(&messages),
        129
    );
    assert_eq!(
        BpeCounter::for_model("gpt-4o").count_messages(&messages),
        124
    );
}

#[test]
fn message_overhead_rules() {
    let c = o200k();
    let t = |s: &str| c.count_text(s);
    let user = Message::user("hello world");
    // 3 framing + "user" + content.
    assert_eq!(c.count_message(&user), 3 + t("user") + 2);
    let mut named = user.clone();
    named.name = Some("alice".into());
    assert_eq!(
        c.count_message(&named),
        c.count_message(&user) + 1 + t("alice")
    );
    // The request adds 3 priming tokens once.
    assert_eq!(
        c.count_messages(&[user.clone(), user.clone()]),
        2 * c.count_message(&user) + 3
    );
    assert_eq!(c.count_messages(&[]), 3);
    // Null content costs nothing beyond the framing.
    let empty = msg(json!({"role": "assistant", "content": null}));
    assert_eq!(c.count_message(&empty), 3 + t("assistant"));
}

#[test]
fn tool_calls_results_and_reasoning_are_billed() {
    let c = o200k();
    let t = |s: &str| c.count_text(s);
    let base = 3 + t("assistant");
    let args = r#"{"command": "ls -la"}"#;
    let call = Message::assistant_tool_calls("", vec![ToolCall::function("call_1", "bash", args)]);
    assert_eq!(c.count_message(&call), base + 3 + t("bash") + t(args));
    let two = Message::assistant_tool_calls(
        "",
        vec![
            ToolCall::function("call_1", "bash", args),
            ToolCall::function("call_2", "bash", args),
        ],
    );
    assert_eq!(c.count_message(&two), base + 2 * (3 + t("bash") + t(args)));

    let result = Message::tool_result("call_1", "file.txt");
    assert_eq!(
        c.count_message(&result),
        3 + t("tool") + t("file.txt") + t("call_1")
    );

    let legacy = msg(json!({"role": "assistant", "content": null,
        "function_call": {"name": "bash", "arguments": args}}));
    assert_eq!(c.count_message(&legacy), base + 3 + t("bash") + t(args));

    let mut thinking = Message::assistant("ok");
    thinking.reasoning_content = Some("Let me think about this carefully.".into());
    let with = c.count_message(&thinking);
    assert_eq!(
        with,
        base + t("ok") + t("Let me think about this carefully.")
    );
    let without = BpeCounter::with_options(
        Encoding::O200kBase,
        CountOptions {
            count_reasoning: false,
            ..CountOptions::default()
        },
    );
    assert_eq!(without.count_message(&thinking), base + t("ok"));
}

#[test]
fn unknown_extra_fields_are_not_counted() {
    let c = o200k();
    let plain = msg(json!({"role": "user", "content": "hi"}));
    let noisy = msg(json!({"role": "user", "content": "hi",
        "extra": {"response": {"usage": {"prompt_tokens": 10}}, "huge": "x".repeat(10_000)},
        "thought": "internal"}));
    assert_eq!(c.count_message(&noisy), c.count_message(&plain));
}

#[test]
fn parts_images_audio_and_files_use_per_part_costs() {
    let c = o200k();
    let t = |s: &str| c.count_text(s);
    let parts = msg(json!({"role": "user", "content": [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "And this one?"},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/x.png", "detail": "low"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-1"}},
        {"type": "input_text", "text": "more"},
        {"type": "mystery"}
    ]}));
    let texts = t("What is in this image?") + t("And this one?") + t("more");
    assert_eq!(c.count_message(&parts), 3 + t("user") + texts + 4 * 1600);
    let custom = BpeCounter::with_options(
        Encoding::O200kBase,
        CountOptions {
            image_part: 85,
            audio_part: 10,
            file_part: 7,
            ..CountOptions::default()
        },
    );
    assert_eq!(
        custom.count_message(&parts),
        3 + t("user") + texts + 2 * 85 + 10 + 7
    );
    // The image's base64 payload is never tokenized as text.
    let mut one = Message::user("");
    one.content = crate::message::Content::Parts(vec![ContentPart::new_image_url(format!(
        "data:image/png;base64,{}",
        "A".repeat(100_000)
    ))]);
    assert_eq!(c.count_message(&one), 3 + t("user") + 1600);
}

#[test]
fn tool_schemas_are_counted_as_compact_json() {
    let c = o200k();
    let def = json!({"name": "bash", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}});
    let tool = json!({"type": "function", "function": def.clone()});
    let one = c.count_tools(std::slice::from_ref(&tool));
    assert_eq!(one, 3 + 3 + c.count_text(&def.to_string()));
    // A bare definition counts the same as its wrapped form.
    assert_eq!(c.count_tools(std::slice::from_ref(&def)), one);
    assert_eq!(
        c.count_tools(&[tool.clone(), tool]),
        one + 3 + c.count_text(&def.to_string())
    );
    assert_eq!(c.count_tools(&[]), 0);
}

#[test]
fn model_names_map_to_encodings() {
    let o = Some(Encoding::O200kBase);
    let cl = Some(Encoding::Cl100kBase);
    for (model, want) in [
        ("gpt-4o", o),
        ("gpt-4o-mini-2024-07-18", o),
        ("chatgpt-4o-latest", o),
        ("gpt-4.1-nano", o),
        ("gpt-4.5-preview", o),
        ("gpt-5", o),
        ("gpt-5-mini", o),
        ("o1-preview", o),
        ("o3-mini", o),
        ("o4-mini", o),
        ("openai/gpt-4o", o),
        ("OpenAI/GPT-4.1", o),
        ("ft:gpt-4o-mini:acme::abc123", o),
        ("gpt-4", cl),
        ("gpt-4-0613", cl),
        ("gpt-4-turbo", cl),
        ("azure:gpt-4", cl),
        ("gpt-3.5-turbo", cl),
        ("azure/gpt-35-turbo", cl),
        ("text-embedding-3-small", cl),
        ("deepseek/deepseek-chat", None),
        ("claude-3-5-sonnet", None),
        ("", None),
    ] {
        assert_eq!(Encoding::for_model(model), want, "{model}");
    }
    assert_eq!(Encoding::O200kBase.name(), "o200k_base");
}

#[test]
fn unknown_models_use_o200k_with_safety_factor() {
    let exact = BpeCounter::for_model("gpt-4o");
    assert_eq!(exact.factor(), 1.0);
    let unknown = BpeCounter::for_model("deepseek/deepseek-chat");
    assert_eq!(unknown.encoding(), Encoding::O200kBase);
    assert_eq!(unknown.factor(), 1.1);
    let text = ["The quick brown fox jumps over the lazy dog."; 10].join(" ");
    let raw = exact.count_text(&text);
    assert_eq!(raw, 100);
    assert_eq!(unknown.count_text(&text), 110);
    let m = Message::user(text.clone());
    assert_eq!(
        unknown.count_message(&m),
        (exact.count_message(&m) as f64 * 1.1).ceil() as usize
    );
    let custom = BpeCounter::for_model_with(
        "mystery-model",
        CountOptions {
            unknown_model_factor: 1.5,
            ..CountOptions::default()
        },
    );
    assert_eq!(custom.count_text(&text), 150);
}

#[test]
fn estimator_is_chars_over_four_rounded_up() {
    let e = EstimateCounter::default();
    assert_eq!(e.count_text(""), 0);
    assert_eq!(e.count_text("abc"), 1);
    assert_eq!(e.count_text("abcd"), 1);
    assert_eq!(e.count_text("abcde"), 2);
    // Characters, not bytes.
    assert_eq!(e.count_text("日本語の"), 1);
    // Same overhead rules: 3 + "user" (1) + "hello world" (3).
    assert_eq!(e.count_message(&Message::user("hello world")), 7);
    assert_eq!(e.count_messages(&[Message::user("hello world")]), 10);
}

#[test]
fn counters_work_as_shared_trait_objects() {
    let counters: Vec<Arc<dyn TokenCounter>> = vec![
        Arc::new(o200k()),
        Arc::new(EstimateCounter::default()),
        counter_for_model("gpt-4o"),
    ];
    let m = [Message::user("hello world")];
    let counts: Vec<usize> = counters.iter().map(|c| c.count_messages(&m)).collect();
    assert_eq!(counts, vec![3 + 1 + 2 + 3, 3 + 1 + 3 + 3, 9]);
    let shared = counters[2].clone();
    let handle = std::thread::spawn(move || shared.count_text("hello world"));
    assert_eq!(handle.join().unwrap(), 2);
}

#[test]
fn cache_counts_only_new_messages() {
    let cached = CachedCounter::new(o200k());
    let mut transcript = vec![
        Message::system("You are helpful."),
        Message::user("List the files."),
        Message::assistant_tool_calls(
            "",
            vec![ToolCall::function("c1", "bash", "{\"command\":\"ls\"}")],
        ),
        Message::tool_result("c1", "a.txt\nb.txt"),
    ];
    let first = cached.count_messages(&transcript);
    assert_eq!(first, o200k().count_messages(&transcript));
    assert_eq!(
        cached.stats(),
        CacheStats {
            hits: 0,
            misses: 4,
            entries: 4
        }
    );
    transcript.push(Message::assistant("Two files."));
    let second = cached.count_messages(&transcript);
    assert_eq!(second, o200k().count_messages(&transcript));
    let s = cached.stats();
    assert_eq!((s.hits, s.misses, s.entries), (4, 5, 5));

    // An unbilled field does not change the key; a billed one does.
    let mut noted = transcript[1].clone();
    noted.extra.insert("timestamp".into(), json!(123));
    cached.count_message(&noted);
    assert_eq!(cached.stats().hits, 5);
    let mut edited = transcript[1].clone();
    edited.content = crate::message::Content::Text("List the files!".into());
    cached.count_message(&edited);
    assert_eq!(cached.stats().misses, 6);

    cached.clear();
    assert_eq!(cached.stats(), CacheStats::default());
    cached.count_messages(&transcript);
    assert_eq!(cached.stats().misses, 5);
}

#[test]
fn cache_keys_separate_fields() {
    // Same bytes in different fields must not collide.
    let a = msg(json!({"role": "user", "content": "ab", "name": "c"}));
    let b = msg(json!({"role": "user", "content": "a", "name": "bc"}));
    let c = msg(json!({"role": "user", "content": "abc"}));
    let d = msg(json!({"role": "user", "content": [{"type": "text", "text": "abc"}]}));
    let e = msg(json!({"role": "user"}));
    let f = msg(json!({"role": "user", "content": null}));
    let hashes: std::collections::HashSet<u128> = [&a, &b, &c, &d, &e, &f]
        .iter()
        .map(|m| message_hash(m))
        .collect();
    assert_eq!(hashes.len(), 6);
    assert_eq!(message_hash(&a), message_hash(&a.clone()));
}

#[test]
fn cache_is_bounded() {
    let cached = CachedCounter::with_capacity(EstimateCounter::default(), 16);
    for i in 0..1000 {
        cached.count_message(&Message::user(format!("message {i}")));
    }
    let s = cached.stats();
    assert_eq!(s.misses, 1000);
    assert!(s.entries <= 32, "{} entries", s.entries);
}

#[test]
fn cache_is_shared_across_threads() {
    let cached = Arc::new(CachedCounter::new(o200k()));
    let transcript: Vec<Message> = (0..50).map(|i| Message::user(format!("m{i}"))).collect();
    let want = o200k().count_messages(&transcript);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let c = cached.clone();
            let t = transcript.clone();
            std::thread::spawn(move || c.count_messages(&t))
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), want);
    }
    let s = cached.stats();
    assert_eq!(s.hits + s.misses, 200);
    assert!(s.misses >= 50 && s.hits >= 50, "{s:?}");
}

fn with_usage(mut m: Message, prompt_tokens: u64) -> Message {
    m.extra.insert(
        "extra".into(),
        json!({"response": {"model": "test-model", "usage": {"prompt_tokens": prompt_tokens}}}),
    );
    m
}

#[test]
fn recorded_usage_is_read_from_known_places() {
    let m = with_usage(Message::assistant("x"), 42);
    assert_eq!(recorded_prompt_tokens(&m), Some(42));
    assert_eq!(recorded_model(&m), Some("test-model"));
    let inline = msg(json!({"role": "assistant", "content": "x", "usage": {"prompt_tokens": 7}}));
    assert_eq!(recorded_prompt_tokens(&inline), Some(7));
    let nested = msg(json!({"role": "assistant", "extra": {"usage": {"input_tokens": 9}}}));
    assert_eq!(recorded_prompt_tokens(&nested), Some(9));
    assert_eq!(recorded_prompt_tokens(&Message::assistant("x")), None);
    let bad = msg(json!({"role": "assistant", "usage": {"prompt_tokens": "many"}}));
    assert_eq!(recorded_prompt_tokens(&bad), None);
}

#[test]
fn calibration_on_synthetic_transcript() {
    // With the estimator a message costs 3 framing + role (chars/4: system
    // 2, user 1, assistant 3) + 1 for a four-char content; a request 3 more.
    let e = EstimateCounter::default();
    let transcript = vec![
        Message::system("abcd"),                    // 0: 6
        Message::user("abcd"),                      // 1: 5
        with_usage(Message::assistant("abcd"), 24), // 2: ours 3 + 11 = 14; 7
        Message::user("abcd"),                      // 3: 5
        with_usage(Message::assistant("abcd"), 36), // 4: ours 14 + 12 = 26
        Message::user("abcd"),                      // 5
        with_usage(Message::assistant("abcd"), 48), // 6: ours 38
    ];
    assert_eq!(e.count_message(&transcript[0]), 6);
    assert_eq!(e.count_message(&transcript[2]), 7);
    let r = calibrate(&e, &transcript).unwrap();
    assert_eq!(r.calls, 3);
    let counted: Vec<u64> = r.points.iter().map(|p| p.counted).collect();
    assert_eq!(counted, vec![14, 26, 38]);
    assert_eq!(r.points[0].index, 2);
    assert_eq!(r.mean_signed_error, -10.0);
    let pcts = [10.0 / 24.0, 10.0 / 36.0, 10.0 / 48.0].map(|x| 100.0 * x);
    assert!((r.mean_abs_pct_error - pcts.iter().sum::<f64>() / 3.0).abs() < 1e-9);
    assert!((r.max_abs_pct_error - pcts[0]).abs() < 1e-9);
    assert_eq!(r.median_offset, 10.0);
    assert_eq!(r.mean_abs_pct_error_after_offset, 0.0);
    assert_eq!(r.max_abs_pct_error_after_offset, 0.0);
    assert!((r.fit_slope - 1.0).abs() < 1e-12 && (r.fit_intercept - 10.0).abs() < 1e-9);
    assert!(r.mean_abs_pct_error_after_fit < 1e-9);
    // The prefix of call i is exactly what count_messages says.
    assert_eq!(
        e.count_messages(&transcript[..4]) as u64,
        r.points[1].counted
    );

    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["median_offset"], json!(10.0));
    let back: CalibrationReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, r);

    assert_eq!(
        calibrate(&e, &transcript[..2]),
        Err(CalibrationError::NoRecordedUsage { messages: 2 })
    );
}

fn corpus_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipping: corpus not found at {}", dir.display());
        None
    }
}

fn corpus_messages(v: &Value) -> Vec<Message> {
    let list = v
        .get("messages")
        .or_else(|| v.get("history"))
        .unwrap_or(v)
        .as_array()
        .cloned()
        .unwrap_or_default();
    list.into_iter().map(msg).collect()
}

/// Every text of every corpus file counts the same with both BPE crates.
#[test]
fn corpus_counts_agree_between_bpe_crates() {
    let Some(dir) = corpus_dir() else { return };
    let mut texts = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().contains(".traj") {
            continue;
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for m in corpus_messages(&v) {
            let mut pieces = vec![m.text().into_owned()];
            pieces.extend(
                m.tool_calls()
                    .iter()
                    .filter_map(|c| c.function.as_ref())
                    .map(|f| f.arguments.clone()),
            );
            for t in pieces {
                for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
                    assert_eq!(
                        BpeCounter::new(enc).count_text(&t),
                        tiktoken_count(enc, &t),
                        "{enc:?} in {}",
                        path.display()
                    );
                }
                texts += 1;
            }
        }
    }
    assert!(texts > 100, "only {texts} texts");
}

#[test]
fn corpus_calibration_against_recorded_usage() {
    let Some(dir) = corpus_dir() else { return };
    let text = std::fs::read_to_string(dir.join("mini_astropy12907.traj.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let messages = corpus_messages(&v);
    let model = messages.iter().find_map(recorded_model).unwrap();
    assert!(model.starts_with("deepseek"), "{model}");
    let counter = CachedCounter::new(BpeCounter::new(Encoding::O200kBase));
    let report = calibrate(&counter, &messages).unwrap();
    eprintln!(
        "{model} vs o200k: {}",
        serde_json::to_string(&CalibrationReport {
            points: vec![],
            ..report.clone()
        })
        .unwrap()
    );
    assert_eq!(report.calls, 64);
    // Counts grow with the transcript, as the provider's do.
    assert!(
        report
            .points
            .windows(2)
            .all(|w| w[0].counted < w[1].counted)
    );
    // A different vendor's tokenizer and template, but the same text: the
    // counts stay within a few percent once the constant part is removed.
    assert!(report.mean_abs_pct_error_after_offset < 10.0, "{report:?}");
    assert!(report.median_offset.abs() < 2000.0, "{report:?}");
    // DeepSeek's tokenizer is close to o200k: a line fits within ~1 %.
    assert!((0.9..1.2).contains(&report.fit_slope), "{report:?}");
    assert!(report.mean_abs_pct_error_after_fit < 3.0, "{report:?}");
}
