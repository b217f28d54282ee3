//! The rule table: its TOML schema (close to gitleaks') and its compiled form.

use regex_automata::meta::Regex;
use regex_automata::util::syntax;
use serde::Deserialize;

use super::RedactError;

/// The built-in rule table, compiled into the binary so that redaction never
/// depends on a file being present at run time.
pub(crate) const BUILTIN_RULES: &str = include_str!("rules.toml");

/// Longest stretch (bytes) a rule with an unbounded regex may inspect on each
/// side of a keyword; keeps the cost of one keyword hit bounded.
const UNBOUNDED_REACH: usize = 4096;
/// Same for rules whose match may span lines (PEM blocks).
const UNBOUNDED_REACH_MULTILINE: usize = 16 * 1024;

/// A rule table file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleFile {
    #[serde(default)]
    allowlist: Option<AllowlistSpec>,
    #[serde(default)]
    rules: Vec<RuleSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowlistSpec {
    #[serde(default)]
    regexes: Vec<String>,
}

/// One `[[rules]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    id: String,
    #[serde(default)]
    #[allow(dead_code)]
    description: String,
    regex: String,
    #[serde(default)]
    keywords: Vec<String>,
    #[serde(default, rename = "secretGroup")]
    secret_group: Option<usize>,
    #[serde(default)]
    entropy: Option<f64>,
    #[serde(default)]
    generic: bool,
    #[serde(default)]
    url_credentials: bool,
    #[serde(default)]
    multiline: bool,
    #[serde(default)]
    replace: Option<String>,
    #[serde(default)]
    filter: Option<Filter>,
}

/// Extra checks of a candidate secret that a regex cannot express cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Filter {
    /// Value of a `KEY = value` assignment: literals only, never code
    /// references, numbers or paths.
    Assignment,
    /// Unprefixed random key: needs a digit and a letter, no paths or URLs.
    Random,
    /// Header-style credential: anything but a path, a URL or `user@host`.
    Credential,
    /// A JSON Web Token, recognised by its header: base64url of a JSON
    /// object naming `alg` or `typ`, whatever the payload.
    Jwt,
}

/// A rule ready to run.
#[derive(Debug)]
pub(crate) struct Rule {
    pub(crate) id: String,
    pub(crate) regex: Regex,
    pub(crate) keywords: Vec<String>,
    pub(crate) secret_group: Option<usize>,
    pub(crate) entropy: Option<f64>,
    pub(crate) generic: bool,
    pub(crate) url_credentials: bool,
    pub(crate) multiline: bool,
    pub(crate) replace: Option<String>,
    pub(crate) filter: Option<Filter>,
    /// Bytes the regex may reach on either side of a keyword hit.
    pub(crate) reach: usize,
}

/// Compile a pattern as a byte regex in ASCII mode (`\w`, `\b`, `(?i)` are
/// ASCII), the fast mode; fall back to Unicode mode for user patterns that
/// need it (`\p{..}`). Also returns the longest match length in bytes, when
/// the pattern bounds it.
pub(crate) fn compile(pattern: &str) -> Result<(Regex, Option<usize>), PatternError> {
    let ascii = syntax::Config::new().unicode(false).utf8(false);
    let hir = match syntax::parse_with(pattern, &ascii) {
        Ok(hir) => hir,
        Err(_) => syntax::parse_with(pattern, &syntax::Config::new().utf8(false))
            .map_err(|e| PatternError::Syntax(Box::new(e)))?,
    };
    let max_len = hir.properties().maximum_len();
    let regex = Regex::builder()
        .configure(Regex::config().utf8_empty(false))
        .build_from_hir(&hir)
        .map_err(|e| PatternError::Build(Box::new(e)))?;
    Ok((regex, max_len))
}

/// Why a pattern does not compile (the parser's or the builder's own
/// message; [`RedactError::Regex`] adds which pattern).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PatternError {
    /// Not a regular expression.
    #[error(transparent)]
    Syntax(Box<regex_syntax::Error>),
    /// A regular expression the engine cannot build (too big, ...).
    #[error(transparent)]
    Build(Box<regex_automata::meta::BuildError>),
}

/// Parse a rule table (TOML text) into compiled rules and allowlist regexes.
/// `source` names the table in errors.
pub(crate) fn parse_table(
    text: &str,
    source: &str,
) -> Result<(Vec<Rule>, Vec<Regex>), RedactError> {
    let file: RuleFile = toml::from_str(text).map_err(|e| RedactError::Table {
        source_name: source.to_owned(),
        message: e.to_string(),
    })?;
    let mut allow = Vec::new();
    if let Some(spec) = file.allowlist {
        for (i, pattern) in spec.regexes.iter().enumerate() {
            let (re, _) = compile(pattern).map_err(|e| RedactError::Regex {
                what: format!("{source}: allowlist regex #{i}"),
                pattern: pattern.clone(),
                message: e.to_string(),
            })?;
            allow.push(re);
        }
    }
    let mut rules = Vec::with_capacity(file.rules.len());
    for spec in file.rules {
        rules.push(build_rule(spec, source)?);
    }
    Ok((rules, allow))
}

fn build_rule(spec: RuleSpec, source: &str) -> Result<Rule, RedactError> {
    let (regex, max_len) = compile(&spec.regex).map_err(|e| RedactError::Regex {
        what: format!("{source}: rule `{}`", spec.id),
        pattern: spec.regex.clone(),
        message: e.to_string(),
    })?;
    if spec.keywords.iter().all(|k| k.is_empty()) {
        return Err(RedactError::Table {
            source_name: source.to_owned(),
            message: format!(
                "rule `{}` has no keyword; every rule needs one for the prefilter",
                spec.id
            ),
        });
    }
    if let Some(g) = spec.secret_group
        && g >= regex
            .group_info()
            .group_len(regex_automata::PatternID::ZERO)
    {
        return Err(RedactError::Table {
            source_name: source.to_owned(),
            message: format!("rule `{}`: secretGroup {g} does not exist", spec.id),
        });
    }
    let cap = if spec.multiline {
        UNBOUNDED_REACH_MULTILINE
    } else {
        UNBOUNDED_REACH
    };
    let reach = max_len.map_or(cap, |m| m.min(cap));
    Ok(Rule {
        id: spec.id,
        regex,
        keywords: spec
            .keywords
            .into_iter()
            .filter(|k| !k.is_empty())
            .collect(),
        secret_group: spec.secret_group,
        entropy: spec.entropy,
        generic: spec.generic,
        url_credentials: spec.url_credentials,
        multiline: spec.multiline,
        replace: spec.replace,
        filter: spec.filter,
        reach,
    })
}

/// A user pattern (config `security.redact_patterns`): the whole match is the
/// secret; the keyword prefilter cannot apply, so the regex scans every text.
pub(crate) fn user_rule(index: usize, pattern: &str) -> Result<Rule, RedactError> {
    let (regex, _) = compile(pattern).map_err(|e| RedactError::Regex {
        what: format!("user pattern #{index}"),
        pattern: pattern.to_owned(),
        message: e.to_string(),
    })?;
    Ok(Rule {
        id: format!("user-pattern-{index}"),
        regex,
        keywords: Vec::new(),
        secret_group: None,
        entropy: None,
        generic: false,
        url_credentials: false,
        multiline: true,
        replace: None,
        filter: None,
        reach: usize::MAX,
    })
}
