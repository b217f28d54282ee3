use super::*;
use crate::config::ConfigLoader;
use crate::digest::digest_view;

fn loaded(overrides: &[&str], env: &Env) -> Loaded {
    ConfigLoader::new()
        .with_search(false)
        .with_environment(env)
        .with_overrides(overrides.iter().copied())
        .load()
        .expect("config")
}

fn engines(overrides: &[&str]) -> Result<Engines, BuildError> {
    EngineBuilder::from_loaded(loaded(overrides, &Env::empty()))
        .with_cwd_plugins(false)
        .build()
}

/// A mini-swe-agent session: two text actions, each answered by a large
/// observation (a user message in the agent's template).
fn text_action_session() -> Vec<Message> {
    let mut m = vec![
        Message::system("You are a helpful agent."),
        Message::user("fix it"),
    ];
    for i in 0..3 {
        m.push(Message::assistant(format!(
            "Looking.\n```bash\ncat file{i}.py\n```"
        )));
        m.push(Message::user(format!(
            "<returncode>0</returncode>\n<output>\n{}\n</output>",
            "line of output\n".repeat(600)
        )));
    }
    m
}

#[test]
fn text_actions_from_config_reach_every_option() {
    for (setting, off) in [("auto", false), ("off", true)] {
        let e = engines(&[&format!("context.text_actions={setting}")]).expect("engines");
        assert_eq!(e.text_actions().is_off(), off);
        assert_eq!(e.compressor_options().text_actions().is_off(), off);
        assert_eq!(
            e.compressor_options().prune.digest.text_actions.is_off(),
            off
        );
        assert_eq!(e.host_options().text_actions.is_off(), off);
        assert_eq!(e.replay_options().text_actions.is_off(), off);
        // And they change what the engine does: observations are tool
        // output (digested once old) only when text actions are on.
        let m = text_action_session();
        let (_, report) = digest_view(&m, &e.compressor_options().digest);
        assert_eq!(report.results_digested > 0, !off, "{setting}: {report:?}");
    }
}

#[test]
fn a_bad_text_action_pattern_is_an_error_naming_it() {
    let err = ConfigLoader::new()
        .with_search(false)
        .with_overrides(["context.text_actions=[\"(\"]"])
        .load()
        .expect_err("a bad pattern");
    assert!(err.to_string().contains("context.text_actions"), "{err}");
}

#[test]
fn the_window_is_the_callers_then_the_configs_then_the_default() {
    assert_eq!(
        engines(&[]).expect("e").context_length(),
        DEFAULT_CONTEXT_LENGTH
    );
    let e = engines(&["context.context_length=32000"]).expect("e");
    assert_eq!(e.context_length(), 32_000);
    let started = e.engine().expect("engine");
    assert_eq!(started.engine.state().context_length, 32_000);
    let caller =
        EngineBuilder::from_loaded(loaded(&["context.context_length=32000"], &Env::empty()))
            .with_context_length(Some(8_000))
            .build()
            .expect("e");
    assert_eq!(caller.context_length(), 8_000);
    assert_eq!(caller.compressor().state().context_length, 8_000);
}

#[test]
fn an_unknown_engine_falls_back_unless_required() {
    let e = engines(&["context.engine=no-such-engine"]).expect("e");
    let started = e.engine().expect("fallback");
    assert_eq!(started.engine.name(), "compressor");
    assert!(matches!(started.source, EngineSource::Fallback { .. }));
    assert!(!started.warnings.is_empty());
    assert!(!Engines::blocks(&started.source));
    let required = engines(&[
        "context.engine=no-such-engine",
        "context.engine_required=true",
    ])
    .expect("e");
    let err = required.engine().expect_err("required");
    assert!(err.to_string().contains("no-such-engine"), "{err}");
}

/// A model summarizer factory standing in for the HTTP client: it reads
/// the key the way the client does, through the variable lookup it is
/// handed.
struct KeyFactory;

struct Keyed;

impl crate::summarize::Summarizer for Keyed {
    fn name(&self) -> &str {
        "keyed"
    }
    fn summarize(
        &self,
        _: &crate::summarize::SummaryRequest<'_>,
    ) -> Result<String, SummarizeError> {
        Ok(String::new())
    }
}

impl ModelSummarizer for Keyed {
    fn last_call(&self) -> crate::summarize::openai::CallStats {
        crate::summarize::openai::CallStats::default()
    }
}

impl SummarizerFactory for KeyFactory {
    fn openai(
        &self,
        config: crate::summarize::openai::OpenAiConfig,
        var: &dyn Fn(&str) -> Option<String>,
        _: Arc<Redactor>,
    ) -> Result<Arc<dyn ModelSummarizer>, SummarizeError> {
        match var(&config.api_key_env) {
            Some(_) => Ok(Arc::new(Keyed)),
            None => Err(SummarizeError::NotConfigured(format!(
                "environment variable {} is not set",
                config.api_key_env
            ))),
        }
    }
}

#[test]
fn a_model_summarizer_needs_a_factory() {
    let keys = [
        "summarizer.kind=openai",
        "summarizer.base_url=http://127.0.0.1:9/v1",
        "summarizer.model=m",
    ];
    let env = Env::from_pairs([("OPENAI_API_KEY", "sk-test")]);
    let err = EngineBuilder::from_loaded(loaded(&keys, &env))
        .with_env(env)
        .build()
        .expect_err("no factory");
    assert!(matches!(err, BuildError::NoAdapter { .. }), "{err}");
}

#[test]
fn the_summarizer_key_comes_from_the_callers_environment() {
    let keys = [
        "summarizer.kind=openai",
        "summarizer.base_url=http://127.0.0.1:9/v1",
        "summarizer.model=m",
        "summarizer.api_key_env=MY_SUMMARY_KEY",
    ];
    // Not in the given environment: an error naming the variable, whatever
    // the process has.
    let err = EngineBuilder::from_loaded(loaded(&keys, &Env::empty()))
        .with_summarizers(Arc::new(KeyFactory))
        .build()
        .expect_err("no key");
    assert!(crate::error_chain(&err).contains("MY_SUMMARY_KEY"), "{err}");
    let env = Env::from_pairs([("MY_SUMMARY_KEY", "sk-test")]);
    let e = EngineBuilder::from_loaded(loaded(&keys, &env))
        .with_env(env)
        .with_summarizers(Arc::new(KeyFactory))
        .build()
        .expect("engines");
    assert!(e.summarizer_client().is_some());
    // A missing setting names its key.
    let err = engines(&["summarizer.kind=openai", "summarizer.model=m"]).expect_err("no url");
    assert!(err.to_string().contains("summarizer.base_url"), "{err}");
}

#[test]
fn a_window_under_the_system_prompt_is_refused() {
    let e = engines(&["context.context_length=5"]).expect("e");
    let err = e
        .check_window(&text_action_session())
        .expect_err("too small");
    assert!(
        matches!(err, BuildError::WindowTooSmall { window: 5, .. }),
        "{err}"
    );
}

#[test]
fn replay_runs_the_baseline_unless_told_not_to() {
    let e = engines(&["context.context_length=8000"]).expect("e");
    let m = text_action_session();
    let mut run = ReplayRun::new(&m, "s");
    let (with, _) = e.replay(run.clone(), |_, _| {}).expect("replay");
    assert!(with.costs.is_some());
    run.baseline = false;
    let (without, _) = e.replay(run, |_, _| {}).expect("replay");
    assert!(without.costs.is_none());
    assert_eq!(with.totals.calls, without.totals.calls);
}
