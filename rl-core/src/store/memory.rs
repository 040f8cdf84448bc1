//! The in-memory store: the embedded default and the reference semantics.
//!
//! Layout, chosen for the hot path and for memory per identity:
//! - a fixed set of shards (cache-padded mutexes), chosen by the hash of
//!   (partition, identity), so calls on different identities rarely contend;
//! - in each shard, one hash table per kind of state ([`Tat`], [`Window`],
//!   [`Meter`], [`Log`], [`Slots`]) and per form of identity (a number, or
//!   text), so an identity costs what its algorithm needs (a GCRA number:
//!   a 4-byte partition, the 8-byte number, the TAT, when it was written
//!   and the interval it is measured in (4 bytes, see [`Tat`]), 32 bytes,
//!   packed into 20 once its shard holds 32 of them (see [`Packing`]),
//!   three to a cache line (see [`LineTable`]); as text: 48 bytes, the text
//!   inline up to 24 bytes);
//! - a partition is one key head (`prefix:{scope:`) with one algorithm,
//!   period and slot count, interned once as a `u32`; a resolved call
//!   carries its partitions ([`Slot`]), so deciding needs no lookup but the
//!   identity's.
//!
//! Identities are stored in full, never as a hash: a number as the number
//! (its text is its canonical decimal form, so no two identities share one,
//! see [`IdentityRef`]), text as text (inline up to 24 bytes). Two
//! identities never share state.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use compact_str::CompactString;
use hashbrown::{Equivalent, HashMap, HashTable};
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;

use crate::algorithm::{Flight, Log, Meter, Slots, State, Tat, Window};
use crate::model::clock::{Clock, SystemClock, micros};
use crate::model::decision::{Decision, Decisions, Figures};
use crate::model::error::BackendError;
use crate::model::key::IdentityRef;
use crate::model::learned::{Adjust, Learned};
use crate::model::limit::{Algorithm, Limit, StateId};
use crate::model::reservation::Reservation;
use crate::store::Stored;
use crate::store::backend::{Backend, BoxFuture, LeaseReturn, Leased, Request, check_lease_batch};
use crate::store::reserve::{Freed, choose_slot};
use crate::store::sharded::{Hasher, Locked, Sharded};
use crate::store::target::{KeyRef, Op, Slot, Target};

/// Laid out in order (`repr(C)`): what every decision touches (the time it
/// decided at, then the tables of numbers, GCRA's first: its packed rows,
/// then where its wide entries are) shares the lock's cache line, so a
/// decision on a cold shard misses one line, not two.
#[repr(C)]
struct Shard {
    /// The latest time this shard decided at: a clock stepping back never
    /// makes a state look older than it is. A reservation's slot, later
    /// than now, never moves it.
    last_now: u64,
    tables: AllTables,
    /// What the packed rows of the GCRA table of numbers share.
    packing: Packing,
    /// The store's hasher, to rehash entries when a table grows.
    hasher: Hasher,
    /// Sweep idle states when the shard grows past this size.
    sweep_at: usize,
    /// Slots given back by cancelled reservations that were no longer the
    /// last of their queue, by partition and identity (rare: kept apart
    /// from the states, which stay compact).
    freed: HashMap<(u32, Owned), Freed>,
    /// Blocked identities ([`Limit::with_block`]), and when to sweep them.
    blocks: HashTable<block::Blocked>,
    blocks_sweep_at: usize,
}

/// An identity held as a key of [`Shard::freed`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Owned {
    Number(u64),
    Text(CompactString),
}

impl Owned {
    fn of(identity: IdentityRef<'_>) -> Self {
        match identity {
            IdentityRef::Number(n) => Owned::Number(n),
            // Under its partition tagged with `IPV4`: never a number's.
            IdentityRef::Ipv4(ip) => Owned::Number(u64::from(ip)),
            IdentityRef::Text(_) => Owned::Text(CompactString::hold(identity)),
        }
    }
}

impl Shard {
    #[inline]
    fn now(&mut self, clock: u64) -> u64 {
        self.last_now = self.last_now.max(clock);
        self.last_now
    }
}

/// One target, located: its partition, the hash of (partition, identity)
/// and its shard.
#[derive(Debug, Clone, Copy)]
struct Located {
    partition: u32,
    hash: u64,
    shard: usize,
}

/// An in-process backend with the same semantics as the Redis backend.
///
/// - Sharded (64 cache-padded shards per core): an identity's shard is
///   chosen by hash, so calls on different identities rarely contend, and
///   a multi-key decision locks its shards in order.
/// - Compact: one table per kind of state and form of identity; a GCRA
///   identity that is a number takes 32 bytes of table while its shard
///   holds fewer than 32 of them ([`MemoryBackend::with_pack_at`]), then 20
///   (packed: its partition and
///   measure interned per shard, its times 40 bits each; the exact state,
///   history across a live limit change included), three to a 64-byte
///   cache line, so that finding one reads one line; one that is text 48
///   bytes (text inline up to 24 bytes).
/// - Bounded: every state expires when it becomes equivalent to a fresh one;
///   a shard sweeps idle states whenever it has doubled since its last
///   sweep, so rotating keys cannot grow memory without bound. A refused
///   call or a peek never adds an identity.
/// - Allocation-free on the hot path once an identity exists.
///
/// ```
/// use ratewall::{Key, Limit, backend::{Backend, MemoryBackend, Request}, clock::ManualClock};
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
    shards: Sharded<Mutex<Shard>>,
    clock: Arc<dyn Clock>,
    partitions: Partitions,
    /// Tells this store's [`Slot`]s from another's.
    id: NonZeroU32,
    /// Kept replies of idempotent acquires ([`Backend::acquire_once`]),
    /// sharded by the first request's key.
    replies: Sharded<Mutex<Replies>>,
    /// Learned scales ([`Backend::adjust`]), by `(prefix, name)`.
    learned: Mutex<HashMap<(String, String), Learned>>,
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
    /// A tombstone: the call was cancelled ([`Backend::cancel_once`]);
    /// it takes nothing should it arrive.
    cancelled: bool,
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
            .field("partitions", &self.partitions.len())
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

/// How long a request id's kept reply or tombstone lives at most (µs): the
/// longest period of the call, but no more than two minutes (the Redis
/// scripts' `KEEP_ONCE_MS`).
const KEEP_ONCE_US: u64 = 120_000_000;

static NEXT_STORE: AtomicU32 = AtomicU32::new(1);

impl MemoryBackend {
    /// A backend on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A backend on the given clock (a [`crate::clock::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::with_shared_clock(Arc::new(clock))
    }

    /// A backend on a shared clock.
    pub fn with_shared_clock(clock: Arc<dyn Clock>) -> Self {
        let shards = Sharded::per_core(64, |hasher| {
            Mutex::new(Shard {
                tables: AllTables::default(),
                packing: Packing::default(),
                hasher: hasher.clone(),
                sweep_at: MIN_SWEEP,
                last_now: 0,
                freed: HashMap::new(),
                blocks: HashTable::new(),
                blocks_sweep_at: MIN_SWEEP,
            })
        });
        let replies = Sharded::per_core(64, |_| {
            Mutex::new(Replies {
                map: HashMap::new(),
                sweep_at: MIN_SWEEP,
            })
        });
        Self {
            shards,
            clock,
            partitions: Partitions::default(),
            // Wraps after 4 billion stores: then at worst a stale slot of a
            // dropped store is looked up again.
            id: NonZeroU32::new(NEXT_STORE.fetch_add(1, Ordering::Relaxed))
                .unwrap_or(NonZeroU32::MIN),
            replies,
            learned: Mutex::new(HashMap::new()),
        }
    }

    /// This backend, its shards packing their GCRA states of numbers once
    /// each holds `states` of them (default 32; 0 packs from the first,
    /// `usize::MAX` never).
    ///
    /// A shard holds GCRA states of numbers in 32-byte entries while it is
    /// small, then packs them all into 20 bytes each, exactly (see the
    /// type's docs), three to a 64-byte cache line: a large table misses
    /// fewer cache lines (a lookup reads one line, rarely two) and takes
    /// less memory, for a few instructions a decision.
    ///
    /// ```
    /// use ratewall::{Algorithm, Key, Limit, backend::{MemoryBackend, Request}};
    /// let backend = MemoryBackend::new().with_pack_at(0);
    /// let limit = Limit::per_minute(1)?.with_algorithm(Algorithm::Gcra)?;
    /// let key = Key::from_display("rl", "users", &42);
    /// assert!(backend.acquire_one(&Request::new(&key, &limit, 1)).allowed());
    /// assert!(!backend.acquire_one(&Request::new(&key, &limit, 1)).allowed());
    /// # Ok::<(), ratewall::error::LimitError>(())
    /// ```
    #[must_use]
    pub fn with_pack_at(self, states: usize) -> Self {
        for shard in self.shards.iter() {
            shard.lock().packing.set_pack_at(states);
        }
        self
    }

    /// The clock this backend decides with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Identities currently held under every limit (idle ones included
    /// until swept).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().tables.len()).sum()
    }

    /// Whether no identity is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every idle state (and every expired kept reply of
    /// [`MemoryBackend::acquire_once_sync`]) now; returns how many were
    /// removed.
    pub fn evict_expired(&self) -> usize {
        let now = self.clock.now_micros();
        let states: usize = self
            .shards
            .iter()
            .map(|shard| {
                let shard = &mut *shard.lock();
                sweep_freed(&mut shard.freed, now);
                block::sweep(shard, now)
                    + shard.tables.sweep(now, &shard.hasher, &mut shard.packing)
            })
            .sum();
        let replies: usize = self.replies.iter().map(|r| r.lock().sweep(now)).sum();
        states + replies
    }

    /// What tells this store's slots from another's.
    #[inline]
    pub(crate) fn id(&self) -> NonZeroU32 {
        self.id
    }

    /// The slot of `key`'s state under `limit` in this store (what a
    /// resolved call caches).
    pub(crate) fn slot(&self, head: &str, limit: &Limit) -> Slot {
        Slot {
            store: self.id,
            partition: self.partitions.get_or_insert(head, limit.state_id()),
        }
    }

    #[inline(always)]
    fn locate(&self, target: &Target<'_>) -> Located {
        let partition = match target.slot {
            Some(slot) if slot.store == self.id => slot.partition,
            _ => self
                .partitions
                .get_cached(self.id, target.key.head, target.limit.state_id()),
        };
        let partition = match target.key.identity {
            IdentityRef::Ipv4(_) => partition | IPV4,
            _ => partition,
        };
        let hash = hash_of(self.shards.hasher(), partition, target.key.identity);
        Located {
            partition,
            hash,
            shard: self.shards.index(hash),
        }
    }

    /// Runs `op` on a batch the pipeline has validated.
    #[inline]
    pub(crate) fn run(&self, op: Op<'_>, targets: &[Target<'_>]) -> Result<Stored, BackendError> {
        Ok(match op {
            Op::Acquire => Stored::Decided(self.acquire_targets(targets)),
            Op::AcquireOnce(id) => Stored::Decided(self.acquire_targets_once(targets, id)?),
            Op::Peek(ahead) => Stored::Decided(self.decide_targets(targets, false, ahead)),
            Op::Refund(at) => {
                self.refund_targets(targets, at);
                Stored::Applied
            }
            Op::Charge => {
                self.charge_targets(targets);
                Stored::Applied
            }
            Op::Hold { after, left } => {
                self.hold_targets(targets, after, left);
                Stored::Applied
            }
            Op::Reset => {
                self.reset_targets(targets);
                Stored::Applied
            }
            Op::Reserve(max_wait) => {
                Stored::Reserved(Box::new(self.reserve_targets(targets, max_wait)))
            }
            Op::Cancel(reservation) => {
                self.cancel_targets(targets, reservation);
                Stored::Applied
            }
            Op::CancelOnce(id) => {
                self.cancel_targets_once(targets, id);
                Stored::Applied
            }
        })
    }

    /// Decides one target (the hot path: one shard, one probe).
    #[inline(always)]
    pub(crate) fn acquire_target(&self, target: &Target<'_>) -> Decision {
        in_shard(self, target, |shard, at, now| {
            decide_in(shard, at, target, now, true, now)
        })
    }

    /// [`MemoryBackend::acquire_target`] for a caller that uses no figure
    /// of an admission: `Err` holds the refusal.
    #[inline]
    pub(crate) fn admit_target(&self, target: &Target<'_>) -> Result<(), Decision> {
        in_shard(self, target, |shard, at, now| {
            admit_in(shard, at, target, now)
        })
    }

    #[inline]
    pub(crate) fn acquire_targets(&self, targets: &[Target<'_>]) -> Decisions {
        if let [one] = targets {
            return Decisions::one(self.acquire_target(one));
        }
        self.with_locked(targets, |now, guards, located| {
            let probe = decide_all(guards, targets, located, now, false);
            if !probe.allowed() {
                block::refused(guards, targets, located, now, &probe);
                return probe;
            }
            decide_all(guards, targets, located, now, true)
        })
    }

    /// Decides `targets` (committing or not) now, or as of `ahead` µs from
    /// now on copies of their states (`Op::Peek(ahead)`).
    fn decide_targets(&self, targets: &[Target<'_>], commit: bool, ahead: u64) -> Decisions {
        self.with_locked(targets, |now, guards, located| match ahead {
            0 => decide_all(guards, targets, located, now, commit),
            _ => project_all(guards, targets, located, now, now.saturating_add(ahead)),
        })
    }

    fn acquire_targets_once(
        &self,
        targets: &[Target<'_>],
        request_id: &str,
    ) -> Result<Decisions, BackendError> {
        let Some(first) = targets.first() else {
            return Ok(Decisions::new([]));
        };
        let mut id = first.key.render().as_str().to_owned();
        id.push_str(":req:");
        id.push_str(request_id);
        // Held while deciding: two calls with one id never both consume.
        let mut replies = self.replies.of(self.replies.hash(id.as_str())).lock();
        let now = self.clock.now_micros();
        if let Some(kept) = replies.map.get(id.as_str())
            && kept.expires_at > now
        {
            if kept.cancelled {
                // Cancelled before it arrived: nothing decided, nothing taken.
                return Ok(Decisions::new(targets.iter().map(|t| {
                    Decision::new(Figures {
                        allowed: false,
                        limit: t.limit.threshold(),
                        at_micros: now,
                        ..Figures::default()
                    })
                })));
            }
            if kept.decisions.len() != targets.len() {
                return Err(BackendError::protocol(format!(
                    "request id reused for a call with {} limit(s); it was first used with {}",
                    targets.len(),
                    kept.decisions.len()
                )));
            }
            return Ok(kept.decisions.clone());
        }
        let decisions = self.acquire_targets(targets);
        if decisions.allowed() {
            let at = decisions.iter().map(|d| d.at_micros()).max().unwrap_or(now);
            let longest = targets
                .iter()
                .map(|t| t.limit.period_micros())
                .max()
                .unwrap_or(0)
                .min(KEEP_ONCE_US);
            if replies.map.len() >= replies.sweep_at {
                replies.sweep(now);
                replies.sweep_at = (replies.map.len() * 2).max(MIN_SWEEP);
            }
            replies.map.insert(
                id.into_boxed_str(),
                Kept {
                    expires_at: at.saturating_add(longest),
                    decisions: decisions.clone(),
                    cancelled: false,
                },
            );
        }
        Ok(decisions)
    }

    /// Takes back an idempotent acquire the caller gave up on, by its id
    /// ([`Backend::cancel_once`]): what it took is given back if it was
    /// allowed, and a tombstone makes it take nothing should it arrive.
    fn cancel_targets_once(&self, targets: &[Target<'_>], request_id: &str) {
        let Some(first) = targets.first() else {
            return;
        };
        let mut id = first.key.render().as_str().to_owned();
        id.push_str(":req:");
        id.push_str(request_id);
        let mut replies = self.replies.of(self.replies.hash(id.as_str())).lock();
        let now = self.clock.now_micros();
        let longest = targets
            .iter()
            .map(|t| t.limit.period_micros())
            .max()
            .unwrap_or(0)
            .min(KEEP_ONCE_US);
        let taken = replies
            .map
            .get(id.as_str())
            .filter(|kept| kept.expires_at > now && !kept.cancelled)
            .map(|kept| {
                kept.decisions
                    .iter()
                    .map(|d| d.at_micros())
                    .max()
                    .unwrap_or(now)
            });
        if let Some(at) = taken {
            self.refund_targets(targets, at);
        }
        replies.map.insert(
            id.into_boxed_str(),
            Kept {
                expires_at: now.saturating_add(longest),
                decisions: Decisions::new([]),
                cancelled: true,
            },
        );
    }

    /// Takes back a call given up on, synchronously, as
    /// [`Backend::cancel_once`].
    pub fn cancel_once_sync(&self, requests: &[Request<'_>], request_id: &str) {
        self.cancel_targets_once(&targets(requests), request_id);
    }

    /// Decides `targets` all-or-nothing and, when all are allowed, leases
    /// up to `extra[i]` more units of target `i` ([`Backend::acquire_lease`]).
    pub(crate) fn lease_targets(
        &self,
        targets: &[Target<'_>],
        extra: &[u64],
    ) -> (Decisions, SmallVec<[u64; 4]>) {
        self.with_locked(targets, |now, guards, located| {
            let probe = decide_all(guards, targets, located, now, false);
            let mut granted: SmallVec<[u64; 4]> = SmallVec::from_elem(0, targets.len());
            if !probe.allowed() {
                return (probe, granted);
            }
            let decisions = targets
                .iter()
                .zip(located)
                .zip(probe.iter())
                .enumerate()
                .map(|(i, ((target, at), before))| {
                    let want = if target.limit.algorithm().leases() {
                        extra.get(i).copied().unwrap_or(0)
                    } else {
                        0
                    };
                    let extra = lease_size(want, before.remaining(), target.cost);
                    granted[i] = extra;
                    let taking = Target {
                        cost: target.cost + extra,
                        ..*target
                    };
                    decide_in(guards.shard(at.shard), at, &taking, now, true, now)
                })
                .collect::<SmallVec<[Decision; 4]>>();
            (Decisions::new(decisions), granted)
        })
    }

    /// Gives back unused leased units ([`Backend::return_lease`]).
    fn release_targets(&self, targets: &[Target<'_>], at_micros: u64, stamps: &[u64]) {
        self.with_locked(targets, |now, guards, located| {
            for ((target, at), stamp) in targets.iter().zip(located).zip(stamps) {
                // Nothing to give back leaves the state as it is.
                if target.cost > 0 {
                    release_in(guards.shard(at.shard), at, target, now, at_micros, *stamp);
                }
            }
        });
    }

    /// Reserves the earliest slot every target allows within `max_wait` µs
    /// and commits each target as of it (see [`Backend::reserve`]).
    fn reserve_targets(&self, targets: &[Target<'_>], max_wait: u64) -> Reservation {
        self.with_locked(targets, |now, guards, located| {
            if targets.iter().any(|t| t.limit.is_in_flight()) {
                // A concurrency limit is never reserved (`Backend::reserve`
                // refuses it): refused, nothing changed.
                let refused: SmallVec<[Decision; 4]> = targets
                    .iter()
                    .zip(located)
                    .map(|(target, at)| {
                        let shard = guards.shard(at.shard);
                        let decision = decide_in(shard, at, target, now, false, now);
                        if target.limit.is_in_flight() {
                            decision.into_refused()
                        } else {
                            decision
                        }
                    })
                    .collect();
                let count = targets.len();
                return Reservation::new(
                    Decisions::new(refused),
                    now,
                    std::iter::repeat_n(false, count),
                );
            }
            let mut probe: SmallVec<[Decision; 4]> = SmallVec::new();
            let mut earliest: SmallVec<[u64; 4]> = SmallVec::new();
            let mut freed: SmallVec<[Freed; 4]> = SmallVec::new();
            for (target, at) in targets.iter().zip(located) {
                let shard = guards.shard(at.shard);
                let decision = decide_in(shard, at, target, now, false, now);
                let wait = micros(decision.retry_after());
                earliest.push(now.saturating_add(wait));
                freed.push(freed_of(shard, at, target, now));
                probe.push(decision);
            }
            let costs: SmallVec<[u64; 4]> = targets.iter().map(|t| t.cost).collect();
            let slot = choose_slot(&earliest, &freed, &costs);
            if slot.saturating_sub(now) > max_wait {
                let count = targets.len();
                return Reservation::new(
                    Decisions::new(probe),
                    now,
                    std::iter::repeat_n(false, count),
                );
            }
            let mut decisions: SmallVec<[Decision; 4]> = SmallVec::new();
            let mut took: SmallVec<[bool; 4]> = SmallVec::new();
            for ((target, at), freed) in targets.iter().zip(located).zip(&freed) {
                let shard = guards.shard(at.shard);
                if freed.has(slot, target.cost) {
                    take_freed(shard, at, target, slot);
                    let decision = decide_in(shard, at, target, slot, false, now);
                    decisions.push(decision.into_allowed());
                    took.push(true);
                } else {
                    decisions.push(decide_in(shard, at, target, slot, true, now));
                    took.push(false);
                }
            }
            Reservation::new(Decisions::new(decisions), now, took)
        })
    }

    /// Gives back an allowed reservation of these targets (see
    /// [`Backend::cancel`]).
    fn cancel_targets(&self, targets: &[Target<'_>], reservation: &Reservation) {
        let Some(slot) = reservation.slot_micros() else {
            return;
        };
        self.with_locked(targets, |now, guards, located| {
            for (index, (target, at)) in targets.iter().zip(located).enumerate() {
                if !target.limit.algorithm().reserves() {
                    // Never reserved (an in-flight limit, a window).
                    continue;
                }
                let Some(decision) = reservation.decisions().as_slice().get(index) else {
                    break;
                };
                let mark = slot.saturating_add(micros(decision.reset_after()));
                let shard = guards.shard(at.shard);
                let restored = !reservation.took_freed_slot(index)
                    && unreserve_in(shard, at, target, now, slot, mark);
                if !restored && slot > now {
                    give_back(shard, at, target, slot, now);
                }
            }
        });
    }

    fn refund_targets(&self, targets: &[Target<'_>], at_micros: u64) {
        self.with_locked(targets, |now, guards, located| {
            for (target, at) in targets.iter().zip(located) {
                refund_in(guards.shard(at.shard), at, target, now, at_micros);
            }
        });
    }

    fn charge_targets(&self, targets: &[Target<'_>]) {
        self.with_locked(targets, |now, guards, located| {
            for (target, at) in targets.iter().zip(located) {
                charge_in(guards.shard(at.shard), at, target, now);
            }
        });
    }

    fn hold_targets(&self, targets: &[Target<'_>], after: u64, left: u64) {
        self.with_locked(targets, |now, guards, located| {
            for (target, at) in targets.iter().zip(located) {
                hold_in(guards.shard(at.shard), at, target, now, after, left);
            }
        });
    }

    fn reset_targets(&self, targets: &[Target<'_>]) {
        self.with_locked(targets, |_, guards, located| {
            for (target, at) in targets.iter().zip(located) {
                let shard = guards.shard(at.shard);
                reset_in(shard, at, target);
                if !shard.freed.is_empty() {
                    shard
                        .freed
                        .remove(&(at.partition, Owned::of(target.key.identity)));
                }
            }
        });
    }

    /// Locks every shard the targets touch, in shard order, and runs `f`
    /// with the time, the guards and each target's location.
    fn with_locked<R>(
        &self,
        targets: &[Target<'_>],
        f: impl FnOnce(u64, &mut Locked<'_, Shard>, &[Located]) -> R,
    ) -> R {
        let located: SmallVec<[Located; 4]> = targets.iter().map(|t| self.locate(t)).collect();
        let mut guards = self.shards.lock(located.iter().map(|l| l.shard));
        let clock = self.clock.now_micros();
        let now = guards
            .iter_mut()
            .map(|shard| shard.last_now)
            .fold(clock, u64::max);
        for shard in guards.iter_mut() {
            shard.last_now = now;
        }
        f(now, &mut guards, &located)
    }
}

/// Extra units a lease takes: up to `want`, but at most half of what is left
/// once the call's own `cost` is taken from `remaining`, so that the last
/// units of a limit are shared between the processes asking for them
/// rather than stranded in one lease (the same rule as `lease.lua`).
pub(crate) fn lease_size(want: u64, remaining: u64, cost: u64) -> u64 {
    want.min(remaining.saturating_sub(cost) / 2)
}

mod backend;
mod block;
mod identity;
mod lines;
mod ops;
mod partitions;
mod rows;
mod sync;
mod tables;
#[cfg(test)]
mod tests;

use identity::{IPV4, IdentityForm, hash_of, sweep_table};
use lines::LineTable;
use ops::*;
use partitions::Partitions;
use rows::{PackedTat, Packing, Row};
use sync::targets;
use tables::{AllTables, Entry, Pick, RowTable, Side, Tabled};
