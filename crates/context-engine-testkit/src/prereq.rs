//! What a test does when a prerequisite (the corpus, python3, a reference
//! file, the Postgres server, a browser, a model server) is missing: under
//! CI it fails, naming what is missing, so a suite never passes by running
//! nothing; elsewhere it is skipped with the reason printed. And where the
//! shared corpus of real agent transcripts is (read at run time).

use std::path::{Path, PathBuf};

/// Whether the tests run under CI: `CI` is `true` (any case) or `1`, the
/// two values CI services set. `.ci/run` exports `CI=true` itself.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// A prerequisite of the running test is missing: under CI ([`in_ci`])
/// this fails the test; elsewhere it prints `skipped: {reason}` and the
/// caller returns.
pub fn skip(reason: &str) {
    assert!(!in_ci(), "prerequisite missing under CI=true: {reason}");
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
    // This crate sits at `crates/context-engine-testkit`: two levels below
    // the repository root, as every crate of the workspace.
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
/// `None` after [`skip`] when there are none.
pub fn corpus_files() -> Option<Vec<PathBuf>> {
    let dir = corpus_dir()?;
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "json" || e == "traj" || e == "jsonl")
            })
            .collect(),
        Err(e) => {
            skip(&format!("cannot read the corpus at {}: {e}", dir.display()));
            return None;
        }
    };
    files.sort();
    if files.is_empty() {
        skip(&format!("corpus at {} has no transcripts", dir.display()));
        return None;
    }
    Some(files)
}

/// The file name of `path`, for messages.
pub fn name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
