//! Sessions kept in a session store, so that any instance of a fleet can
//! serve any request of any session (issue 16) and a restart loses nothing.
//!
//! A session's record ([`Versioned`]) holds the host's state (engine
//! snapshot and driver counters, what `host::Session::with_store`
//! restores), the proxy's own figures, and the lineage (each managed
//! message's frozen JSON text, so the byte-for-byte prefix survives a move
//! to another instance). Per request:
//!
//! 1. `load_versioned_after(session, version held, segments held)`: one
//!    read. Nothing when the copy this instance holds is current; else
//!    the state and, where the store can (Postgres, SQLite), only the history
//!    segments stored after the ones the copy holds: the copy applies
//!    them, checks the lineage it built against the digest stored in the
//!    state, and restores the host from the state (a copy that was not
//!    what the store held, or a store that answers whole, is rebuilt from
//!    the whole record). Skipped while the copy's last check found it
//!    current (a session that stays on one instance): the
//!    compare-and-swap of step 3 then tells, and a lost one reads.
//! 2. The engine step runs with the host attached to a [`Staged`] store:
//!    what a compaction archives is collected, not written.
//! 3. `commit_versioned`: the collected batches and the new record, in one
//!    transaction, only if the version is still the one read
//!    (compare-and-swap); the lineage as a segment with what the step
//!    changed (see [`history_delta`]), not whole. A writer that lost reloads and runs the step
//!    again (at most [`RETRIES`] times): a compaction is committed once,
//!    by one instance, and two instances never interleave a session's
//!    writes. Only a lost compare-and-swap ([`StoreError::Conflict`]) is
//!    retried as a race: a step whose compaction record is numbered like a
//!    stored one ([`StoreError::Duplicate`]: nobody else wrote, it would
//!    clash again) runs again once, numbered after the stored records.
//! 4. After the response, the usage is fed back and the state written the
//!    same way (the lineage is unchanged, so only the small state), off
//!    the client's path: the response goes out first, and the session
//!    stays locked on this instance until the write is done.
//!
//! Step 4 runs after the client has its answer, so the client's next
//! call may reach another instance before the usage is written. The
//! record of step 3 therefore names the instance whose response is
//! awaited (`awaiting`), and step 4 clears it (with the usage, or
//! without when the call failed). An instance that loads a record
//! awaited by another waits for that write, polling the version, for at
//! most [`USAGE_WAIT`] (an instance that died meanwhile never writes it):
//! a session moved between instances steps on the same usage as one that
//! stays, so a fleet decides as one instance does.
//!
//! Any store failure fails open: the request goes unmanaged, the cached
//! copy is dropped (the next request reloads), and the store's health
//! ([`StoreHealth`]) turns degraded until a store call succeeds again.
//! While it is degraded the store's [breaker](super::breaker) is open:
//! requests go unmanaged at once, without touching the store (a database
//! that accepts connections and never answers would cost each its
//! timeout), and a probe in the background, one at a time and ever less
//! often, closes it when the store answers again.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use context_engine::store::{
    Batch, CompactionRecord, Entry, HistoryWrite, SearchHit, SessionStore, Since, StoreError,
    Versioned,
};

use super::breaker::{Admit, Breaker};
use super::lineage::{Lineage, RecordPrints};
use super::{LineageError, SessionError};
use serde_json::Value;

/// Compare-and-swap attempts per step before the request fails open.
pub const RETRIES: usize = 3;

/// The longest an instance waits for another's usage write (see the
/// module's text): past it, the step runs without that usage, as when a
/// provider reports none.
pub const USAGE_WAIT: Duration = Duration::from_millis(250);

/// The session store of a server, with its health.
#[derive(Clone)]
pub struct SharedStore {
    /// The store.
    pub store: Arc<dyn SessionStore>,
    /// Whether its last call succeeded.
    pub health: Arc<StoreHealth>,
    /// This instance, as the owner of its claims (process id and start
    /// time: unique across a fleet's restarts).
    pub owner: String,
}

/// How long a background summary's claim lasts: past it, an instance that
/// died while summarizing no longer holds the job.
pub const SUMMARY_CLAIM_TTL: Duration = Duration::from_secs(300);

/// A fleet's background summaries are claimed through the shared store, so
/// two instances never compute the same one (`summary:<key>` per session).
/// A summary prepared on one instance is adopted by that instance's next
/// request of the session; on another instance the request goes out with
/// the digest, as when a summary is not ready.
impl super::SummaryClaims for SharedStore {
    fn claim(&self, session: &str, key: u128) -> bool {
        self.claim(session, &format!("summary:{key:032x}"), SUMMARY_CLAIM_TTL)
    }
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore")
            .field("location", &self.store.location())
            .finish_non_exhaustive()
    }
}

impl SharedStore {
    /// `store`, healthy until a call fails.
    pub fn new(store: Arc<dyn SessionStore>) -> SharedStore {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        SharedStore {
            store,
            health: Arc::new(StoreHealth::default()),
            owner: format!("ctx-serve-{}-{started:x}", std::process::id()),
        }
    }

    /// Claims background job `job` of session `sid` for this instance for
    /// `ttl` (blocking): `true` when this instance may compute it (the
    /// claim was free, expired or already ours). Another instance's live
    /// claim, or a store that does not answer, is `false`: the job is not
    /// started twice. Release it with [`release`](Self::release) when done;
    /// a claim this instance never releases (it died) expires after `ttl`.
    pub fn claim(&self, sid: &str, job: &str, ttl: Duration) -> bool {
        if !self.available() {
            return false;
        }
        let t = Instant::now();
        self.observe(t, self.store.try_claim(sid, job, &self.owner, ttl))
            .unwrap_or(false)
    }

    /// Gives up this instance's claim on `job` of `sid` (blocking).
    pub fn release(&self, sid: &str, job: &str) {
        if !self.available() {
            return;
        }
        let t = Instant::now();
        let _ = self.observe(t, self.store.release(sid, job, &self.owner));
    }

    /// Whether the store may be used now: `false` while its breaker is
    /// open (the caller goes on without the store, at once). When a probe
    /// is due this starts it, in the background: no caller waits for it.
    pub fn available(&self) -> bool {
        match self.health.admit() {
            Admit::Closed => true,
            Admit::Skip => false,
            Admit::Probe => {
                self.probe();
                false
            }
        }
    }

    /// Asks the store whether it answers again (one cheap read) on a
    /// thread of its own; the answer closes the breaker or puts the next
    /// probe further off.
    fn probe(&self) {
        let probe = self.clone();
        let spawned = std::thread::Builder::new()
            .name("ctx-store-probe".into())
            .spawn(move || {
                let t = Instant::now();
                let answer = probe.store.version("");
                if let Some(h) = probe.health.latency.get() {
                    h.observe(t.elapsed().as_secs_f64());
                }
                probe.health.probed(t.elapsed(), answer.map(drop));
            });
        if spawned.is_err() {
            self.health.probe_abandoned();
        }
    }

    /// Records the outcome of a store call (its latency too) and passes it on.
    pub fn observe<T>(&self, started: Instant, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Some(h) = self.health.latency.get() {
            h.observe(started.elapsed().as_secs_f64());
        }
        match &r {
            Ok(_) => self.health.ok(started.elapsed()),
            // The store answered: a lost compare-and-swap, a clash of
            // records or one session's unreadable record is not an outage
            // (it must not open the breaker for every session).
            Err(
                StoreError::Conflict { .. }
                | StoreError::Duplicate { .. }
                | StoreError::Corrupt { .. }
                | StoreError::NotFound { .. },
            ) => self.health.ok(started.elapsed()),
            Err(e) => self.health.failed(e),
        }
        r
    }
}

/// Whether the store answers, and why not.
#[derive(Debug, Default)]
pub struct StoreHealth {
    inner: Mutex<HealthInner>,
    /// `ctx_store_seconds`, once the server's metrics exist.
    latency: std::sync::OnceLock<prometheus_client::metrics::histogram::Histogram>,
}

impl StoreHealth {
    /// Times every store call into `histogram` from now on.
    pub fn time_into(&self, histogram: prometheus_client::metrics::histogram::Histogram) {
        let _ = self.latency.set(histogram);
    }
}

#[derive(Debug, Default)]
struct HealthInner {
    error: Option<String>,
    since: Option<Instant>,
    calls: u64,
    busy: Duration,
    breaker: Breaker,
}

impl StoreHealth {
    fn ok(&self, took: Duration) {
        let mut h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if h.error.take().is_some() {
            tracing::info!("session store reachable again: sessions are managed again");
        }
        h.breaker.succeeded();
        h.since = None;
        h.calls += 1;
        h.busy += took;
    }

    fn failed(&self, e: &StoreError) {
        let mut h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if h.error.is_none() {
            // Store errors carry the location without its password.
            tracing::error!(error = %e, "session store unavailable: requests go unmanaged, without waiting for it, until a probe finds it answering");
            h.since = Some(Instant::now());
        }
        h.breaker.failed(Instant::now());
        h.error = Some(e.to_string());
    }

    /// Whether a caller may use the store now (see [`Breaker::admit`]).
    pub fn admit(&self) -> Admit {
        let mut h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        h.breaker.admit(Instant::now())
    }

    /// What the probe found.
    fn probed(&self, took: Duration, answer: Result<(), StoreError>) {
        match answer {
            Ok(()) => self.ok(took),
            Err(e) => {
                let mut h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
                tracing::debug!(error = %e, "session store probe: still unavailable");
                h.breaker.probe_failed(Instant::now());
                if h.since.is_none() {
                    h.since = Some(Instant::now());
                }
                h.error = Some(e.to_string());
            }
        }
    }

    /// The probe could not be started.
    fn probe_abandoned(&self) {
        let mut h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        h.breaker.probe_abandoned();
    }

    /// `None` when healthy, else the last error and how long ago the
    /// store stopped answering.
    pub fn degraded(&self) -> Option<(String, Duration)> {
        let h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        h.error
            .clone()
            .map(|e| (e, h.since.map(|s| s.elapsed()).unwrap_or_default()))
    }
}

/// A store the host driver commits to during one engine step: batches are
/// collected (written later with the record, in one transaction), reads go
/// to the real store, and `load_state` answers the state the session is
/// being restored from.
pub struct Staged {
    inner: Arc<dyn SessionStore>,
    batches: Mutex<Vec<Batch>>,
    restore: Mutex<Option<Value>>,
    /// What of the lineage the store holds at the version the session's
    /// copy matches (`None`: nothing yet).
    mark: Mutex<Option<HistoryMark>>,
}

impl Staged {
    /// Staging over `inner`; `restore` is what the host resumes from.
    pub fn new(inner: Arc<dyn SessionStore>, restore: Option<Value>) -> Staged {
        Staged {
            inner,
            batches: Mutex::new(Vec::new()),
            restore: Mutex::new(restore),
            mark: Mutex::new(None),
        }
    }

    /// The lineage the store holds is now `mark`'s.
    pub(crate) fn set_mark(&self, mark: Option<HistoryMark>) {
        *self.mark.lock().unwrap_or_else(PoisonError::into_inner) = mark;
    }

    /// What of the lineage the store holds (`None`: nothing yet).
    pub(crate) fn mark(&self) -> Option<HistoryMark> {
        self.mark
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many segments hold the stored lineage, and its digest (no copy
    /// of the mark: read on every request).
    pub(crate) fn held(&self) -> Option<(usize, u128)> {
        self.mark
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|m| (m.segments, m.digest()))
    }

    /// What a write of `lineage` must add to the stored history (`None`:
    /// nothing changed).
    pub(crate) fn history_delta(
        &self,
        lineage: &Lineage,
    ) -> Result<Option<HistoryDelta>, LineageError> {
        let mark = self.mark.lock().unwrap_or_else(PoisonError::into_inner);
        history_delta(lineage, mark.as_ref())
    }

    /// The batches collected since the last call.
    pub fn take(&self) -> Vec<Batch> {
        std::mem::take(&mut *self.batches.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Forgets what was collected (the step was not committed).
    pub fn discard(&self) {
        self.take();
    }

    /// The real store.
    pub fn inner(&self) -> &Arc<dyn SessionStore> {
        &self.inner
    }
}

impl SessionStore for Staged {
    fn location(&self) -> String {
        self.inner.location()
    }

    fn commit(&self, _session: &str, batch: &Batch) -> Result<(), StoreError> {
        self.batches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(batch.clone());
        Ok(())
    }

    fn load_state(&self, _session: &str) -> Result<Option<Value>, StoreError> {
        Ok(self
            .restore
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take())
    }

    /// Only within a named session: a session's view of the store never
    /// answers from every session's archive (`None` finds nothing).
    fn resolve(&self, session: Option<&str>, handle: &str) -> Result<Option<Entry>, StoreError> {
        match session {
            Some(s) => self.inner.resolve(Some(s), handle),
            None => Ok(None),
        }
    }

    /// Only within a named session, as [`resolve`](Self::resolve).
    fn search(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        match session {
            Some(s) => self.inner.search(Some(s), query, limit),
            None => Ok(Vec::new()),
        }
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
}

/// The parts of a stored record.
pub(crate) struct Loaded {
    pub version: u64,
    pub state: Value,
    pub history: Vec<String>,
}

impl From<Versioned> for Loaded {
    fn from(v: Versioned) -> Loaded {
        Loaded {
            version: v.version,
            state: v.state,
            history: v.history,
        }
    }
}

/// The history is rewritten whole (one segment) once it would hold more
/// segments than this: a reload reads a bounded number of rows.
pub const MAX_SEGMENTS: usize = 64;

/// ... or once its segments would hold more than twice the lineage's
/// bytes plus this (what compactions and divergences left behind).
const REWRITE_SLACK: usize = 64 * 1024;

/// What of a session's lineage the store holds: the lineage's
/// fingerprints when written, how many segments and bytes hold it.
#[derive(Clone, Debug)]
pub(crate) struct HistoryMark {
    prints: RecordPrints,
    segments: usize,
    bytes: usize,
}

impl HistoryMark {
    /// The mark of `lineage`, built from the stored `segments`.
    pub(crate) fn loaded(lineage: &Lineage, segments: &[String]) -> Option<HistoryMark> {
        (!segments.is_empty()).then(|| HistoryMark {
            prints: lineage.record_prints(),
            segments: segments.len(),
            bytes: segments.iter().map(String::len).sum(),
        })
    }

    /// The mark of `lineage`, built by applying `segments` after this
    /// mark's.
    pub(crate) fn appended(&self, lineage: &Lineage, segments: &[String]) -> HistoryMark {
        HistoryMark {
            prints: lineage.record_prints(),
            segments: self.segments + segments.len(),
            bytes: self.bytes + segments.iter().map(String::len).sum::<usize>(),
        }
    }

    /// How many segments hold the lineage.
    pub(crate) fn segments(&self) -> usize {
        self.segments
    }

    /// The lineage's fingerprints when written.
    pub(crate) fn prints(&self) -> &RecordPrints {
        &self.prints
    }

    /// The digest of the lineage when written (stored with the record).
    pub(crate) fn digest(&self) -> u128 {
        self.prints.digest()
    }
}

/// A history write: segments kept and appended, and the mark once written.
pub(crate) struct HistoryDelta {
    pub keep: usize,
    pub append: Vec<String>,
    pub mark: HistoryMark,
}

impl HistoryDelta {
    /// The write as the store takes it.
    pub fn write(&self) -> HistoryWrite<'_> {
        HistoryWrite {
            keep: self.keep,
            append: &self.append,
        }
    }
}

/// What to write of `lineage` over a stored history `mark`: one segment
/// with what changed since (the common start of each part kept), or the
/// whole lineage as one segment when nothing is stored or the segments
/// grew past [`MAX_SEGMENTS`] or twice the lineage's size. `None` when
/// nothing changed. The write costs what the step changed, not the
/// session's length (the fingerprints are a hash per message, in memory).
pub(crate) fn history_delta(
    lineage: &Lineage,
    mark: Option<&HistoryMark>,
) -> Result<Option<HistoryDelta>, LineageError> {
    let prints = lineage.record_prints();
    let whole = |prints: RecordPrints| -> Result<Option<HistoryDelta>, LineageError> {
        let segment = lineage.to_record()?;
        Ok(Some(HistoryDelta {
            keep: 0,
            mark: HistoryMark {
                prints,
                segments: 1,
                bytes: segment.len(),
            },
            append: vec![segment],
        }))
    };
    let Some(mark) = mark else {
        return whole(prints);
    };
    if prints.same_parts(&mark.prints) {
        return Ok(None);
    }
    let keep = lineage.record_kept(&prints, &mark.prints);
    let segment = lineage.to_segment(keep)?;
    let bytes = mark.bytes + segment.len();
    if mark.segments + 1 > MAX_SEGMENTS || bytes > 2 * prints.bytes + REWRITE_SLACK {
        return whole(prints);
    }
    Ok(Some(HistoryDelta {
        keep: mark.segments,
        mark: HistoryMark {
            prints,
            segments: mark.segments + 1,
            bytes,
        },
        append: vec![segment],
    }))
}

/// The name of `key`'s session in the store: credential scope and id, so
/// that two credentials never share a session.
pub fn store_id(key: &super::SessionKey) -> String {
    format!("{}:{}", key.scope, key.id)
}

/// Where a stored step's time went, traced (target `ctx_timing::session`,
/// level trace) for the fleet bench.
#[derive(Default)]
struct StepTiming {
    load: Duration,
    waited: Duration,
    reloaded: bool,
    rebuild: Duration,
    step: Duration,
    record: Duration,
    commit: Duration,
}

impl StepTiming {
    fn trace(&self, sid: &str, attempt: usize, archived: bool) {
        let us = |d: Duration| d.as_micros() as u64;
        tracing::trace!(
            target: "ctx_timing::session",
            session = sid,
            attempt,
            archived,
            reloaded = self.reloaded,
            load_us = us(self.load),
            waited_us = us(self.waited),
            rebuild_us = us(self.rebuild),
            step_us = us(self.step),
            record_us = us(self.record),
            commit_us = us(self.commit),
            "step"
        );
    }
}

/// The session step ([`super::step`]) for a stored session:
/// brings the cached copy up to date, runs the step, and commits it by
/// compare-and-swap (retrying on a conflict). Blocking: call it on the
/// blocking pool. On `Err` the request goes unmanaged and the cached copy
/// is dropped.
pub(crate) fn prepare_stored(
    slot: &mut Option<super::Managed>,
    ctx: &Arc<super::SessionContext>,
    key: &super::SessionKey,
    store: &SharedStore,
    run: impl Fn(&mut super::Managed) -> Result<super::Plan, SessionError>,
) -> Result<super::Plan, SessionError> {
    let sid = store_id(key);
    if !store.available() {
        // The store failed lately: skipped at once, not waited for.
        *slot = None;
        let why = store
            .health
            .degraded()
            .map(|(why, _)| why)
            .unwrap_or_default();
        return Err(SessionError::Skipped { why });
    }
    // Set when a step numbered a compaction record the store holds: the
    // highest stored number, which the step run again numbers after.
    let mut renumber: Option<u64> = None;
    for attempt in 0..RETRIES {
        let mut timing = StepTiming::default();
        if let Err(e) = up_to_date(slot, ctx, &sid, store, attempt, &mut timing) {
            *slot = None;
            return Err(e);
        }
        let Some(m) = slot.as_mut() else {
            return Err(SessionError::NoSession);
        };
        if let Some(n) = renumber {
            m.host_mut().number_records_after(n);
        }
        let t = Instant::now();
        let plan = match run(m) {
            Ok(plan) => plan,
            Err(why) => {
                // What the step changed is not stored: start from the
                // record next time.
                *slot = None;
                return Err(why);
            }
        };
        timing.step = t.elapsed();
        let t = Instant::now();
        let expected = m.stored_version().unwrap_or(0);
        m.set_awaiting(Some(store.owner.clone()));
        let (batches, state, history) = match m.record(true) {
            Ok(record) => record,
            Err(why) => {
                // The step is not stored: start from the record next time.
                *slot = None;
                return Err(why);
            }
        };
        timing.record = t.elapsed();
        let t = Instant::now();
        let written = store.observe(
            t,
            store.store.commit_versioned(
                &sid,
                expected,
                &batches,
                &state,
                history.as_ref().map(HistoryDelta::write),
            ),
        );
        timing.commit = t.elapsed();
        match written {
            Ok(version) => {
                m.set_stored_version(version, history.map(|h| h.mark));
                timing.trace(&sid, attempt, !batches.is_empty());
                return Ok(plan);
            }
            Err(StoreError::Conflict { .. }) => {
                // Another instance wrote the session meanwhile: reload and
                // run the step on its state.
                tracing::debug!(session = %sid, "session changed by another instance: step run again");
                *slot = None;
            }
            Err(e @ StoreError::Duplicate { .. }) => {
                // Nobody else wrote: the step numbered a record the store
                // holds already (the session's count fell behind its
                // records). Run as it was, it would clash again: once, the
                // step runs again numbered after the stored records.
                *slot = None;
                if renumber.is_some() {
                    return Err(SessionError::Refused(e));
                }
                let records = store
                    .observe(Instant::now(), store.store.compactions(&sid))
                    .map_err(SessionError::Unavailable)?;
                tracing::warn!(session = %sid, error = %e, "compaction numbered like a stored one: numbered after the stored records and run again");
                renumber = Some(records.iter().map(|r| r.seq).max().unwrap_or(0));
            }
            Err(e) => {
                *slot = None;
                return Err(SessionError::Unavailable(e));
            }
        }
    }
    Err(SessionError::Contended {
        session: sid,
        attempts: RETRIES,
    })
}

/// Brings the copy in `slot` up to date with the stored record of `sid`
/// (one read; none on a first attempt whose copy the last check found
/// current), waiting for the usage another instance owes it.
fn up_to_date(
    slot: &mut Option<super::Managed>,
    ctx: &Arc<super::SessionContext>,
    sid: &str,
    store: &SharedStore,
    attempt: usize,
    timing: &mut StepTiming,
) -> Result<(), SessionError> {
    // One read: nothing when the copy held is current, else the
    // record or what changed of it (or none: a new session). A copy
    // the last check found current skips it on the first attempt: the step's
    // compare-and-swap fails if another instance wrote meanwhile, and
    // the next attempt reads (a session that stays on one instance
    // saves a round trip per request; one that moves checks first).
    let t = Instant::now();
    let trusted = attempt == 0 && slot.as_ref().is_some_and(super::Managed::is_current);
    let known = slot.as_ref().and_then(super::Managed::stored_version);
    let held = slot.as_ref().map_or(0, super::Managed::held_segments);
    let load = || match known {
        Some(known) => store.observe(
            Instant::now(),
            store.store.load_versioned_after(sid, known, held),
        ),
        None => store
            .observe(Instant::now(), store.store.load_versioned(sid))
            .map(Since::Changed),
    };
    let found = if trusted {
        Ok(Since::Unchanged)
    } else {
        load()
    };
    timing.load = t.elapsed();
    let found = match found {
        Ok(since) if awaited_elsewhere(&since, &store.owner) => {
            let t = Instant::now();
            let found = await_usage(store, sid, since, load);
            timing.waited = t.elapsed();
            found
        }
        other => other,
    };
    let t = Instant::now();
    let rebuilt = match found {
        Ok(Since::Unchanged) => {
            if let Some(m) = slot.as_mut() {
                m.set_current(true);
            }
            Ok(false)
        }
        Ok(Since::Changed(record)) => rebuild(slot, ctx, sid, store, record).map(|()| true),
        Ok(Since::Appended {
            version,
            state,
            from,
            segments,
        }) => {
            let advanced = match slot.take() {
                Some(m) => m.advance(version, state, from, &segments),
                None => Err(SessionError::NoCopy),
            };
            match advanced {
                Ok(m) => {
                    *slot = Some(m);
                    Ok(true)
                }
                Err(why) => {
                    // Read whole: the copy was not what the store held.
                    tracing::debug!(session = %sid, reason = %why, "stored session read whole");
                    store
                        .observe(Instant::now(), store.store.load_versioned(sid))
                        .map_err(SessionError::Unavailable)
                        .and_then(|r| rebuild(slot, ctx, sid, store, r))
                        .map(|()| true)
                }
            }
        }
        Err(e) => Err(SessionError::Unavailable(e)),
    };
    if rebuilt? {
        timing.reloaded = true;
        timing.rebuild = t.elapsed();
    }
    Ok(())
}

/// Replaces the copy in `slot` by the session built from `record` (none: a
/// new session).
fn rebuild(
    slot: &mut Option<super::Managed>,
    ctx: &Arc<super::SessionContext>,
    sid: &str,
    store: &SharedStore,
    record: Option<Versioned>,
) -> Result<(), SessionError> {
    // A plain state (version 0) is not a server's record.
    let record = record.filter(|r| r.version > 0).map(Loaded::from);
    let staged = Arc::new(Staged::new(Arc::clone(&store.store), None));
    *slot = None;
    *slot = Some(super::Managed::stored(
        Arc::clone(ctx),
        sid,
        staged,
        record,
    )?);
    Ok(())
}

/// The version and state a read found, if it found a record.
fn found_state(since: &Since) -> Option<(u64, &Value)> {
    match since {
        Since::Unchanged | Since::Changed(None) => None,
        Since::Changed(Some(r)) => Some((r.version, &r.state)),
        Since::Appended { version, state, .. } => Some((*version, state)),
    }
}

/// Whether the record `since` found awaits the usage of a response
/// another instance than `owner` is serving.
fn awaited_elsewhere(since: &Since, owner: &str) -> bool {
    found_state(since).is_some_and(|(_, state)| {
        state
            .pointer("/serve/awaiting")
            .and_then(Value::as_str)
            .is_some_and(|o| o != owner)
    })
}

/// Waits until the instance the record `since` found awaits has written
/// its usage (the version moves on), polling the version for at most
/// [`USAGE_WAIT`], then reads again with `load`. Blocking.
fn await_usage(
    store: &SharedStore,
    sid: &str,
    since: Since,
    load: impl Fn() -> Result<Since, StoreError>,
) -> Result<Since, StoreError> {
    let started = Instant::now();
    let mut pause = Duration::from_micros(250);
    let mut since = since;
    while awaited_elsewhere(&since, &store.owner) && started.elapsed() < USAGE_WAIT {
        let Some((version, _)) = found_state(&since) else {
            break;
        };
        std::thread::sleep(pause.min(USAGE_WAIT.saturating_sub(started.elapsed())));
        pause = (pause * 2).min(Duration::from_millis(8));
        let now = store.observe(Instant::now(), store.store.version(sid))?;
        if now != Some(version) {
            since = load()?;
        }
    }
    if awaited_elsewhere(&since, &store.owner) {
        tracing::debug!(session = %sid, "usage of another instance's response not written in time: the step runs without it");
    }
    Ok(since)
}

/// Settles a stored session's response: feeds its usage (`None`: the call
/// failed or reported none), clears the awaited mark, and writes the state
/// (the lineage did not change). Blocking. A failure only drops the cached
/// copy: the next request reloads the record.
pub(crate) fn after_response_stored(
    slot: &mut Option<super::Managed>,
    usage: Option<&context_engine::engine::Usage>,
    store: &SharedStore,
) {
    if slot.is_some() && !store.available() {
        // The store failed lately: the next request reloads the session.
        *slot = None;
        return;
    }
    let Some(m) = slot.as_mut() else { return };
    let awaited = m.set_awaiting(None).is_some();
    if let Some(usage) = usage {
        m.after_response(usage);
    } else if !awaited {
        // Nothing to write.
        return;
    }
    let sid = m.id().to_owned();
    let sid = sid.as_str();
    let started = Instant::now();
    let expected = m.stored_version().unwrap_or(0);
    let mut commit = Duration::ZERO;
    let written = m.record(false).and_then(|(b, s, _)| {
        let t = Instant::now();
        let r = store
            .observe(t, store.store.commit_versioned(sid, expected, &b, &s, None))
            .map_err(SessionError::Unavailable);
        commit = t.elapsed();
        r
    });
    tracing::trace!(
        target: "ctx_timing::session",
        session = sid,
        record_us = started.elapsed().saturating_sub(commit).as_micros() as u64,
        commit_us = commit.as_micros() as u64,
        "usage"
    );
    match written {
        Ok(version) => m.set_stored_version(version, None),
        Err(e) => {
            tracing::warn!(session = %sid, error = %e, "usage not stored: the next request reloads the session");
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests;
