//! The failure-policy layer: what a call gets when the store (or the
//! breaker in front of it) cannot answer.
//!
//! | operation | `FailOpen` | `FailClosed` | `Local { share }` |
//! |---|---|---|---|
//! | acquire | let through | refuse (unavailable) | decide in process with `threshold / share` |
//! | reserve (a waiting call) | let through, no wait | refuse (unavailable) | reserve in process with `threshold / share` |
//! | peek | the error | the error | peek the in-process state |
//! | refund, reset, cancel | the error | the error | the error (the backend's units stay taken) |
//!
//! A call admitted in process is settled in process too ([`Call::local_only`]:
//! its refund or reset never goes to the backend, so settling it never
//! waits for a backend that just failed). The limiter also resets the
//! in-process state when it resets an identity.

use std::num::NonZeroU64;

use smallvec::SmallVec;

use super::{Answer, Call, Layer, Plan, Source, stored_as};
use crate::model::error::Error;
use crate::model::limit::Limit;
use crate::model::policy::FailurePolicy;
use crate::store::memory::MemoryBackend;
use crate::store::target::{Op, Target};

/// Applies the failure policy; owns the in-process fallback store.
#[derive(Debug)]
pub(crate) struct Failure {
    fallback: std::sync::Arc<MemoryBackend>,
}

impl Failure {
    pub(crate) fn new(fallback: std::sync::Arc<MemoryBackend>) -> Self {
        Self { fallback }
    }

    /// Runs the call's operation in process, with every limit divided by
    /// `share` (at least 1).
    fn local(&self, call: &mut Call<'_>, share: NonZeroU64) -> Answer {
        let targets = call.targets;
        let shared: SmallVec<[Limit; 4]> = targets
            .iter()
            .map(|t| local_share(t.limit, share))
            .collect();
        let local: SmallVec<[Target<'_>; 4]> = targets
            .iter()
            .zip(&shared)
            .map(|(t, limit)| Target {
                limit,
                cost: t.cost.min(limit.capacity()),
                slot: None,
                ..*t
            })
            .collect();
        let result = self.fallback.run(call.op, &local);
        stored_as(call, result, Source::Local)
    }
}

/// The share of one instance when the backend is down: `limit` with its
/// threshold and burst divided by `share` (each at least 1). The state id
/// is unchanged, so refunds and later calls find the same state.
pub(crate) fn local_share(limit: &Limit, share: NonZeroU64) -> Limit {
    let share = share.get();
    // The fallback decides every call in process: nothing to lease.
    let limit = &limit.without_lease();
    limit
        .with_threshold((limit.threshold() / share).max(1))
        .and_then(|l| l.with_burst((limit.burst() / share).max(1)))
        .unwrap_or(*limit)
}

/// The share a call's policy gives the fallback (1 for a call settled in
/// process under another policy, as its limits were never divided).
fn share_of(policy: FailurePolicy) -> NonZeroU64 {
    match policy {
        FailurePolicy::Local { share } => share,
        _ => NonZeroU64::MIN,
    }
}

impl Layer for Failure {
    /// A memory store never fails an acquire: nothing to apply.
    fn applies(&self, plan: &Plan<'_>) -> bool {
        plan.remote
    }

    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        if !call.local_only {
            return None;
        }
        let share = share_of(call.policy);
        Some(self.local(call, share))
    }

    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        let Answer::Failed(error @ Error::Backend(_)) = answer else {
            return;
        };
        let error = error.clone();
        call.notes.failure = Some(error.clone());
        let acquire = call.op.admits();
        *answer = match call.policy {
            FailurePolicy::Local { share } if acquire || matches!(call.op, Op::Peek(_)) => {
                self.local(call, share)
            }
            FailurePolicy::FailClosed if acquire => Answer::Unavailable(error),
            FailurePolicy::FailOpen if acquire => Answer::FailedOpen(error),
            _ => Answer::Failed(error),
        };
    }

    /// A block lifted in the store is lifted in process too (the fallback
    /// decided with it while the store failed).
    fn unblocked(&self, key: &crate::model::key::Key) {
        self.fallback.unblock_sync(key);
    }
}
