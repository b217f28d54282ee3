//! Secret redaction before any text leaves the process.
//!
//! Summaries persist and are fed back into every later prompt, often through
//! another provider: a secret that reaches one once has leaked for good. So
//! every outgoing text goes through [`Egress`] (the user's patterns, always
//! forced), the one helper for text that leaves the process.
//!
//! The rules are data (`rules.toml`, gitleaks-like, compiled in). Speed comes
//! from never running a regex blindly: one Aho-Corasick pass finds the rules'
//! keywords, and each rule's byte regex (ASCII mode) only runs on the few
//! bytes around its keyword hits.

mod egress;
mod filters;
mod normalize;
mod rules;
mod scan;

use std::borrow::Cow;
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};
use regex_automata::meta::Regex;

use rules::Rule;

pub use egress::Egress;

/// Environment variable through which a user can opt out of redaction
/// (`CTX_REDACT_SECRETS=0`): the configuration loader reads it as
/// `security.redact_secrets: false`; never honoured where
/// [`RedactOptions::force`] is set (egress, the store).
pub const OPT_OUT_ENV: &str = "CTX_REDACT_SECRETS";

/// Whether `value` (of [`OPT_OUT_ENV`]) means "do not redact".
pub fn is_opt_out_value(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "0" | "false" | "no" | "off"
    )
}

/// Replacement of a whole PEM private-key block.
pub const PRIVATE_KEY_REPLACEMENT: &str = "[REDACTED PRIVATE KEY]";

/// How one call redacts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedactOptions {
    /// Redact even when the user opted out: text leaving the process (to a
    /// summarizer, a plugin) is always redacted.
    pub force: bool,
    /// Also mask sensitive URL query/fragment parameters and all URL userinfo.
    pub url_credentials: bool,
    /// The text is a source file: skip generic `KEY = value` assignment rules,
    /// which misfire on code.
    pub code_file: bool,
}

/// Why a redactor could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RedactError {
    /// A rule table is not valid TOML or breaks the table's rules.
    #[error("rule table {source_name}: {message}")]
    Table {
        /// Which table (`builtin` or the name given by the caller).
        source_name: String,
        /// What is wrong, with the position when TOML reports one.
        message: String,
    },
    /// A regex (rule, allowlist entry or user pattern) does not compile.
    #[error("{what}: invalid regex `{pattern}`: {message}")]
    Regex {
        /// Which regex: rule id, allowlist index or user pattern index.
        what: String,
        /// The pattern as written.
        pattern: String,
        /// The regex parser's message.
        message: String,
    },
    /// The keyword prefilter could not be built.
    #[error("keyword prefilter: {0}")]
    Prefilter(String),
}

/// One masked secret, for reports (`ctx redact --report`). Carries the masked
/// form only, never the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Id of the rule that matched (the first one when several overlap).
    pub rule: String,
    /// 1-based line of the secret's start in the input.
    pub line: usize,
    /// Byte range of the replaced text in the input.
    pub start: usize,
    /// End of that range (exclusive).
    pub end: usize,
    /// What replaced it.
    pub masked: String,
}

/// The redacted text and what was masked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redaction<'a> {
    /// The text, borrowed when nothing was masked.
    pub text: Cow<'a, str>,
    /// What was masked, in text order.
    pub findings: Vec<Finding>,
}

/// Mask a secret so that a person can still tell which key it was: shorter
/// than 18 characters → `***`, else the first 6 and last 4 around `...`.
pub fn mask(secret: &str) -> String {
    let n = secret.chars().count();
    if n < 18 {
        return "***".to_owned();
    }
    let head: String = secret.chars().take(6).collect();
    let tail: String = secret.chars().skip(n - 4).collect();
    format!("{head}...{tail}")
}

/// Redact `text` with the built-in rules (one compiled table, built once and
/// shared; no opt-out: a user's `security.redact_secrets: false` applies to
/// the [`Redactor`] built from their configuration). Unchanged text is not
/// copied.
pub fn redact<'a>(text: &'a str, opts: &RedactOptions) -> Cow<'a, str> {
    match Redactor::global() {
        Some(r) => r.redact(text, opts),
        // Unreachable in practice (the built-in table is tested); fail
        // closed rather than let a text out unredacted.
        None => Cow::Owned("[REDACTED: redactor unavailable]".to_owned()),
    }
}

/// A compiled rule set plus the user's opt-out settings. Build one with
/// [`Redactor::builder`] to add config (`security.redact_secrets`,
/// `security.redact_patterns`); [`redact`] uses a default one.
#[derive(Debug)]
pub struct Redactor {
    rules: Vec<Rule>,
    allow: Vec<Regex>,
    prefilter: AhoCorasick,
    /// For each prefilter pattern, the rules that use it as a keyword.
    keyword_rules: Vec<Vec<usize>>,
    /// Rules without keywords (user patterns): scanned on every text.
    unfiltered: Vec<usize>,
    enabled: bool,
}

/// Builder of a [`Redactor`].
#[derive(Clone, Debug)]
pub struct RedactorBuilder {
    enabled: bool,
    builtin: bool,
    tables: Vec<(String, String)>,
    patterns: Vec<String>,
}

impl Default for RedactorBuilder {
    fn default() -> Self {
        Self {
            enabled: true,
            builtin: true,
            tables: Vec::new(),
            patterns: Vec::new(),
        }
    }
}

impl RedactorBuilder {
    /// Config `security.redact_secrets`: `false` opts out (unless a call
    /// forces redaction).
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Whether to load the built-in rule table (default `true`).
    pub fn builtin_rules(mut self, builtin: bool) -> Self {
        self.builtin = builtin;
        self
    }

    /// Add a rule table in the built-in format; `name` appears in errors.
    pub fn rule_table(mut self, name: impl Into<String>, toml: impl Into<String>) -> Self {
        self.tables.push((name.into(), toml.into()));
        self
    }

    /// Add a user pattern (config `security.redact_patterns`): every match
    /// is masked.
    pub fn pattern(mut self, pattern: impl Into<String>) -> Self {
        self.patterns.push(pattern.into());
        self
    }

    /// Add several user patterns.
    pub fn patterns<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.patterns.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Compile every table and pattern.
    pub fn build(self) -> Result<Redactor, RedactError> {
        let mut rules = Vec::new();
        let mut allow = Vec::new();
        if self.builtin {
            let (r, a) = rules::parse_table(rules::BUILTIN_RULES, "builtin")?;
            rules.extend(r);
            allow.extend(a);
        }
        for (name, text) in &self.tables {
            let (r, a) = rules::parse_table(text, name)?;
            rules.extend(r);
            allow.extend(a);
        }
        for (i, p) in self.patterns.iter().enumerate() {
            rules.push(rules::user_rule(i, p)?);
        }

        let mut keywords: Vec<String> = Vec::new();
        let mut keyword_rules: Vec<Vec<usize>> = Vec::new();
        let mut unfiltered = Vec::new();
        for (ri, rule) in rules.iter().enumerate() {
            if rule.keywords.is_empty() {
                unfiltered.push(ri);
            }
            for kw in &rule.keywords {
                let kw = kw.to_ascii_lowercase();
                match keywords.iter().position(|k| *k == kw) {
                    Some(i) => keyword_rules[i].push(ri),
                    None => {
                        keywords.push(kw);
                        keyword_rules.push(vec![ri]);
                    }
                }
            }
        }
        // A full DFA: the overlapping keyword pass is most of the scan's
        // time, and a DFA takes one table lookup per byte (about twice as
        // fast as the default NFA here; see `benches/redact.rs`).
        let prefilter = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .kind(Some(AhoCorasickKind::DFA))
            .build(&keywords)
            .map_err(|e| RedactError::Prefilter(e.to_string()))?;
        Ok(Redactor {
            rules,
            allow,
            prefilter,
            keyword_rules,
            unfiltered,
            enabled: self.enabled,
        })
    }
}

impl Redactor {
    /// A builder with the built-in rules, enabled, honouring the env opt-out.
    pub fn builder() -> RedactorBuilder {
        RedactorBuilder::default()
    }

    /// The process-wide default redactor (built-in rules), built on first use.
    /// `None` only if the built-in table failed to compile.
    pub fn global() -> Option<&'static Redactor> {
        static GLOBAL: OnceLock<Option<Redactor>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| Redactor::builder().build().ok())
            .as_ref()
    }

    /// Ids of the loaded rules, in table order.
    pub fn rule_ids(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.id.as_str())
    }

    /// Whether a call with `opts` redacts at all (the user may have opted
    /// out; `force` overrides).
    pub fn is_active(&self, opts: &RedactOptions) -> bool {
        opts.force || self.enabled
    }

    /// Redact `text`; unchanged text is borrowed, not copied.
    pub fn redact<'a>(&self, text: &'a str, opts: &RedactOptions) -> Cow<'a, str> {
        self.redact_report(text, opts).text
    }

    /// Redact `text` and report what was masked.
    pub fn redact_report<'a>(&self, text: &'a str, opts: &RedactOptions) -> Redaction<'a> {
        if !self.is_active(opts) {
            return Redaction {
                text: Cow::Borrowed(text),
                findings: Vec::new(),
            };
        }
        let replacements = if normalize::may_contain_invisible(text) {
            let stripped = normalize::strip(text);
            scan::find(self, &stripped.text, opts)
                .into_iter()
                .map(|s| {
                    let (start, end) = stripped.original_range(s.start, s.end);
                    scan::Replacement {
                        start,
                        end,
                        rule: s.rule,
                        with: s.with,
                    }
                })
                .collect()
        } else {
            scan::find(self, text, opts)
        };
        if replacements.is_empty() {
            return Redaction {
                text: Cow::Borrowed(text),
                findings: Vec::new(),
            };
        }
        let mut out = String::with_capacity(text.len());
        let mut findings = Vec::with_capacity(replacements.len());
        let mut last = 0;
        let mut line = 1;
        for r in replacements {
            if r.start < last {
                continue;
            }
            let bytes = text.as_bytes();
            line += memchr::memchr_iter(b'\n', &bytes[last..r.start]).count();
            out.push_str(&text[last..r.start]);
            out.push_str(&r.with);
            findings.push(Finding {
                rule: self.rules[r.rule].id.clone(),
                line,
                start: r.start,
                end: r.end,
                masked: r.with,
            });
            line += memchr::memchr_iter(b'\n', &bytes[r.start..r.end]).count();
            last = r.end;
        }
        out.push_str(&text[last..]);
        Redaction {
            text: Cow::Owned(out),
            findings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_lengths() {
        assert_eq!(mask("short"), "***");
        assert_eq!(mask("abcdefghijklmnopq"), "***");
        assert_eq!(mask("abcdefghijklmnopqr"), "abcdef...opqr");
    }

    #[test]
    fn builtin_table_compiles() {
        let r = Redactor::builder().build().unwrap();
        assert!(r.rule_ids().count() > 50);
    }

    #[test]
    fn opt_out_values() {
        assert!(is_opt_out_value("0"));
        assert!(is_opt_out_value(" false "));
        assert!(!is_opt_out_value("1"));
        assert!(!is_opt_out_value(""));
    }

    #[test]
    fn config_opt_out_and_force() {
        let r = Redactor::builder().enabled(false).build().unwrap();
        let text = "GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789";
        assert_eq!(r.redact(text, &RedactOptions::default()), text);
        let forced = RedactOptions {
            force: true,
            ..RedactOptions::default()
        };
        assert_ne!(r.redact(text, &forced), text);
    }
}
