//! Settling an admitted call after it ran ([`Permit::settle`],
//! [`Permit::refund`], [`Permit::reset`]): giving back what it took, or
//! forgetting its identities, in the store that decided it.

use smallvec::SmallVec;

use crate::layer::{ALL, Answer, Call};
use crate::limiter::Limiter;
use crate::limiter::call::{Admission, CallSpec, Settle};
use crate::limiter::resolve::Targets;
use crate::model::error::Error;
use crate::model::policy::FailurePolicy;
use crate::store::target::{Op, Target};

#[cfg(doc)]
use crate::limiter::call::Permit;

impl Limiter {
    /// Gives back what a settled call took, or resets its identities: each
    /// group by its `reset_on_success`, or all of them as `force` says
    /// (`Some(true)`: reset, `Some(false)`: refund).
    pub(crate) async fn settle(
        &self,
        spec: &CallSpec,
        settle: &Settle,
        admission: &Admission,
        force: Option<bool>,
    ) {
        let resolved = &settle.resolved;
        let targets_of = |keep: &dyn Fn(usize) -> bool| settle.targets(keep);
        let decided = |index: usize| settle.skipped & (1 << index) == 0;
        let resets = |index: usize| force.unwrap_or(resolved.groups[index].reset_on_success);
        // A call the backend admitted under a request id is given back by
        // that id: one cancel over the call's own requests, idempotent, and
        // sent again once the backend answers should it fail now (the
        // abandon layer). Groups that reset are then reset.
        if let (Some(id), Admission::Backend(_)) = (&settle.id, admission) {
            if (0..resolved.groups.len()).any(|g| decided(g) && !resets(g)) {
                let targets = targets_of(&decided);
                let mut call =
                    Call::new(Op::CancelOnce(id), &targets, spec.name(), resolved.policy);
                if let Err(error) = applied(self.pipeline.run(&mut call, ALL).await) {
                    tracing::warn!(call = spec.name(), %error, "rate limit refund failed; sent again once the backend answers");
                }
            }
            for (index, group) in resolved.groups.iter().enumerate() {
                if decided(index) && resets(index) {
                    let targets = targets_of(&|i| i == index);
                    if let Err(error) = self
                        .reset_targets(spec.name(), &targets, admission, resolved.policy)
                        .await
                    {
                        tracing::warn!(limit = &*group.name, %error, "rate limit reset failed; sent again once the backend answers");
                    }
                }
            }
            return;
        }
        let mut offset = 0;
        for (index, group) in resolved.groups.iter().enumerate() {
            // An allow-listed group took nothing.
            if !decided(index) {
                continue;
            }
            let targets = targets_of(&|i| i == index);
            let range = offset..offset + targets.len();
            offset = range.end;
            let result = if resets(index) {
                self.reset_targets(spec.name(), &targets, admission, resolved.policy)
                    .await
            } else {
                self.refund_targets(spec.name(), &targets, admission, range, resolved.policy)
                    .await
            };
            if let Err(error) = result {
                tracing::warn!(limit = &*group.name, %error, "rate limit refund or reset failed");
            }
        }
    }

    /// Settles the cost of a call whose groups took an estimate
    /// ([`Permit::settle_cost`]): in each settled group (every group when
    /// none is marked [`GroupSpec::settled`](crate::GroupSpec::settled)),
    /// what the estimate took beyond `actual` is given back as of the
    /// decision, and what `actual` took beyond the estimate is charged now.
    pub(crate) async fn settle_cost(
        &self,
        spec: &CallSpec,
        settle: &Settle,
        admission: &Admission,
        actual_of: &(dyn Fn(usize) -> u64 + Sync),
    ) {
        let resolved = &settle.resolved;
        let marked = resolved.groups.iter().any(|g| g.settles);
        let mut offset = 0;
        for (index, group) in resolved.groups.iter().enumerate() {
            // An allow-listed group took nothing.
            if settle.skipped & (1 << index) != 0 {
                continue;
            }
            let targets = settle.targets(&|i| i == index);
            let range = offset..offset + targets.len();
            offset = range.end;
            let estimate = settle.costs.get(index).copied().unwrap_or(group.cost);
            let actual = actual_of(index);
            if (marked && !group.settles) || actual == estimate {
                continue;
            }
            let units = actual.abs_diff(estimate);
            let adjusted: SmallVec<[Target<'_>; 4]> = targets
                .iter()
                .map(|t| Target { cost: units, ..*t })
                .collect();
            let result = if actual < estimate {
                self.refund_targets(spec.name(), &adjusted, admission, range, resolved.policy)
                    .await
            } else {
                self.charge_targets(spec.name(), &adjusted, admission, resolved.policy)
                    .await
            };
            match result {
                Ok(()) => {
                    tracing::trace!(
                        limit = &*group.name,
                        estimate,
                        actual,
                        "rate limit cost settled"
                    );
                }
                Err(error) => {
                    tracing::warn!(limit = &*group.name, estimate, actual, %error, "rate limit cost settlement failed: the estimate stays taken");
                }
            }
        }
    }

    /// Takes each target's cost as debt ([`Op::Charge`]) where `admission`
    /// took its units: the backend, or the in-process fallback for a call
    /// it admitted. A call let through without a decision took nothing and
    /// is charged nothing. In-flight limits have no cost to settle.
    async fn charge_targets(
        &self,
        name: &str,
        targets: &[Target<'_>],
        admission: &Admission,
        policy: FailurePolicy,
    ) -> Result<(), Error> {
        let local = match admission {
            Admission::Backend(_) => None,
            Admission::Local { share, .. } => Some(*share),
            Admission::FailedOpen | Admission::Shadowed(_) | Admission::AllowListed => {
                return Ok(());
            }
        };
        let kept: SmallVec<[Target<'_>; 4]> = targets
            .iter()
            .filter(|t| !t.limit.is_in_flight())
            .copied()
            .collect();
        if kept.is_empty() {
            return Ok(());
        }
        let policy = local.map_or(policy, |share| FailurePolicy::Local { share });
        let mut call = Call::new(Op::Charge, &kept, name, policy);
        call.local_only = local.is_some();
        applied(self.pipeline.run(&mut call, ALL).await)
    }

    /// Gives back what `admission` took from `targets` (decisions `range`
    /// of the admission): from the backend, or from the in-process fallback
    /// for a call it admitted (never asking a backend that just failed).
    pub(super) async fn refund_targets(
        &self,
        name: &str,
        targets: &[Target<'_>],
        admission: &Admission,
        range: std::ops::Range<usize>,
        policy: FailurePolicy,
    ) -> Result<(), Error> {
        let (decisions, local) = match admission {
            Admission::Backend(d) => (d, None),
            Admission::Local { decisions, share } => (decisions, Some(*share)),
            Admission::FailedOpen | Admission::Shadowed(_) | Admission::AllowListed => {
                return Ok(());
            }
        };
        let decisions = decisions.as_slice().get(range).unwrap_or_default();
        let mut times: SmallVec<[u64; 2]> = decisions.iter().map(|d| d.at_micros).collect();
        times.sort_unstable();
        times.dedup();
        for at in times {
            // In-flight slots go back when the permit drops, not here.
            let group: SmallVec<[Target<'_>; 4]> = targets
                .iter()
                .zip(decisions)
                .filter(|(t, d)| d.at_micros == at && !t.limit.is_in_flight())
                .map(|(t, _)| *t)
                .collect();
            if group.is_empty() {
                continue;
            }
            let policy = local.map_or(policy, |share| FailurePolicy::Local { share });
            let mut call = Call::new(Op::Refund(at), &group, name, policy);
            call.local_only = local.is_some();
            applied(self.pipeline.run(&mut call, ALL).await)?;
        }
        Ok(())
    }

    /// Forgets `targets`' state in process and, unless the backend just
    /// failed this call (the admission did not come from it), in the backend.
    async fn reset_targets(
        &self,
        name: &str,
        targets: &[Target<'_>],
        admission: &Admission,
        policy: FailurePolicy,
    ) -> Result<(), Error> {
        // Resetting an in-flight limit would free every caller's slot.
        let kept: SmallVec<[Target<'_>; 4]> = targets
            .iter()
            .filter(|t| !t.limit.is_in_flight())
            .copied()
            .collect();
        if kept.is_empty() {
            return Ok(());
        }
        let targets = &kept[..];
        let mut local = Call::new(Op::Reset, targets, name, policy);
        local.local_only = true;
        applied(self.pipeline.run(&mut local, ALL).await)?;
        if matches!(admission, Admission::Backend(_) | Admission::Shadowed(_)) {
            let mut call = Call::new(Op::Reset, targets, name, policy);
            applied(self.pipeline.run(&mut call, ALL).await)?;
        }
        Ok(())
    }
}

/// A refund's or reset's answer as a result.
pub(crate) fn applied(answer: Answer) -> Result<(), Error> {
    match answer {
        Answer::Failed(error) | Answer::Unavailable(error) | Answer::FailedOpen(error) => {
            Err(error)
        }
        _ => Ok(()),
    }
}

impl Settle {
    /// The targets of the groups `keep` accepts, as the call decided them
    /// (its tiers', at its costs).
    fn targets(&self, keep: &dyn Fn(usize) -> bool) -> Targets<'_> {
        let mut targets = Targets::new();
        if self.chosen.is_empty() {
            self.resolved
                .fill_targets(&self.identities, &self.costs, |i, _| keep(i), &mut targets);
        } else {
            self.resolved.fill_tiered(
                &self.identities,
                &self.costs,
                &self.chosen,
                keep,
                &mut targets,
            );
        }
        targets
    }
}
