//! Room given back by other processes, as the store tells of it
//! ([`Backend::subscribe_refunds`]): the deny cache forgets what it
//! remembered for the key, then one call waiting under the key wakes and
//! asks the store again ([`Room::freed_key`]). In that order, so the woken
//! call is not refused from the cache.
//!
//! Asked for once, when a limiter over a remote store is built; a backend
//! that tells nothing (the default) leaves the limiter as it was: other
//! processes' refunds seen within the deny cache's maximum hold.

use std::sync::{Arc, Weak};

use crate::layer::counters::{self, count};
use crate::layer::deny_cache::DenyLayer;
use crate::limiter::room::Room;
use crate::model::memo::Counted;
use crate::store::backend::{Backend, Hear, RefundNotices};
use crate::store::target::KeyRef;

/// What one limiter does with its store's notices.
pub(crate) struct Heard {
    prefix: Box<str>,
    deny: Option<Arc<DenyLayer>>,
    room: Arc<Room>,
    /// `ratewall_refund_notices_total{prefix}`.
    notices: Counted,
}

impl std::fmt::Debug for Heard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heard")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Heard {
    /// Asks `backend` to tell this limiter (its deny layer `deny`, its
    /// waiting calls `room`, keys under `prefix`) of room given back
    /// elsewhere: `Some` (to keep for as long as the limiter lives) when
    /// it will.
    pub(crate) fn subscribe(
        backend: &dyn Backend,
        prefix: &str,
        deny: Option<Arc<DenyLayer>>,
        room: Arc<Room>,
    ) -> Option<Arc<Self>> {
        let heard = Arc::new(Self {
            prefix: prefix.into(),
            deny,
            room: room.clone(),
            notices: counters::prefixed("ratewall_refund_notices_total", prefix),
        });
        let hear: Arc<dyn Hear> = heard.clone();
        let weak: Weak<dyn Hear> = Arc::downgrade(&hear);
        if !backend.subscribe_refunds(prefix, RefundNotices::new(weak)) {
            return None;
        }
        room.hear();
        Some(heard)
    }
}

impl Hear for Heard {
    fn given_back(&self, text: &str, key: KeyRef<'_>) {
        count(&self.notices);
        if let Some(deny) = &self.deny {
            deny.given_back(&key);
        }
        self.room.freed_key(text);
    }

    fn subscribed(&self, live: bool) {
        metrics::gauge!("ratewall_refund_notices_subscribed", "prefix" => self.prefix.to_string())
            .set(if live { 1.0 } else { 0.0 });
    }
}
