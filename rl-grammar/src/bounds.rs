//! Every numeric bound of a limit, and why it is there.

use std::fmt;

use crate::algorithm::Algorithm;

/// Integers are exact in an IEEE double (a Lua number, what the Redis
/// scripts compute with) below this: 2^53.
pub const DOUBLE_EXACT: u64 = 1 << 53;

/// The bound on `capacity × period_us` (2^52). The largest integer an
/// algorithm's arithmetic reaches is about an absolute time (now ≈ 2^50.6 µs
/// since the epoch) plus this product, so with the bound every integer stays
/// below [`DOUBLE_EXACT`] and Lua and Rust compute the same decisions.
pub const MAX_CAPACITY_PERIOD: u64 = 1 << 52;

/// The largest threshold of a sliding log: each admitted unit is one stored
/// entry, and every decision trims and counts them.
pub const SLIDING_LOG_CAP: u64 = 10_000;

/// The default number of sub-windows of the sliding-window counter.
pub const DEFAULT_SLOTS: u64 = 10;

/// The most calls an in-flight limit lets run at once: each running call
/// holds one entry in Redis (a sorted set member), counted on every
/// admission.
pub const MAX_IN_FLIGHT: u64 = 100_000;

/// The shortest lease of an in-flight slot (1 s): leases are renewed every
/// third of their time to live, so a shorter one would mean a renewal every
/// few hundred milliseconds for every live call set.
pub const MIN_LEASE_TTL_US: u64 = 1_000_000;

/// The longest lease of an in-flight slot (1 h): a dead instance's slots
/// come back after at most this long.
pub const MAX_LEASE_TTL_US: u64 = 3_600_000_000;

/// The default lease of an in-flight slot: 10 s (renewed every ~3.3 s, so
/// two renewals can fail before a live call loses its slot; a dead
/// instance's slots come back within 10 s).
pub const DEFAULT_LEASE_TTL_US: u64 = 10_000_000;

/// Why a set of parts does not make a limit. The message says how to fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// `threshold = 0` would refuse every call.
    ZeroThreshold,
    /// A period of zero has no meaning.
    ZeroPeriod,
    /// `burst = 0` would refuse every call.
    ZeroBurst,
    /// The sliding-window counter needs at least one slot.
    ZeroSlots,
    /// The sliding-window counter splits the period into equal whole
    /// microseconds.
    UnevenSlots {
        /// The period in microseconds.
        period_us: u64,
        /// The slot count.
        slots: u64,
    },
    /// `capacity × period_us` above [`MAX_CAPACITY_PERIOD`].
    TooLarge {
        /// The threshold, or the burst where it is the larger capacity.
        capacity: u64,
        /// The period in microseconds.
        period_us: u64,
    },
    /// A sliding log above [`SLIDING_LOG_CAP`].
    SlidingLogTooLarge {
        /// The threshold asked for.
        threshold: u64,
    },
    /// An in-flight limit above [`MAX_IN_FLIGHT`].
    InFlightTooLarge {
        /// The `max_in_flight` asked for.
        max: u64,
    },
    /// An in-flight lease outside [`MIN_LEASE_TTL_US`] ..= [`MAX_LEASE_TTL_US`].
    LeaseTtlOutOfRange {
        /// The time to live asked for, in microseconds.
        ttl_us: u64,
    },
    /// `burst` written for an algorithm whose capacity is its threshold
    /// (the window algorithms): it would change nothing ([`check_settings`]).
    BurstWithoutEffect {
        /// The limit's algorithm.
        algorithm: Algorithm,
    },
    /// `slots` written for an algorithm other than the sliding-window
    /// counter: it would change nothing ([`check_settings`]).
    SlotsWithoutEffect {
        /// The limit's algorithm.
        algorithm: Algorithm,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Problem::ZeroThreshold => f.write_str("threshold must be at least 1, got 0"),
            Problem::ZeroPeriod => f.write_str("period must be at least 1 microsecond, got 0"),
            Problem::ZeroBurst => f.write_str("burst must be at least 1, got 0"),
            Problem::ZeroSlots => f.write_str("slots must be at least 1, got 0"),
            Problem::UnevenSlots { period_us, slots } => write!(
                f,
                "a period of {period_us} µs cannot be split into {slots} equal slots (the sliding-window \
                 counter counts per whole microsecond); pick a period or slot count that divides evenly"
            ),
            Problem::TooLarge {
                capacity,
                period_us,
            } => write!(
                f,
                "capacity × period = {capacity} × {period_us} µs exceeds 2^52, too large to compute exactly \
                 (the Redis backend computes in doubles); pick a shorter period or a smaller capacity"
            ),
            Problem::SlidingLogTooLarge { threshold } => write!(
                f,
                "a sliding log stores one entry per admitted unit and allows a threshold of at most \
                 {SLIDING_LOG_CAP}, got {threshold}; use the sliding-window counter (`sliding_window`) for \
                 large thresholds"
            ),
            Problem::InFlightTooLarge { max } => write!(
                f,
                "`max_in_flight` is at most {MAX_IN_FLIGHT} (each call in flight is one entry in the store), got {max}"
            ),
            Problem::LeaseTtlOutOfRange { ttl_us } => write!(
                f,
                "an in-flight lease lives from 1s to 1h (it is renewed every third of it while the call runs, \
                 and a dead instance's slots come back after it), got {}",
                crate::format_duration(ttl_us)
            ),
            Problem::BurstWithoutEffect { algorithm } => write!(
                f,
                "`burst` has no effect with `{algorithm}`, which admits at most `threshold` per period; \
                 remove it, or pick `token_bucket`, `leaky_bucket` or `gcra`"
            ),
            Problem::SlotsWithoutEffect { algorithm } => write!(
                f,
                "`slots` only applies to `algorithm = sliding_window`, not `{algorithm}`; remove it"
            ),
        }
    }
}

impl std::error::Error for Problem {}

/// The most units a single instant can admit: `burst` for token bucket,
/// leaky bucket and GCRA, `threshold` for the window algorithms.
pub const fn capacity(threshold: u64, algorithm: Algorithm, burst: u64) -> u64 {
    if algorithm.uses_burst() {
        burst
    } else {
        threshold
    }
}

/// Checks the parts of a limit against every bound, in a fixed order (the
/// first problem found is returned).
///
/// ```
/// use ratewall_grammar::{Algorithm, Problem, check_limit};
/// assert_eq!(check_limit(5, 60_000_000, Algorithm::Gcra, 5, 10), Ok(()));
/// assert_eq!(check_limit(0, 60_000_000, Algorithm::Gcra, 5, 10), Err(Problem::ZeroThreshold));
/// assert_eq!(
///     check_limit(10, 1_001, Algorithm::SlidingWindow, 10, 10),
///     Err(Problem::UnevenSlots { period_us: 1_001, slots: 10 })
/// );
/// ```
///
/// # Errors
/// The first bound the parts break, checked in this order:
/// [`Problem::ZeroThreshold`], [`Problem::ZeroPeriod`],
/// [`Problem::ZeroBurst`], [`Problem::ZeroSlots`], [`Problem::UnevenSlots`]
/// (sliding window), [`Problem::InFlightTooLarge`] and
/// [`Problem::LeaseTtlOutOfRange`] (a concurrency limit),
/// [`Problem::TooLarge`], [`Problem::SlidingLogTooLarge`].
pub const fn check_limit(
    threshold: u64,
    period_us: u64,
    algorithm: Algorithm,
    burst: u64,
    slots: u64,
) -> Result<(), Problem> {
    if threshold == 0 {
        return Err(Problem::ZeroThreshold);
    }
    if period_us == 0 {
        return Err(Problem::ZeroPeriod);
    }
    if burst == 0 {
        return Err(Problem::ZeroBurst);
    }
    if slots == 0 {
        return Err(Problem::ZeroSlots);
    }
    if algorithm.uses_slots() && !period_us.is_multiple_of(slots) {
        return Err(Problem::UnevenSlots { period_us, slots });
    }
    if algorithm.is_in_flight() {
        if threshold > MAX_IN_FLIGHT {
            return Err(Problem::InFlightTooLarge { max: threshold });
        }
        if period_us < MIN_LEASE_TTL_US || period_us > MAX_LEASE_TTL_US {
            return Err(Problem::LeaseTtlOutOfRange { ttl_us: period_us });
        }
    }
    // The larger of threshold and burst bounds the state (GCRA's tolerance,
    // the meters' full level, the window counts).
    let size = if algorithm.uses_burst() && burst > threshold {
        burst
    } else {
        threshold
    };
    match size.checked_mul(period_us) {
        Some(product) if product <= MAX_CAPACITY_PERIOD => {}
        _ => {
            return Err(Problem::TooLarge {
                capacity: size,
                period_us,
            });
        }
    }
    if matches!(algorithm, Algorithm::SlidingLog) && threshold > SLIDING_LOG_CAP {
        return Err(Problem::SlidingLogTooLarge { threshold });
    }
    Ok(())
}

/// Checks that the settings written beside a rate change something under
/// its algorithm: `burst` sets the capacity of GCRA and the buckets only,
/// `slots` the sub-windows of the sliding-window counter only. A setting
/// that changes nothing is a mistake to report (the reader meant another
/// algorithm), not one to ignore: the macro and `ratewall`'s configuration
/// forms (its limits file, its serde forms) refuse it with this message.
///
/// ```
/// use ratewall_grammar::{Algorithm, Problem, check_settings};
/// assert_eq!(check_settings(Algorithm::Gcra, true, false), Ok(()));
/// assert_eq!(check_settings(Algorithm::SlidingWindow, false, true), Ok(()));
/// assert_eq!(
///     check_settings(Algorithm::FixedWindow, true, false),
///     Err(Problem::BurstWithoutEffect { algorithm: Algorithm::FixedWindow })
/// );
/// assert!(check_settings(Algorithm::Gcra, false, true).is_err());
/// ```
///
/// # Errors
/// [`Problem::BurstWithoutEffect`] when `burst` is written and the
/// algorithm does not use it ([`Algorithm::uses_burst`]), else
/// [`Problem::SlotsWithoutEffect`] when `slots` is written and the
/// algorithm does not use them ([`Algorithm::uses_slots`]).
pub const fn check_settings(algorithm: Algorithm, burst: bool, slots: bool) -> Result<(), Problem> {
    if burst && !algorithm.uses_burst() {
        return Err(Problem::BurstWithoutEffect { algorithm });
    }
    if slots && !algorithm.uses_slots() {
        return Err(Problem::SlotsWithoutEffect { algorithm });
    }
    Ok(())
}

/// Every bound the parts break, in the order [`check_limit`] checks them
/// (its error is the first of these). Zero values are reported alone: the
/// other bounds are meaningless without them.
///
/// ```
/// use ratewall_grammar::{Algorithm, Problem, problems};
/// let all = problems(20_000, 1_001 * 86_400_000_000, Algorithm::SlidingLog, 20_000, 10);
/// assert!(matches!(all[..], [Problem::TooLarge { .. }, Problem::SlidingLogTooLarge { .. }]));
/// ```
pub fn problems(
    threshold: u64,
    period_us: u64,
    algorithm: Algorithm,
    burst: u64,
    slots: u64,
) -> Vec<Problem> {
    let zeros: Vec<Problem> = [
        (threshold, Problem::ZeroThreshold),
        (period_us, Problem::ZeroPeriod),
        (burst, Problem::ZeroBurst),
        (slots, Problem::ZeroSlots),
    ]
    .into_iter()
    .filter(|(value, _)| *value == 0)
    .map(|(_, problem)| problem)
    .collect();
    if !zeros.is_empty() {
        return zeros;
    }
    let mut found = Vec::new();
    if algorithm.uses_slots() && !period_us.is_multiple_of(slots) {
        found.push(Problem::UnevenSlots { period_us, slots });
    }
    if algorithm.is_in_flight() {
        if threshold > MAX_IN_FLIGHT {
            found.push(Problem::InFlightTooLarge { max: threshold });
        }
        if !(MIN_LEASE_TTL_US..=MAX_LEASE_TTL_US).contains(&period_us) {
            found.push(Problem::LeaseTtlOutOfRange { ttl_us: period_us });
        }
    }
    let size = if algorithm.uses_burst() && burst > threshold {
        burst
    } else {
        threshold
    };
    if size
        .checked_mul(period_us)
        .is_none_or(|product| product > MAX_CAPACITY_PERIOD)
    {
        found.push(Problem::TooLarge {
            capacity: size,
            period_us,
        });
    }
    if matches!(algorithm, Algorithm::SlidingLog) && threshold > SLIDING_LOG_CAP {
        found.push(Problem::SlidingLogTooLarge { threshold });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_limit_reports_the_first_of_all_problems() {
        let values = [0, 1, 3, 7, 10, 10_001, 1 << 26, 86_400_000_000, u64::MAX];
        for algorithm in Algorithm::ALL.into_iter().chain([Algorithm::InFlight]) {
            for &threshold in &values {
                for &period_us in &values {
                    for &burst in &values[..6] {
                        for slots in [0, 1, 10] {
                            let all = problems(threshold, period_us, algorithm, burst, slots);
                            assert_eq!(
                                check_limit(threshold, period_us, algorithm, burst, slots),
                                all.first().map_or(Ok(()), |p| Err(*p)),
                                "{threshold} {period_us} {algorithm} {burst} {slots}"
                            );
                        }
                    }
                }
            }
        }
    }

    const DAY_US: u64 = 86_400_000_000;

    #[test]
    fn the_product_bound_is_inclusive_and_uses_the_larger_of_threshold_and_burst() {
        let most = MAX_CAPACITY_PERIOD / DAY_US;
        assert_eq!(check_limit(most, DAY_US, Algorithm::Gcra, most, 10), Ok(()));
        assert_eq!(
            check_limit(most + 1, DAY_US, Algorithm::Gcra, most + 1, 10),
            Err(Problem::TooLarge {
                capacity: most + 1,
                period_us: DAY_US
            })
        );
        assert!(check_limit(1, DAY_US, Algorithm::Gcra, most + 1, 10).is_err());
        // The window algorithms ignore burst.
        assert_eq!(
            check_limit(1, DAY_US, Algorithm::FixedWindow, most + 1, 10),
            Ok(())
        );
        assert!(check_limit(u64::MAX, u64::MAX, Algorithm::Gcra, 1, 10).is_err());
    }

    #[test]
    fn the_bounds_keep_absolute_times_exact_in_doubles() {
        // 2100-01-01 in µs since the epoch, plus the largest state.
        let year_2100_us: u64 = 4_102_444_800_000_000;
        assert!(year_2100_us + MAX_CAPACITY_PERIOD < DOUBLE_EXACT);
    }

    #[test]
    fn sliding_log_cap_and_slots_apply_only_to_their_algorithm() {
        assert_eq!(
            check_limit(SLIDING_LOG_CAP + 1, 1_000_000, Algorithm::SlidingLog, 1, 10),
            Err(Problem::SlidingLogTooLarge {
                threshold: SLIDING_LOG_CAP + 1
            })
        );
        assert_eq!(
            check_limit(SLIDING_LOG_CAP + 1, 1_000_000, Algorithm::Gcra, 1, 10),
            Ok(())
        );
        assert_eq!(check_limit(1, 1_001, Algorithm::Gcra, 1, 10), Ok(()));
        assert_eq!(
            check_limit(1, 1_000, Algorithm::FixedWindow, 1, 0),
            Err(Problem::ZeroSlots)
        );
    }

    #[test]
    fn in_flight_limits_bound_their_size_and_lease() {
        let ok = check_limit(10, DEFAULT_LEASE_TTL_US, Algorithm::InFlight, 10, 10);
        assert_eq!(ok, Ok(()));
        assert_eq!(
            check_limit(
                MAX_IN_FLIGHT + 1,
                DEFAULT_LEASE_TTL_US,
                Algorithm::InFlight,
                1,
                10
            ),
            Err(Problem::InFlightTooLarge {
                max: MAX_IN_FLIGHT + 1
            })
        );
        assert_eq!(
            check_limit(10, 999_999, Algorithm::InFlight, 10, 10),
            Err(Problem::LeaseTtlOutOfRange { ttl_us: 999_999 })
        );
        let message = Problem::LeaseTtlOutOfRange { ttl_us: 500_000 }.to_string();
        assert!(message.contains("500ms"), "{message}");
    }

    #[test]
    fn messages_name_the_value_and_the_fix() {
        let message = Problem::SlidingLogTooLarge { threshold: 20_000 }.to_string();
        assert!(message.contains("20000") && message.contains("sliding_window"));
        let message = Problem::TooLarge {
            capacity: 3,
            period_us: 7,
        }
        .to_string();
        assert!(message.contains("3 × 7 µs exceeds 2^52"), "{message}");
    }
}
