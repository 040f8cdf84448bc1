//! Fixed window: `w = floor(now / P)`; refuse if `count + c > T`.
//!
//! - `reset_after = retry_after (when refused) = P - now mod P` (the window's end);
//!   `reset_after = 0` when nothing is counted in the current window.
//! - expires at the window's end.

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
    let window = now / p;
    let window_end_in = p - now % p;
    let count = match cell.state {
        Some(State::Window { window: w, count }) if w == window => count,
        _ => 0,
    };
    if count + cost > t {
        return Decision::from_micros(
            false,
            t,
            t.saturating_sub(count),
            window_end_in,
            window_end_in,
            now,
        );
    }
    let count = if commit {
        cell.state = Some(State::Window {
            window,
            count: count + cost,
        });
        cell.expires_at = (window + 1) * p;
        count + cost
    } else {
        count
    };
    let reset = if count > 0 { window_end_in } else { 0 };
    Decision::from_micros(true, t, t - count, 0, reset, now)
}

pub(super) fn refund(limit: &Limit, cell: &mut Cell, cost: u64, at: u64) {
    if let Some(State::Window { window, count }) = &mut cell.state
        && *window == at / limit.period_micros()
    {
        *count = count.saturating_sub(cost);
    }
}
