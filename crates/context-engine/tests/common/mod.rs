//! Helpers shared by the integration tests: where the shared corpus of real
//! agent transcripts is, and what a test does when a prerequisite (corpus,
//! python3, a reference file) is missing: under CI (`CI=true`) it fails,
//! naming what is missing; elsewhere it is skipped with the reason printed.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A prerequisite of the running test is missing: under CI this fails the
/// test (a suite must not pass by running nothing); elsewhere it prints
/// `skipped: {reason}` and the caller returns.
pub fn skip(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("prerequisite missing under CI=true: {reason}");
    }
    eprintln!("skipped: {reason}");
}

/// `python3` runs, else [`skip`].
pub fn python() -> bool {
    let ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip("python3 is not available");
    }
    ok
}

/// `shared/{rel}` beside the repository or beside any folder above it (a
/// worktree may sit one level deeper than the main checkout), without
/// skipping.
pub fn find_shared(rel: &str) -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .skip(2)
        .map(|dir| dir.join("shared").join(rel))
        .find(|path| path.exists())
}

/// `shared/{rel}` (see [`find_shared`]), else [`skip`].
pub fn shared(rel: &str) -> Option<PathBuf> {
    let found = find_shared(rel);
    if found.is_none() {
        skip(&format!(
            "no shared/{rel} beside the repository or a folder above it"
        ));
    }
    found
}

/// The shared corpus: `$CTX_CORPUS_DIR`, else `shared/corpus` (see
/// [`find_shared`]); [`skip`] when there is none.
pub fn corpus_dir() -> Option<PathBuf> {
    match std::env::var_os("CTX_CORPUS_DIR") {
        Some(dir) if Path::new(&dir).is_dir() => Some(PathBuf::from(dir)),
        Some(dir) => {
            skip(&format!(
                "$CTX_CORPUS_DIR={} is not a folder",
                dir.to_string_lossy()
            ));
            None
        }
        None => shared("corpus"),
    }
}

/// The corpus transcripts (`.json`, `.traj`, `.jsonl`), sorted by name, or
/// `None` with the reason printed.
pub fn corpus_files() -> Option<Vec<PathBuf>> {
    let dir = corpus_dir()?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "json" || e == "traj" || e == "jsonl")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        skip(&format!("corpus at {} has no transcripts", dir.display()));
        return None;
    }
    Some(files)
}

/// The file name of `path`, for messages.
pub fn name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Re-runs the ignored test `child` of this test binary in a child process
/// with `key=value` set, and asserts it passed. Environment switches are
/// checked this way because setting a variable in this process would race
/// with the other tests.
pub fn run_child_with_env(child: &str, key: &str, value: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child, "--include-ignored"])
        .env(key, value)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child {child} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tiny deterministic generator (an LCG), so the sessions are the same
/// on every run and every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}
