use super::*;
use context_engine::summarize::openai::DEFAULT_SEED;

fn config() -> OpenAiConfig {
    OpenAiConfig::new("http://127.0.0.1:9/v1/", "m")
}

#[test]
fn missing_base_url_model_or_key_is_not_configured() {
    let cases = [
        OpenAiSummarizer::with_env(OpenAiConfig::default(), |_| Some("k".into())),
        OpenAiSummarizer::with_env(OpenAiConfig::new("http://127.0.0.1:9/v1", " "), |_| {
            Some("k".into())
        }),
        OpenAiSummarizer::with_env(config(), |_| None),
        OpenAiSummarizer::with_env(config(), |_| Some("  ".into())),
        OpenAiSummarizer::with_env(OpenAiConfig::new("ftp://x/v1", "m"), |_| Some("k".into())),
    ];
    for case in cases {
        assert!(
            matches!(case, Err(SummarizeError::NotConfigured(_))),
            "{case:?}"
        );
    }
}

#[test]
fn key_comes_from_the_named_variable_and_never_shows_in_debug() {
    let mut asked = String::new();
    let s = OpenAiSummarizer::with_env(config().with_api_key_env("MY_KEY"), |name| {
        asked = name.to_owned();
        Some("sk-secret-123".into())
    })
    .unwrap();
    assert_eq!(asked, "MY_KEY");
    assert_eq!(s.endpoint(), "http://127.0.0.1:9/v1/chat/completions");
    assert_eq!(s.name(), "openai:m");
    let debug = format!("{s:?} {:?}", config().with_api_key("sk-secret-123"));
    assert!(!debug.contains("sk-secret"), "{debug}");
    assert!(debug.contains("<hidden>"));
}

#[test]
fn explicit_key_wins_over_the_environment() {
    let s = OpenAiSummarizer::with_env(config().with_api_key("explicit"), |_| {
        panic!("environment must not be read")
    })
    .unwrap();
    assert_eq!(s.key.expose(), "explicit");
}

#[test]
fn default_config_matches_the_documented_values() {
    let c = OpenAiConfig::default();
    assert_eq!(c.api_key_env, "OPENAI_API_KEY");
    assert_eq!(c.timeout, Duration::from_secs(120));
    assert_eq!(c.max_retries, 3);
    assert_eq!(c.seed, Some(DEFAULT_SEED));
    assert_eq!(c.token_margin, 1.3);
    assert!(c.deterministic_sections);
    assert_eq!((c.context_length, c.max_output_tokens), (None, None));
}

#[test]
fn the_reply_reserve_is_the_cap_or_a_quarter_of_the_window() {
    assert_eq!(config().output_reserve(), None);
    assert_eq!(
        config().with_max_output_tokens(300).output_reserve(),
        Some(300)
    );
    assert_eq!(
        config().with_context_length(8192).output_reserve(),
        Some(2048)
    );
    assert_eq!(
        config().with_context_length(2000).output_reserve(),
        Some(500)
    );
    assert_eq!(
        config()
            .with_context_length(8192)
            .with_max_output_tokens(512)
            .output_reserve(),
        Some(512)
    );
}
