//! Sliding-window counter: `N` slots of `S = P / N`; the slot index is
//! `s = floor(now / S)`, `r = now mod S`.
//!
//! The estimate, scaled by `S` to stay an integer, is
//! `est = S · Σ count[s-N+1 ..= s] + (S - r) · count[s-N]`: the full slots
//! inside the window plus the oldest slot weighted by the part of it still
//! inside. Refuse if `est + c·S > T·S`. Slots older than `s - N` are dropped.
//!
//! - refused: `retry_after` is the first µs at which the estimate has decayed
//!   enough, found by walking at most `N + 1` slot boundaries;
//! - `reset_after = (m + N + 1)·S - now` for the newest non-empty slot `m`;
//! - expires at `(m + N + 1)·S`.
//!
//! Worst-case over-admission: the estimate assumes the oldest slot's calls
//! were spread evenly over it. If they all came at its very end, up to
//! `T + count(oldest slot) < 2T` units pass in some window of length `P`.
//! With traffic spread over the slot, the error stays within `T / N`.
//!
//! A pause (an upstream's `Retry-After`: [`State::hold`] with `left = 0`)
//! is a time of its own, `held`: every call before it is refused
//! (`remaining = 0`), however many slots or windows it spans; from `held`
//! on the slots decide as before. Refused in a pause, `retry_after` is the
//! first µs from `held` on at which the estimate has room (the walk above,
//! from `held`); `reset_after` the later of `held` and the slots' reset.
//! The state expires at the later of `held` and the slots' expiry.

use std::collections::VecDeque;

use super::{DEBT_CAP, State};
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// `(slot index, count)`, oldest first, when the newest non-empty slot
/// stops counting, and the end of a pause (0: none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Slots {
    slots: VecDeque<(u64, u64)>,
    expires: u64,
    held: u64,
}

fn count_at(slots: &VecDeque<(u64, u64)>, index: u64) -> u64 {
    slots
        .iter()
        .find(|(i, _)| *i == index)
        .map_or(0, |(_, c)| *c)
}

fn sum_between(slots: &VecDeque<(u64, u64)>, from: u64, to: u64) -> u64 {
    slots
        .iter()
        .filter(|(i, _)| *i >= from && *i <= to)
        .map(|(_, c)| *c)
        .sum()
}

/// The scaled estimate at time `at`, whose slot is `s_at`.
fn estimate(slots: &VecDeque<(u64, u64)>, n: u64, size: u64, at: u64) -> u64 {
    let s_at = at / size;
    let full = sum_between(slots, (s_at + 1).saturating_sub(n), s_at);
    let old = if s_at >= n {
        count_at(slots, s_at - n)
    } else {
        0
    };
    size * full + ((s_at + 1) * size - at) * old
}

impl Slots {
    /// Forgets an expired state and the slots that left the window at
    /// `now`; answers the current slot's index.
    fn prune(&mut self, limit: &Limit, now: u64) -> u64 {
        let n = limit.slots();
        let s = now / (limit.period_micros() / n);
        if self.expires <= now {
            self.slots.clear();
        }
        while self.slots.front().is_some_and(|(i, _)| *i + n < s) {
            self.slots.pop_front();
        }
        s
    }

    /// Adds `units` to slot `slot` (a live one: the current slot or an
    /// older one still in the window) whatever the limit says, a slot's
    /// count at most `DEBT_CAP / P`, and moves the expiry with the newest
    /// slot.
    fn add(&mut self, limit: &Limit, slot: u64, units: u64) {
        let n = limit.slots();
        let size = limit.period_micros() / n;
        let cap = DEBT_CAP / limit.period_micros();
        let slots = &mut self.slots;
        match slots.iter().position(|(i, _)| *i >= slot) {
            Some(p) if slots[p].0 == slot => slots[p].1 = slots[p].1.saturating_add(units).min(cap),
            Some(p) => slots.insert(p, (slot, units.min(cap))),
            None => slots.push_back((slot, units.min(cap))),
        }
        let newest = slots.iter().filter(|(_, c)| *c > 0).map(|(i, _)| *i).max();
        self.expires = (newest.unwrap_or(slot) + n + 1) * size;
    }
}

impl State for Slots {
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        let (t, n) = (limit.threshold(), limit.slots());
        let size = limit.period_micros() / n;
        let s = now / size;
        let slots = &mut self.slots;
        if self.expires <= now {
            slots.clear();
        }
        while slots.front().is_some_and(|(i, _)| *i + n < s) {
            slots.pop_front();
        }
        let est = estimate(slots, n, size, now);
        let capacity = t * size;
        let decision = if now < self.held {
            // Paused: room comes back at the pause's end at the earliest.
            let held = self.held;
            let target = capacity - cost * size;
            Decision::new(Figures {
                allowed: false,
                limit: t,
                remaining: 0,
                retry_after_us: held - now + retry_after(slots, n, size, held, target),
                reset_after_us: reset_after(slots, n, size, now).max(held - now),
                at_micros: now,
            })
        } else if est + cost * size > capacity {
            let target = capacity - cost * size;
            Decision::new(Figures {
                allowed: false,
                limit: t,
                remaining: capacity.saturating_sub(est) / size,
                retry_after_us: retry_after(slots, n, size, now, target),
                reset_after_us: reset_after(slots, n, size, now),
                at_micros: now,
            })
        } else {
            let est = if commit {
                match slots.back_mut() {
                    Some((i, c)) if *i == s => *c += cost,
                    _ => slots.push_back((s, cost)),
                }
                est + cost * size
            } else {
                est
            };
            Decision::new(Figures {
                allowed: true,
                limit: t,
                remaining: (capacity - est) / size,
                retry_after_us: 0,
                reset_after_us: reset_after(slots, n, size, now),
                at_micros: now,
            })
        };
        self.expires = match slots.iter().rev().find(|(_, c)| *c > 0) {
            Some(&(newest, _)) => (newest + n + 1) * size,
            None => {
                slots.clear();
                0
            }
        };
        decision
    }

    fn refund(&mut self, limit: &Limit, now: u64, cost: u64, at: u64) {
        if self.is_idle(now) {
            *self = Slots::default();
            return;
        }
        let size = limit.period_micros() / limit.slots();
        if let Some((_, c)) = self.slots.iter_mut().find(|(i, _)| *i == at / size) {
            *c = c.saturating_sub(cost);
        }
    }

    fn charge(&mut self, limit: &Limit, now: u64, units: u64) {
        if units == 0 {
            return;
        }
        let s = self.prune(limit, now);
        self.add(limit, s, units);
    }

    /// A pause (`left = 0`, `after > 0`) refuses every call until
    /// `now + after` (`after` kept to [`DEBT_CAP`]); a count goes into the
    /// current slot, as a charge (`after` is not held with it).
    fn hold(&mut self, limit: &Limit, now: u64, after: u64, left: u64) {
        let (t, n) = (limit.threshold(), limit.slots());
        let size = limit.period_micros() / n;
        if left >= t {
            return;
        }
        if after > 0 && left == 0 {
            self.held = self.held.max(now + after.min(DEBT_CAP));
            return;
        }
        let s = self.prune(limit, now);
        // remaining = floor((T·S - est) / S) <= left  <=>  est > (T - left - 1)·S.
        let floor = (t - left - 1) * size + 1;
        let est = estimate(&self.slots, n, size, now);
        if est < floor {
            self.add(limit, s, (floor - est).div_ceil(size));
        }
    }

    fn expires_at(&self) -> u64 {
        self.expires.max(self.held)
    }
}

fn reset_after(slots: &VecDeque<(u64, u64)>, n: u64, size: u64, now: u64) -> u64 {
    slots
        .iter()
        .rev()
        .find(|(_, c)| *c > 0)
        .map_or(0, |(newest, _)| {
            ((newest + n + 1) * size).saturating_sub(now)
        })
}

/// First time `>= now` at which `estimate <= target`, minus `now`.
fn retry_after(slots: &VecDeque<(u64, u64)>, n: u64, size: u64, now: u64, target: u64) -> u64 {
    let s = now / size;
    for j in 0..=n {
        let start = if j == 0 { now } else { (s + j) * size };
        let end = (s + j + 1) * size;
        let est = estimate(slots, n, size, start);
        if est <= target {
            return start - now;
        }
        let old_index = s + j;
        let old = if old_index >= n {
            count_at(slots, old_index - n)
        } else {
            0
        };
        if old > 0 {
            let wait = (est - target).div_ceil(old);
            if start + wait <= end {
                return start + wait - now;
            }
        }
    }
    // Unreachable for cost <= threshold: after N + 1 slots every count has left.
    (s + n + 1) * size - now
}
