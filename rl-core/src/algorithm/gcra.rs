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

use super::State;
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// The TAT; any value `<= now` (0 included) is a fresh state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tat(pub(crate) u64);

impl State for Tat {
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        let interval = limit.emission_interval_micros();
        let burst = limit.burst();
        let tau = interval * burst;
        let tat = self.0.max(now);
        let new_tat = tat + cost * interval;
        if new_tat > now + tau {
            return Decision::new(Figures {
                allowed: false,
                limit: burst,
                remaining: (now + tau).saturating_sub(tat) / interval,
                retry_after_us: new_tat - tau - now,
                reset_after_us: tat - now,
                at_micros: now,
            });
        }
        let kept = if commit {
            self.0 = new_tat;
            new_tat
        } else {
            tat
        };
        Decision::new(Figures {
            allowed: true,
            limit: burst,
            remaining: (now + tau - kept) / interval,
            retry_after_us: 0,
            reset_after_us: kept - now,
            at_micros: now,
        })
    }

    fn refund(&mut self, limit: &Limit, now: u64, cost: u64, _at: u64) {
        if self.0 > now {
            let back = self
                .0
                .saturating_sub(cost.saturating_mul(limit.emission_interval_micros()));
            self.0 = if back <= now { 0 } else { back };
        } else {
            self.0 = 0;
        }
    }

    fn release(&mut self, limit: &Limit, now: u64, units: u64, at: u64, stamp: u64) {
        if self.0 == stamp {
            self.refund(limit, now, units, at);
        }
    }

    fn unreserve(&mut self, limit: &Limit, now: u64, _at: u64, mark: u64, cost: u64) -> bool {
        if self.0 != mark {
            return false;
        }
        let back = self
            .0
            .saturating_sub(cost.saturating_mul(limit.emission_interval_micros()));
        self.0 = if back <= now { 0 } else { back };
        true
    }

    fn expires_at(&self) -> u64 {
        self.0
    }
}
