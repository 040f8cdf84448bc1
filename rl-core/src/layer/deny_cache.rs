//! The deny cache: a local memory of the refusals a remote backend just
//! made, so that a flood on a blocked identity is refused in process
//! instead of costing one round trip per call.
//!
//! When the backend refuses a call, its binding refusal (the refusing limit
//! with the longest `retry_after`) is remembered under the request's full
//! key and limit until `start + retry_after`, where `start` is the local
//! monotonic time taken *before* the backend call: the backend decided after
//! that instant, so the remembered refusal never outlives the real one
//! (given no other traffic, no refund and an unchanged limit — which is
//! exactly what `retry_after` promises). While remembered, a call carrying
//! that key and limit, at the same or a higher cost, is refused without
//! asking the backend; any other call goes to the backend as before.
//!
//! What invalidates an entry early: this limiter refunding or resetting the
//! key (count-failures mode, [`crate::Limiter::reset_everywhere`]), new
//! limits for its name ([`crate::settings::Settings::set_limits`]), shadow mode,
//! turning the cache off for the name, or a notice from the store that
//! another process gave room back under the key (a refund, a settled
//! estimate, a reset: [`crate::backend::Backend::subscribe_refunds`], on
//! Redis within one pub/sub delivery). A change made by another process
//! that no notice tells of (a backend without notices, a notice lost while
//! the subscription was down) is seen within the maximum hold (1 s by
//! default): a remembered refusal is trusted that long at most, then
//! re-checked.
//!
//! The re-check is single flight: when a hold ends while the refusal is
//! still valid (its `retry_after` has not passed), the first caller to see
//! it asks the backend, and every other caller keeps being refused from
//! the cache for another hold (or until that caller's answer replaces the
//! entry). A flood of any size on a blocked identity therefore reaches the
//! backend once per hold, not once per caller.
//!
//! Memory is bounded: a fixed number of shards, each holding at most
//! `capacity / shards` keys; expired entries are swept whenever a shard has
//! doubled since its last sweep, and a full shard evicts the entry that
//! expires first.
//!
//! Time is passed in (nanoseconds on [`DenyCache::now`]'s clock), so the
//! cache's logic is tested without any clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hashbrown::HashTable;
use parking_lot::RwLock;
use smallvec::SmallVec;

use super::{Answer, Call, Layer, Plan, Source};
use crate::model::decision::{Decision, Decisions};
use crate::model::error::Error;
use crate::model::key::Key;
use crate::model::limit::Limit;
use crate::model::settings::Registry;
use crate::store::sharded::Sharded;
use crate::store::target::{KeyRef, Op, Target};

/// How many keys the cache holds at most, by default.
pub(crate) const DEFAULT_CAPACITY: usize = 65_536;

/// How long a process trusts a remembered refusal at most (1 s): bounds how
/// late it sees a reset made elsewhere, while a flood still reaches the
/// backend at most once a second per key.
pub(crate) const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(1);

/// A shard sweeps expired entries once it holds this many keys (and then
/// again each time it has doubled).
const MIN_SWEEP: usize = 64;

/// Distinct limits remembered per key at most (a key rarely carries more
/// than a handful of limits).
const PER_KEY: usize = 8;

/// One remembered refusal.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    /// The refused limit (all of it: a limit with another threshold on the
    /// same key is not covered).
    limit: Limit,
    /// The refused cost: a call of this cost or more is refused too.
    cost: u64,
    /// When the backend call started (ns on the cache's clock).
    since: u64,
    /// When the refusal ends (ns on the cache's clock).
    until: u64,
    /// Until when this process trusts it without asking the backend: at
    /// most the maximum hold after `since` (or after a re-check began), so
    /// a reset made by another process is seen within that bound. 0 for an
    /// entry consulted only while the backend fails ([`Refusal::trusted`]).
    held_until: u64,
    /// Whether it answers calls while the backend is up: the binding
    /// refusal of a call. The others (another refused limit of the call, a
    /// limit an admitted call left without room) answer only while the
    /// backend fails.
    trusted: bool,
    /// The backend's decision.
    decision: Decision,
}

/// Every remembered refusal of one key.
#[derive(Debug)]
struct Refusals {
    hash: u64,
    /// The key (compared by its parts: a number or an address identity is
    /// never rendered to look a call up).
    key: Key,
    /// The call's name and the key's group name (for
    /// [`DenyCache::forget_name`]).
    names: [Box<str>; 2],
    entries: SmallVec<[Refusal; 1]>,
}

impl Refusals {
    /// The latest end among the entries (what eviction compares).
    fn until(&self) -> u64 {
        self.entries.iter().map(|e| e.until).max().unwrap_or(0)
    }

    #[inline]
    fn is(&self, key: &KeyRef<'_>) -> bool {
        KeyRef::of(&self.key) == *key
    }
}

#[derive(Debug, Default)]
struct Shard {
    table: HashTable<Refusals>,
    sweep_at: usize,
}

impl Shard {
    fn sweep(&mut self, now: u64) -> usize {
        let before = self.table.len();
        self.table.retain(|slot| {
            slot.entries.retain(|e| e.until > now);
            !slot.entries.is_empty()
        });
        before - self.table.len()
    }
}

/// The remembered refusals of one [`crate::Limiter`].
#[derive(Debug)]
pub(crate) struct DenyCache {
    shards: Sharded<RwLock<Shard>>,
    /// Keys per shard at most.
    shard_capacity: usize,
    /// Keys held, across shards (lets refunds skip the lookup when empty).
    held: AtomicUsize,
    /// The cache's monotonic clock (the cycle counter where it is reliable,
    /// as [`crate::clock::SystemClock`] reads it: a few instructions, where
    /// `Instant::elapsed` reads the system clock and subtracts timespecs)
    /// and its reading when the cache was made.
    clock: quanta::Clock,
    epoch: u64,
    /// The most a refusal is held, in ns.
    max_hold: u64,
}

/// What the cache knows of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// A remembered refusal applies: refuse without the backend.
    Hit(Hit),
    /// A refusal is still valid but its hold has ended: this caller asks
    /// the backend again, the others keep the refusal meanwhile.
    Probe,
    /// Nothing remembered applies.
    Miss,
}

/// A remembered refusal that applies to a call: which target, and the
/// decision to report now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    /// The index of the refused target in the call.
    pub(crate) index: usize,
    /// The backend's decision, aged: `retry_after` and `reset_after` reduced
    /// by the time elapsed since, `remaining` 0.
    pub(crate) decision: Decision,
}

impl DenyCache {
    /// A cache holding at most `capacity` keys, each refusal at most `max_hold`.
    pub(crate) fn new(capacity: usize, max_hold: Duration) -> Self {
        let count = (std::thread::available_parallelism().map_or(4, |n| n.get()) * 8)
            .next_power_of_two()
            .min(capacity.max(1).next_power_of_two());
        let clock = quanta::Clock::new();
        let shards = Sharded::new(count, |_| {
            RwLock::new(Shard {
                table: HashTable::new(),
                sweep_at: MIN_SWEEP,
            })
        });
        Self {
            shards,
            shard_capacity: capacity.div_ceil(count).max(1),
            held: AtomicUsize::new(0),
            clock: clock.clone(),
            epoch: clock.raw(),
            max_hold: u64::try_from(max_hold.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
        }
    }

    /// Nanoseconds on the cache's monotonic clock.
    pub(crate) fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.epoch, self.clock.raw())
    }

    fn hash(&self, key: &KeyRef<'_>) -> u64 {
        self.shards.hash((key.head, key.identity))
    }

    /// The shard of a hash.
    fn shard(&self, hash: u64) -> &RwLock<Shard> {
        self.shards.of(hash)
    }

    /// What applies to this call at `now`: the remembered refusal ending
    /// last, else a claim to re-check an expired hold, else nothing.
    pub(crate) fn lookup(&self, targets: &[Target<'_>], now: u64) -> Lookup {
        if self.held.load(Ordering::Relaxed) == 0 {
            return Lookup::Miss;
        }
        let mut best: Option<(usize, Refusal)> = None;
        let mut stale: SmallVec<[usize; 2]> = SmallVec::new();
        for (index, target) in targets.iter().enumerate() {
            let hash = self.hash(&target.key);
            let shard = self.shard(hash).read();
            let Some(slot) = shard.table.find(hash, |s| s.is(&target.key)) else {
                continue;
            };
            for entry in slot.entries.iter().filter(|e| covers(e, target)) {
                if entry.held_until > now {
                    if best.is_none_or(|(_, b)| entry.until > b.until) {
                        best = Some((index, *entry));
                    }
                } else if entry.trusted && entry.until > now {
                    stale.push(index);
                }
            }
        }
        if let Some((index, entry)) = best {
            return Lookup::Hit(Hit {
                index,
                decision: aged(&entry, now),
            });
        }
        // Single flight: the first caller to extend an expired hold re-checks.
        for index in stale {
            let target = &targets[index];
            let hash = self.hash(&target.key);
            let mut shard = self.shard(hash).write();
            let Some(slot) = shard.table.find_mut(hash, |s| s.is(&target.key)) else {
                continue;
            };
            for entry in slot.entries.iter_mut().filter(|e| covers(e, target)) {
                if entry.held_until > now {
                    return Lookup::Hit(Hit {
                        index,
                        decision: aged(entry, now),
                    });
                }
                if entry.trusted && entry.until > now {
                    entry.held_until = now.saturating_add(self.max_hold).min(entry.until);
                    return Lookup::Probe;
                }
            }
        }
        Lookup::Miss
    }

    /// Learns from the backend's decisions of a call that started at
    /// `since`: remembers its binding refusal (trusted: answers repeats for
    /// up to the maximum hold), and, for outages only, every other refused
    /// limit and every limit the call left without room for another call of
    /// its cost (until its `reset_after`: the backend may admit sooner, so
    /// this errs on refusing, and only while the backend fails); forgets
    /// what it held for limits that now have room.
    pub(crate) fn learn(
        &self,
        name: &str,
        targets: &[Target<'_>],
        decisions: &Decisions,
        since: u64,
    ) {
        let binding = (!decisions.allowed()).then(|| decisions.binding_index());
        let mut forget: SmallVec<[usize; 2]> = SmallVec::new();
        for (index, (target, decision)) in targets.iter().zip(decisions.iter()).enumerate() {
            // A slot in flight frees whenever a running call ends: its
            // refusal promises nothing to remember.
            if target.limit.is_in_flight() {
                continue;
            }
            let wait = if !decision.allowed() {
                decision.retry_after()
            } else if decision.remaining() < target.cost {
                decision.reset_after()
            } else {
                forget.push(index);
                continue;
            };
            if wait.is_zero() {
                continue;
            }
            let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            let trusted = binding == Some(index);
            self.insert(
                name,
                target,
                Refusal {
                    limit: *target.limit,
                    cost: target.cost,
                    since,
                    until: since.saturating_add(wait),
                    held_until: if trusted {
                        since.saturating_add(wait.min(self.max_hold))
                    } else {
                        0
                    },
                    trusted,
                    decision: *decision,
                },
            );
        }
        if !forget.is_empty() && self.held.load(Ordering::Relaxed) != 0 {
            let fits: SmallVec<[Target<'_>; 2]> = forget.iter().map(|&i| targets[i]).collect();
            self.forget(&fits);
        }
    }

    /// While the backend fails: the remembered refusal or exhaustion that
    /// applies to this call at `now` (the one ending last), trusted or not.
    pub(crate) fn outage(&self, targets: &[Target<'_>], now: u64) -> Option<Hit> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut best: Option<(usize, Refusal)> = None;
        for (index, target) in targets.iter().enumerate() {
            let hash = self.hash(&target.key);
            let shard = self.shard(hash).read();
            let Some(slot) = shard.table.find(hash, |s| s.is(&target.key)) else {
                continue;
            };
            for entry in slot.entries.iter().filter(|e| covers(e, target)) {
                if entry.until > now && best.is_none_or(|(_, b)| entry.until > b.until) {
                    best = Some((index, *entry));
                }
            }
        }
        best.map(|(index, entry)| Hit {
            index,
            decision: aged(&entry, now),
        })
    }

    fn insert(&self, name: &str, target: &Target<'_>, entry: Refusal) {
        let hash = self.hash(&target.key);
        let mut shard = self.shard(hash).write();
        if let Some(slot) = shard.table.find_mut(hash, |s| s.is(&target.key)) {
            match slot.entries.iter_mut().find(|e| e.limit == entry.limit) {
                Some(existing) => *existing = entry,
                None => {
                    if slot.entries.len() >= PER_KEY {
                        slot.entries.remove(0);
                    }
                    slot.entries.push(entry);
                }
            }
            return;
        }
        let now = entry.since;
        if shard.table.len() >= shard.sweep_at {
            let removed = shard.sweep(now);
            self.held.fetch_sub(removed, Ordering::Relaxed);
            shard.sweep_at = (shard.table.len() * 2).max(MIN_SWEEP);
        }
        if shard.table.len() >= self.shard_capacity {
            // Full of live refusals: drop the one that ends first.
            let victim = shard
                .table
                .iter()
                .min_by_key(|slot| slot.until())
                .map(|slot| (slot.hash, slot.key.clone()));
            if let Some((victim_hash, victim_key)) = victim
                && let Ok(found) = shard.table.find_entry(victim_hash, |s| s.key == victim_key)
            {
                found.remove();
                self.held.fetch_sub(1, Ordering::Relaxed);
            }
        }
        shard.table.insert_unique(
            hash,
            Refusals {
                hash,
                key: target.key.render(),
                names: [name.into(), target.name.into()],
                entries: smallvec::smallvec![entry],
            },
            |slot| slot.hash,
        );
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets the refusals of these targets' keys and limits (their state
    /// was just refunded or reset, or a re-check found room).
    pub(crate) fn forget(&self, targets: &[Target<'_>]) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        for target in targets {
            let hash = self.hash(&target.key);
            let mut shard = self.shard(hash).write();
            if let Ok(mut found) = shard.table.find_entry(hash, |s| s.is(&target.key)) {
                let slot = found.get_mut();
                slot.entries
                    .retain(|e| e.limit.state_id() != target.limit.state_id());
                if slot.entries.is_empty() {
                    found.remove();
                    self.held.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Forgets every refusal remembered for `key`, whatever its limit
    /// (another process gave room back under it, or its blocks were
    /// lifted).
    pub(crate) fn forget_key(&self, key: &KeyRef<'_>) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        let hash = self.hash(key);
        let mut shard = self.shard(hash).write();
        if let Ok(found) = shard.table.find_entry(hash, |s| s.is(key)) {
            found.remove();
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Forgets every refusal made for the call or group `name`.
    pub(crate) fn forget_name(&self, name: &str) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            let before = shard.table.len();
            shard
                .table
                .retain(|slot| slot.names.iter().all(|n| **n != *name));
            self.held
                .fetch_sub(before - shard.table.len(), Ordering::Relaxed);
        }
    }

    /// Keys currently held (expired ones included until swept).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().table.len()).sum()
    }
}

/// Whether a remembered entry refuses `target`: the same limit, at the same
/// or a higher cost.
fn covers(entry: &Refusal, target: &Target<'_>) -> bool {
    entry.limit == *target.limit && entry.cost <= target.cost
}

/// The deny cache as a layer: answers remembered refusals of acquires,
/// remembers the store's refusals, and forgets on refunds, resets and
/// runtime changes.
#[derive(Debug)]
pub(crate) struct DenyLayer {
    cache: DenyCache,
    registry: Arc<Registry>,
    /// Whether calls use the cache unless their name says otherwise.
    default: bool,
}

impl DenyLayer {
    pub(crate) fn new(cache: DenyCache, registry: Arc<Registry>, default: bool) -> Self {
        Self {
            cache,
            registry,
            default,
        }
    }

    /// Whether a call with these names uses the cache: an explicit "off"
    /// for its name or any of its groups wins, then an explicit "on", then
    /// the default.
    fn enabled<'a>(&self, names: impl Iterator<Item = &'a str>) -> bool {
        self.registry.deny_cache(names).unwrap_or(self.default)
    }
}

impl Layer for DenyLayer {
    fn applies(&self, plan: &Plan<'_>) -> bool {
        self.enabled(plan.names())
    }

    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        match call.op {
            Op::Acquire | Op::AcquireOnce(_)
                if !call.every_decision
                    && self.enabled(
                        std::iter::once(call.name).chain(call.targets.iter().map(|t| t.name)),
                    ) =>
            {
                let now = self.cache.now();
                call.notes.deny_since = Some(now);
                match self.cache.lookup(call.targets, now) {
                    Lookup::Hit(hit) => {
                        return Some(Answer::Refused {
                            index: hit.index,
                            decision: hit.decision,
                            source: Source::Cache,
                        });
                    }
                    Lookup::Probe => call.notes.deny_probe = true,
                    Lookup::Miss => {}
                }
            }
            // The state changed: a refusal remembered before says too little
            // (a hold's pause makes the wait longer than it said).
            Op::Refund(_) | Op::Reset | Op::Cancel(_) | Op::CancelOnce(_) | Op::Hold { .. } => {
                self.cache.forget(call.targets)
            }
            _ => {}
        }
        None
    }

    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        let Some(since) = call.notes.deny_since else {
            return;
        };
        match answer {
            // A decision from a lease is this process's own: nothing the
            // backend said to remember.
            Answer::Decided {
                source: Source::Lease,
                ..
            } => {}
            Answer::Decided { decisions, .. } => {
                self.cache.learn(call.name, call.targets, decisions, since);
            }
            // The backend cannot answer: what it last said still holds for
            // what it had refused or left without room, so a blocked
            // identity is not handed a fresh quota by the failure policy.
            Answer::Failed(Error::Backend(_)) => {
                if let Some(hit) = self.cache.outage(call.targets, self.cache.now()) {
                    *answer = Answer::Refused {
                        index: hit.index,
                        decision: hit.decision,
                        source: Source::Cache,
                    };
                }
            }
            _ => {}
        }
    }

    fn changed(&self, name: &str) {
        self.cache.forget_name(name);
    }

    fn unblocked(&self, key: &Key) {
        self.cache.forget_key(&KeyRef::of(key));
    }
}

impl DenyLayer {
    /// Another process gave room back under `key` (a refund, a settled
    /// estimate, a reset, as its store told): what was remembered for the
    /// key may no longer hold, so the next call asks the backend.
    pub(crate) fn given_back(&self, key: &KeyRef<'_>) {
        self.cache.forget_key(key);
    }
}

/// The remembered decision as of `now`.
fn aged(entry: &Refusal, now: u64) -> Decision {
    let elapsed = Duration::from_nanos(now.saturating_sub(entry.since));
    // Whole microseconds, rounded up, like every backend's figures.
    let retry_us = (entry.until - now).div_ceil(1_000);
    entry
        .decision
        .refused_later(Duration::from_micros(retry_us), elapsed)
}

#[cfg(test)]
mod tests;
