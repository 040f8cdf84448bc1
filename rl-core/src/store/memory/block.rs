//! Blocks ([`Limit::with_block`]): in each shard, the identities a limit
//! with a block refused, each under the limit's partition, with the end of
//! its block (µs). Kept apart from the states (which stay compact, and are
//! what every decision probes): only a limit with a block reads this table.
//! An ended block is idle: it is swept whenever the table has doubled since
//! its last sweep, so rotating identities cannot grow it without bound.

use super::*;
use crate::model::key::Key;

/// One identity blocked under one partition until `end` (µs).
#[derive(Debug)]
pub(super) struct Blocked {
    partition: u32,
    identity: Owned,
    end: u64,
}

impl Owned {
    /// Whether this is `identity` (an address is held as its number, under
    /// its partition tagged with `IPV4`).
    fn is(&self, identity: IdentityRef<'_>) -> bool {
        match (self, identity) {
            (Owned::Number(n), IdentityRef::Number(m)) => *n == m,
            (Owned::Number(n), IdentityRef::Ipv4(ip)) => *n == u64::from(ip),
            (Owned::Text(text), IdentityRef::Text(_)) => identity == IdentityRef::Text(text),
            _ => false,
        }
    }

    /// The identity as [`hash_of`] hashes it (an address as its number).
    fn as_ref(&self) -> IdentityRef<'_> {
        match self {
            Owned::Number(n) => IdentityRef::Number(*n),
            Owned::Text(text) => IdentityRef::Text(text),
        }
    }
}

fn matches(at: &Located, identity: IdentityRef<'_>) -> impl Fn(&Blocked) -> bool {
    move |b| b.partition == at.partition && b.identity.is(identity)
}

/// The end of the block of `identity` under `at`'s partition, if it is
/// after `now`.
pub(super) fn live(
    shard: &Shard,
    at: &Located,
    identity: IdentityRef<'_>,
    now: u64,
) -> Option<u64> {
    if shard.blocks.is_empty() {
        return None;
    }
    shard
        .blocks
        .find(at.hash, matches(at, identity))
        .map(|b| b.end)
        .filter(|&end| end > now)
}

/// Blocks `identity` under `at`'s partition until `end`, sweeping ended
/// blocks first when the table has doubled since its last sweep.
pub(super) fn write(
    shard: &mut Shard,
    at: &Located,
    identity: IdentityRef<'_>,
    end: u64,
    now: u64,
) {
    if let Some(found) = shard.blocks.find_mut(at.hash, matches(at, identity)) {
        found.end = end;
        return;
    }
    if shard.blocks.len() >= shard.blocks_sweep_at {
        sweep(shard, now);
        shard.blocks_sweep_at = (shard.blocks.len() * 2).max(MIN_SWEEP);
    }
    let hasher = shard.hasher.clone();
    shard.blocks.insert_unique(
        at.hash,
        Blocked {
            partition: at.partition,
            identity: Owned::of(identity),
            end,
        },
        move |b| hash_of(&hasher, b.partition, b.identity.as_ref()),
    );
}

/// Lifts the block of `identity` under `at`'s partition; its end, if it
/// had one.
pub(super) fn lift(shard: &mut Shard, at: &Located, identity: IdentityRef<'_>) -> Option<u64> {
    if shard.blocks.is_empty() {
        return None;
    }
    let found = shard
        .blocks
        .find_entry(at.hash, matches(at, identity))
        .ok()?;
    Some(found.remove().0.end)
}

/// Drops every block ended by `now`; returns how many.
pub(super) fn sweep(shard: &mut Shard, now: u64) -> usize {
    let before = shard.blocks.len();
    shard.blocks.retain(|b| b.end > now);
    let hasher = shard.hasher.clone();
    if shard.blocks.len().saturating_mul(4) <= shard.blocks.capacity() {
        shard.blocks.shrink_to(shard.blocks.len() * 2, |b| {
            hash_of(&hasher, b.partition, b.identity.as_ref())
        });
    }
    before - shard.blocks.len()
}

/// The blocks of a limit that refused in an all-or-nothing call's first
/// pass (`decisions`, one per target): each refusing target whose limit
/// blocks, and whose identity is not blocked already, is blocked from
/// `now` (a refusal during a block does not extend it).
pub(super) fn refused(
    guards: &mut Locked<'_, Shard>,
    targets: &[Target<'_>],
    located: &[Located],
    now: u64,
    decisions: &Decisions,
) {
    for ((target, at), decision) in targets.iter().zip(located).zip(decisions.iter()) {
        let block = target.limit.block_micros();
        if block == 0 || decision.allowed() {
            continue;
        }
        let shard = guards.shard(at.shard);
        if live(shard, at, target.key.identity, now).is_none() {
            write(
                shard,
                at,
                target.key.identity,
                now.saturating_add(block),
                now,
            );
        }
    }
}

/// A block of one identity, as [`MemoryBackend::blocks_of`] reports it.
pub(crate) type Found = (StateId, u64);

impl MemoryBackend {
    /// Where `key`'s identity is held under each partition of `key`'s
    /// head: one location per limit that ever decided there.
    fn partitions_of(&self, key: &Key) -> SmallVec<[(StateId, Located); 4]> {
        let identity = key.identity_ref();
        self.partitions
            .of_head(key.head())
            .into_iter()
            .map(|(state, partition)| {
                let partition = match identity {
                    IdentityRef::Ipv4(_) => partition | IPV4,
                    _ => partition,
                };
                let hash = hash_of(self.shards.hasher(), partition, identity);
                let located = Located {
                    partition,
                    hash,
                    shard: self.shards.index(hash),
                };
                (state, located)
            })
            .collect()
    }

    /// The blocks of `key`'s identity (every limit of `key`'s head) not
    /// ended by now: each limit's state id and the time left (µs), in no
    /// order ([`Backend::blocks`] sorts what it answers).
    pub(crate) fn blocks_of(&self, key: &Key) -> Vec<Found> {
        let now = self.clock.now_micros();
        self.partitions_of(key)
            .into_iter()
            .filter_map(|(state, at)| {
                let mut shard = self.shards.at(at.shard).lock();
                let now = shard.now(now);
                live(&shard, &at, key.identity_ref(), now).map(|end| (state, end - now))
            })
            .collect()
    }

    /// Lifts every block of `key`'s identity (every limit of `key`'s head);
    /// whether one had not ended. What [`Backend::unblock`] does.
    pub(crate) fn unblock_key(&self, key: &Key) -> bool {
        let now = self.clock.now_micros();
        let mut lifted = false;
        for (_, at) in self.partitions_of(key) {
            let mut shard = self.shards.at(at.shard).lock();
            let now = shard.now(now);
            if lift(&mut shard, &at, key.identity_ref()).is_some_and(|end| end > now) {
                lifted = true;
            }
        }
        lifted
    }
}
