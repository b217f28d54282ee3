#![allow(clippy::unwrap_used, clippy::expect_used)]
//! No secret at rest in the clear: a session whose tool outputs hold an
//! AWS key, a GitHub token, an RSA private key and a secret only the
//! user's pattern knows is driven through `host::Session` with a SQLite
//! store, and every byte of the store's files (the database, its `-wal`
//! and `-shm`, every column of every table, DEFLATE blobs inflated) is
//! scanned for each secret: by default none is found; with
//! `store.verbatim` and a key none either (ciphertext) and recall gives the
//! verbatim text back; verbatim without a key keeps them (the control) and
//! a deleted session leaves none. The files are 0600, a folder the store
//! creates 0700.

use context_engine_testkit::secrets;
use context_engine_testkit::sqlite_scan;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use context_engine::Message;
use context_engine::compressor::Compressor;
use context_engine::engine::Usage;
use context_engine::host::Session;
use context_engine::message::{Content, Role};
use context_engine::redact::{Egress, Redactor};
use context_engine::store::{AtRest, Seal, SessionStore, StoreError};
use context_engine::tokens::{BpeCounter, CachedCounter, Encoding, TokenCounter};
use context_engine::transcript::Transcript;
use context_engine::validate::is_tool_reentry;
use context_engine_sqlite::open_at_rest;

const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const OTHER_KEY_HEX: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn egress() -> Egress {
    let redactor = Redactor::builder()
        .pattern(secrets::USER_PATTERN)
        .build()
        .unwrap();
    Egress::new(Some(Arc::new(redactor)))
}

fn seal(hex: &str) -> Seal {
    Seal::from_text("CTX_TEST_STORE_KEY", hex).unwrap()
}

/// The example session with the secrets planted in four early tool
/// outputs and one tool call's arguments (all compacted away later).
fn recording() -> Vec<Message> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/coding-session.json");
    let mut messages = Transcript::load(&path).unwrap().messages;
    for i in [3, 5, 13, 15] {
        assert!(messages[i].is_tool_result());
        let text = secrets::planted(&messages[i].text());
        messages[i].content = Content::Text(text);
    }
    let call = messages[4]
        .tool_calls
        .as_mut()
        .and_then(|c| c.first_mut())
        .and_then(|c| c.function.as_mut())
        .unwrap();
    call.arguments = serde_json::json!({"command": format!("curl -H 'Authorization: token {}' api", secrets::GITHUB)}).to_string();
    messages
}

fn counter() -> Arc<dyn TokenCounter> {
    Arc::new(CachedCounter::new(BpeCounter::new(Encoding::O200kBase)))
}

/// Drives a session over every call of `recording` with `store`, as an
/// agent would; returns how many compactions the store recorded.
fn drive(store: &Arc<dyn SessionStore>, recording: &[Message]) -> usize {
    let counter = counter();
    let mut session = Session::new(
        "leaky",
        Box::new(Compressor::new(Arc::clone(&counter), 8_000)),
        Arc::clone(&counter),
    )
    .with_store(Arc::clone(store))
    .unwrap();
    let mut history: Vec<Message> = Vec::new();
    let mut cursor = 0;
    let calls: Vec<usize> = recording
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Assistant)
        .map(|(i, _)| i)
        .collect();
    for index in calls {
        let segment = &recording[cursor..index];
        let tools = segment
            .iter()
            .position(|m| !(m.is_tool_result() || is_tool_reentry(m)))
            .unwrap_or(segment.len());
        history.extend_from_slice(&segment[..tools]);
        if tools > 0
            && let Some(new) = session.after_tools(&history).new_history
        {
            history = new;
        }
        history.extend_from_slice(&segment[tools..]);
        let prepared = session.before_request(&history);
        if let Some(new) = prepared.update.new_history {
            history = new;
        }
        history.push(recording[index].clone());
        let prompt = counter.count_messages(&prepared.request) as u64;
        session.after_response(&Usage::new(prompt, 50));
        cursor = index + 1;
    }
    store.compactions("leaky").unwrap().len()
}

/// A fresh folder (not created yet) for a store file.
fn fresh(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ctx-at-rest-{}-{name}/private", std::process::id()));
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    dir.join("store.db")
}

/// The handles of archived tool results that held a secret.
fn secret_handles(recording: &[Message]) -> Vec<String> {
    [3, 5, 13, 15]
        .iter()
        .map(|&i| recording[i].tool_call_id.clone().unwrap())
        .collect()
}

#[test]
fn planted_secrets_are_what_egress_masks() {
    let e = egress();
    let text = secrets::planted("output");
    let masked = e.string(&text);
    assert!(
        secrets::found(text.as_bytes()).len() == 4,
        "the scan finds all four in the clear"
    );
    assert!(secrets::found(masked.as_bytes()).is_empty(), "{masked}");
}

#[test]
fn the_default_store_keeps_no_secret_in_any_file() {
    let path = fresh("default");
    let recording = recording();
    let store = open_at_rest(&path, &AtRest::redacted(egress())).unwrap();
    let compactions = drive(&store, &recording);
    assert!(compactions >= 2, "{compactions} compactions");
    // The planted outputs were archived (masked) and resolve.
    for handle in secret_handles(&recording) {
        let entry = store
            .resolve(Some("leaky"), &handle)
            .unwrap()
            .expect(&handle);
        let text = entry.messages[0].text();
        assert!(text.contains("[REDACTED PRIVATE KEY]"), "{text}");
        assert!(secrets::found(text.as_bytes()).is_empty(), "{text}");
    }
    // While open (the log holds the latest pages) and after.
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());
    #[cfg(unix)]
    {
        for suffix in ["", "-wal", "-shm"] {
            let file = PathBuf::from(format!("{}{suffix}", path.display()));
            assert_eq!(secrets::mode(&file), 0o600, "{}", file.display());
        }
        assert_eq!(secrets::mode(path.parent().unwrap()), 0o700);
    }
    drop(store);
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());
    // The search index holds the masked text: a secret is not found, its
    // masked neighbourhood is.
    let store = open_at_rest(&path, &AtRest::redacted(egress())).unwrap();
    assert!(
        store
            .search(Some("leaky"), secrets::AWS, 5)
            .unwrap()
            .is_empty()
    );
    let hits = store.search(Some("leaky"), "aws_access_key_id", 5).unwrap();
    assert!(!hits.is_empty());
    for line in hits.iter().flat_map(|h| &h.lines) {
        assert!(
            secrets::found(line.text.as_bytes()).is_empty(),
            "{}",
            line.text
        );
    }
}

#[test]
fn a_verbatim_store_with_a_key_keeps_ciphertext_and_recalls_the_verbatim_text() {
    let path = fresh("sealed");
    let recording = recording();
    let at_rest = AtRest::verbatim(egress(), Some(seal(KEY_HEX)));
    let store = open_at_rest(&path, &at_rest).unwrap();
    assert!(drive(&store, &recording) >= 2);
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());
    let handles = secret_handles(&recording);
    for (handle, i) in handles.iter().zip([3, 5, 13, 15]) {
        let entry = store.resolve(Some("leaky"), handle).unwrap().expect(handle);
        assert_eq!(entry.messages[0], recording[i], "verbatim with the key");
    }
    // The state comes back whole.
    let state = store.load_state("leaky").unwrap().expect("state");
    assert!(
        state.is_object() && state.get("ctx_sealed").is_none(),
        "{state}"
    );
    // The index holds the redacted text, never the verbatim.
    assert!(
        store
            .search(Some("leaky"), secrets::AWS, 5)
            .unwrap()
            .is_empty()
    );
    drop(store);
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());

    // Another key: an error that names the variable, never garbage.
    let wrong = open_at_rest(
        &path,
        &AtRest::verbatim(egress(), Some(seal(OTHER_KEY_HEX))),
    )
    .unwrap();
    let err = wrong.resolve(Some("leaky"), &handles[0]).unwrap_err();
    assert!(err.to_string().contains("CTX_TEST_STORE_KEY"), "{err}");
    let err = wrong.load_state("leaky").unwrap_err();
    assert!(err.to_string().contains("CTX_TEST_STORE_KEY"), "{err}");
    drop(wrong);
    // No key: says which setting opens it.
    let keyless = open_at_rest(&path, &AtRest::redacted(egress())).unwrap();
    let err = keyless.resolve(Some("leaky"), &handles[0]).unwrap_err();
    assert!(
        matches!(err, StoreError::Backend { .. })
            && err.to_string().contains("store.encryption_key_env"),
        "{err}"
    );
}

#[test]
fn a_ciphertext_moved_to_another_record_is_refused() {
    let path = fresh("moved");
    let recording = recording();
    let at_rest = AtRest::verbatim(egress(), Some(seal(KEY_HEX)));
    let store = open_at_rest(&path, &at_rest).unwrap();
    drive(&store, &recording);
    drop(store);
    // Swap the stored bodies of two archived messages.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let ids: Vec<i64> = conn
        .prepare("SELECT id FROM messages ORDER BY id LIMIT 2")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    conn.execute_batch(&format!(
        "UPDATE messages SET json = (SELECT json FROM messages WHERE id = {b}) WHERE id = {a};",
        a = ids[0],
        b = ids[1]
    ))
    .unwrap();
    drop(conn);
    let store = open_at_rest(&path, &at_rest).unwrap();
    let first = store.handles("leaky").unwrap();
    let errors = first
        .iter()
        .filter_map(|h| store.resolve(Some("leaky"), h).err())
        .count();
    assert!(errors > 0, "a moved ciphertext is an error");
}

#[test]
fn a_verbatim_store_without_a_key_is_in_the_clear_until_the_session_is_deleted() {
    let path = fresh("clear");
    let recording = recording();
    let at_rest = AtRest::verbatim(egress(), None);
    assert!(
        at_rest
            .warning()
            .is_some_and(|w| w.contains("in the clear"))
    );
    let store = open_at_rest(&path, &at_rest).unwrap();
    assert!(drive(&store, &recording) >= 2);
    // The control: the scan sees what a verbatim store keeps.
    let found = sqlite_scan::scan_sqlite(&path);
    for name in ["aws", "github", "pem", "user-pattern"] {
        assert!(found.iter().any(|f| f.ends_with(name)), "{name}: {found:?}");
    }
    // Deleted: no page, no log frame and no index entry keeps them.
    store.delete_session("leaky").unwrap();
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());
    drop(store);
    assert_eq!(sqlite_scan::scan_sqlite(&path), Vec::<String>::new());
}

#[cfg(unix)]
#[test]
fn an_existing_store_file_others_can_read_is_made_private() {
    use std::os::unix::fs::PermissionsExt;
    let path = fresh("narrowed");
    drop(open_at_rest(&path, &AtRest::default()).unwrap());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(open_at_rest(&path, &AtRest::default()).unwrap());
    assert_eq!(secrets::mode(&path), 0o600);
}

#[test]
fn a_key_that_is_not_32_bytes_is_refused_naming_the_variable() {
    for bad in ["", "abc", &KEY_HEX[..62], "not base64 at all!!"] {
        let err = Seal::from_text("MY_KEY", bad).unwrap_err();
        assert!(err.to_string().contains("`MY_KEY`"), "{err}");
        assert!(!bad.is_empty() && !err.to_string().contains(bad) || bad.is_empty());
    }
    let b64 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    assert!(Seal::from_text("MY_KEY", b64).is_ok());
}
