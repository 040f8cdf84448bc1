//! Sliding log: one entry per admitted unit; entries with `t + P <= now` are
//! gone. Refuse if `n + c > T`.
//!
//! - refused: `retry_after = t_k + P - now` where `t_k` is the k-th oldest
//!   entry, `k = n + c - T` (the entry whose leaving makes room for `c`);
//! - `reset_after = newest + P - now` (0 with no entries);
//! - expires when the newest entry leaves: `newest + P`.

use std::collections::VecDeque;

use super::{Cell, State};
use crate::decision::Decision;
use crate::limit::Limit;

pub(super) fn decide(
    limit: &Limit,
    cell: &mut Cell,
    now: u64,
    cost: u64,
    commit: bool,
) -> Decision {
    let (t, p) = (limit.threshold(), limit.period_micros());
    let log = match &mut cell.state {
        Some(State::Log(log)) => log,
        _ => {
            cell.state = Some(State::Log(VecDeque::new()));
            match &mut cell.state {
                Some(State::Log(log)) => log,
                _ => unreachable!("just set"),
            }
        }
    };
    while log.front().is_some_and(|&oldest| oldest + p <= now) {
        log.pop_front();
    }
    let n = log.len() as u64;
    let reset_of = |log: &VecDeque<u64>| log.back().map_or(0, |&newest| newest + p - now);
    if n + cost > t {
        let k = (n + cost - t) as usize;
        let retry = log.get(k - 1).map_or(p, |&entry| entry + p - now);
        return Decision::from_micros(false, t, t.saturating_sub(n), retry, reset_of(log), now);
    }
    let n = if commit {
        log.extend(std::iter::repeat_n(now, cost as usize));
        cell.expires_at = now + p;
        n + cost
    } else {
        n
    };
    let reset = reset_of(log);
    if log.is_empty() {
        cell.state = None;
    }
    Decision::from_micros(true, t, t - n, 0, reset, now)
}

pub(super) fn refund(cell: &mut Cell, cost: u64, at: u64) {
    if let Some(State::Log(log)) = &mut cell.state {
        let mut left = cost;
        log.retain(|&entry| {
            if left > 0 && entry == at {
                left -= 1;
                false
            } else {
                true
            }
        });
    }
}
