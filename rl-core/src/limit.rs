//! The limit model: how many units per period, decided by which algorithm.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::LimitError;

/// Bound on `capacity × period_us`. Every integer of the algorithms'
/// arithmetic, absolute times included (now ≈ 2^50.6 µs, plus at most this),
/// then stays below 2^53, so Lua (doubles) and Rust (u64) compute the same.
pub(crate) const EXACT_LIMIT: u64 = 1 << 52;

/// The limiting algorithm. See the crate docs for which one to pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Counts per aligned window of length `period`. O(1), but up to 2×threshold
    /// can pass around a window boundary.
    FixedWindow,
    /// One entry per admitted unit: exact, never more than `threshold` in any
    /// window of length `period`. Memory O(threshold) per identity.
    SlidingLog,
    /// Counts per sub-window (`slots` of them), the oldest weighted by how much
    /// of it is still inside the window. O(slots) memory, close to exact.
    SlidingWindow,
    /// A bucket of `burst` tokens refilled at `threshold` per `period`.
    TokenBucket,
    /// A meter draining at `threshold` per `period`, holding at most `burst`.
    LeakyBucket,
    /// Generic cell rate algorithm: one timestamp per identity, exact average
    /// rate, bursts up to `burst`. The default.
    #[default]
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The snake_case name used in the macro, configuration and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// A short code used in storage keys and in the Redis scripts.
    pub const fn code(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingLog => "sl",
            Algorithm::SlidingWindow => "sw",
            Algorithm::TokenBucket => "tb",
            Algorithm::LeakyBucket => "lb",
            Algorithm::Gcra => "gc",
        }
    }

    /// Whether `burst` sets the capacity for this algorithm.
    pub const fn uses_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = LimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| LimitError::UnknownAlgorithm(s.to_owned()))
    }
}

/// A limit: `threshold` units per `period`, decided by an [`Algorithm`].
///
/// Built only from valid values: zero thresholds, periods, bursts, slots, and
/// values too large to compute exactly are refused with a [`LimitError`].
///
/// ```
/// use rl_core::{Algorithm, Limit};
/// use std::time::Duration;
///
/// let limit = Limit::per_minute(5)?.with_algorithm(Algorithm::SlidingLog)?;
/// assert_eq!(limit.threshold(), 5);
/// assert_eq!(limit.period(), Duration::from_secs(60));
/// assert!(Limit::new(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), rl_core::LimitError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    threshold: u64,
    period_us: u64,
    algorithm: Algorithm,
    burst: u64,
    slots: u64,
}

/// Why a set of parts does not make a limit (const-evaluable twin of [`LimitError`]).
#[derive(Debug, Clone, Copy)]
enum Problem {
    ZeroThreshold,
    ZeroPeriod,
    ZeroBurst,
    ZeroSlots,
    UnevenSlots,
    TooLarge,
    SlidingLogTooLarge,
}

impl Limit {
    /// The largest threshold a sliding log accepts: each admitted unit is one
    /// stored entry, and every decision trims and counts them.
    pub const SLIDING_LOG_CAP: u64 = 10_000;

    /// The default number of sub-windows of the sliding-window counter.
    pub const DEFAULT_SLOTS: u64 = 10;

    /// `threshold` units per `period`, with the default algorithm ([`Algorithm::Gcra`])
    /// and a burst equal to the threshold.
    pub fn new(threshold: u64, period: Duration) -> Result<Self, LimitError> {
        Self::from_parts(
            threshold,
            u64::try_from(period.as_micros()).unwrap_or(u64::MAX),
            Algorithm::default(),
            threshold,
            Self::DEFAULT_SLOTS,
        )
    }

    /// `threshold` units per second.
    pub fn per_second(threshold: u64) -> Result<Self, LimitError> {
        Self::new(threshold, Duration::from_secs(1))
    }

    /// `threshold` units per minute.
    pub fn per_minute(threshold: u64) -> Result<Self, LimitError> {
        Self::new(threshold, Duration::from_secs(60))
    }

    /// `threshold` units per hour.
    pub fn per_hour(threshold: u64) -> Result<Self, LimitError> {
        Self::new(threshold, Duration::from_secs(3_600))
    }

    /// `threshold` units per day.
    pub fn per_day(threshold: u64) -> Result<Self, LimitError> {
        Self::new(threshold, Duration::from_secs(86_400))
    }

    /// The same limit decided by another algorithm.
    pub fn with_algorithm(self, algorithm: Algorithm) -> Result<Self, LimitError> {
        Self::from_parts(
            self.threshold,
            self.period_us,
            algorithm,
            self.burst,
            self.slots,
        )
    }

    /// The same limit with another burst (capacity of token bucket, leaky bucket
    /// and GCRA; ignored by the window algorithms).
    pub fn with_burst(self, burst: u64) -> Result<Self, LimitError> {
        Self::from_parts(
            self.threshold,
            self.period_us,
            self.algorithm,
            burst,
            self.slots,
        )
    }

    /// The same limit with another number of sub-windows (sliding-window counter).
    pub fn with_slots(self, slots: u64) -> Result<Self, LimitError> {
        Self::from_parts(
            self.threshold,
            self.period_us,
            self.algorithm,
            self.burst,
            slots,
        )
    }

    /// The same limit with another threshold.
    pub fn with_threshold(self, threshold: u64) -> Result<Self, LimitError> {
        let burst = if self.burst == self.threshold {
            threshold
        } else {
            self.burst
        };
        Self::from_parts(threshold, self.period_us, self.algorithm, burst, self.slots)
    }

    /// Builds a limit from raw parts, validating them all.
    pub fn from_parts(
        threshold: u64,
        period_us: u64,
        algorithm: Algorithm,
        burst: u64,
        slots: u64,
    ) -> Result<Self, LimitError> {
        match Self::validate(threshold, period_us, algorithm, burst, slots) {
            Ok(limit) => Ok(limit),
            Err(problem) => Err(match problem {
                Problem::ZeroThreshold => LimitError::ZeroThreshold,
                Problem::ZeroPeriod => LimitError::ZeroPeriod,
                Problem::ZeroBurst => LimitError::ZeroBurst,
                Problem::ZeroSlots => LimitError::ZeroSlots,
                Problem::UnevenSlots => LimitError::UnevenSlots { period_us, slots },
                Problem::TooLarge => LimitError::TooLarge {
                    capacity: if algorithm.uses_burst() {
                        burst.max(threshold)
                    } else {
                        threshold
                    },
                    period_us,
                },
                Problem::SlidingLogTooLarge => LimitError::SlidingLogTooLarge {
                    threshold,
                    cap: Self::SLIDING_LOG_CAP,
                },
            }),
        }
    }

    /// Compile-time constructor used by the `#[rate_limit]` macro, which has
    /// already validated the values; invalid parts fail const evaluation.
    #[doc(hidden)]
    pub const fn __const(
        threshold: u64,
        period_us: u64,
        algorithm: Algorithm,
        burst: u64,
        slots: u64,
    ) -> Self {
        match Self::validate(threshold, period_us, algorithm, burst, slots) {
            Ok(limit) => limit,
            Err(_) => panic!("invalid rate limit"),
        }
    }

    const fn validate(
        threshold: u64,
        period_us: u64,
        algorithm: Algorithm,
        burst: u64,
        slots: u64,
    ) -> Result<Self, Problem> {
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
        if matches!(algorithm, Algorithm::SlidingWindow) && !period_us.is_multiple_of(slots) {
            return Err(Problem::UnevenSlots);
        }
        let capacity = if algorithm.uses_burst() && burst > threshold {
            burst
        } else {
            threshold
        };
        match capacity.checked_mul(period_us) {
            Some(product) if product <= EXACT_LIMIT => {}
            _ => return Err(Problem::TooLarge),
        }
        if matches!(algorithm, Algorithm::SlidingLog) && threshold > Self::SLIDING_LOG_CAP {
            return Err(Problem::SlidingLogTooLarge);
        }
        Ok(Self {
            threshold,
            period_us,
            algorithm,
            burst,
            slots,
        })
    }

    /// Units admitted per period.
    pub const fn threshold(&self) -> u64 {
        self.threshold
    }

    /// The period.
    pub const fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The period in microseconds.
    pub const fn period_micros(&self) -> u64 {
        self.period_us
    }

    /// The algorithm.
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The burst as configured (defaults to the threshold).
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// Sub-windows of the sliding-window counter.
    pub const fn slots(&self) -> u64 {
        self.slots
    }

    /// The most units a single instant can admit: `burst` for token bucket,
    /// leaky bucket and GCRA, `threshold` for the window algorithms. This is
    /// the `limit` a [`crate::Decision`] reports.
    pub const fn capacity(&self) -> u64 {
        if self.algorithm.uses_burst() {
            self.burst
        } else {
            self.threshold
        }
    }

    /// Checks that a call of `cost` units could ever be allowed.
    pub fn check_cost(&self, cost: u64) -> Result<(), LimitError> {
        if cost == 0 {
            Err(LimitError::ZeroCost)
        } else if cost > self.capacity() {
            Err(LimitError::CostExceedsCapacity {
                cost,
                capacity: self.capacity(),
            })
        } else {
            Ok(())
        }
    }

    /// GCRA emission interval: `period / threshold`, rounded up to whole
    /// microseconds (never admits faster than configured).
    pub const fn emission_interval_micros(&self) -> u64 {
        self.period_us.div_ceil(self.threshold)
    }

    /// The suffix that identifies this limit's state under a key: algorithm
    /// and period (and slot count for the sliding-window counter). Changing
    /// any of these starts from fresh state (documented as a reset); changing
    /// the threshold or burst applies to the existing state.
    pub fn storage_suffix(&self) -> String {
        let (algorithm, period, slots) = self.state_id();
        match algorithm {
            Algorithm::SlidingWindow => format!("{}:{period}:{slots}", algorithm.code()),
            _ => format!("{}:{period}", algorithm.code()),
        }
    }

    /// What identifies this limit's state: two limits with the same id on one
    /// key would share (and double-count) one state.
    pub const fn state_id(&self) -> (Algorithm, u64, u64) {
        let slots = if matches!(self.algorithm, Algorithm::SlidingWindow) {
            self.slots
        } else {
            0
        };
        (self.algorithm, self.period_us, slots)
    }

    /// Checks that limits meant for one key have distinct state ids (e.g. not
    /// `"5/1h"` and `"10/1h"` with one algorithm: the smaller one suffices).
    pub fn check_distinct(limits: &[Limit]) -> Result<(), LimitError> {
        for (i, a) in limits.iter().enumerate() {
            if let Some(b) = limits[i + 1..]
                .iter()
                .find(|b| b.state_id() == a.state_id())
            {
                return Err(LimitError::Overlapping {
                    first: a.to_string(),
                    second: b.to_string(),
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} ({})",
            self.threshold,
            format_duration(self.period_us),
            self.algorithm
        )
    }
}

/// Parses `"5/1h"`, `"100/30s"` or `"10/d"` into a limit with the default algorithm.
impl FromStr for Limit {
    type Err = LimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || LimitError::BadRate(s.to_owned());
        let (threshold, period) = s.split_once('/').ok_or_else(bad)?;
        let threshold: u64 = threshold.trim().parse().map_err(|_| bad())?;
        let period = period.trim();
        let period = if period.starts_with(|c: char| c.is_ascii_digit()) {
            parse_duration(period)?
        } else {
            parse_duration(&format!("1{period}")).map_err(|_| bad())?
        };
        Limit::new(threshold, period)
    }
}

/// Parses a duration such as `"250us"`, `"500ms"`, `"30s"`, `"1m"`, `"1h"` or
/// `"1d"`; a bare integer is seconds.
///
/// ```
/// use rl_core::parse_duration;
/// use std::time::Duration;
/// assert_eq!(parse_duration("1m")?, Duration::from_secs(60));
/// assert_eq!(parse_duration("500ms")?, Duration::from_millis(500));
/// assert!(parse_duration("soon").is_err());
/// # Ok::<(), rl_core::LimitError>(())
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, LimitError> {
    let bad = || LimitError::BadDuration(text.to_owned());
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let micros_per_unit: u64 = match unit.trim() {
        "us" | "µs" => 1,
        "ms" => 1_000,
        "" | "s" | "sec" => 1_000_000,
        "m" | "min" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => return Err(bad()),
    };
    number
        .checked_mul(micros_per_unit)
        .map(Duration::from_micros)
        .ok_or_else(bad)
}

fn format_duration(us: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (86_400_000_000, "d"),
        (3_600_000_000, "h"),
        (60_000_000, "m"),
        (1_000_000, "s"),
        (1_000, "ms"),
    ];
    UNITS
        .iter()
        .find(|(size, _)| us.is_multiple_of(*size))
        .map(|(size, unit)| format!("{}{unit}", us / size))
        .unwrap_or_else(|| format!("{us}us"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_values_are_refused_with_the_bad_value_named() {
        assert_eq!(
            Limit::new(0, Duration::from_secs(1)),
            Err(LimitError::ZeroThreshold)
        );
        assert_eq!(Limit::new(1, Duration::ZERO), Err(LimitError::ZeroPeriod));
        assert_eq!(
            Limit::per_second(1).unwrap().with_burst(0),
            Err(LimitError::ZeroBurst)
        );
        assert_eq!(
            Limit::per_second(1).unwrap().with_slots(0),
            Err(LimitError::ZeroSlots)
        );
    }

    #[test]
    fn sliding_log_above_the_cap_suggests_the_sliding_window_counter() {
        let err = Limit::per_minute(20_000)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap_err();
        assert!(err.to_string().contains("sliding-window counter"), "{err}");
    }

    #[test]
    fn values_beyond_exact_integer_range_are_refused() {
        let err = Limit::new(u64::MAX / 2, Duration::from_secs(86_400)).unwrap_err();
        assert!(matches!(err, LimitError::TooLarge { .. }));
    }

    #[test]
    fn sliding_window_period_must_split_into_equal_slots() {
        let limit = Limit::new(10, Duration::from_micros(1_001)).unwrap();
        assert!(matches!(
            limit.with_algorithm(Algorithm::SlidingWindow),
            Err(LimitError::UnevenSlots {
                period_us: 1_001,
                slots: 10
            })
        ));
    }

    #[test]
    fn cost_above_capacity_is_an_error_not_a_forever_reject() {
        let limit = Limit::per_minute(5).unwrap();
        assert!(limit.check_cost(5).is_ok());
        assert_eq!(
            limit.check_cost(6),
            Err(LimitError::CostExceedsCapacity {
                cost: 6,
                capacity: 5
            })
        );
        assert_eq!(limit.check_cost(0), Err(LimitError::ZeroCost));
    }

    #[test]
    fn limits_on_one_key_must_not_share_algorithm_and_period() {
        let hour = |t| Limit::per_hour(t).unwrap();
        assert!(
            Limit::check_distinct(&[
                Limit::per_minute(1).unwrap(),
                hour(5),
                Limit::per_day(10).unwrap()
            ])
            .is_ok()
        );
        let err = Limit::check_distinct(&[hour(5), hour(10)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "limits 5/1h (gcra) and 10/1h (gcra) share an algorithm and period on one key; keep one"
        );
        let windows = hour(5).with_algorithm(Algorithm::SlidingWindow).unwrap();
        assert!(Limit::check_distinct(&[windows, windows.with_slots(20).unwrap()]).is_ok());
        assert_ne!(
            windows.storage_suffix(),
            windows.with_slots(20).unwrap().storage_suffix()
        );
    }

    #[test]
    fn rates_parse_from_text() {
        assert_eq!(
            "5/1h".parse::<Limit>().unwrap(),
            Limit::per_hour(5).unwrap()
        );
        assert_eq!(
            "10/d".parse::<Limit>().unwrap(),
            Limit::per_day(10).unwrap()
        );
        assert_eq!(
            "3/500ms".parse::<Limit>().unwrap(),
            Limit::new(3, Duration::from_millis(500)).unwrap()
        );
        assert!(matches!(
            "5 per hour".parse::<Limit>(),
            Err(LimitError::BadRate(_))
        ));
        assert!(matches!(
            "0/1h".parse::<Limit>(),
            Err(LimitError::ZeroThreshold)
        ));
    }

    #[test]
    fn durations_parse_with_units_and_reject_garbage() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86_400));
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn display_round_trips_the_rate() {
        assert_eq!(Limit::per_hour(5).unwrap().to_string(), "5/1h (gcra)");
    }
}
