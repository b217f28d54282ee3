//! The one retry policy: exponential backoff from a first wait, doubled for
//! each next retry, capped, optionally jittered. The summarizer client
//! (`context-engine-openai`: 429 and 5xx, unless `Retry-After` says more),
//! the proxy's upstream connect retries (`context-engine-serve`, jittered)
//! and a plugin process's restarts ([`crate::plugin::Timeouts::backoff`])
//! all wait by it.

use std::time::Duration;

/// An exponential backoff (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    jitter: bool,
}

impl Backoff {
    /// `first` before the first retry, doubled for each next one, with no
    /// cap and no jitter.
    pub const fn exponential(first: Duration) -> Backoff {
        Backoff {
            first,
            cap: Duration::MAX,
            jitter: false,
        }
    }

    /// No wait longer than `cap`.
    pub const fn capped(mut self, cap: Duration) -> Backoff {
        self.cap = cap;
        self
    }

    /// Each wait a random point in the upper half of its full value (so
    /// that clients failing together do not retry together).
    pub const fn jittered(mut self) -> Backoff {
        self.jitter = true;
        self
    }

    /// The wait before retry `n` (from 1; 0 counts as 1): `first` doubled
    /// `n - 1` times, saturating, at most the cap; jittered, a random point
    /// in the upper half of that.
    pub fn delay(&self, n: u32) -> Duration {
        if self.first.is_zero() {
            return Duration::ZERO;
        }
        let full = match 1u32.checked_shl(n.saturating_sub(1)) {
            Some(factor) => self.first.saturating_mul(factor),
            None => Duration::MAX,
        }
        .min(self.cap);
        if !self.jitter {
            return full;
        }
        let half = full / 2;
        half.saturating_add(half.mul_f64(fastrand::f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_and_saturates_without_a_cap() {
        let b = Backoff::exponential(Duration::from_millis(100));
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(3), Duration::from_millis(400));
        assert_eq!(b.delay(200), Duration::MAX);
    }

    #[test]
    fn the_cap_bounds_every_wait() {
        let b = Backoff::exponential(Duration::from_millis(100)).capped(Duration::from_secs(30));
        assert_eq!(b.delay(3), Duration::from_millis(400));
        assert_eq!(b.delay(40), Duration::from_secs(30));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let b = Backoff::exponential(Duration::from_millis(25)).jittered();
        for _ in 0..200 {
            for (n, full) in [(1, 25), (2, 50), (3, 100)] {
                let wait = b.delay(n);
                let full = Duration::from_millis(full);
                assert!(wait >= full / 2 && wait <= full, "retry {n}: {wait:?}");
            }
        }
        assert!(b.delay(u32::MAX) > Duration::ZERO, "no overflow");
    }
}
