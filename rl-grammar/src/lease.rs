//! Quota leasing: which algorithms can lease, and how large a lease may be.
//!
//! A lease reserves units of a limit in the shared store for one process,
//! which then admits calls from them without a round trip. A reserved unit
//! is consumed when it is reserved, so a process may only hand it out while
//! admitting it then is something the algorithm would have allowed:
//!
//! - `fixed_window`: a unit is valid until the end of the window it was
//!   taken in (counts are per window, so when in the window it is used does
//!   not matter);
//! - `sliding_window`: until the end of the slot it was taken in (the
//!   counter is kept per slot: a unit used in its slot is counted exactly
//!   as if it had been taken then, and the estimate only falls within a
//!   slot, so it would have been admitted then too);
//! - `gcra`, `token_bucket`, `leaky_bucket`: unit `k` of a lease is valid
//!   until its theoretical arrival time (the time the algorithm scheduled it
//!   for), so every unit is used inside the algorithm's own bound;
//! - `sliding_log` cannot lease: it keeps the time of every admitted unit,
//!   and a unit reserved at one time and used later would leave the log
//!   before its use had left the window, letting more than `threshold`
//!   through in some window;
//! - concurrency limits (`max_in_flight`) cannot lease either: their slots
//!   are held while a call runs and come back when it ends, not spent.

use std::fmt;

use crate::algorithm::Algorithm;
use crate::bounds::capacity;

/// Whether limits of `algorithm` can lease units (every rate algorithm but
/// the sliding log; see the module docs for why).
///
/// ```
/// use ratewall_grammar::{Algorithm, can_lease};
/// assert!(can_lease(Algorithm::Gcra) && can_lease(Algorithm::FixedWindow));
/// assert!(!can_lease(Algorithm::SlidingLog));
/// assert!(!can_lease(Algorithm::InFlight));
/// ```
pub const fn can_lease(algorithm: Algorithm) -> bool {
    algorithm.leases()
}

/// Why a lease size does not fit a limit. The message says how to fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseProblem {
    /// `lease = 0`: leave `lease` out to decide every call in the store.
    Zero,
    /// A lease as large as the capacity would let one process hold the
    /// whole limit.
    TooLarge {
        /// The lease asked for.
        lease: u64,
        /// The capacity (threshold, or burst for gcra and the buckets).
        capacity: u64,
        /// Whether the capacity is the burst.
        burst: bool,
    },
    /// The algorithm keeps per-unit timestamps (the sliding log), or the
    /// limit is a concurrency limit (slots held, not spent).
    Algorithm(Algorithm),
}

impl fmt::Display for LeaseProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LeaseProblem::Zero => f.write_str(
                "lease must be at least 1, got 0; leave `lease` out to decide every call in the store",
            ),
            LeaseProblem::TooLarge {
                lease,
                capacity,
                burst,
            } => write!(
                f,
                "lease {lease} must be smaller than the capacity of {capacity} (the {}): one process would \
                 hold the whole limit; pick a lease of at most {}",
                if burst { "burst" } else { "threshold" },
                capacity.saturating_sub(1)
            ),
            LeaseProblem::Algorithm(Algorithm::InFlight) => f.write_str(
                "a concurrency limit (`max_in_flight`) cannot lease: its slots are held while a call runs, \
                 not spent; remove `lease`",
            ),
            LeaseProblem::Algorithm(algorithm) => write!(
                f,
                "`{algorithm}` cannot lease: it keeps the time of every admitted unit, and a unit reserved \
                 now but used later would leave the window too early; use `sliding_window`, `fixed_window`, \
                 `gcra` or a bucket, or remove `lease`"
            ),
        }
    }
}

impl std::error::Error for LeaseProblem {}

/// Checks a lease of `lease` units against a limit's parts: at least 1,
/// below the capacity, and an algorithm that can lease ([`can_lease`]).
///
/// ```
/// use ratewall_grammar::{Algorithm, LeaseProblem, check_lease};
/// assert_eq!(check_lease(1_000, Algorithm::Gcra, 1_000, 100), Ok(()));
/// assert_eq!(check_lease(1_000, Algorithm::Gcra, 1_000, 0), Err(LeaseProblem::Zero));
/// assert!(check_lease(1_000, Algorithm::FixedWindow, 1, 1_000).is_err());
/// assert_eq!(
///     check_lease(10, Algorithm::SlidingLog, 10, 2),
///     Err(LeaseProblem::Algorithm(Algorithm::SlidingLog))
/// );
/// ```
///
/// # Errors
/// [`LeaseProblem::Zero`] for a lease of 0, [`LeaseProblem::Algorithm`] for
/// an algorithm that cannot lease (the sliding log, a concurrency limit),
/// and [`LeaseProblem::TooLarge`] for a lease at or above the capacity,
/// checked in that order.
pub const fn check_lease(
    threshold: u64,
    algorithm: Algorithm,
    burst: u64,
    lease: u64,
) -> Result<(), LeaseProblem> {
    if lease == 0 {
        return Err(LeaseProblem::Zero);
    }
    if !can_lease(algorithm) {
        return Err(LeaseProblem::Algorithm(algorithm));
    }
    let capacity = capacity(threshold, algorithm, burst);
    if lease >= capacity {
        return Err(LeaseProblem::TooLarge {
            lease,
            capacity,
            burst: algorithm.uses_burst(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_but_the_sliding_log_leases_below_its_capacity() {
        for algorithm in Algorithm::ALL {
            let result = check_lease(100, algorithm, 50, 10);
            assert_eq!(
                result.is_ok(),
                algorithm != Algorithm::SlidingLog,
                "{algorithm}"
            );
        }
        assert_eq!(
            check_lease(100, Algorithm::Gcra, 50, 50),
            Err(LeaseProblem::TooLarge {
                lease: 50,
                capacity: 50,
                burst: true
            })
        );
        assert_eq!(check_lease(100, Algorithm::FixedWindow, 50, 99), Ok(()));
    }

    #[test]
    fn messages_say_how_to_fix_the_lease() {
        let too_large = check_lease(10, Algorithm::FixedWindow, 10, 10)
            .unwrap_err()
            .to_string();
        assert!(
            too_large.contains("capacity of 10 (the threshold)"),
            "{too_large}"
        );
        assert!(too_large.contains("at most 9"), "{too_large}");
        let log = LeaseProblem::Algorithm(Algorithm::SlidingLog).to_string();
        assert!(log.starts_with("`sliding_log` cannot lease"), "{log}");
        assert!(LeaseProblem::Zero.to_string().contains("leave `lease` out"));
    }
}
