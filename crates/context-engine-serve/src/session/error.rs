//! [`SessionError`]: why a request's session step produced no managed
//! request; [`LineageError`]: why a managed history could not be read back
//! or written (see [`lineage`](super::lineage)). Never an HTTP error: the
//! handler sends the client's request as it came (fail open) and keeps the
//! reason in the session's stats (`last_fallback`) and the log.

use context_engine::store::StoreError;
use context_engine::validate::Violation;

use super::FactoryError;
use super::lineage::RecordKeep;

/// Why a session step failed (see the module docs).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The session's engine could not be built.
    #[error("cannot start the engine: {}", context_engine::error_chain(&**error))]
    EngineStart {
        /// The session.
        session: String,
        /// The factory's error, with its causes.
        error: FactoryError,
    },
    /// A client message is not a chat message.
    #[error("message {index} is not a chat message: {error}")]
    Message {
        /// Its index in the client's history.
        index: usize,
        /// Why it does not parse.
        error: serde_json::Error,
    },
    /// The managed request would break a provider rule the client's own
    /// request kept.
    #[error("the managed request would break a provider rule: {0}")]
    Violation(Violation),
    /// The managed history could not be read back or written.
    #[error(transparent)]
    Lineage(#[from] LineageError),
    /// The proxy's part of a stored record does not parse.
    #[error("stored session `{session}`: {error}")]
    Record {
        /// The session's name in the store.
        session: String,
        /// Why.
        error: serde_json::Error,
    },
    /// The proxy's part of the record could not be encoded.
    #[error("stored session `{session}`: cannot encode its state: {error}")]
    Encode {
        /// The session's name in the store.
        session: String,
        /// Why.
        error: serde_json::Error,
    },
    /// The host could not resume from the stored state.
    #[error(transparent)]
    Restore(StoreError),
    /// A stored session's operation on a session that is not stored.
    #[error("the session is not stored")]
    NotStored,
    /// A stored copy holds no stored history to advance.
    #[error("no stored history held")]
    NoStoredHistory,
    /// A copy holds other segments than the ones the store's answer follows.
    #[error("{from} segments kept, {held} held")]
    Segments {
        /// Segments the store's answer follows.
        from: usize,
        /// Segments the copy holds.
        held: usize,
    },
    /// The copy changed since it was stored.
    #[error("the copy changed since it was stored")]
    CopyChanged,
    /// The stored record names no lineage digest.
    #[error("the record has no lineage digest")]
    NoDigest,
    /// The stored segments do not build the stored lineage.
    #[error("the segments do not build the stored lineage")]
    DigestMismatch,
    /// No copy of the session to advance.
    #[error("no copy")]
    NoCopy,
    /// No session in the slot.
    #[error("no session")]
    NoSession,
    /// The session store failed.
    #[error("session store unavailable: {0}")]
    Unavailable(StoreError),
    /// The session store failed lately: skipped until a probe finds it
    /// answering.
    #[error("session store unavailable, skipped until a probe finds it answering: {why}")]
    Skipped {
        /// The last failure.
        why: String,
    },
    /// The store refused the step again after it was numbered anew.
    #[error("the session store refused the step: {0}")]
    Refused(StoreError),
    /// Other instances kept writing the session.
    #[error("session `{session}` kept changing under this instance ({attempts} attempts)")]
    Contended {
        /// The session's name in the store.
        session: String,
        /// Attempts made.
        attempts: usize,
    },
    /// The engine panicked; the session was dropped.
    #[error("the engine panicked; the session starts over")]
    Panicked,
}

/// Why a lineage could not be read back (a sleeping one inflated, a stored
/// one rebuilt from its segments) or written as a record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LineageError {
    /// The deflated texts of a sleeping lineage do not inflate.
    #[error("sleeping lineage: {0}")]
    Inflate(std::io::Error),
    /// The inflated texts are not as long as recorded.
    #[error("sleeping lineage: {got} bytes of text, {expected} expected")]
    Length {
        /// Bytes inflated.
        got: usize,
        /// Bytes recorded.
        expected: usize,
    },
    /// An inflated text is not UTF-8.
    #[error("sleeping lineage: {0}")]
    Utf8(std::str::Utf8Error),
    /// A sleeping message's text is not a chat message.
    #[error("sleeping managed message {index}: {error}")]
    SleepingMessage {
        /// The message's index in the managed history.
        index: usize,
        /// Why it does not parse.
        error: serde_json::Error,
    },
    /// A managed message's frozen text is not JSON.
    #[error("managed message {index} is not JSON: {error}")]
    NotJson {
        /// The message's index in the managed history.
        index: usize,
        /// Why.
        error: serde_json::Error,
    },
    /// The record could not be encoded.
    #[error("cannot encode the lineage: {0}")]
    Encode(serde_json::Error),
    /// Segments were applied to a sleeping lineage.
    #[error("stored lineage: segments applied to a sleeping lineage")]
    Asleep,
    /// A stored segment does not parse.
    #[error("stored lineage, segment {segment}: {error}")]
    Segment {
        /// The segment's index in the store.
        segment: usize,
        /// Why.
        error: serde_json::Error,
    },
    /// A stored segment keeps more than the segments before it built.
    #[error(
        "stored lineage, segment {segment}: keeps {keep:?} of {chain} chain entries, {messages} messages, {sent} hashes"
    )]
    Keeps {
        /// The segment's index in the store.
        segment: usize,
        /// What it keeps.
        keep: RecordKeep,
        /// Chain entries built before it.
        chain: usize,
        /// Managed messages built before it.
        messages: usize,
        /// Hashes built before it.
        sent: usize,
    },
    /// A stored chain entry is not a hash.
    #[error("stored lineage, segment {segment}: chain entry `{entry}`: {error}")]
    Chain {
        /// The segment's index in the store.
        segment: usize,
        /// The entry as stored.
        entry: String,
        /// Why.
        error: std::num::ParseIntError,
    },
    /// A stored message is not a chat message.
    #[error("stored managed message {index}: {error}")]
    StoredMessage {
        /// The message's index in the managed history.
        index: usize,
        /// Why.
        error: serde_json::Error,
    },
}
