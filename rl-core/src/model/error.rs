//! Error types: configuration errors, backend failures and the limiter's own errors.

use std::fmt;
use std::sync::Arc;

use ratewall_grammar::{
    BadDuration, BadRate, BlockProblem, LeaseProblem, Problem, UnknownAlgorithm,
};

/// A limit that can never be built: the message names the bad value. The
/// texts of the bounds are [`Problem`]'s (`ratewall-grammar`'s, re-exported
/// here), shared with the macro.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// `threshold = 0` would reject every call.
    #[error("{}", Problem::ZeroThreshold)]
    ZeroThreshold,
    /// `period = 0` has no meaning.
    #[error("{}", Problem::ZeroPeriod)]
    ZeroPeriod,
    /// `burst = 0` would reject every call.
    #[error("{}", Problem::ZeroBurst)]
    ZeroBurst,
    /// The sliding-window counter needs at least one slot.
    #[error("{}", Problem::ZeroSlots)]
    ZeroSlots,
    /// The sliding-window counter splits the period into equal slots.
    #[error("{}", Problem::UnevenSlots { period_us: *period_us, slots: *slots })]
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
    #[error("{}", Problem::TooLarge { capacity: *capacity, period_us: *period_us })]
    TooLarge {
        /// The threshold or burst.
        capacity: u64,
        /// The period in microseconds.
        period_us: u64,
    },
    /// The sliding log stores one entry per admitted unit.
    #[error("{}", Problem::SlidingLogTooLarge { threshold: *threshold })]
    SlidingLogTooLarge {
        /// The requested threshold.
        threshold: u64,
        /// The cap ([`crate::Limit::SLIDING_LOG_CAP`]).
        cap: u64,
    },
    /// Another bound of [`ratewall_grammar::check_limit`].
    #[error("{0}")]
    Other(Problem),
    /// A duration string such as `"1m"` could not be read.
    #[error("{}", BadDuration(.0.clone()))]
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
    #[error("{}", BadRate(.0.clone()))]
    BadRate(String),
    /// An algorithm name was not recognised.
    #[error("{}", UnknownAlgorithm(.0.clone()))]
    UnknownAlgorithm(String),
    /// A call names no group, or more identities than groups (or fewer).
    #[error("{0}")]
    BadCall(String),
    /// A lease that does not fit its limit ([`crate::Limit::with_lease`]).
    #[error("{0}")]
    Lease(LeaseProblem),
    /// A block that does not fit its limit ([`crate::Limit::with_block`]).
    #[error("{0}")]
    Block(BlockProblem),
    /// A tier name that is not one, two tiers of a group with one name, or
    /// a tiered group whose name cannot carry tiers.
    #[error("{0}")]
    BadTier(String),
    /// A call's tier is none of its group's (declared in code or configured
    /// at run time as `<group>@<tier>`), and the group has no `default`
    /// tier: the call cannot be decided, and the failure policy says what
    /// it gets.
    #[error(
        "tier {tier:?} of `{group}` is unknown: declare it, configure `{group}@{tier}` (e.g. `limiter.settings().set_limits(\"{group}@{tier}\", ..)`), or give `{group}` a `default` tier"
    )]
    UnknownTier {
        /// The group's name.
        group: String,
        /// The tier the call gave (`""`: none; cut at 64 bytes, ending `…`).
        tier: String,
    },
}

impl From<UnknownAlgorithm> for LimitError {
    fn from(error: UnknownAlgorithm) -> Self {
        LimitError::UnknownAlgorithm(error.0)
    }
}

/// A backend could not decide: the store is unreachable, timed out, or answered
/// something unexpected.
///
/// [`BackendError::Unavailable`] and [`BackendError::Protocol`] carry a
/// [`Cause`]: a message naming what failed, and the error behind it when
/// there is one (a `redis::RedisError` from `ratewall-redis`), which is this
/// error's [`source`](std::error::Error::source):
///
/// ```
/// use ratewall::error::BackendError;
/// use std::error::Error as _;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let error = BackendError::unavailable_with_source("connect to 10.0.0.5:6379", io);
/// assert_eq!(error.to_string(), "backend unavailable: connect to 10.0.0.5:6379");
/// let source = error.source().unwrap().downcast_ref::<std::io::Error>().unwrap();
/// assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused);
/// assert!(BackendError::unavailable("down").source().is_none());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum BackendError {
    /// The call did not complete within the configured timeout.
    Timeout(std::time::Duration),
    /// The store could not be reached or the connection broke.
    Unavailable(Cause),
    /// The request itself is invalid (e.g. a cost above the capacity).
    Invalid(LimitError),
    /// The store answered something the backend cannot interpret.
    Protocol(Cause),
    /// The limiter's circuit breaker is open after consecutive failures:
    /// the backend was not called.
    CircuitOpen,
}

impl BackendError {
    /// A connection-level failure with a message.
    pub fn unavailable(message: impl fmt::Display) -> Self {
        Self::Unavailable(Cause::new(message, None))
    }

    /// A connection-level failure with a message and the error behind it
    /// (kept as [`source`](std::error::Error::source)).
    pub fn unavailable_with_source(
        message: impl fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Unavailable(Cause::new(message, Some(Arc::new(source))))
    }

    /// An unexpected reply with a message.
    pub fn protocol(message: impl fmt::Display) -> Self {
        Self::Protocol(Cause::new(message, None))
    }

    /// An unexpected reply with a message and the error behind it (kept as
    /// [`source`](std::error::Error::source)).
    pub fn protocol_with_source(
        message: impl fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Protocol(Cause::new(message, Some(Arc::new(source))))
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(after) => write!(f, "backend call timed out after {after:?}"),
            Self::Unavailable(cause) => write!(f, "backend unavailable: {cause}"),
            Self::Invalid(error) => write!(f, "invalid request: {error}"),
            Self::Protocol(cause) => write!(f, "backend protocol error: {cause}"),
            Self::CircuitOpen => {
                f.write_str("backend not called: circuit open after consecutive failures")
            }
        }
    }
}

// By hand rather than with thiserror: `source` must be the error behind the
// cause itself (so that it downcasts to, e.g., `redis::RedisError`), not the
// `Arc` that shares it between clones.
impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Invalid(error) => Some(error),
            Self::Unavailable(cause) | Self::Protocol(cause) => cause
                .source()
                .map(|source| source as &(dyn std::error::Error + 'static)),
            Self::Timeout(_) | Self::CircuitOpen => None,
        }
    }
}

impl From<LimitError> for BackendError {
    fn from(error: LimitError) -> Self {
        Self::Invalid(error)
    }
}

/// Why a backend could not decide: a message naming what failed (shown by
/// [`BackendError`]'s `Display`), and the error behind it when there is one
/// (its [`source`](std::error::Error::source)). Clones share the source.
#[derive(Debug, Clone)]
pub struct Cause {
    message: Arc<str>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Cause {
    fn new(
        message: impl fmt::Display,
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            message: message.to_string().into(),
            source,
        }
    }

    /// What failed, e.g. `EVALSHA acquire on redis://10.0.0.5:6379/: ...`.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error behind the message, if the backend kept one.
    pub fn source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
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
    /// The identity is on the deny list of this limit name (or of every
    /// name): refused without a decision.
    #[error("denied by the deny list of `{0}`")]
    Denied(String),
    /// The key prefix contains characters that would break key layout.
    #[error(
        "invalid key prefix {0:?}: it must be non-empty and contain none of `{{`, `}}`, or whitespace"
    )]
    BadPrefix(String),
}
