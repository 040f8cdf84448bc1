//! How the memory store holds an identity (a number as is, text inline),
//! hashes it under its partition, and sweeps the tables that hold them.

use super::*;

/// How an entry holds its identity: a number as is (what most keys are),
/// text inline up to 24 bytes.
pub(super) trait IdentityForm: Sized {
    /// Whether this is `identity`.
    fn is(&self, identity: IdentityRef<'_>) -> bool;
    /// The identity, held.
    fn hold(identity: IdentityRef<'_>) -> Self;
    /// The identity as the pipeline carries it.
    fn as_ref(&self) -> IdentityRef<'_>;
}

/// Numbers and IPv4 addresses share the number tables: an address is held
/// as its `u32` value under its partition tagged with [`IPV4`], so it never
/// meets the number of the same value (the partitions differ).
impl IdentityForm for u64 {
    #[inline]
    fn is(&self, identity: IdentityRef<'_>) -> bool {
        match identity {
            IdentityRef::Number(n) => n == *self,
            IdentityRef::Ipv4(ip) => u64::from(ip) == *self,
            IdentityRef::Text(_) => false,
        }
    }
    fn hold(identity: IdentityRef<'_>) -> Self {
        match identity {
            IdentityRef::Number(n) => n,
            IdentityRef::Ipv4(ip) => u64::from(ip),
            IdentityRef::Text(_) => unreachable!("text is held in the text tables"),
        }
    }
    /// As a number, even for an address: what [`hash_of`] hashes either by
    /// (the tagged partition tells them apart).
    fn as_ref(&self) -> IdentityRef<'_> {
        IdentityRef::Number(*self)
    }
}

/// The bit of a partition id that marks its IPv4 identities (held in the
/// number tables under `partition | IPV4`); partition ids stay below it.
pub(super) const IPV4: u32 = 1 << 31;

impl IdentityForm for CompactString {
    #[inline]
    fn is(&self, identity: IdentityRef<'_>) -> bool {
        identity == IdentityRef::Text(self)
    }
    fn hold(identity: IdentityRef<'_>) -> Self {
        identity.with_text(|text| CompactString::new(text))
    }
    fn as_ref(&self) -> IdentityRef<'_> {
        IdentityRef::Text(self)
    }
}

/// The hash of an identity under a partition (what locates it, and what
/// its table rehashes it by).
#[inline]
pub(super) fn hash_of(hasher: &Hasher, partition: u32, identity: IdentityRef<'_>) -> u64 {
    match identity {
        IdentityRef::Number(n) => hasher.hash_one((u64::from(partition) << 32) ^ n.rotate_left(32)),
        // The partition is tagged with `IPV4` (see `MemoryBackend::locate`).
        IdentityRef::Ipv4(ip) => {
            hasher.hash_one((u64::from(partition) << 32) ^ u64::from(ip).rotate_left(32))
        }
        IdentityRef::Text(text) => hasher.hash_one((partition, text)),
    }
}

/// Drops the idle states of `table`, then gives back its room if that left
/// it at most a quarter full: it keeps twice what it holds, so its entries
/// stay as close together as when they were inserted (a table grown for
/// states since swept would otherwise spread the live ones over twice the
/// cache lines, for good).
pub(super) fn sweep_table<S, T: RowTable<Row: Row<S>>>(
    table: &mut T,
    now: u64,
    hasher: &Hasher,
    packing: &mut Packing,
) {
    table.retain(
        packing,
        |row, packing| {
            if row.is_idle(packing, now) {
                row.forget(packing);
                return false;
            }
            true
        },
        |row, packing| row.hash(packing, hasher),
    );
    let held = table.len();
    if held.saturating_mul(4) <= table.capacity() {
        table.shrink_to(held * 2, |row| row.hash(packing, hasher));
    }
}
