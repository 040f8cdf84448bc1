//! Waiting calls woken when room is given back: in this process, a settled
//! estimate's refund (or any refund) wakes one call of the same name that
//! waits for room ([`Room::freed`]); in another process sharing the store,
//! its store's notice names the key, and wakes one call waiting under that
//! key ([`Room::freed_key`], while the limiter hears notices: see
//! [`crate::backend::Backend::subscribe_refunds`]). A woken call that is
//! admitted wakes the next, so the room goes to as many as it fits, one
//! store call each. A waiting call otherwise sleeps for its refusal's
//! `retry_after`: room given back by a process whose notice never came is
//! found then.
//!
//! And calls moved when this process hears a pause ([`Pauses::heard`],
//! from `Limiter::hold`): a call sleeping until a slot it reserved before
//! the pause was written, for a time inside it, reserves again, and the
//! store finds its new slot after the pause.

use std::collections::HashMap;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::limiter::timer;
use crate::model::clock::later;
use crate::store::target::Target;

/// The waiting calls of one limiter, by call name, and by rendered key
/// while the limiter hears its store's notices.
#[derive(Debug, Default)]
pub(crate) struct Room {
    waiting: Mutex<HashMap<Box<str>, Arc<Notify>>>,
    /// Whether the store tells of room given back elsewhere (set once,
    /// when the limiter is built): only then do waiting calls register
    /// their keys.
    hears: AtomicBool,
    /// The calls waiting under each key: an entry lives while a call
    /// waits under its key ([`Watching`]).
    keys: Mutex<HashMap<Box<str>, Waiters>>,
    /// How many keys `keys` holds (read without its lock).
    watched: AtomicUsize,
}

/// What the calls waiting under one key wait on, and how many they are.
type Waiters = (Arc<Notify>, usize);

impl Room {
    /// What a call named `name` waits on (made on its first wait; one per
    /// name, as many as the process has call names).
    pub(crate) fn of(&self, name: &str) -> Arc<Notify> {
        let mut waiting = self.waiting.lock();
        if let Some(notify) = waiting.get(name) {
            return notify.clone();
        }
        let notify = Arc::new(Notify::new());
        waiting.insert(Box::from(name), notify.clone());
        notify
    }

    /// Room was given back to calls named `name`: one waiting call tries
    /// again now.
    pub(crate) fn freed(&self, name: &str) {
        if let Some(notify) = self.waiting.lock().get(name) {
            notify.notify_one();
        }
    }

    /// From now on, waiting calls register their keys, for
    /// [`Room::freed_key`].
    pub(crate) fn hear(&self) {
        self.hears.store(true, Ordering::Relaxed);
    }

    /// Whether waiting calls register their keys ([`Room::hear`]).
    pub(crate) fn hears(&self) -> bool {
        self.hears.load(Ordering::Relaxed)
    }

    /// Room was given back under the rendered key `key` (by another
    /// process): one call waiting under it tries again now. Nothing to do
    /// (no lock taken) while no call waits under any key.
    pub(crate) fn freed_key(&self, key: &str) {
        if self.watched.load(Ordering::Relaxed) == 0 {
            return;
        }
        let keys = self.keys.lock();
        if let Some((notify, _)) = keys.get(key) {
            notify.notify_one();
        }
    }

    /// Room was given back under the keys of `targets` in this process:
    /// one call waiting under each tries again now (a call of another
    /// name than the one given back, which [`Room::freed`] does not
    /// wake). Nothing is rendered while no call waits under a key.
    pub(crate) fn freed_targets(&self, targets: &[Target<'_>]) {
        if self.watched.load(Ordering::Relaxed) == 0 {
            return;
        }
        for target in targets {
            self.freed_key(target.key.render().as_str());
        }
    }

    /// Registers a waiting call under its rendered `keys` until the
    /// returned guard drops (nothing, unless the limiter hears notices).
    pub(crate) fn watch(&self, keys: &[Box<str>]) -> Watching<'_> {
        let mut watched = SmallVec::new();
        if self.hears.load(Ordering::Relaxed) && !keys.is_empty() {
            let mut map = self.keys.lock();
            for key in keys {
                let (notify, count) = map.entry(key.clone()).or_insert_with(|| {
                    self.watched.fetch_add(1, Ordering::Relaxed);
                    (Arc::new(Notify::new()), 0)
                });
                *count += 1;
                watched.push((key.clone(), notify.clone()));
            }
        }
        Watching {
            room: self,
            watched,
        }
    }
}

/// A waiting call registered under its keys ([`Room::watch`]); the entries
/// go when the last call waiting under a key stops.
pub(crate) struct Watching<'r> {
    room: &'r Room,
    watched: SmallVec<[(Box<str>, Arc<Notify>); 2]>,
}

impl Watching<'_> {
    /// Room was given back and this call was admitted: the next call
    /// waiting under one of its keys tries too.
    pub(crate) fn pass_on(&self) {
        for (_, notify) in &self.watched {
            notify.notify_one();
        }
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        if self.watched.is_empty() {
            return;
        }
        let mut map = self.room.keys.lock();
        for (key, _) in self.watched.drain(..) {
            if let Some((_, count)) = map.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    map.remove(&key);
                    self.room.watched.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Sleeps until `at`, or until room is given back to the call's name or
/// under one of the keys it watches (`true`: woken by it).
pub(crate) async fn sleep_or_freed(at: Instant, freed: &Notify, watching: &Watching<'_>) -> bool {
    if watching.watched.is_empty() {
        return sleep_or_told(at, pin!(freed.notified())).await;
    }
    let mut by_name = pin!(freed.notified());
    let mut by_key: SmallVec<[Pin<Box<Notified<'_>>>; 2]> = watching
        .watched
        .iter()
        .map(|(_, notify)| Box::pin(notify.notified()))
        .collect();
    let mut sleep = pin!(timer::sleep_until(at));
    std::future::poll_fn(|cx| {
        if by_name.as_mut().poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        // (A notification one of these received and the call leaves
        // unused goes to the next call waiting under that key when the
        // future drops: tokio's `Notified` forwards it.)
        if by_key
            .iter_mut()
            .any(|told| told.as_mut().poll(cx).is_ready())
        {
            return Poll::Ready(true);
        }
        sleep.as_mut().poll(cx).map(|()| false)
    })
    .await
}

/// Sleeps until `at`, or until `told` resolves (`true`: woken by it).
pub(crate) async fn sleep_or_told(at: Instant, mut told: Pin<&mut Notified<'_>>) -> bool {
    let mut sleep = pin!(timer::sleep_until(at));
    std::future::poll_fn(|cx| {
        if told.as_mut().poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        sleep.as_mut().poll(cx).map(|()| false)
    })
    .await
}

/// Rendered keys ([`Pauses::keys`]).
pub(crate) type PausedKeys = SmallVec<[Box<str>; 2]>;

/// The pauses this process heard, by rendered key: when each was asked for
/// and when it ends. An entry goes once its pause has ended.
#[derive(Debug, Default)]
pub(crate) struct Pauses {
    heard: Mutex<HashMap<Box<str>, Heard>>,
    /// Told of every pause heard: each call sleeping until a reserved slot
    /// checks its keys.
    news: Notify,
}

/// One key's latest pause.
#[derive(Debug, Clone, Copy)]
struct Heard {
    /// When the pause was asked of the store.
    at: Instant,
    until: Instant,
}

impl Pauses {
    /// The keys of `targets`, rendered: what pauses are kept by.
    pub(crate) fn keys(targets: &[Target<'_>]) -> PausedKeys {
        targets
            .iter()
            .map(|t| Box::from(t.key.render().as_str()))
            .collect()
    }

    /// A pause of `pause` was written over `keys`, asked of the store at
    /// `at`.
    pub(crate) fn heard(&self, keys: PausedKeys, at: Instant, pause: Duration) {
        let until = later(at, pause);
        {
            let mut heard = self.heard.lock();
            let now = Instant::now();
            heard.retain(|_, h| h.until > now);
            for key in keys {
                heard
                    .entry(key)
                    .and_modify(|h| {
                        *h = Heard {
                            at,
                            until: h.until.max(until),
                        }
                    })
                    .or_insert(Heard { at, until });
            }
        }
        self.news.notify_waiters();
    }

    /// Whether a pause over one of `keys`, asked after `reserved` (when a
    /// call's slot was asked for), ends after that slot (`slot`): the store
    /// had not seen the pause when it gave the slot, which falls inside it.
    pub(crate) fn cut(&self, keys: &[Box<str>], reserved: Instant, slot: Instant) -> bool {
        let heard = self.heard.lock();
        keys.iter()
            .filter_map(|key| heard.get(key))
            .any(|h| h.at > reserved && h.until > slot)
    }

    /// Resolves once a pause is heard (after it is enabled).
    pub(crate) fn news(&self) -> Notified<'_> {
        self.news.notified()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use tokio::sync::Notify;

    use super::{Room, sleep_or_freed};

    fn sleeps(room: &Room, keys: &[Box<str>], told: impl FnOnce(&Room)) -> bool {
        let watching = room.watch(keys);
        told(room);
        let far = Instant::now() + Duration::from_secs(3_600);
        let name = Notify::new();
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    sleep_or_freed(far, &name, &watching),
                )
                .await
                .unwrap_or(false)
            })
    }

    #[test]
    fn a_call_waiting_under_a_key_is_woken_by_a_notice_of_that_key_only_while_notices_are_heard() {
        let room = Room::default();
        let keys: Vec<Box<str>> = vec!["app:{jobs:acme}".into(), "app:{ip:1.2.3.4}".into()];
        // Not hearing: nothing is registered, nothing is looked up.
        assert!(room.watch(&keys).watched.is_empty());
        room.hear();
        // Told before it sleeps (a notice between a refusal and the
        // sleep): the sleep ends at once.
        assert!(sleeps(&room, &keys, |room| room.freed_key("app:{ip:1.2.3.4}")));
        // Another key's notice does not wake it.
        let other = std::thread::scope(|scope| {
            let waiting = scope.spawn(|| sleeps(&room, &keys, |_| {}));
            while room.watched.load(Ordering::Relaxed) < 2 {
                std::thread::yield_now();
            }
            room.freed_key("app:{jobs:other}");
            std::thread::sleep(Duration::from_millis(50));
            let early = waiting.is_finished();
            room.freed_key("app:{jobs:acme}");
            (early, waiting.join().expect("waiter"))
        });
        assert_eq!(other, (false, true));
        // Every entry goes with the last call waiting under it.
        assert!(room.keys.lock().is_empty());
        assert_eq!(room.watched.load(Ordering::Relaxed), 0);
    }
}
