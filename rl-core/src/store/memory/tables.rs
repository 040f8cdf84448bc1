//! The tables of a shard: one per kind of state and form of identity (a
//! number, or text), and for GCRA states of numbers two, wide while the
//! shard is small and packed once it is not (see [`Packing`]), the packed
//! rows three to a cache line ([`LineTable`]).

use super::*;

/// A table of rows: `hashbrown`'s for entries, [`LineTable`] for packed
/// GCRA rows. `rehash` gives a held row's hash (to move it when the table
/// grows or shrinks).
pub(super) trait RowTable: Default {
    /// What it holds.
    type Row;
    /// How many rows it holds.
    fn len(&self) -> usize;
    /// Whether it holds none.
    fn is_empty(&self) -> bool;
    /// How many rows it holds before it grows.
    fn capacity(&self) -> usize;
    /// The row of `hash` for which `eq` holds.
    fn find_mut(&mut self, hash: u64, eq: impl FnMut(&Self::Row) -> bool)
    -> Option<&mut Self::Row>;
    /// Removes the row of `hash` for which `eq` holds, and returns it.
    fn remove(&mut self, hash: u64, eq: impl FnMut(&Self::Row) -> bool) -> Option<Self::Row>;
    /// Adds `row`, of `hash`, which the table does not hold.
    fn insert_unique(&mut self, hash: u64, row: Self::Row, rehash: impl Fn(&Self::Row) -> u64);
    /// Makes room for `additional` more rows.
    fn reserve(&mut self, additional: usize, rehash: impl Fn(&Self::Row) -> u64);
    /// Gives back room down to what `rows` rows (or those it holds) need.
    fn shrink_to(&mut self, rows: usize, rehash: impl Fn(&Self::Row) -> u64);
    /// Keeps the rows for which `keep` holds (it may change a row, not its
    /// hash), given `context`.
    fn retain<C>(
        &mut self,
        context: &mut C,
        keep: impl FnMut(&mut Self::Row, &mut C) -> bool,
        rehash: impl Fn(&Self::Row, &C) -> u64,
    );
}

impl<R> RowTable for HashTable<R> {
    type Row = R;

    #[inline(always)]
    fn len(&self) -> usize {
        HashTable::len(self)
    }

    #[inline(always)]
    fn is_empty(&self) -> bool {
        HashTable::is_empty(self)
    }

    fn capacity(&self) -> usize {
        HashTable::capacity(self)
    }

    #[inline(always)]
    fn find_mut(&mut self, hash: u64, eq: impl FnMut(&R) -> bool) -> Option<&mut R> {
        HashTable::find_mut(self, hash, eq)
    }

    fn remove(&mut self, hash: u64, eq: impl FnMut(&R) -> bool) -> Option<R> {
        HashTable::find_entry(self, hash, eq)
            .ok()
            .map(|found| found.remove().0)
    }

    fn insert_unique(&mut self, hash: u64, row: R, rehash: impl Fn(&R) -> u64) {
        HashTable::insert_unique(self, hash, row, rehash);
    }

    fn reserve(&mut self, additional: usize, rehash: impl Fn(&R) -> u64) {
        HashTable::reserve(self, additional, rehash);
    }

    fn shrink_to(&mut self, rows: usize, rehash: impl Fn(&R) -> u64) {
        HashTable::shrink_to(self, rows, rehash);
    }

    /// `hashbrown` drops a row without moving any other: no rehash.
    fn retain<C>(
        &mut self,
        context: &mut C,
        mut keep: impl FnMut(&mut R, &mut C) -> bool,
        _rehash: impl Fn(&R, &C) -> u64,
    ) {
        HashTable::retain(self, |row| keep(row, context));
    }
}

/// One identity's state under one partition.
#[derive(Debug)]
pub(super) struct Entry<S, I> {
    pub(super) partition: u32,
    pub(super) identity: I,
    pub(super) state: S,
}

/// A state kind with its tables in a shard.
pub(super) trait Tabled: State {
    /// How a table of identities held as `I` holds this state.
    type Row<I: Side>: Row<Self>;
    fn table<I: Side>(tables: &mut Tables<I>) -> &mut RowsOf<Self, I>;
    /// The table a shard holds this state of identities held as `I` in:
    /// its rows ([`Tabled::table`]), or, for GCRA states of numbers while
    /// the shard holds none packed, wide entries (see [`Packing`]).
    #[inline(always)]
    fn pick<I: Side>(tables: &mut Tables<I>) -> Pick<'_, Self, I> {
        Pick::Rows(Self::table(tables))
    }
    /// Moves the wide entries [`Tabled::pick`] picked into rows (the shard
    /// is packed from then on).
    fn pack_all<I: Side>(_tables: &mut Tables<I>, _packing: &mut Packing, _hasher: &Hasher) {}
}

/// The table that holds the rows of `S` held as `I`.
pub(super) type RowsOf<S, I> = <<S as Tabled>::Row<I> as Row<S>>::Table;

/// The table [`Tabled::pick`] picked.
pub(super) enum Pick<'a, S: Tabled, I: Side> {
    /// Wide entries: a GCRA state of a number, whole, in a small shard.
    Wide(&'a mut HashTable<Entry<S, I>>),
    Rows(&'a mut RowsOf<S, I>),
}

/// Which of a shard's tables holds identities as `I`, and how its GCRA
/// states are held (a number's packed once its shard is large, see
/// [`PackedTat`]).
pub(super) trait Side: IdentityForm {
    type TatRow: Row<Tat>;
    /// Whether GCRA states held this way are packed in a large shard.
    const PACKS: bool;
    fn tables(all: &mut AllTables) -> &mut Tables<Self>;
}

impl Side for u64 {
    type TatRow = PackedTat;
    const PACKS: bool = true;
    fn tables(all: &mut AllTables) -> &mut Tables<Self> {
        &mut all.numbers
    }
}

impl Side for CompactString {
    type TatRow = Entry<Tat, CompactString>;
    const PACKS: bool = false;
    fn tables(all: &mut AllTables) -> &mut Tables<Self> {
        &mut all.texts
    }
}

macro_rules! tabled {
    ($($state:ty => $field:ident as $row:ty),* $(,)?) => {
        /// Identities held one way, one table per kind of state; GCRA
        /// states of numbers in wide entries first, while the shard is
        /// small (see [`Packing`]).
        #[repr(C)]
        pub(super) struct Tables<I: Side> {
            pub(super) gcra: <I::TatRow as Row<Tat>>::Table,
            pub(super) wide_gcra: HashTable<Entry<Tat, I>>,
            $($field: HashTable<<$state as Tabled>::Row<I>>,)*
        }

        impl<I: Side> Default for Tables<I> {
            fn default() -> Self {
                Self {
                    gcra: Default::default(),
                    wide_gcra: HashTable::new(),
                    $($field: HashTable::new(),)*
                }
            }
        }

        impl<I: Side> Tables<I> {
            pub(super) fn len(&self) -> usize {
                self.wide_gcra.len() + self.gcra.len() $(+ self.$field.len())*
            }

            /// Drops every idle state (see [`sweep_table`]); returns how many.
            pub(super) fn sweep(&mut self, now: u64, hasher: &Hasher, packing: &mut Packing) -> usize {
                let before = self.len();
                sweep_table(&mut self.wide_gcra, now, hasher, packing);
                sweep_table(&mut self.gcra, now, hasher, packing);
                $(sweep_table(&mut self.$field, now, hasher, packing);)*
                before - self.len()
            }
        }

        $(impl Tabled for $state {
            type Row<I: Side> = $row;
            fn table<I: Side>(tables: &mut Tables<I>) -> &mut RowsOf<Self, I> {
                &mut tables.$field
            }
        })*
    };
}

tabled! {
    Window => window as Entry<Window, I>,
    Meter => meter as Entry<Meter, I>,
    Log => log as Entry<Log, I>,
    Slots => slots as Entry<Slots, I>,
    Flight => flight as Entry<Flight, I>,
}

impl Tabled for Tat {
    type Row<I: Side> = I::TatRow;
    fn table<I: Side>(tables: &mut Tables<I>) -> &mut RowsOf<Self, I> {
        &mut tables.gcra
    }
    #[inline(always)]
    fn pick<I: Side>(tables: &mut Tables<I>) -> Pick<'_, Self, I> {
        // One of the two is empty: a shard packs all its states at once.
        if I::PACKS && tables.gcra.is_empty() {
            Pick::Wide(&mut tables.wide_gcra)
        } else {
            Pick::Rows(&mut tables.gcra)
        }
    }
    #[cold]
    fn pack_all<I: Side>(tables: &mut Tables<I>, packing: &mut Packing, hasher: &Hasher) {
        let wide = std::mem::take(&mut tables.wide_gcra);
        tables
            .gcra
            .reserve(wide.len(), |row| row.hash(packing, hasher));
        for entry in wide {
            let identity = entry.identity.as_ref();
            let hash = hash_of(hasher, entry.partition, identity);
            let row = <I::TatRow as Row<Tat>>::new(packing, entry.partition, identity, entry.state);
            tables
                .gcra
                .insert_unique(hash, row, |row| row.hash(packing, hasher));
        }
    }
}

/// Every identity of a shard: numbers and text apart (in order: numbers
/// first, see [`Shard`]).
#[derive(Default)]
#[repr(C)]
pub(super) struct AllTables {
    pub(super) numbers: Tables<u64>,
    pub(super) texts: Tables<CompactString>,
}

impl AllTables {
    pub(super) fn len(&self) -> usize {
        self.numbers.len() + self.texts.len()
    }

    pub(super) fn sweep(&mut self, now: u64, hasher: &Hasher, packing: &mut Packing) -> usize {
        self.numbers.sweep(now, hasher, packing) + self.texts.sweep(now, hasher, packing)
    }
}
