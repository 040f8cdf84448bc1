//! What the limiter does when its backend cannot decide.

use std::num::NonZeroU64;

/// The reaction to a backend failure (unreachable store, timeout, open
/// circuit).
///
/// The default is [`FailurePolicy::FailOpen`]: a limiter outage should not
/// become a service outage. Every failure is logged at `WARN` and counted in
/// `ratewall_backend_errors_total` whatever the policy. Pick
/// [`FailurePolicy::FailClosed`] where letting calls through is worse than
/// refusing them (e.g. sending paid SMS), and [`FailurePolicy::Local`] to keep
/// limiting approximately with an in-process limiter.
///
/// ```
/// use ratewall::FailurePolicy;
/// let local = FailurePolicy::local(4).unwrap();
/// assert!(matches!(local, FailurePolicy::Local { share } if share.get() == 4));
/// assert!(FailurePolicy::local(0).is_none(), "a share of zero is not representable");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Allow the call.
    #[default]
    FailOpen,
    /// Refuse the call with [`crate::RejectionReason::Unavailable`].
    FailClosed,
    /// Decide in process with the same algorithm and `threshold / share`
    /// (at least 1), where `share` is the number of instances expected to
    /// share the limit.
    Local {
        /// How many instances share the limit.
        share: NonZeroU64,
    },
}

impl FailurePolicy {
    /// [`FailurePolicy::Local`] with `share` instances; `None` for 0.
    pub const fn local(share: u64) -> Option<Self> {
        match NonZeroU64::new(share) {
            Some(share) => Some(FailurePolicy::Local { share }),
            None => None,
        }
    }

    /// The name used in logs, metrics and configuration: `fail_open`,
    /// `fail_closed` or `local`.
    pub const fn name(&self) -> &'static str {
        match self {
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::Local { .. } => "local",
        }
    }
}
