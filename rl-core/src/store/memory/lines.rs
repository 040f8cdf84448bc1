//! The table of a shard's packed GCRA rows ([`PackedTat`]): three rows to
//! a 64-byte line, with their tags in the line.
//!
//! A `hashbrown` table reads a group of control bytes, then the row they
//! point at: two cache lines at least, three when the 20-byte row straddles
//! two (one row in four). Once a store's rows no longer fit the cache, both
//! miss. Here a row and its tag share one line, and no row straddles two:
//! a lookup reads one line, and the next one only when a row was placed
//! past it because it was full (`passed`).
//!
//! Probing is linear over lines from the row's home line (the hash's low
//! 32 bits scaled to the table: its bits 32.. pick the shard), Robin Hood
//! on insertion (a row takes the slot of one nearer its home than it is to
//! its own, which goes on instead), so every row stays within a few lines
//! of home; a tag is the hash's top 7 bits with the high bit set (0 marks
//! an empty slot). Each line counts the rows that passed it full on their
//! way to a later line (saturating: a line past 255 stays there until the
//! counts are made again); a lookup goes on past a line only while that
//! count is not 0, and never past every line once; a removal takes its row
//! back from every line it had passed. The table is at most four fifths
//! full and grows by half (to the next size that holds what it needs), so
//! it holds between about 27 and 40 bytes a row.

use super::*;

/// Rows in a line.
const SLOTS: usize = 3;

/// A line's tag of an empty slot.
const EMPTY: u8 = 0;

/// Three rows and their tags: one cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line {
    /// Each slot's tag ([`tag`]), [`EMPTY`] for an empty slot.
    tags: [u8; SLOTS],
    /// How many rows passed this line full on their way to a later one
    /// (saturating, see the module docs).
    passed: u8,
    rows: [PackedTat; SLOTS],
}

const _: () = assert!(std::mem::size_of::<Line>() == 64);

/// A line with every slot empty.
const EMPTY_LINE: Line = Line {
    tags: [EMPTY; SLOTS],
    passed: 0,
    rows: [PackedTat::BLANK; SLOTS],
};

/// The tag of a row of `hash`: never [`EMPTY`].
#[inline(always)]
fn tag(hash: u64) -> u8 {
    (hash >> 57) as u8 | 0x80
}

/// The most a table holds, as a fraction of its slots.
const FULL: (usize, usize) = (4, 5);

/// How many lines hold `rows` rows at most [`FULL`].
fn lines_for(rows: usize) -> usize {
    rows.saturating_mul(FULL.1)
        .div_ceil(FULL.0 * SLOTS)
        .max(usize::from(rows > 0))
}

/// The packed GCRA rows of a shard (see the module docs).
#[derive(Default)]
pub(super) struct LineTable {
    lines: Vec<Line>,
    len: usize,
}

impl RowTable for LineTable {
    type Row = PackedTat;

    /// How many rows it holds.
    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    #[inline]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many rows it holds before it grows.
    fn capacity(&self) -> usize {
        self.lines.len() * SLOTS * FULL.0 / FULL.1
    }

    /// The row of `hash` for which `eq` holds.
    #[inline(always)]
    fn find_mut(
        &mut self,
        hash: u64,
        eq: impl FnMut(&PackedTat) -> bool,
    ) -> Option<&mut PackedTat> {
        let (at, slot) = self.position(hash, eq)?;
        Some(&mut self.lines[at].rows[slot])
    }

    /// Removes the row of `hash` for which `eq` holds, and returns it.
    fn remove(&mut self, hash: u64, eq: impl FnMut(&PackedTat) -> bool) -> Option<PackedTat> {
        let (at, slot) = self.position(hash, eq)?;
        let line = &mut self.lines[at];
        line.tags[slot] = EMPTY;
        let row = line.rows[slot];
        self.len -= 1;
        // The lines it passed on its way here count it no more.
        let mut passed = self.home(hash);
        while passed != at {
            let count = &mut self.lines[passed].passed;
            if *count != u8::MAX {
                *count -= 1;
            }
            passed = self.next(passed);
        }
        Some(row)
    }

    /// Adds `row`, of `hash`, which the table does not hold; `rehash` gives
    /// a held row's hash, should the table grow.
    fn insert_unique(&mut self, hash: u64, row: PackedTat, rehash: impl Fn(&PackedTat) -> u64) {
        if self.len >= self.capacity() {
            let grown = lines_for(self.len + 1).max(self.lines.len() + self.lines.len() / 2);
            self.resize(grown, &rehash);
        }
        self.place(hash, row, &rehash);
        self.len += 1;
    }

    /// Makes room for `additional` more rows.
    fn reserve(&mut self, additional: usize, rehash: impl Fn(&PackedTat) -> u64) {
        let needed = self.len.saturating_add(additional);
        if needed > self.capacity() {
            self.resize(lines_for(needed), &rehash);
        }
    }

    /// Gives back room down to what `rows` rows (or those it holds, if
    /// more) need.
    fn shrink_to(&mut self, rows: usize, rehash: impl Fn(&PackedTat) -> u64) {
        let lines = lines_for(rows.max(self.len));
        if lines < self.lines.len() {
            self.resize(lines, &rehash);
        }
    }

    /// Keeps the rows for which `keep` holds (it may change a row, not its
    /// hash), given `context`; `rehash` gives a row's hash, to count again
    /// which lines rows passed once some were dropped.
    fn retain<C>(
        &mut self,
        context: &mut C,
        mut keep: impl FnMut(&mut PackedTat, &mut C) -> bool,
        rehash: impl Fn(&PackedTat, &C) -> u64,
    ) {
        let before = self.len;
        for line in &mut self.lines {
            for slot in 0..SLOTS {
                if line.tags[slot] != EMPTY && !keep(&mut line.rows[slot], context) {
                    line.tags[slot] = EMPTY;
                    self.len -= 1;
                }
            }
        }
        if self.len != before {
            self.count_passed(&|row: &PackedTat| rehash(row, context));
        }
    }
}

impl LineTable {
    /// The line a row of `hash` is looked for from.
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        // Below `lines` whatever their count: a 96-bit product.
        ((u128::from(hash as u32) * self.lines.len() as u128) >> 32) as usize
    }

    /// The line after `at`.
    #[inline(always)]
    fn next(&self, at: usize) -> usize {
        if at + 1 == self.lines.len() {
            0
        } else {
            at + 1
        }
    }

    /// Where the row of `hash` for which `eq` holds is: its line and slot.
    #[inline(always)]
    fn position(
        &self,
        hash: u64,
        mut eq: impl FnMut(&PackedTat) -> bool,
    ) -> Option<(usize, usize)> {
        if self.lines.is_empty() {
            return None;
        }
        // The tag in each of the low three bytes: a slot whose tag it is
        // becomes a zero byte of `tags ^ tags_of`.
        let tags_of = u32::from(tag(hash)) * 0x0001_0101;
        let mut at = self.home(hash);
        // Every line at most once: after removals, every line may count a
        // row that passed it (a ring of rows placed past full lines).
        for _ in 0..self.lines.len() {
            let line = &self.lines[at];
            let word = u32::from_le_bytes([line.tags[0], line.tags[1], line.tags[2], 0]) ^ tags_of;
            // The high bit of each zero byte (and maybe of a byte above
            // one, which `eq` turns down): no branch on which slot.
            let mut hits = word.wrapping_sub(0x0001_0101) & !word & 0x0080_8080;
            while hits != 0 {
                let slot = (hits.trailing_zeros() / 8) as usize;
                if eq(&line.rows[slot]) {
                    return Some((at, slot));
                }
                hits &= hits - 1;
            }
            if line.passed == 0 {
                return None;
            }
            at = self.next(at);
        }
        None
    }

    /// Counts again, for every line, the rows that passed it.
    fn count_passed(&mut self, rehash: &impl Fn(&PackedTat) -> u64) {
        for line in &mut self.lines {
            line.passed = 0;
        }
        for at in 0..self.lines.len() {
            for slot in 0..SLOTS {
                if self.lines[at].tags[slot] == EMPTY {
                    continue;
                }
                let mut passed = self.home(rehash(&self.lines[at].rows[slot]));
                while passed != at {
                    let count = &mut self.lines[passed].passed;
                    *count = count.saturating_add(1);
                    passed = self.next(passed);
                }
            }
        }
    }

    /// Puts `row` of `hash` in the first free slot from its home line,
    /// Robin Hood: on a full line, it takes the slot of the row there that
    /// is nearest its own home line if that is nearer than `row` is to
    /// its, and that row goes on instead. Rows stay within a few lines of
    /// home (linear probing alone leaves one in a hundred more than ten
    /// lines away at four fifths full, and every lookup of it walks them).
    fn place(&mut self, hash: u64, row: PackedTat, rehash: &impl Fn(&PackedTat) -> u64) {
        let (mut hash, mut row) = (hash, row);
        let mut home = self.home(hash);
        let mut at = home;
        let lines = self.lines.len();
        // How many lines lie from `from` to `at`.
        let away = |from: usize, at: usize| (at + lines - from) % lines;
        loop {
            let line = &mut self.lines[at];
            if let Some(slot) = line.tags.iter().position(|&t| t == EMPTY) {
                line.tags[slot] = tag(hash);
                line.rows[slot] = row;
                return;
            }
            // At home no row is nearer its own: only past it is a row
            // worth hashing again.
            let ours = away(home, at);
            if ours > 0 {
                let (slot, nearest, near) = (0..SLOTS)
                    .map(|slot| {
                        let theirs = rehash(&self.lines[at].rows[slot]);
                        (slot, theirs, away(self.home(theirs), at))
                    })
                    .min_by_key(|&(_, _, away)| away)
                    .expect("a line has slots");
                if near < ours {
                    let line = &mut self.lines[at];
                    let moved = std::mem::replace(&mut line.rows[slot], row);
                    line.tags[slot] = tag(hash);
                    (hash, row, home) = (nearest, moved, self.home(nearest));
                }
            }
            // Whichever row goes on passes this line.
            let line = &mut self.lines[at];
            line.passed = line.passed.saturating_add(1);
            at = self.next(at);
        }
    }

    /// Moves every row into a table of `lines` lines (none: no room).
    fn resize(&mut self, lines: usize, rehash: &impl Fn(&PackedTat) -> u64) {
        let old = std::mem::replace(&mut self.lines, vec![EMPTY_LINE; lines]);
        for line in &old {
            for slot in 0..SLOTS {
                if line.tags[slot] != EMPTY {
                    self.place(rehash(&line.rows[slot]), line.rows[slot], rehash);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// The rows' hashes: spread (`splitmix64`), or all from one home line
    /// (`crowded`), which makes every row past the first line's three pass
    /// it: its count saturates past 255.
    fn hash_of(number: u64, crowded: bool) -> u64 {
        let mut z = number.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if crowded { z & !0xffff_ffff } else { z }
    }

    /// A small deterministic generator (the test's own, so a failure
    /// replays).
    struct Steps(u64);

    impl Steps {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Every row the model holds is found, as itself, and the numbers
    /// around them that it does not hold are not.
    fn holds_exactly(table: &mut LineTable, model: &HashSet<u64>, crowded: bool, span: u64) {
        assert_eq!(table.len(), model.len());
        assert!(table.len() <= table.capacity());
        for number in 0..span {
            let found = table
                .find_mut(hash_of(number, crowded), |row| row.number() == number)
                .map(|row| row.number());
            assert_eq!(found, model.get(&number).copied(), "number {number}");
        }
    }

    fn run(crowded: bool, seed: u64) {
        let rehash = |row: &PackedTat| hash_of(row.number(), crowded);
        let mut table = LineTable::default();
        let mut model = HashSet::new();
        let mut steps = Steps(seed);
        let span = 700;
        for round in 0..3_000 {
            let number = steps.below(span);
            match steps.below(100) {
                0..55 => {
                    if model.insert(number) {
                        table.insert_unique(
                            hash_of(number, crowded),
                            PackedTat::of_number(number),
                            rehash,
                        );
                    }
                }
                55..90 => {
                    let removed = table
                        .remove(hash_of(number, crowded), |row| row.number() == number)
                        .map(|row| row.number());
                    assert_eq!(removed, model.take(&number));
                }
                90..95 => {
                    let modulus = 2 + steps.below(5);
                    table.retain(
                        &mut (),
                        |row, ()| row.number() % modulus != 0,
                        |row, ()| rehash(row),
                    );
                    model.retain(|number| number % modulus != 0);
                }
                95..98 => table.shrink_to(steps.below(span) as usize, rehash),
                _ => table.reserve(steps.below(span) as usize, rehash),
            }
            if round % 100 == 0 {
                holds_exactly(&mut table, &model, crowded, span);
            }
        }
        holds_exactly(&mut table, &model, crowded, span);
    }

    #[test]
    fn rows_inserted_removed_kept_and_moved_are_found_exactly_as_a_set_holds_them() {
        for seed in 1..=4 {
            run(false, seed);
        }
    }

    #[test]
    fn rows_that_all_share_one_home_line_are_found_exactly_past_a_saturated_count() {
        for seed in 1..=2 {
            run(true, seed);
        }
        // 400 rows from line 0: 397 passed it; the count stops at 255.
        let rehash = |row: &PackedTat| hash_of(row.number(), true);
        let mut table = LineTable::default();
        for number in 0..400 {
            table.insert_unique(hash_of(number, true), PackedTat::of_number(number), rehash);
        }
        assert_eq!(table.lines[0].passed, u8::MAX);
        for number in (0..400).rev() {
            assert!(
                table
                    .remove(hash_of(number, true), |row| row.number() == number)
                    .is_some()
            );
            for left in 0..number {
                let hash = hash_of(left, true);
                assert!(table.find_mut(hash, |row| row.number() == left).is_some());
            }
        }
        assert!(table.is_empty());
    }

    #[test]
    fn a_lookup_ends_when_every_line_counts_a_row_that_passed_it() {
        // Numbers 0..4 and 7 live from line 0, 4..7 from line 1 (of two).
        let hash = |number: u64| {
            number << 57
                | if (4..7).contains(&number) {
                    0xffff_ffff
                } else {
                    0
                }
        };
        let rehash = |row: &PackedTat| hash(row.number());
        let mut table = LineTable::default();
        let insert = |table: &mut LineTable, number| {
            table.insert_unique(hash(number), PackedTat::of_number(number), rehash);
        };
        let remove = |table: &mut LineTable, number: u64| {
            assert!(
                table
                    .remove(hash(number), |row| row.number() == number)
                    .is_some()
            );
        };
        for number in 0..4 {
            insert(&mut table, number);
        }
        assert_eq!(table.lines.len(), 2);
        // 3 passed line 0; then 6 passes line 1 into line 0's free slots.
        remove(&mut table, 0);
        remove(&mut table, 1);
        insert(&mut table, 4);
        insert(&mut table, 5);
        remove(&mut table, 2);
        insert(&mut table, 6);
        assert_eq!(table.lines.len(), 2);
        assert_eq!((table.lines[0].passed, table.lines[1].passed), (1, 1));
        assert!(table.find_mut(hash(7), |row| row.number() == 7).is_none());
        for number in [3, 4, 5, 6] {
            assert!(
                table
                    .find_mut(hash(number), |row| row.number() == number)
                    .is_some()
            );
        }
    }

    #[test]
    fn every_row_stays_within_a_few_lines_of_its_home() {
        let rehash = |row: &PackedTat| hash_of(row.number(), false);
        let mut table = LineTable::default();
        for number in 0..20_000 {
            table.insert_unique(hash_of(number, false), PackedTat::of_number(number), rehash);
            if number % 1_000 == 999 {
                let lines = table.lines.len();
                let farthest = (0..lines)
                    .flat_map(|at| (0..SLOTS).map(move |slot| (at, slot)))
                    .filter(|&(at, slot)| table.lines[at].tags[slot] != EMPTY)
                    .map(|(at, slot)| {
                        let home = table.home(rehash(&table.lines[at].rows[slot]));
                        (at + lines - home) % lines
                    })
                    .max();
                // Linear probing alone leaves some row tens of lines away.
                assert!(farthest <= Some(12), "{farthest:?} lines at {number} rows");
            }
        }
    }

    #[test]
    fn a_table_holds_at_most_four_fifths_of_its_slots_and_grows_by_half() {
        let rehash = |row: &PackedTat| hash_of(row.number(), false);
        let mut table = LineTable::default();
        assert_eq!(table.capacity(), 0);
        let mut sizes = vec![];
        for number in 0..10_000 {
            table.insert_unique(hash_of(number, false), PackedTat::of_number(number), rehash);
            assert!(table.len() * 5 <= table.lines.len() * SLOTS * 4);
            if sizes.last() != Some(&table.lines.len()) {
                sizes.push(table.lines.len());
            }
        }
        for pair in sizes.windows(2).skip(3) {
            assert_eq!(pair[1], pair[0] + pair[0] / 2, "{sizes:?}");
        }
        table.retain(&mut (), |_, ()| false, |row, ()| rehash(row));
        table.shrink_to(0, rehash);
        assert_eq!((table.len(), table.capacity()), (0, 0));
    }
}
