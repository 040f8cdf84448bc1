//! The memory store's synchronous public API.

use super::*;
use crate::model::key::Key;
use crate::store::backend::Block;

/// The public synchronous API, over [`Request`]s (rendered keys).
impl MemoryBackend {
    /// Decides one request synchronously.
    pub fn acquire_one(&self, request: &Request<'_>) -> Decision {
        self.acquire_target(&targets(std::slice::from_ref(request))[0])
    }

    /// Decides a batch synchronously: all-or-nothing, as [`Backend::acquire`].
    /// The batch is not validated here ([`Backend::acquire`] does).
    pub fn acquire_sync(&self, requests: &[Request<'_>]) -> Decisions {
        self.acquire_targets(&targets(requests))
    }

    /// Decides a batch synchronously like [`MemoryBackend::acquire_sync`],
    /// idempotently: see [`Backend::acquire_once`]. An allowed reply is kept
    /// under the first request's key and `request_id` for the longest
    /// period of the batch, and swept like expired state.
    ///
    /// ```
    /// use ratewall::{Key, Limit, backend::{MemoryBackend, Request}};
    /// let backend = MemoryBackend::new();
    /// let limit = Limit::per_minute(5).unwrap();
    /// let key = Key::new("rl", "pay", "alice");
    /// let req = [Request::new(&key, &limit, 1)];
    /// let first = backend.acquire_once_sync(&req, "retry-1").unwrap();
    /// let again = backend.acquire_once_sync(&req, "retry-1").unwrap();
    /// assert_eq!(first, again);
    /// assert_eq!(backend.peek_sync(&req)[0].remaining(), 4); // charged once
    /// ```
    ///
    /// # Errors
    /// [`BackendError::Protocol`] when `request_id` was used, within the time
    /// it is kept, for a call with a different number of limits.
    pub fn acquire_once_sync(
        &self,
        requests: &[Request<'_>],
        request_id: &str,
    ) -> Result<Decisions, BackendError> {
        self.acquire_targets_once(&targets(requests), request_id)
    }

    /// Evaluates a batch synchronously without consuming.
    pub fn peek_sync(&self, requests: &[Request<'_>]) -> Decisions {
        self.decide_targets(&targets(requests), false, 0)
    }

    /// Refunds a batch synchronously.
    pub fn refund_sync(&self, requests: &[Request<'_>], at_micros: u64) {
        self.refund_targets(&targets(requests), at_micros);
    }

    /// Takes each request's cost on top of its state synchronously, as
    /// [`Backend::charge`].
    ///
    /// ```
    /// use ratewall::{Key, Limit, backend::{MemoryBackend, Request}};
    /// let backend = MemoryBackend::new();
    /// let limit = Limit::per_minute(10).unwrap();
    /// let key = Key::new("rl", "tokens", "team-a");
    /// backend.charge_sync(&[Request::new(&key, &limit, 12)]); // 2 past the limit
    /// let now = backend.peek_sync(&[Request::new(&key, &limit, 1)]);
    /// assert!(!now[0].allowed()); // the debt is paid before anyone passes
    /// ```
    pub fn charge_sync(&self, requests: &[Request<'_>]) {
        self.charge_targets(&targets(requests));
    }

    /// Raises each request's state so that at most `left` units remain
    /// `after` from now, synchronously, as [`Backend::hold`].
    ///
    /// ```
    /// use ratewall::{Key, Limit, backend::{MemoryBackend, Request}, clock::ManualClock};
    /// use std::time::Duration;
    /// let clock = ManualClock::new(1_000_000);
    /// let backend = MemoryBackend::with_clock(clock.clone());
    /// let limit = Limit::per_minute(600).unwrap(); // one every 100 ms
    /// let key = Key::new("rl", "upstream", "api");
    /// let req = [Request::new(&key, &limit, 1)];
    /// // The upstream said: retry after 2 s.
    /// backend.hold_sync(&req, Duration::from_secs(2), 0);
    /// let refused = backend.peek_sync(&req);
    /// assert!(!refused[0].allowed());
    /// assert!(refused[0].retry_after() >= Duration::from_secs(2));
    /// clock.advance(refused[0].retry_after());
    /// assert!(backend.peek_sync(&req)[0].allowed());
    /// ```
    pub fn hold_sync(&self, requests: &[Request<'_>], after: std::time::Duration, left: u64) {
        let after = micros(after);
        self.hold_targets(&targets(requests), after, left);
    }

    /// Applies `adjust` to the learned scale of `name` under `prefix`
    /// synchronously, as [`Backend::adjust`], and answers the scale after
    /// it. A scale unchanged for a day is forgotten.
    ///
    /// ```
    /// use ratewall::{backend::MemoryBackend, clock::ManualClock, upstream::{Adjust, SCALE_ONE}};
    /// use std::time::Duration;
    /// let backend = MemoryBackend::with_clock(ManualClock::new(1_000_000));
    /// let lower = Adjust::Lower {
    ///     keep: SCALE_ONE / 2,
    ///     estimate: 0,
    ///     headroom: SCALE_ONE,
    ///     cooldown: Duration::from_secs(5),
    ///     floor: 0,
    /// };
    /// assert_eq!(backend.adjust_sync("rl", "tpm", lower), SCALE_ONE / 2);
    /// assert_eq!(backend.adjust_sync("rl", "tpm", lower), SCALE_ONE / 2); // once per cooldown
    /// assert_eq!(backend.adjust_sync("rl", "rpm", Adjust::Read), SCALE_ONE);
    /// ```
    pub fn adjust_sync(&self, prefix: &str, name: &str, adjust: Adjust) -> u64 {
        const DAY: u64 = 86_400_000_000;
        let now = self.clock.now_micros();
        let mut learned = self.learned.lock();
        let key = (prefix.to_owned(), name.to_owned());
        let current = learned
            .get(&key)
            .copied()
            .filter(|l| now.saturating_sub(l.changed_at) < DAY)
            .unwrap_or_default();
        let (after, written) = current.adjusted(adjust, now);
        if written {
            learned.insert(key, after);
        } else if current == Learned::default() {
            learned.remove(&key);
        }
        after.scale
    }

    /// Resets a batch synchronously.
    pub fn reset_sync(&self, requests: &[Request<'_>]) {
        self.reset_targets(&targets(requests));
    }

    /// The blocks of `key`'s identity synchronously, as
    /// [`Backend::blocks`].
    ///
    /// ```
    /// use ratewall::{Key, Limit, backend::{MemoryBackend, Request}};
    /// use std::time::Duration;
    /// let backend = MemoryBackend::new();
    /// let limit = Limit::per_minute(1).unwrap().with_block(Duration::from_secs(600)).unwrap();
    /// let key = Key::new("rl", "login", "alice");
    /// let call = [Request::new(&key, &limit, 1)];
    /// assert!(backend.acquire_sync(&call).allowed());
    /// assert!(!backend.acquire_sync(&call).allowed()); // refused: blocked for 10 minutes
    /// let blocks = backend.blocks_sync(&key);
    /// assert_eq!(blocks[0].suffix, limit.storage_suffix());
    /// assert!(blocks[0].left <= Duration::from_secs(600));
    /// assert!(backend.unblock_sync(&key));
    /// assert!(backend.blocks_sync(&key).is_empty());
    /// ```
    pub fn blocks_sync(&self, key: &Key) -> Vec<Block> {
        let mut blocks: Vec<Block> = self
            .blocks_of(key)
            .into_iter()
            .map(|(state, left)| {
                let mut suffix = String::new();
                crate::model::limit::write_suffix(state, &mut suffix);
                Block::new(suffix, std::time::Duration::from_micros(left))
            })
            .collect();
        blocks.sort();
        blocks
    }

    /// Lifts every block of `key`'s identity synchronously, as
    /// [`Backend::unblock`].
    pub fn unblock_sync(&self, key: &Key) -> bool {
        self.unblock_key(key)
    }

    /// Reserves a slot for a waiting call synchronously, as
    /// [`Backend::reserve`] (`max_wait` in µs). The batch is not validated
    /// here ([`Backend::reserve`] does).
    ///
    /// ```
    /// use ratewall::{Algorithm, Key, Limit, backend::{MemoryBackend, Request}, clock::ManualClock};
    /// let backend = MemoryBackend::with_clock(ManualClock::new(1_000_000));
    /// let limit = Limit::per_second(10).unwrap().with_algorithm(Algorithm::LeakyBucket).unwrap().with_burst(1).unwrap();
    /// let key = Key::new("rl", "jobs", "queue");
    /// let req = [Request::new(&key, &limit, 1)];
    /// let times: Vec<u64> = (0..3).map(|_| backend.reserve_sync(&req, 1_000_000).slot_micros().unwrap()).collect();
    /// assert_eq!(times, [1_000_000, 1_100_000, 1_200_000]); // one every 100 ms
    /// ```
    pub fn reserve_sync(&self, requests: &[Request<'_>], max_wait: u64) -> Reservation {
        self.reserve_targets(&targets(requests), max_wait)
    }

    /// Gives back a reservation synchronously, as [`Backend::cancel`].
    pub fn cancel_sync(&self, requests: &[Request<'_>], reservation: &Reservation) {
        self.cancel_targets(&targets(requests), reservation);
    }

    /// Decides a batch and leases extra units synchronously, as
    /// [`Backend::acquire_lease`] (not validated here).
    ///
    /// ```
    /// use ratewall::{Key, Limit, backend::{MemoryBackend, Request}};
    /// let backend = MemoryBackend::new();
    /// let limit = Limit::per_minute(100).unwrap().with_algorithm(ratewall::Algorithm::FixedWindow).unwrap();
    /// let key = Key::new("rl", "api", "tenant-1");
    /// let leased = backend.acquire_lease_sync(&[Request::new(&key, &limit, 1)], &[10]);
    /// assert!(leased.decisions.allowed());
    /// assert_eq!(leased.granted, [10]); // the call's unit and 10 more are taken
    /// assert_eq!(leased.decisions.binding().remaining(), 89);
    /// ```
    pub fn acquire_lease_sync(&self, requests: &[Request<'_>], extra: &[u64]) -> Leased {
        let (decisions, granted) = self.lease_targets(&targets(requests), extra);
        Leased::new(decisions, granted.into_vec())
    }

    /// Gives back unused leased units synchronously, as [`Backend::return_lease`].
    pub fn return_lease_sync(&self, returns: &[LeaseReturn<'_>]) {
        for back in returns {
            let request = std::slice::from_ref(&back.request);
            self.release_targets(&targets(request), back.at_micros, &[back.stamp]);
        }
    }
}

/// The targets of `requests`, whose keys they borrow.
pub(super) fn targets<'a>(requests: &'a [Request<'a>]) -> SmallVec<[Target<'a>; 4]> {
    requests
        .iter()
        .map(|r| Target {
            name: "",
            key: KeyRef::of(r.key),
            limit: r.limit,
            cost: r.cost,
            slot: None,
            lease: r.holder,
        })
        .collect()
}
