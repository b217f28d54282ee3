//! What a session store keeps of the text it is given: [`AtRest`], the one
//! transform between the host (or a server) and any backend, and
//! [`AtRestStore`], the store that applies it around another.
//!
//! **By default** (`AtRest::redacted`) every text is redacted with the
//! egress rules (the built-in ones and the user's `security.redact_patterns`,
//! forced) before a backend sees it: archived messages (so the full-text
//! index and the compaction summaries too), the state snapshot, and a
//! server's history segments. An archived message keeps the hash and
//! handles of its verbatim form (so the handles a summary or digest line
//! names still resolve), and recall gives back the masked form; a server
//! that reloads a session from its segments holds the masked messages
//! from then on (the model then sees the mask where a secret was), while
//! its client chain, made of hashes of what the client sent, is unchanged,
//! so the lineage goes on.
//!
//! **Verbatim** (`store.verbatim: true`) keeps the texts as they are. With
//! a key (`store.encryption_key_env`) every stored text is encrypted with
//! XChaCha20-Poly1305 (random 24-byte nonces): an archived message is kept
//! as its masked form (what the index and search hits' lines read) with the
//! ciphertext of its verbatim JSON in a [`SEALED_FIELD`] field; the state
//! and each history segment are ciphertext whole. The associated data
//! binds each ciphertext to where it belongs: a message to its content
//! hash (messages are shared by every session that archives them; a
//! resolved entry is checked against its handle, which is computed from
//! the verbatim content), the state to its session, a segment to its
//! session and position. A ciphertext moved elsewhere, a wrong key or no
//! key is an error that names the variable, never garbage. Without a key
//! the texts are kept in the clear ([`AtRest::warning`]).

use std::sync::Arc;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde_json::Value;

use super::handle::{message_handle, message_hash, result_handles, span_handle};
use super::{
    Batch, CompactionRecord, Entry, EntryKind, HistoryWrite, SearchHit, SessionStore, Since,
    StoreError, Versioned,
};
use crate::message::Message;
use crate::redact::Egress;

/// The field of an archived message that holds the ciphertext of its
/// verbatim form (encrypted stores only).
pub const SEALED_FIELD: &str = "ctx_sealed";

/// The prefix of an encrypted history segment or state: the format's
/// version.
const SEALED_PREFIX: &str = "ctx-sealed:xc1:";

/// Nonce bytes of XChaCha20-Poly1305.
const NONCE_BYTES: usize = 24;

/// What a store keeps of the text it is given (see the module docs).
/// Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct AtRest {
    egress: Egress,
    verbatim: bool,
    seal: Option<Arc<Seal>>,
}

impl AtRest {
    /// The default: everything redacted with `egress` (the user's
    /// redactor) before it is stored.
    pub fn redacted(egress: Egress) -> AtRest {
        AtRest {
            egress,
            verbatim: false,
            seal: None,
        }
    }

    /// Texts kept verbatim, encrypted with `seal` when given (the search
    /// index then holds the text redacted with `egress`); in the clear
    /// without.
    pub fn verbatim(egress: Egress, seal: Option<Seal>) -> AtRest {
        AtRest {
            egress,
            verbatim: true,
            seal: seal.map(Arc::new),
        }
    }

    /// Whether stored texts are kept verbatim (encrypted or not).
    pub fn is_verbatim(&self) -> bool {
        self.verbatim
    }

    /// Whether stored texts are encrypted.
    pub fn is_encrypted(&self) -> bool {
        self.verbatim && self.seal.is_some()
    }

    /// The start-up warning of a store that keeps secrets in the clear
    /// (verbatim without a key), `None` otherwise.
    pub fn warning(&self) -> Option<&'static str> {
        (self.verbatim && self.seal.is_none()).then_some(
            "store.verbatim is on without store.encryption_key_env: archived messages, \
             session state and history are kept UNREDACTED AND UNENCRYPTED; any secret an \
             agent saw is at rest in the clear in the store",
        )
    }

    /// The redaction this policy stores (and search output shows) with.
    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    /// `store` with this policy applied to everything written to it and
    /// read from it.
    pub fn wrap(&self, store: Arc<dyn SessionStore>) -> Arc<dyn SessionStore> {
        Arc::new(AtRestStore {
            inner: store,
            policy: self.clone(),
        })
    }

    /// What the store keeps of archived message `message` (content hash
    /// `hash`).
    fn message(
        &self,
        location: &str,
        hash: &str,
        message: &Message,
    ) -> Result<Message, StoreError> {
        if self.verbatim && self.seal.is_none() {
            return Ok(message.clone());
        }
        let masked = self.egress.message_at_rest(message);
        let Some(seal) = self.seal.as_ref().filter(|_| self.verbatim) else {
            return Ok(masked.unwrap_or_else(|| message.clone()));
        };
        let mut stored = masked.unwrap_or_else(|| message.clone());
        let json = serde_json::to_string(message).map_err(|e| backend(location, e))?;
        let data = seal.seal(location, &message_aad(hash), json.as_bytes())?;
        stored.extra.insert(
            SEALED_FIELD.to_owned(),
            serde_json::json!({"hash": hash, "data": data}),
        );
        Ok(stored)
    }

    /// The message a stored one was made from: decrypted when sealed, as
    /// stored otherwise.
    fn open_message(&self, location: &str, stored: Message) -> Result<Message, StoreError> {
        let Some(sealed) = stored.extra.get(SEALED_FIELD) else {
            return Ok(stored);
        };
        let corrupt = |detail: &str| StoreError::Corrupt {
            location: location.to_owned(),
            detail: format!("encrypted archived message: {detail}"),
        };
        let (Some(hash), Some(data)) = (
            sealed.get("hash").and_then(Value::as_str),
            sealed.get("data").and_then(Value::as_str),
        ) else {
            return Err(corrupt("no hash or data"));
        };
        let seal = self.need_seal(location, "archived messages")?;
        let plain = seal.open(location, &message_aad(hash), data)?;
        let message: Message = serde_json::from_slice(&plain)
            .map_err(|e| corrupt(&format!("not a message once decrypted: {e}")))?;
        if message_hash(&message) != hash {
            return Err(corrupt(
                "its content does not have the hash it is stored under",
            ));
        }
        Ok(message)
    }

    /// `batch` as the store keeps it.
    fn batch(&self, location: &str, session: &str, batch: &Batch) -> Result<Batch, StoreError> {
        batch.at_rest(
            |hash, m| self.message(location, hash, m),
            |state| self.state(location, session, state),
        )
    }

    /// What the store keeps of `session`'s state.
    fn state(&self, location: &str, session: &str, state: &Value) -> Result<Value, StoreError> {
        if !self.verbatim {
            return Ok(self
                .egress
                .value_at_rest(state)
                .unwrap_or_else(|| state.clone()));
        }
        let Some(seal) = &self.seal else {
            return Ok(state.clone());
        };
        let json = serde_json::to_string(state).map_err(|e| backend(location, e))?;
        let data = seal.seal(location, &state_aad(session), json.as_bytes())?;
        Ok(serde_json::json!({ SEALED_FIELD: data }))
    }

    /// The state a stored one was made from.
    fn open_state(
        &self,
        location: &str,
        session: &str,
        stored: Value,
    ) -> Result<Value, StoreError> {
        let data = match &stored {
            Value::Object(map) if map.len() == 1 => match map.get(SEALED_FIELD) {
                Some(Value::String(data)) => data,
                _ => return Ok(stored),
            },
            _ => return Ok(stored),
        };
        let what = format!("the state of session `{session}`");
        let seal = self.need_seal(location, &what)?;
        let plain = seal.open(location, &state_aad(session), data)?;
        serde_json::from_slice(&plain).map_err(|e| StoreError::Corrupt {
            location: location.to_owned(),
            detail: format!("{what}: not JSON once decrypted: {e}"),
        })
    }

    /// What the store keeps of history segment `index` of `session`.
    fn segment(
        &self,
        location: &str,
        session: &str,
        index: usize,
        text: &str,
    ) -> Result<String, StoreError> {
        if !self.verbatim {
            // A server's segments are JSON: only their strings are masked,
            // the rest kept byte for byte. Any other text is masked whole.
            return Ok(match self.egress.json_at_rest(text) {
                Ok(masked) => masked.into_owned(),
                Err(_) => self.egress.string(text),
            });
        }
        let Some(seal) = &self.seal else {
            return Ok(text.to_owned());
        };
        let data = seal.seal(location, &segment_aad(session, index), text.as_bytes())?;
        Ok(format!("{SEALED_PREFIX}{data}"))
    }

    /// The segment a stored one was made from.
    fn open_segment(
        &self,
        location: &str,
        session: &str,
        index: usize,
        stored: String,
    ) -> Result<String, StoreError> {
        let Some(data) = stored.strip_prefix(SEALED_PREFIX) else {
            return Ok(stored);
        };
        let what = format!("history segment {index} of session `{session}`");
        let seal = self.need_seal(location, &what)?;
        let plain = seal.open(location, &segment_aad(session, index), data)?;
        String::from_utf8(plain).map_err(|e| StoreError::Corrupt {
            location: location.to_owned(),
            detail: format!("{what}: not text once decrypted: {e}"),
        })
    }

    fn need_seal(&self, location: &str, what: &str) -> Result<&Seal, StoreError> {
        self.seal.as_deref().ok_or_else(|| StoreError::Backend {
            location: location.to_owned(),
            detail: format!(
                "{what} is encrypted and no key is configured: set store.verbatim: true and \
                 store.encryption_key_env to the NAME of the variable that holds the key it was \
                 written with"
            ),
        })
    }

    /// `entry` with its sealed messages decrypted; when all were sealed,
    /// checked against the handle (computed from the verbatim content),
    /// so a ciphertext moved to another record is refused.
    fn open_entry(&self, location: &str, entry: Entry) -> Result<Entry, StoreError> {
        let sealed = entry
            .messages
            .iter()
            .filter(|m| m.extra.contains_key(SEALED_FIELD))
            .count();
        if sealed == 0 {
            return Ok(entry);
        }
        let Entry {
            handle,
            kind,
            session,
            messages,
            start,
            end,
        } = entry;
        let all = sealed == messages.len();
        let messages = messages
            .into_iter()
            .map(|m| self.open_message(location, m))
            .collect::<Result<Vec<_>, _>>()?;
        let belongs = match kind {
            EntryKind::Span => span_handle(&messages) == handle,
            EntryKind::Message => messages.iter().all(|m| {
                message_handle(&message_hash(m)) == handle || result_handles(m).contains(&handle)
            }),
        };
        if all && !belongs {
            return Err(StoreError::Corrupt {
                location: location.to_owned(),
                detail: format!(
                    "the encrypted messages stored under `{handle}` are not the ones it names (moved from another record)"
                ),
            });
        }
        Ok(Entry {
            handle,
            kind,
            session,
            messages,
            start,
            end,
        })
    }

    fn open_versioned(
        &self,
        location: &str,
        session: &str,
        v: Versioned,
    ) -> Result<Versioned, StoreError> {
        Ok(Versioned {
            version: v.version,
            state: self.open_state(location, session, v.state)?,
            history: v
                .history
                .into_iter()
                .enumerate()
                .map(|(i, s)| self.open_segment(location, session, i, s))
                .collect::<Result<_, _>>()?,
        })
    }

    fn open_since(&self, location: &str, session: &str, since: Since) -> Result<Since, StoreError> {
        Ok(match since {
            Since::Unchanged => Since::Unchanged,
            Since::Changed(v) => Since::Changed(
                v.map(|v| self.open_versioned(location, session, v))
                    .transpose()?,
            ),
            Since::Appended {
                version,
                state,
                from,
                segments,
            } => Since::Appended {
                version,
                state: self.open_state(location, session, state)?,
                from,
                segments: segments
                    .into_iter()
                    .enumerate()
                    .map(|(i, s)| self.open_segment(location, session, from + i, s))
                    .collect::<Result<_, _>>()?,
            },
        })
    }
}

fn backend(location: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        location: location.to_owned(),
        detail: e.to_string(),
    }
}

fn message_aad(hash: &str) -> Vec<u8> {
    format!("context-engine/message\0{hash}").into_bytes()
}

fn state_aad(session: &str) -> Vec<u8> {
    format!("context-engine/state\0{session}").into_bytes()
}

fn segment_aad(session: &str, index: usize) -> Vec<u8> {
    format!("context-engine/history\0{session}\0{index}").into_bytes()
}

/// The key of an encrypted store (XChaCha20-Poly1305), read from the
/// environment variable `store.encryption_key_env` names. The key is 32
/// bytes written as 64 hex digits or in standard base64 (44 characters
/// with its padding), e.g. `openssl rand -hex 32`.
pub struct Seal {
    cipher: XChaCha20Poly1305,
    /// The variable it came from, for error messages.
    name: String,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal")
            .field("variable", &self.name)
            .finish_non_exhaustive()
    }
}

/// Why no key could be read (names the variable, never shows its value).
#[derive(Debug, thiserror::Error)]
#[error("store.encryption_key_env: the variable `{name}` {detail}")]
pub struct KeyError {
    /// The variable.
    pub name: String,
    /// What is wrong with it.
    pub detail: String,
}

impl Seal {
    /// The key held by the environment variable `name`, whose value the
    /// caller looked up (`None`: unset).
    pub fn from_var(name: &str, value: Option<&str>) -> Result<Seal, KeyError> {
        match value {
            Some(v) if !v.trim().is_empty() => Seal::from_text(name, v),
            _ => Err(KeyError {
                name: name.to_owned(),
                detail:
                    "is not set (or not text): it must hold the store's 32-byte key (64 hex digits or base64)"
                        .to_owned(),
            }),
        }
    }

    /// The key written in `text` (64 hex digits or base64 of 32 bytes);
    /// `name` names where it came from.
    pub fn from_text(name: &str, text: &str) -> Result<Seal, KeyError> {
        let text = text.trim();
        let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            (0..32)
                .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .ok()
        } else {
            base64::engine::general_purpose::STANDARD.decode(text).ok()
        };
        let Some(bytes) = bytes.filter(|b| b.len() == 32) else {
            return Err(KeyError {
                name: name.to_owned(),
                detail: "does not hold a 32-byte key: write it as 64 hex digits or in base64 \
                         (e.g. `openssl rand -hex 32`)"
                    .to_owned(),
            });
        };
        let cipher = XChaCha20Poly1305::new_from_slice(&bytes).map_err(|e| KeyError {
            name: name.to_owned(),
            detail: e.to_string(),
        })?;
        Ok(Seal {
            cipher,
            name: name.to_owned(),
        })
    }

    /// `plain` encrypted under a fresh random nonce, bound to `aad`:
    /// base64 of the nonce then the ciphertext.
    fn seal(&self, location: &str, aad: &[u8], plain: &[u8]) -> Result<String, StoreError> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let ct = self
            .cipher
            .encrypt(&nonce, Payload { msg: plain, aad })
            .map_err(|_| backend(location, "encryption failed"))?;
        let mut out = Vec::with_capacity(NONCE_BYTES + ct.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        Ok(base64::engine::general_purpose::STANDARD.encode(out))
    }

    /// What [`seal`](Self::seal) encrypted, if this key sealed it for
    /// `aad`.
    fn open(&self, location: &str, aad: &[u8], data: &str) -> Result<Vec<u8>, StoreError> {
        let failed = || StoreError::Backend {
            location: location.to_owned(),
            detail: format!(
                "cannot decrypt with the key in `{}`: it is not the key the store was written \
                 with, or the record was altered or moved",
                self.name
            ),
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|_| failed())?;
        if bytes.len() < NONCE_BYTES {
            return Err(failed());
        }
        let (nonce, ct) = bytes.split_at(NONCE_BYTES);
        self.cipher
            .decrypt(XNonce::from_slice(nonce), Payload { msg: ct, aad })
            .map_err(|_| failed())
    }
}

/// A store with an [`AtRest`] policy applied around another (see the
/// module docs): what it is given is transformed before the inner store
/// sees it, and what it reads is opened before the caller does.
pub struct AtRestStore {
    inner: Arc<dyn SessionStore>,
    policy: AtRest,
}

impl AtRestStore {
    /// The store under the policy.
    pub fn inner(&self) -> &Arc<dyn SessionStore> {
        &self.inner
    }
}

impl SessionStore for AtRestStore {
    fn location(&self) -> String {
        self.inner.location()
    }

    fn commit(&self, session: &str, batch: &Batch) -> Result<(), StoreError> {
        let stored = self.policy.batch(&self.location(), session, batch)?;
        self.inner.commit(session, &stored)
    }

    fn load_state(&self, session: &str) -> Result<Option<Value>, StoreError> {
        let location = self.location();
        self.inner
            .load_state(session)?
            .map(|s| self.policy.open_state(&location, session, s))
            .transpose()
    }

    fn resolve(&self, session: Option<&str>, handle: &str) -> Result<Option<Entry>, StoreError> {
        let location = self.location();
        self.inner
            .resolve(session, handle)?
            .map(|e| self.policy.open_entry(&location, e))
            .transpose()
    }

    fn search(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        self.inner.search(session, query, limit)
    }

    fn compactions(&self, session: &str) -> Result<Vec<CompactionRecord>, StoreError> {
        self.inner.compactions(session)
    }

    fn handles(&self, session: &str) -> Result<Vec<String>, StoreError> {
        self.inner.handles(session)
    }

    fn delete_session(&self, session: &str) -> Result<(), StoreError> {
        self.inner.delete_session(session)
    }

    fn version(&self, session: &str) -> Result<Option<u64>, StoreError> {
        self.inner.version(session)
    }

    fn load_versioned(&self, session: &str) -> Result<Option<Versioned>, StoreError> {
        let location = self.location();
        self.inner
            .load_versioned(session)?
            .map(|v| self.policy.open_versioned(&location, session, v))
            .transpose()
    }

    fn load_versioned_since(&self, session: &str, known: u64) -> Result<Since, StoreError> {
        let since = self.inner.load_versioned_since(session, known)?;
        self.policy.open_since(&self.location(), session, since)
    }

    fn load_versioned_after(
        &self,
        session: &str,
        known: u64,
        segments: usize,
    ) -> Result<Since, StoreError> {
        let since = self.inner.load_versioned_after(session, known, segments)?;
        self.policy.open_since(&self.location(), session, since)
    }

    fn commit_versioned(
        &self,
        session: &str,
        expected: u64,
        batches: &[Batch],
        state: &Value,
        history: Option<HistoryWrite<'_>>,
    ) -> Result<u64, StoreError> {
        let location = self.location();
        let batches = batches
            .iter()
            .map(|b| self.policy.batch(&location, session, b))
            .collect::<Result<Vec<_>, _>>()?;
        let state = self.policy.state(&location, session, state)?;
        let append = match &history {
            Some(h) => h
                .append
                .iter()
                .enumerate()
                .map(|(i, s)| self.policy.segment(&location, session, h.keep + i, s))
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        let history = history.map(|h| HistoryWrite {
            keep: h.keep,
            append: &append,
        });
        self.inner
            .commit_versioned(session, expected, &batches, &state, history)
    }

    fn try_claim(
        &self,
        session: &str,
        job: &str,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.inner.try_claim(session, job, owner, ttl)
    }

    fn release(&self, session: &str, job: &str, owner: &str) -> Result<(), StoreError> {
        self.inner.release(session, job, owner)
    }
}
