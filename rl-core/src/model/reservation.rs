//! What a store answers to a reservation: the slot a waiting call was given
//! (or why it was refused), and what is needed to give the slot back.

use std::time::Duration;

use crate::model::decision::Decisions;

/// The answer to [`crate::backend::Backend::reserve`]: a waiting call's place in the
/// queue of every limit it carries, reserved all-or-nothing.
///
/// When allowed, every limit was committed as of one time, the *slot*
/// ([`Reservation::slot_micros`], the latest of the limits' earliest
/// times): each decision's [`crate::Decision::at_micros`] is the slot, and
/// the call may proceed [`Reservation::wait`] after the store's time of the
/// decision. When refused (the slot would have been later than the call
/// may wait), nothing was changed and the decisions are those of an acquire
/// at the store's time, with their usual `retry_after`.
///
/// A reservation is given back with [`crate::backend::Backend::cancel`]; what that
/// needs besides the decisions is which limits took a slot another
/// cancelled call had given back ([`Reservation::took_freed_slot`]).
///
/// ```
/// use ratewall::{Decision, backend::{Decisions, Figures, Reservation}};
/// use std::time::Duration;
/// let slot = Decision::new(Figures { allowed: true, limit: 1, at_micros: 1_250_000, ..Figures::default() });
/// let reserved = Reservation::new(Decisions::one(slot), 1_000_000, [false]);
/// assert!(reserved.allowed());
/// assert_eq!(reserved.slot_micros(), Some(1_250_000));
/// assert_eq!(reserved.wait(), Duration::from_millis(250));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    decisions: Decisions,
    now_micros: u64,
    freed: Box<[bool]>,
}

impl Reservation {
    /// A reservation decided at the store's time `now_micros`: one decision
    /// per limit (each at the slot when allowed) and, per limit, whether it
    /// took a slot given back by a cancelled reservation.
    pub fn new(
        decisions: Decisions,
        now_micros: u64,
        freed: impl IntoIterator<Item = bool>,
    ) -> Self {
        Self {
            decisions,
            now_micros,
            freed: freed.into_iter().collect(),
        }
    }

    /// The decisions, one per limit.
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// The decisions, owned.
    pub fn into_decisions(self) -> Decisions {
        self.decisions
    }

    /// Whether every limit reserved the slot.
    pub fn allowed(&self) -> bool {
        self.decisions.allowed()
    }

    /// The store's time of the decision (µs since the epoch).
    pub fn now_micros(&self) -> u64 {
        self.now_micros
    }

    /// The reserved slot (µs since the epoch), when allowed.
    pub fn slot_micros(&self) -> Option<u64> {
        if !self.allowed() {
            return None;
        }
        self.decisions.iter().map(|d| d.at_micros()).max()
    }

    /// How long the call waits for its slot (zero when refused, or when it
    /// may proceed at once).
    pub fn wait(&self) -> Duration {
        Duration::from_micros(
            self.slot_micros()
                .map_or(0, |slot| slot.saturating_sub(self.now_micros)),
        )
    }

    /// Whether limit `index` took a slot given back by a cancelled
    /// reservation (rather than the next one of its queue).
    pub fn took_freed_slot(&self, index: usize) -> bool {
        self.freed.get(index).copied().unwrap_or(false)
    }
}
