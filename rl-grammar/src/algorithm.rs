//! The algorithms' names and codes.

use std::fmt;
use std::str::FromStr;

/// The limiting algorithm. See `ratewall`'s docs for which one to pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
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
    /// It decides exactly as the token bucket (a whole burst passes at
    /// once); callers that wait for room (`wait`) leave at the drain rate.
    LeakyBucket,
    /// Generic cell rate algorithm: one timestamp per identity, exact average
    /// rate, bursts up to `burst`. The default.
    #[default]
    Gcra,
    /// Not a rate: at most `threshold` calls in flight at once, each holding
    /// a slot (a lease) from admission until it ends. `period` is the
    /// lease's time to live: a slot whose holder died (and so stopped
    /// renewing it) comes back after it. Written `max_in_flight = N` (and
    /// `in_flight_ttl`), never `algorithm = ...`; not in [`Algorithm::ALL`].
    InFlight,
}

impl Algorithm {
    /// Every rate algorithm, in a stable order ([`Algorithm::InFlight`], a
    /// concurrency limit, is not one).
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
            Algorithm::InFlight => "in_flight",
        }
    }

    /// The two-letter code used in storage keys and in the Redis scripts.
    pub const fn code(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingLog => "sl",
            Algorithm::SlidingWindow => "sw",
            Algorithm::TokenBucket => "tb",
            Algorithm::LeakyBucket => "lb",
            Algorithm::Gcra => "gc",
            Algorithm::InFlight => "if",
        }
    }

    /// The Rust variant's name (what the macro writes into generated code).
    pub const fn variant(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "FixedWindow",
            Algorithm::SlidingLog => "SlidingLog",
            Algorithm::SlidingWindow => "SlidingWindow",
            Algorithm::TokenBucket => "TokenBucket",
            Algorithm::LeakyBucket => "LeakyBucket",
            Algorithm::Gcra => "Gcra",
            Algorithm::InFlight => "InFlight",
        }
    }

    /// Whether `burst` sets the capacity for this algorithm (token bucket,
    /// leaky bucket, GCRA); the window algorithms hold `threshold`.
    pub const fn uses_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }

    /// Whether `slots` applies (the sliding-window counter).
    pub const fn uses_slots(self) -> bool {
        matches!(self, Algorithm::SlidingWindow)
    }

    /// Whether this is the concurrency limit ([`Algorithm::InFlight`]).
    pub const fn is_in_flight(self) -> bool {
        matches!(self, Algorithm::InFlight)
    }

    /// The algorithm named `name` (see [`Algorithm::name`]; `in_flight`
    /// included, as limits registries and tools write it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([Algorithm::InFlight])
            .find(|a| a.name() == name)
    }

    /// The algorithm with storage code `code` (see [`Algorithm::code`]).
    pub fn from_code(code: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([Algorithm::InFlight])
            .find(|a| a.code() == code)
    }

    /// Every name, comma-separated, for messages.
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not an algorithm's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(pub String);

impl fmt::Display for UnknownAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown algorithm {:?}: expected one of {}",
            self.0,
            Algorithm::names()
        )
    }
}

impl std::error::Error for UnknownAlgorithm {}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_name(s).ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip_and_are_distinct() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
            assert_eq!(Algorithm::from_code(a.code()), Some(a));
            assert_eq!(a.code().len(), 2);
        }
        assert_eq!(Algorithm::from_name("in_flight"), Some(Algorithm::InFlight));
        assert_eq!(Algorithm::from_code("if"), Some(Algorithm::InFlight));
        let mut codes: Vec<&str> = Algorithm::ALL.map(Algorithm::code).to_vec();
        codes.push(Algorithm::InFlight.code());
        codes.sort_unstable();
        assert!(codes.windows(2).all(|w| w[0] != w[1]));
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let err = "gcr".parse::<Algorithm>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown algorithm \"gcr\": expected one of fixed_window, sliding_log, sliding_window, \
             token_bucket, leaky_bucket, gcra"
        );
    }
}
