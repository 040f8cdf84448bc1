//! The limit model: how many units per period, decided by which algorithm.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use ratewall_grammar::Algorithm;
use ratewall_grammar::{BlockProblem, LeaseProblem, Problem};

use crate::model::clock::micros;
use crate::model::error::LimitError;

// Serde: a limit read from "10/1m" or a table, written back the same way.
// A limit's block (a penalty box).
mod block;
#[cfg(feature = "serde")]
pub(crate) mod form;

/// What identifies a limit's state under a key ([`Limit::state_id`]): its
/// algorithm, period and slot count.
pub(crate) type StateId = (Algorithm, u64, u64);

/// A limit: `threshold` units per `period`, decided by an [`Algorithm`].
///
/// Built only from valid values: zero thresholds, periods, bursts, slots, and
/// values too large to compute exactly are refused with a [`LimitError`].
///
/// ```
/// use ratewall::{Algorithm, Limit};
/// use std::time::Duration;
///
/// let limit = Limit::per_minute(5)?.with_algorithm(Algorithm::SlidingLog)?;
/// assert_eq!(limit.threshold(), 5);
/// assert_eq!(limit.period(), Duration::from_secs(60));
/// assert!(Limit::new(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), ratewall::error::LimitError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    threshold: u64,
    period_us: u64,
    algorithm: Algorithm,
    burst: u64,
    slots: u64,
    /// GCRA's emission interval, `ceil(period / threshold)` (derived).
    interval_us: u64,
    /// Units a process may lease at most (0: no leasing); see
    /// [`Limit::with_lease`].
    lease: u64,
    /// How long an identity stays refused once this limit refused it, in
    /// µs (0: no block); see [`Limit::with_block`].
    block_us: u64,
}

impl Limit {
    /// The largest threshold a sliding log accepts: each admitted unit is one
    /// stored entry, and every decision trims and counts them.
    pub const SLIDING_LOG_CAP: u64 = ratewall_grammar::SLIDING_LOG_CAP;

    /// The default number of sub-windows of the sliding-window counter.
    pub const DEFAULT_SLOTS: u64 = ratewall_grammar::DEFAULT_SLOTS;

    /// `threshold` units per `period`, with the default algorithm ([`Algorithm::Gcra`])
    /// and a burst equal to the threshold.
    ///
    /// # Errors
    /// [`LimitError::ZeroThreshold`] for a `threshold` of 0,
    /// [`LimitError::ZeroPeriod`] for a `period` under one microsecond, and
    /// [`LimitError::TooLarge`] when `threshold × period` (in µs) exceeds 2^52,
    /// beyond what every store computes exactly.
    pub fn new(threshold: u64, period: Duration) -> Result<Self, LimitError> {
        Self::from_parts(
            threshold,
            micros(period),
            Algorithm::default(),
            threshold,
            Self::DEFAULT_SLOTS,
        )
    }

    /// At most `max` calls in flight at once (a concurrency limit, not a
    /// rate), each holding a slot leased for [`Limit::DEFAULT_LEASE_TTL`]
    /// (10 s) and renewed while it runs; see [`Limit::in_flight_with_ttl`].
    ///
    /// ```
    /// use ratewall::Limit;
    /// let ten = Limit::in_flight(10)?;
    /// assert!(ten.is_in_flight());
    /// assert_eq!(ten.threshold(), 10);
    /// assert_eq!(ten.to_string(), "max_in_flight=10 (lease 10s)");
    /// assert!(Limit::in_flight(0).is_err());
    /// # Ok::<(), ratewall::error::LimitError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Limit::in_flight_with_ttl`]: [`LimitError::ZeroThreshold`] for a
    /// `max` of 0, [`LimitError::Other`] with
    /// [`Problem::InFlightTooLarge`](crate::error::Problem::InFlightTooLarge)
    /// above 100 000.
    pub fn in_flight(max: u64) -> Result<Self, LimitError> {
        Self::in_flight_with_ttl(max, Self::DEFAULT_LEASE_TTL)
    }

    /// At most `max` calls in flight at once, each slot leased for `ttl`
    /// (1 s ..= 1 h). A running call's slots are renewed every `ttl / 3`;
    /// when its instance dies, they come back at most `ttl` later. The key
    /// of the slots carries the lease (`if:<ttl_us>`): changing it starts
    /// from an empty set of slots.
    ///
    /// # Errors
    /// [`LimitError::ZeroThreshold`] for a `max` of 0, [`LimitError::ZeroPeriod`]
    /// for a zero `ttl`, and [`LimitError::Other`] with
    /// [`Problem::InFlightTooLarge`](crate::error::Problem::InFlightTooLarge)
    /// for a `max` above 100 000 or
    /// [`Problem::LeaseTtlOutOfRange`](crate::error::Problem::LeaseTtlOutOfRange)
    /// for a `ttl` outside 1 s ..= 1 h.
    pub fn in_flight_with_ttl(max: u64, ttl: Duration) -> Result<Self, LimitError> {
        Self::from_parts(
            max,
            micros(ttl),
            Algorithm::InFlight,
            max,
            Self::DEFAULT_SLOTS,
        )
    }

    /// The lease of an in-flight slot unless told otherwise: 10 s. Renewed
    /// every ~3.3 s, a running call keeps its slot through two failed
    /// renewals; a dead instance's slots come back within 10 s.
    pub const DEFAULT_LEASE_TTL: Duration =
        Duration::from_micros(ratewall_grammar::DEFAULT_LEASE_TTL_US);

    /// Whether this is a concurrency limit ([`Limit::in_flight`]).
    pub const fn is_in_flight(&self) -> bool {
        self.algorithm.is_in_flight()
    }

    /// `threshold` units per second.
    ///
    /// # Errors
    /// As [`Limit::new`]: [`LimitError::ZeroThreshold`] for 0,
    /// [`LimitError::TooLarge`] above 4 503 599 627 per second.
    pub fn per_second(threshold: u64) -> Result<Self, LimitError> {
        Self::new(threshold, Duration::from_secs(1))
    }

    /// `threshold` units per minute.
    ///
    /// # Errors
    /// As [`Limit::new`]: [`LimitError::ZeroThreshold`] for 0,
    /// [`LimitError::TooLarge`] above 75 059 993 per minute.
    pub fn per_minute(threshold: u64) -> Result<Self, LimitError> {
        Self::new(threshold, Duration::from_secs(60))
    }

    /// `threshold` units per hour.
    ///
    /// # Errors
    /// As [`Limit::new`]: [`LimitError::ZeroThreshold`] for 0,
    /// [`LimitError::TooLarge`] above 1 250 999 per hour.
    pub fn per_hour(threshold: u64) -> Result<Self, LimitError> {
        Self::new(threshold, Duration::from_secs(3_600))
    }

    /// `threshold` units per day.
    ///
    /// # Errors
    /// As [`Limit::new`]: [`LimitError::ZeroThreshold`] for 0,
    /// [`LimitError::TooLarge`] above 52 124 per day (a longer period allows
    /// fewer units: `threshold × period` in µs stays within 2^52).
    pub fn per_day(threshold: u64) -> Result<Self, LimitError> {
        Self::new(threshold, Duration::from_secs(86_400))
    }

    /// The same limit decided by another algorithm (an error if the limit
    /// leases and `algorithm` cannot, see [`Limit::with_lease`]).
    ///
    /// # Errors
    /// The bound of [`Limit::from_parts`] the limit breaks under `algorithm`
    /// (e.g. [`LimitError::SlidingLogTooLarge`] for a sliding log above
    /// [`Limit::SLIDING_LOG_CAP`], [`LimitError::UnevenSlots`] for a sliding
    /// window whose slots do not divide the period), [`LimitError::Lease`]
    /// when the limit leases and `algorithm` cannot lease or its capacity no
    /// longer holds the lease, or [`LimitError::Block`] when the limit
    /// blocks and `algorithm` cannot (a concurrency limit).
    pub fn with_algorithm(self, algorithm: Algorithm) -> Result<Self, LimitError> {
        Self::from_parts(
            self.threshold,
            self.period_us,
            algorithm,
            self.burst,
            self.slots,
        )?
        .keep_lease(self.lease)?
        .keep_block(self.block_us)
    }

    /// The same limit with another burst (capacity of token bucket, leaky bucket
    /// and GCRA; ignored by the window algorithms).
    ///
    /// # Errors
    /// [`LimitError::ZeroBurst`] for a `burst` of 0 (whatever the algorithm),
    /// [`LimitError::TooLarge`] when a burst above the threshold makes
    /// `burst × period` (in µs) exceed 2^52 (GCRA and the buckets), and
    /// [`LimitError::Lease`] when the limit's lease is no longer below the new
    /// capacity.
    pub fn with_burst(self, burst: u64) -> Result<Self, LimitError> {
        Self::from_parts(
            self.threshold,
            self.period_us,
            self.algorithm,
            burst,
            self.slots,
        )?
        .keep_lease(self.lease)
        .map(|limit| Self {
            block_us: self.block_us,
            ..limit
        })
    }

    /// The same limit with another number of sub-windows (sliding-window counter).
    ///
    /// # Errors
    /// [`LimitError::ZeroSlots`] for 0 slots, and [`LimitError::UnevenSlots`]
    /// when the limit is a sliding window whose period (in µs) `slots` does not
    /// divide.
    pub fn with_slots(self, slots: u64) -> Result<Self, LimitError> {
        Self::from_parts(
            self.threshold,
            self.period_us,
            self.algorithm,
            self.burst,
            slots,
        )?
        .keep_lease(self.lease)
        .map(|limit| Self {
            block_us: self.block_us,
            ..limit
        })
    }

    /// The same limit with another threshold.
    ///
    /// # Errors
    /// [`LimitError::ZeroThreshold`] for 0, [`LimitError::TooLarge`] when
    /// `threshold × period` (in µs) exceeds 2^52,
    /// [`LimitError::SlidingLogTooLarge`] for a sliding log above
    /// [`Limit::SLIDING_LOG_CAP`], [`LimitError::Other`] for a concurrency limit
    /// above 100 000, and [`LimitError::Lease`] when the limit's lease is no
    /// longer below the new capacity.
    pub fn with_threshold(self, threshold: u64) -> Result<Self, LimitError> {
        let burst = if self.burst == self.threshold {
            threshold
        } else {
            self.burst
        };
        Self::from_parts(threshold, self.period_us, self.algorithm, burst, self.slots)?
            .keep_lease(self.lease)
            .map(|limit| Self {
                block_us: self.block_us,
                ..limit
            })
    }

    /// The same limit, leasing: a process may reserve up to `lease` units
    /// of it in the store at once and admit calls from them without a
    /// round trip (see the crate docs, "Quota leasing"). Leasing is used
    /// for an identity only when its calls come fast enough to need it,
    /// with leases sized to its observed rate; `lease` is the most one
    /// process reserves. Refused (with the reason) for `0`, for a lease
    /// of the whole capacity or more, and for the sliding log, whose
    /// per-unit timestamps a reserved unit would falsify.
    ///
    /// ```
    /// use ratewall::{Algorithm, Limit};
    /// let hot = Limit::per_minute(1_000_000)?.with_lease(10_000)?;
    /// assert_eq!(hot.lease(), Some(10_000));
    /// assert!(Limit::per_minute(100)?.with_lease(100).is_err()); // the whole limit
    /// assert!(Limit::per_minute(100)?.with_algorithm(Algorithm::SlidingLog)?.with_lease(10).is_err());
    /// assert!(hot.with_algorithm(Algorithm::SlidingLog).is_err()); // a leasing limit stays leasable
    /// assert!(Limit::in_flight(10)?.with_lease(2).is_err()); // slots are held, not spent
    /// # Ok::<(), ratewall::error::LimitError>(())
    /// ```
    ///
    /// # Errors
    /// [`LimitError::Lease`] with the reason
    /// ([`LeaseProblem`](crate::error::LeaseProblem)): `Zero` for a lease of
    /// 0, `Algorithm` for the sliding log and for a concurrency limit,
    /// `TooLarge` for a lease at or above the capacity; and
    /// [`LimitError::Block`] with [`BlockProblem::Lease`] for a limit that
    /// blocks ([`Limit::with_block`]).
    pub fn with_lease(self, lease: u64) -> Result<Self, LimitError> {
        if let Err(problem) =
            ratewall_grammar::check_lease(self.threshold, self.algorithm, self.burst, lease)
        {
            return Err(LimitError::Lease(problem));
        }
        if self.block_us > 0 {
            return Err(LimitError::Block(BlockProblem::Lease));
        }
        Ok(Self { lease, ..self })
    }

    /// [`Limit::with_lease`] for constants and statics (what `#[rate_limit(lease
    /// = N)]` builds, after checking `N` itself).
    ///
    /// # Panics
    /// When the lease does not fit the limit, or the limit blocks (at
    /// compile time in a constant).
    pub const fn with_lease_const(self, lease: u64) -> Self {
        if self.block_us > 0 {
            panic!("invalid lease: the limit blocks");
        }
        match ratewall_grammar::check_lease(self.threshold, self.algorithm, self.burst, lease) {
            Ok(()) => Self { lease, ..self },
            Err(_) => panic!("invalid lease"),
        }
    }

    /// The same limit without leasing.
    pub const fn without_lease(self) -> Self {
        Self { lease: 0, ..self }
    }

    /// The most units one process may lease, when the limit leases.
    pub const fn lease(&self) -> Option<u64> {
        if self.lease == 0 {
            None
        } else {
            Some(self.lease)
        }
    }

    /// This limit with `lease` (0: none) checked again after a change.
    fn keep_lease(self, lease: u64) -> Result<Self, LimitError> {
        if lease == 0 {
            Ok(self)
        } else {
            self.with_lease(lease)
        }
    }

    /// Builds a limit from raw parts, validating them all
    /// ([`ratewall_grammar::check_limit`]).
    ///
    /// # Errors
    /// The first bound the parts break, as a [`LimitError`] naming the bad
    /// value, checked in this order: [`LimitError::ZeroThreshold`],
    /// [`LimitError::ZeroPeriod`], [`LimitError::ZeroBurst`],
    /// [`LimitError::ZeroSlots`]; [`LimitError::UnevenSlots`] for a sliding
    /// window whose `slots` do not divide `period_us`; for a concurrency limit
    /// ([`Algorithm::InFlight`]), [`LimitError::Other`] with a `max` above
    /// 100 000 or a `period_us` (the slot lease) outside 1 s ..= 1 h;
    /// [`LimitError::TooLarge`] when the capacity (the larger of threshold and,
    /// for GCRA and the buckets, burst) times `period_us` exceeds 2^52; and
    /// [`LimitError::SlidingLogTooLarge`] for a sliding log above
    /// [`Limit::SLIDING_LOG_CAP`].
    pub fn from_parts(
        threshold: u64,
        period_us: u64,
        algorithm: Algorithm,
        burst: u64,
        slots: u64,
    ) -> Result<Self, LimitError> {
        match ratewall_grammar::check_limit(threshold, period_us, algorithm, burst, slots) {
            Ok(()) => Ok(Self::assemble(
                threshold, period_us, algorithm, burst, slots,
            )),
            Err(problem) => Err(LimitError::from(problem)),
        }
    }

    /// [`Limit::from_parts`] for constants and statics: invalid parts fail
    /// compilation (const evaluation panics), with the rules of
    /// [`ratewall_grammar::check_limit`]. `#[rate_limit]` builds its limits with
    /// it after checking them itself, so its errors point at the argument.
    ///
    /// ```
    /// use ratewall::{Algorithm, Limit};
    /// const SMS: Limit = Limit::from_parts_const(1, 60_000_000, Algorithm::SlidingLog, 1, 10);
    /// assert_eq!(SMS, "1/1m".parse::<Limit>().unwrap().with_algorithm(Algorithm::SlidingLog).unwrap());
    /// ```
    ///
    /// # Panics
    /// When the parts do not make a limit (at compile time in a constant).
    pub const fn from_parts_const(
        threshold: u64,
        period_us: u64,
        algorithm: Algorithm,
        burst: u64,
        slots: u64,
    ) -> Self {
        match ratewall_grammar::check_limit(threshold, period_us, algorithm, burst, slots) {
            Ok(()) => Self::assemble(threshold, period_us, algorithm, burst, slots),
            Err(_) => panic!("invalid rate limit"),
        }
    }

    const fn assemble(
        threshold: u64,
        period_us: u64,
        algorithm: Algorithm,
        burst: u64,
        slots: u64,
    ) -> Self {
        Self {
            threshold,
            period_us,
            algorithm,
            burst,
            slots,
            interval_us: period_us.div_ceil(threshold),
            lease: 0,
            block_us: 0,
        }
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
        ratewall_grammar::capacity(self.threshold, self.algorithm, self.burst)
    }

    /// Checks that a call of `cost` units could ever be allowed.
    ///
    /// # Errors
    /// [`LimitError::ZeroCost`] for a cost of 0, and
    /// [`LimitError::CostExceedsCapacity`] for a cost above
    /// [`Limit::capacity`].
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
        self.interval_us
    }

    /// The suffix that identifies this limit's state under a key:
    /// `<code>:<period_us>`, and `:<slots>` for the sliding-window counter
    /// (e.g. `gc:60000000`). Changing the algorithm, the period or the
    /// slot count starts from fresh state (documented as a reset); changing
    /// the threshold or burst applies to the existing state. Every store
    /// that names state by text writes it with [`Limit::write_storage_suffix`].
    pub fn storage_suffix(&self) -> String {
        let mut suffix = String::with_capacity(24);
        self.write_storage_suffix(&mut suffix);
        suffix
    }

    /// Appends [`Limit::storage_suffix`] to `out` (no intermediate string).
    ///
    /// ```
    /// use ratewall::{Algorithm, Limit};
    /// let mut key = String::from("rl:{sms:+33}:");
    /// Limit::per_minute(5).unwrap().with_algorithm(Algorithm::SlidingWindow).unwrap().write_storage_suffix(&mut key);
    /// assert_eq!(key, "rl:{sms:+33}:sw:60000000:10");
    /// ```
    pub fn write_storage_suffix(&self, out: &mut String) {
        write_suffix(self.state_id(), out);
    }

    /// What identifies this limit's state: two limits with the same id on one
    /// key would share (and double-count) one state.
    pub const fn state_id(&self) -> (Algorithm, u64, u64) {
        let slots = if self.algorithm.uses_slots() {
            self.slots
        } else {
            0
        };
        (self.algorithm, self.period_us, slots)
    }

    /// Checks that limits meant for one key have distinct state ids (e.g. not
    /// `"5/1h"` and `"10/1h"` with one algorithm: the smaller one suffices).
    ///
    /// # Errors
    /// [`LimitError::Overlapping`], naming the first two limits that share an
    /// algorithm and a period (and, for the sliding window, a slot count).
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

/// Appends the storage suffix of the state `state` names (see
/// [`Limit::storage_suffix`]).
pub(crate) fn write_suffix((algorithm, period, slots): StateId, out: &mut String) {
    use std::fmt::Write as _;
    out.push_str(algorithm.code());
    let _ = write!(out, ":{period}");
    if algorithm.uses_slots() {
        let _ = write!(out, ":{slots}");
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_in_flight() {
            return write!(
                f,
                "max_in_flight={} (lease {})",
                self.threshold,
                ratewall_grammar::format_duration(self.period_us)
            );
        }
        write!(
            f,
            "{}/{} ({}",
            self.threshold,
            ratewall_grammar::format_duration(self.period_us),
            self.algorithm
        )?;
        if self.lease > 0 {
            write!(f, ", lease {}", self.lease)?;
        }
        if self.block_us > 0 {
            write!(
                f,
                ", block {}",
                ratewall_grammar::format_duration(self.block_us)
            )?;
        }
        f.write_str(")")
    }
}

/// Parses `"5/1h"`, `"100/30s"`, `"10/d"`, `"10/minute"` or `"1000 per
/// hour"` into a limit with the default algorithm (the grammar of
/// [`ratewall_grammar::parse_rate`], the same the macro checks at compile
/// time).
impl FromStr for Limit {
    type Err = LimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rate = ratewall_grammar::parse_rate(s).map_err(|e| LimitError::BadRate(e.0))?;
        Limit::from_parts(
            rate.threshold,
            rate.period_us,
            Algorithm::default(),
            rate.threshold,
            Self::DEFAULT_SLOTS,
        )
    }
}

/// Parses a duration such as `"250us"`, `"500ms"`, `"30s"`, `"1m"`, `"1h"` or
/// `"1d"`; a bare integer is seconds (the grammar of
/// [`ratewall_grammar::parse_duration_micros`]).
///
/// ```
/// use ratewall::clock::parse_duration;
/// use std::time::Duration;
/// assert_eq!(parse_duration("1m")?, Duration::from_secs(60));
/// assert_eq!(parse_duration("500ms")?, Duration::from_millis(500));
/// assert!(parse_duration("soon").is_err());
/// # Ok::<(), ratewall::error::LimitError>(())
/// ```
///
/// # Errors
/// [`LimitError::BadDuration`] with the text when it is not a whole number
/// with an optional unit (`us` or `µs`, `ms`, `s` or `sec`, `m` or `min`,
/// `h`, `d`), e.g. `"1.5s"` or `"soon"`, or when the duration does not fit
/// a `u64` of microseconds.
pub fn parse_duration(text: &str) -> Result<Duration, LimitError> {
    ratewall_grammar::parse_duration_micros(text)
        .map(Duration::from_micros)
        .map_err(|e| LimitError::BadDuration(e.0))
}

impl From<Problem> for LimitError {
    fn from(problem: Problem) -> Self {
        match problem {
            Problem::ZeroThreshold => LimitError::ZeroThreshold,
            Problem::ZeroPeriod => LimitError::ZeroPeriod,
            Problem::ZeroBurst => LimitError::ZeroBurst,
            Problem::ZeroSlots => LimitError::ZeroSlots,
            Problem::UnevenSlots { period_us, slots } => {
                LimitError::UnevenSlots { period_us, slots }
            }
            Problem::TooLarge {
                capacity,
                period_us,
            } => LimitError::TooLarge {
                capacity,
                period_us,
            },
            Problem::SlidingLogTooLarge { threshold } => LimitError::SlidingLogTooLarge {
                threshold,
                cap: Limit::SLIDING_LOG_CAP,
            },
            // `Problem` is non-exhaustive; a new bound keeps its message.
            other => LimitError::Other(other),
        }
    }
}

impl From<LeaseProblem> for LimitError {
    fn from(problem: LeaseProblem) -> Self {
        LimitError::Lease(problem)
    }
}

#[cfg(test)]
mod tests;
