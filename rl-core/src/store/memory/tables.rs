//! The tables of a shard: one per kind of state and form of identity (a
//! number, or text), and for GCRA states of numbers two, wide while the
//! shard is small and packed once it is not (see [`Packing`]).

use super::*;

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
    fn table<I: Side>(tables: &mut Tables<I>) -> &mut HashTable<Self::Row<I>>;
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

/// The table [`Tabled::pick`] picked.
pub(super) enum Pick<'a, S: Tabled, I: Side> {
    /// Wide entries: a GCRA state of a number, whole, in a small shard.
    Wide(&'a mut HashTable<Entry<S, I>>),
    Rows(&'a mut HashTable<S::Row<I>>),
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
            pub(super) gcra: HashTable<I::TatRow>,
            pub(super) wide_gcra: HashTable<Entry<Tat, I>>,
            $($field: HashTable<<$state as Tabled>::Row<I>>,)*
        }

        impl<I: Side> Default for Tables<I> {
            fn default() -> Self {
                Self {
                    gcra: HashTable::new(),
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
            fn table<I: Side>(tables: &mut Tables<I>) -> &mut HashTable<Self::Row<I>> {
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
    fn table<I: Side>(tables: &mut Tables<I>) -> &mut HashTable<Self::Row<I>> {
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
