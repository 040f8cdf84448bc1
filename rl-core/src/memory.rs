//! The in-memory backend: the embedded default and the reference semantics.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use hashbrown::{HashMap, HashTable};
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

/// One key's states, with the key's hash (computed once per decision: it
/// picks the shard and probes the table).
struct Entry {
    hash: u64,
    key: Box<str>,
    cells: Cells,
}

struct Shard {
    table: HashTable<Entry>,
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
    /// Kept replies of idempotent acquires ([`Backend::acquire_once`]),
    /// sharded like `shards` by the first request's key.
    replies: Box<[Mutex<Replies>]>,
}

/// The allowed replies of [`MemoryBackend::acquire_once_sync`], by
/// `<first key>:req:<request id>` (injective: a key ends at its only `}`).
struct Replies {
    map: HashMap<Box<str>, Kept>,
    /// Sweep expired replies when the map grows past this size.
    sweep_at: usize,
}

/// One kept reply and when it stops being replayed.
struct Kept {
    expires_at: u64,
    decisions: Decisions,
}

impl Replies {
    /// Drops expired replies; returns how many.
    fn sweep(&mut self, now: u64) -> usize {
        let before = self.map.len();
        self.map.retain(|_, kept| kept.expires_at > now);
        before - self.map.len()
    }
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
                    table: HashTable::new(),
                    sweep_at: MIN_SWEEP,
                    last_now: 0,
                }))
            })
            .collect();
        let replies = (0..count)
            .map(|_| {
                Mutex::new(Replies {
                    map: HashMap::new(),
                    sweep_at: MIN_SWEEP,
                })
            })
            .collect();
        Self {
            shards,
            hasher: hashbrown::DefaultHashBuilder::default(),
            clock,
            replies,
        }
    }

    /// The clock this backend decides with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Keys currently held (including expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().table.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired state (and every expired kept reply of
    /// [`MemoryBackend::acquire_once_sync`]) now; returns how many keys were
    /// removed.
    pub fn evict_expired(&self) -> usize {
        let now = self.clock.now_micros();
        let states: usize = self
            .shards
            .iter()
            .map(|shard| sweep(&mut shard.lock(), now))
            .sum();
        let replies: usize = self.replies.iter().map(|r| r.lock().sweep(now)).sum();
        states + replies
    }

    /// Decides a batch synchronously like [`MemoryBackend::acquire_sync`],
    /// idempotently: see [`Backend::acquire_once`]. An allowed reply is kept
    /// under the first request's key and `request_id` for the longest
    /// period of the batch, and swept like expired state.
    ///
    /// ```
    /// use rl_core::{Key, Limit, MemoryBackend, Request};
    /// let backend = MemoryBackend::new();
    /// let limit = Limit::per_minute(5).unwrap();
    /// let key = Key::new("rl", "pay", "alice");
    /// let req = [Request::new(&key, &limit, 1)];
    /// let first = backend.acquire_once_sync(&req, "retry-1").unwrap();
    /// let again = backend.acquire_once_sync(&req, "retry-1").unwrap();
    /// assert_eq!(first, again);
    /// assert_eq!(backend.peek_sync(&req)[0].remaining, 4); // charged once
    /// ```
    pub fn acquire_once_sync(
        &self,
        requests: &[Request<'_>],
        request_id: &str,
    ) -> Result<Decisions, BackendError> {
        let Some(first) = requests.first() else {
            return Ok(self.acquire_sync(requests));
        };
        let mut id = String::with_capacity(first.key.as_str().len() + 5 + request_id.len());
        id.push_str(first.key.as_str());
        id.push_str(":req:");
        id.push_str(request_id);
        // Held while deciding: two calls with one id never both consume.
        let mut replies = self.replies[self.shard_of(first.key.as_str())].lock();
        let now = self.clock.now_micros();
        if let Some(kept) = replies.map.get(id.as_str())
            && kept.expires_at > now
        {
            if kept.decisions.len() != requests.len() {
                return Err(BackendError::protocol(format_args!(
                    "request id reused for a call with {} limit(s); it was first used with {}",
                    requests.len(),
                    kept.decisions.len()
                )));
            }
            return Ok(kept.decisions.clone());
        }
        let decisions = self.acquire_sync(requests);
        if decisions.allowed() {
            let at = decisions.iter().map(|d| d.at_micros).max().unwrap_or(now);
            let longest = requests
                .iter()
                .map(|r| r.limit.period_micros())
                .max()
                .unwrap_or(0);
            if replies.map.len() >= replies.sweep_at {
                replies.sweep(now);
                replies.sweep_at = (replies.map.len() * 2).max(MIN_SWEEP);
            }
            replies.map.insert(
                id.into_boxed_str(),
                Kept {
                    expires_at: at.saturating_add(longest),
                    decisions: decisions.clone(),
                },
            );
        }
        Ok(decisions)
    }

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a hash: bits that the shard's table uses neither for
    /// its bucket index (low bits) nor for its control bytes (top 7 bits).
    fn shard_of_hash(&self, hash: u64) -> usize {
        ((hash >> 32) as usize) & (self.shards.len() - 1)
    }

    fn shard_of(&self, key: &str) -> usize {
        self.shard_of_hash(self.hash(key))
    }

    /// Decides one request synchronously (the in-memory fast path).
    pub fn acquire_one(&self, request: &Request<'_>) -> Decision {
        let clock = self.clock.now_micros();
        let hash = self.hash(request.key.as_str());
        let mut shard = self.shards[self.shard_of_hash(hash)].lock();
        let now = shard.now(clock);
        algorithm::decide(
            request.limit,
            cell(&mut shard, hash, request, now),
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
                    cell(shards.get(index[i].0), index[i].1, r, now),
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
                    cell(shards.get(index[i].0), index[i].1, r, now),
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
                    cell(shards.get(index[i].0), index[i].1, r, now),
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
                    cell(shards.get(index[i].0), index[i].1, r, now),
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
            let key = r.key.as_str();
            let hash = self.hash(key);
            let mut shard = self.shards[self.shard_of_hash(hash)].lock();
            if let Ok(mut found) = shard.table.find_entry(hash, |e| &*e.key == key) {
                let cells = &mut found.get_mut().cells;
                cells.retain(|(id, _)| *id != r.limit.state_id());
                if cells.is_empty() {
                    found.remove();
                }
            }
        }
    }

    /// Locks every shard the requests touch, in shard order, and runs `f`
    /// with the time, the guards and each request's guard index and key hash.
    fn with_locked<R>(
        &self,
        requests: &[Request<'_>],
        f: impl FnOnce(u64, &mut Guards<'_>, &[(usize, u64)]) -> R,
    ) -> R {
        let hashes: SmallVec<[u64; 4]> =
            requests.iter().map(|r| self.hash(r.key.as_str())).collect();
        let mut order: SmallVec<[usize; 4]> =
            hashes.iter().map(|&h| self.shard_of_hash(h)).collect();
        order.sort_unstable();
        order.dedup();
        let index: SmallVec<[(usize, u64); 4]> = hashes
            .iter()
            .map(|&h| {
                let guard = order
                    .binary_search(&self.shard_of_hash(h))
                    .unwrap_or_default();
                (guard, h)
            })
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

/// The cell of `request` (whose key hashes to `hash`) in `shard`, created
/// when missing (sweeping first when the shard has grown enough). One probe
/// of the table when the key exists.
fn cell<'s>(shard: &'s mut Shard, hash: u64, request: &Request<'_>, now: u64) -> &'s mut Cell {
    let id = request.limit.state_id();
    let key = request.key.as_str();
    let cells = match shard.table.find_bucket_index(hash, |e| &*e.key == key) {
        Some(index) => {
            &mut shard
                .table
                .get_bucket_mut(index)
                .expect("found above")
                .cells
        }
        None => {
            if shard.table.len() >= shard.sweep_at {
                sweep(shard, now);
                shard.sweep_at = (shard.table.len() * 2).max(MIN_SWEEP);
            }
            let entry = Entry {
                hash,
                key: key.into(),
                cells: SmallVec::new(),
            };
            &mut shard
                .table
                .insert_unique(hash, entry, |e| e.hash)
                .into_mut()
                .cells
        }
    };
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
    let before = shard.table.len();
    shard.table.retain(|entry| {
        entry.cells.retain(|(_, cell)| !cell.is_idle(now));
        !entry.cells.is_empty()
    });
    before - shard.table.len()
}

fn validate(requests: &[Request<'_>]) -> Result<(), BackendError> {
    Request::check_batch(requests).map_err(BackendError::Invalid)
}

impl Backend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = validate(requests).map(|()| self.acquire_sync(requests));
        Box::pin(std::future::ready(result))
    }

    fn acquire_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = validate(requests).and_then(|()| self.acquire_once_sync(requests, request_id));
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
