//! The in-memory store: the embedded default and the reference semantics.
//!
//! Layout, chosen for the hot path and for memory per identity:
//! - a fixed set of shards (cache-padded mutexes), chosen by the hash of
//!   (partition, identity), so calls on different identities rarely contend;
//! - in each shard, one hash table per kind of state ([`Tat`], [`Window`],
//!   [`Meter`], [`Log`], [`Slots`]) and per form of identity (a number, or
//!   text), so an identity costs what its algorithm needs (a GCRA identity
//!   that is a number: a 4-byte partition, the 8-byte number, the TAT, the
//!   interval it is measured in and when it was written, 40 bytes; as
//!   text: 56 bytes, the text inline up to 24 bytes);
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
use crate::model::clock::{Clock, SystemClock};
use crate::model::decision::{Decision, Decisions, Figures};
use crate::model::error::BackendError;
use crate::model::key::IdentityRef;
use crate::model::limit::{Algorithm, Limit};
use crate::model::reservation::Reservation;
use crate::store::Stored;
use crate::store::backend::{Backend, BoxFuture, LeaseReturn, Leased, Request, check_lease_batch};
use crate::store::reserve::{Freed, choose_slot};
use crate::store::sharded::{Hasher, Locked, Sharded};
use crate::store::target::{KeyRef, Op, Slot, Target};

/// What identifies a limit's state under a key ([`Limit::state_id`]).
type StateId = (Algorithm, u64, u64);

/// One identity's state under one partition.
#[derive(Debug)]
struct Entry<S, I> {
    partition: u32,
    identity: I,
    state: S,
}

/// How an entry holds its identity: a number as is (what most keys are),
/// text inline up to 24 bytes.
trait Held: Sized {
    /// Whether this is `identity`.
    fn is(&self, identity: IdentityRef<'_>) -> bool;
    /// The identity, held.
    fn hold(identity: IdentityRef<'_>) -> Self;
    /// The identity as the pipeline carries it.
    fn as_ref(&self) -> IdentityRef<'_>;
}

/// Numbers and IPv4 addresses share the number tables: an address is held
/// as its `u32` value under its partition tagged with [`IPV4`], so it never
/// meets the number of the same value (the partitions differ).
impl Held for u64 {
    #[inline]
    fn is(&self, identity: IdentityRef<'_>) -> bool {
        match identity {
            IdentityRef::Number(n) => n == *self,
            IdentityRef::Ipv4(ip) => u64::from(ip) == *self,
            IdentityRef::Text(_) => false,
        }
    }
    fn hold(identity: IdentityRef<'_>) -> Self {
        match identity {
            IdentityRef::Number(n) => n,
            IdentityRef::Ipv4(ip) => u64::from(ip),
            IdentityRef::Text(_) => unreachable!("text is held in the text tables"),
        }
    }
    /// As a number, even for an address: what [`hash_of`] hashes either by
    /// (the tagged partition tells them apart).
    fn as_ref(&self) -> IdentityRef<'_> {
        IdentityRef::Number(*self)
    }
}

/// The bit of a partition id that marks its IPv4 identities (held in the
/// number tables under `partition | IPV4`); partition ids stay below it.
const IPV4: u32 = 1 << 31;

impl Held for CompactString {
    #[inline]
    fn is(&self, identity: IdentityRef<'_>) -> bool {
        identity == IdentityRef::Text(self)
    }
    fn hold(identity: IdentityRef<'_>) -> Self {
        identity.with_text(|text| CompactString::new(text))
    }
    fn as_ref(&self) -> IdentityRef<'_> {
        IdentityRef::Text(self)
    }
}

/// The hash of an identity under a partition (what locates it, and what
/// its table rehashes it by).
#[inline]
fn hash_of(hasher: &Hasher, partition: u32, identity: IdentityRef<'_>) -> u64 {
    match identity {
        IdentityRef::Number(n) => hasher.hash_one((u64::from(partition) << 32) ^ n.rotate_left(32)),
        // The partition is tagged with `IPV4` (see `MemoryBackend::locate`).
        IdentityRef::Ipv4(ip) => {
            hasher.hash_one((u64::from(partition) << 32) ^ u64::from(ip).rotate_left(32))
        }
        IdentityRef::Text(text) => hasher.hash_one((partition, text)),
    }
}

/// A state kind with its tables in a shard.
trait Tabled: State {
    fn table<I>(tables: &mut Tables<I>) -> &mut HashTable<Entry<Self, I>>;
}

macro_rules! tabled {
    ($($state:ty => $field:ident),* $(,)?) => {
        /// Identities held one way, one table per kind of state.
        struct Tables<I> {
            $($field: HashTable<Entry<$state, I>>,)*
        }

        impl<I> Default for Tables<I> {
            fn default() -> Self {
                Self { $($field: HashTable::new(),)* }
            }
        }

        impl<I> Tables<I> {
            fn len(&self) -> usize {
                0 $(+ self.$field.len())*
            }

            /// Drops every idle state; returns how many.
            fn sweep(&mut self, now: u64) -> usize {
                let before = self.len();
                $(self.$field.retain(|entry| !entry.state.is_idle(now));)*
                before - self.len()
            }
        }

        $(impl Tabled for $state {
            fn table<I>(tables: &mut Tables<I>) -> &mut HashTable<Entry<Self, I>> {
                &mut tables.$field
            }
        })*
    };
}

tabled! {
    Tat => gcra,
    Window => window,
    Meter => meter,
    Log => log,
    Slots => slots,
    Flight => flight,
}

/// Every identity of a shard: numbers and text apart.
#[derive(Default)]
struct AllTables {
    numbers: Tables<u64>,
    texts: Tables<CompactString>,
}

impl AllTables {
    fn len(&self) -> usize {
        self.numbers.len() + self.texts.len()
    }

    fn sweep(&mut self, now: u64) -> usize {
        self.numbers.sweep(now) + self.texts.sweep(now)
    }
}

struct Shard {
    tables: AllTables,
    /// The store's hasher, to rehash entries when a table grows.
    hasher: Hasher,
    /// Sweep idle states when the shard grows past this size.
    sweep_at: usize,
    /// The latest time this shard decided at: a clock stepping back never
    /// makes a state look older than it is. A reservation's slot, later
    /// than now, never moves it.
    last_now: u64,
    /// Slots given back by cancelled reservations that were no longer the
    /// last of their queue, by partition and identity (rare: kept apart
    /// from the states, which stay compact).
    freed: HashMap<(u32, Owned), Freed>,
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

/// The partitions of a store: `(key head, state id)` to a `u32`.
#[derive(Default)]
struct Partitions {
    ids: RwLock<HashMap<(Box<str>, StateId), u32>>,
}

/// A borrowed partition name, to look one up without allocating.
#[derive(Hash)]
struct PartitionRef<'a>(&'a str, StateId);

impl Equivalent<(Box<str>, StateId)> for PartitionRef<'_> {
    fn equivalent(&self, key: &(Box<str>, StateId)) -> bool {
        *key.0 == *self.0 && key.1 == self.1
    }
}

/// The partition this thread looked up last: its store, name and id.
/// Partitions are never removed, so a hit stays right; it spares the shared
/// lock (whose reader count every core would write) on each call that comes
/// without a prebuilt [`Slot`].
type LastPartition = Option<(NonZeroU32, Box<str>, StateId, u32)>;

thread_local! {
    static LAST_PARTITION: std::cell::RefCell<LastPartition> = const { std::cell::RefCell::new(None) };
}

impl Partitions {
    /// [`Partitions::get_or_insert`] of store `store`, through this
    /// thread's last lookup.
    fn get_cached(&self, store: NonZeroU32, head: &str, state: StateId) -> u32 {
        LAST_PARTITION.with(|last| {
            let mut last = last.borrow_mut();
            if let Some((s, h, st, id)) = last.as_ref()
                && *s == store
                && *st == state
                && **h == *head
            {
                return *id;
            }
            let id = self.get_or_insert(head, state);
            *last = Some((store, head.into(), state, id));
            id
        })
    }

    fn get_or_insert(&self, head: &str, state: StateId) -> u32 {
        let name = PartitionRef(head, state);
        if let Some(id) = self.ids.read().get(&name) {
            return *id;
        }
        let mut ids = self.ids.write();
        // Below the `IPV4` tag (2^31 partitions: never reached in practice).
        let next = u32::try_from(ids.len()).map_or(IPV4 - 1, |n| n.min(IPV4 - 1));
        *ids.entry((head.into(), state)).or_insert(next)
    }

    fn len(&self) -> usize {
        self.ids.read().len()
    }
}

/// An in-process backend with the same semantics as the Redis backend.
///
/// - Sharded (64 cache-padded shards per core): an identity's shard is
///   chosen by hash, so calls on different identities rarely contend, and
///   a multi-key decision locks its shards in order.
/// - Compact: one table per kind of state and form of identity; a GCRA
///   identity that is a number takes 40 bytes of table, one that is text
///   56 bytes (text inline up to 24 bytes).
/// - Bounded: every state expires when it becomes equivalent to a fresh one;
///   a shard sweeps idle states whenever it has doubled since its last
///   sweep, so rotating keys cannot grow memory without bound. A refused
///   call or a peek never adds an identity.
/// - Allocation-free on the hot path once an identity exists.
///
/// ```
/// use ratewall::{Backend, Key, Limit, ManualClock, MemoryBackend, Request};
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

    /// A backend on the given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::with_shared_clock(Arc::new(clock))
    }

    /// A backend on a shared clock.
    pub fn with_shared_clock(clock: Arc<dyn Clock>) -> Self {
        let shards = Sharded::per_core(64, |hasher| {
            Mutex::new(Shard {
                tables: AllTables::default(),
                hasher: hasher.clone(),
                sweep_at: MIN_SWEEP,
                last_now: 0,
                freed: HashMap::new(),
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
        }
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
                let mut shard = shard.lock();
                sweep_freed(&mut shard.freed, now);
                shard.tables.sweep(now)
            })
            .sum();
        let replies: usize = self.replies.iter().map(|r| r.lock().sweep(now)).sum();
        states + replies
    }

    /// The slot of `key`'s state under `limit` in this store (what a
    /// resolved call caches).
    pub(crate) fn slot(&self, head: &str, limit: &Limit) -> Slot {
        Slot {
            store: self.id,
            partition: self.partitions.get_or_insert(head, limit.state_id()),
        }
    }

    #[inline]
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
            Op::Peek => Stored::Decided(self.decide_targets(targets, false)),
            Op::Refund(at) => {
                self.refund_targets(targets, at);
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
    #[inline]
    pub(crate) fn acquire_target(&self, target: &Target<'_>) -> Decision {
        let at = self.locate(target);
        let clock = self.clock.now_micros();
        let mut shard = self.shards.at(at.shard).lock();
        let now = shard.now(clock);
        decide_in(&mut shard, &at, target, now, true, now)
    }

    #[inline]
    pub(crate) fn acquire_targets(&self, targets: &[Target<'_>]) -> Decisions {
        if let [one] = targets {
            return Decisions::one(self.acquire_target(one));
        }
        self.with_locked(targets, |now, guards, located| {
            let probe = decide_all(guards, targets, located, now, false);
            if !probe.allowed() {
                return probe;
            }
            decide_all(guards, targets, located, now, true)
        })
    }

    fn decide_targets(&self, targets: &[Target<'_>], commit: bool) -> Decisions {
        self.with_locked(targets, |now, guards, located| {
            decide_all(guards, targets, located, now, commit)
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
            let at = decisions.iter().map(|d| d.at_micros).max().unwrap_or(now);
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
                    .map(|d| d.at_micros)
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
                    let extra = lease_size(want, before.remaining, target.cost);
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
                        let mut decision = decide_in(shard, at, target, now, false, now);
                        decision.allowed &= !target.limit.is_in_flight();
                        decision
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
                let wait = u64::try_from(decision.retry_after.as_micros()).unwrap_or(u64::MAX);
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
                    let mut decision = decide_in(shard, at, target, slot, false, now);
                    decision.allowed = true;
                    decision.retry_after = std::time::Duration::ZERO;
                    decisions.push(decision);
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
                let mark = slot.saturating_add(
                    u64::try_from(decision.reset_after.as_micros()).unwrap_or(u64::MAX),
                );
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

/// The targets of `requests`, whose keys they borrow.
fn targets<'a>(requests: &'a [Request<'a>]) -> SmallVec<[Target<'a>; 4]> {
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
    /// use ratewall::{Key, Limit, MemoryBackend, Request};
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
        self.acquire_targets_once(&targets(requests), request_id)
    }

    /// Evaluates a batch synchronously without consuming.
    pub fn peek_sync(&self, requests: &[Request<'_>]) -> Decisions {
        self.decide_targets(&targets(requests), false)
    }

    /// Refunds a batch synchronously.
    pub fn refund_sync(&self, requests: &[Request<'_>], at_micros: u64) {
        self.refund_targets(&targets(requests), at_micros);
    }

    /// Resets a batch synchronously.
    pub fn reset_sync(&self, requests: &[Request<'_>]) {
        self.reset_targets(&targets(requests));
    }

    /// Reserves a slot for a waiting call synchronously, as
    /// [`Backend::reserve`] (`max_wait` in µs). The batch is not validated
    /// here ([`Backend::reserve`] does).
    ///
    /// ```
    /// use ratewall::{Algorithm, Key, Limit, ManualClock, MemoryBackend, Request};
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
    /// use ratewall::{Key, Limit, MemoryBackend, Request};
    /// let backend = MemoryBackend::new();
    /// let limit = Limit::per_minute(100).unwrap().with_algorithm(ratewall::Algorithm::FixedWindow).unwrap();
    /// let key = Key::new("rl", "api", "tenant-1");
    /// let leased = backend.acquire_lease_sync(&[Request::new(&key, &limit, 1)], &[10]);
    /// assert!(leased.decisions.allowed());
    /// assert_eq!(leased.granted, [10]); // the call's unit and 10 more are taken
    /// assert_eq!(leased.decisions.binding().remaining, 89);
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

/// Extra units a lease takes: up to `want`, but at most half of what is left
/// once the call's own `cost` is taken from `remaining`, so that the last
/// units of a limit are shared between the processes asking for them
/// rather than stranded in one lease (the same rule as `lease.lua`).
pub(crate) fn lease_size(want: u64, remaining: u64, cost: u64) -> u64 {
    want.min(remaining.saturating_sub(cost) / 2)
}

/// Decides every target against its state, in order.
fn decide_all(
    guards: &mut Locked<'_, Shard>,
    targets: &[Target<'_>],
    located: &[Located],
    now: u64,
    commit: bool,
) -> Decisions {
    Decisions::new(
        targets
            .iter()
            .zip(located)
            .map(|(target, at)| decide_in(guards.shard(at.shard), at, target, now, commit, now)),
    )
}

/// Runs `$body` with `$state` the memory store's state type of
/// `$algorithm`: the store's one table of algorithms. Exhaustive: a new
/// algorithm does not compile until it has a row here.
macro_rules! with_state {
    ($algorithm:expr, $state:ident => $body:expr) => {
        match $algorithm {
            Algorithm::FixedWindow => {
                type $state = Window;
                $body
            }
            Algorithm::SlidingLog => {
                type $state = Log;
                $body
            }
            Algorithm::SlidingWindow => {
                type $state = Slots;
                $body
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                type $state = Meter;
                $body
            }
            Algorithm::Gcra => {
                type $state = Tat;
                $body
            }
            Algorithm::InFlight => {
                type $state = Flight;
                $body
            }
        }
    };
}

/// Decides one target in its (locked) shard at `now` (a reservation's slot
/// may be later than the shard's time, `clock`, which a new identity's
/// insertion sweeps by).
fn decide_in(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    commit: bool,
    clock: u64,
) -> Decision {
    with_state!(target.limit.algorithm(), S => decide::<S>(shard, at, target, now, commit, clock))
}

/// Takes back a reservation if it is still the last one of its queue.
fn unreserve_in(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    slot: u64,
    mark: u64,
) -> bool {
    if !target.limit.algorithm().reserves() {
        return false;
    }
    with_state!(target.limit.algorithm(), S => unreserve::<S>(shard, at, target, now, slot, mark))
}

fn unreserve<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    slot: u64,
    mark: u64,
) -> bool {
    change::<S>(shard, at, target, now, |state| {
        state.unreserve(target.limit, now, slot, mark, target.cost)
    })
}

/// The slots given back under a target's state that are still ahead (drops
/// the ones already past).
fn freed_of(shard: &mut Shard, at: &Located, target: &Target<'_>, now: u64) -> Freed {
    if shard.freed.is_empty() {
        return Freed::default();
    }
    let key = (at.partition, Owned::of(target.key.identity));
    let Some(freed) = shard.freed.get_mut(&key) else {
        return Freed::default();
    };
    freed.drop_before(now);
    let kept = freed.clone();
    if freed.is_empty() {
        shard.freed.remove(&key);
    }
    kept
}

/// Takes a target's cost from the slot given back at `slot`.
fn take_freed(shard: &mut Shard, at: &Located, target: &Target<'_>, slot: u64) {
    let key = (at.partition, Owned::of(target.key.identity));
    if let Some(freed) = shard.freed.get_mut(&key) {
        freed.take(slot, target.cost);
        if freed.is_empty() {
            shard.freed.remove(&key);
        }
    }
}

/// Records a target's cost as given back at `slot`.
fn give_back(shard: &mut Shard, at: &Located, target: &Target<'_>, slot: u64, now: u64) {
    if shard.freed.len() >= shard.sweep_at {
        sweep_freed(&mut shard.freed, now);
    }
    shard
        .freed
        .entry((at.partition, Owned::of(target.key.identity)))
        .or_default()
        .give(slot, target.cost);
}

/// Drops every given-back slot already past.
fn sweep_freed(freed: &mut HashMap<(u32, Owned), Freed>, now: u64) {
    freed.retain(|_, slots| {
        slots.drop_before(now);
        !slots.is_empty()
    });
}

fn refund_in(shard: &mut Shard, at: &Located, target: &Target<'_>, now: u64, at_micros: u64) {
    with_state!(target.limit.algorithm(), S => refund::<S>(shard, at, target, now, at_micros))
}

fn release_in(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    at_micros: u64,
    stamp: u64,
) {
    let release = Release { at_micros, stamp };
    // Only leased units are released; an algorithm that cannot lease has
    // none.
    if !target.limit.algorithm().leases() {
        return;
    }
    with_state!(target.limit.algorithm(), S => release_state::<S>(shard, at, target, now, release))
}

/// The lease a release gives units back to.
#[derive(Clone, Copy)]
struct Release {
    at_micros: u64,
    stamp: u64,
}

fn release_state<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    release: Release,
) {
    change::<S>(shard, at, target, now, |state| {
        state.release(
            target.limit,
            now,
            target.cost,
            release.at_micros,
            release.stamp,
        );
        true
    });
}

fn reset_in(shard: &mut Shard, at: &Located, target: &Target<'_>) {
    with_state!(target.limit.algorithm(), S => reset::<S>(shard, at, target))
}

fn matches<S, I: Held>(at: &Located, identity: IdentityRef<'_>) -> impl Fn(&Entry<S, I>) -> bool {
    move |entry| entry.partition == at.partition && entry.identity.is(identity)
}

fn decide<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    commit: bool,
    clock: u64,
) -> Decision {
    match target.key.identity {
        IdentityRef::Number(_) | IdentityRef::Ipv4(_) => {
            decide_held::<S, u64>(shard, at, target, now, commit, clock)
        }
        IdentityRef::Text(_) => {
            decide_held::<S, CompactString>(shard, at, target, now, commit, clock)
        }
    }
}

/// Which of a shard's tables holds identities as `I`.
trait Side: Held {
    fn tables(all: &mut AllTables) -> &mut Tables<Self>;
}

impl Side for u64 {
    fn tables(all: &mut AllTables) -> &mut Tables<Self> {
        &mut all.numbers
    }
}

impl Side for CompactString {
    fn tables(all: &mut AllTables) -> &mut Tables<Self> {
        &mut all.texts
    }
}

#[inline]
fn decide_held<S: Tabled, I: Side>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    commit: bool,
    clock: u64,
) -> Decision {
    let identity = target.key.identity;
    let table = S::table(I::tables(&mut shard.tables));
    if let Some(entry) = table.find_mut(at.hash, matches::<S, I>(at, identity)) {
        return entry.state.decide(target.limit, now, target.cost, commit);
    }
    let mut state = S::default();
    let decision = state.decide(target.limit, now, target.cost, commit);
    if commit && !state.is_idle(now) {
        insert::<S, I>(shard, at, identity, state, clock);
    }
    decision
}

/// Adds a new identity's state, sweeping idle ones first when the shard
/// has doubled since its last sweep.
fn insert<S: Tabled, I: Side>(
    shard: &mut Shard,
    at: &Located,
    identity: IdentityRef<'_>,
    state: S,
    now: u64,
) {
    if shard.tables.len() >= shard.sweep_at {
        shard.tables.sweep(now);
        sweep_freed(&mut shard.freed, now);
        shard.sweep_at = (shard.tables.len() * 2).max(MIN_SWEEP);
    }
    let partition = at.partition;
    let entry = Entry {
        partition,
        identity: I::hold(identity),
        state,
    };
    // An entry's hash is recomputed from what it holds when its table grows
    // (kept out of the entry to keep it small); as in `MemoryBackend::locate`.
    let hasher = shard.hasher.clone();
    S::table(I::tables(&mut shard.tables)).insert_unique(at.hash, entry, move |e| {
        hash_of(&hasher, e.partition, e.identity.as_ref())
    });
}

fn refund<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    at_micros: u64,
) {
    change::<S>(shard, at, target, now, |state| {
        state.refund(target.limit, now, target.cost, at_micros);
        true
    });
}

/// Applies `apply` to the state `target` names, when there is one, and
/// drops that state when the change left it idle; whether `apply` said it
/// changed it (a state it did not change is kept as it is).
fn change<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    apply: impl FnOnce(&mut S) -> bool,
) -> bool {
    match target.key.identity {
        IdentityRef::Number(_) | IdentityRef::Ipv4(_) => {
            change_held::<S, u64>(shard, at, target, now, apply)
        }
        IdentityRef::Text(_) => change_held::<S, CompactString>(shard, at, target, now, apply),
    }
}

fn change_held<S: Tabled, I: Side>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    apply: impl FnOnce(&mut S) -> bool,
) -> bool {
    let table = S::table(I::tables(&mut shard.tables));
    let Ok(mut found) = table.find_entry(at.hash, matches::<S, I>(at, target.key.identity)) else {
        return false;
    };
    let entry = found.get_mut();
    if !apply(&mut entry.state) {
        return false;
    }
    if entry.state.is_idle(now) {
        found.remove();
    }
    true
}

fn reset<S: Tabled>(shard: &mut Shard, at: &Located, target: &Target<'_>) {
    match target.key.identity {
        IdentityRef::Number(_) | IdentityRef::Ipv4(_) => reset_held::<S, u64>(shard, at, target),
        IdentityRef::Text(_) => reset_held::<S, CompactString>(shard, at, target),
    }
}

fn reset_held<S: Tabled, I: Side>(shard: &mut Shard, at: &Located, target: &Target<'_>) {
    let table = S::table(I::tables(&mut shard.tables));
    if let Ok(found) = table.find_entry(at.hash, matches::<S, I>(at, target.key.identity)) {
        found.remove();
    }
}

impl Backend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = Request::check_batch(requests)
            .map_err(BackendError::Invalid)
            .map(|()| self.acquire_sync(requests));
        Box::pin(std::future::ready(result))
    }

    fn acquire_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = Request::check_batch(requests)
            .map_err(BackendError::Invalid)
            .and_then(|()| self.acquire_once_sync(requests, request_id));
        Box::pin(std::future::ready(result))
    }

    fn cancel_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.cancel_once_sync(requests, request_id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = Request::check_batch(requests)
            .map_err(BackendError::Invalid)
            .map(|()| self.peek_sync(requests));
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

    fn acquire_lease<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        extra: &'a [u64],
        _ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<Leased, BackendError>> {
        let result =
            check_lease_batch(requests, extra).map(|()| self.acquire_lease_sync(requests, extra));
        Box::pin(std::future::ready(result))
    }

    fn return_lease<'a>(
        &'a self,
        returns: &'a [LeaseReturn<'a>],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.return_lease_sync(returns);
        Box::pin(std::future::ready(Ok(())))
    }

    fn cancels_once(&self) -> bool {
        true
    }

    fn reserves(&self) -> bool {
        true
    }

    fn reserve<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        max_wait: std::time::Duration,
    ) -> BoxFuture<'a, Result<Reservation, BackendError>> {
        let max_wait = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        let result = Request::check_reservation(requests)
            .map_err(BackendError::Invalid)
            .map(|()| self.reserve_sync(requests, max_wait));
        Box::pin(std::future::ready(result))
    }

    fn cancel<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        reservation: &'a Reservation,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.cancel_sync(requests, reservation);
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::clock::ManualClock;
    use crate::model::key::Key;

    #[test]
    fn an_identity_entry_is_small() {
        assert_eq!(std::mem::size_of::<Entry<Tat, u64>>(), 40);
        assert_eq!(std::mem::size_of::<Entry<Tat, CompactString>>(), 56);
        assert!(std::mem::size_of::<Entry<Window, CompactString>>() <= 48);
    }

    #[test]
    fn refused_calls_and_peeks_add_no_identity() {
        let store = MemoryBackend::with_clock(ManualClock::new(1_000_000));
        let limit = Limit::per_minute(1).unwrap();
        let key = Key::new("rl", "s", "a");
        let req = [Request::new(&key, &limit, 1)];
        assert!(store.peek_sync(&req).allowed());
        assert_eq!(store.len(), 0);
        assert!(store.acquire_sync(&req).allowed());
        assert!(!store.acquire_sync(&req).allowed());
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn tables_grow_past_many_identities_and_keep_every_state() {
        let store = MemoryBackend::with_clock(ManualClock::new(1_000_000));
        let limit = Limit::per_minute(1).unwrap();
        let keys: Vec<Key> = (0..5_000u32)
            .map(|i| Key::from_display("rl", "s", &i))
            .collect();
        for key in &keys {
            assert!(store.acquire_one(&Request::new(key, &limit, 1)).allowed);
        }
        for key in &keys {
            assert!(!store.acquire_one(&Request::new(key, &limit, 1)).allowed);
        }
        assert_eq!(store.len(), 5_000);
    }

    #[test]
    fn an_address_shares_state_with_its_text_and_never_with_the_number_of_its_value() {
        use crate::model::key::{Identity, Part};
        use crate::store::target::{KeyRef, Op, Target};
        let store = MemoryBackend::with_clock(ManualClock::new(1_000_000));
        let limit = Limit::per_minute(1).unwrap();
        let head = "rl:{s:";
        let acquire = |identity: Identity| {
            let target = Target {
                name: "s",
                key: KeyRef {
                    head,
                    identity: identity.as_ref(),
                },
                limit: &limit,
                cost: 1,
                slot: None,
                lease: 0,
            };
            let Ok(Stored::Decided(decisions)) = store.run(Op::Acquire, &[target]) else {
                panic!("an acquire decides");
            };
            decisions.allowed()
        };
        let address = std::net::Ipv4Addr::new(0, 0, 0, 5);
        assert!(acquire(Identity::of(Part::Ip(address.into()))));
        // The number 5 is another identity, with its own state.
        assert!(acquire(Identity::of(Part::Unsigned(5))));
        // The address however given: its text, a key, its `Display`.
        assert!(!acquire(Identity::of(Part::Text("0.0.0.5"))));
        assert!(!acquire(Identity::render(&address)));
        let key = Key::new("rl", "s", "0.0.0.5");
        assert!(!store.acquire_one(&Request::new(&key, &limit, 1)).allowed);
        assert!(!acquire(Identity::of(Part::Unsigned(5))));
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn one_identity_under_two_scopes_or_two_limits_has_two_states() {
        let store = MemoryBackend::with_clock(ManualClock::new(1_000_000));
        let minute = Limit::per_minute(1).unwrap();
        let hour = Limit::per_hour(1).unwrap();
        let a = Key::new("rl", "a", "x");
        let b = Key::new("rl", "b", "x");
        for (key, limit) in [(&a, &minute), (&b, &minute), (&a, &hour)] {
            assert!(store.acquire_one(&Request::new(key, limit, 1)).allowed);
        }
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn two_stores_used_in_turn_by_one_thread_keep_their_own_partitions() {
        // Each store numbers its partitions from 0: a lookup cached for one
        // store must never answer for the other.
        let first = MemoryBackend::with_clock(ManualClock::new(1_000_000));
        let second = MemoryBackend::with_clock(ManualClock::new(1_000_000));
        let limit = Limit::per_minute(1).unwrap();
        let a = Key::new("rl", "a", "x");
        let b = Key::new("rl", "b", "x");
        assert!(first.acquire_one(&Request::new(&a, &limit, 1)).allowed);
        assert!(second.acquire_one(&Request::new(&b, &limit, 1)).allowed);
        assert!(first.acquire_one(&Request::new(&b, &limit, 1)).allowed);
        assert!(second.acquire_one(&Request::new(&a, &limit, 1)).allowed);
        for store in [&first, &second] {
            assert!(!store.acquire_one(&Request::new(&a, &limit, 1)).allowed);
            assert!(!store.acquire_one(&Request::new(&b, &limit, 1)).allowed);
            assert_eq!(store.len(), 2);
        }
    }
}
