//! How a table holds one identity's state: an [`Entry`] as it is, or a
//! GCRA state of a number packed into 20 bytes ([`PackedTat`]).
//!
//! A GCRA state is the TAT, when it was written and the interval it was
//! measured in ([`Tat`], kept whole so that a live limit change converts
//! exactly). Under a number it is what most identities hold, so its row is
//! packed:
//! - the number, 8 bytes;
//! - a class, 2 bytes: the row's partition and the interval its state was
//!   measured in, interned per shard (a shard sees few of either);
//! - the TAT as µs above the shard's base, 5 bytes;
//! - how long before the TAT it was written, 5 bytes.
//!
//! A state that does not pack (a TAT or a write more than 2^40 µs, about 12
//! days, from the base or the TAT: long periods, debt; or a shard past
//! [`MAX_CLASSES`]) is held whole aside, its row marked [`ASIDE`]: exact
//! either way, only larger. The base moves up to the shard's time once it
//! is [`REBASE`] behind, repacking every row (idle ones are dropped then),
//! so the times of live states stay small.

use super::*;

/// How a table holds one identity's state under one partition.
pub(super) trait Row<S>: Sized {
    /// What a call finds its rows by: its partition, and what the shard
    /// knows of it ([`Row::key`]).
    type Key: Copy;
    /// The table that holds rows of this kind.
    type Table: RowTable<Row = Self>;
    /// The key of calls under `partition`, found once per call.
    fn key(packing: &Packing, partition: u32) -> Self::Key;
    /// Whether this row holds `identity` under `key`'s partition.
    fn is(&self, packing: &Packing, key: Self::Key, identity: IdentityRef<'_>) -> bool;
    /// A row of `identity`'s `state` under `partition`.
    fn new(packing: &mut Packing, partition: u32, identity: IdentityRef<'_>, state: S) -> Self;
    /// Runs `f` on the row's state (found by `key`), keeping what it
    /// changed.
    fn with<R>(&mut self, packing: &mut Packing, key: Self::Key, f: impl FnOnce(&mut S) -> R) -> R;
    /// The hash that located the row (what its table rehashes it by).
    fn hash(&self, packing: &Packing, hasher: &Hasher) -> u64;
    /// Whether the row's state is equivalent to a fresh one at `now`.
    fn is_idle(&self, packing: &Packing, now: u64) -> bool;
    /// Drops what the row keeps outside its table: called when it is
    /// removed.
    fn forget(&self, _packing: &mut Packing) {}
    /// Makes `table` ready for a call at the shard's time `now`.
    #[inline(always)]
    fn ready(_table: &mut Self::Table, _packing: &mut Packing, _hasher: &Hasher, _now: u64) {}
}

impl<S: State, I: IdentityForm> Row<S> for Entry<S, I> {
    type Key = u32;
    type Table = HashTable<Self>;

    #[inline(always)]
    fn key(_: &Packing, partition: u32) -> u32 {
        partition
    }

    #[inline(always)]
    fn is(&self, _: &Packing, partition: u32, identity: IdentityRef<'_>) -> bool {
        self.partition == partition && self.identity.is(identity)
    }

    fn new(_: &mut Packing, partition: u32, identity: IdentityRef<'_>, state: S) -> Self {
        Entry {
            partition,
            identity: I::hold(identity),
            state,
        }
    }

    #[inline(always)]
    fn with<R>(&mut self, _: &mut Packing, _: u32, f: impl FnOnce(&mut S) -> R) -> R {
        f(&mut self.state)
    }

    fn hash(&self, _: &Packing, hasher: &Hasher) -> u64 {
        hash_of(hasher, self.partition, self.identity.as_ref())
    }

    fn is_idle(&self, _: &Packing, now: u64) -> bool {
        self.state.is_idle(now)
    }
}

/// The class of a row held aside ([`Packing::aside`]).
pub(super) const ASIDE: u16 = u16::MAX;

/// The most classes a shard interns; past them, states of new classes are
/// held aside.
pub(super) const MAX_CLASSES: usize = 4096;

/// A packed time is below this (µs, about 12.7 days).
const SPAN: u64 = 1 << 40;

/// How far behind the shard's time the base may fall before it moves up
/// (µs, about 3.2 days).
pub(super) const REBASE: u64 = 1 << 38;

/// A partition and the raw measure of a GCRA state ([`Tat::parts`]).
type Class = (u32, u32);

/// A shard holds its GCRA states of numbers in wide entries until it
/// holds this many, then packs them all. Per shard: with 64 shards a core,
/// 2 048 identities a core stay wide (64 KiB of entries), and the wide
/// tables a store outgrew and freed are about 2 KiB a shard.
pub(super) const PACK_AT: usize = 32;

/// What the packed rows of a shard share, and when the shard packs.
///
/// A small shard holds GCRA states of numbers whole ([`Entry`], 32 bytes):
/// packing costs a few instructions a decision, and a small table is in
/// the cache anyway. Once it holds `pack_at` of them ([`PACK_AT`] unless
/// [`MemoryBackend::with_pack_at`] said otherwise) it packs them all, and
/// packs new ones for as long as it holds any packed: a table that no
/// longer fits the cache misses fewer lines (20 bytes a row against 32,
/// three rows and their tags to a line, see [`LineTable`]).
#[repr(C)]
pub(super) struct Packing {
    /// The time packed TATs count from (µs): never after the shard's time.
    base: u64,
    /// The partition hinted last, and its hint: what most calls find
    /// (with the base, in one cache line).
    last: (u32, Hint),
    /// By partition ([`hint_index`]), the class its rows were last packed
    /// in: what a call compares rows with first.
    hints: Vec<Hint>,
    /// How many wide entries the shard holds before it packs.
    pack_at: usize,
    /// Each class, by index.
    classes: Vec<Class>,
    /// The index of each class.
    index: HashMap<Class, u16>,
    /// The states that do not pack, by partition and number.
    aside: HashMap<(u32, u64), Tat>,
}

/// The class a partition's rows were last packed in, and its measure.
#[derive(Debug, Clone, Copy)]
pub(super) struct Hint {
    class: u16,
    measure: u32,
}

/// The hint of a partition with none yet: a class no row has.
const NO_HINT: Hint = Hint {
    class: ASIDE - 1,
    measure: 0,
};

/// Where a partition's hint is: partitions are numbered from 0, an IPv4
/// one tagged with [`IPV4`] (two hints per number).
#[inline(always)]
fn hint_index(partition: u32) -> usize {
    ((partition & !IPV4) as usize) << 1 | (partition >> 31) as usize
}

/// What a call finds packed rows by: its partition and its hint.
#[derive(Debug, Clone, Copy)]
pub(super) struct PackedKey {
    partition: u32,
    hint: Hint,
}

impl Default for Packing {
    fn default() -> Self {
        Packing {
            base: 0,
            last: (u32::MAX, NO_HINT),
            pack_at: PACK_AT,
            classes: Vec::new(),
            index: HashMap::new(),
            aside: HashMap::new(),
            hints: Vec::new(),
        }
    }
}

impl Packing {
    /// How many wide entries the shard holds before it packs.
    pub(super) fn pack_at(&self) -> usize {
        self.pack_at
    }

    /// Packs once the shard holds `entries` wide entries (0: at once).
    pub(super) fn set_pack_at(&mut self, entries: usize) {
        self.pack_at = entries;
    }

    /// The index of `class`, interned if new; `None` once the shard holds
    /// [`MAX_CLASSES`].
    fn class(&mut self, class: Class) -> Option<u16> {
        if let Some(&index) = self.index.get(&class) {
            return Some(index);
        }
        if self.classes.len() >= MAX_CLASSES {
            return None;
        }
        let index = u16::try_from(self.classes.len()).ok()?;
        self.classes.push(class);
        self.index.insert(class, index);
        Some(index)
    }

    /// Makes `class` (at `index`) the hint of its partition.
    #[cold]
    fn hint(&mut self, index: u16, (partition, measure): Class) {
        let at = hint_index(partition);
        if self.hints.len() <= at {
            self.hints.resize(at + 1, NO_HINT);
        }
        let hint = Hint {
            class: index,
            measure,
        };
        self.hints[at] = hint;
        self.last = (partition, hint);
    }

    /// How many states are held aside (see the module docs).
    #[cfg(test)]
    pub(super) fn aside(&self) -> usize {
        self.aside.len()
    }

    /// The base (see the module docs).
    #[cfg(test)]
    pub(super) fn base(&self) -> u64 {
        self.base
    }
}

/// A GCRA state of a number, packed (see the module docs): 20 bytes,
/// aligned to 1.
#[derive(Debug, Clone, Copy)]
pub(super) struct PackedTat {
    number: [u8; 8],
    class: [u8; 2],
    /// The TAT above the base, then how long before the TAT it was written
    /// (40 bits each, little-endian, as [`pack_times`] splits them); for a
    /// row held aside, its partition.
    times: Times,
}

/// Two 40-bit times in an 8-byte and a 2-byte word, each read as it was
/// written: a read across two writes would stall on a row just written, as
/// one identity's calls in a row are.
#[derive(Debug, Clone, Copy, Default)]
struct Times {
    low: [u8; 8],
    high: [u8; 2],
}

/// The low 40 bits.
const MASK: u64 = SPAN - 1;

/// Two 40-bit times, packed (little-endian).
#[inline(always)]
fn pack_times(above: u64, before: u64) -> Times {
    Times {
        low: (above | before << 40).to_le_bytes(),
        high: ((before >> 24) as u16).to_le_bytes(),
    }
}

/// The two 40-bit times of [`pack_times`].
#[inline(always)]
fn unpack_times(times: &Times) -> (u64, u64) {
    let low = u64::from_le_bytes(times.low);
    let high = u64::from(u16::from_le_bytes(times.high));
    (low & MASK, low >> 40 | high << 24)
}

impl PackedTat {
    /// The row of an empty slot ([`LineTable`]'s): no row's bytes.
    pub(super) const BLANK: PackedTat = PackedTat {
        number: [0; 8],
        class: [0; 2],
        times: Times {
            low: [0; 8],
            high: [0; 2],
        },
    };

    /// A row of `number` holding nothing else (for [`LineTable`]'s tests).
    #[cfg(test)]
    pub(super) fn of_number(number: u64) -> Self {
        PackedTat {
            number: number.to_ne_bytes(),
            ..Self::BLANK
        }
    }

    #[inline(always)]
    pub(super) fn number(&self) -> u64 {
        u64::from_ne_bytes(self.number)
    }

    #[inline(always)]
    fn class_index(&self) -> u16 {
        u16::from_ne_bytes(self.class)
    }

    /// The partition of a row held aside.
    #[inline]
    fn aside_partition(&self) -> u32 {
        let mut word = [0u8; 4];
        word.copy_from_slice(&self.times.low[..4]);
        u32::from_ne_bytes(word)
    }

    #[inline(always)]
    fn partition(&self, packing: &Packing) -> u32 {
        match self.class_index() {
            ASIDE => self.aside_partition(),
            class => packing.classes[usize::from(class)].0,
        }
    }

    /// The row's state, whole.
    #[inline(always)]
    fn unpack(&self, packing: &Packing) -> Tat {
        let class = self.class_index();
        if class == ASIDE {
            return self.unpack_aside(packing);
        }
        Self::unpack_packed(
            &self.times,
            packing.base,
            packing.classes[usize::from(class)].1,
        )
    }

    /// The state of a packed row whose class has `measure` (an idle one,
    /// packed as 0, comes back as the base: idle too, see [`PackedTat::pack`]).
    #[inline(always)]
    fn unpack_packed(times: &Times, base: u64, measure: u32) -> Tat {
        let (above, before) = unpack_times(times);
        let tat = base + above;
        Tat::from_parts(tat, tat - before, measure)
    }

    #[cold]
    fn unpack_aside(&self, packing: &Packing) -> Tat {
        packing
            .aside
            .get(&(self.aside_partition(), self.number()))
            .copied()
            .unwrap_or_default()
    }

    /// `state` of `number` under `partition`, packed against `base` (held
    /// aside if it does not pack); `class` is the row's class before, if
    /// it had one (what most writes keep).
    #[inline]
    fn pack(
        packing: &mut Packing,
        base: u64,
        partition: u32,
        number: u64,
        state: &Tat,
        class: Option<u16>,
    ) -> Self {
        let (tat, written, measure) = state.parts();
        // A TAT not after the base is not after any time the shard decides
        // at: idle, whatever it holds.
        let (above, before) = if tat <= base {
            (0, 0)
        } else {
            (tat - base, tat.saturating_sub(written))
        };
        let fits = tat <= base || (above < SPAN && written <= tat && before < SPAN);
        let class = class
            .filter(|&c| packing.classes[usize::from(c)] == (partition, measure))
            .or_else(|| packing.class((partition, measure)));
        if let Some(class) = class {
            packing.hint(class, (partition, measure));
        }
        match class {
            Some(class) if fits => PackedTat {
                number: number.to_ne_bytes(),
                class: class.to_ne_bytes(),
                times: pack_times(above, before),
            },
            _ => Self::pack_aside(packing, partition, number, state),
        }
    }

    #[cold]
    fn pack_aside(packing: &mut Packing, partition: u32, number: u64, state: &Tat) -> Self {
        packing.aside.insert((partition, number), *state);
        let mut times = Times::default();
        times.low[..4].copy_from_slice(&partition.to_ne_bytes());
        PackedTat {
            number: number.to_ne_bytes(),
            class: ASIDE.to_ne_bytes(),
            times,
        }
    }

    /// Packs `state` in place of the row's, against `base`.
    #[cold]
    fn repack(&mut self, packing: &mut Packing, base: u64, state: &Tat) {
        let partition = self.partition(packing);
        let class = match self.class_index() {
            ASIDE => {
                self.forget_aside(packing);
                None
            }
            class => Some(class),
        };
        *self = Self::pack(packing, base, partition, self.number(), state, class);
    }

    /// [`Row::with`] of a row not in its partition's hinted class (held
    /// aside, or packed before a live change).
    #[cold]
    fn with_other<R>(&mut self, packing: &mut Packing, f: impl FnOnce(&mut Tat) -> R) -> R {
        let before = self.unpack(packing);
        let mut state = before;
        let out = f(&mut state);
        if state != before {
            let base = packing.base;
            self.repack(packing, base, &state);
        }
        out
    }

    #[cold]
    fn forget_aside(&self, packing: &mut Packing) {
        packing
            .aside
            .remove(&(self.aside_partition(), self.number()));
    }

    /// Moves the base of `table`'s rows up to `now`: every row repacked
    /// against it, idle ones dropped.
    #[cold]
    fn rebase(table: &mut LineTable, packing: &mut Packing, hasher: &Hasher, now: u64) {
        table.retain(
            packing,
            |row, packing| {
                let state = row.unpack(packing);
                if state.is_idle(now) {
                    Row::<Tat>::forget(row, packing);
                    return false;
                }
                row.repack(packing, now, &state);
                true
            },
            |row, packing| row.hash(packing, hasher),
        );
        packing.base = now;
    }
}

impl Row<Tat> for PackedTat {
    type Key = PackedKey;
    type Table = LineTable;

    #[inline(always)]
    fn key(packing: &Packing, partition: u32) -> PackedKey {
        let hint = match packing.last {
            (last, hint) if last == partition => hint,
            _ => packing
                .hints
                .get(hint_index(partition))
                .copied()
                .unwrap_or(NO_HINT),
        };
        PackedKey { partition, hint }
    }

    #[inline(always)]
    fn is(&self, packing: &Packing, key: PackedKey, identity: IdentityRef<'_>) -> bool {
        self.number().is(identity)
            && (self.class_index() == key.hint.class || self.partition(packing) == key.partition)
    }

    fn new(packing: &mut Packing, partition: u32, identity: IdentityRef<'_>, state: Tat) -> Self {
        let base = packing.base;
        Self::pack(packing, base, partition, u64::hold(identity), &state, None)
    }

    /// The hot path inline: a row packed in its partition's hinted class,
    /// whose state stays in it and packs again; anything else through
    /// [`PackedTat::with_other`].
    #[inline(always)]
    fn with<R>(
        &mut self,
        packing: &mut Packing,
        key: PackedKey,
        f: impl FnOnce(&mut Tat) -> R,
    ) -> R {
        if self.class_index() != key.hint.class {
            return self.with_other(packing, f);
        }
        let base = packing.base;
        let measure = key.hint.measure;
        let mut state = Self::unpack_packed(&self.times, base, measure);
        let out = f(&mut state);
        let (tat, written, now_measure) = state.parts();
        // Packs as it is (a TAT at the base, idle, packs as 0): within
        // reach of the base and of its write, in the row's class. An
        // unchanged state always does (it packs back to the same bytes).
        let (above, ahead) = (tat.wrapping_sub(base), tat.wrapping_sub(written));
        if (above | ahead) < SPAN && now_measure == measure {
            self.times = pack_times(above, ahead);
        } else {
            self.repack(packing, base, &state);
        }
        out
    }

    fn hash(&self, packing: &Packing, hasher: &Hasher) -> u64 {
        hash_of(
            hasher,
            self.partition(packing),
            IdentityRef::Number(self.number()),
        )
    }

    fn is_idle(&self, packing: &Packing, now: u64) -> bool {
        self.unpack(packing).is_idle(now)
    }

    fn forget(&self, packing: &mut Packing) {
        if self.class_index() == ASIDE {
            self.forget_aside(packing);
        }
    }

    #[inline(always)]
    fn ready(table: &mut LineTable, packing: &mut Packing, hasher: &Hasher, now: u64) {
        if now.saturating_sub(packing.base) >= REBASE {
            Self::rebase(table, packing, hasher, now);
        }
    }
}
