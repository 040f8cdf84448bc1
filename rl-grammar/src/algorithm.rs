//! The algorithms' names and codes.

use std::fmt;
use std::str::FromStr;

/// The limiting algorithm. See `ratewall`'s docs for which one to pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
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

    /// Every algorithm: the rate algorithms ([`Algorithm::ALL`]), then the
    /// concurrency limit.
    pub const EVERY: [Algorithm; 7] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
        Algorithm::InFlight,
    ];

    /// Everything other code dispatches on, for this algorithm: its row of
    /// the one table of algorithms. A new algorithm is a variant and a row
    /// here (see the repository's CONTRIBUTING.md for the rest of the
    /// checklist); every `match` on an algorithm elsewhere is exhaustive, so
    /// a place that forgets it does not compile.
    pub const fn traits(self) -> Traits {
        match self {
            Algorithm::FixedWindow => Traits {
                name: "fixed_window",
                code: "fw",
                variant: "FixedWindow",
                capacity: Capacity::Threshold,
                reserves: false,
                leases: true,
                lua_module: "fixed_window",
            },
            Algorithm::SlidingLog => Traits {
                name: "sliding_log",
                code: "sl",
                variant: "SlidingLog",
                capacity: Capacity::Threshold,
                reserves: false,
                // A unit reserved at `t` but used later would leave the log
                // early (each entry is its own unit's time).
                leases: false,
                lua_module: "sliding_log",
            },
            Algorithm::SlidingWindow => Traits {
                name: "sliding_window",
                code: "sw",
                variant: "SlidingWindow",
                capacity: Capacity::Slots,
                reserves: false,
                leases: true,
                lua_module: "sliding_window",
            },
            Algorithm::TokenBucket => Traits {
                name: "token_bucket",
                code: "tb",
                variant: "TokenBucket",
                capacity: Capacity::Burst,
                reserves: true,
                leases: true,
                lua_module: "meter",
            },
            Algorithm::LeakyBucket => Traits {
                name: "leaky_bucket",
                code: "lb",
                variant: "LeakyBucket",
                capacity: Capacity::Burst,
                reserves: true,
                leases: true,
                lua_module: "meter",
            },
            Algorithm::Gcra => Traits {
                name: "gcra",
                code: "gc",
                variant: "Gcra",
                capacity: Capacity::Burst,
                reserves: true,
                leases: true,
                lua_module: "gcra",
            },
            Algorithm::InFlight => Traits {
                name: "in_flight",
                code: "if",
                variant: "InFlight",
                capacity: Capacity::Threshold,
                reserves: false,
                // Slots are held while a call runs, not spent.
                leases: false,
                lua_module: "in_flight",
            },
        }
    }

    /// The snake_case name used in the macro, configuration and metrics.
    pub const fn name(self) -> &'static str {
        self.traits().name
    }

    /// The two-letter code used in storage keys and in the Redis scripts.
    pub const fn code(self) -> &'static str {
        self.traits().code
    }

    /// The Rust variant's name (what the macro writes into generated code).
    pub const fn variant(self) -> &'static str {
        self.traits().variant
    }

    /// Whether `burst` sets the capacity for this algorithm (token bucket,
    /// leaky bucket, GCRA); the window algorithms hold `threshold`.
    pub const fn uses_burst(self) -> bool {
        matches!(self.traits().capacity, Capacity::Burst)
    }

    /// Whether `slots` applies (the sliding-window counter).
    pub const fn uses_slots(self) -> bool {
        matches!(self.traits().capacity, Capacity::Slots)
    }

    /// Whether a waiting call can reserve a slot ahead of time, a queue it
    /// joins (GCRA and the buckets: their state is a time to schedule
    /// against). The window algorithms have no such queue; a waiting call
    /// retries them after their `retry_after`.
    pub const fn reserves(self) -> bool {
        self.traits().reserves
    }

    /// Whether units of this algorithm's limits can be leased (quota
    /// leasing; see [`crate::can_lease`]).
    pub const fn leases(self) -> bool {
        self.traits().leases
    }

    /// Whether this is the concurrency limit ([`Algorithm::InFlight`]).
    pub const fn is_in_flight(self) -> bool {
        matches!(self, Algorithm::InFlight)
    }

    /// The algorithm named `name` (see [`Algorithm::name`]; `in_flight`
    /// included, as limits registries and tools write it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::EVERY.into_iter().find(|a| a.name() == name)
    }

    /// The algorithm with storage code `code` (see [`Algorithm::code`]).
    pub fn from_code(code: &str) -> Option<Self> {
        Self::EVERY.into_iter().find(|a| a.code() == code)
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

/// One algorithm's row of the table of algorithms ([`Algorithm::traits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Traits {
    /// The snake_case name (macro, configuration, metrics).
    pub name: &'static str,
    /// The two-letter code (storage keys, Lua).
    pub code: &'static str,
    /// The Rust variant's name (what the macro writes).
    pub variant: &'static str,
    /// What bounds how many units one identity can take at once, and so
    /// which third number a limit carries.
    pub capacity: Capacity,
    /// Whether a waiting call can reserve a slot ([`Algorithm::reserves`]).
    pub reserves: bool,
    /// Whether units can be leased ([`Algorithm::leases`]).
    pub leases: bool,
    /// Its Lua module in `ratewall-redis` (`src/lua/<module>.lua`).
    pub lua_module: &'static str,
}

/// What holds an algorithm's capacity: the third number of its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capacity {
    /// `threshold` itself (the window algorithms; no third number).
    Threshold,
    /// `threshold`, spread over `slots` sub-windows (the sliding window).
    Slots,
    /// `burst` (GCRA and the buckets).
    Burst,
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

/// Written as its name ([`Algorithm::name`]): `"gcra"`, `"sliding_log"`.
#[cfg(feature = "serde")]
impl serde_core::Serialize for Algorithm {
    fn serialize<S: serde_core::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// Read from its name ([`Algorithm::from_name`]); any other text is an
/// error naming it and the algorithms there are.
///
/// ```
/// # use ratewall_grammar::Algorithm;
/// use serde_core::Deserialize;
/// use serde_core::de::{IntoDeserializer, value::Error};
/// let read = |name: &str| Algorithm::deserialize(IntoDeserializer::<'_, Error>::into_deserializer(name));
/// assert_eq!(read("sliding_log"), Ok(Algorithm::SlidingLog));
/// let unknown = read("sliding").unwrap_err().to_string();
/// assert!(unknown.starts_with("unknown algorithm \"sliding\": expected one of"), "{unknown}");
/// ```
#[cfg(feature = "serde")]
impl<'de> serde_core::Deserialize<'de> for Algorithm {
    fn deserialize<D: serde_core::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde_core::de::Visitor<'_> for Name {
            type Value = Algorithm;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an algorithm's name: one of {}", Algorithm::names())
            }

            fn visit_str<E: serde_core::de::Error>(self, name: &str) -> Result<Algorithm, E> {
                name.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Name)
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
