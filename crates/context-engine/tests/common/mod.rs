//! Helpers shared by the integration tests: where the shared corpus of real
//! agent transcripts is, and skipping (with the reason printed) where it is
//! absent, as CI's machines may not have it.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared/corpus` next to the repository (or `CTX_CORPUS_DIR`), or
/// `None` with the reason printed.
pub fn corpus_dir() -> Option<PathBuf> {
    // `CTX_CORPUS_DIR` points elsewhere (a git worktree has no `../shared`).
    let dir = std::env::var_os("CTX_CORPUS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"),
        PathBuf::from,
    );
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: no corpus at {}", dir.display());
        None
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
        eprintln!("skipped: corpus at {} has no transcripts", dir.display());
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
