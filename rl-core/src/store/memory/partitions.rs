//! The partitions of a memory store: each key head with one algorithm,
//! period and slot count, interned once as a `u32`.

use super::*;

/// The partitions of a store: `(key head, state id)` to a `u32`.
#[derive(Default)]
pub(super) struct Partitions {
    ids: RwLock<HashMap<(Box<str>, StateId), u32>>,
}

/// A borrowed partition name, to look one up without allocating.
#[derive(Hash)]
struct PartitionRef<'a>(&'a str, StateId);

impl Equivalent<(Box<str>, StateId)> for PartitionRef<'_> {
    fn equivalent(&self, key: &(Box<str>, StateId)) -> bool {
        *key.0 == *self.0 && key.1 == self.1
    }
}

/// The partition this thread looked up last: its store, name and id.
/// Partitions are never removed, so a hit stays right; it spares the shared
/// lock (whose reader count every core would write) on each call that comes
/// without a prebuilt [`Slot`].
type LastPartition = Option<(NonZeroU32, Box<str>, StateId, u32)>;

thread_local! {
    static LAST_PARTITION: std::cell::RefCell<LastPartition> = const { std::cell::RefCell::new(None) };
}

impl Partitions {
    /// [`Partitions::get_or_insert`] of store `store`, through this
    /// thread's last lookup.
    pub(super) fn get_cached(&self, store: NonZeroU32, head: &str, state: StateId) -> u32 {
        LAST_PARTITION.with(|last| {
            let mut last = last.borrow_mut();
            if let Some((s, h, st, id)) = last.as_ref()
                && *s == store
                && *st == state
                && **h == *head
            {
                return *id;
            }
            let id = self.get_or_insert(head, state);
            *last = Some((store, head.into(), state, id));
            id
        })
    }

    pub(super) fn get_or_insert(&self, head: &str, state: StateId) -> u32 {
        let name = PartitionRef(head, state);
        if let Some(id) = self.ids.read().get(&name) {
            return *id;
        }
        let mut ids = self.ids.write();
        // Below the `IPV4` tag (2^31 partitions: never reached in practice).
        let next = u32::try_from(ids.len()).map_or(IPV4 - 1, |n| n.min(IPV4 - 1));
        *ids.entry((head.into(), state)).or_insert(next)
    }

    /// Every partition of key head `head`, with its state id.
    pub(super) fn of_head(&self, head: &str) -> Vec<(StateId, u32)> {
        self.ids
            .read()
            .iter()
            .filter(|((h, _), _)| **h == *head)
            .map(|((_, state), id)| (*state, *id))
            .collect()
    }

    pub(super) fn len(&self) -> usize {
        self.ids.read().len()
    }
}
