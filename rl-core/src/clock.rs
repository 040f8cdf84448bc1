//! Time sources: the system clock and a manual clock for deterministic tests.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in whole microseconds since the Unix epoch.
///
/// All arithmetic in the limiter is on integer microseconds so that the
/// in-memory and Redis backends (whose Lua numbers are doubles, exact up to
/// 2^53) compute identical decisions.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;
}

/// The machine's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; clones share the same time.
///
/// ```
/// use rl_core::{Clock, ManualClock};
/// use std::time::Duration;
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_millis(2));
/// assert_eq!(clock.now_micros(), 3_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `micros` microseconds since the epoch.
    pub fn new(micros: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(micros)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    /// Moves the clock forward by a number of microseconds.
    pub fn advance_micros(&self, by: u64) {
        self.now.fetch_add(by, Ordering::SeqCst);
    }

    /// Sets the clock to an absolute time in microseconds.
    pub fn set_micros(&self, micros: u64) {
        self.now.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
