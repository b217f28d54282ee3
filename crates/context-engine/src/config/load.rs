//! Finding, merging and checking the configuration layers.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use super::tree::{self, Pos};
use super::{Config, FILE_NAME, url_has_password};
use crate::redact::{RedactOptions, Redactor};

/// Prefix of the variables that set config keys: `CTX_<SECTION>__<KEY>`.
pub const ENV_PREFIX: &str = "CTX_";

/// Variable naming the config file when no explicit path is given.
pub const FILE_ENV: &str = "CTX_CONFIG";

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// The built-in default.
    Default,
    /// A config file, at the key's line and column (1-based).
    File {
        /// The file as found or given.
        path: PathBuf,
        /// Line of the key.
        line: u64,
        /// Column of the key.
        column: u64,
    },
    /// An environment variable.
    Env {
        /// The variable's name.
        var: String,
    },
    /// A command-line override.
    Flag {
        /// The `key.path=value` argument.
        arg: String,
    },
}

impl Source {
    /// The long form used in errors and warnings: a file position with its
    /// column (`config.yaml:3:5`).
    pub fn location(&self) -> String {
        match self {
            Source::File { path, line, column } => {
                format!("{}:{line}:{column}", path.display())
            }
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Source {
    /// `default`, `FILE:LINE`, `env VAR` or `flag key=value`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File { path, line, .. } => write!(f, "{}:{line}", path.display()),
            Source::Env { var } => write!(f, "env {var}"),
            Source::Flag { arg } => write!(f, "flag {arg}"),
        }
    }
}

/// Something in the configuration that was ignored but is worth telling.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConfigWarning {
    /// Dotted path of the key (`context.digest.min_byte`).
    pub path: String,
    /// Where it was set.
    pub source: Source,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.source.location(), self.message)
    }
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A config file named explicitly (`--config`, `CTX_CONFIG`) is absent.
    #[error("config file {} does not exist (named by {origin})", path.display())]
    NotFound {
        /// The path as given.
        path: PathBuf,
        /// Who named it: `--config` or `CTX_CONFIG`.
        origin: String,
    },
    /// The file exists but cannot be read (or is not UTF-8).
    #[error("cannot read config file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid YAML.
    #[error("{}{}: invalid YAML: {message}", path.display(), line_col(*line, *column))]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line, when the parser knows it.
        line: Option<u64>,
        /// 1-based column, when the parser knows it.
        column: Option<u64>,
        /// The parser's message.
        message: String,
    },
    /// A value has the wrong type or is out of range.
    #[error("{}: {key}: {message}", origin.location())]
    Invalid {
        /// Dotted path of the key.
        key: String,
        /// Where the value was set (file and line, variable or flag).
        origin: Source,
        /// What was expected, e.g. `invalid type: string "x", expected f64`.
        message: String,
    },
    /// A command-line override is not `key.path=value`.
    #[error("invalid override `{arg}`: {message}")]
    Override {
        /// The argument as given.
        arg: String,
        /// What is wrong.
        message: String,
    },
}

fn line_col(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(":{l}:{c}"),
        (Some(l), None) => format!(":{l}"),
        _ => String::new(),
    }
}

/// The loaded configuration and where each value came from.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The effective configuration.
    pub config: Config,
    /// The config file read, if any.
    pub file: Option<PathBuf>,
    /// Source of every value set by a layer above the defaults, by dotted
    /// path: scalars, lists and list items (mappings merge key by key, so
    /// they have none). Absent paths are defaults; see [`Loaded::source`].
    pub sources: BTreeMap<String, Source>,
    /// Unknown keys and ignored variables, in layer order.
    pub warnings: Vec<ConfigWarning>,
}

/// One leaf of the effective configuration, for `ctx config show`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Entry {
    /// Dotted path.
    pub path: String,
    /// Effective value (a list is one entry).
    pub value: Value,
    /// Where it came from.
    pub source: Source,
}

impl Loaded {
    /// Where the value at the dotted `path` came from: the nearest recorded
    /// path at or above it, else [`Source::Default`].
    pub fn source(&self, path: &str) -> Source {
        let Some(mut segs) = tree::split(path) else {
            return Source::Default;
        };
        while !segs.is_empty() {
            if let Some(s) = self.sources.get(&tree::join(&segs)) {
                return s.clone();
            }
            segs.pop();
        }
        Source::Default
    }

    /// Every leaf of the effective configuration (lists whole, empty
    /// mappings as `{}`) with its source, in key order.
    pub fn entries(&self) -> Vec<Entry> {
        // Serializing plain data into a `Value` cannot fail; `Null` would
        // only show as an empty listing.
        let value = serde_json::to_value(&self.config).unwrap_or(Value::Null);
        let mut out = Vec::new();
        let mut path = Vec::new();
        self.flatten(value, &mut path, &mut out);
        out
    }

    fn flatten(&self, value: Value, path: &mut Vec<String>, out: &mut Vec<Entry>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    path.push(k);
                    self.flatten(v, path, out);
                    path.pop();
                }
            }
            value => {
                let dotted = tree::join(path);
                out.push(Entry {
                    source: self.source(&dotted),
                    path: dotted,
                    value,
                });
            }
        }
    }
}

/// Builds the layered configuration. `new()` reads nothing from the process:
/// pass the environment with [`with_env`](Self::with_env) (or
/// [`with_environment`](Self::with_environment)), so tests need not mutate
/// global state.
#[derive(Clone, Debug)]
pub struct ConfigLoader {
    file: Option<PathBuf>,
    env: Vec<(String, String)>,
    overrides: Vec<String>,
    search: bool,
    cwd: Option<PathBuf>,
}

impl Default for ConfigLoader {
    fn default() -> ConfigLoader {
        ConfigLoader::new()
    }
}

impl ConfigLoader {
    /// No file given, empty environment, no overrides, default-file search on.
    pub fn new() -> ConfigLoader {
        ConfigLoader {
            file: None,
            env: Vec::new(),
            overrides: Vec::new(),
            search: true,
            cwd: None,
        }
    }

    /// An explicit config file (`--config PATH`); it must exist.
    pub fn with_file(mut self, file: Option<PathBuf>) -> ConfigLoader {
        self.file = file;
        self
    }

    /// The environment: `CTX_<SECTION>__<KEY>` variables set keys,
    /// `CTX_CONFIG`, `XDG_CONFIG_HOME` and `HOME` locate the file.
    pub fn with_env<I, K, V>(mut self, env: I) -> ConfigLoader
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.env = env.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        self
    }

    /// The caller's environment snapshot ([`Env`](super::Env)): the same
    /// as [`with_env`](Self::with_env) over its variables.
    pub fn with_environment(self, env: &super::Env) -> ConfigLoader {
        self.with_env(env.iter())
    }

    /// Command-line overrides, `key.path=value`, applied in order (a later
    /// one wins). A key segment holding a `.` is written in double quotes:
    /// `context.model_thresholds."gpt-4.1"=0.6`.
    pub fn with_overrides<I, S>(mut self, overrides: I) -> ConfigLoader
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.overrides = overrides.into_iter().map(Into::into).collect();
        self
    }

    /// Whether to look for `./config.yaml` and the user's config file when
    /// neither `with_file` nor `CTX_CONFIG` names one (default on).
    pub fn with_search(mut self, search: bool) -> ConfigLoader {
        self.search = search;
        self
    }

    /// The folder searched for `config.yaml` (default: the working
    /// directory).
    pub fn with_cwd(mut self, cwd: impl Into<PathBuf>) -> ConfigLoader {
        self.cwd = Some(cwd.into());
        self
    }

    fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    /// The file to read: explicit path > `$CTX_CONFIG` > `./config.yaml` >
    /// `$XDG_CONFIG_HOME/context-engine/config.yaml` (else
    /// `$HOME/.config/context-engine/config.yaml`). A named file that does
    /// not exist is an error; a missing default file is not.
    pub fn find_file(&self) -> Result<Option<PathBuf>, ConfigError> {
        let named = match (&self.file, self.env_var(FILE_ENV)) {
            (Some(p), _) => Some((p.clone(), "--config")),
            (None, Some(p)) => Some((PathBuf::from(p), FILE_ENV)),
            (None, None) => None,
        };
        if let Some((path, origin)) = named {
            if !path.exists() {
                return Err(ConfigError::NotFound {
                    path,
                    origin: origin.to_owned(),
                });
            }
            return Ok(Some(path));
        }
        if !self.search {
            return Ok(None);
        }
        let local = match &self.cwd {
            Some(cwd) => cwd.join(FILE_NAME),
            None => PathBuf::from(FILE_NAME),
        };
        if local.is_file() {
            return Ok(Some(local));
        }
        let config_home = match self.env_var("XDG_CONFIG_HOME") {
            Some(x) if Path::new(x).is_absolute() => Some(PathBuf::from(x)),
            _ => self.env_var("HOME").map(|h| Path::new(h).join(".config")),
        };
        Ok(config_home
            .map(|d| d.join("context-engine").join(FILE_NAME))
            .filter(|p| p.is_file()))
    }

    /// Finds, reads and merges the layers, then checks the result.
    pub fn load(self) -> Result<Loaded, ConfigError> {
        let mut merged = Merged::new();
        let mut warnings = Vec::new();

        let file = self.find_file()?;
        if let Some(path) = &file {
            merged.apply(file_layer(path)?);
        }

        // The two single-purpose switches older than the `CTX_…__…` layer
        // are read as the keys they stand for (an explicit key still wins).
        if let Some(v) = self.env_var(crate::redact::OPT_OUT_ENV)
            && crate::redact::is_opt_out_value(v)
        {
            let source = Source::Env {
                var: crate::redact::OPT_OUT_ENV.to_owned(),
            };
            let segs = ["security".to_owned(), "redact_secrets".to_owned()];
            merged.apply(Layer::one(&segs, Value::Bool(false), source));
        }
        if let Some(v) = self.env_var(super::DISABLE_ENV)
            && super::is_disable_value(v)
        {
            let source = Source::Env {
                var: super::DISABLE_ENV.to_owned(),
            };
            let segs = [
                "context".to_owned(),
                "digest".to_owned(),
                "enabled".to_owned(),
            ];
            merged.apply(Layer::one(&segs, Value::Bool(false), source));
        }

        let mut vars: Vec<&(String, String)> = self.env.iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            if !rest.contains("__") {
                continue;
            }
            let segs: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
            let source = Source::Env { var: name.clone() };
            if segs.iter().any(String::is_empty) {
                warnings.push(ConfigWarning {
                    path: tree::join(&segs),
                    source,
                    message: format!("ignored variable {name}: empty key between `__`"),
                });
                continue;
            }
            merged.apply(Layer::one(&segs, tree::parse_scalar(value), source));
        }

        for arg in &self.overrides {
            let (key, value) = arg.split_once('=').ok_or_else(|| ConfigError::Override {
                arg: arg.clone(),
                message: "expected key.path=value".to_owned(),
            })?;
            let segs = tree::split(key.trim()).ok_or_else(|| ConfigError::Override {
                arg: arg.clone(),
                message: "the key is not a dotted path (a.b.c, \"quoted.segment\")".to_owned(),
            })?;
            let source = Source::Flag { arg: arg.clone() };
            merged.apply(Layer::one(&segs, tree::parse_scalar(value), source));
        }

        check_api_keys(&merged.value, &mut Vec::new(), &merged)?;

        let mut ignored: Vec<Vec<String>> = Vec::new();
        let mut on_ignored = |path: serde_ignored::Path<'_>| {
            ignored.push(ignored_segments(&path));
        };
        let de = serde_ignored::Deserializer::new(merged.value.clone(), &mut on_ignored);
        let result: Result<Config, _> = serde_path_to_error::deserialize(de);
        let mut config = result.map_err(|e| {
            let segs = error_segments(e.path());
            ConfigError::Invalid {
                key: tree::join(&segs),
                origin: merged.origin(&segs),
                message: e.into_inner().to_string(),
            }
        })?;
        for segs in ignored {
            let path = tree::join(&segs);
            warnings.push(ConfigWarning {
                source: merged.origin(&segs),
                message: format!("unknown key `{path}` (ignored)"),
                path,
            });
        }

        // `context.text_actions`, checked once here (the builder compiles
        // it into the digest and prune options).
        config.text_actions().map_err(|e| {
            let segs = ["context", "text_actions", &e.index.to_string()].map(str::to_owned);
            ConfigError::Invalid {
                key: tree::join(&segs),
                origin: merged.origin(&segs),
                message: e.to_string(),
            }
        })?;

        for (i, pattern) in config.security.redact_patterns.iter().enumerate() {
            if let Err(e) = Redactor::builder()
                .builtin_rules(false)
                .pattern(pattern.clone())
                .build()
            {
                let segs = ["security", "redact_patterns", &i.to_string()].map(str::to_owned);
                return Err(ConfigError::Invalid {
                    key: tree::join(&segs),
                    origin: merged.origin(&segs),
                    message: e.to_string(),
                });
            }
        }

        for (i, dir) in config.plugins.dirs.iter_mut().enumerate() {
            let segs = ["plugins", "dirs", &i.to_string()].map(str::to_owned);
            if let Source::File { path, .. } = merged.origin(&segs)
                && dir.is_relative()
                && let Some(parent) = path.parent()
            {
                *dir = parent.join(&*dir);
            }
        }

        Ok(Loaded {
            config,
            file,
            sources: merged.sources,
            warnings,
        })
    }
}

/// One layer: a tree of keys and the source of each of its nodes (with
/// whether the node is a mapping).
struct Layer {
    value: Value,
    nodes: BTreeMap<String, (Source, bool)>,
}

impl Layer {
    /// A single key set to `value` (a variable or a flag).
    fn one(segs: &[String], value: Value, source: Source) -> Layer {
        let mut nodes = BTreeMap::new();
        let mut path = segs.to_vec();
        record(&value, &mut path, &source, &mut nodes);
        for n in 1..segs.len() {
            nodes.insert(tree::join(&segs[..n]), (source.clone(), true));
        }
        let mut v = value;
        for seg in segs.iter().rev() {
            let mut m = Map::new();
            m.insert(seg.clone(), v);
            v = Value::Object(m);
        }
        Layer { value: v, nodes }
    }
}

fn record(
    value: &Value,
    path: &mut Vec<String>,
    source: &Source,
    nodes: &mut BTreeMap<String, (Source, bool)>,
) {
    nodes.insert(tree::join(path), (source.clone(), value.is_object()));
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                path.push(k.clone());
                record(v, path, source, nodes);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(i.to_string());
                record(v, path, source, nodes);
                path.pop();
            }
        }
        _ => {}
    }
}

fn file_layer(path: &Path) -> Result<Layer, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let parsed = tree::parse(&text).map_err(|e| ConfigError::Syntax {
        path: path.to_owned(),
        line: e.pos.map(|p| p.line),
        column: e.pos.map(|p| p.column),
        message: e.message,
    })?;
    let at = |pos: Pos| Source::File {
        path: path.to_owned(),
        line: pos.line,
        column: pos.column,
    };
    let value = match parsed.value {
        Value::Null => Value::Object(Map::new()),
        v @ Value::Object(_) => v,
        other => {
            return Err(ConfigError::Invalid {
                key: "(top level)".to_owned(),
                origin: at(Pos { line: 1, column: 1 }),
                message: format!(
                    "expected a mapping of sections (context, summarizer, ...), found {}",
                    kind_of(&other)
                ),
            });
        }
    };
    let mut nodes = BTreeMap::new();
    let mut flags = BTreeMap::new();
    record(&value, &mut Vec::new(), &Source::Default, &mut flags);
    for (key, pos) in parsed.positions {
        let is_map = flags.get(&key).is_some_and(|(_, m)| *m);
        nodes.insert(key, (at(pos), is_map));
    }
    Ok(Layer { value, nodes })
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The merged tree and the source of its nodes.
struct Merged {
    value: Value,
    /// Scalars, lists and list items: what `Loaded::sources` reports.
    sources: BTreeMap<String, Source>,
    /// Every node, mappings included: where warnings and errors point.
    nodes: BTreeMap<String, Source>,
}

impl Merged {
    fn new() -> Merged {
        // Starting from the defaults tells an empty section header (`null`
        // over a mapping) from a real `null`.
        Merged {
            value: serde_json::to_value(Config::default()).unwrap_or(Value::Object(Map::new())),
            sources: BTreeMap::new(),
            nodes: BTreeMap::new(),
        }
    }

    fn apply(&mut self, layer: Layer) {
        let Value::Object(src) = layer.value else {
            return;
        };
        let mut dst = std::mem::take(&mut self.value);
        self.merge(&mut dst, src, &mut Vec::new(), &layer.nodes);
        self.value = dst;
    }

    fn merge(
        &mut self,
        dst: &mut Value,
        src: Map<String, Value>,
        path: &mut Vec<String>,
        layer: &BTreeMap<String, (Source, bool)>,
    ) {
        if !dst.is_object() {
            *dst = Value::Object(Map::new());
        }
        let Value::Object(dst) = dst else {
            return;
        };
        for (key, value) in src {
            path.push(key.clone());
            let dotted = tree::join(path);
            match (dst.get_mut(&key), value) {
                (Some(d @ Value::Object(_)), Value::Object(v)) => {
                    if let Some((s, _)) = layer.get(&dotted) {
                        self.nodes.insert(dotted, s.clone());
                    }
                    self.merge(d, v, path, layer);
                }
                // An empty section header (`context:` with nothing under
                // it) leaves the section as it is.
                (Some(Value::Object(_)), Value::Null) => {}
                (_, value) => {
                    let prefix = format!("{dotted}.");
                    let under = |k: &String| *k == dotted || k.starts_with(&prefix);
                    self.sources.retain(|k, _| !under(k));
                    self.nodes.retain(|k, _| !under(k));
                    for (k, (s, is_map)) in layer.range(dotted.clone()..) {
                        if !under(k) {
                            break;
                        }
                        if !is_map {
                            self.sources.insert(k.clone(), s.clone());
                        }
                        self.nodes.insert(k.clone(), s.clone());
                    }
                    dst.insert(key, value);
                }
            }
            path.pop();
        }
    }

    /// The source of the node at `segs` or its nearest recorded ancestor.
    fn origin(&self, segs: &[String]) -> Source {
        (1..=segs.len())
            .rev()
            .find_map(|n| self.nodes.get(&tree::join(&segs[..n])))
            .cloned()
            .unwrap_or(Source::Default)
    }
}

fn ignored_segments(path: &serde_ignored::Path<'_>) -> Vec<String> {
    use serde_ignored::Path as P;
    let mut out = match path {
        P::Root => return Vec::new(),
        P::Seq { parent, .. }
        | P::Map { parent, .. }
        | P::Some { parent }
        | P::NewtypeStruct { parent }
        | P::NewtypeVariant { parent } => ignored_segments(parent),
    };
    match path {
        P::Seq { index, .. } => out.push(index.to_string()),
        P::Map { key, .. } => out.push(key.clone()),
        _ => {}
    }
    out
}

fn error_segments(path: &serde_path_to_error::Path) -> Vec<String> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|s| match s {
            Segment::Seq { index } => Some(index.to_string()),
            Segment::Map { key } => Some(key.clone()),
            Segment::Enum { variant } => Some(variant.clone()),
            Segment::Unknown => None,
        })
        .collect()
}

/// Refuses an API key written into the configuration: under any key whose
/// name starts with `api_key` (any case) a string must be the NAME of an
/// environment variable, and must not look like a secret to the redactor.
fn check_api_keys(
    value: &Value,
    path: &mut Vec<String>,
    merged: &Merged,
) -> Result<(), ConfigError> {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                path.push(k.clone());
                let lower = k.to_ascii_lowercase();
                if let Value::String(s) = v
                    && url_has_password(s)
                {
                    return Err(ConfigError::Invalid {
                        key: tree::join(path),
                        origin: merged.origin(path),
                        message: "a URL in the configuration must not carry a password: \
                                  write it without one and put the password in an environment \
                                  variable named by store.password_env"
                            .to_owned(),
                    });
                }
                if (lower.starts_with("api_key")
                    || lower.starts_with("apikey")
                    || lower.starts_with("auth_token")
                    || lower.starts_with("password")
                    || lower.starts_with("encryption_key"))
                    && let Value::String(s) = v
                    && (!is_env_name(s) || looks_secret(s))
                {
                    return Err(ConfigError::Invalid {
                        key: tree::join(path),
                        origin: merged.origin(path),
                        message: "must be the NAME of an environment variable (letters, digits, \
                                  `_`), never a key: put the key in a variable and set \
                                  summarizer.api_key_env to its name"
                            .to_owned(),
                    });
                }
                check_api_keys(v, path, merged)?;
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(i.to_string());
                check_api_keys(v, path, merged)?;
                path.pop();
            }
        }
        _ => {}
    }
    Ok(())
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() <= 128
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn looks_secret(s: &str) -> bool {
    let opts = RedactOptions {
        force: true,
        ..RedactOptions::default()
    };
    // Fail closed: without the redactor, trust only the name check.
    Redactor::global().is_some_and(|r| !r.redact_report(s, &opts).findings.is_empty())
}
