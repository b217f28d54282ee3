//! Sessions: keying ([`key`]), the managed history and its hash chain
//! ([`lineage`]), the host driver per session ([`managed`]), and the
//! in-memory registry.
//!
//! Each session sits behind its own async mutex: requests of one session
//! are serialized (a request waits for the previous one's response, which
//! carries the usage the engine needs), different sessions run in
//! parallel. An idle session is only data in the map: no task, no thread.
//! The registry keeps at most `max_sessions` (least recently used dropped
//! first) and drops sessions idle longer than `idle`; a dropped session
//! starts over from the client's full history on its next request. A
//! session idle for `hibernate` sleeps ([`Sessions::hibernate_idle`]): its
//! managed history keeps only the deflated frozen texts (or, with a session
//! store, the whole copy is dropped: the store holds it), and its next
//! request wakes it with the same bytes and the same engine state.

pub mod background;
pub mod breaker;
pub mod calls;
mod error;
pub mod key;
pub mod lineage;
pub mod managed;
pub mod persist;
pub mod requests;
pub mod step;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use context_engine::engine::ContextEngine;
use context_engine::engine::Usage;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

pub use background::SummaryClaims;
pub use error::{LineageError, SessionError};
pub use key::{KeySource, SessionKey};
pub use managed::{Background, Managed, Plan, SessionContext, SessionStats};
pub use persist::{SharedStore, StoreHealth};

/// Why a factory could not build an engine (its whole chain of causes
/// is logged).
pub type FactoryError = Box<dyn std::error::Error + Send + Sync>;

/// Builds the engine of each new session.
pub trait EngineFactory: Send + Sync {
    /// A fresh engine for session `id`.
    fn create(&self, id: &str) -> Result<Box<dyn ContextEngine>, FactoryError>;
}

impl<F> EngineFactory for F
where
    F: Fn(&str) -> Result<Box<dyn ContextEngine>, FactoryError> + Send + Sync,
{
    fn create(&self, id: &str) -> Result<Box<dyn ContextEngine>, FactoryError> {
        self(id)
    }
}

/// One session's slot: its state behind an async mutex (`None` until the
/// first request builds it, and again after a failure reset it).
#[derive(Debug)]
pub struct Slot {
    /// The session, locked for the whole of each request.
    pub state: Arc<AsyncMutex<Option<Managed>>>,
    /// An Anthropic or Responses session's last request, parsed and
    /// bridged, so the next one reads only its new messages (used under
    /// `state`'s lock; content addressed, so it stays valid whatever
    /// happens to the session).
    pub front: Mutex<context_engine::front::FrontCache>,
    /// The session's last calls, for the page at `/ui` (empty when the
    /// page is off: [`Sessions::with_call_log`]).
    pub calls: Mutex<calls::CallLog>,
    /// Observe mode: the arrival number of the newest request observed
    /// (an older one that reaches the session after it is skipped, never
    /// taken for a rewritten history).
    pub observed: AtomicU64,
    last_used: AtomicU64,
}

/// A session, locked for the whole of one request.
pub type Guard = OwnedMutexGuard<Option<Managed>>;

/// The sessions of one server.
pub struct Sessions {
    map: Mutex<HashMap<SessionKey, Arc<Slot>>>,
    ctx: Arc<SessionContext>,
    max: usize,
    idle: Duration,
    epoch: Instant,
    claims: OnceLock<Arc<dyn SummaryClaims>>,
    store: Option<SharedStore>,
    hibernate: Option<Duration>,
    call_log: usize,
    requests: requests::RequestLog,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("max", &self.max)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// An empty registry.
    pub fn new(ctx: SessionContext, max: usize, idle: Duration) -> Sessions {
        Sessions {
            map: Mutex::new(HashMap::new()),
            ctx: Arc::new(ctx),
            max: max.max(1),
            idle,
            epoch: Instant::now(),
            claims: OnceLock::new(),
            store: None,
            hibernate: None,
            call_log: 0,
            requests: requests::RequestLog::new(0),
        }
    }

    /// Keeps each session's last `calls` calls for the page (0: none).
    pub fn with_call_log(mut self, calls: usize) -> Sessions {
        self.call_log = calls;
        self
    }

    /// Keeps the last managed calls' bodies for the page's view of a call's request,
    /// up to `bytes` in all (0: none).
    pub fn with_request_log(mut self, bytes: usize) -> Sessions {
        self.requests = requests::RequestLog::new(bytes);
        self
    }

    /// The last managed calls' bodies (see [`requests`]).
    pub fn requests(&self) -> &requests::RequestLog {
        &self.requests
    }

    /// Calls kept per session for the page (0: none).
    pub fn call_log(&self) -> usize {
        self.call_log
    }

    /// Every session held, with its slot (for the page: the caller
    /// filters by identity).
    pub fn list(&self) -> Vec<(SessionKey, Arc<Slot>)> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .map(|(k, s)| (k.clone(), Arc::clone(s)))
            .collect()
    }

    /// Sessions idle this long sleep (`None`: never).
    pub fn with_hibernation(mut self, after: Option<Duration>) -> Sessions {
        self.hibernate = after;
        self
    }

    /// Idle time after which a session sleeps, when set.
    pub fn hibernation(&self) -> Option<Duration> {
        self.hibernate
    }

    /// Puts to sleep every session unused for `idle_for` that no request
    /// holds; returns how many went to sleep. Without a session store a
    /// session keeps its engine and the deflated texts of its managed
    /// history ([`Managed::hibernate`]); with one, the cached copy is
    /// dropped (the store holds the session; the next request loads it).
    /// A session with a background summary on its way stays awake.
    /// Blocking (it deflates): call it off the async workers.
    pub fn hibernate_idle(&self, idle_for: Duration) -> usize {
        let now = self.now();
        let idle_ms = u64::try_from(idle_for.as_millis()).unwrap_or(u64::MAX);
        let idle: Vec<Arc<Slot>> = {
            let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
            map.values()
                .filter(|s| now.saturating_sub(s.last_used.load(Ordering::Relaxed)) >= idle_ms)
                .cloned()
                .collect()
        };
        let mut slept = 0;
        for slot in idle {
            // A request holds it: not idle after all.
            let Ok(mut guard) = slot.state.try_lock() else {
                continue;
            };
            let Some(m) = guard.as_mut() else {
                continue;
            };
            if m.is_asleep() {
                continue;
            }
            if self.store.is_some() {
                if !m.summary_pending() {
                    *guard = None;
                    slept += 1;
                }
            } else if m.hibernate() {
                slept += 1;
            }
        }
        slept
    }

    /// Keeps every session in `store` (see [`persist`]).
    pub fn with_store(mut self, store: Option<SharedStore>) -> Sessions {
        self.store = store;
        self
    }

    /// Settles a served request and releases its session: feeds the
    /// response's usage (`None`: the call failed or reported none) to the
    /// session. With a session store the state is written on the blocking
    /// pool, off the client's path (the session stays locked until it is;
    /// see [`persist`]), else in place.
    pub fn release(&self, guard: Option<Guard>, usage: Option<Usage>) {
        let Some(mut guard) = guard else { return };
        match self.store.clone() {
            Some(store) => {
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    return;
                };
                rt.spawn_blocking(move || {
                    persist::after_response_stored(&mut guard, usage.as_ref(), &store);
                });
            }
            None => {
                if let (Some(m), Some(usage)) = (guard.as_mut(), usage) {
                    m.after_response(&usage);
                }
            }
        }
    }

    /// The session store, when sessions are kept in one.
    pub fn store(&self) -> Option<&SharedStore> {
        self.store.as_ref()
    }

    /// What every session shares.
    pub fn context(&self) -> &Arc<SessionContext> {
        &self.ctx
    }

    /// Sets the claims background summaries ask before they run (a fleet
    /// sharing a store); once, before serving. `false` if already set.
    pub fn set_summary_claims(&self, claims: Arc<dyn SummaryClaims>) -> bool {
        self.claims.set(claims).is_ok()
    }

    /// The claims background summaries ask, if set.
    pub fn summary_claims(&self) -> Option<Arc<dyn SummaryClaims>> {
        self.claims.get().cloned()
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The slot of `key`, created when new. Over capacity, the least
    /// recently used sessions that no request holds are dropped (a tenth of
    /// the capacity at once, so the scan is rare).
    pub fn slot(&self, key: &SessionKey) -> Arc<Slot> {
        let now = self.now();
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = map.get(key) {
            slot.last_used.store(now, Ordering::Relaxed);
            return Arc::clone(slot);
        }
        if map.len() >= self.max {
            evict(&mut map, (self.max / 10).max(1));
        }
        let slot = Arc::new(Slot {
            state: Arc::new(AsyncMutex::new(None)),
            front: Mutex::default(),
            calls: Mutex::default(),
            observed: AtomicU64::new(0),
            last_used: AtomicU64::new(now),
        });
        map.insert(key.clone(), Arc::clone(&slot));
        slot
    }

    /// The slot of `key` if it exists.
    pub fn get(&self, key: &SessionKey) -> Option<Arc<Slot>> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(key).cloned()
    }

    /// Drops sessions idle longer than the idle limit; returns how many
    /// are left.
    pub fn sweep(&self) -> usize {
        let cutoff = self
            .now()
            .saturating_sub(u64::try_from(self.idle.as_millis()).unwrap_or(u64::MAX));
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, slot| {
            Arc::strong_count(slot) > 1
                || Arc::strong_count(&slot.state) > 1
                || slot.last_used.load(Ordering::Relaxed) >= cutoff
        });
        map.len()
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn evict(map: &mut HashMap<SessionKey, Arc<Slot>>, n: usize) {
    let mut idle: Vec<(u64, SessionKey)> = map
        .iter()
        .filter(|(_, s)| Arc::strong_count(s) == 1 && Arc::strong_count(&s.state) == 1)
        .map(|(k, s)| (s.last_used.load(Ordering::Relaxed), k.clone()))
        .collect();
    idle.sort_unstable();
    for (_, k) in idle.into_iter().take(n) {
        map.remove(&k);
    }
}
