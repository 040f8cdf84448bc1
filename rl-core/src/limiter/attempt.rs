//! The one road of a call: an [`Attempt`] is one call of a resolved spec —
//! its identities, the tier each group is decided by, the groups whose
//! identity is allow-listed — and every shape of call goes down it: plain,
//! tiered, waiting (a reservation, or a retry of the same road), with
//! in-flight slots and with settling. The shapes are inputs (tiers choose
//! each group's limits, a wait changes the operation, an in-flight limit
//! gives the targets a lease id, settled counting keeps what a refund
//! needs), so they combine: a tiered call can wait and hold in-flight slots.
//!
//! The memory and the remote stores differ only in *when* they answer: an
//! attempt is decided now on the memory store ([`Attempt::decide_now`]),
//! or in a future on a remote one ([`OwnedAttempt`], [`Attempt::decide`]),
//! by the same code.

use std::sync::Arc;

use crate::layer::{Answer, Call, Source};
use crate::limiter::Limiter;
use crate::limiter::admission::Admission;
use crate::limiter::call::{Costs, Decided, Permit, Settle};
use crate::limiter::resolve::Chosen;
use crate::limiter::resolve::{Resolved, Targets};
use crate::limiter::spec::{CallSpec, Counting};
use crate::model::decision::Decision;
use crate::model::error::{BackendError, Error, LimitError};
use crate::model::key::{Identities, Identity};
use crate::model::policy::FailurePolicy;
use crate::model::rejection::{Name, Rejection};
use crate::model::reservation::Reservation;
use crate::store::memory::MemoryBackend;
use crate::store::target::{Op, Target};

/// One call of a resolved spec, borrowing its identities.
#[derive(Debug)]
pub(crate) struct Attempt<'r> {
    pub(crate) resolved: &'r Arc<Resolved>,
    pub(crate) identities: &'r [Identity],
    /// The tier each group is decided by (empty: no group is tiered).
    pub(crate) chosen: Chosen,
    /// The groups whose identity is allow-listed (bit `i`: group `i`):
    /// they take nothing and are not decided.
    pub(crate) skipped: u64,
    /// This call's cost in each group (empty: the groups' own).
    pub(crate) costs: &'r [u64],
}

/// An [`Attempt`] that owns what it borrows, for a call decided later (a
/// remote store's round trip, a waiting call's retry or given-back slot).
#[derive(Debug, Clone)]
pub(crate) struct OwnedAttempt {
    resolved: Arc<Resolved>,
    identities: Identities,
    chosen: Chosen,
    skipped: u64,
    costs: Costs,
}

impl OwnedAttempt {
    /// The attempt, borrowing from this.
    pub(crate) fn attempt(&self) -> Attempt<'_> {
        Attempt {
            resolved: &self.resolved,
            identities: &self.identities,
            chosen: self.chosen.clone(),
            skipped: self.skipped,
            costs: &self.costs,
        }
    }
}

impl<'r> Attempt<'r> {
    /// The attempt of a call giving `tiers` (one per tiered group), or what
    /// a call that cannot be decided gets: a misconfigured spec or tier is
    /// refused as unavailable, an unknown tier is answered by the failure
    /// policy (boxed: rare, and large).
    #[inline]
    pub(crate) fn new<'l>(
        limiter: &'l Limiter,
        spec: &'l CallSpec,
        resolved: &'r Arc<Resolved>,
        identities: &'r [Identity],
        tiers: &[&str],
        costs: &'r [u64],
    ) -> Result<Self, Box<Decided<'l>>> {
        if !resolved.special {
            let attempt = Self {
                resolved,
                identities,
                chosen: Chosen::new(),
                skipped: resolved.allow_listed(&limiter.registry, identities),
                costs,
            };
            return attempt.with_checked_costs(spec);
        }
        if let Some(problem) = &resolved.problem {
            return Err(Box::new(Err(misconfigured(spec, problem))));
        }
        let chosen = match resolved.choose(tiers) {
            Ok(chosen) => chosen,
            Err(unknown) => {
                return Err(Box::new(
                    limiter.unknown_tier(spec, resolved, identities, unknown),
                ));
            }
        };
        if let Some(problem) = resolved.tier_problem(&chosen) {
            return Err(Box::new(Err(misconfigured(spec, problem))));
        }
        let skipped = resolved.allow_listed_tiered(&limiter.registry, identities, &chosen);
        Self {
            resolved,
            identities,
            chosen,
            skipped,
            costs,
        }
        .with_checked_costs(spec)
    }

    /// This attempt, if the call's own costs ([`crate::Keys::costs`]) fit
    /// the limits each group is decided by (a spec's own costs were
    /// checked when it was resolved); else the call is refused as
    /// unavailable (logged).
    #[inline(always)]
    fn with_checked_costs<'l>(self, spec: &CallSpec) -> Result<Self, Box<Decided<'l>>> {
        if self.costs.is_empty() {
            return Ok(self);
        }
        for (index, &cost) in self.costs.iter().enumerate() {
            let (name, _, limits, _) = self.resolved.part(index, &self.chosen);
            let problem = limits
                .iter()
                .filter(|limit| !limit.is_in_flight())
                .find_map(|limit| limit.check_cost(cost).err());
            if let Some(problem) = problem {
                let problem = LimitError::BadCall(format!("group `{name}`: {problem}"));
                return Err(Box::new(Err(crate::limiter::bad_call(spec, problem))));
            }
        }
        Ok(self)
    }

    /// This attempt, owning what it borrows.
    pub(crate) fn to_owned(&self) -> OwnedAttempt {
        OwnedAttempt {
            resolved: self.resolved.clone(),
            identities: self.identities.iter().cloned().collect(),
            chosen: self.chosen.clone(),
            skipped: self.skipped,
            costs: self.costs.iter().copied().collect(),
        }
    }

    /// The call's targets: each decided group's limits (its tier's, for a
    /// tiered group) on its identity, the in-flight ones under a fresh
    /// lease id.
    #[inline]
    pub(crate) fn targets(&self, limiter: &Limiter) -> Targets<'r> {
        let mut targets = Targets::new();
        let skipped = self.skipped;
        if self.chosen.is_empty() {
            self.resolved.fill_targets(
                self.identities,
                self.costs,
                |i, _| skipped & (1 << i) == 0,
                &mut targets,
            );
        } else {
            self.resolved.fill_tiered(
                self.identities,
                self.costs,
                &self.chosen,
                |i| skipped & (1 << i) == 0,
                &mut targets,
            );
        }
        if self.resolved.in_flight {
            limiter.lease(&mut targets);
        }
        targets
    }

    /// The pipeline call of `op` over `targets`: named by the call (with its
    /// tier, `<call>@<tier>`), under the spec's failure policy.
    #[inline]
    pub(crate) fn call<'a>(
        &'a self,
        spec: &'a CallSpec,
        op: Op<'a>,
        targets: &'a [Target<'a>],
    ) -> Call<'a> {
        let (name, counters) = if self.chosen.is_empty() {
            (spec.name(), &self.resolved.counters)
        } else {
            self.resolved.named(spec, &self.chosen)
        };
        let mut call = Call::new(op, targets, name, self.resolved.policy);
        call.counters = Some(counters);
        call.allow_listed = self.skipped != 0 && self.skipped == self.resolved.all_groups();
        call
    }

    /// Decides `op` on the memory store, now; a reservation's answer goes
    /// into `reservation`.
    #[inline(always)]
    pub(crate) fn decide_now<'l>(
        &self,
        limiter: &'l Limiter,
        spec: &'l CallSpec,
        memory: &MemoryBackend,
        op: Op<'_>,
        reservation: &mut Option<Box<Reservation>>,
    ) -> Decided<'l> {
        let targets = self.targets(limiter);
        let mut call = self.call(spec, op, &targets);
        let answer = limiter
            .pipeline
            .run_memory(memory, &mut call, self.resolved.mask);
        *reservation = call.notes.reservation.take();
        self.finish(limiter, spec, &targets, answer, None)
    }

    /// Decides `op` on any store: one round trip on a remote one. An
    /// acquire that may have to be taken back carries a request id (the
    /// abandon layer cancels it by that id should the store not answer).
    pub(crate) async fn decide<'l>(
        &self,
        limiter: &'l Limiter,
        spec: &'l CallSpec,
        op: Op<'_>,
        reservation: &mut Option<Box<Reservation>>,
    ) -> Decided<'l> {
        let targets = self.targets(limiter);
        let id = (op == Op::Acquire && self.cancellable(limiter, spec)).then(|| limiter.call_id());
        let op = match &id {
            Some(id) => Op::AcquireOnce(id),
            None => op,
        };
        let mut call = self.call(spec, op, &targets);
        let answer = limiter.pipeline.run(&mut call, self.resolved.mask).await;
        *reservation = call.notes.reservation.take();
        drop(call);
        self.finish(limiter, spec, &targets, answer, id)
    }

    /// Whether an acquire of this call carries a request id, to be taken
    /// back should the store not answer in time: on a remote store, for a
    /// call that counts selectively (its refund must not leak), or for any
    /// call when the limiter says so; not for a call whose limits all lease
    /// (it is decided from leases).
    fn cancellable(&self, limiter: &Limiter, spec: &CallSpec) -> bool {
        limiter.abandoned.as_ref().is_some_and(|a| a.cancels)
            && (limiter.cancel_every_call || spec.counting() == Counting::Settled)
            && !self
                .resolved
                .groups
                .iter()
                .all(|g| !g.limits.is_empty() && g.limits.iter().all(|l| l.lease().is_some()))
    }

    /// The permit (or rejection) of a call that got `answer`.
    #[inline(always)]
    pub(crate) fn finish<'l>(
        &self,
        limiter: &'l Limiter,
        spec: &'l CallSpec,
        targets: &[Target<'_>],
        answer: Answer,
        id: Option<String>,
    ) -> Decided<'l> {
        let admission = match answer {
            // The commonest answer first.
            Answer::Decided {
                decisions,
                source: Source::Backend,
            } if decisions.allowed() => Admission::Backend(decisions),
            answer => self.admission(spec, targets, answer)?,
        };
        let settle = (spec.counting() == Counting::Settled || self.resolved.settles)
            .then(|| self.settle(id));
        let tiers = if self.chosen.is_empty() {
            None
        } else {
            Some(self.resolved.binding_of(&self.chosen))
        };
        let mut permit = Permit {
            limiter,
            spec,
            admission,
            skipped: self.skipped,
            settle,
            waited: std::time::Duration::ZERO,
            tiers,
            in_flight: None,
        };
        // Taken from the admission in place (it is not moved again).
        if self.resolved.in_flight {
            permit.in_flight = limiter.keeper.take(targets, &permit.admission);
        }
        Ok(permit)
    }

    /// The admission (or rejection) of every answer but an allowed one
    /// from the store.
    #[inline(never)]
    fn admission(
        &self,
        spec: &CallSpec,
        targets: &[Target<'_>],
        answer: Answer,
    ) -> Result<Admission, Rejection> {
        // An owned spec's (or group's) name is copied, not cloned: in place
        // when short.
        let name_of = |index: usize| {
            let origin = if self.chosen.is_empty() {
                self.resolved
                    .target_origin(index, self.skipped)
                    .map(|(group, _)| spec.groups()[group].name_cow())
            } else {
                self.resolved.origin_name(index, self.skipped, &self.chosen)
            };
            Name::from(origin.unwrap_or(spec.name_cow()))
        };
        admit(
            || Name::from(spec.name_cow()),
            targets,
            answer,
            self.resolved.policy,
            name_of,
        )
    }

    /// What a settled call keeps to give back what it took.
    #[inline(never)]
    fn settle(&self, id: Option<String>) -> Box<Settle> {
        Box::new(Settle {
            resolved: self.resolved.clone(),
            identities: self.identities.iter().cloned().collect(),
            skipped: self.skipped,
            chosen: self.chosen.clone(),
            id: id.map(String::into_boxed_str),
            costs: self.costs.iter().copied().collect(),
        })
    }
}

/// The rejection of every call of a spec that can never be decided (logged).
#[cold]
#[inline(never)]
pub(crate) fn misconfigured(spec: &CallSpec, problem: &LimitError) -> Rejection {
    tracing::error!(call = spec.name(), error = %problem, "rate limit misconfigured");
    Rejection::unavailable(spec.name_cow().clone(), Error::Limit(problem.clone()))
}

/// An acquire's answer as an admission or a rejection; `name_of(i)` names
/// target `i`'s group (the name a rejection carries).
pub(crate) fn admit<N: Into<Name>, M: Into<Name>>(
    name: impl Fn() -> N,
    targets: &[Target<'_>],
    answer: Answer,
    policy: FailurePolicy,
    name_of: impl Fn(usize) -> M,
) -> Result<Admission, Rejection> {
    match answer {
        Answer::Decided { decisions, source } if decisions.allowed() => Ok(match source {
            Source::Local => Admission::Local {
                decisions,
                share: match policy {
                    FailurePolicy::Local { share } => share,
                    _ => std::num::NonZeroU64::MIN,
                },
            },
            _ => Admission::Backend(decisions),
        }),
        Answer::Decided { decisions, source } => {
            let index = decisions.binding_index();
            // A refusal in process names the limit it applied: the share.
            let share = match (source, policy) {
                (Source::Local, FailurePolicy::Local { share }) => Some(share),
                _ => None,
            };
            Err(limited(
                targets,
                index,
                *decisions.binding(),
                share,
                &name_of,
            ))
        }
        Answer::Refused {
            index, decision, ..
        } => Err(limited(targets, index, decision, None, &name_of)),
        Answer::Shadowed { decisions, .. } => Ok(Admission::Shadowed(decisions)),
        Answer::Denied { index, until } => Err(Rejection::denied_as(name_of(index).into(), until)),
        Answer::AllowListed => Ok(Admission::AllowListed),
        Answer::FailedOpen(_) => Ok(Admission::FailedOpen),
        Answer::Unavailable(error) | Answer::Failed(error) => {
            Err(Rejection::unavailable_as(name().into(), error))
        }
        Answer::Applied { .. } => Err(Rejection::unavailable_as(
            name().into(),
            Error::Backend(BackendError::protocol("no decision for an acquire")),
        )),
    }
}

/// The rejection of a call refused by target `index` (under the in-process
/// fallback's `share` of its limit, when it decided).
pub(crate) fn limited<N: Into<Name>>(
    targets: &[Target<'_>],
    index: usize,
    decision: Decision,
    share: Option<std::num::NonZeroU64>,
    name_of: &impl Fn(usize) -> N,
) -> Rejection {
    let Some(target) = targets.get(index) else {
        let error = LimitError::BadCall("a refusal of no limit".into());
        return Rejection::unavailable_as(name_of(index).into(), Error::Limit(error));
    };
    let limit = match share {
        Some(share) => crate::layer::failure::local_share(target.limit, share),
        None => *target.limit,
    };
    Rejection::limited_as(name_of(index).into(), decision, limit)
}
