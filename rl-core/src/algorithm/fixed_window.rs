//! Fixed window: `w = floor(now / P)`; refuse if `count + c > T`.
//!
//! - `reset_after = retry_after (when refused) = P - now mod P` (the window's end);
//!   `reset_after = 0` when nothing is counted in the current window.
//! - expires at the window's end.
//!
//! A pause (an upstream's `Retry-After`: [`State::hold`] with `left = 0`)
//! is a time of its own, `held`: every call before it is refused
//! (`remaining = 0`), whatever the windows it spans; from `held` on the
//! window's count decides as before. Refused in a pause, `retry_after` is
//! `held - now`, or the end of the window `held` falls in if that window's
//! count leaves no room for the cost then; `reset_after` is `held - now`,
//! or that window's end if it counts anything. The state expires at the
//! later of `held` and the window's end.

use super::{DEBT_CAP, State};
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// The count of the window ending at `end` (µs), and the end of a pause
/// (`held`, µs; 0: none); a count of 0, or a window that has ended, past
/// the pause's end, is a fresh state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Window {
    end: u64,
    count: u64,
    held: u64,
}

impl Window {
    /// The refusal of a call of `cost` at `now`, before the pause's end.
    fn paused(&self, limit: &Limit, now: u64, cost: u64) -> Decision {
        let (t, p) = (limit.threshold(), limit.period_micros());
        let held = self.held;
        // The window the pause ends in counts what it counts now, if it is
        // the window stored (no later one has been written).
        let held_end = (held / p + 1) * p;
        let counted = if self.end == held_end { self.count } else { 0 };
        let (retry, full) = match counted {
            0 => (held, held),
            n if n + cost > t => (held_end, held_end),
            _ => (held, held_end),
        };
        Decision::new(Figures {
            allowed: false,
            limit: t,
            remaining: 0,
            retry_after_us: retry - now,
            reset_after_us: full - now,
            at_micros: now,
        })
    }
}

impl State for Window {
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        if now < self.held {
            return self.paused(limit, now, cost);
        }
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

    /// A pause (`left = 0`, `after > 0`) refuses every call until
    /// `now + after` (`after` kept to [`DEBT_CAP`]); a count goes into the
    /// current window (`after` is not held with it).
    fn hold(&mut self, limit: &Limit, now: u64, after: u64, left: u64) {
        let (t, p) = (limit.threshold(), limit.period_micros());
        if left >= t {
            return;
        }
        if after > 0 && left == 0 {
            self.held = self.held.max(now + after.min(DEBT_CAP));
            return;
        }
        let end = (now / p + 1) * p;
        let count = if self.end == end { self.count } else { 0 };
        if count >= t - left {
            return;
        }
        self.end = end;
        self.count = t - left;
    }

    fn expires_at(&self) -> u64 {
        let counted = if self.count > 0 { self.end } else { 0 };
        counted.max(self.held)
    }
}
