//! Token bucket and leaky bucket: a meter scaled by `P` so that refill and
//! drain stay exact integers (`T` scaled units per µs; one unit is `P` scaled
//! units). Capacity `B·P`.
//!
//! Token bucket: `tokens = min(B·P, tokens + elapsed·T)` (fresh: full);
//! allowed iff `tokens >= c·P`; `remaining = floor(tokens / P)`;
//! refused: `retry_after = ceil((c·P - tokens) / T)`;
//! `reset_after = ceil((B·P - tokens) / T)`.
//!
//! Leaky bucket: `level = max(0, level - elapsed·T)` (fresh: empty);
//! allowed iff `level + c·P <= B·P`; `remaining = floor((B·P - level) / P)`;
//! refused: `retry_after = ceil((level + c·P - B·P) / T)`;
//! `reset_after = ceil(level / T)`.
//!
//! Both expire `reset_after` after the last write, when the meter is back to
//! its fresh value. With `level = B·P - tokens` the two are the same meter
//! seen from either side; both are kept because users ask for them by name.

use super::{Cell, State, div_ceil};
use crate::decision::Decision;
use crate::limit::Limit;

/// Which side of the meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Token,
    Leaky,
}

/// The current level (units in use × P), after draining to `now`.
fn level(limit: &Limit, cell: &Cell, now: u64, kind: Kind) -> u64 {
    let (t, full) = (limit.threshold(), limit.burst() * limit.period_micros());
    match cell.state {
        Some(State::Meter { scaled, updated }) => {
            let drained = now.saturating_sub(updated).saturating_mul(t);
            match kind {
                Kind::Token => full - full.min(scaled.saturating_add(drained)),
                Kind::Leaky => scaled.saturating_sub(drained),
            }
        }
        _ => 0,
    }
}

fn store(limit: &Limit, cell: &mut Cell, now: u64, level: u64, kind: Kind) {
    let full = limit.burst() * limit.period_micros();
    let scaled = match kind {
        Kind::Token => full.saturating_sub(level),
        Kind::Leaky => level,
    };
    if level == 0 {
        cell.state = None;
    } else {
        cell.state = Some(State::Meter {
            scaled,
            updated: now,
        });
        cell.expires_at = now + div_ceil(level, limit.threshold());
    }
}

pub(super) fn decide(
    limit: &Limit,
    cell: &mut Cell,
    now: u64,
    cost: u64,
    commit: bool,
    kind: Kind,
) -> Decision {
    let (t, p, b) = (limit.threshold(), limit.period_micros(), limit.burst());
    let full = b * p;
    let level = level(limit, cell, now, kind);
    let need = cost * p;
    if level + need > full {
        let retry = div_ceil(level + need - full, t);
        let remaining = full.saturating_sub(level) / p;
        return Decision::from_micros(false, b, remaining, retry, div_ceil(level, t), now);
    }
    let level = if commit {
        store(limit, cell, now, level + need, kind);
        level + need
    } else {
        level
    };
    Decision::from_micros(true, b, (full - level) / p, 0, div_ceil(level, t), now)
}

pub(super) fn refund(limit: &Limit, cell: &mut Cell, now: u64, cost: u64, kind: Kind) {
    let level = level(limit, cell, now, kind).saturating_sub(cost * limit.period_micros());
    store(limit, cell, now, level, kind);
}
