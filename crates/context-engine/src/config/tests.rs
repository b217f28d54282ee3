use super::*;
use std::time::Duration;

use crate::compressor::CompressorOptions;

#[test]
fn percent_accepts_fraction_and_percent() {
    assert_eq!(percent(0.6), Ok(0.6));
    assert_eq!(percent(1.0), Ok(1.0));
    assert_eq!(percent(60.0), Ok(0.6));
    assert_eq!(percent(100.0), Ok(1.0));
    assert!(percent(0.0).is_err());
    assert!(percent(-0.5).is_err());
    assert!(percent(100.5).is_err());
    assert!(percent(f64::NAN).is_err());
}

#[test]
fn compressor_options_take_the_context_section() {
    let mut c = Config::default();
    c.context.threshold_percent = 0.5;
    c.context.protect_first_n = 1;
    c.context.tail_ratio = 0.3;
    c.context.model_thresholds.insert("gpt-4o".into(), 0.9);
    c.context.digest.min_bytes = 10;
    c.context.prune.proactive_prune_tokens = 1000;
    let o = c.compressor_options();
    assert_eq!(o.threshold_percent, 0.5);
    assert_eq!(o.protect_first_n, 1);
    assert_eq!(o.tail_ratio, 0.3);
    assert_eq!(o.model_thresholds["gpt-4o"], 0.9);
    assert_eq!(o.digest.min_bytes, 10);
    assert_eq!(o.prune.proactive_prune_tokens, 1000);
    assert_eq!(
        o.summary_max_tokens,
        CompressorOptions::default().summary_max_tokens
    );
}

#[test]
fn defaults_match_the_engine_defaults() {
    let o = Config::default().compressor_options();
    let d = CompressorOptions::default();
    assert_eq!(o.threshold_percent, d.threshold_percent);
    assert_eq!(o.protect_last_n, d.protect_last_n);
    assert_eq!(o.tail_ratio, d.tail_ratio);
}

#[test]
fn openai_config_needs_kind_url_and_model() {
    let mut c = Config::default();
    assert!(c.openai_config().is_none());
    c.summarizer.kind = SummarizerKind::Openai;
    c.summarizer.base_url = Some("http://127.0.0.1:9/v1".into());
    assert!(c.openai_config().is_none());
    c.summarizer.model = Some("m".into());
    c.summarizer.api_key_env = "MY_KEY".into();
    c.summarizer.timeout_seconds = 7;
    let o = c.openai_config().unwrap();
    assert_eq!(o.api_key_env, "MY_KEY");
    assert_eq!(o.timeout, Duration::from_secs(7));
    assert_eq!(o.model, "m");
    assert_eq!(o.context_length, None);
    c.summarizer.context_length = Some(8192);
    c.summarizer.max_output_tokens = Some(256);
    let o = c.openai_config().unwrap();
    assert_eq!(o.context_length, Some(8192));
    assert_eq!(o.max_output_tokens, Some(256));
}

#[test]
fn engine_section_is_null_when_absent() {
    let mut c = Config::default();
    assert_eq!(c.engine_section("x"), serde_json::Value::Null);
    c.engines.insert("x".into(), serde_json::json!({"k": 1}));
    assert_eq!(c.engine_section("x")["k"], 1);
}

#[test]
fn redactor_uses_user_patterns() {
    let mut c = Config::default();
    c.security.redact_patterns = vec!["internal-[0-9]{4}".into()];
    let r = c.redactor().unwrap();
    let out = r.redact(
        "ticket internal-1234 here",
        &crate::redact::RedactOptions::default(),
    );
    assert!(!out.contains("internal-1234"), "{out}");
}

#[test]
fn pricing_starts_from_the_preset_and_feeds_the_schedule() {
    let loaded = ConfigLoader::new()
        .with_search(false)
        .with_overrides([
            "pricing.provider=anthropic",
            "pricing.cached_input=0.25",
            "pricing.cache_lifetime_secs=3600",
            "context.schedule.enabled=false",
        ])
        .load()
        .unwrap();
    let p = loaded.config.pricing.price_model();
    assert_eq!(p.name, "anthropic (custom)");
    assert_eq!(p.input_per_million, 3.00);
    assert_eq!(p.cached_input_per_million, 0.25);
    assert_eq!(p.cache_write_per_million, 3.75);
    assert_eq!(p.cache.lifetime_secs, 3600);
    let o = loaded.config.compressor_options();
    assert_eq!(o.schedule.price, p);
    assert!(!o.schedule.enabled);
}

#[test]
fn an_unknown_pricing_preset_is_an_error_naming_the_key_and_the_presets() {
    let err = ConfigLoader::new()
        .with_search(false)
        .with_overrides(["pricing.provider=acme"])
        .load()
        .unwrap_err()
        .to_string();
    assert!(err.contains("pricing.provider"), "{err}");
    assert!(err.contains("unknown provider preset `acme`"), "{err}");
    assert!(err.contains("anthropic-1h"), "{err}");
}
