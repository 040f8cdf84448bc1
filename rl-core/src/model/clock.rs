//! Time sources: the system clock and a manual clock for deterministic tests.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `d` in whole microseconds, the unit every decision computes in,
/// saturating at `u64::MAX` (about 584 000 years).
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The instant `d` after `at`, saturating: a duration past what an
/// `Instant` can hold (an upstream's `Retry-After` of 10^19 s, a wait of
/// `Duration::MAX`) ends a century after `at` instead of panicking.
pub(crate) fn later(at: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
    at.checked_add(d)
        .or_else(|| at.checked_add(CENTURY))
        .unwrap_or(at)
}

/// A source of the current time, in whole microseconds since the Unix epoch.
///
/// All arithmetic in the limiter is on integer microseconds so that the
/// in-memory and Redis backends (whose Lua numbers are doubles, exact up to
/// 2^53) compute identical decisions.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;
}

/// The machine's clock: the wall clock as read once (when first used),
/// advanced by the CPU's monotonic cycle counter (through `quanta`, about
/// 10 ns a read where the time stamp counter is invariant, otherwise the
/// OS's monotonic clock).
///
/// It never steps back (an NTP correction of the wall clock does not move
/// it) and drifts from the wall clock only as much as the machine's
/// oscillator does. Decisions in memory need exactly that: a steady count
/// of microseconds. A remote backend keeps its own time (Redis `TIME`).
///
/// ```
/// use ratewall::clock::{Clock, SystemClock};
/// let (a, b) = (SystemClock.now_micros(), SystemClock.now_micros());
/// assert!(b >= a);
/// let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
/// assert!(a.abs_diff(wall.as_micros() as u64) < 60_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// The wall clock's reading at one instant of the cycle counter.
struct Anchor {
    clock: quanta::Clock,
    raw: u64,
    epoch_micros: u64,
}

static ANCHOR: LazyLock<Anchor> = LazyLock::new(|| {
    let clock = quanta::Clock::new();
    let raw = clock.raw();
    let epoch_micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    Anchor {
        clock,
        raw,
        epoch_micros,
    }
});

impl Clock for SystemClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        let anchor = &*ANCHOR;
        let elapsed = anchor.clock.delta_as_nanos(anchor.raw, anchor.clock.raw());
        anchor.epoch_micros + elapsed / 1_000
    }
}

/// A clock that only moves when told to; clones share the same time.
///
/// ```
/// use ratewall::clock::{Clock, ManualClock};
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
