//! Token bucket and leaky bucket: a meter scaled by `P` so that refill and
//! drain stay exact integers (`T` scaled units per µs; one unit is `P` scaled
//! units). Capacity `B·P`. The state is the level (what is in use), for
//! both: a token bucket's tokens are `B·P - level`.
//!
//! Token bucket: `tokens = min(B·P, tokens + elapsed·T)` (fresh: full);
//! allowed iff `tokens >= c·P`; `remaining = floor(tokens / P)`;
//! refused: `retry_after = ceil((c·P - tokens) / T)`;
//! `reset_after = ceil((B·P - tokens) / T)`.
//!
//! Leaky bucket: `level = max(0, level - elapsed·T)` (fresh: empty);
//! allowed iff `level + c·P <= B·P`; `remaining = floor((B·P - level) / P)`;
//! refused: `retry_after = ceil((level + c·P - B·P) / T)`;
//! `reset_after = ceil(level / T)`.
//!
//! Both expire `reset_after` after the last write, when the meter is back to
//! its fresh value. A reservation (a waiting call) writes the meter as of
//! its slot, later than now; read before that time the level is higher by
//! the drain still to come (`level + (updated - now)·T`), so the reserved
//! slots count as taken. Taking back the last reservation made removes its
//! `c·P` as of its slot. With `level = B·P - tokens` the two are the same meter
//! seen from either side; both are kept because users ask for them by name.
//!
//! A limit changed at run time (its period is the key's, so a new threshold
//! or burst) reads the same level: the units in use still count, as units
//! of the new limit, draining at the new rate from the last write, until
//! the expiry that write set (a state never outlives its key).

use super::{DEBT_CAP, State};
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// A token or leaky bucket: the scaled level (units in use × P) at
/// `updated`, and when it is back to its fresh value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Meter {
    scaled: u64,
    updated: u64,
    expires: u64,
}

impl Meter {
    /// The level (units in use × P) at `now`: drained since the last
    /// update, or, before a reservation written as of a later time, higher
    /// by the drain still to come until then.
    fn level(&self, limit: &Limit, now: u64) -> u64 {
        if self.expires <= now {
            return 0;
        }
        let (t, at_update) = (limit.threshold(), self.scaled);
        if now >= self.updated {
            at_update.saturating_sub((now - self.updated).saturating_mul(t))
        } else {
            at_update.saturating_add((self.updated - now).saturating_mul(t))
        }
    }

    fn store(&mut self, limit: &Limit, now: u64, level: u64) {
        if level == 0 {
            *self = Meter::default();
            return;
        }
        self.scaled = level;
        self.updated = now;
        self.expires = now + level.div_ceil(limit.threshold());
    }
}

impl State for Meter {
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        let (t, p, b) = (limit.threshold(), limit.period_micros(), limit.burst());
        let full = b * p;
        let level = self.level(limit, now);
        let need = cost * p;
        if level + need > full {
            return Decision::new(Figures {
                allowed: false,
                limit: b,
                remaining: full.saturating_sub(level) / p,
                retry_after_us: (level + need - full).div_ceil(t),
                reset_after_us: level.div_ceil(t),
                at_micros: now,
            });
        }
        let level = if commit {
            self.store(limit, now, level + need);
            level + need
        } else {
            level
        };
        Decision::new(Figures {
            allowed: true,
            limit: b,
            remaining: (full - level) / p,
            retry_after_us: 0,
            reset_after_us: level.div_ceil(t),
            at_micros: now,
        })
    }

    fn refund(&mut self, limit: &Limit, now: u64, cost: u64, _at: u64) {
        if self.is_idle(now) {
            *self = Meter::default();
            return;
        }
        let level = self
            .level(limit, now)
            .saturating_sub(cost.saturating_mul(limit.period_micros()));
        self.store(limit, now, level);
    }

    fn charge(&mut self, limit: &Limit, now: u64, units: u64) {
        if units == 0 {
            return;
        }
        let level = self
            .level(limit, now)
            .saturating_add(units.saturating_mul(limit.period_micros()))
            .min(DEBT_CAP);
        self.store(limit, now, level);
    }

    fn hold(&mut self, limit: &Limit, now: u64, after: u64, left: u64) {
        let (t, p, b) = (limit.threshold(), limit.period_micros(), limit.burst());
        if left >= b {
            return;
        }
        // remaining(t) = floor((B·P - level(t)) / P) <= left  <=>
        // level(t) >= B·P - (left + 1)·P + 1, and level(now) drains
        // `after`·T until then.
        let at_then = (b - left - 1) * p + 1;
        let now_level = at_then
            .saturating_add(after.saturating_mul(t))
            .min(DEBT_CAP);
        if self.level(limit, now) >= now_level {
            return;
        }
        self.store(limit, now, now_level);
    }

    fn release(&mut self, limit: &Limit, now: u64, units: u64, at: u64, stamp: u64) {
        if self.updated == at && self.expires == stamp && !self.is_idle(now) {
            self.refund(limit, now, units, at);
        }
    }

    fn unreserve(&mut self, limit: &Limit, now: u64, at: u64, mark: u64, cost: u64) -> bool {
        if self.updated != at || self.expires != mark {
            return false;
        }
        let level = self
            .level(limit, at)
            .saturating_sub(cost.saturating_mul(limit.period_micros()));
        if level == 0 && at > now {
            // Empty as of `at`, still draining until then: the state the
            // queue had before this reservation.
            self.scaled = 0;
            self.expires = at;
            return true;
        }
        self.store(limit, at, level);
        if self.expires <= now {
            *self = Meter::default();
        }
        true
    }

    fn expires_at(&self) -> u64 {
        self.expires
    }
}
