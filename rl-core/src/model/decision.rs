//! What a backend answers: one [`Decision`] per limit, gathered in [`Decisions`].

use std::time::Duration;

use crate::model::clock::micros;

/// The answer for one limit.
///
/// Maps directly onto HTTP `Retry-After` and the IETF `RateLimit` fields.
/// Read through its accessors; a store builds one with [`Decision::new`].
///
/// ```
/// use ratewall::{Decision, backend::Figures};
/// use std::time::Duration;
/// let allowed = Decision::new(Figures {
///     allowed: true,
///     limit: 10,
///     remaining: 9,
///     reset_after_us: 6_000_000,
///     ..Figures::default()
/// });
/// assert!(allowed.allowed());
/// assert_eq!((allowed.limit(), allowed.remaining()), (10, 9));
/// assert_eq!(allowed.retry_after(), Duration::ZERO);
/// assert_eq!(allowed.reset_after(), Duration::from_secs(6));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Decision {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after: Duration,
    reset_after: Duration,
    at_micros: u64,
}

/// A decision's figures in whole microseconds, by name: what stores compute
/// and [`Decision::new`] turns into a [`Decision`].
///
/// Unlike [`Decision`], its fields are public and it is not
/// `#[non_exhaustive]`: a store in another crate (`ratewall-redis`) builds
/// it by struct literal, which a non-exhaustive struct would forbid there.
///
/// ```
/// use ratewall::{Decision, backend::Figures};
/// let refused = Decision::new(Figures {
///     allowed: false,
///     limit: 5,
///     remaining: 0,
///     retry_after_us: 1_500_000,
///     reset_after_us: 60_000_000,
///     at_micros: 42,
/// });
/// assert_eq!(refused.retry_after_secs(), 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Figures {
    /// Whether the call is admitted.
    pub allowed: bool,
    /// The limit's capacity.
    pub limit: u64,
    /// Units still available after this decision.
    pub remaining: u64,
    /// Zero when allowed; otherwise the wait until a call of the same cost fits.
    pub retry_after_us: u64,
    /// The wait until the limit is back to its full quota.
    pub reset_after_us: u64,
    /// The store's time of the decision, µs since the Unix epoch.
    pub at_micros: u64,
}

impl Decision {
    /// The decision with these figures.
    #[inline]
    pub const fn new(figures: Figures) -> Self {
        Self {
            allowed: figures.allowed,
            limit: figures.limit,
            remaining: figures.remaining,
            retry_after: Duration::from_micros(figures.retry_after_us),
            reset_after: Duration::from_micros(figures.reset_after_us),
            at_micros: figures.at_micros,
        }
    }

    /// Whether the call is admitted.
    #[inline]
    pub const fn allowed(&self) -> bool {
        self.allowed
    }

    /// The limit's capacity: the threshold, or the burst for token bucket,
    /// leaky bucket and GCRA.
    #[inline]
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// Units still available right now, after this decision (never negative).
    #[inline]
    pub const fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Zero when allowed; otherwise how long until a call of the same cost
    /// would be allowed, assuming no other traffic.
    #[inline]
    pub const fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// How long until the limit is back to its full quota.
    #[inline]
    pub const fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// The backend's time of the decision, in microseconds since the Unix
    /// epoch (needed to refund exactly what this decision took).
    #[inline]
    pub const fn at_micros(&self) -> u64 {
        self.at_micros
    }

    /// The same figures, allowed with no wait: a reservation that took its
    /// slot from units given back (the state itself would have refused).
    #[inline]
    pub(crate) const fn into_allowed(self) -> Self {
        Self {
            allowed: true,
            retry_after: Duration::ZERO,
            ..self
        }
    }

    /// The same figures, refused (a limit that can never be reserved).
    #[inline]
    pub(crate) const fn into_refused(self) -> Self {
        Self {
            allowed: false,
            ..self
        }
    }

    /// This decision of a limit that blocks ([`crate::Limit::with_block`])
    /// for an identity blocked `left_us` more: refused, nothing remaining,
    /// and the retry and reset no sooner than the block's end (later when
    /// the state itself still refuses then, or is not yet full).
    #[inline]
    pub(crate) fn blocked(self, left_us: u64) -> Self {
        let left = Duration::from_micros(left_us);
        Self {
            allowed: false,
            remaining: 0,
            retry_after: self.retry_after.max(left),
            reset_after: self.reset_after.max(left),
            ..self
        }
    }

    /// This decision, remembered in process, as a refusal `elapsed` later
    /// with `retry_after` left (the deny cache, a lease's holder waiting at
    /// its limit): nothing remaining, the reset `elapsed` nearer but never
    /// before the retry, the time `elapsed` on.
    #[inline]
    pub(crate) fn refused_later(self, retry_after: Duration, elapsed: Duration) -> Self {
        Self {
            allowed: false,
            limit: self.limit,
            remaining: 0,
            retry_after,
            reset_after: self.reset_after.saturating_sub(elapsed).max(retry_after),
            at_micros: self.at_micros.saturating_add(micros(elapsed)),
        }
    }

    /// `retry_after` in whole seconds, rounded up: a client that waits exactly
    /// this long is allowed (the HTTP `Retry-After` value).
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after.as_micros().div_ceil(1_000_000) as u64
    }

    /// `reset_after` in whole seconds, rounded up.
    pub fn reset_after_secs(&self) -> u64 {
        self.reset_after.as_micros().div_ceil(1_000_000) as u64
    }
}

/// The decisions of one call that carries one or more limits, decided together
/// and all-or-nothing: the call is allowed only if every limit allows it, and
/// when any limit refuses, nothing is consumed from any of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decisions {
    items: Items,
}

/// One decision inline (no bigger than a [`Decision`]: results move
/// through several layers, and most calls have one limit), several on the
/// heap. One decision is always `One`, so the derived equality holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Items {
    One(Decision),
    Many(Box<[Decision]>),
}

impl Decisions {
    /// Gathers per-limit decisions, in the order of the requests.
    pub fn new(items: impl IntoIterator<Item = Decision>) -> Self {
        let mut items = items.into_iter();
        let items = match (items.next(), items.next()) {
            (Some(one), None) => Items::One(one),
            (None, _) => Items::Many(Box::new([])),
            (Some(first), Some(second)) => {
                Items::Many([first, second].into_iter().chain(items).collect())
            }
        };
        Self { items }
    }

    /// A single decision.
    #[inline]
    pub fn one(decision: Decision) -> Self {
        Self {
            items: Items::One(decision),
        }
    }

    /// True when every limit allows the call.
    #[inline]
    pub fn allowed(&self) -> bool {
        match &self.items {
            Items::One(one) => one.allowed,
            Items::Many(many) => many.iter().all(|d| d.allowed),
        }
    }

    /// The decision that matters to a client: when refused, the refusing
    /// limit with the longest `retry_after`; when allowed, the limit with the
    /// fewest units remaining.
    ///
    /// # Panics
    /// Never for decisions produced by a backend (they hold at least one).
    pub fn binding(&self) -> &Decision {
        if let Items::One(one) = &self.items {
            return one;
        }
        let refused = self
            .as_slice()
            .iter()
            .filter(|d| !d.allowed)
            .max_by_key(|d| d.retry_after);
        refused
            .or_else(|| {
                self.as_slice()
                    .iter()
                    .min_by_key(|d| (d.remaining, std::cmp::Reverse(d.reset_after)))
            })
            .expect("decisions are never empty")
    }

    /// The index of [`Decisions::binding`]: the first decision equal to it
    /// (0 when empty).
    pub fn binding_index(&self) -> usize {
        if self.len() <= 1 {
            return 0;
        }
        let binding = self.binding();
        self.as_slice()
            .iter()
            .position(|d| d == binding)
            .unwrap_or(0)
    }

    /// Every decision, in request order.
    pub fn iter(&self) -> impl Iterator<Item = &Decision> {
        self.as_slice().iter()
    }

    /// Number of limits decided.
    #[inline]
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether no limit was decided.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// The decisions as a slice.
    #[inline]
    pub fn as_slice(&self) -> &[Decision] {
        match &self.items {
            Items::One(one) => std::slice::from_ref(one),
            Items::Many(many) => many,
        }
    }
}

impl std::ops::Index<usize> for Decisions {
    type Output = Decision;
    fn index(&self, index: usize) -> &Decision {
        &self.as_slice()[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(allowed: bool, remaining: u64, retry_ms: u64) -> Decision {
        Decision::new(Figures {
            allowed,
            limit: 10,
            remaining,
            retry_after_us: retry_ms * 1000,
            ..Figures::default()
        })
    }

    #[test]
    fn binding_decision_is_the_longest_refusal_or_the_scarcest_allowance() {
        let refused = Decisions::new([d(true, 3, 0), d(false, 0, 50), d(false, 0, 900)]);
        assert!(!refused.allowed());
        assert_eq!(refused.binding().retry_after, Duration::from_millis(900));
        let allowed = Decisions::new([d(true, 3, 0), d(true, 1, 0)]);
        assert!(allowed.allowed());
        assert_eq!(allowed.binding().remaining, 1);
    }

    #[test]
    fn retry_after_seconds_round_up_so_waiting_that_long_suffices() {
        assert_eq!(d(false, 0, 1).retry_after_secs(), 1);
        assert_eq!(d(false, 0, 1000).retry_after_secs(), 1);
        assert_eq!(d(false, 0, 1001).retry_after_secs(), 2);
        assert_eq!(d(true, 0, 0).retry_after_secs(), 0);
    }
}
