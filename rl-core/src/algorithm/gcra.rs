//! GCRA: one theoretical arrival time (TAT) per identity.
//!
//! `I = ceil(P / T)` µs (rounded up: never faster than configured),
//! `τ = I·B`, `tat = max(stored, now)`, `new_tat = tat + c·I`.
//! Allowed iff `new_tat <= now + τ`; then store `new_tat`, expiring at
//! `new_tat`; `remaining = floor((now + τ - new_tat) / I)`,
//! `reset_after = new_tat - now`.
//! Refused: `retry_after = new_tat - τ - now`, nothing stored,
//! `remaining = floor((now + τ - tat) / I)`, `reset_after = tat - now`.

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
    let interval = limit.emission_interval_micros();
    let tau = interval * limit.burst();
    let tat = match cell.state {
        Some(State::Tat(tat)) => tat.max(now),
        _ => now,
    };
    let new_tat = tat + cost * interval;
    let b = limit.burst();
    if new_tat > now + tau {
        let remaining = (now + tau).saturating_sub(tat) / interval;
        return Decision::from_micros(false, b, remaining, new_tat - tau - now, tat - now, now);
    }
    if commit {
        cell.state = Some(State::Tat(new_tat));
        cell.expires_at = new_tat;
        Decision::from_micros(
            true,
            b,
            (now + tau - new_tat) / interval,
            0,
            new_tat - now,
            now,
        )
    } else {
        Decision::from_micros(true, b, (now + tau - tat) / interval, 0, tat - now, now)
    }
}

pub(super) fn refund(limit: &Limit, cell: &mut Cell, now: u64, cost: u64) {
    if let Some(State::Tat(tat)) = cell.state {
        let back = tat.saturating_sub(cost * limit.emission_interval_micros());
        if back <= now {
            cell.state = None;
        } else {
            cell.state = Some(State::Tat(back));
            cell.expires_at = back;
        }
    }
}
