//! `rl_decisions_total{limit, outcome, source}`, counted without rebuilding
//! the metric key on every decision.
//!
//! `metrics::counter!` with runtime labels allocates the label vector and
//! hashes the key on each call (about a third of an in-memory decision).
//! The key depends only on the call's name, the outcome and the source, so
//! each thread keeps the keys it built in a small direct-mapped table. The
//! recorder is still asked for the counter on every call, so installing or
//! replacing a recorder (global or local) takes effect at once.

use std::cell::RefCell;

use metrics::{Key, Label, Level, Metadata};

/// Slots per thread (a power of two); a collision only rebuilds a key.
const SLOTS: usize = 32;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

struct Slot {
    outcome: &'static str,
    source: &'static str,
    /// The name, compared by content: a name's string may be freed and
    /// another allocated at its address.
    name: Box<str>,
    key: Key,
}

thread_local! {
    static KEYS: RefCell<[Option<Slot>; SLOTS]> = const { RefCell::new([const { None }; SLOTS]) };
}

/// Adds one to `rl_decisions_total{limit = name, outcome, source}`.
pub(crate) fn decision(name: &str, outcome: &'static str, source: &'static str) {
    let index = ((name.as_ptr() as usize >> 3)
        ^ (outcome.as_ptr() as usize >> 3)
        ^ (source.as_ptr() as usize >> 2)
        ^ name.len())
        & (SLOTS - 1);
    let counted = KEYS.try_with(|keys| {
        let Ok(mut keys) = keys.try_borrow_mut() else {
            return false;
        };
        let slot = &mut keys[index];
        let hit = slot.as_ref().is_some_and(|s| {
            std::ptr::eq(s.outcome, outcome) && std::ptr::eq(s.source, source) && *s.name == *name
        });
        if !hit {
            *slot = Some(Slot {
                outcome,
                source,
                name: name.into(),
                key: key(name, outcome, source),
            });
        }
        let key = &slot.as_ref().expect("filled above").key;
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(1);
        true
    });
    if counted != Ok(true) {
        // Thread-local storage is being torn down (or in use): the slow way.
        metrics::with_recorder(|recorder| {
            recorder.register_counter(&key(name, outcome, source), &METADATA)
        })
        .increment(1);
    }
}

/// The keys of a call's commonest outcomes, built once when the call's spec
/// is resolved: what the hot path counts without any lookup.
#[derive(Debug)]
pub(crate) struct Prebuilt {
    /// `outcome="allowed", source="backend"`.
    pub(crate) allowed: Key,
    /// `outcome="rejected", source="backend"`.
    pub(crate) rejected: Key,
    /// `outcome="allowed", source="lease"`.
    pub(crate) leased: Key,
}

impl Prebuilt {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            allowed: key(name, "allowed", "backend"),
            rejected: key(name, "rejected", "backend"),
            leased: key(name, "allowed", "lease"),
        }
    }
}

/// Adds one to the counter of a prebuilt key.
#[inline]
pub(crate) fn count(key: &Key) {
    metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(1);
}

fn key(name: &str, outcome: &'static str, source: &'static str) -> Key {
    Key::from_parts(
        "rl_decisions_total",
        vec![
            Label::new("limit", name.to_owned()),
            Label::new("outcome", outcome),
            Label::new("source", source),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Counters;

    #[test]
    fn counts_land_under_the_same_key_as_the_counter_macro_and_follow_the_recorder() {
        let first = Counters::default();
        metrics::with_local_recorder(&first, || {
            decision("sms", "allowed", "backend");
            decision(&String::from("sms"), "allowed", "backend");
            decision("login", "rejected", "cache");
            let name = "sms";
            metrics::counter!("rl_decisions_total", "limit" => name, "outcome" => "allowed", "source" => "backend")
                .increment(1);
        });
        let second = Counters::default();
        metrics::with_local_recorder(&second, || decision("sms", "allowed", "backend"));
        assert_eq!(first.get(&key("sms", "allowed", "backend")), Some(3));
        assert_eq!(first.get(&key("login", "rejected", "cache")), Some(1));
        assert_eq!(second.get(&key("sms", "allowed", "backend")), Some(1));
    }
}
