//! Quota leasing: a hot identity's calls decided in process from units
//! reserved in the store, instead of one round trip each.
//!
//! For a limit with a lease size ([`Limit::with_lease`], `lease = N` in the
//! macro), this layer watches each identity's rate of calls. A cold identity
//! (under about 80 units a second) is decided by the store as before. A hot
//! one asks, with the acquire that reaches the store anyway, for a lease of
//! more units ([`Backend::acquire_lease`]): about a tenth of the lease TTL's
//! worth of its rate, at most `N`, and never more than half of what the
//! store has left (so the last units of a limit are shared, not stranded in
//! one process). The store takes the call's cost and the leased units in
//! one atomic step; the next calls are admitted from the lease in process,
//! all-or-nothing over every limit of the call. When a lease is half spent,
//! the next one is taken ahead, by a task on the runtime, so that callers
//! do not wait for it; it is sized so that it and what is left of the
//! current one stay within one lease's bound (`N`, the TTL's worth of
//! refill): a process never holds more than `N` unused units. A call that needs a limit without a live lease goes
//! to the store as one round trip, as before.
//!
//! **Never more than the limit.** A leased unit is taken in the store when
//! it is leased, so the store never admits it twice. It is used only while
//! using it then is something the algorithm allows: in the window it was
//! taken in (`fixed_window`), in its slot (`sliding_window`), and no later
//! than its theoretical arrival time (`gcra`, `token_bucket`,
//! `leaky_bucket`: unit `k` of a lease is scheduled `k` emission intervals
//! after the one before it); and never after the lease's TTL. The cost is
//! that units leased to one process cannot serve another: with `n`
//! processes, up to `(n − 1) × N` units can sit unused in the other
//! processes' leases while one is refused.
//!
//! **Giving back.** Unused units go back to the store when the lease's TTL
//! ends, when the identity has made no call for two tenths of the TTL, when
//! its limits change, when a lease taken ahead replaces a lease that could
//! not serve a call's cost, and on [`crate::Limiter::shutdown`]; a
//! background task (on the Tokio runtime of the first call that leased)
//! does it. Without a Tokio runtime, nothing leases.
//! Window algorithms give back into the lease's window or slot; GCRA and the
//! buckets only while no other call has written the state since the lease
//! (then the unused units are exactly the last ones scheduled), otherwise
//! they stay taken until time passes them. A process that dies (or a
//! limiter dropped without `shutdown`) gives nothing back: its units count
//! as used, so a window's return at its end, and a bucket's within the
//! lease TTL (a lease never spans more than the TTL's worth of refill).
//!
//! **Waiting at the limit.** When a take gets fewer units than it asked for
//! (the limit is nearly spent) or is refused, the identity's calls are
//! refused in process, once its lease is spent, for the time the missing
//! units take to come back at the limit's rate (at most a fortieth of the
//! TTL), or the refusal's `retry_after` if longer (at most the TTL), and
//! then while the next take is on its way. The units it did not get stay in
//! the store for the next take (or for other processes), so a saturating
//! identity costs one round trip per take, not per refusal; the price is
//! that such a refusal may come while the store still has a few units.
//!
//! Local decisions pass every layer above this one (observe counts them
//! with `source="lease"`, lists and validation apply as usual); shadowed
//! names, idempotent and raw `acquire_all` calls do not lease.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hashbrown::HashTable;
use parking_lot::Mutex;
use smallvec::SmallVec;

use super::{Answer, Call, Layer, Plan, Source};
use crate::model::clock::micros;
use crate::model::decision::{Decision, Decisions, Figures};
use crate::model::key::Key;
use crate::model::limit::{Algorithm, Limit};
use crate::model::settings::Registry;
use crate::store::Ask;
use crate::store::backend::{Backend, LeaseReturn, Leased, Request};
use crate::store::sharded::{Hasher, Locked, Sharded};
use crate::store::target::{KeyRef, Op, Target};

/// The default lease TTL: 1 s.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(1);

/// A lease asks for this many units at least: an identity whose rate gives
/// fewer per tenth of the TTL is cold and decided by the store.
const MIN_LEASE: u64 = 8;

/// A rate sample covers at least this long (ns)...
const RATE_WINDOW: u64 = 50_000_000;

/// ...unless it already holds this many units (and 1 ms), so that a hot
/// identity is recognised within a few hundred calls.
const RATE_QUICK_UNITS: u64 = 256;

/// An identity without a lease that made no call for this long (ns) is
/// forgotten when its shard needs room.
const FORGET_AFTER: u64 = 1_000_000_000;

/// Identities watched at most (per limiter); beyond, new ones are cold.
const CAPACITY: usize = 65_536;

/// What a lease layer is configured with (derived from the TTL).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// A lease is used for this long at most (ns).
    ttl: u64,
    /// A lease is sized to last this long at the identity's rate (ns).
    hold: u64,
    /// A lease unused for this long is given back (ns).
    idle: u64,
    /// The longest wait after a take that found the limit nearly spent (ns).
    backoff: u64,
    /// How often the background task looks for leases to give back.
    tick: Duration,
}

impl Timing {
    pub(crate) fn new(ttl: Duration) -> Self {
        let ttl = u64::try_from(ttl.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1_000_000);
        Self {
            ttl,
            hold: ttl / 10,
            idle: ttl / 5,
            backoff: ttl / 40,
            tick: Duration::from_nanos(ttl / 20),
        }
    }
}

/// Units leased for one identity under one limit, held by this process.
#[derive(Debug, Clone, Copy)]
struct Lease {
    /// The limit it was taken under.
    limit: Limit,
    /// Units left.
    units: u64,
    /// The take's decision time in the store (µs) and its stamp.
    at: u64,
    stamp: u64,
    /// When the take was sent (ns on the layer's clock): the store decided
    /// after it, so times derived from it are never late.
    sent: u64,
    /// No local use from then on (ns): the TTL.
    ends: u64,
    /// The deadline of the last unit (ns): the window's or slot's end, or
    /// the theoretical arrival time of the last unit taken.
    top: u64,
    /// Between two units' deadlines (ns): the emission interval for GCRA
    /// and the buckets, 0 for the windows (one deadline for all).
    spacing: u64,
    /// What the store had left after the take.
    room: u64,
    /// The units the store granted (names the lease's record there).
    granted: u64,
    /// The units the lease started with.
    initial: u64,
    /// The take's `reset_after` (µs).
    reset_after: u64,
}

impl Lease {
    /// The lease of `units` units (`granted` of them granted beyond the
    /// take's cost) from a take answered with `decision`.
    fn new(
        limit: &Limit,
        decision: &Decision,
        units: u64,
        granted: u64,
        sent: u64,
        timing: &Timing,
    ) -> Self {
        let reset_after = micros(decision.reset_after());
        let due = |us: u64| sent.saturating_add(us.saturating_mul(1_000));
        let (top, spacing) = match limit.algorithm() {
            Algorithm::FixedWindow => (due(reset_after), 0),
            Algorithm::SlidingWindow => {
                let size = limit.period_micros() / limit.slots();
                let slot_end = (decision.at_micros() / size + 1) * size;
                (due(slot_end - decision.at_micros()), 0)
            }
            // The last unit's theoretical arrival time is the state's new
            // expiry (1 µs early: the meters round it up); unit `k` below
            // it is due `k` intervals (rounded up) earlier. (The sliding log
            // and in-flight limits never lease.)
            Algorithm::Gcra
            | Algorithm::TokenBucket
            | Algorithm::LeakyBucket
            | Algorithm::SlidingLog
            | Algorithm::InFlight => (
                due(reset_after.saturating_sub(1)),
                limit.emission_interval_micros().saturating_mul(1_000),
            ),
        };
        Self {
            limit: *limit,
            units,
            at: decision.at_micros(),
            stamp: Leased::stamp(decision),
            sent,
            ends: sent.saturating_add(timing.ttl),
            top,
            spacing,
            room: decision.remaining(),
            granted,
            initial: units,
            reset_after,
        }
    }

    /// Units the algorithm still allows at `now` (the lowest ones expire
    /// first), whatever the TTL.
    fn valid(&self, now: u64) -> u64 {
        if now > self.top {
            return 0;
        }
        if self.spacing == 0 {
            return self.units;
        }
        self.units.min((self.top - now) / self.spacing + 1)
    }

    /// Units this process may still hand out at `now`.
    fn usable(&self, now: u64) -> u64 {
        if now >= self.ends { 0 } else { self.valid(now) }
    }

    /// The decision of a call admitted from this lease at `now`.
    fn admitted(&self, now: u64) -> Decision {
        let elapsed_us = now.saturating_sub(self.sent) / 1_000;
        Decision::new(Figures {
            allowed: true,
            limit: self.limit.capacity(),
            remaining: self.units.saturating_add(self.room),
            retry_after_us: 0,
            reset_after_us: self.reset_after.saturating_sub(elapsed_us),
            at_micros: self.at,
        })
    }
}

/// A lease on its way back to the store.
#[derive(Debug)]
struct Pending {
    key: Key,
    name: Box<str>,
    held: Lease,
}

/// Leases retired while a shard is locked, given back once it is not.
type Retired = SmallVec<[Pending; 1]>;

/// What this process knows of one identity under one limit.
#[derive(Debug)]
struct Watched {
    key: Key,
    /// The group's name (the metrics label).
    name: Box<str>,
    limit: Limit,
    /// The rate sample being taken: since when, how many units.
    sample_since: u64,
    sample_units: u64,
    /// Units per second, from the last samples.
    rate: f64,
    last_call: u64,
    /// When a take for this entry was sent and has not been answered (0:
    /// none). One take at a time; a stale one (cancelled) expires.
    taking: u64,
    /// The last take found the limit (nearly) spent: while the next take
    /// is on its way, calls without units are refused here.
    at_limit: bool,
    /// Refuse in process until then (ns) when there are no units.
    wait_until: u64,
    /// The refusal to report meanwhile (the store's figures).
    wait_decision: Decision,
    /// When `wait_decision` was made (ns).
    wait_since: u64,
    /// The lease calls are decided from.
    lease: Option<Lease>,
    /// The lease taken ahead (when the current one ran low), used next.
    next: Option<Lease>,
}

impl Watched {
    fn new(target: &Target<'_>, now: u64) -> Self {
        Self {
            key: target.key.render(),
            name: target.name.into(),
            limit: *target.limit,
            sample_since: now,
            sample_units: 0,
            rate: 0.0,
            last_call: now,
            taking: 0,
            at_limit: false,
            wait_until: 0,
            wait_decision: Decision::new(Figures::default()),
            wait_since: 0,
            lease: None,
            next: None,
        }
    }

    fn is(&self, key: &KeyRef<'_>, limit: &Limit) -> bool {
        self.key.head() == key.head
            && self.key.identity_ref() == key.identity
            && self.limit.state_id() == limit.state_id()
    }

    /// Counts a call of `cost` units at `now` in the rate sample.
    fn seen(&mut self, now: u64, cost: u64) {
        self.last_call = now;
        self.sample_units = self.sample_units.saturating_add(cost);
        let elapsed = now.saturating_sub(self.sample_since);
        if elapsed >= RATE_WINDOW || (self.sample_units >= RATE_QUICK_UNITS && elapsed >= 1_000_000)
        {
            let measured = self.sample_units as f64 * 1e9 / elapsed as f64;
            self.rate = if self.rate == 0.0 {
                measured
            } else {
                (self.rate + measured) / 2.0
            };
            self.sample_since = now;
            self.sample_units = 0;
        }
    }

    /// Whether a take is on its way (a stale one, whose call was
    /// cancelled, no longer counts).
    fn taking(&self, now: u64, timing: &Timing) -> bool {
        self.taking != 0 && now.saturating_sub(self.taking) < timing.ttl
    }

    /// Units to ask for with the next take at `now` (0: none).
    fn want(&self, now: u64, timing: &Timing, limit: &Limit) -> u64 {
        let Some(most) = limit.lease() else {
            return 0;
        };
        if self.taking(now, timing) {
            return 0;
        }
        let mut want = (self.rate * timing.hold as f64 / 1e9) as u64;
        if want < MIN_LEASE {
            return 0;
        }
        want = want.min(most);
        if limit.algorithm().uses_burst() {
            // A lease spans at most the TTL's worth of refill.
            let span = (timing.ttl / 1_000) / limit.emission_interval_micros().max(1);
            want = want.min(span);
        }
        if want < MIN_LEASE { 0 } else { want }
    }

    /// The units the current lease can hand out at `now`, after moving on
    /// to the lease taken ahead when the current one cannot serve `cost`
    /// (its unused units are retired, to be given back).
    fn serve(&mut self, now: u64, cost: u64, retired: &mut Retired) -> u64 {
        loop {
            let usable = match &mut self.lease {
                Some(held) => {
                    held.units = held.valid(now);
                    held.usable(now)
                }
                None => 0,
            };
            if usable >= cost {
                return usable;
            }
            let Some(next) = self.next.take() else {
                return usable;
            };
            if let Some(old) = self.lease.replace(next) {
                self.retire(old, now, retired);
            }
        }
    }

    /// Queues what `held` has left at `now` for giving back.
    fn retire(&self, held: Lease, now: u64, retired: &mut Retired) {
        let valid = held.valid(now);
        if valid > 0 {
            retired.push(Pending {
                key: self.key.clone(),
                name: self.name.clone(),
                held: Lease {
                    units: valid,
                    ..held
                },
            });
        }
    }

    /// Whether the identity waits at its limit at `now`.
    fn waits(&self, now: u64, timing: &Timing) -> bool {
        self.wait_until > now || (self.at_limit && self.taking(now, timing))
    }

    /// The refusal to report at `now` while waiting.
    fn waiting(&self, now: u64) -> Decision {
        let d = self.wait_decision;
        let elapsed = Duration::from_nanos(now.saturating_sub(self.wait_since));
        let retry =
            Duration::from_micros(self.wait_until.saturating_sub(now).div_ceil(1_000).max(1));
        d.refused_later(retry, elapsed)
    }

    /// Units held, usable at `now`, in both leases.
    fn outstanding(&self, now: u64) -> u64 {
        [self.lease, self.next]
            .iter()
            .flatten()
            .map(|h| h.usable(now))
            .sum()
    }
}

#[derive(Debug, Default)]
struct Shard {
    table: HashTable<Watched>,
    /// Whether an entry may hold a lease (the background task skips the
    /// shards without).
    leases: bool,
    sweep_at: usize,
}

impl Shard {
    /// The entry of `target`, found by its hash.
    fn get(&mut self, hash: u64, target: &Target<'_>) -> Option<&mut Watched> {
        self.table
            .find_mut(hash, |e| e.is(&target.key, target.limit))
    }
}

/// A take for one target, sent ahead while its lease still serves.
#[derive(Debug)]
struct Ahead {
    key: Key,
    name: Box<str>,
    limit: Limit,
    extra: u64,
}

/// The leases of one limiter, and the layer that decides from them.
#[derive(Debug)]
pub(crate) struct Leases {
    backend: Arc<dyn Backend>,
    registry: Arc<Registry>,
    timing: Timing,
    shards: Sharded<Mutex<Shard>>,
    shard_capacity: usize,
    epoch: Instant,
    pending: Mutex<Vec<Pending>>,
    /// Whether the background task runs (or could not be started).
    task: Mutex<Task>,
    /// After [`crate::Limiter::shutdown`]: no new lease, no local decision.
    closed: AtomicBool,
    /// Names whose gauge was set (to set it back to 0).
    gauged: Mutex<Vec<Box<str>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    NotStarted,
    Running,
    /// No Tokio runtime to run it on: no leasing.
    Unavailable,
}

/// The layer: an `Arc` of the leases, so the limiter can shut them down.
pub(crate) type LeaseLayer = Arc<Leases>;

/// One target's entry, located.
struct Found {
    shard: usize,
    hash: u64,
}

impl Leases {
    pub(crate) fn new(backend: Arc<dyn Backend>, registry: Arc<Registry>, ttl: Duration) -> Self {
        let shards = Sharded::per_core(16, |_| Mutex::new(Shard::default()));
        let count = shards.len();
        Self {
            backend,
            registry,
            timing: Timing::new(ttl),
            shards,
            shard_capacity: CAPACITY.div_ceil(count).max(1),
            epoch: Instant::now(),
            pending: Mutex::new(Vec::new()),
            task: Mutex::new(Task::NotStarted),
            closed: AtomicBool::new(false),
            gauged: Mutex::new(Vec::new()),
        }
    }

    /// Nanoseconds on the layer's monotonic clock.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn locate_key(&self, key: KeyRef<'_>, limit: &Limit) -> Found {
        let hash = self.shards.hash((key, limit.state_id()));
        Found {
            shard: self.shards.index(hash),
            hash,
        }
    }

    fn locate(&self, target: &Target<'_>) -> Found {
        self.locate_key(target.key, target.limit)
    }

    /// Whether every target leases (and none is shadowed).
    fn leasing(&self, call: &Call<'_>) -> bool {
        !call.targets.is_empty()
            && call.targets.iter().all(|t| t.limit.lease().is_some())
            && !(self.registry.any_shadow()
                && std::iter::once(call.name)
                    .chain(call.targets.iter().map(|t| t.name))
                    .any(|name| self.registry.shadowed(name)))
    }

    /// Whether leases can be taken: not shut down, and the background task
    /// that gives them back runs (started now if need be).
    fn can_take(self: &Arc<Self>) -> bool {
        if self.closed.load(Ordering::Relaxed) {
            return false;
        }
        let mut task = self.task.lock();
        match *task {
            Task::Running => true,
            Task::Unavailable => false,
            Task::NotStarted => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(background(Arc::downgrade(self)));
                    *task = Task::Running;
                    true
                }
                Err(_) => {
                    tracing::warn!(
                        "quota leasing needs a Tokio runtime to give unused units back; deciding every call in the store"
                    );
                    *task = Task::Unavailable;
                    false
                }
            },
        }
    }

    /// The locked shards of `found`, in shard order.
    fn lock(&self, found: &[Found]) -> Locked<'_, Shard> {
        self.shards.lock(found.iter().map(|f| f.shard))
    }

    /// An acquire on the way down: decided from leases, refused while
    /// waiting at the limit, or sent on with a lease asked for (or as is).
    fn acquire(self: &Arc<Self>, call: &mut Call<'_>) -> Option<Answer> {
        if self.closed.load(Ordering::Relaxed) {
            return None;
        }
        let now = self.now();
        let targets = call.targets;
        let found: SmallVec<[Found; 2]> = targets.iter().map(|t| self.locate(t)).collect();
        let mut guards = self.lock(&found);
        let mut retired = Retired::new();
        // Each target's entry, made when missing (a full shard leaves the
        // identity cold), with the call counted in its rate, and what its
        // lease can hand out.
        let mut usable: SmallVec<[u64; 2]> = SmallVec::new();
        for (target, at) in targets.iter().zip(&found) {
            let shard = guards.shard(at.shard);
            let units = match entry(
                shard,
                at.hash,
                target,
                now,
                self.shard_capacity,
                self.shards.hasher(),
            ) {
                Some(entry) => {
                    entry.seen(now, target.cost);
                    entry.serve(now, target.cost, &mut retired)
                }
                None => 0,
            };
            usable.push(units);
        }
        let answer = if targets.iter().zip(&usable).all(|(t, &u)| u >= t.cost) {
            // Every target with enough units: decided here, all-or-nothing.
            let mut decisions: SmallVec<[Decision; 2]> = SmallVec::new();
            let mut ahead: SmallVec<[Ahead; 1]> = SmallVec::new();
            for (target, at) in targets.iter().zip(&found) {
                let entry = guards
                    .shard(at.shard)
                    .get(at.hash, target)
                    .expect("served above");
                let held = entry.lease.as_mut().expect("served above");
                held.units -= target.cost;
                decisions.push(held.admitted(now));
                // Running low: take the next lease ahead, so that the
                // callers never wait for it.
                let low = held.units.saturating_mul(2) <= held.initial;
                let left = held.units;
                if low && entry.next.is_none() && !entry.waits(now, &self.timing) {
                    // The next lease and what is left of this one stay
                    // within one lease's bound (`N`, and the TTL's worth of
                    // refill): the take's own unit and `extra` come on top
                    // of `left`, never beside a whole lease.
                    let extra = entry
                        .want(now, &self.timing, target.limit)
                        .saturating_sub(left + 1);
                    if extra >= MIN_LEASE {
                        entry.taking = now.max(1);
                        ahead.push(Ahead {
                            key: entry.key.clone(),
                            name: entry.name.clone(),
                            limit: *target.limit,
                            extra,
                        });
                    }
                }
            }
            drop(guards);
            for take in ahead {
                self.take_ahead(take, now);
            }
            Some(Answer::Decided {
                decisions: Decisions::new(decisions),
                source: Source::Lease,
            })
        } else if let Some((index, decision)) = targets
            .iter()
            .zip(&found)
            .zip(&usable)
            .enumerate()
            .find_map(|(index, ((target, at), &units))| {
                let entry = guards.shard(at.shard).get(at.hash, target)?;
                (units < target.cost && entry.waits(now, &self.timing))
                    .then(|| (index, entry.waiting(now)))
            })
        {
            // Waiting at the limit, without units: refused here.
            drop(guards);
            Some(Answer::Refused {
                index,
                decision,
                source: Source::Lease,
            })
        } else {
            // To the store, asking for leases where an identity is hot.
            let extra: SmallVec<[u64; 2]> = targets
                .iter()
                .zip(&found)
                .zip(&usable)
                .map(
                    |((target, at), &units)| match guards.shard(at.shard).get(at.hash, target) {
                        Some(e) if units < target.cost => e.want(now, &self.timing, target.limit),
                        _ => 0,
                    },
                )
                .collect();
            drop(guards);
            if extra.iter().any(|&n| n > 0) && self.can_take() {
                let mut guards = self.lock(&found);
                for ((target, at), &n) in targets.iter().zip(&found).zip(&extra) {
                    if n > 0
                        && let Some(entry) = guards.shard(at.shard).get(at.hash, target)
                    {
                        entry.taking = now.max(1);
                    }
                }
                call.lease = Some(Ask {
                    granted: SmallVec::from_elem(0, extra.len()),
                    extra,
                    sent: now,
                    ttl: Duration::from_nanos(self.timing.ttl),
                });
            }
            None
        };
        if !retired.is_empty() {
            self.pending.lock().extend(retired);
        }
        answer
    }
}

/// Finds or makes the entry of `target` in `shard`; `None` when the shard
/// is full of identities seen recently (the new one stays cold).
fn entry<'s>(
    shard: &'s mut Shard,
    hash: u64,
    target: &Target<'_>,
    now: u64,
    capacity: usize,
    hasher: &Hasher,
) -> Option<&'s mut Watched> {
    let is = |e: &Watched| e.is(&target.key, target.limit);
    if shard.table.find(hash, is).is_none() {
        if shard.table.len() >= shard.sweep_at.max(64) || shard.table.len() >= capacity {
            shard.table.retain(|e| {
                e.lease.is_some() || e.taking != 0 || now.saturating_sub(e.last_call) < FORGET_AFTER
            });
            shard.sweep_at = (shard.table.len() * 2).max(64);
        }
        if shard.table.len() >= capacity {
            return None;
        }
        let fresh = Watched::new(target, now);
        shard.table.insert_unique(hash, fresh, |e| {
            hasher.hash_one((KeyRef::of(&e.key), e.limit.state_id()))
        });
    }
    let entry = shard.table.find_mut(hash, is)?;
    entry.limit = *target.limit;
    Some(entry)
}

/// Gives back due leases every tick, until the limiter is dropped or shut
/// down.
async fn background(leases: Weak<Leases>) {
    let tick = match leases.upgrade() {
        Some(leases) => leases.timing.tick,
        None => return,
    };
    loop {
        tokio::time::sleep(tick).await;
        let Some(leases) = leases.upgrade() else {
            return;
        };
        if leases.closed.load(Ordering::Relaxed) {
            return;
        }
        leases.collect(leases.now(), false, None);
        leases.flush().await;
    }
}

impl Layer for LeaseLayer {
    /// Calls whose every limit leases, on a remote store, unless a name of
    /// the call is shadowed.
    fn applies(&self, plan: &Plan<'_>) -> bool {
        plan.remote
            && plan
                .groups
                .iter()
                .all(|g| !g.limits.is_empty() && g.limits.iter().all(|l| l.lease().is_some()))
            && !(self.registry.any_shadow()
                && std::iter::once(plan.name)
                    .chain(plan.groups.iter().map(|g| g.name))
                    .any(|name| self.registry.shadowed(name)))
    }

    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        match call.op {
            Op::Acquire if !call.every_decision && self.leasing(call) => self.acquire(call),
            Op::Refund(at) => self.refund(call, at),
            Op::Reset => {
                self.reset(call);
                None
            }
            _ => None,
        }
    }

    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        if let Some(ask) = call.lease.take() {
            self.taken(call, ask, answer);
        }
    }

    fn changed(&self, name: &str) {
        self.collect(self.now(), false, Some(name));
    }
}

mod give_back;
mod take;
#[cfg(test)]
mod tests;
