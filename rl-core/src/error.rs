//! Error types: configuration errors, backend failures and the limiter's own errors.

use std::fmt;
use std::sync::Arc;

/// A limit that can never be built: the message names the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// `threshold = 0` would reject every call.
    #[error("threshold must be at least 1, got 0")]
    ZeroThreshold,
    /// `period = 0` has no meaning.
    #[error("period must be at least 1 microsecond, got 0")]
    ZeroPeriod,
    /// `burst = 0` would reject every call.
    #[error("burst must be at least 1, got 0")]
    ZeroBurst,
    /// The sliding-window counter needs at least one slot.
    #[error("slots must be at least 1, got 0")]
    ZeroSlots,
    /// The sliding-window counter splits the period into equal slots.
    #[error(
        "period of {period_us} µs cannot be split into {slots} equal slots; pick a period divisible by the slot count"
    )]
    UnevenSlots {
        /// The period in microseconds.
        period_us: u64,
        /// The requested slot count.
        slots: u64,
    },
    /// A cost of zero would make a call free.
    #[error("cost must be at least 1, got 0")]
    ZeroCost,
    /// A call costing more than the capacity could never pass.
    #[error("cost {cost} exceeds the capacity {capacity}: such a call could never be allowed")]
    CostExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// What the limit can ever hold.
        capacity: u64,
    },
    /// Keeps all state exact in 53-bit integers (Lua numbers are doubles).
    #[error(
        "capacity {capacity} × period {period_us} µs exceeds 2^52 (exact integer arithmetic): pick a shorter period or a smaller threshold"
    )]
    TooLarge {
        /// The threshold or burst.
        capacity: u64,
        /// The period in microseconds.
        period_us: u64,
    },
    /// The sliding log stores one entry per admitted unit.
    #[error(
        "sliding log threshold {threshold} exceeds the cap of {cap} entries per identity; use the sliding-window counter (`Algorithm::SlidingWindow`) for large thresholds"
    )]
    SlidingLogTooLarge {
        /// The requested threshold.
        threshold: u64,
        /// The cap ([`crate::Limit::SLIDING_LOG_CAP`]).
        cap: u64,
    },
    /// A duration string such as `"1m"` could not be read.
    #[error(
        "cannot parse duration {0:?}: expected an integer followed by one of us, ms, s, m, h, d (e.g. \"500ms\", \"1m\")"
    )]
    BadDuration(String),
    /// A limit name needs at least one limit.
    #[error("at least one limit is needed")]
    NoLimits,
    /// Two limits on one key with the same algorithm and period would share state.
    #[error("limits {first} and {second} share an algorithm and period on one key; keep one")]
    Overlapping {
        /// The first limit.
        first: String,
        /// The second limit.
        second: String,
    },
    /// A rate string such as `"5/1h"` could not be read.
    #[error("cannot parse rate {0:?}: expected THRESHOLD/PERIOD, e.g. \"5/1h\" or \"100/30s\"")]
    BadRate(String),
    /// An algorithm name was not recognised.
    #[error(
        "unknown algorithm {0:?}: expected one of fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, gcra"
    )]
    UnknownAlgorithm(String),
}

/// A backend could not decide: the store is unreachable, timed out, or answered
/// something unexpected.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The call did not complete within the configured timeout.
    #[error("backend call timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The store could not be reached or the connection broke.
    #[error("backend unavailable: {0}")]
    Unavailable(Arc<str>),
    /// The request itself is invalid (e.g. a cost above the capacity).
    #[error("invalid request: {0}")]
    Invalid(#[from] LimitError),
    /// The store answered something the backend cannot interpret.
    #[error("backend protocol error: {0}")]
    Protocol(Arc<str>),
}

impl BackendError {
    /// A connection-level failure with a message.
    pub fn unavailable(message: impl fmt::Display) -> Self {
        Self::Unavailable(message.to_string().into())
    }

    /// An unexpected reply with a message.
    pub fn protocol(message: impl fmt::Display) -> Self {
        Self::Protocol(message.to_string().into())
    }
}

/// Everything the limiter can fail with. Being rate limited is *not* an error:
/// it is a [`crate::Decision`] with `allowed == false`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A limit or call was configured with invalid values.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The backend failed to decide.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// No global limiter was installed before the first call.
    #[error(
        "no global rate limiter is installed: call `Limiter::builder()...install()` at startup"
    )]
    NotInstalled,
    /// `install()` was called twice.
    #[error("a global rate limiter is already installed")]
    AlreadyInstalled,
    /// The key prefix contains characters that would break key layout.
    #[error(
        "invalid key prefix {0:?}: it must be non-empty and contain none of `{{`, `}}`, or whitespace"
    )]
    BadPrefix(String),
}
