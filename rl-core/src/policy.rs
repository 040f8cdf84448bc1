//! What the limiter does when its backend cannot decide.

/// The reaction to a backend failure (unreachable store, timeout).
///
/// The default is [`FailurePolicy::FailOpen`]: a limiter outage should not
/// become a service outage. Every failure is logged at `WARN` and counted in
/// the `rl_decisions_total{outcome="error"}` metric whatever the policy. Pick
/// [`FailurePolicy::FailClosed`] where letting calls through is worse than
/// refusing them (e.g. sending paid SMS), and [`FailurePolicy::Local`] to keep
/// limiting approximately with an in-process limiter.
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
        /// How many instances share the limit (`>= 1`).
        share: u64,
    },
}
