//! One sharded table: a fixed, power-of-two set of cache-padded shards, each
//! behind its own lock, a key's shard chosen by its hash. The memory store,
//! the lease layer and the deny cache keep their state in one of these.
//!
//! The hash is computed once per key and serves twice: its bits 32.. pick
//! the shard, and the whole hash probes the shard's own hash table (which
//! uses the low bits for its bucket and the top 7 for its control bytes), so
//! the two never correlate.
//!
//! **Hashing attacker-chosen keys.** Keys are often chosen by clients (IP
//! addresses, API keys, phone numbers). The hash is foldhash (hashbrown's
//! own), each table seeded with 64 bits from the operating system's
//! randomness (through std's `RandomState`), not only from what foldhash
//! derives by itself (addresses and the time): an attacker cannot
//! precompute colliding keys offline, and this crate never exposes hash
//! values or table order (no iteration reaches a response). foldhash makes
//! no claim against an *interactive* attacker deriving the seed from timing;
//! against that, every table is bounded (swept when it grows, capped per
//! shard for the deny cache and the leases), and a flood of colliding keys
//! would slow only the shards it lands in. SipHash (std's `RandomState`)
//! would resist that too, at a measured cost: +138 instructions per
//! decision of the in-memory `#[rate_limit]` fn (563 against 425, +32 %),
//! +147 per request through the route layer (+1.3 %), callgrind, see
//! `docs/performance.md` ("Hashing"). Seeding costs nothing per decision.

use std::hash::{BuildHasher as _, Hash};

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

/// The hasher of every sharded table (see the module docs).
pub(crate) type Hasher = foldhash::fast::SeedableRandomState;

/// A hasher seeded from the operating system's randomness (see the module
/// docs).
fn seeded() -> Hasher {
    let seed = std::hash::RandomState::new().hash_one(0x5eed_u64);
    Hasher::with_seed(seed, foldhash::SharedSeed::global_random())
}

/// Shards behind locks of type `L` (a `Mutex` or an `RwLock` of a shard).
pub(crate) struct Sharded<L> {
    shards: Box<[CachePadded<L>]>,
    hasher: Hasher,
}

impl<L> std::fmt::Debug for Sharded<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharded")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl<L> Sharded<L> {
    /// `per_core` shards for each core this process may run on, rounded up
    /// to a power of two; `make` builds each shard's lock with the table's
    /// hasher (for tables inside a shard that hash the same keys).
    pub(crate) fn per_core(per_core: usize, make: impl FnMut(&Hasher) -> L) -> Self {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        Self::new(cores * per_core, make)
    }

    /// `count` shards (rounded up to a power of two).
    pub(crate) fn new(count: usize, mut make: impl FnMut(&Hasher) -> L) -> Self {
        let hasher = seeded();
        let shards = (0..count.max(1).next_power_of_two())
            .map(|_| CachePadded::new(make(&hasher)))
            .collect();
        Self { shards, hasher }
    }

    /// The hasher keys of this table are hashed with.
    #[inline]
    pub(crate) fn hasher(&self) -> &Hasher {
        &self.hasher
    }

    /// The hash of `key`.
    #[inline]
    pub(crate) fn hash(&self, key: impl Hash) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a hash.
    #[inline]
    pub(crate) fn index(&self, hash: u64) -> usize {
        ((hash >> 32) as usize) & (self.shards.len() - 1)
    }

    /// Shard `index`.
    #[inline]
    pub(crate) fn at(&self, index: usize) -> &L {
        &self.shards[index]
    }

    /// The shard of a hash.
    #[inline]
    pub(crate) fn of(&self, hash: u64) -> &L {
        self.at(self.index(hash))
    }

    /// Every shard.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &L> {
        self.shards.iter().map(|s| &**s)
    }

    /// How many shards.
    pub(crate) fn len(&self) -> usize {
        self.shards.len()
    }
}

impl<S> Sharded<Mutex<S>> {
    /// Locks the shards at `indices`, each once and in index order (so two
    /// callers locking overlapping sets never deadlock).
    pub(crate) fn lock(&self, indices: impl IntoIterator<Item = usize>) -> Locked<'_, S> {
        let mut order: SmallVec<[usize; 4]> = indices.into_iter().collect();
        order.sort_unstable();
        order.dedup();
        Locked {
            guards: order.iter().map(|&i| self.shards[i].lock()).collect(),
            order,
        }
    }
}

/// Shards locked together (one decision over several keys).
pub(crate) struct Locked<'a, S> {
    order: SmallVec<[usize; 4]>,
    guards: SmallVec<[MutexGuard<'a, S>; 4]>,
}

impl<S> Locked<'_, S> {
    /// Locked shard `index` (one of those asked for).
    #[inline]
    pub(crate) fn shard(&mut self, index: usize) -> &mut S {
        let at = self.order.binary_search(&index).unwrap_or_default();
        &mut self.guards[at]
    }

    /// Every locked shard.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut S> {
        self.guards.iter_mut().map(|g| &mut **g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_a_power_of_two_and_a_hash_picks_one_by_its_middle_bits() {
        let table: Sharded<Mutex<u32>> = Sharded::new(5, |_| Mutex::new(0));
        assert_eq!(table.len(), 8);
        assert_eq!(table.index(3 << 32), 3);
        assert_eq!(
            table.index(u64::from(u32::MAX)),
            0,
            "low bits are the tables' own"
        );
    }

    #[test]
    fn locking_several_shards_takes_each_once_in_order() {
        let table: Sharded<Mutex<u32>> = Sharded::new(4, |_| Mutex::new(0));
        let mut locked = table.lock([3, 1, 3]);
        *locked.shard(3) += 1;
        *locked.shard(1) += 2;
        assert_eq!(locked.iter_mut().map(|s| *s).collect::<Vec<_>>(), [2, 1]);
        drop(locked);
        assert_eq!(*table.at(3).lock(), 1);
    }
}
