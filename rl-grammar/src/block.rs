//! Blocks (a penalty box): once a call is refused by a limit with a block,
//! the identity is refused by that limit for the block's duration.
//!
//! A block is written by the decision that refused, in the same atomic step
//! (one round trip on Redis), and read by every later decision of the limit
//! for that identity. Its bounds:
//!
//! - at least [`MIN_BLOCK_US`] (1 ms): a block is kept in the store with a
//!   time to live in whole milliseconds;
//! - at most [`MAX_BLOCK_US`] (30 days): its end, an absolute time in
//!   microseconds, stays exact in a Lua double (now ≈ 2^50.6 µs, 30 days
//!   ≈ 2^41.2 µs);
//! - only on rate limits: a concurrency limit (`max_in_flight`) refuses
//!   while its slots are held, which no block can shorten or lengthen;
//! - not with a lease: a leased unit is admitted in process, so a process
//!   holding leased units would admit calls of an identity another process
//!   blocked, and a refusal decided from a lease could not write its block.

use std::fmt;

use crate::algorithm::Algorithm;
use crate::text::format_duration;

/// The shortest block: 1 ms.
pub const MIN_BLOCK_US: u64 = 1_000;

/// The longest block: 30 days.
pub const MAX_BLOCK_US: u64 = 30 * 86_400_000_000;

/// Why a block does not fit a limit. The message says how to fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockProblem {
    /// A block outside [`MIN_BLOCK_US`] ..= [`MAX_BLOCK_US`].
    OutOfRange {
        /// The block asked for, in microseconds.
        block_us: u64,
    },
    /// A block on a concurrency limit.
    InFlight,
    /// A block on a limit that leases units.
    Lease,
}

impl fmt::Display for BlockProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            BlockProblem::OutOfRange { block_us } => write!(
                f,
                "a block lasts from 1ms to 30d (its end is kept exact in the store, with a time to live in \
                 whole milliseconds), got {}",
                format_duration(block_us)
            ),
            BlockProblem::InFlight => f.write_str(
                "a concurrency limit (`max_in_flight`) cannot block: it refuses while its slots are held, and \
                 admits again when a call ends; put the block on a rate limit, or remove it",
            ),
            BlockProblem::Lease => f.write_str(
                "a limit cannot both lease and block: a leased unit is admitted in process, where another \
                 process's block is not seen, and a refusal decided from a lease could not write its block; \
                 remove `lease` or the block",
            ),
        }
    }
}

impl std::error::Error for BlockProblem {}

/// Checks a block of `block_us` against a limit's algorithm and lease (0:
/// none): within [`MIN_BLOCK_US`] ..= [`MAX_BLOCK_US`], on a rate limit,
/// and not beside a lease.
///
/// ```
/// use ratewall_grammar::{Algorithm, BlockProblem, check_block};
/// assert_eq!(check_block(900_000_000, Algorithm::Gcra, 0), Ok(()));
/// assert_eq!(check_block(999, Algorithm::Gcra, 0), Err(BlockProblem::OutOfRange { block_us: 999 }));
/// assert_eq!(check_block(1_000_000, Algorithm::InFlight, 0), Err(BlockProblem::InFlight));
/// assert_eq!(check_block(1_000_000, Algorithm::FixedWindow, 10), Err(BlockProblem::Lease));
/// ```
///
/// # Errors
/// [`BlockProblem::OutOfRange`] for a block under 1 ms or over 30 days,
/// [`BlockProblem::InFlight`] for a concurrency limit and
/// [`BlockProblem::Lease`] for a limit that leases, checked in that order.
pub const fn check_block(
    block_us: u64,
    algorithm: Algorithm,
    lease: u64,
) -> Result<(), BlockProblem> {
    if block_us < MIN_BLOCK_US || block_us > MAX_BLOCK_US {
        return Err(BlockProblem::OutOfRange { block_us });
    }
    if algorithm.is_in_flight() {
        return Err(BlockProblem::InFlight);
    }
    if lease > 0 {
        return Err(BlockProblem::Lease);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::{DOUBLE_EXACT, MAX_CAPACITY_PERIOD};

    #[test]
    fn the_bounds_are_inclusive() {
        for algorithm in Algorithm::ALL {
            assert_eq!(check_block(MIN_BLOCK_US, algorithm, 0), Ok(()));
            assert_eq!(check_block(MAX_BLOCK_US, algorithm, 0), Ok(()));
            assert!(check_block(MIN_BLOCK_US - 1, algorithm, 0).is_err());
            assert!(check_block(MAX_BLOCK_US + 1, algorithm, 0).is_err());
        }
        assert!(check_block(0, Algorithm::Gcra, 0).is_err());
    }

    #[test]
    fn a_block_ends_exactly_in_a_double() {
        // 2100-01-01 in µs since the epoch, plus the longest block and the
        // largest state: every time a blocked decision computes.
        let year_2100_us: u64 = 4_102_444_800_000_000;
        assert!(year_2100_us + MAX_BLOCK_US + MAX_CAPACITY_PERIOD < DOUBLE_EXACT);
    }

    #[test]
    fn messages_say_how_to_fix_the_block() {
        let range = BlockProblem::OutOfRange { block_us: 500 }.to_string();
        assert!(
            range.contains("from 1ms to 30d") && range.ends_with("got 500us"),
            "{range}"
        );
        assert!(
            BlockProblem::Lease
                .to_string()
                .contains("remove `lease` or the block")
        );
        assert!(
            BlockProblem::InFlight
                .to_string()
                .contains("`max_in_flight`")
        );
    }
}
