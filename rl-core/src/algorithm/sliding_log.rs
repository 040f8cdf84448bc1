//! Sliding log: one entry per admitted unit; entries with `t + P <= now` are
//! gone. Refuse if `n + c > T`.
//!
//! - refused: `retry_after = t_k + P - now` where `t_k` is the k-th oldest
//!   entry, `k = n + c - T` (the entry whose leaving makes room for `c`);
//! - `reset_after = newest + P - now` (0 with no entries);
//! - expires when the newest entry leaves: `newest + P`.
//!
//! An entry at `x` counts while `x + P > now`, an entry in the future
//! included. A pause until `until` (an upstream's `Retry-After`:
//! [`State::hold`] with `left = 0`) is written as entries: the entries that
//! leave before `until` are dropped (the pause refuses everything they
//! could), then `min(T, 2T - k)` entries at `until - P` join the `k` left,
//! so that at least `T` count until `until` exactly, for a pause of any
//! length (entries later than now exist only during a pause longer than
//! `P`). `T` of the pause's own (`T - k` would do) keep it whole when the
//! calls among the `k` are refunded; the decisions are the same either
//! way. A refusal's `retry_after` comes out as `until - now` (or later,
//! should the entries left keep the log full longer). The log holds at
//! most `2T` entries. (With `until < P`, only possible for a period longer
//! than the time since the epoch, the entries go at 0 and the pause lasts
//! until `P`.)

use std::collections::VecDeque;

use super::{DEBT_CAP, State};
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// Admission times, oldest first, one per unit, and when the newest leaves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Log {
    entries: VecDeque<u64>,
    expires: u64,
}

/// Adds `count` entries at `at`, the log kept sorted: appended, unless
/// entries later than `at` are held (a pause longer than the period).
fn insert(log: &mut VecDeque<u64>, at: u64, count: usize) {
    let later = log.iter().rev().take_while(|&&entry| entry > at).count();
    log.extend(std::iter::repeat_n(at, count));
    if later > 0 {
        let len = log.len();
        log.make_contiguous()[len - count - later..].rotate_right(count);
    }
}

#[cfg(test)]
impl Log {
    /// The entries held (live or not yet trimmed).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

impl State for Log {
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        let (t, p) = (limit.threshold(), limit.period_micros());
        let log = &mut self.entries;
        while log.front().is_some_and(|&oldest| oldest + p <= now) {
            log.pop_front();
        }
        let n = log.len() as u64;
        let reset_of = |log: &VecDeque<u64>| log.back().map_or(0, |&newest| newest + p - now);
        if n + cost > t {
            let k = (n + cost - t) as usize;
            return Decision::new(Figures {
                allowed: false,
                limit: t,
                remaining: t.saturating_sub(n),
                retry_after_us: log.get(k - 1).map_or(p, |&entry| entry + p - now),
                reset_after_us: reset_of(log),
                at_micros: now,
            });
        }
        let n = if commit {
            insert(log, now, cost as usize);
            self.expires = self.expires.max(now + p);
            n + cost
        } else {
            n
        };
        if log.is_empty() {
            self.expires = 0;
        }
        Decision::new(Figures {
            allowed: true,
            limit: t,
            remaining: t - n,
            retry_after_us: 0,
            reset_after_us: reset_of(log),
            at_micros: now,
        })
    }

    fn refund(&mut self, _limit: &Limit, now: u64, cost: u64, at: u64) {
        if self.is_idle(now) {
            *self = Log::default();
            return;
        }
        let mut left = cost;
        self.entries.retain(|&entry| {
            if left > 0 && entry == at {
                left -= 1;
                false
            } else {
                true
            }
        });
    }

    fn charge(&mut self, limit: &Limit, now: u64, units: u64) {
        let (t, p) = (limit.threshold(), limit.period_micros());
        if self.is_idle(now) {
            *self = Log::default();
        }
        let log = &mut self.entries;
        while log.front().is_some_and(|&oldest| oldest + p <= now) {
            log.pop_front();
        }
        // Entries of one time leave together: past `T` of them at `now`,
        // more could refuse nothing more; and the log holds at most `2T`.
        let at_now = log.iter().filter(|&&entry| entry == now).count() as u64;
        let live = log.len() as u64;
        let add = units
            .min(t.saturating_sub(at_now))
            .min((2 * t).saturating_sub(live));
        if add > 0 {
            insert(log, now, add as usize);
            self.expires = self.expires.max(now + p);
        }
    }

    /// A pause (`left = 0`, `after > 0`, `after` kept to [`DEBT_CAP`]) is
    /// written as entries leaving when it ends (see the module); a count
    /// adds entries at `now` (`after` is not held with it).
    fn hold(&mut self, limit: &Limit, now: u64, after: u64, left: u64) {
        let (t, p) = (limit.threshold(), limit.period_micros());
        if self.is_idle(now) {
            *self = Log::default();
        }
        let log = &mut self.entries;
        while log.front().is_some_and(|&oldest| oldest + p <= now) {
            log.pop_front();
        }
        if left >= t {
            return;
        }
        if after > 0 && left == 0 {
            let until = now + after.min(DEBT_CAP);
            let at = until.saturating_sub(p);
            // Sorted: the rest are at `at` or later.
            while log.front().is_some_and(|&oldest| oldest < at) {
                log.pop_front();
            }
            let add = t.min((2 * t).saturating_sub(log.len() as u64));
            if add == 0 {
                return;
            }
            for _ in 0..add {
                log.push_front(at);
            }
            self.expires = self.expires.max(at + p);
            return;
        }
        let n = log.len() as u64;
        if n >= t - left {
            return;
        }
        insert(log, now, (t - left - n) as usize);
        self.expires = self.expires.max(now + p);
    }

    fn expires_at(&self) -> u64 {
        self.expires
    }
}
