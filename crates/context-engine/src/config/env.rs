//! The environment a configuration is read in: a snapshot of variables the
//! caller takes once, e.g. `Env::from_os(std::env::vars_os())` in a binary.
//! The library never reads the process environment itself: the config
//! layer `CTX_<SECTION>__<KEY>`, the variables that name keys
//! (`summarizer.api_key_env`, `store.encryption_key_env`) and the default
//! locations (`XDG_DATA_HOME`, `HOME`) are all looked up here, so a test or
//! an embedding host decides what the engine sees.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::Arc;

/// Variables by name; cheap to clone (shared). Its `Debug` shows the names
/// only: values may be keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Env {
    vars: Arc<BTreeMap<String, String>>,
}

impl Env {
    /// No variables at all.
    pub fn empty() -> Env {
        Env::default()
    }

    /// From name/value pairs (a later pair of the same name wins).
    pub fn from_pairs<I, K, V>(pairs: I) -> Env
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Env {
            vars: Arc::new(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.into(), v.into()))
                    .collect(),
            ),
        }
    }

    /// From the operating system's pairs (`std::env::vars_os()`); a name
    /// or value that is not UTF-8 is left out (read as unset).
    pub fn from_os<I: IntoIterator<Item = (OsString, OsString)>>(vars: I) -> Env {
        Env::from_pairs(
            vars.into_iter()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// The value of `name`, if set (possibly empty).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// The value of `name` when set and not empty.
    pub fn non_empty(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.is_empty())
    }

    /// Every variable, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// This environment with `name` set to `value`.
    pub fn with(self, name: impl Into<String>, value: impl Into<String>) -> Env {
        let mut vars = Arc::unwrap_or_clone(self.vars);
        vars.insert(name.into(), value.into());
        Env {
            vars: Arc::new(vars),
        }
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.vars.keys()).finish()
    }
}

/// Set to `1` (or `true`, `yes`, `on`) to send every body: the digest then
/// returns the transcript unchanged. The configuration loader reads it as
/// `context.digest.enabled: false` ([`is_disable_value`]).
pub const DISABLE_ENV: &str = "CTX_TOOL_DIGEST_DISABLED";

/// Whether `value` (of [`DISABLE_ENV`]) turns the digest off: the
/// configuration loader reads it as `context.digest.enabled: false`.
pub fn is_disable_value(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_values() {
        let env = Env::from_pairs([("KEY", "sk-secret-value")]);
        let shown = format!("{env:?}");
        assert!(
            shown.contains("KEY") && !shown.contains("secret"),
            "{shown}"
        );
    }

    #[test]
    fn non_utf8_is_unset_and_empty_is_not_non_empty() {
        use std::os::unix::ffi::OsStringExt;
        let env = Env::from_os([
            (OsString::from("A"), OsString::from_vec(vec![0xff, 0xfe])),
            (OsString::from("B"), OsString::new()),
        ]);
        assert_eq!(env.get("A"), None);
        assert_eq!(env.get("B"), Some(""));
        assert_eq!(env.non_empty("B"), None);
        assert_eq!(env.with("B", "x").non_empty("B"), Some("x"));
    }
}
