//! Waiting calls woken when room is given back in this process: a settled
//! estimate's refund (or any refund) wakes one call of the same name that
//! waits for room ([`Room::freed`]); if it is admitted it wakes the next,
//! so the room goes to as many as it fits, one store call each. A waiting
//! call otherwise sleeps for its refusal's `retry_after`: room given back
//! by another process is found then.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::limiter::timer;

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
    let mut sleep = pin!(timer::sleep_until(at));
    let mut notified = pin!(freed.notified());
    std::future::poll_fn(|cx| {
        if notified.as_mut().poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        sleep.as_mut().poll(cx).map(|()| false)
    })
    .await
}
