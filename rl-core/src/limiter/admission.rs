//! How a call got through ([`Admission`]): what a permit, a settled call
//! and an in-flight slot say about the decision behind them.
use crate::model::decision::Decisions;

/// How a call got through.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    /// The backend allowed it.
    Backend(Decisions),
    /// The backend failed and the in-process fallback allowed it.
    Local {
        /// The fallback's decisions.
        decisions: Decisions,
        /// The share the fallback divided the limits by.
        share: std::num::NonZeroU64,
    },
    /// The backend failed and the policy let the call through.
    FailedOpen,
    /// Over the limit, but the limit is in shadow mode: nothing was consumed.
    Shadowed(Decisions),
    /// Every group's identity is on its allow list: not decided.
    AllowListed,
}

impl Admission {
    /// The decisions behind the admission, when there were any.
    pub fn decisions(&self) -> Option<&Decisions> {
        match self {
            Admission::Backend(d)
            | Admission::Local { decisions: d, .. }
            | Admission::Shadowed(d) => Some(d),
            Admission::FailedOpen | Admission::AllowListed => None,
        }
    }
}
