//! A limit's block (a penalty box, [`Limit::with_block`]): once a call is
//! refused by such a limit, the identity is refused by it for the block.
//! The bounds are the grammar's ([`ratewall_grammar::check_block`]); the
//! stores keep and read the blocks (`store/memory/block.rs`, and
//! `ratewall-redis`'s `lua/block.lua`).

use std::time::Duration;

use ratewall_grammar::BlockProblem;

use super::Limit;
use crate::model::clock::micros;
use crate::model::error::LimitError;

impl Limit {
    /// The same limit with a block (a penalty box, rate-limiter-flexible's
    /// `blockDuration`): once a call is refused by this limit, the identity
    /// is refused by it for `block` from that refusal, whatever its state
    /// says, with `remaining` 0 and a `retry_after` until the block ends
    /// (or later, when the state then still refuses). The block is written
    /// by the decision that refused, in the same atomic step (one round
    /// trip on Redis), and every instance sharing the store sees it.
    /// Refusals during the block do not extend it; the first refusal after
    /// it starts a new one. Only the limit that refused is blocked: the
    /// other limits of an all-or-nothing call, and the identity's other
    /// keys, are untouched. A block is lifted by a reset of the limit for
    /// the identity, or by [`Settings::unblock`](crate::settings::Settings::unblock).
    ///
    /// ```
    /// use ratewall::Limit;
    /// use std::time::Duration;
    /// let login = Limit::per_minute(5)?.with_block(Duration::from_secs(900))?;
    /// assert_eq!(login.block(), Some(Duration::from_secs(900)));
    /// assert_eq!(login.to_string(), "5/1m (gcra, block 15m)");
    /// assert!(Limit::per_minute(5)?.with_block(Duration::ZERO).is_err());
    /// assert!(Limit::per_minute(5)?.with_block(Duration::from_secs(31 * 86_400)).is_err());
    /// assert!(login.with_lease(2).is_err()); // leased units would be admitted past a block
    /// assert!(Limit::in_flight(4)?.with_block(Duration::from_secs(1)).is_err());
    /// # Ok::<(), ratewall::error::LimitError>(())
    /// ```
    ///
    /// # Errors
    /// [`LimitError::Block`] with the reason
    /// ([`BlockProblem`](crate::error::BlockProblem)): `OutOfRange` for a
    /// block under 1 ms or over 30 days, `InFlight` for a concurrency limit,
    /// `Lease` for a limit that leases.
    pub fn with_block(self, block: Duration) -> Result<Self, LimitError> {
        let block_us = micros(block);
        match ratewall_grammar::check_block(block_us, self.algorithm, self.lease) {
            Ok(()) => Ok(Self { block_us, ..self }),
            Err(problem) => Err(LimitError::Block(problem)),
        }
    }

    /// [`Limit::with_block`] for constants and statics, in microseconds
    /// (what `#[rate_limit(block_for = ...)]` builds, after checking the
    /// block itself).
    ///
    /// # Panics
    /// When the block does not fit the limit (at compile time in a
    /// constant).
    pub const fn with_block_const(self, block_us: u64) -> Self {
        match ratewall_grammar::check_block(block_us, self.algorithm, self.lease) {
            Ok(()) => Self { block_us, ..self },
            Err(_) => panic!("invalid block"),
        }
    }

    /// The same limit without a block.
    pub const fn without_block(self) -> Self {
        Self {
            block_us: 0,
            ..self
        }
    }

    /// How long an identity stays refused once this limit refused it, when
    /// the limit blocks ([`Limit::with_block`]).
    pub const fn block(&self) -> Option<Duration> {
        if self.block_us == 0 {
            None
        } else {
            Some(Duration::from_micros(self.block_us))
        }
    }

    /// The block in microseconds (0: none).
    #[inline(always)]
    pub const fn block_micros(&self) -> u64 {
        self.block_us
    }

    /// This limit with a block of `block_us` (0: none) checked again.
    pub(super) fn keep_block(self, block_us: u64) -> Result<Self, LimitError> {
        if block_us == 0 {
            Ok(self)
        } else {
            self.with_block(Duration::from_micros(block_us))
        }
    }
}

impl From<BlockProblem> for LimitError {
    fn from(problem: BlockProblem) -> Self {
        LimitError::Block(problem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::limit::Algorithm;

    #[test]
    fn a_block_is_bounded_survives_changes_and_excludes_leases_and_slots() {
        let minute = Limit::per_minute(5).unwrap();
        let block = |us| minute.with_block(Duration::from_micros(us));
        assert!(block(999).is_err() && block(1_000).is_ok());
        assert!(block(30 * 86_400_000_000).is_ok());
        assert_eq!(
            block(30 * 86_400_000_000 + 1),
            Err(LimitError::Block(BlockProblem::OutOfRange {
                block_us: 30 * 86_400_000_000 + 1
            }))
        );
        let blocking = block(900_000_000).unwrap();
        assert_eq!(blocking.block_micros(), 900_000_000);
        assert_eq!(
            blocking.with_threshold(9).unwrap().block(),
            blocking.block()
        );
        assert_eq!(blocking.with_burst(9).unwrap().block(), blocking.block());
        let windows = blocking.with_algorithm(Algorithm::SlidingWindow).unwrap();
        assert_eq!(windows.with_slots(5).unwrap().block(), blocking.block());
        assert_eq!(
            blocking.with_algorithm(Algorithm::InFlight),
            Err(LimitError::Block(BlockProblem::InFlight))
        );
        assert_eq!(
            blocking.with_lease(2),
            Err(LimitError::Block(BlockProblem::Lease))
        );
        assert_eq!(
            minute
                .with_lease(2)
                .unwrap()
                .with_block(Duration::from_secs(1)),
            Err(LimitError::Block(BlockProblem::Lease))
        );
        // Not part of the state's identity: changing it keeps the state.
        assert_eq!(blocking.state_id(), minute.state_id());
        assert_eq!(blocking.without_block(), minute);
        assert_eq!(
            Limit::from_parts_const(5, 60_000_000, Algorithm::Gcra, 5, 10)
                .with_block_const(900_000_000),
            blocking
        );
    }
}
