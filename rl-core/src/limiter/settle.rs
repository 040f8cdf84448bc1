//! Settling an admitted call after it ran ([`Permit::settle`],
//! [`Permit::refund`], [`Permit::reset`], [`Permit::settle_cost`]): giving
//! back what it took, forgetting its identities, or replacing its estimated
//! cost by the real one, in the store that decided it.

use smallvec::SmallVec;

use crate::layer::{ALL, Answer, Call};
use crate::limiter::Limiter;
use crate::limiter::admission::Admission;
use crate::limiter::call::{Permit, Settle};
use crate::limiter::resolve::Targets;
use crate::model::error::Error;
use crate::model::policy::FailurePolicy;
use crate::store::target::{Op, Target};

use crate::limiter::spec::CallSpec;
#[cfg(doc)]
use crate::limiter::spec::{Counting, GroupSpec};

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
                match applied(self.pipeline.run(&mut call, ALL).await) {
                    Ok(()) => {
                        self.room.freed(spec.name());
                        self.room.freed_targets(&targets);
                    }
                    Err(error) => {
                        tracing::warn!(call = spec.name(), %error, "rate limit refund failed; sent again once the backend answers");
                    }
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
        let kept = rate_targets(targets);
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
        let mut times: SmallVec<[u64; 2]> = decisions.iter().map(|d| d.at_micros()).collect();
        times.sort_unstable();
        times.dedup();
        for at in times {
            // In-flight slots go back when the permit drops, not here.
            let group: SmallVec<[Target<'_>; 4]> = targets
                .iter()
                .zip(decisions)
                .filter(|(t, d)| d.at_micros() == at && !t.limit.is_in_flight())
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
        self.room.freed(name);
        self.room.freed_targets(targets);
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
        let kept = rate_targets(targets);
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
        self.room.freed(name);
        self.room.freed_targets(targets);
        Ok(())
    }
}

/// The rate limits among `targets`: what a charge, a reset or a hold acts
/// on (an in-flight limit counts running calls, not units).
pub(crate) fn rate_targets<'a>(targets: &[Target<'a>]) -> SmallVec<[Target<'a>; 4]> {
    targets
        .iter()
        .filter(|t| !t.limit.is_in_flight())
        .copied()
        .collect()
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

/// Settling, on the permit: what a call does once it has run.
impl Permit<'_> {
    /// Settles a [`Counting::Settled`] call after it ran: a counted call
    /// keeps what it took; otherwise each group gives its units back, or
    /// forgets its identity when it resets on success. A call admitted
    /// while the backend was failing is settled in process only. Failures
    /// are logged, not returned: the call already ran.
    ///
    /// **Who sees the room given back.** This limiter at once: it forgets
    /// the refusals it remembers for the call's keys and wakes a call
    /// waiting for room under them. Other instances sharing a remote
    /// store, as the store tells them
    /// ([`Backend::subscribe_refunds`](crate::backend::Backend::subscribe_refunds)):
    /// on Redis within one pub/sub delivery, typically a few milliseconds
    /// (its tests hold it under 100 ms); if the notice is lost (the
    /// subscription down) or the store tells nothing, within their deny
    /// cache's maximum hold
    /// ([`LimiterBuilder::deny_cache_max_hold`](crate::builder::LimiterBuilder::deny_cache_max_hold),
    /// 1 s by default). The same holds for [`Permit::settle_cost`] below
    /// an estimate, [`Permit::refund`] and [`Permit::reset`].
    pub async fn settle(self, counted: bool) {
        if counted {
            return;
        }
        let Some(settle) = self.settle else {
            tracing::warn!(
                call = self.spec.name(),
                "a permit was settled as not counted, but its call does not use `Counting::Settled`: nothing given back"
            );
            return;
        };
        self.limiter
            .settle(self.spec, &settle, &self.admission, None)
            .await;
    }

    /// Settles this call's cost now that it is known ([`GroupSpec::settled`]):
    /// in each settled group (every group of a spec that marks none), the
    /// estimate the call took is replaced by `actual`, in one step per
    /// group. Below the estimate, the difference is given back (as a
    /// refund: to the decision's window or slot for the window algorithms,
    /// from the TAT or level for GCRA and the buckets). Above it, the
    /// difference is charged now whatever the limit says: debt that later
    /// calls pay before any passes. GCRA and the buckets carry debt forward
    /// unit for unit (the budget is exact over time whatever the estimates
    /// were); a fixed or sliding window counts it in the current window or
    /// slot, where it lapses with the window; a sliding log takes at most
    /// its threshold at once. `0` gives the whole estimate back (a request
    /// that was never sent). A permit dropped unsettled keeps its estimate.
    ///
    /// Works on every store, in all-or-nothing groups and tiers; a call
    /// admitted by the in-process fallback is settled there, and a call let
    /// through without a decision has nothing to settle. Failures are
    /// logged, not returned: the call already ran. Needs a settled group or
    /// [`Counting::Settled`] (logged and ignored otherwise).
    ///
    /// An estimate given back is usable by this limiter at once and by the
    /// other instances sharing a remote store within one notice delivery
    /// (Redis: typically a few milliseconds), else within their deny
    /// cache's maximum hold (see [`Permit::settle`]).
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Keys, Limit, Limiter};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().build()?;
    /// // Requests per minute (one each) and tokens per minute (estimated,
    /// // settled from the response), decided together.
    /// let chat = CallSpec::owned("chat", vec![
    ///     GroupSpec::owned("chat_rpm", vec![Limit::per_minute(500)?]),
    ///     GroupSpec::owned("chat_tpm", vec![Limit::per_minute(10_000)?]).settled(),
    /// ]);
    /// let permit = limiter.call_with(&chat, Keys::new(&[&"team-a", &"team-a"]).costs(&[1, 4_000])).await?;
    /// let used = 6_500; // the response's usage
    /// permit.settle_cost(used).await;
    /// // 10 000 - 6 500 left: a call estimated at 4 000 no longer fits.
    /// assert!(limiter.call_with(&chat, Keys::new(&[&"team-a", &"team-a"]).costs(&[1, 4_000])).await.is_err());
    /// assert!(limiter.call_with(&chat, Keys::new(&[&"team-a", &"team-a"]).costs(&[1, 3_500])).await.is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    pub async fn settle_cost(self, actual: u64) {
        let Some(settle) = &self.settle else {
            tracing::warn!(
                call = self.spec.name(),
                "a permit's cost was settled, but its call has no settled group (`GroupSpec::settled`): nothing settled"
            );
            return;
        };
        self.limiter
            .settle_cost(self.spec, settle, &self.admission, &|_| actual)
            .await;
    }

    /// [`Permit::settle_cost`] with each group's own real cost: `actuals`
    /// holds one per group of the spec, in order; a group whose cost is not
    /// settled ignores its own (what `#[rate_limit(settle = ..)]` calls).
    /// Fewer than one per group is logged and settles nothing.
    pub async fn settle_costs(self, actuals: &[u64]) {
        let Some(settle) = &self.settle else {
            tracing::warn!(
                call = self.spec.name(),
                "a permit's costs were settled, but its call has no settled group (`GroupSpec::settled`): nothing settled"
            );
            return;
        };
        if actuals.len() < self.spec.groups().len() {
            tracing::warn!(
                call = self.spec.name(),
                given = actuals.len(),
                groups = self.spec.groups().len(),
                "a permit's costs were settled with fewer costs than groups: nothing settled"
            );
            return;
        }
        self.limiter
            .settle_cost(self.spec, settle, &self.admission, &|group| actuals[group])
            .await;
    }

    /// Gives back what this call took, in every group. Needs
    /// [`Counting::Settled`] (logged and ignored otherwise). Seen by the
    /// other instances as [`Permit::settle`] says.
    pub async fn refund(self) {
        if let Some(settle) = &self.settle {
            self.limiter
                .settle(self.spec, settle, &self.admission, Some(false))
                .await;
        }
    }

    /// Forgets the state of this call's identities in every group
    /// (consecutive-failure counting). Needs [`Counting::Settled`]. Seen
    /// by the other instances as [`Permit::settle`] says.
    pub async fn reset(self) {
        if let Some(settle) = &self.settle {
            self.limiter
                .settle(self.spec, settle, &self.admission, Some(true))
                .await;
        }
    }
}
