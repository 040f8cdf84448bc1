//! Waiting calls woken when room is given back in this process: a settled
//! estimate's refund (or any refund) wakes one call of the same name that
//! waits for room ([`Room::freed`]); if it is admitted it wakes the next,
//! so the room goes to as many as it fits, one store call each. A waiting
//! call otherwise sleeps for its refusal's `retry_after`: room given back
//! by another process is found then.
//!
//! And calls moved when this process hears a pause ([`Pauses::heard`],
//! from `Limiter::hold`): a call sleeping until a slot it reserved before
//! the pause was written, for a time inside it, reserves again, and the
//! store finds its new slot after the pause.

use std::collections::HashMap;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::limiter::timer;
use crate::model::clock::later;
use crate::store::target::Target;

/// The waiting calls of one limiter, by call name.
#[derive(Debug, Default)]
pub(crate) struct Room {
    waiting: Mutex<HashMap<Box<str>, Arc<Notify>>>,
}

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
}

/// Sleeps until `at`, or until room is given back (`true`: woken by it).
pub(crate) async fn sleep_or_freed(at: Instant, freed: &Notify) -> bool {
    sleep_or_told(at, pin!(freed.notified())).await
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
