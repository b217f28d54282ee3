#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The layered configuration: precedence and sources, warnings and errors
//! with positions, file lookup, the example file.

use std::path::{Path, PathBuf};

use context_engine::config::{Config, ConfigError, ConfigLoader, Loaded, Source, SummarizerKind};

/// A fresh folder for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ctx-config-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn load_file(path: &Path) -> Result<Loaded, ConfigError> {
    ConfigLoader::new().with_file(Some(path.to_owned())).load()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn file_line(s: &Source) -> u64 {
    match s {
        Source::File { line, .. } => *line,
        other => panic!("expected a file source, got {other:?}"),
    }
}

#[test]
fn no_layers_gives_the_defaults() {
    let loaded = ConfigLoader::new().with_search(false).load().unwrap();
    assert_eq!(loaded.config, Config::default());
    assert!(loaded.file.is_none());
    assert!(loaded.sources.is_empty());
    assert!(loaded.warnings.is_empty());
    assert_eq!(loaded.config.context.engine, "compressor");
    assert_eq!(loaded.config.summarizer.api_key_env, "OPENAI_API_KEY");
    assert!(loaded.config.security.redact_secrets);
}

#[test]
fn precedence_default_file_env_flag() {
    let dir = temp_dir("precedence");
    let file = write(
        &dir,
        "c.yaml",
        "context:\n  threshold_percent: 0.5\n  protect_first_n: 2\n  protect_last_n: 4\n\
         summarizer:\n  kind: extractive\n",
    );
    let loaded = ConfigLoader::new()
        .with_file(Some(file.clone()))
        .with_env(env(&[
            ("CTX_CONTEXT__PROTECT_FIRST_N", "5"),
            ("CTX_CONTEXT__PROTECT_LAST_N", "7"),
        ]))
        .with_overrides(["context.protect_last_n=8"])
        .load()
        .unwrap();
    let c = &loaded.config.context;
    assert_eq!(c.threshold_percent, 0.5); // file
    assert_eq!(c.protect_first_n, 5); // env over file
    assert_eq!(c.protect_last_n, 8); // flag over env over file
    assert_eq!(c.tail_ratio, 0.2); // default

    assert_eq!(file_line(&loaded.source("context.threshold_percent")), 2);
    assert_eq!(
        loaded.source("context.protect_first_n"),
        Source::Env {
            var: "CTX_CONTEXT__PROTECT_FIRST_N".into()
        }
    );
    assert_eq!(
        loaded.source("context.protect_last_n"),
        Source::Flag {
            arg: "context.protect_last_n=8".into()
        }
    );
    assert_eq!(loaded.source("context.tail_ratio"), Source::Default);
    assert_eq!(file_line(&loaded.source("summarizer.kind")), 6);
    assert_eq!(loaded.file.as_deref(), Some(file.as_path()));
    // Entries (what `ctx config show` prints) carry the same sources.
    let entries = loaded.entries();
    let e = entries
        .iter()
        .find(|e| e.path == "context.protect_first_n")
        .unwrap();
    assert_eq!(e.value, serde_json::json!(5));
    assert!(matches!(e.source, Source::Env { .. }));
    assert!(entries.iter().any(|e| e.path == "context.digest.min_bytes"));
}

#[test]
fn env_nesting_and_non_config_variables() {
    let loaded = ConfigLoader::new()
        .with_search(false)
        .with_env(env(&[
            ("CTX_SUMMARIZER__KIND", "openai"),
            ("CTX_CONTEXT__DIGEST__MIN_BYTES", "123"),
            ("CTX_CONTEXT__MODEL_THRESHOLDS__GPT-4O", "50"),
            ("CTX_ENGINES__MYENG__DEPTH", "3"),
            ("CTX_SECURITY__REDACT_PATTERNS", "[\"foo[0-9]+\", bar]"),
            ("CTX_TOOL_DIGEST_DISABLED", "1"),
            ("CTX_CONFIG", ""),
            ("PATH", "/bin"),
        ]))
        .load()
        .unwrap();
    let c = &loaded.config;
    assert_eq!(c.summarizer.kind, SummarizerKind::Openai);
    assert_eq!(c.context.digest.min_bytes, 123);
    assert_eq!(c.context.model_thresholds["gpt-4o"], 0.5);
    assert_eq!(c.engine_section("myeng"), serde_json::json!({"depth": 3}));
    assert_eq!(c.security.redact_patterns, vec!["foo[0-9]+", "bar"]);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(
        loaded.source("context.digest.min_bytes"),
        Source::Env {
            var: "CTX_CONTEXT__DIGEST__MIN_BYTES".into()
        }
    );
}

#[test]
fn threshold_percent_accepts_a_percent() {
    let loaded = ConfigLoader::new()
        .with_search(false)
        .with_overrides(["context.threshold_percent=60"])
        .load()
        .unwrap();
    assert_eq!(loaded.config.context.threshold_percent, 0.6);
    let err = ConfigLoader::new()
        .with_search(false)
        .with_overrides(["context.threshold_percent=150"])
        .load()
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("context.threshold_percent"), "{msg}");
    assert!(msg.contains("percent in (1, 100]"), "{msg}");
    assert!(msg.contains("flag"), "{msg}");
}

#[test]
fn unknown_keys_warn_with_path_and_line() {
    let dir = temp_dir("unknown");
    let file = write(
        &dir,
        "c.yaml",
        "context:\n  engine: compressor\n  treshold_percent: 0.5\n  digest:\n    min_byte: 10\n\
         colour: blue\n",
    );
    let loaded = load_file(&file).unwrap();
    let mut w: Vec<(String, u64)> = loaded
        .warnings
        .iter()
        .map(|w| (w.path.clone(), file_line(&w.source)))
        .collect();
    w.sort();
    assert_eq!(
        w,
        vec![
            ("colour".to_owned(), 6),
            ("context.digest.min_byte".to_owned(), 5),
            ("context.treshold_percent".to_owned(), 3),
        ]
    );
    let shown = loaded.warnings[0].to_string();
    assert!(shown.contains("c.yaml:"), "{shown}");
    // The rest of the file still applies.
    assert_eq!(loaded.config.context.digest.min_bytes, 4096);
}

#[test]
fn unknown_env_key_warns_with_the_variable() {
    let loaded = ConfigLoader::new()
        .with_search(false)
        .with_env(env(&[("CTX_CONTEXT__NOPE", "1")]))
        .load()
        .unwrap();
    assert_eq!(loaded.warnings.len(), 1);
    assert_eq!(loaded.warnings[0].path, "context.nope");
    assert_eq!(
        loaded.warnings[0].source,
        Source::Env {
            var: "CTX_CONTEXT__NOPE".into()
        }
    );
}

#[test]
fn wrong_type_is_an_error_with_file_line_column_and_type() {
    let dir = temp_dir("wrongtype");
    let file = write(
        &dir,
        "c.yaml",
        "# comment\ncontext:\n  engine: compressor\n  protect_first_n: lots\n",
    );
    let err = load_file(&file).unwrap_err();
    match &err {
        ConfigError::Invalid {
            key,
            origin,
            message,
        } => {
            assert_eq!(key, "context.protect_first_n");
            assert_eq!(file_line(origin), 4);
            assert!(message.contains("expected usize"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("c.yaml:4:3"), "{msg}");

    let file = write(&dir, "k.yaml", "summarizer:\n  kind: claude\n");
    let msg = load_file(&file).unwrap_err().to_string();
    assert!(msg.contains("k.yaml:2:"), "{msg}");
    assert!(msg.contains("extractive"), "{msg}");
}

#[test]
fn yaml_syntax_error_names_the_line() {
    let dir = temp_dir("syntax");
    let file = write(&dir, "c.yaml", "context:\n  engine: [a, b\n");
    let err = load_file(&file).unwrap_err();
    match &err {
        ConfigError::Syntax { line, .. } => assert!(line.is_some(), "{err}"),
        other => panic!("unexpected {other:?}"),
    }
    let file = write(&dir, "list.yaml", "- a\n- b\n");
    assert!(matches!(
        load_file(&file).unwrap_err(),
        ConfigError::Invalid { .. }
    ));
}

#[test]
fn explicit_missing_file_is_an_error_default_missing_is_not() {
    let dir = temp_dir("missing");
    let err = ConfigLoader::new()
        .with_file(Some(dir.join("absent.yaml")))
        .load()
        .unwrap_err();
    assert!(matches!(err, ConfigError::NotFound { .. }), "{err}");
    let err = ConfigLoader::new()
        .with_env(env(&[(
            "CTX_CONFIG",
            dir.join("absent.yaml").to_str().unwrap(),
        )]))
        .load()
        .unwrap_err();
    assert!(err.to_string().contains("CTX_CONFIG"), "{err}");
    // Nothing in the search folders: defaults.
    let loaded = ConfigLoader::new()
        .with_cwd(&dir)
        .with_env(env(&[(
            "XDG_CONFIG_HOME",
            dir.join("xdg").to_str().unwrap(),
        )]))
        .load()
        .unwrap();
    assert!(loaded.file.is_none());
}

#[test]
fn file_lookup_order() {
    let dir = temp_dir("lookup");
    let xdg = dir.join("xdg");
    std::fs::create_dir_all(xdg.join("context-engine")).unwrap();
    let user = write(
        &xdg.join("context-engine"),
        "config.yaml",
        "context:\n  protect_first_n: 1\n",
    );
    let cwd = dir.join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let xdg_env = ("XDG_CONFIG_HOME", xdg.to_str().unwrap());
    let found = |loader: ConfigLoader| loader.load().unwrap().file;

    // Only the user file: found.
    let l = ConfigLoader::new().with_cwd(&cwd).with_env(env(&[xdg_env]));
    assert_eq!(found(l), Some(user.clone()));
    // HOME/.config when XDG_CONFIG_HOME is unset.
    let home = dir.join("home");
    std::fs::create_dir_all(home.join(".config/context-engine")).unwrap();
    let home_file = write(&home.join(".config/context-engine"), "config.yaml", "");
    let l = ConfigLoader::new()
        .with_cwd(&cwd)
        .with_env(env(&[("HOME", home.to_str().unwrap())]));
    assert_eq!(found(l), Some(home_file));
    // ./config.yaml beats the user file.
    let local = write(&cwd, "config.yaml", "context:\n  protect_first_n: 2\n");
    let l = ConfigLoader::new().with_cwd(&cwd).with_env(env(&[xdg_env]));
    assert_eq!(found(l), Some(local));
    // CTX_CONFIG beats ./config.yaml, --config beats CTX_CONFIG.
    let named = write(&dir, "named.yaml", "");
    let explicit = write(&dir, "explicit.yaml", "");
    let l = ConfigLoader::new()
        .with_cwd(&cwd)
        .with_env(env(&[xdg_env, ("CTX_CONFIG", named.to_str().unwrap())]));
    assert_eq!(found(l.clone()), Some(named));
    assert_eq!(found(l.with_file(Some(explicit.clone()))), Some(explicit));
    // Search off: nothing.
    let l = ConfigLoader::new()
        .with_cwd(&cwd)
        .with_env(env(&[xdg_env]))
        .with_search(false);
    assert_eq!(found(l), None);
}

#[test]
fn plugin_dirs_resolve_against_the_file_folder() {
    let dir = temp_dir("plugins");
    let sub = dir.join("proj");
    std::fs::create_dir_all(&sub).unwrap();
    let file = write(
        &sub,
        "c.yaml",
        "plugins:\n  dirs:\n    - plugins\n    - /opt/ctx/plugins\n",
    );
    let loaded = load_file(&file).unwrap();
    assert_eq!(
        loaded.config.plugins.dirs,
        vec![sub.join("plugins"), PathBuf::from("/opt/ctx/plugins")]
    );
    assert_eq!(file_line(&loaded.source("plugins.dirs.0")), 3);
    // From a flag, relative stays relative (to the working directory).
    let loaded = ConfigLoader::new()
        .with_file(Some(file))
        .with_overrides(["plugins.dirs=[local]"])
        .load()
        .unwrap();
    assert_eq!(loaded.config.plugins.dirs, vec![PathBuf::from("local")]);
    assert!(matches!(
        loaded.source("plugins.dirs.0"),
        Source::Flag { .. }
    ));
}

#[test]
fn api_key_literal_is_refused() {
    let dir = temp_dir("apikey");
    let file = write(
        &dir,
        "c.yaml",
        "summarizer:\n  kind: openai\n  api_key: sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD\n",
    );
    let err = load_file(&file).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("summarizer.api_key"), "{msg}");
    assert!(msg.contains("c.yaml:3:"), "{msg}");
    assert!(msg.contains("api_key_env"), "{msg}");
    assert!(
        !msg.contains("abcdefghijkl"),
        "the key must not be echoed: {msg}"
    );

    let err = ConfigLoader::new()
        .with_search(false)
        .with_overrides(["summarizer.api_key_env=sk-abc123-def456"])
        .load()
        .unwrap_err();
    assert!(err.to_string().contains("summarizer.api_key_env"), "{err}");

    let ok = ConfigLoader::new()
        .with_search(false)
        .with_overrides(["summarizer.api_key_env=MY_PROVIDER_KEY"])
        .load()
        .unwrap();
    assert_eq!(ok.config.summarizer.api_key_env, "MY_PROVIDER_KEY");
}

#[test]
fn a_store_url_with_a_password_is_refused() {
    let dir = temp_dir("storeurl");
    let file = write(
        &dir,
        "c.yaml",
        "store:\n  url: postgres://ctx:hunter2-secret@db:5432/ctx\n",
    );
    let msg = load_file(&file).unwrap_err().to_string();
    assert!(msg.contains("store.url"), "{msg}");
    assert!(msg.contains("c.yaml:2:"), "{msg}");
    assert!(msg.contains("password_env"), "{msg}");
    assert!(
        !msg.contains("hunter2"),
        "the password must not be echoed: {msg}"
    );

    let err = ConfigLoader::new()
        .with_search(false)
        .with_overrides(["store.password_env=hunter2 secret"])
        .load()
        .unwrap_err();
    assert!(err.to_string().contains("store.password_env"), "{err}");

    let file = write(
        &dir,
        "ok.yaml",
        "store:\n  url: postgres://ctx@db:5432/ctx\n  password_env: CTX_PG_PASSWORD\n",
    );
    let ok = load_file(&file).unwrap();
    assert_eq!(
        ok.config.store.url.as_deref(),
        Some("postgres://ctx@db:5432/ctx")
    );
    assert_eq!(
        ok.config.store.password_env.as_deref(),
        Some("CTX_PG_PASSWORD")
    );
    assert_eq!(ok.config.store.pool_size, 16);
}

#[test]
fn invalid_redact_pattern_names_its_line() {
    let dir = temp_dir("regex");
    let file = write(
        &dir,
        "c.yaml",
        "security:\n  redact_patterns:\n    - 'ok-[0-9]+'\n    - 'bad(['\n",
    );
    let err = load_file(&file).unwrap_err();
    match &err {
        ConfigError::Invalid { key, origin, .. } => {
            assert_eq!(key, "security.redact_patterns.1");
            assert_eq!(file_line(origin), 4);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn empty_file_and_empty_sections_are_defaults() {
    let dir = temp_dir("empty");
    let file = write(&dir, "c.yaml", "# nothing yet\n");
    assert_eq!(load_file(&file).unwrap().config, Config::default());
    let file = write(&dir, "s.yaml", "context:\nsummarizer:\n");
    let loaded = load_file(&file).unwrap();
    assert_eq!(loaded.config, Config::default());
    assert!(loaded.warnings.is_empty());
}

#[test]
fn override_syntax_errors() {
    for bad in ["context.engine", "context..engine=x", "=x"] {
        let err = ConfigLoader::new()
            .with_search(false)
            .with_overrides([bad])
            .load()
            .unwrap_err();
        assert!(matches!(err, ConfigError::Override { .. }), "{bad}: {err}");
    }
    // A quoted segment keeps its dots.
    let loaded = ConfigLoader::new()
        .with_search(false)
        .with_overrides(["context.model_thresholds.\"gpt-4.1\"=0.9"])
        .load()
        .unwrap();
    assert_eq!(loaded.config.context.model_thresholds["gpt-4.1"], 0.9);
    assert!(matches!(
        loaded.source("context.model_thresholds.\"gpt-4.1\""),
        Source::Flag { .. }
    ));
}

#[test]
fn later_list_replaces_earlier_list_and_its_sources() {
    let dir = temp_dir("lists");
    let file = write(&dir, "c.yaml", "security:\n  redact_patterns: [a, b, c]\n");
    let loaded = ConfigLoader::new()
        .with_file(Some(file))
        .with_env(env(&[("CTX_SECURITY__REDACT_PATTERNS", "[z]")]))
        .load()
        .unwrap();
    assert_eq!(loaded.config.security.redact_patterns, vec!["z"]);
    assert!(!loaded.sources.contains_key("security.redact_patterns.2"));
    assert!(matches!(
        loaded.source("security.redact_patterns"),
        Source::Env { .. }
    ));
}

/// `config.example.yaml` at the repository root documents every key with
/// its default: it loads without warnings and equals the defaults, except
/// for the values it sets on purpose to show the syntax (listed here).
#[test]
fn example_file_loads_clean_and_equals_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config.example.yaml");
    let loaded = load_file(&path).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let mut expected = Config::default();
    // The example's illustrations, which differ from the defaults:
    expected
        .context
        .model_thresholds
        .insert("gpt-4o".into(), 0.8);
    expected
        .context
        .model_thresholds
        .insert("openrouter:claude".into(), 0.85);
    assert_eq!(loaded.config, expected);
    // Every leaf of the defaults is written in the example file.
    for entry in loaded.entries() {
        if entry.path.starts_with("engines") {
            continue;
        }
        assert!(
            matches!(entry.source, Source::File { .. }),
            "{} is not in the example file",
            entry.path
        );
    }
}
