//! The cap on request bytes in flight (`serve.max_inflight_bytes`): every
//! request body takes its bytes from one shared budget before it is read
//! (its declared `Content-Length` at once, a body without a length as it
//! streams) and gives them back when its handling ends. A request that
//! does not fit is refused at once (503 with `Retry-After`) instead of
//! growing the process until it is killed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The shared budget.
#[derive(Debug)]
pub struct InflightBudget {
    cap: usize,
    used: AtomicUsize,
}

impl InflightBudget {
    /// A budget of `cap` bytes.
    pub fn new(cap: usize) -> Arc<InflightBudget> {
        Arc::new(InflightBudget {
            cap,
            used: AtomicUsize::new(0),
        })
    }

    /// The bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// The cap.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Takes `bytes`, or `None` when they do not fit.
    pub fn try_take(self: &Arc<Self>, bytes: usize) -> Option<Permit> {
        self.take(bytes).then(|| Permit {
            budget: Arc::clone(self),
            bytes,
        })
    }

    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.cap)
            })
            .is_ok()
    }
}

/// Bytes taken from the budget, given back on drop.
#[derive(Debug)]
pub struct Permit {
    budget: Arc<InflightBudget>,
    bytes: usize,
}

impl Permit {
    /// Takes `more` bytes for the same request; `false` (and nothing
    /// taken) when they do not fit.
    pub fn grow(&mut self, more: usize) -> bool {
        if !self.budget.take(more) {
            return false;
        }
        self.bytes += more;
        true
    }

    /// The bytes this permit holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_gives_back_and_refuses_past_the_cap() {
        let budget = InflightBudget::new(100);
        let a = budget.try_take(60).unwrap();
        assert!(budget.try_take(41).is_none());
        let mut b = budget.try_take(40).unwrap();
        assert!(!b.grow(1));
        assert_eq!(budget.used(), 100);
        drop(a);
        assert!(b.grow(60));
        assert_eq!((b.bytes(), budget.used()), (100, 100));
        drop(b);
        assert_eq!(budget.used(), 0);
        assert!(budget.try_take(101).is_none());
    }
}
