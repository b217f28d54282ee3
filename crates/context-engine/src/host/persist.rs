//! The session store: attaching it (resuming a saved session), the
//! snapshot of the engine's and the driver's state, and commits.

use std::sync::Arc;

use serde_json::Value;

use crate::store::{Batch, SessionStore, StoreError};

use super::{HostState, Notice, Session};

impl Session {
    /// Attaches a session store: what leaves the history is archived there,
    /// the state is saved after every step, and the recall tools read it.
    /// When the store already has this session's state (a restart), the
    /// engine and the driver resume from it.
    pub fn with_store(mut self, store: Arc<dyn SessionStore>) -> Result<Session, StoreError> {
        if let Some(saved) = store.load_state(&self.id)? {
            let corrupt = |detail: String| StoreError::Corrupt {
                location: store.location(),
                detail: format!("state of session `{}`: {detail}", self.id),
            };
            let host: HostState = saved
                .get("host")
                .cloned()
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| corrupt(e.to_string()))?
                .ok_or_else(|| corrupt("no `host` part".into()))?;
            let engine = saved
                .get("engine_state")
                .ok_or_else(|| corrupt("no `engine_state` part".into()))?;
            self.engine
                .restore(engine)
                .map_err(|e| corrupt(e.to_string()))?;
            self.awaiting_usage = host.awaiting_usage;
            self.last_usage = host.last_usage;
            self.calls_this_turn = host.calls_this_turn;
            self.recorded = host.recorded;
        }
        self.store = Some(store);
        Ok(self)
    }

    /// Compaction records this session has numbered in its store so far
    /// (the next is numbered after them).
    pub fn records_numbered(&self) -> u64 {
        self.recorded
    }

    /// Numbers this session's next compaction records after the first `n`
    /// its store holds under its name. A host that starts over under a
    /// name that already compacted (a new conversation under a session id
    /// a server reuses) continues the store's numbering instead of
    /// clashing with the records there.
    pub fn with_records_after(mut self, n: u64) -> Session {
        self.number_records_after(n);
        self
    }

    /// [`with_records_after`](Self::with_records_after) on a running
    /// session (one whose count fell behind the store's records).
    pub fn number_records_after(&mut self, n: u64) {
        self.recorded = self.recorded.max(n);
    }

    /// The attached session store.
    pub fn store(&self) -> Option<&Arc<dyn SessionStore>> {
        self.store.as_ref()
    }

    /// The state a store keeps for this session: the engine's snapshot and
    /// the driver's counters (what [`with_store`](Self::with_store) resumes
    /// from).
    pub fn snapshot(&self) -> Value {
        let host = HostState {
            awaiting_usage: self.awaiting_usage,
            last_usage: self.last_usage,
            calls_this_turn: self.calls_this_turn,
            recorded: self.recorded,
        };
        serde_json::json!({
            "engine": self.engine.name(),
            "engine_state": self.engine.snapshot(),
            "host": host,
        })
    }

    /// Commits `batch` with the current state.
    pub(super) fn commit(&self, mut batch: Batch) -> Result<(), StoreError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        batch.set_state(self.snapshot());
        store.commit(&self.id, &batch)
    }

    /// Saves the state alone; a failure becomes a warning on the next update.
    pub(super) fn save_state(&mut self) {
        if let Err(e) = self.commit(Batch::new()) {
            self.pending.push(Notice::warning(format!(
                "session store: cannot save the engine state: {e}"
            )));
        }
    }
}
