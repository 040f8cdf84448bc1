//! Reservations (waiting calls) shared by every store: the slots that
//! cancelled reservations gave back ([`Freed`]) and how a reservation's
//! slot is chosen over several limits ([`choose_slot`]). The Redis scripts
//! implement the same rules (`rl-redis/src/lua/batch.lua`).
//!
//! A waiting call over several limits is committed as of one time, the
//! slot, on all of them: committing each limit at its own earliest time
//! would let calls bunch up at the latest one and break the limit whose
//! slot was earlier. So the slot is the latest of the limits' earliest
//! times, or an earlier time that every limit can serve: one at or after
//! its own earliest time, or one exactly at a slot it has been given back.
//!
//! A given-back slot is the slot of a cancelled reservation that was no
//! longer the last of its queue (the last one is taken back from the state
//! itself): its units are still counted in the state, so a later
//! reservation may use exactly that time, at no more than those units,
//! without counting them again. A given-back slot that has passed unused
//! is dropped.

use smallvec::SmallVec;

/// The slots given back under one limit's state: `(time µs, units)`,
/// usually none or one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Freed(SmallVec<[(u64, u64); 2]>);

impl Freed {
    /// Whether `cost` units were given back exactly at `slot`.
    pub(crate) fn has(&self, slot: u64, cost: u64) -> bool {
        self.0.iter().any(|&(t, units)| t == slot && units >= cost)
    }

    /// The times at which `cost` units were given back.
    pub(crate) fn times(&self, cost: u64) -> impl Iterator<Item = u64> + '_ {
        self.0
            .iter()
            .filter(move |&&(_, units)| units >= cost)
            .map(|&(t, _)| t)
    }

    /// Takes `cost` units from the slot at `slot`.
    pub(crate) fn take(&mut self, slot: u64, cost: u64) {
        if let Some(i) = self.0.iter().position(|&(t, _)| t == slot) {
            let units = &mut self.0[i].1;
            *units = units.saturating_sub(cost);
            if *units == 0 {
                self.0.swap_remove(i);
            }
        }
    }

    /// Gives `cost` units back at `slot`.
    pub(crate) fn give(&mut self, slot: u64, cost: u64) {
        match self.0.iter_mut().find(|(t, _)| *t == slot) {
            Some((_, units)) => *units = units.saturating_add(cost),
            None => self.0.push((slot, cost)),
        }
    }

    /// Drops the slots before `now`.
    pub(crate) fn drop_before(&mut self, now: u64) {
        self.0.retain(|&mut (t, _)| t >= now);
    }

    /// Whether no slot is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The slot of a reservation over limits whose earliest times (each at or
/// after now) are `earliest`, with the slots each was given back (`freed`,
/// none before now) and each call's cost: the latest earliest time, or the
/// earliest given-back time that every limit can serve.
pub(crate) fn choose_slot(earliest: &[u64], freed: &[Freed], costs: &[u64]) -> u64 {
    let tail = earliest.iter().copied().max().unwrap_or(0);
    let serves = |t: u64| {
        earliest
            .iter()
            .zip(freed)
            .zip(costs)
            .all(|((&e, f), &c)| t >= e || f.has(t, c))
    };
    let mut best = tail;
    for (f, &cost) in freed.iter().zip(costs) {
        for t in f.times(cost) {
            if t < best && serves(t) {
                best = t;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freed(slots: &[(u64, u64)]) -> Freed {
        let mut f = Freed::default();
        for &(t, units) in slots {
            f.give(t, units);
        }
        f
    }

    #[test]
    fn the_slot_is_the_latest_earliest_time_of_the_limits() {
        let none = [Freed::default(), Freed::default()];
        assert_eq!(choose_slot(&[100, 250], &none, &[1, 1]), 250);
    }

    #[test]
    fn a_given_back_slot_is_used_only_when_every_limit_can_serve_it() {
        // Limit 0 was given back 150; limit 1 can serve from 120 on.
        let f = [freed(&[(150, 1)]), Freed::default()];
        assert_eq!(choose_slot(&[300, 120], &f, &[1, 1]), 150);
        // Limit 1 cannot serve before 200: 150 is no use, 300 is the slot.
        assert_eq!(choose_slot(&[300, 200], &f, &[1, 1]), 300);
        // Both given back 180: that is the slot even though neither's queue has room.
        let both = [freed(&[(180, 1)]), freed(&[(180, 2)])];
        assert_eq!(choose_slot(&[300, 400], &both, &[1, 1]), 180);
        // Too few units given back for the cost.
        assert_eq!(choose_slot(&[300], &[freed(&[(150, 1)])], &[2]), 300);
    }

    #[test]
    fn given_back_units_add_up_and_are_taken_exactly() {
        let mut f = freed(&[(150, 1), (150, 1), (200, 1)]);
        assert!(f.has(150, 2) && !f.has(150, 3));
        f.take(150, 1);
        assert!(f.has(150, 1) && !f.has(150, 2));
        f.take(150, 1);
        assert!(!f.has(150, 1));
        f.drop_before(201);
        assert!(f.is_empty());
    }
}
