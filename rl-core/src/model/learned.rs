//! A limit learned from an upstream ([`Adjust`], [`Learned`]): the scale of
//! a budget's stated limits that every instance shares through the store
//! (`Backend::adjust`), raised while the upstream accepts, lowered when it
//! refuses, or set to what it says its limit is.

use std::time::Duration;

use crate::model::clock::micros;

/// A scale of one: the stated limits as they are, in parts per million.
pub const SCALE_ONE: u64 = 1_000_000;

/// The lowest a learned scale goes (0.1 % of the stated limits): a budget
/// never learns to send nothing.
pub const SCALE_FLOOR: u64 = 1_000;

/// The highest a learned scale goes (1 000 times the stated limits), when
/// the upstream says its limit is higher than the stated one.
pub const SCALE_CEILING: u64 = 1_000 * SCALE_ONE;

/// One change to a learned scale ([`crate::backend::Backend::adjust`]), in parts per
/// million ([`SCALE_ONE`] is the stated limits). The store applies it
/// atomically, by its own time, and answers the scale after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Adjust {
    /// Only read the scale (a scale never learned is [`SCALE_ONE`]).
    Read,
    /// The upstream accepted: add `step` parts per million of the current
    /// scale (at least 1; none for a `step` of 0), up to [`SCALE_ONE`],
    /// unless the scale changed less than `every` ago (so many instances
    /// raise it once per `every`).
    Raise {
        /// Parts per million of the current scale added.
        step: u64,
        /// The least time since the scale last changed.
        every: Duration,
    },
    /// The upstream refused: keep `keep` parts per million of the current
    /// scale (down to `floor`, never below [`SCALE_FLOOR`]), unless it was
    /// lowered less than `cooldown` ago (the refusals of one overload lower
    /// it once).
    Lower {
        /// Parts per million of the current scale kept.
        keep: u64,
        /// The least time since the scale was last lowered.
        cooldown: Duration,
        /// The lowest scale it goes to.
        floor: u64,
    },
    /// The upstream said its limit: the scale is `scale` (within
    /// [`SCALE_FLOOR`] ..= [`SCALE_CEILING`]).
    Set {
        /// The new scale.
        scale: u64,
    },
}

/// A learned scale as a store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learned {
    /// The scale, in parts per million of the stated limits.
    pub scale: u64,
    /// When it last changed (store time, microseconds).
    pub changed_at: u64,
    /// When it was last lowered (store time, microseconds).
    pub lowered_at: u64,
}

impl Default for Learned {
    fn default() -> Self {
        Self {
            scale: SCALE_ONE,
            changed_at: 0,
            lowered_at: 0,
        }
    }
}

impl Learned {
    /// This scale after `adjust` at `now` (microseconds), and whether it
    /// was written (the store refreshes its time to live then). The memory
    /// store runs this; `ratewall-redis`'s `learned.lua` is the same rule.
    pub fn adjusted(self, adjust: Adjust, now: u64) -> (Self, bool) {
        let since = |at: u64| now.saturating_sub(at);
        match adjust {
            Adjust::Read => (self, false),
            Adjust::Raise { step, every } => {
                if step == 0 || self.scale >= SCALE_ONE || since(self.changed_at) < micros(every) {
                    return (self, false);
                }
                let step = (u128::from(self.scale) * u128::from(step.min(SCALE_ONE))
                    / u128::from(SCALE_ONE)) as u64;
                let scale = (self.scale + step.max(1)).min(SCALE_ONE);
                (
                    Self {
                        scale,
                        changed_at: now,
                        ..self
                    },
                    true,
                )
            }
            Adjust::Lower {
                keep,
                cooldown,
                floor,
            } => {
                if self.lowered_at != 0 && since(self.lowered_at) < micros(cooldown) {
                    return (self, false);
                }
                let kept = (u128::from(self.scale) * u128::from(keep.min(SCALE_ONE))
                    / u128::from(SCALE_ONE)) as u64;
                (
                    Self {
                        scale: kept.max(floor.clamp(SCALE_FLOOR, SCALE_ONE)),
                        changed_at: now,
                        lowered_at: now,
                    },
                    true,
                )
            }
            Adjust::Set { scale } => (
                Self {
                    scale: scale.clamp(SCALE_FLOOR, SCALE_CEILING),
                    changed_at: now,
                    ..self
                },
                true,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000;

    fn raise() -> Adjust {
        Adjust::Raise {
            step: 10_000,
            every: Duration::from_secs(1),
        }
    }

    fn lower() -> Adjust {
        Adjust::Lower {
            keep: 700_000,
            cooldown: Duration::from_secs(5),
            floor: 0,
        }
    }

    #[test]
    fn a_scale_never_learned_is_the_stated_limits_and_is_never_raised_past_them() {
        let start = Learned::default();
        assert_eq!(start.scale, SCALE_ONE);
        assert_eq!(start.adjusted(raise(), 10 * SECOND), (start, false));
        assert_eq!(start.adjusted(Adjust::Read, 10 * SECOND), (start, false));
    }

    #[test]
    fn the_refusals_of_one_overload_lower_the_scale_once() {
        let (once, written) = Learned::default().adjusted(lower(), 100 * SECOND);
        assert!(written);
        assert_eq!(once.scale, 700_000);
        let (again, written) = once.adjusted(lower(), 104 * SECOND);
        assert_eq!((again, written), (once, false), "within the cooldown");
        let (twice, _) = once.adjusted(lower(), 105 * SECOND);
        assert_eq!(twice.scale, 490_000);
    }

    #[test]
    fn raising_adds_a_share_of_the_current_scale_once_per_interval() {
        let (low, _) = Learned::default().adjusted(lower(), 100 * SECOND);
        assert!(!low.adjusted(raise(), 100 * SECOND + SECOND / 2).1);
        let (up, written) = low.adjusted(raise(), 101 * SECOND);
        assert!(written);
        assert_eq!(up.scale, 707_000);
        assert!(!up.adjusted(raise(), 101 * SECOND + 1).1);
        let mut scale = up;
        for second in 102..400 {
            scale = scale.adjusted(raise(), second * SECOND).0;
        }
        assert_eq!(scale.scale, SCALE_ONE, "capped at the stated limits");
    }

    #[test]
    fn a_said_limit_is_taken_within_bounds_and_the_floor_holds() {
        let said = Learned::default().adjusted(Adjust::Set { scale: 250_000 }, SECOND);
        assert_eq!(said.0.scale, 250_000);
        let above = Learned::default().adjusted(Adjust::Set { scale: u64::MAX }, SECOND);
        assert_eq!(above.0.scale, SCALE_CEILING);
        let mut low = Learned::default();
        for second in 0..100 {
            low = low
                .adjusted(
                    Adjust::Lower {
                        keep: 0,
                        cooldown: Duration::ZERO,
                        floor: 0,
                    },
                    second * SECOND,
                )
                .0;
        }
        assert_eq!(low.scale, SCALE_FLOOR);
    }
}
