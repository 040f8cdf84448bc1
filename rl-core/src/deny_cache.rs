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
//! limits for its name ([`crate::Limiter::set_limits`]), shadow mode, or
//! turning the cache off for the name. A refund made by another process is
//! not seen: the refusal then lasts until its `retry_after` at most, which
//! is what a client told `Retry-After` would wait anyway.
//!
//! Memory is bounded: a fixed number of shards, each holding at most
//! `capacity / shards` keys; expired entries are swept whenever a shard has
//! doubled since its last sweep, and a full shard evicts the entry that
//! expires first.
//!
//! Time is passed in (nanoseconds on [`DenyCache::now`]'s clock), so the
//! cache's logic is tested without any clock.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use parking_lot::RwLock;
use smallvec::SmallVec;

use crate::backend::Request;
use crate::decision::{Decision, Decisions};
use crate::limit::Limit;

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
struct Entry {
    /// The refused limit (all of it: a limit with another threshold on the
    /// same key is not covered).
    limit: Limit,
    /// The refused cost: a call of this cost or more is refused too.
    cost: u64,
    /// The function's name and the request's group name (for
    /// [`DenyCache::forget_name`]).
    name: &'static str,
    group: &'static str,
    /// When the backend call started (ns on the cache's clock).
    since: u64,
    /// When the refusal ends (ns on the cache's clock).
    until: u64,
    /// When this process stops trusting it: at most
    /// [`DEFAULT_MAX_HOLD`] after `since`, so a reset made by another process
    /// (an operator unblocking a user) is seen within that bound.
    held_until: u64,
    /// The backend's decision.
    decision: Decision,
}

/// Every remembered refusal of one key.
#[derive(Debug)]
struct Slot {
    hash: u64,
    key: Box<str>,
    entries: SmallVec<[Entry; 1]>,
}

impl Slot {
    /// The latest end among the entries (what eviction compares).
    fn until(&self) -> u64 {
        self.entries.iter().map(|e| e.held_until).max().unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct Shard {
    table: HashTable<Slot>,
    sweep_at: usize,
}

impl Shard {
    fn sweep(&mut self, now: u64) -> usize {
        let before = self.table.len();
        self.table.retain(|slot| {
            slot.entries.retain(|e| e.held_until > now);
            !slot.entries.is_empty()
        });
        before - self.table.len()
    }
}

/// The deny cache of one [`crate::Limiter`], with its on/off settings.
#[derive(Debug)]
pub(crate) struct DenyCache {
    shards: Box<[CachePadded<RwLock<Shard>>]>,
    hasher: hashbrown::DefaultHashBuilder,
    /// Keys per shard at most.
    shard_capacity: usize,
    /// Keys held, across shards (lets refunds skip the lookup when empty).
    held: AtomicUsize,
    epoch: Instant,
    /// Whether calls use the cache unless their name says otherwise.
    default: AtomicBool,
    /// Per-name settings made at run time.
    overrides: RwLock<HashMap<Box<str>, bool>>,
    any_override: AtomicBool,
    /// The most a refusal is held, in ns.
    max_hold: u64,
}

/// A remembered refusal that applies to a call: which request, and the
/// decision to report now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    /// The index of the refused request in the call.
    pub(crate) index: usize,
    /// The backend's decision, aged: `retry_after` and `reset_after` reduced
    /// by the time elapsed since, `remaining` 0.
    pub(crate) decision: Decision,
}

impl DenyCache {
    /// A cache holding at most `capacity` keys, used by default or not.
    #[cfg(test)]
    pub(crate) fn new(enabled: bool, capacity: usize) -> Self {
        Self::with_max_hold(enabled, capacity, DEFAULT_MAX_HOLD)
    }

    /// Like [`DenyCache::new`], holding a refusal at most `max_hold`.
    pub(crate) fn with_max_hold(enabled: bool, capacity: usize, max_hold: Duration) -> Self {
        let count = (std::thread::available_parallelism().map_or(4, |n| n.get()) * 8)
            .next_power_of_two()
            .min(capacity.max(1).next_power_of_two());
        let shards = (0..count)
            .map(|_| {
                CachePadded::new(RwLock::new(Shard {
                    table: HashTable::new(),
                    sweep_at: MIN_SWEEP,
                }))
            })
            .collect();
        Self {
            shards,
            hasher: hashbrown::DefaultHashBuilder::default(),
            shard_capacity: capacity.div_ceil(count).max(1),
            held: AtomicUsize::new(0),
            epoch: Instant::now(),
            default: AtomicBool::new(enabled),
            overrides: RwLock::default(),
            any_override: AtomicBool::new(false),
            max_hold: u64::try_from(max_hold.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
        }
    }

    /// Nanoseconds on the cache's monotonic clock.
    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether a call of the function `name` with groups `groups` uses the
    /// cache: an explicit "off" for any of these names wins, then an
    /// explicit "on", then the limiter's default.
    pub(crate) fn enabled(&self, name: &str, groups: &[&'static str]) -> bool {
        let default = self.default.load(Ordering::Relaxed);
        if !self.any_override.load(Ordering::Acquire) {
            return default;
        }
        let overrides = self.overrides.read();
        let mut verdict = None;
        for n in std::iter::once(name).chain(groups.iter().copied()) {
            match overrides.get(n) {
                Some(false) => return false,
                Some(true) => verdict = Some(true),
                None => {}
            }
        }
        verdict.unwrap_or(default)
    }

    /// Turns the cache on or off for calls named `name` (forgetting what
    /// it remembered for them when turned off).
    pub(crate) fn set(&self, name: &str, enabled: bool) {
        {
            let mut overrides = self.overrides.write();
            overrides.insert(name.into(), enabled);
            self.any_override.store(true, Ordering::Release);
        }
        if !enabled {
            self.forget_name(name);
        }
    }

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a hash: bits the table's own bucket index (low bits)
    /// and control byte (top 7 bits) do not use.
    fn shard(&self, hash: u64) -> &RwLock<Shard> {
        &self.shards[((hash >> 32) as usize) & (self.shards.len() - 1)]
    }

    /// The remembered refusal that applies to this call at `now`, if any
    /// (the one ending last, when several requests are remembered).
    pub(crate) fn lookup(&self, requests: &[Request<'_>], now: u64) -> Option<Hit> {
        let mut best: Option<(usize, Entry)> = None;
        for (index, request) in requests.iter().enumerate() {
            let key = request.key.as_str();
            let hash = self.hash(key);
            let shard = self.shard(hash).read();
            let Some(slot) = shard.table.find(hash, |s| &*s.key == key) else {
                continue;
            };
            let found = slot.entries.iter().find(|e| {
                e.held_until > now && e.limit == *request.limit && e.cost <= request.cost
            });
            if let Some(entry) = found
                && best.is_none_or(|(_, b)| entry.until > b.until)
            {
                best = Some((index, *entry));
            }
        }
        best.map(|(index, entry)| Hit {
            index,
            decision: aged(&entry, now),
        })
    }

    /// Remembers the binding refusal of a call the backend refused, decided
    /// by a backend call that started at `since`.
    pub(crate) fn remember(
        &self,
        name: &'static str,
        groups: &[&'static str],
        requests: &[Request<'_>],
        decisions: &Decisions,
        since: u64,
    ) {
        let binding = decisions.binding();
        if binding.allowed || binding.retry_after.is_zero() {
            return;
        }
        let Some(index) = decisions.iter().position(|d| d == binding) else {
            return;
        };
        let Some(request) = requests.get(index) else {
            return;
        };
        let retry = u64::try_from(binding.retry_after.as_nanos()).unwrap_or(u64::MAX);
        let entry = Entry {
            limit: *request.limit,
            cost: request.cost,
            name,
            group: groups.get(index).copied().unwrap_or(name),
            since,
            until: since.saturating_add(retry),
            held_until: since.saturating_add(retry.min(self.max_hold)),
            decision: *binding,
        };
        self.insert(request.key.as_str(), entry);
    }

    fn insert(&self, key: &str, entry: Entry) {
        let hash = self.hash(key);
        let mut shard = self.shard(hash).write();
        if let Some(slot) = shard.table.find_mut(hash, |s| &*s.key == key) {
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
            Slot {
                hash,
                key: key.into(),
                entries: smallvec::smallvec![entry],
            },
            |slot| slot.hash,
        );
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets the refusals of these requests' keys and limits (their state
    /// was just refunded or reset).
    pub(crate) fn forget(&self, requests: &[Request<'_>]) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        for request in requests {
            let key = request.key.as_str();
            let hash = self.hash(key);
            let mut shard = self.shard(hash).write();
            if let Ok(mut found) = shard.table.find_entry(hash, |s| &*s.key == key) {
                let slot = found.get_mut();
                slot.entries
                    .retain(|e| e.limit.state_id() != request.limit.state_id());
                if slot.entries.is_empty() {
                    found.remove();
                    self.held.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Forgets every refusal made for the function or group `name`.
    pub(crate) fn forget_name(&self, name: &str) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            let before = shard.table.len();
            shard.table.retain(|slot| {
                slot.entries.retain(|e| e.name != name && e.group != name);
                !slot.entries.is_empty()
            });
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

/// The remembered decision as of `now`.
fn aged(entry: &Entry, now: u64) -> Decision {
    let elapsed = Duration::from_nanos(now.saturating_sub(entry.since));
    // Whole microseconds, rounded up, like every backend's figures.
    let retry_us = (entry.until - now).div_ceil(1_000);
    let d = entry.decision;
    let retry_after = Duration::from_micros(retry_us);
    Decision {
        allowed: false,
        limit: d.limit,
        remaining: 0,
        retry_after,
        reset_after: d.reset_after.saturating_sub(elapsed).max(retry_after),
        at_micros: d
            .at_micros
            .saturating_add(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    const MS: u64 = 1_000_000;

    fn refused(retry_ms: u64) -> Decision {
        Decision::from_micros(false, 5, 0, retry_ms * 1_000, retry_ms * 2_000, 1_000)
    }

    fn allowed() -> Decision {
        Decision::from_micros(true, 5, 3, 0, 100, 1_000)
    }

    fn cache() -> DenyCache {
        DenyCache::new(true, DEFAULT_CAPACITY)
    }

    #[test]
    fn a_refusal_is_remembered_until_its_retry_after_from_the_call_start() {
        let cache = cache();
        let limit = Limit::per_minute(5).unwrap();
        let key = Key::new("rl", "sms", "alice");
        let req = [Request::new(&key, &limit, 1)];
        cache.remember("sms", &[], &req, &Decisions::one(refused(100)), 10 * MS);
        let hit = cache.lookup(&req, 10 * MS).expect("remembered");
        assert_eq!(hit.index, 0);
        assert_eq!(hit.decision.retry_after, Duration::from_millis(100));
        let later = cache.lookup(&req, 40 * MS).expect("still remembered");
        assert_eq!(later.decision.retry_after, Duration::from_millis(70));
        assert_eq!(later.decision.remaining, 0);
        assert_eq!(later.decision.reset_after, Duration::from_millis(170));
        assert_eq!(later.decision.at_micros, 1_000 + 30_000);
        assert!(cache.lookup(&req, 110 * MS - 1).is_some());
        assert!(
            cache.lookup(&req, 110 * MS).is_none(),
            "ends at retry_after"
        );
    }

    #[test]
    fn a_partial_microsecond_left_rounds_up_so_waiting_it_out_suffices() {
        let cache = cache();
        let limit = Limit::per_minute(5).unwrap();
        let key = Key::new("rl", "sms", "alice");
        let req = [Request::new(&key, &limit, 1)];
        cache.remember("sms", &[], &req, &Decisions::one(refused(1)), 0);
        let hit = cache.lookup(&req, 999_500).expect("remembered");
        assert_eq!(hit.decision.retry_after, Duration::from_micros(1));
    }

    #[test]
    fn only_the_same_key_limit_and_at_least_the_same_cost_are_covered() {
        let cache = cache();
        let limit = Limit::per_minute(5).unwrap();
        let key = Key::new("rl", "sms", "alice");
        cache.remember(
            "sms",
            &[],
            &[Request::new(&key, &limit, 2)],
            &Decisions::one(refused(100)),
            0,
        );
        assert!(cache.lookup(&[Request::new(&key, &limit, 2)], 1).is_some());
        assert!(cache.lookup(&[Request::new(&key, &limit, 3)], 1).is_some());
        assert!(
            cache.lookup(&[Request::new(&key, &limit, 1)], 1).is_none(),
            "a cheaper call may fit"
        );
        let other_key = Key::new("rl", "sms", "bob");
        assert!(
            cache
                .lookup(&[Request::new(&other_key, &limit, 2)], 1)
                .is_none()
        );
        let looser = limit.with_threshold(50).unwrap();
        assert!(cache.lookup(&[Request::new(&key, &looser, 2)], 1).is_none());
    }

    #[test]
    fn allowed_calls_and_zero_waits_are_not_remembered() {
        let cache = cache();
        let limit = Limit::per_minute(5).unwrap();
        let key = Key::new("rl", "sms", "alice");
        let req = [Request::new(&key, &limit, 1)];
        cache.remember("sms", &[], &req, &Decisions::one(allowed()), 0);
        cache.remember("sms", &[], &req, &Decisions::one(refused(0)), 0);
        assert!(cache.lookup(&req, 0).is_none());
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_multi_limit_call_remembers_the_binding_refusal_and_any_cached_request_refuses() {
        let cache = cache();
        let minute = Limit::per_minute(5).unwrap();
        let hour = Limit::per_hour(50).unwrap();
        let phone = Key::new("rl", "sms", "+1");
        let ip = Key::new("rl", "ip", "10.0.0.1");
        let call = [
            Request::new(&phone, &minute, 1),
            Request::new(&phone, &hour, 1),
            Request::new(&ip, &minute, 1),
        ];
        let decisions = Decisions::new([refused(10), allowed(), refused(500)]);
        cache.remember("send", &["sms", "sms", "ip"], &call, &decisions, 0);
        let hit = cache.lookup(&call, MS).expect("the binding refusal");
        assert_eq!(hit.index, 2);
        assert_eq!(hit.decision.retry_after, Duration::from_millis(499));
        // Another phone from the same IP is refused by the IP's entry.
        let other = Key::new("rl", "sms", "+2");
        let other_call = [
            Request::new(&other, &minute, 1),
            Request::new(&ip, &minute, 1),
        ];
        assert_eq!(cache.lookup(&other_call, MS).map(|h| h.index), Some(1));
        // The phone's own minute refusal was not the binding one.
        assert!(cache.lookup(&call[..2], MS).is_none());
    }

    #[test]
    fn forgetting_by_request_and_by_name_drops_the_entries() {
        let cache = cache();
        let limit = Limit::per_minute(5).unwrap();
        let a = Key::new("rl", "sms", "alice");
        let b = Key::new("rl", "login", "bob");
        let ra = [Request::new(&a, &limit, 1)];
        let rb = [Request::new(&b, &limit, 1)];
        cache.remember("sms", &[], &ra, &Decisions::one(refused(100)), 0);
        cache.remember("handler", &["login"], &rb, &Decisions::one(refused(100)), 0);
        cache.forget(&ra);
        assert!(cache.lookup(&ra, 1).is_none());
        assert!(cache.lookup(&rb, 1).is_some());
        cache.forget_name("login");
        assert!(cache.lookup(&rb, 1).is_none());
        cache.remember("handler", &["login"], &rb, &Decisions::one(refused(100)), 0);
        cache.forget_name("handler");
        assert!(
            cache.lookup(&rb, 1).is_none(),
            "the function's name works too"
        );
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn memory_stays_bounded_and_expired_entries_are_swept() {
        let cache = DenyCache::new(true, 256);
        let limit = Limit::per_minute(5).unwrap();
        let keys: Vec<Key> = (0..10_000)
            .map(|i| Key::from_display("rl", "flood", &i))
            .collect();
        for (i, key) in keys.iter().enumerate() {
            let req = [Request::new(key, &limit, 1)];
            // Each refusal lasts 1 ms, one new key every 10 µs.
            cache.remember(
                "flood",
                &[],
                &req,
                &Decisions::one(refused(1)),
                i as u64 * 10_000,
            );
            assert!(
                cache.len() <= 256 + cache.shards.len(),
                "{} keys",
                cache.len()
            );
        }
        // The newest refusal is still there; long-expired ones are gone.
        let last = [Request::new(&keys[9_999], &limit, 1)];
        assert!(cache.lookup(&last, 9_999 * 10_000).is_some());
        let first = [Request::new(&keys[0], &limit, 1)];
        assert!(cache.lookup(&first, 9_999 * 10_000).is_none());
    }

    #[test]
    fn a_full_cache_of_live_refusals_evicts_the_one_ending_first() {
        let cache = DenyCache::new(true, 1);
        let limit = Limit::per_minute(5).unwrap();
        let a = Key::new("rl", "x", "a");
        let b = Key::new("rl", "x", "b");
        let ra = [Request::new(&a, &limit, 1)];
        let rb = [Request::new(&b, &limit, 1)];
        cache.remember("x", &[], &ra, &Decisions::one(refused(1_000)), 0);
        cache.remember("x", &[], &rb, &Decisions::one(refused(1_000)), 1);
        assert_eq!(cache.len(), 1);
        assert!(cache.lookup(&rb, 2).is_some());
    }

    #[test]
    fn names_turn_the_cache_on_or_off_over_the_default() {
        let cache = DenyCache::new(false, DEFAULT_CAPACITY);
        assert!(!cache.enabled("f", &[]));
        cache.set("f", true);
        assert!(cache.enabled("f", &[]));
        assert!(cache.enabled("g", &["f"]));
        cache.set("ip", false);
        assert!(!cache.enabled("f", &["ip"]), "an explicit off wins");
        let on = DenyCache::new(true, DEFAULT_CAPACITY);
        on.set("login", false);
        assert!(!on.enabled("login", &[]));
        assert!(on.enabled("other", &[]));
    }

    #[test]
    fn turning_a_name_off_forgets_its_refusals() {
        let cache = cache();
        let limit = Limit::per_minute(5).unwrap();
        let key = Key::new("rl", "sms", "alice");
        let req = [Request::new(&key, &limit, 1)];
        cache.remember("sms", &[], &req, &Decisions::one(refused(100)), 0);
        cache.set("sms", false);
        assert!(cache.lookup(&req, 1).is_none());
    }
}
