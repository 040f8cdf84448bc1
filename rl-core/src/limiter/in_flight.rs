//! In-flight slots: what an admitted call holds for its concurrency limits
//! ([`crate::Limit::in_flight`]) until it ends.
//!
//! An admission whose groups have an in-flight limit takes one slot per
//! such limit in the same decision as the call's rate limits (one round
//! trip, all-or-nothing), under a lease id unique to the admission. The
//! [`Permit`](crate::Permit) holds an [`InFlight`] guard; dropping it (the
//! call returned, panicked or was cancelled) gives the slots back:
//!
//! - in memory (the store, or the failure policy's in-process fallback),
//!   at once, in the guard's `drop`: the process holding the slot is the
//!   store, so a slot needs no lease there;
//! - in a remote store, the guard queues the release and wakes the
//!   limiter's one keeper task, which sends every queued release in one
//!   call per hash slot (a single call on a standalone server) — in
//!   practice within one round trip of the drop. The same task renews the
//!   lease of every live slot every third of its time to live, again in one
//!   batched call, so 1 000s of running calls cost one renewal call per
//!   period, not 1 000s of timers. A process that dies stops renewing: its
//!   slots expire after the lease and capacity comes back.
//!
//! The keeper task runs on the Tokio runtime of the first admission
//! (remote stores need one anyway), is started again if that runtime ends,
//! and stops when the limiter is dropped.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::layer::counters;
use crate::limiter::admission::Admission;
use crate::model::key::Key;
use crate::model::limit::Limit;
use crate::store::Store;
use crate::store::backend::{Backend, Request};
use crate::store::memory::MemoryBackend;
use crate::store::target::{KeyRef, Op, Target};

/// The most slots one renewal or release call carries.
const CHUNK: usize = 512;

/// One slot: the group (limit name) it counts under, its key and limit.
#[derive(Debug)]
struct FlightSlot {
    name: Box<str>,
    key: Key,
    limit: Limit,
}

/// The slots of one admission, under one lease id.
#[derive(Debug)]
struct AdmissionSlots {
    lease: u64,
    slots: Box<[FlightSlot]>,
    /// A renewal found the lease expired: not renewed again.
    lost: AtomicBool,
}

impl AdmissionSlots {
    fn targets(&self, share: Option<NonZeroU64>) -> Vec<(Limit, &FlightSlot)> {
        self.slots
            .iter()
            .map(|slot| {
                let limit = match share {
                    Some(share) => crate::layer::failure::local_share(&slot.limit, share),
                    None => slot.limit,
                };
                (limit, slot)
            })
            .collect()
    }

    /// Gives the slots back to a memory store, now.
    fn release_in(&self, memory: &MemoryBackend, share: Option<NonZeroU64>) {
        let limits = self.targets(share);
        let targets: Vec<Target<'_>> = limits
            .iter()
            .map(|(limit, slot)| Target {
                name: &slot.name,
                key: KeyRef::of(&slot.key),
                limit,
                cost: 1,
                slot: None,
                lease: self.lease,
            })
            .collect();
        let _ = memory.run(Op::Refund(0), &targets);
    }
}

/// Where an admission's slots were taken.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// The limiter's memory store.
    Memory,
    /// The remote backend (leased, renewed by the keeper task).
    Remote,
    /// The in-process fallback, with the limits divided by `share`.
    Local(NonZeroU64),
}

/// The slots held by a running call; dropping it gives them back (see the
/// module docs of `ratewall::limiter::in_flight`, summarised in
/// [`Limit::in_flight`]).
///
/// A [`Permit`](crate::Permit) holds it; [`Permit::into_in_flight`](crate::Permit::into_in_flight)
/// takes it out, `'static`, for a caller that keeps the slots past the
/// permit (the tower layer keeps them until the response is ready).
pub struct InFlight {
    keeper: Arc<Keeper>,
    held: Arc<AdmissionSlots>,
    place: Place,
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("lease", &format_args!("{:016x}", self.held.lease))
            .field(
                "names",
                &self.held.slots.iter().map(|s| &*s.name).collect::<Vec<_>>(),
            )
            .field("place", &self.place)
            .finish()
    }
}

impl InFlight {
    /// The id of the admission holding the slots, under which their lease
    /// is kept (a remote store's sorted-set member, as 16 hex digits).
    pub fn holder(&self) -> u64 {
        self.held.lease
    }

    /// The names of the groups whose in-flight limits this call holds a
    /// slot of.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.held.slots.iter().map(|s| &*s.name)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        for slot in self.held.slots.iter() {
            counters::gauge_add("ratewall_in_flight", &slot.name, -1.0);
            counters::counter_add("ratewall_in_flight_releases_total", &slot.name);
        }
        match self.place {
            Place::Memory => {
                if let Home::Memory(memory) = &self.keeper.home {
                    self.held.release_in(memory, None);
                }
            }
            Place::Local(share) => self.held.release_in(&self.keeper.fallback, Some(share)),
            Place::Remote => self.keeper.queue_release(self.held.clone()),
        }
    }
}

/// The store a limiter's slots live in.
enum Home {
    Memory(Arc<MemoryBackend>),
    Remote(Arc<dyn Backend>),
}

/// What the keeper task works from.
#[derive(Default)]
struct Book {
    /// Live leases in the remote store, by id.
    live: HashMap<u64, Arc<AdmissionSlots>>,
    /// Released leases not sent yet.
    queue: Vec<Arc<AdmissionSlots>>,
    /// Releases queued, and sent (or given up), since the start.
    queued: u64,
    sent: u64,
    /// The shortest lease seen (µs): the task renews every third of it.
    shortest_us: u64,
}

/// One per limiter: lease ids, the guards' way back to the store, and the
/// remote store's keeper task.
pub(crate) struct Keeper {
    home: Home,
    fallback: Arc<MemoryBackend>,
    seed: u64,
    next: AtomicU64,
    book: Mutex<Book>,
    /// Wakes the keeper task (a release was queued, or the limiter is gone).
    wake: Arc<tokio::sync::Notify>,
    /// Signalled after each batch of releases was sent.
    sent: tokio::sync::Notify,
    running: Arc<AtomicBool>,
}

impl fmt::Debug for Keeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let book = self.book.lock();
        f.debug_struct("Keeper")
            .field("live", &book.live.len())
            .field("queued", &book.queue.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // The task finds the keeper gone and stops.
        self.wake.notify_one();
    }
}

impl Keeper {
    pub(crate) fn new(store: &Store, fallback: Arc<MemoryBackend>) -> Arc<Self> {
        let home = match store {
            Store::Memory(memory) => Home::Memory(memory.clone()),
            Store::Remote(backend) => Home::Remote(backend.clone()),
        };
        // A random seed per keeper (std's hasher keys are random per
        // process), so two instances' lease ids do not follow each other.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(std::process::id().into());
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        Arc::new(Self {
            home,
            fallback,
            seed: hasher.finish(),
            next: AtomicU64::new(1),
            book: Mutex::new(Book::default()),
            wake: Arc::new(tokio::sync::Notify::new()),
            sent: tokio::sync::Notify::new(),
            running: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A fresh lease id: never 0, never repeated by this keeper (a
    /// bijection of a counter), unrelated to another keeper's.
    pub(crate) fn lease_id(&self) -> u64 {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let id = mix(n.wrapping_add(self.seed));
            if id != 0 {
                return id;
            }
        }
    }

    /// The guard of the in-flight slots `targets` took under an admission,
    /// if it took any.
    pub(crate) fn take(
        self: &Arc<Self>,
        targets: &[Target<'_>],
        admission: &Admission,
    ) -> Option<InFlight> {
        let place = match (admission, &self.home) {
            (Admission::Backend(_), Home::Memory(_)) => Place::Memory,
            (Admission::Backend(_), Home::Remote(_)) => Place::Remote,
            (Admission::Local { share, .. }, _) => Place::Local(*share),
            _ => return None,
        };
        let mut lease = 0;
        let slots: Box<[FlightSlot]> = targets
            .iter()
            .filter(|t| t.limit.is_in_flight())
            .map(|t| {
                lease = t.lease;
                FlightSlot {
                    name: t.name.into(),
                    key: t.key.render(),
                    limit: *t.limit,
                }
            })
            .collect();
        if slots.is_empty() {
            return None;
        }
        for slot in slots.iter() {
            counters::gauge_add("ratewall_in_flight", &slot.name, 1.0);
        }
        let held = Arc::new(AdmissionSlots {
            lease,
            slots,
            lost: AtomicBool::new(false),
        });
        if let Place::Remote = place {
            let shortest = held
                .slots
                .iter()
                .map(|s| s.limit.period_micros())
                .min()
                .unwrap_or(u64::MAX);
            let mut book = self.book.lock();
            book.live.insert(lease, held.clone());
            if book.shortest_us == 0 || shortest < book.shortest_us {
                book.shortest_us = shortest;
                // A shorter lease than the task renews for: wake it.
                self.wake.notify_one();
            }
            drop(book);
            self.ensure_task();
        }
        Some(InFlight {
            keeper: self.clone(),
            held,
            place,
        })
    }

    fn queue_release(self: &Arc<Self>, held: Arc<AdmissionSlots>) {
        let mut book = self.book.lock();
        book.live.remove(&held.lease);
        book.queue.push(held);
        book.queued += 1;
        drop(book);
        self.wake.notify_one();
        self.ensure_task();
    }

    /// Starts the keeper task on the current Tokio runtime unless it runs.
    fn ensure_task(self: &Arc<Self>) {
        let Home::Remote(_) = &self.home else {
            return;
        };
        if self.running.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "in-flight slots taken outside a Tokio runtime: they are neither renewed nor released, and \
                 come back when their lease expires"
            );
            return;
        };
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let running = Running(self.running.clone());
        runtime.spawn(keep(Arc::downgrade(self), self.wake.clone(), running));
    }

    /// Waits until every release queued so far was sent to the store.
    pub(crate) async fn flush(self: &Arc<Self>) {
        let target = self.book.lock().queued;
        loop {
            let mut sent = std::pin::pin!(self.sent.notified());
            sent.as_mut().enable();
            if self.book.lock().sent >= target {
                return;
            }
            self.ensure_task();
            sent.await;
        }
    }

    /// Live leases in the remote store held by this limiter.
    pub(crate) fn live(&self) -> usize {
        self.book.lock().live.len()
    }

    /// Sends the queued releases; whether there were any.
    async fn send_releases(&self, backend: &dyn Backend) -> bool {
        let queue = std::mem::take(&mut self.book.lock().queue);
        if queue.is_empty() {
            return false;
        }
        for chunk in queue.chunks(CHUNK) {
            let requests: Vec<Request<'_>> = chunk
                .iter()
                .flat_map(|held| {
                    held.slots
                        .iter()
                        .map(|slot| Request::new(&slot.key, &slot.limit, 1).with_holder(held.lease))
                })
                .collect();
            if let Err(error) = backend.refund(&requests, 0).await {
                tracing::warn!(
                    %error,
                    slots = requests.len(),
                    "could not give back in-flight slots; they come back when their lease expires"
                );
            }
        }
        self.book.lock().sent += queue.len() as u64;
        self.sent.notify_waiters();
        true
    }

    /// Renews every live lease; how long until the next renewal.
    async fn renew(&self, backend: &dyn Backend) -> Duration {
        let (live, shortest): (Vec<Arc<AdmissionSlots>>, u64) = {
            let book = self.book.lock();
            (
                book.live
                    .values()
                    .filter(|h| !h.lost.load(Ordering::Relaxed))
                    .cloned()
                    .collect(),
                book.shortest_us,
            )
        };
        for chunk in live.chunks(CHUNK) {
            let requests: Vec<Request<'_>> = chunk
                .iter()
                .flat_map(|held| {
                    held.slots
                        .iter()
                        .map(|slot| Request::new(&slot.key, &slot.limit, 1).with_holder(held.lease))
                })
                .collect();
            match backend.renew(&requests).await {
                Ok(found) => {
                    let mut at = 0;
                    for held in chunk {
                        for slot in held.slots.iter() {
                            if !found.get(at).copied().unwrap_or(true) {
                                held.lost.store(true, Ordering::Relaxed);
                                counters::counter_add(
                                    "ratewall_in_flight_expired_total",
                                    &slot.name,
                                );
                                tracing::warn!(
                                    limit = &*slot.name,
                                    "an in-flight slot's lease expired while its call was running (renewals \
                                     failed for longer than the lease): another call may take its place"
                                );
                            }
                            at += 1;
                        }
                    }
                }
                Err(error) => tracing::warn!(
                    %error,
                    slots = requests.len(),
                    "could not renew in-flight leases; they expire unless a later renewal succeeds"
                ),
            }
        }
        renew_every(shortest)
    }
}

/// A third of the shortest lease (the default lease's third when none was
/// seen yet).
fn renew_every(shortest_us: u64) -> Duration {
    let lease = if shortest_us == 0 {
        ratewall_grammar::DEFAULT_LEASE_TTL_US
    } else {
        shortest_us
    };
    Duration::from_micros(lease / 3)
}

/// Clears the running flag when the task ends (or its runtime drops it).
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The keeper task: sends releases as soon as they are queued, renews every
/// live lease every third of the shortest lease, stops with the keeper.
async fn keep(keeper: Weak<Keeper>, wake: Arc<tokio::sync::Notify>, _running: Running) {
    let mut next_renewal = tokio::time::Instant::now();
    loop {
        let Some(strong) = keeper.upgrade() else {
            return;
        };
        let Home::Remote(backend) = &strong.home else {
            return;
        };
        let backend = backend.clone();
        while strong.send_releases(&*backend).await {}
        let now = tokio::time::Instant::now();
        let shortest = strong.book.lock().shortest_us;
        if now >= next_renewal || next_renewal - now > renew_every(shortest) {
            let every = strong.renew(&*backend).await;
            next_renewal = tokio::time::Instant::now() + every;
        }
        drop(strong);
        let _ = tokio::time::timeout_at(next_renewal, wake.notified()).await;
    }
}

/// SplitMix64's finaliser: a bijection on `u64`.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_distinct_and_never_zero() {
        let store = Store::Memory(Arc::new(MemoryBackend::new()));
        let keeper = Keeper::new(&store, Arc::new(MemoryBackend::new()));
        let mut ids: Vec<u64> = (0..10_000).map(|_| keeper.lease_id()).collect();
        assert!(ids.iter().all(|&id| id != 0));
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 10_000);
        let other = Keeper::new(&store, Arc::new(MemoryBackend::new()));
        assert_ne!(keeper.lease_id(), other.lease_id());
    }

    #[test]
    fn renewals_come_every_third_of_the_shortest_lease() {
        assert_eq!(renew_every(0), Duration::from_micros(3_333_333));
        assert_eq!(renew_every(3_000_000), Duration::from_secs(1));
    }
}
