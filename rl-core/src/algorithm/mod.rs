//! The six algorithms as pure functions over per-key state.
//!
//! These functions are the reference semantics: the in-memory backend calls
//! them under a lock, and the Redis Lua scripts implement the same integer
//! arithmetic line by line (the differential tests hold them to it).
//!
//! Conventions shared by every algorithm:
//! - time `now` is integer microseconds; `P` is the period in µs, `T` the
//!   threshold, `B` the burst, `c` the cost;
//! - `commit == false` evaluates without consuming (a peek, or the first
//!   phase of an all-or-nothing decision): `remaining` is then what is left
//!   now, and `allowed` says whether `c` units would fit;
//! - a refused call changes nothing that matters (only trimming of entries
//!   that have already expired);
//! - every state carries the time at which it becomes equivalent to "no
//!   state" (`expires_at`), which is the TTL the Redis scripts set.

mod fixed_window;
mod gcra;
mod meter;
mod sliding_log;
mod sliding_window;

use std::collections::VecDeque;

use crate::decision::Decision;
use crate::limit::{Algorithm, Limit};

/// Per-key, per-limit state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// Fixed window: window index and count in it.
    Window { window: u64, count: u64 },
    /// Sliding log: admission times, oldest first, one per unit.
    Log(VecDeque<u64>),
    /// Sliding-window counter: (slot index, count), oldest first.
    Slots(VecDeque<(u64, u64)>),
    /// Token bucket (tokens × P) or leaky bucket (level × P), and the time of
    /// the last update.
    Meter { scaled: u64, updated: u64 },
    /// GCRA theoretical arrival time.
    Tat(u64),
}

/// A state and the time it expires; `None` state means fresh.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cell {
    pub(crate) state: Option<State>,
    pub(crate) expires_at: u64,
}

impl Cell {
    /// Drops the state once it has expired (it is then equivalent to fresh).
    fn settle(&mut self, now: u64) {
        if self.state.is_some() && now >= self.expires_at {
            self.state = None;
        }
    }

    /// Whether nothing is stored (fresh or expired).
    pub(crate) fn is_idle(&self, now: u64) -> bool {
        self.state.is_none() || now >= self.expires_at
    }
}

/// Decides one call on one cell.
pub(crate) fn decide(
    limit: &Limit,
    cell: &mut Cell,
    now: u64,
    cost: u64,
    commit: bool,
) -> Decision {
    cell.settle(now);
    match limit.algorithm() {
        Algorithm::FixedWindow => fixed_window::decide(limit, cell, now, cost, commit),
        Algorithm::SlidingLog => sliding_log::decide(limit, cell, now, cost, commit),
        Algorithm::SlidingWindow => sliding_window::decide(limit, cell, now, cost, commit),
        Algorithm::TokenBucket => meter::decide(limit, cell, now, cost, commit, meter::Kind::Token),
        Algorithm::LeakyBucket => meter::decide(limit, cell, now, cost, commit, meter::Kind::Leaky),
        Algorithm::Gcra => gcra::decide(limit, cell, now, cost, commit),
    }
}

/// Gives back `cost` units taken by a decision made at `at`.
pub(crate) fn refund(limit: &Limit, cell: &mut Cell, now: u64, cost: u64, at: u64) {
    cell.settle(now);
    if cell.state.is_none() {
        return;
    }
    match limit.algorithm() {
        Algorithm::FixedWindow => fixed_window::refund(limit, cell, cost, at),
        Algorithm::SlidingLog => sliding_log::refund(cell, cost, at),
        Algorithm::SlidingWindow => sliding_window::refund(limit, cell, cost, at),
        Algorithm::TokenBucket => meter::refund(limit, cell, now, cost, meter::Kind::Token),
        Algorithm::LeakyBucket => meter::refund(limit, cell, now, cost, meter::Kind::Leaky),
        Algorithm::Gcra => gcra::refund(limit, cell, now, cost),
    }
}

/// `ceil(a / b)` for positive integers.
fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

#[cfg(test)]
mod tests;
