//! GCRA: one theoretical arrival time (TAT) per identity.
//!
//! `I = ceil(P / T)` µs (rounded up: never faster than configured),
//! `τ = I·B`, `tat = max(stored, now)`, `new_tat = tat + c·I`.
//! Allowed iff `new_tat <= now + τ`; then store `new_tat`, expiring at
//! `new_tat`; `remaining = floor((now + τ - new_tat) / I)`,
//! `reset_after = new_tat - now`.
//! Refused: `retry_after = new_tat - τ - now`, nothing stored,
//! `remaining = floor((now + τ - tat) / I)`, `reset_after = tat - now`.
//!
//! A reservation at slot `s` (a waiting call) stores `max(tat, s) + c·I`;
//! taking back the last one made stores `tat - c·I` again.
//!
//! The state remembers the interval it was measured in and when it was
//! written. Under a limit whose interval differs (changed at run time) the
//! time the last write left ahead is converted, `tat' = w + ceil((tat - w)
//! · I_new / I_old)` (in `f64`, exactly as the Lua script computes it): the
//! calls made still count, as units of the new limit, draining at the new
//! rate from the last write, until the expiry that write set (a state never
//! outlives its key). The conversion depends on the state alone, so
//! `retry_after` stays exact. The time converted is kept to [`DEBT_CAP`]
//! (only debt reaches it).

use super::{DEBT_CAP, State};
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// The TAT (any value `<= now`, 0 included, is a fresh state), the
/// emission interval it was measured in, and when it was written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tat {
    tat: u64,
    interval: u64,
    written: u64,
}

impl Tat {
    /// The TAT measured in `interval` (see the module docs), or the stored
    /// one when it is fresh at `now` or measured in `interval` already.
    #[inline]
    fn measured_in(&self, interval: u64, now: u64) -> u64 {
        if self.interval == interval || self.tat <= now || self.tat <= self.written {
            return self.tat;
        }
        let ahead = (self.tat - self.written) as f64 * interval as f64 / self.interval as f64;
        // Debt converted to a longer interval stays within the cap (and
        // exact in Lua's doubles).
        self.written + (ahead.ceil() as u64).min(DEBT_CAP)
    }

    /// Where a call of `cost` at `now` would move the TAT.
    #[inline]
    fn step(&self, limit: &Limit, now: u64, cost: u64) -> Step {
        let interval = limit.emission_interval_micros();
        let tat = self.measured_in(interval, now).max(now);
        Step {
            interval,
            burst: limit.burst(),
            tat,
            new_tat: tat + cost * interval,
        }
    }

    /// Takes the call `step` fits, written at `now`.
    #[inline]
    fn take(&mut self, step: &Step, now: u64) {
        *self = Tat {
            tat: step.new_tat,
            interval: step.interval,
            written: now,
        };
    }
}

/// A call: the limit's interval and burst, the TAT as of now, and the TAT
/// the call would move it to.
struct Step {
    interval: u64,
    burst: u64,
    tat: u64,
    new_tat: u64,
}

impl Step {
    /// `τ`, the tolerance.
    #[inline]
    fn tau(&self) -> u64 {
        self.interval * self.burst
    }

    /// Whether the call fits the limit at `now`.
    #[inline]
    fn fits(&self, now: u64) -> bool {
        self.new_tat <= now + self.tau()
    }

    /// The call's refusal at `now` (nothing taken).
    #[inline]
    fn refusal(&self, now: u64) -> Decision {
        let tau = self.tau();
        Decision::new(Figures {
            allowed: false,
            limit: self.burst,
            remaining: (now + tau).saturating_sub(self.tat) / self.interval,
            retry_after_us: self.new_tat - tau - now,
            reset_after_us: self.tat - now,
            at_micros: now,
        })
    }
}

impl State for Tat {
    #[inline]
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        let step = self.step(limit, now, cost);
        if !step.fits(now) {
            return step.refusal(now);
        }
        let kept = if commit {
            self.take(&step, now);
            step.new_tat
        } else {
            step.tat
        };
        Decision::new(Figures {
            allowed: true,
            limit: step.burst,
            remaining: (now + step.tau() - kept) / step.interval,
            retry_after_us: 0,
            reset_after_us: kept - now,
            at_micros: now,
        })
    }

    #[inline]
    fn admit(&mut self, limit: &Limit, now: u64, cost: u64) -> Result<(), Decision> {
        let step = self.step(limit, now, cost);
        if !step.fits(now) {
            return Err(step.refusal(now));
        }
        self.take(&step, now);
        Ok(())
    }

    fn refund(&mut self, limit: &Limit, now: u64, cost: u64, _at: u64) {
        let interval = limit.emission_interval_micros();
        let back = self
            .measured_in(interval, now)
            .saturating_sub(cost.saturating_mul(interval));
        *self = if back <= now {
            Tat::default()
        } else {
            Tat {
                tat: back,
                interval,
                written: now,
            }
        };
    }

    fn charge(&mut self, limit: &Limit, now: u64, units: u64) {
        if units == 0 {
            return;
        }
        let interval = limit.emission_interval_micros();
        let ahead = self.measured_in(interval, now).max(now) - now;
        let ahead = ahead
            .saturating_add(units.saturating_mul(interval))
            .min(DEBT_CAP);
        *self = Tat {
            tat: now + ahead,
            interval,
            written: now,
        };
    }

    fn hold(&mut self, limit: &Limit, now: u64, after: u64, left: u64) {
        let interval = limit.emission_interval_micros();
        let tau = interval * limit.burst();
        // remaining(t) = floor((t + τ - tat) / I) <= left  <=>
        // tat - now >= after + τ + 1 - (left + 1)·I, at t = now + after
        // (`after` kept where the sum stays within the cap).
        let needed = (after.min(DEBT_CAP.saturating_sub(tau)) + tau + 1)
            .saturating_sub(left.saturating_add(1).saturating_mul(interval));
        let ahead = self.measured_in(interval, now).max(now) - now;
        if needed <= ahead {
            return;
        }
        *self = Tat {
            tat: now + needed.min(DEBT_CAP),
            interval,
            written: now,
        };
    }

    fn release(&mut self, limit: &Limit, now: u64, units: u64, at: u64, stamp: u64) {
        if self.tat == stamp {
            self.refund(limit, now, units, at);
        }
    }

    fn unreserve(&mut self, limit: &Limit, now: u64, _at: u64, mark: u64, cost: u64) -> bool {
        if self.tat != mark {
            return false;
        }
        let back = self
            .tat
            .saturating_sub(cost.saturating_mul(limit.emission_interval_micros()));
        self.tat = if back <= now { 0 } else { back };
        true
    }

    fn expires_at(&self) -> u64 {
        self.tat
    }
}
