//! What a [`Key`](crate::Key) remembers for the raw requests' lane: where a
//! memory store keeps its state under one limit, and the counter of its
//! admissions, found on its first decision so the ones after skip both
//! lookups (a key built once and reused, as `limiter.requests().acquire`
//! is meant to be called).

use std::num::NonZeroU32;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

use metrics::Counter;

use crate::model::limit::StateId;

/// A counter's key, and its handle from the global recorder once asked
/// (counted through `layer::counters::count`).
#[derive(Debug)]
pub(crate) struct Counted {
    pub(crate) key: metrics::Key,
    pub(crate) global: OnceLock<Counter>,
}

impl Counted {
    pub(crate) fn new(key: metrics::Key) -> Self {
        Self {
            key,
            global: OnceLock::new(),
        }
    }
}

/// Where one memory store keeps the state of a key head under one limit,
/// and the counter of the head's admissions on the raw lane: one per store,
/// head and state, shared by every key that remembers it.
#[derive(Debug)]
pub(crate) struct Remembered {
    /// The memory store (its id) the partition is one of.
    pub(crate) store: NonZeroU32,
    /// The limit's state id the partition is for.
    pub(crate) state: StateId,
    /// The partition: the key head with that state.
    pub(crate) partition: u32,
    /// The key head (`prefix:{scope:`) every key remembering this shares:
    /// read here on the lane rather than sliced from each key's own text,
    /// which would read that text (a heap line per key) only to check the
    /// slice.
    pub(crate) head: Box<str>,
    /// The head's scope: the name its requests are counted by.
    pub(crate) name: Box<str>,
    /// `ratewall_decisions_total{limit = scope, outcome = "allowed", source = "backend"}`.
    pub(crate) allowed: Counted,
    /// `ratewall_decisions_total{limit = scope, outcome = "rejected", source = "backend"}`.
    pub(crate) rejected: Counted,
}

/// A key's memory: set once (its first decision on the raw lane of a
/// memory store), never changed. A key used with another store or limit
/// afterwards decides as one that remembers nothing. Invisible to the key's
/// equality, order and hash; a clone remembers the same.
///
/// Unwind safe as a key always was: what it holds is set once and never
/// changed, and its counter's handle only adds atomically, so a panic
/// cannot leave it half-made.
#[derive(Default)]
pub(crate) struct Memo(AssertUnwindSafe<OnceLock<Arc<Remembered>>>);

impl Clone for Memo {
    fn clone(&self) -> Self {
        Self(AssertUnwindSafe(self.0.0.clone()))
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_empty() { "-" } else { "remembered" })
    }
}

impl Memo {
    /// What is remembered for `store` and `state`, if that is it.
    #[inline]
    pub(crate) fn get(&self, store: NonZeroU32, state: StateId) -> Option<&Remembered> {
        self.0
            .get()
            .filter(|memo| memo.store == store && memo.state == state)
            .map(|memo| &**memo)
    }

    /// Whether nothing is remembered yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.get().is_none()
    }

    /// Remembers `memo` unless something is remembered already.
    pub(crate) fn set(&self, memo: Arc<Remembered>) {
        let _ = self.0.set(memo);
    }
}

impl PartialEq for Memo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Memo {}

impl PartialOrd for Memo {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Memo {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl std::hash::Hash for Memo {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}
