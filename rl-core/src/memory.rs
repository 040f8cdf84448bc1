//! The in-memory backend: the embedded default and the reference semantics.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use hashbrown::HashMap;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use crate::algorithm::{self, Cell};
use crate::backend::{Backend, BoxFuture, Request};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Decisions};
use crate::error::BackendError;
use crate::limit::Algorithm;

/// What identifies a limit's state under a key ([`crate::Limit::state_id`]).
type StateId = (Algorithm, u64, u64);

/// Every limit's state under one key.
type Cells = SmallVec<[(StateId, Cell); 1]>;

struct Shard {
    map: HashMap<Box<str>, Cells>,
    /// Sweep expired entries when the map grows past this size.
    sweep_at: usize,
    /// The latest time this shard decided at: a wall clock stepping back
    /// never makes a state look older than it is.
    last_now: u64,
}

impl Shard {
    fn now(&mut self, clock: u64) -> u64 {
        self.last_now = self.last_now.max(clock);
        self.last_now
    }
}

/// An in-process backend with the same semantics as the Redis backend.
///
/// - Sharded (64 cache-padded shards per core): a key's shard is chosen by hash, so calls on different keys
///   rarely contend and no lock is held across shards except for the
///   duration of one multi-key decision (locks taken in shard order).
/// - Bounded: every state expires when it becomes equivalent to a fresh one;
///   a shard sweeps expired entries whenever it has doubled since its last
///   sweep, so rotating keys cannot grow memory without bound.
/// - Allocation-free on the hot path once a key exists.
///
/// ```
/// use rl_core::{Backend, Key, Limit, ManualClock, MemoryBackend, Request};
///
/// # tokio_test_block_on(async {
/// let clock = ManualClock::new(0);
/// let backend = MemoryBackend::with_clock(clock.clone());
/// let limit = Limit::per_minute(1)?;
/// let key = Key::new("rl", "demo", "alice");
/// let req = [Request::new(&key, &limit, 1)];
/// assert!(backend.acquire(&req).await?.allowed());
/// assert!(!backend.acquire(&req).await?.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
pub struct MemoryBackend {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    hasher: hashbrown::DefaultHashBuilder,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("shards", &self.shards.len())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

const MIN_SWEEP: usize = 1024;

impl MemoryBackend {
    /// A backend on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A backend on the given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::with_shared_clock(Arc::new(clock))
    }

    /// A backend on a shared clock.
    pub fn with_shared_clock(clock: Arc<dyn Clock>) -> Self {
        let count =
            (std::thread::available_parallelism().map_or(4, |n| n.get()) * 64).next_power_of_two();
        let shards = (0..count)
            .map(|_| {
                CachePadded::new(Mutex::new(Shard {
                    map: HashMap::new(),
                    sweep_at: MIN_SWEEP,
                    last_now: 0,
                }))
            })
            .collect();
        Self {
            shards,
            hasher: hashbrown::DefaultHashBuilder::default(),
            clock,
        }
    }

    /// The clock this backend decides with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Keys currently held (including expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired state now; returns how many keys were removed.
    pub fn evict_expired(&self) -> usize {
        let now = self.clock.now_micros();
        self.shards
            .iter()
            .map(|shard| sweep(&mut shard.lock(), now))
            .sum()
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) & (self.shards.len() - 1)
    }

    /// Decides one request synchronously (the in-memory fast path).
    pub fn acquire_one(&self, request: &Request<'_>) -> Decision {
        let clock = self.clock.now_micros();
        let mut shard = self.shards[self.shard_of(request.key.as_str())].lock();
        let now = shard.now(clock);
        algorithm::decide(
            request.limit,
            cell(&mut shard, request, now),
            now,
            request.cost,
            true,
        )
    }

    /// Decides a batch synchronously: all-or-nothing, as [`Backend::acquire`].
    pub fn acquire_sync(&self, requests: &[Request<'_>]) -> Decisions {
        if let [one] = requests {
            return Decisions::one(self.acquire_one(one));
        }
        self.with_locked(requests, |now, shards, index| {
            let probe = Decisions::new(requests.iter().enumerate().map(|(i, r)| {
                algorithm::decide(
                    r.limit,
                    cell(shards.get(index[i]), r, now),
                    now,
                    r.cost,
                    false,
                )
            }));
            if !probe.allowed() {
                return probe;
            }
            Decisions::new(requests.iter().enumerate().map(|(i, r)| {
                algorithm::decide(
                    r.limit,
                    cell(shards.get(index[i]), r, now),
                    now,
                    r.cost,
                    true,
                )
            }))
        })
    }

    /// Evaluates a batch synchronously without consuming.
    pub fn peek_sync(&self, requests: &[Request<'_>]) -> Decisions {
        self.with_locked(requests, |now, shards, index| {
            Decisions::new(requests.iter().enumerate().map(|(i, r)| {
                algorithm::decide(
                    r.limit,
                    cell(shards.get(index[i]), r, now),
                    now,
                    r.cost,
                    false,
                )
            }))
        })
    }

    /// Refunds a batch synchronously.
    pub fn refund_sync(&self, requests: &[Request<'_>], at_micros: u64) {
        self.with_locked(requests, |now, shards, index| {
            for (i, r) in requests.iter().enumerate() {
                algorithm::refund(
                    r.limit,
                    cell(shards.get(index[i]), r, now),
                    now,
                    r.cost,
                    at_micros,
                );
            }
        });
    }

    /// Resets a batch synchronously.
    pub fn reset_sync(&self, requests: &[Request<'_>]) {
        for r in requests {
            let mut shard = self.shards[self.shard_of(r.key.as_str())].lock();
            if let Some(cells) = shard.map.get_mut(r.key.as_str()) {
                cells.retain(|(id, _)| *id != r.limit.state_id());
                if cells.is_empty() {
                    shard.map.remove(r.key.as_str());
                }
            }
        }
    }

    /// Locks every shard the requests touch, in shard order, and runs `f`
    /// with the time, the guards and each request's guard index.
    fn with_locked<R>(
        &self,
        requests: &[Request<'_>],
        f: impl FnOnce(u64, &mut Guards<'_>, &[usize]) -> R,
    ) -> R {
        let shard_ids: SmallVec<[usize; 4]> = requests
            .iter()
            .map(|r| self.shard_of(r.key.as_str()))
            .collect();
        let mut order: SmallVec<[usize; 4]> = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let index: SmallVec<[usize; 4]> = shard_ids
            .iter()
            .map(|id| order.binary_search(id).unwrap_or_default())
            .collect();
        let mut guards = Guards(order.iter().map(|&id| self.shards[id].lock()).collect());
        let clock = self.clock.now_micros();
        let now = guards
            .0
            .iter()
            .map(|shard| shard.last_now)
            .fold(clock, u64::max);
        for shard in guards.0.iter_mut() {
            shard.last_now = now;
        }
        f(now, &mut guards, &index)
    }
}

struct Guards<'a>(SmallVec<[MutexGuard<'a, Shard>; 4]>);

impl Guards<'_> {
    fn get(&mut self, i: usize) -> &mut Shard {
        &mut self.0[i]
    }
}

/// The cell of `request` in `shard`, created when missing (sweeping first
/// when the shard has grown enough).
fn cell<'s>(shard: &'s mut Shard, request: &Request<'_>, now: u64) -> &'s mut Cell {
    let id = request.limit.state_id();
    if !shard.map.contains_key(request.key.as_str()) {
        if shard.map.len() >= shard.sweep_at {
            sweep(shard, now);
            shard.sweep_at = (shard.map.len() * 2).max(MIN_SWEEP);
        }
        shard
            .map
            .insert(request.key.as_str().into(), SmallVec::new());
    }
    let cells = shard
        .map
        .get_mut(request.key.as_str())
        .expect("inserted above");
    let position = match cells.iter().position(|(existing, _)| *existing == id) {
        Some(position) => position,
        None => {
            cells.push((id, Cell::default()));
            cells.len() - 1
        }
    };
    &mut cells[position].1
}

fn sweep(shard: &mut Shard, now: u64) -> usize {
    let before = shard.map.len();
    shard.map.retain(|_, cells| {
        cells.retain(|(_, cell)| !cell.is_idle(now));
        !cells.is_empty()
    });
    before - shard.map.len()
}

fn validate(requests: &[Request<'_>]) -> Result<(), BackendError> {
    for r in requests {
        r.limit.check_cost(r.cost).map_err(BackendError::Invalid)?;
    }
    Ok(())
}

impl Backend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = validate(requests).map(|()| self.acquire_sync(requests));
        Box::pin(std::future::ready(result))
    }

    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = validate(requests).map(|()| self.peek_sync(requests));
        Box::pin(std::future::ready(result))
    }

    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.refund_sync(requests, at_micros);
        Box::pin(std::future::ready(Ok(())))
    }

    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        self.reset_sync(requests);
        Box::pin(std::future::ready(Ok(())))
    }
}
