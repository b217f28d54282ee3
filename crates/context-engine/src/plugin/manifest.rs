//! `plugin.yaml`: what a plugin folder declares about the process to start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::PluginError;

/// The manifest's file name inside a plugin folder.
pub const MANIFEST_FILE: &str = "plugin.yaml";

/// Deadlines for talking to a plugin process. Every read has one, so a hung
/// plugin costs the host at most this long per hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timeouts {
    /// From spawn to the `initialize` answer (interpreters start slowly).
    pub startup_ms: u64,
    /// Any hook but `compress`.
    pub call_ms: u64,
    /// `compress`, which may call a model of its own.
    pub compress_ms: u64,
    /// First pause before restarting a failed process; doubles per
    /// consecutive failure, capped at 30 s. Hooks within the pause answer
    /// their fail-open default without a round trip.
    pub restart_backoff_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            startup_ms: 10_000,
            call_ms: 5_000,
            compress_ms: 120_000,
            restart_backoff_ms: 500,
        }
    }
}

impl Timeouts {
    /// [`startup_ms`](Self::startup_ms) as a duration.
    pub fn startup(&self) -> Duration {
        Duration::from_millis(self.startup_ms)
    }

    /// [`call_ms`](Self::call_ms) as a duration.
    pub fn call(&self) -> Duration {
        Duration::from_millis(self.call_ms)
    }

    /// [`compress_ms`](Self::compress_ms) as a duration.
    pub fn compress(&self) -> Duration {
        Duration::from_millis(self.compress_ms)
    }

    /// The pause before the restart that follows `failures` consecutive
    /// failures (1 = the first).
    /// [`crate::retry::Backoff`] from `restart_backoff_ms`, capped at 30 s.
    pub fn backoff(&self, failures: u32) -> Duration {
        crate::retry::Backoff::exponential(Duration::from_millis(self.restart_backoff_ms))
            .capped(Duration::from_secs(30))
            .delay(failures)
    }
}

/// The default for [`PluginManifest::max_failures`].
pub const DEFAULT_MAX_FAILURES: u32 = 3;

fn default_max_failures() -> u32 {
    DEFAULT_MAX_FAILURES
}

/// The raw file, with the spans needed to point at a bad value.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    name: Spanned<String>,
    version: Spanned<String>,
    command: Spanned<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    timeouts: Timeouts,
    #[serde(default)]
    description: Option<String>,
    #[serde(default = "default_max_failures")]
    max_failures: u32,
}

/// A parsed `plugin.yaml`, with the folder it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PluginManifest {
    /// The engine's name (normally the folder's name).
    pub name: String,
    /// The plugin's own version, for status and logs.
    pub version: String,
    /// Program and arguments. A program given as a relative path
    /// (`./engine`, `bin/engine`) resolves in the plugin folder; a bare name
    /// (`python3`) is looked up on `PATH`.
    pub command: Vec<String>,
    /// Variables added to the host's environment for the process.
    pub env: BTreeMap<String, String>,
    /// Deadlines (see [`Timeouts`]).
    pub timeouts: Timeouts,
    /// One line for humans.
    pub description: Option<String>,
    /// Consecutive failures after which the host gives up on the plugin and
    /// uses the built-in compressor for the rest of the session.
    pub max_failures: u32,
    /// The plugin folder: the process's working directory.
    pub dir: PathBuf,
    /// The manifest file itself, for messages.
    pub path: PathBuf,
}

impl PluginManifest {
    /// Reads and checks `path` (a `plugin.yaml`).
    pub fn load(path: &Path) -> Result<PluginManifest, PluginError> {
        let text = std::fs::read_to_string(path).map_err(|source| PluginError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        PluginManifest::parse(&text, path)
    }

    /// Parses manifest `text` read from `path` (the folder of `path` is the
    /// plugin folder).
    pub fn parse(text: &str, path: &Path) -> Result<PluginManifest, PluginError> {
        let raw: RawManifest = serde_saphyr::from_str(text).map_err(|e| {
            let (line, column) = e
                .location()
                .map(|l| (l.line(), l.column()))
                .unwrap_or((0, 0));
            PluginError::Manifest {
                path: path.to_path_buf(),
                line,
                column,
                reason: first_line(&e.to_string()),
            }
        })?;
        let bad = |at: &serde_saphyr::Location, reason: &str| PluginError::Manifest {
            path: path.to_path_buf(),
            line: at.line(),
            column: at.column(),
            reason: reason.to_owned(),
        };
        if raw.name.value.trim().is_empty() {
            return Err(bad(&raw.name.referenced, "`name` is empty"));
        }
        if raw.version.value.trim().is_empty() {
            return Err(bad(&raw.version.referenced, "`version` is empty"));
        }
        match raw.command.value.first() {
            None => {
                return Err(bad(
                    &raw.command.referenced,
                    "`command` must list the program and its arguments",
                ));
            }
            Some(p) if p.trim().is_empty() => {
                return Err(bad(&raw.command.referenced, "`command` program is empty"));
            }
            Some(_) => {}
        }
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(PluginManifest {
            name: raw.name.value,
            version: raw.version.value,
            command: raw.command.value,
            env: raw.env,
            timeouts: raw.timeouts,
            description: raw.description,
            max_failures: raw.max_failures.max(1),
            dir,
            path: path.to_path_buf(),
        })
    }

    /// The program to run: relative paths with a separator resolve in the
    /// plugin folder, bare names are left to the `PATH` lookup.
    pub fn program(&self) -> PathBuf {
        let program = self.command.first().map(String::as_str).unwrap_or("");
        let p = Path::new(program);
        if p.is_relative() && p.components().count() > 1 || program.starts_with("./") {
            self.dir.join(p)
        } else {
            p.to_path_buf()
        }
    }
}

/// The first line of a possibly multi-line rendered error.
fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or(text).trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PluginManifest, PluginError> {
        PluginManifest::parse(text, Path::new("/plugins/x/plugin.yaml"))
    }

    #[test]
    fn full_manifest_parses_with_defaults_filled() {
        let m = parse(
            "name: x\nversion: '1.0'\ncommand: [python3, engine.py]\nenv:\n  A: b\ntimeouts:\n  call_ms: 10\n",
        )
        .unwrap();
        assert_eq!(m.name, "x");
        assert_eq!(m.command, vec!["python3", "engine.py"]);
        assert_eq!(m.env.get("A").map(String::as_str), Some("b"));
        assert_eq!(m.timeouts.call_ms, 10);
        assert_eq!(m.timeouts.startup_ms, Timeouts::default().startup_ms);
        assert_eq!(m.max_failures, DEFAULT_MAX_FAILURES);
        assert_eq!(m.dir, PathBuf::from("/plugins/x"));
        assert_eq!(m.program(), PathBuf::from("python3"));
    }

    #[test]
    fn relative_program_resolves_in_the_plugin_folder() {
        let m = parse("name: x\nversion: '1'\ncommand: [./run.sh, a]\n").unwrap();
        assert_eq!(m.program(), PathBuf::from("/plugins/x/./run.sh"));
        let m = parse("name: x\nversion: '1'\ncommand: [bin/run]\n").unwrap();
        assert_eq!(m.program(), PathBuf::from("/plugins/x/bin/run"));
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = parse("name: x\nversion: '1'\ncommand: []\n").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("/plugins/x/plugin.yaml:3"), "{text}");
        let e =
            parse("name: x\nversion: '1'\ncommand: [a]\ntimeouts:\n  call_sec: 3\n").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("/plugins/x/plugin.yaml:5"), "{text}");
        let e = parse("name: x\ncommand: [a]\n").unwrap_err();
        assert!(e.to_string().contains("version"), "{e}");
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let t = Timeouts {
            restart_backoff_ms: 100,
            ..Timeouts::default()
        };
        assert_eq!(t.backoff(1), Duration::from_millis(100));
        assert_eq!(t.backoff(3), Duration::from_millis(400));
        assert_eq!(t.backoff(40), Duration::from_secs(30));
    }
}
