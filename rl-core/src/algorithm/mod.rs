//! The six algorithms as pure functions over per-identity state.
//!
//! These functions are the reference semantics: the in-memory store calls
//! them under a lock, and the Redis Lua scripts implement the same integer
//! arithmetic line by line (the differential tests hold them to it).
//!
//! Each algorithm has its own state type (a [`State`]), so the in-memory
//! store keeps one compact table per algorithm (a GCRA identity is one
//! `u64`, not a slot sized for the largest algorithm).
//!
//! Conventions shared by every algorithm:
//! - time `now` is integer microseconds; `P` is the period in µs, `T` the
//!   threshold, `B` the burst, `c` the cost;
//! - `commit == false` evaluates without consuming (a peek, or the first
//!   phase of an all-or-nothing decision): `remaining` is then what is left
//!   now, and `allowed` says whether `c` units would fit;
//! - a refused call changes nothing that matters (only trimming of entries
//!   that have already expired);
//! - every state knows the time at which it becomes equivalent to "no
//!   state" ([`State::expires_at`]), which is the TTL the Redis scripts set;
//!   from then on it decides exactly as a fresh one.
//!
//! Reservations (waiting calls, GCRA and the buckets only): a call that
//! cannot pass now is committed as of a later time, its slot (`decide` with
//! that time). The state then describes the queue up to that slot; read at
//! an earlier time it is the more occupied (the TAT is later still; the
//! meter's level is higher by the drain still to come), so every later
//! decision, waiting or not, sees the reserved slots as taken.

mod fixed_window;
mod gcra;
mod in_flight;
mod meter;
mod sliding_log;
mod sliding_window;

pub(crate) use fixed_window::Window;
pub(crate) use gcra::Tat;
pub(crate) use in_flight::Flight;
#[cfg_attr(
    not(test),
    allow(unused_imports, reason = "the hint is named by tests")
)]
pub(crate) use in_flight::RETRY_HINT_US;
pub(crate) use meter::Meter;
pub(crate) use sliding_log::Log;
pub(crate) use sliding_window::Slots;

use crate::model::decision::Decision;
use crate::model::limit::Limit;

/// The most a charge leaves a state holding, in its own measure (µs ahead
/// for GCRA, scaled units for the buckets, units for a fixed window, units
/// × period for a sliding window's slot): `2^52`, where every integer an
/// algorithm computes stays exact in a double (Lua's numbers), as the limits
/// themselves do ([`ratewall_grammar::MAX_CAPACITY_PERIOD`]). Debt past it
/// lapses; no estimate off by less than centuries of quota reaches it.
pub(crate) const DEBT_CAP: u64 = ratewall_grammar::MAX_CAPACITY_PERIOD;

/// The state of one identity under one limit, and what can be done with it.
pub(crate) trait State: Default + std::fmt::Debug + Send + 'static {
    /// Decides a call of `cost` units at `now`; consumes them when allowed
    /// and `commit`.
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision;

    /// [`State::decide`] with `commit`, for a caller that uses no figure of
    /// an admission (`#[rate_limit]` without headers): `Ok` when admitted,
    /// the refusal otherwise. Leaves the state exactly as `decide` does; an
    /// algorithm may skip the admission's figures.
    #[inline]
    fn admit(&mut self, limit: &Limit, now: u64, cost: u64) -> Result<(), Decision> {
        let decision = self.decide(limit, now, cost, true);
        if decision.allowed() {
            Ok(())
        } else {
            Err(decision)
        }
    }

    /// Gives back `cost` units taken by a decision made at `at`.
    fn refund(&mut self, limit: &Limit, now: u64, cost: u64, at: u64);

    /// Takes `units` more at `now` whatever the limit says: the part of a
    /// call's actual cost above the estimate it was admitted with (its
    /// settled cost). What goes past the limit is debt that later calls pay:
    /// the windows count past `T` in the current window or slot (refusing
    /// until it has passed), GCRA moves its TAT and the buckets their level
    /// past the tolerance (refusing until the rate has drained it), the
    /// sliding log adds entries at `now` (at most `T` at one time and `2T`
    /// in all: more at one time could not refuse
    /// anything `T` do not). Debt is kept up to [`DEBT_CAP`]. In-flight
    /// limits have no cost to settle.
    fn charge(&mut self, limit: &Limit, now: u64, units: u64);

    /// Raises the state so that at most `left` units remain `after` µs from
    /// now (what an upstream's own word asks: `Retry-After` is `left = 0`
    /// after the wait, a `remaining` header is `left` now). A state already
    /// that full is left as it is; what it decides never loosens.
    ///
    /// A pause (`left = 0`, `after > 0`) holds every algorithm exactly,
    /// whatever windows or slots it spans: no call passes before
    /// `now + after`. GCRA and the buckets raise their TAT or level as of
    /// `now` by what drains until then (so they refuse at `now + after`
    /// too, and resume at their rate 1 µs later); the fixed and sliding
    /// windows keep the pause's end as a time of their own and refuse
    /// until it, then decide on their counts as before; the sliding log
    /// writes the pause as entries that leave at its end. A count
    /// (`left > 0`) is held by the window algorithms now, in the current
    /// window or slot (the sliding log: entries at `now`), `after` not
    /// held with it. Debt and `after` are kept up to [`DEBT_CAP`].
    fn hold(&mut self, limit: &Limit, now: u64, after: u64, left: u64);

    /// Gives back `units` unused units of a lease taken at `at` that left
    /// the state expiring at `stamp` ([`crate::backend::Leased::stamp`]), only where
    /// giving them back cannot let a later call pass outside the
    /// algorithm's bound: the window algorithms count per window or slot,
    /// so they refund as [`State::refund`] does (in the lease's window or
    /// slot only); GCRA and the meters give units back only while the
    /// state is the one the lease left (nothing written since), where the
    /// unused units are exactly the last ones scheduled. Otherwise the
    /// units stay taken and lapse as time passes them.
    fn release(&mut self, limit: &Limit, now: u64, units: u64, at: u64, stamp: u64) {
        let _ = stamp;
        self.refund(limit, now, units, at);
    }

    /// Takes back a reservation of `cost` units committed as of `at` (a
    /// waiting call's slot, possibly later than `now`) whose decision left
    /// the state at `mark` (the decision's `at + reset_after`), if the state
    /// is still exactly what it left: the reservation is then the last one
    /// made, and the state goes back to what it was before it. `false` when
    /// a later write changed the state (the caller then records the slot as
    /// given back instead). Only the algorithms that reserve (GCRA, token
    /// and leaky bucket) implement it.
    fn unreserve(&mut self, limit: &Limit, now: u64, at: u64, mark: u64, cost: u64) -> bool {
        let _ = (limit, now, at, mark, cost);
        false
    }

    /// From when the state is equivalent to a fresh one (0: already fresh).
    fn expires_at(&self) -> u64;

    /// Whether the state is equivalent to a fresh one at `now`.
    fn is_idle(&self, now: u64) -> bool {
        self.expires_at() <= now
    }
}

#[cfg(test)]
mod tests;
