//! Fixed window: `w = floor(now / P)`; refuse if `count + c > T`.
//!
//! - `reset_after = retry_after (when refused) = P - now mod P` (the window's end);
//!   `reset_after = 0` when nothing is counted in the current window.
//! - expires at the window's end.

use super::{DEBT_CAP, State};
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// The count of the window ending at `end` (µs); a count of 0, or a window
/// that has ended, is a fresh state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Window {
    end: u64,
    count: u64,
}

impl State for Window {
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        let (t, p) = (limit.threshold(), limit.period_micros());
        let end = (now / p + 1) * p;
        let window_end_in = end - now;
        let count = if self.end == end { self.count } else { 0 };
        if count + cost > t {
            return Decision::new(Figures {
                allowed: false,
                limit: t,
                remaining: t.saturating_sub(count),
                retry_after_us: window_end_in,
                reset_after_us: window_end_in,
                at_micros: now,
            });
        }
        let count = if commit {
            self.end = end;
            self.count = count + cost;
            self.count
        } else {
            count
        };
        Decision::new(Figures {
            allowed: true,
            limit: t,
            remaining: t - count,
            retry_after_us: 0,
            reset_after_us: if count > 0 { window_end_in } else { 0 },
            at_micros: now,
        })
    }

    fn refund(&mut self, limit: &Limit, now: u64, cost: u64, at: u64) {
        let p = limit.period_micros();
        if now < self.end && self.end == (at / p + 1) * p {
            self.count = self.count.saturating_sub(cost);
        }
    }

    fn charge(&mut self, limit: &Limit, now: u64, units: u64) {
        if units == 0 {
            return;
        }
        let p = limit.period_micros();
        let end = (now / p + 1) * p;
        let count = if self.end == end { self.count } else { 0 };
        self.end = end;
        self.count = count.saturating_add(units).min(DEBT_CAP);
    }

    fn hold(&mut self, limit: &Limit, now: u64, _after: u64, left: u64) {
        let (t, p) = (limit.threshold(), limit.period_micros());
        let end = (now / p + 1) * p;
        let count = if self.end == end { self.count } else { 0 };
        if left >= t || count >= t - left {
            return;
        }
        self.end = end;
        self.count = t - left;
    }

    fn expires_at(&self) -> u64 {
        if self.count > 0 { self.end } else { 0 }
    }
}
