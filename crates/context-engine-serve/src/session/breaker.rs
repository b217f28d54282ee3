//! The session store's circuit breaker: once the store fails, requests
//! skip it at once (they go unmanaged) instead of each waiting for the
//! store's timeout, and one probe at a time, at a growing interval, asks
//! the store whether it answers again.
//!
//! A database that accepts connections and never answers costs the first
//! request its full timeout (`store.timeout_seconds`); with the breaker
//! open, the requests after it do not touch the store. The first probe is
//! due [`FIRST_PROBE`] after the failure, each failed probe doubles the
//! interval up to [`MAX_PROBE_INTERVAL`]; any call that succeeds closes the
//! breaker.

use std::time::{Duration, Instant};

/// How long after the store failed the first probe is due.
pub const FIRST_PROBE: Duration = Duration::from_millis(500);

/// The longest interval between two probes.
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// Whether a caller may use the store now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// The store answers: use it.
    Closed,
    /// The store failed: skip it, and run the probe (this caller is the
    /// only one asked to).
    Probe,
    /// The store failed: skip it (a probe is on its way or not due yet).
    Skip,
}

/// The breaker's state (see the module's text). Time is passed in, so the
/// rules are checked without waiting.
#[derive(Debug, Default)]
pub struct Breaker {
    open: Option<Open>,
}

#[derive(Debug)]
struct Open {
    interval: Duration,
    next_probe: Instant,
    probing: bool,
}

impl Breaker {
    /// Whether a caller may use the store at `now`; at most one caller at
    /// a time is told to probe, and only once the interval has passed.
    pub fn admit(&mut self, now: Instant) -> Admit {
        let Some(open) = self.open.as_mut() else {
            return Admit::Closed;
        };
        if open.probing || now < open.next_probe {
            return Admit::Skip;
        }
        open.probing = true;
        Admit::Probe
    }

    /// Whether the breaker is open.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// A store call succeeded: the breaker closes. Returns whether it was
    /// open.
    pub fn succeeded(&mut self) -> bool {
        self.open.take().is_some()
    }

    /// A store call failed at `now`: the breaker opens (the first probe
    /// due [`FIRST_PROBE`] later). A call that was under way when it
    /// opened changes nothing more. Returns whether it just opened.
    pub fn failed(&mut self, now: Instant) -> bool {
        if self.open.is_some() {
            return false;
        }
        self.open = Some(Open {
            interval: FIRST_PROBE,
            next_probe: now + FIRST_PROBE,
            probing: false,
        });
        true
    }

    /// The probe failed at `now`: the next is due twice as long after
    /// (at most [`MAX_PROBE_INTERVAL`]).
    pub fn probe_failed(&mut self, now: Instant) {
        match self.open.as_mut() {
            Some(open) => {
                open.interval = (open.interval * 2).min(MAX_PROBE_INTERVAL);
                open.next_probe = now + open.interval;
                open.probing = false;
            }
            None => {
                self.failed(now);
            }
        }
    }

    /// The probe could not be run: another caller may start one.
    pub fn probe_abandoned(&mut self) {
        if let Some(open) = self.open.as_mut() {
            open.probing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_breaker_skips_the_store_and_probes_one_at_a_time_ever_less_often() {
        let t0 = Instant::now();
        let mut b = Breaker::default();
        assert_eq!(b.admit(t0), Admit::Closed);
        assert!(b.failed(t0), "the first failure opens it");
        assert!(!b.failed(t0), "a call under way when it opened");
        assert_eq!(b.admit(t0), Admit::Skip, "no probe before the interval");
        let due = t0 + FIRST_PROBE;
        assert_eq!(b.admit(due), Admit::Probe);
        assert_eq!(b.admit(due), Admit::Skip, "one probe at a time");
        // Each failed probe doubles the interval, up to the bound.
        let mut now = due;
        let mut interval = FIRST_PROBE;
        for _ in 0..10 {
            b.probe_failed(now);
            interval = (interval * 2).min(MAX_PROBE_INTERVAL);
            assert_eq!(
                b.admit(now + interval - Duration::from_millis(1)),
                Admit::Skip
            );
            now += interval;
            assert_eq!(b.admit(now), Admit::Probe);
        }
        assert_eq!(interval, MAX_PROBE_INTERVAL);
        assert!(b.succeeded(), "a success closes it");
        assert_eq!(b.admit(now), Admit::Closed);
        assert!(!b.succeeded());
        // A probe that could not run leaves the next caller to it.
        b.failed(now);
        let later = now + FIRST_PROBE;
        assert_eq!(b.admit(later), Admit::Probe);
        b.probe_abandoned();
        assert_eq!(b.admit(later), Admit::Probe);
    }
}
