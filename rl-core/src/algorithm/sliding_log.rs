//! Sliding log: one entry per admitted unit; entries with `t + P <= now` are
//! gone. Refuse if `n + c > T`.
//!
//! - refused: `retry_after = t_k + P - now` where `t_k` is the k-th oldest
//!   entry, `k = n + c - T` (the entry whose leaving makes room for `c`);
//! - `reset_after = newest + P - now` (0 with no entries);
//! - expires when the newest entry leaves: `newest + P`.

use std::collections::VecDeque;

use super::State;
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// Admission times, oldest first, one per unit, and when the newest leaves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Log {
    entries: VecDeque<u64>,
    expires: u64,
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
            log.extend(std::iter::repeat_n(now, cost as usize));
            self.expires = now + p;
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
            log.extend(std::iter::repeat_n(now, add as usize));
            self.expires = self.expires.max(now + p);
        }
    }

    fn hold(&mut self, limit: &Limit, now: u64, _after: u64, left: u64) {
        let (t, p) = (limit.threshold(), limit.period_micros());
        if self.is_idle(now) {
            *self = Log::default();
        }
        let log = &mut self.entries;
        while log.front().is_some_and(|&oldest| oldest + p <= now) {
            log.pop_front();
        }
        let n = log.len() as u64;
        if left >= t || n >= t - left {
            return;
        }
        log.extend(std::iter::repeat_n(now, (t - left - n) as usize));
        self.expires = self.expires.max(now + p);
    }

    fn expires_at(&self) -> u64 {
        self.expires
    }
}
