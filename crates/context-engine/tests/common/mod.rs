//! Helpers shared by the integration tests: where the shared corpus of real
//! agent transcripts is, and skipping (with the reason printed) where it is
//! absent, as CI's machines may not have it.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared/corpus` next to the repository, or `None` with the reason
/// printed.
pub fn corpus_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus");
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
