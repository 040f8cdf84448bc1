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

/// One change to a learned scale ([`crate::backend::Backend::adjust`]),
/// in parts per million ([`SCALE_ONE`] is the stated limits). The store
/// applies it atomically, by its own time, and answers the scale after
/// it.
///
/// Besides the scale a store keeps a **ceiling**: the level an upstream's
/// limit was last found at (by a refusal, or by what it said was left),
/// believed for a while. While it is believed, the scale climbs back
/// toward a share of it (fast far below it, slowly near it) and stops
/// there, below the level that drew the refusal; once it is no longer
/// believed, the scale probes upward slowly, up to the stated limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Adjust {
    /// Only read the scale (a scale never learned is [`SCALE_ONE`]).
    Read,
    /// The upstream accepted: unless the scale changed less than `every`
    /// ago (so that many instances raise it once per `every`), raise it:
    /// toward `headroom` of a believed ceiling by `approach` of the gap
    /// (at least one part), never past it; with no ceiling believed (none
    /// found, or found `believe_for` or longer ago), by `step` of the scale
    /// (at least one part; none for a `step` of 0). Never past
    /// [`SCALE_ONE`].
    Raise {
        /// Parts per million of the current scale added while probing.
        step: u64,
        /// Parts per million of the gap to the target closed per raise,
        /// while a ceiling is believed.
        approach: u64,
        /// Parts per million of the ceiling the scale climbs to.
        headroom: u64,
        /// The least time since the scale last changed.
        every: Duration,
        /// How long a ceiling is believed after it was found.
        believe_for: Duration,
    },
    /// The upstream refused: unless the scale was lowered less than
    /// `cooldown` ago (the refusals of one overload lower it once: the
    /// later ones read a count the first one's pause changed). With an
    /// `estimate` of the upstream's limit (parts per million of the stated
    /// limits; 0 for none) the ceiling becomes the estimate and the scale
    /// at most `headroom` of it (not lower: the estimate is what the
    /// budget's own count says the upstream admitted); without one the
    /// ceiling becomes the scale that drew the refusal and the scale keeps
    /// `keep` of it. Never below `floor` (itself never below
    /// [`SCALE_FLOOR`]).
    Lower {
        /// Parts per million of the current scale kept, without an estimate.
        keep: u64,
        /// The upstream's limit the budget's count says, or 0.
        estimate: u64,
        /// Parts per million of the estimate the scale stays under.
        headroom: u64,
        /// The least time since the scale was last lowered.
        cooldown: Duration,
        /// The lowest scale it goes to.
        floor: u64,
    },
    /// The upstream said how much it has left, accepting a call: the limit
    /// that implies (`estimate`, parts per million of the stated limits)
    /// becomes the ceiling, and a scale above `headroom` of it comes down to
    /// it (no refusal needed to find a lower limit).
    Found {
        /// The upstream's limit implied by what it said was left.
        estimate: u64,
        /// Parts per million of the estimate the scale stays under.
        headroom: u64,
    },
    /// The upstream said its limit: the scale is `scale` (within
    /// [`SCALE_FLOOR`] ..= [`SCALE_CEILING`]) and no ceiling is kept.
    Set {
        /// The new scale.
        scale: u64,
    },
}

/// A learned scale as a store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Learned {
    /// The scale, in parts per million of the stated limits.
    pub scale: u64,
    /// When it last changed (store time, microseconds).
    pub changed_at: u64,
    /// When it was last lowered (store time, microseconds).
    pub lowered_at: u64,
    /// The upstream's limit as last found (parts per million; 0: none).
    pub ceiling: u64,
    /// When the ceiling was found (store time, microseconds).
    pub ceiling_at: u64,
}

impl Default for Learned {
    fn default() -> Self {
        Self {
            scale: SCALE_ONE,
            changed_at: 0,
            lowered_at: 0,
            ceiling: 0,
            ceiling_at: 0,
        }
    }
}

/// `value` times `share` parts per million, rounded down.
fn share_of(value: u64, share: u64) -> u64 {
    (u128::from(value) * u128::from(share) / u128::from(SCALE_ONE)) as u64
}

impl Learned {
    /// This scale after `adjust` at `now` (microseconds), and whether it
    /// was written (the store refreshes its time to live then). The memory
    /// store runs this; `ratewall-redis`'s `learned.lua` is the same rule,
    /// in the same integers.
    pub fn adjusted(self, adjust: Adjust, now: u64) -> (Self, bool) {
        let since = |at: u64| now.saturating_sub(at);
        match adjust {
            Adjust::Read => (self, false),
            Adjust::Raise {
                step,
                approach,
                headroom,
                every,
                believe_for,
            } => {
                if since(self.changed_at) < micros(every) {
                    return (self, false);
                }
                let believed = self.ceiling > 0 && since(self.ceiling_at) < micros(believe_for);
                let scale = if believed {
                    let target = share_of(self.ceiling, headroom.min(SCALE_ONE)).min(SCALE_ONE);
                    if self.scale >= target || approach == 0 {
                        return (self, false);
                    }
                    let gap = share_of(target - self.scale, approach.min(SCALE_ONE));
                    (self.scale + gap.max(1)).min(target)
                } else {
                    if step == 0 || self.scale >= SCALE_ONE {
                        return (self, false);
                    }
                    let step = share_of(self.scale, step.min(SCALE_ONE));
                    (self.scale + step.max(1)).min(SCALE_ONE)
                };
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
                estimate,
                headroom,
                cooldown,
                floor,
            } => {
                if self.lowered_at != 0 && since(self.lowered_at) < micros(cooldown) {
                    return (self, false);
                }
                let (ceiling, scale) = if estimate > 0 {
                    let estimate = estimate.min(SCALE_CEILING);
                    let under = share_of(estimate, headroom.min(SCALE_ONE));
                    (estimate, self.scale.min(under))
                } else {
                    (self.scale, share_of(self.scale, keep.min(SCALE_ONE)))
                };
                (
                    Self {
                        scale: scale.max(floor.clamp(SCALE_FLOOR, SCALE_ONE)),
                        changed_at: now,
                        lowered_at: now,
                        ceiling,
                        ceiling_at: now,
                    },
                    true,
                )
            }
            Adjust::Found { estimate, headroom } => {
                let estimate = estimate.clamp(SCALE_FLOOR, SCALE_CEILING);
                let under = share_of(estimate, headroom.min(SCALE_ONE)).max(SCALE_FLOOR);
                let (scale, changed_at) = if self.scale > under {
                    (under, now)
                } else {
                    (self.scale, self.changed_at)
                };
                (
                    Self {
                        scale,
                        changed_at,
                        ceiling: estimate,
                        ceiling_at: now,
                        ..self
                    },
                    true,
                )
            }
            Adjust::Set { scale } => (
                Self {
                    scale: scale.clamp(SCALE_FLOOR, SCALE_CEILING),
                    changed_at: now,
                    ceiling: 0,
                    ceiling_at: 0,
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
            approach: 250_000,
            headroom: 950_000,
            every: Duration::from_secs(1),
            believe_for: Duration::from_secs(600),
        }
    }

    fn lower(estimate: u64) -> Adjust {
        Adjust::Lower {
            keep: 700_000,
            estimate,
            headroom: 950_000,
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
        let (once, written) = Learned::default().adjusted(lower(0), 100 * SECOND);
        assert!(written);
        assert_eq!((once.scale, once.ceiling), (700_000, SCALE_ONE));
        let (again, written) = once.adjusted(lower(0), 104 * SECOND);
        assert_eq!((again, written), (once, false), "within the cooldown");
        let (twice, _) = once.adjusted(lower(0), 105 * SECOND);
        assert_eq!((twice.scale, twice.ceiling), (490_000, 700_000));
    }

    #[test]
    fn a_refusal_with_an_estimate_goes_under_it_and_never_below_what_it_says() {
        // Found at 500 000 (half the stated limits): the scale goes to 95 % of it.
        let (cut, _) = Learned::default().adjusted(lower(500_000), 100 * SECOND);
        assert_eq!((cut.scale, cut.ceiling), (475_000, 500_000));
        // A refusal a burst drew, the count saying the limit is where the
        // scale already is: no deeper cut than the estimate's headroom.
        let (burst, _) = Learned::default().adjusted(lower(1_001_000), 100 * SECOND);
        assert_eq!((burst.scale, burst.ceiling), (950_950, 1_001_000));
        let low = Learned {
            scale: 300_000,
            ..Learned::default()
        };
        assert_eq!(low.adjusted(lower(500_000), 100 * SECOND).0.scale, 300_000);
    }

    #[test]
    fn raising_climbs_fast_toward_a_believed_ceiling_and_stops_below_it() {
        let (low, _) = Learned::default().adjusted(lower(0), 100 * SECOND);
        assert!(!low.adjusted(raise(), 100 * SECOND + SECOND / 2).1);
        // The ceiling is the scale that drew the refusal (1.0); the target
        // 95 % of it; a quarter of the gap a second.
        let (up, written) = low.adjusted(raise(), 101 * SECOND);
        assert!(written);
        assert_eq!(up.scale, 700_000 + (950_000 - 700_000) / 4);
        let mut scale = up;
        for second in 102..140 {
            scale = scale.adjusted(raise(), second * SECOND).0;
        }
        assert!(
            scale.scale >= 940_000 && scale.scale <= 950_000,
            "{}",
            scale.scale
        );
        for second in 140..600 {
            scale = scale.adjusted(raise(), second * SECOND).0;
        }
        assert_eq!(scale.scale, 950_000, "a plateau below the refusal's level");
        // Ten minutes after the refusal the ceiling is no longer believed:
        // the scale probes 1 % a second, up to the stated limits.
        let probed = scale.adjusted(raise(), 701 * SECOND).0;
        assert_eq!(probed.scale, 950_000 + 9_500);
        let mut scale = probed;
        for second in 702..800 {
            scale = scale.adjusted(raise(), second * SECOND).0;
        }
        assert_eq!(scale.scale, SCALE_ONE);
    }

    #[test]
    fn what_the_upstream_says_is_left_sets_the_ceiling_without_a_refusal() {
        let found = Adjust::Found {
            estimate: 400_000,
            headroom: 950_000,
        };
        let (down, written) = Learned::default().adjusted(found, 10 * SECOND);
        assert!(written);
        assert_eq!((down.scale, down.ceiling), (380_000, 400_000));
        // Found higher: the ceiling rises, the scale climbs to it by raises.
        let higher = Adjust::Found {
            estimate: 800_000,
            headroom: 950_000,
        };
        let (up, _) = down.adjusted(higher, 11 * SECOND);
        assert_eq!((up.scale, up.ceiling), (380_000, 800_000));
        let climbed = up.adjusted(raise(), 12 * SECOND).0;
        assert!(climbed.scale > 380_000 && climbed.scale < 760_000);
    }

    #[test]
    fn a_said_limit_is_taken_within_bounds_and_the_floor_holds() {
        let said = Learned::default().adjusted(Adjust::Set { scale: 250_000 }, SECOND);
        assert_eq!((said.0.scale, said.0.ceiling), (250_000, 0));
        let above = Learned::default().adjusted(Adjust::Set { scale: u64::MAX }, SECOND);
        assert_eq!(above.0.scale, SCALE_CEILING);
        let mut low = Learned::default();
        for second in 0..100 {
            low = low
                .adjusted(
                    Adjust::Lower {
                        keep: 0,
                        estimate: 0,
                        headroom: 950_000,
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
