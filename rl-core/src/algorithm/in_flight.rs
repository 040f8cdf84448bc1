//! In flight: at most `T` calls hold a slot at once; `P` is a slot's lease
//! (its time to live in a remote store, where a dead holder stops renewing
//! it). Not a rate: a slot is taken at admission and given back
//! ([`State::refund`]) when the call ends.
//!
//! - allowed iff `held + c ≤ T`; `remaining = T − held` (after this call);
//! - `retry_after` (refused) is a hint, [`RETRY_HINT_US`]: a slot frees
//!   whenever any running call ends, which nothing can predict;
//! - `reset_after` is `P` while any slot is held (the longest a held slot
//!   can stay without renewal), 0 otherwise.
//!
//! In memory a slot lives as long as its holder's guard: the process that
//! holds it is the store, so it needs no lease. The Redis code keeps one
//! sorted-set member per slot, scored by its lease's expiry, with the same
//! figures.

use super::State;
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// The `retry_after` of a refused in-flight call: 1 s, the smallest
/// `Retry-After` HTTP can say.
pub(crate) const RETRY_HINT_US: u64 = 1_000_000;

/// The slots held for one identity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Flight {
    held: u64,
}

impl State for Flight {
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        let (t, p) = (limit.threshold(), limit.period_micros());
        if self.held + cost > t {
            return Decision::new(Figures {
                allowed: false,
                limit: t,
                remaining: t.saturating_sub(self.held),
                retry_after_us: RETRY_HINT_US,
                reset_after_us: p,
                at_micros: now,
            });
        }
        if commit {
            self.held += cost;
        }
        Decision::new(Figures {
            allowed: true,
            limit: t,
            remaining: t - self.held,
            retry_after_us: 0,
            reset_after_us: if self.held > 0 { p } else { 0 },
            at_micros: now,
        })
    }

    fn refund(&mut self, _limit: &Limit, _now: u64, cost: u64, _at: u64) {
        self.held = self.held.saturating_sub(cost);
    }

    fn charge(&mut self, _limit: &Limit, _now: u64, _units: u64) {}

    fn hold(&mut self, _limit: &Limit, _now: u64, _after: u64, _left: u64) {}

    fn expires_at(&self) -> u64 {
        if self.held > 0 { u64::MAX } else { 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_held_until_given_back_and_never_more_than_the_limit() {
        let limit = Limit::in_flight(2).unwrap();
        let mut state = Flight::default();
        assert!(state.decide(&limit, 0, 1, true).allowed());
        assert!(state.decide(&limit, 0, 1, true).allowed());
        let refused = state.decide(&limit, 1_000_000_000, 1, true);
        assert!(!refused.allowed());
        assert_eq!(refused.retry_after().as_micros(), u128::from(RETRY_HINT_US));
        assert!(
            !state.is_idle(u64::MAX - 1),
            "a held slot never expires in memory"
        );
        state.refund(&limit, 0, 1, 0);
        let again = state.decide(&limit, 0, 1, true);
        assert!(again.allowed());
        assert_eq!(again.remaining(), 0);
        state.refund(&limit, 0, 1, 0);
        state.refund(&limit, 0, 1, 0);
        state.refund(&limit, 0, 1, 0);
        assert!(state.is_idle(0));
    }
}
