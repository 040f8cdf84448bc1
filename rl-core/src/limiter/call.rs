//! The public call API, running: the keys a call is decided for
//! ([`Keys`]), the futures it is awaited as ([`CallFuture`], [`Admitted`])
//! and what an admitted call holds ([`Permit`]); what it asks for is in
//! `spec.rs`. `#[rate_limit]` expands to exactly this; a tower layer, a
//! background job or a gRPC interceptor gets the same decisions without the
//! macro.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use smallvec::SmallVec;

use crate::limiter::Limiter;
use crate::limiter::in_flight::InFlight;
use crate::limiter::resolve::{self, Resolved};
use crate::model::decision::{Decision, Decisions};
use crate::model::error::LimitError;
use crate::model::key::{Identities, Identity, Part};
use crate::model::limit::Limit;
use crate::model::rejection::Rejection;

use crate::limiter::admission::Admission;
use crate::limiter::resolve::{Chosen, TierBinding};
use crate::limiter::spec::{CallSpec, tier_text};
#[cfg(doc)]
use crate::limiter::spec::{Counting, GroupSpec, Tier};

/// What a settled call needs to give back what it took.
#[derive(Debug)]
pub(crate) struct Settle {
    pub(crate) resolved: Arc<Resolved>,
    pub(crate) identities: Identities,
    /// The allow-listed groups, which took nothing (bit `i`: group `i`).
    pub(crate) skipped: u64,
    /// The tier of each group, for a tiered call (else empty).
    pub(crate) chosen: Chosen,
    /// The request id the call was decided under, when it may be taken
    /// back by it (a settled call on a remote store).
    pub(crate) id: Option<Box<str>>,
    /// The call's cost in each group (empty: the groups' own), what a
    /// settled cost is measured against.
    pub(crate) costs: Costs,
}

/// A call's cost in each group (empty: the groups' own), owned.
pub(crate) type Costs = smallvec::SmallVec<[u64; 2]>;

/// An admitted call.
///
/// With [`Counting::Settled`], [`Permit::settle`] says after the call ran
/// whether it counted; dropping the permit unsettled keeps what it took (a
/// cancelled or panicking call counts).
///
/// A call whose groups have in-flight limits ([`Limit::in_flight`]) holds
/// one slot of each while the permit lives: keep the permit until the call
/// ends. Dropping it (the call returned, panicked or was cancelled) gives
/// the slots back ([`InFlight`]); rate-limit units stay taken.
#[must_use = "dropping the permit frees the in-flight slots it holds at once: keep it while the call runs (and settle it, with `Counting::Settled`)"]
pub struct Permit<'l> {
    pub(crate) limiter: &'l Limiter,
    pub(crate) spec: &'l CallSpec,
    pub(crate) admission: Admission,
    /// The allow-listed groups, not decided (bit `i`: group `i`).
    pub(crate) skipped: u64,
    pub(crate) settle: Option<Box<Settle>>,
    /// How long the call waited for room.
    pub(crate) waited: Duration,
    /// The tiers a tiered call was decided by.
    pub(crate) tiers: Option<Arc<TierBinding>>,
    pub(crate) in_flight: Option<InFlight>,
}

impl fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("call", &self.spec.name())
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

impl Permit<'_> {
    /// How the call was admitted.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// How long the call waited for room before it was admitted (zero for
    /// a call that did not wait): for a reserved slot, the time from the
    /// store's decision to the slot (for a call a pause moved to a new slot,
    /// from its first slot's ask); for a window algorithm, the time spent
    /// sleeping and retrying.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The in-flight slots this call holds, if its groups have in-flight
    /// limits.
    pub fn in_flight(&self) -> Option<&InFlight> {
        self.in_flight.as_ref()
    }

    /// Takes the in-flight slots out of the permit, to hold them past it
    /// (they are given back when the returned guard drops).
    pub fn into_in_flight(mut self) -> Option<InFlight> {
        self.in_flight.take()
    }

    /// The allowed decision with the fewest units left, with its group's
    /// name and limit (what `RateLimit` headers on a success describe; the
    /// limit as currently set, should it have changed since). In-flight
    /// limits are not rates and are left out.
    pub fn binding(&self) -> Option<(&str, Decision, Limit)> {
        if let Some(tiers) = &self.tiers {
            return tiers.binding(self.limiter, self.skipped, self.admission.decisions()?);
        }
        let (group, decision, limit) = self.binding_group()?;
        Some((self.spec.groups()[group].name(), decision, limit))
    }

    /// [`Permit::binding`] of an untiered call, with its group's index
    /// (`None` for a call decided by tiers: its names are the tiers'). The
    /// limits come from the spec's current resolution (this thread's cached
    /// one when it is current), not from the registry: no lock, even with
    /// overrides set. As [`rate_binding`]: in-flight limits are left out.
    pub(crate) fn binding_group(&self) -> Option<(usize, Decision, Limit)> {
        if self.tiers.is_some() {
            return None;
        }
        let decisions = self.admission.decisions()?;
        let index = decisions.binding_index();
        resolve::with(self.limiter, self.spec, |resolved| {
            match resolved.target_origin(index, self.skipped) {
                Some((group, limit)) if !limit.is_in_flight() => {
                    Some((group, *decisions.binding(), limit))
                }
                _ => rate_origin(resolved, self.skipped, decisions),
            }
        })
    }
}

/// An admitted call's [`Permit`] without the limiter and the spec it
/// borrows ([`Permit::detach`]): what a call out whose answer outlives the
/// borrow (a response body read later) keeps, to settle it then. Dropped,
/// it is a dropped permit: what it took stays taken, its in-flight slots
/// are given back.
#[derive(Debug)]
pub(crate) struct Detached {
    admission: Admission,
    skipped: u64,
    settle: Option<Box<Settle>>,
    waited: Duration,
    tiers: Option<Arc<TierBinding>>,
    in_flight: Option<InFlight>,
}

impl<'l> Permit<'l> {
    /// This permit, without its borrows: [`Detached::attach`] makes it a
    /// permit again, with the limiter and the spec it was admitted by.
    pub(crate) fn detach(self) -> Detached {
        Detached {
            admission: self.admission,
            skipped: self.skipped,
            settle: self.settle,
            waited: self.waited,
            tiers: self.tiers,
            in_flight: self.in_flight,
        }
    }
}

impl Detached {
    /// The permit again, borrowing `limiter` and `spec`: the ones it was
    /// admitted by (another limiter or spec would settle other state).
    pub(crate) fn attach<'l>(self, limiter: &'l Limiter, spec: &'l CallSpec) -> Permit<'l> {
        Permit {
            limiter,
            spec,
            admission: self.admission,
            skipped: self.skipped,
            settle: self.settle,
            waited: self.waited,
            tiers: self.tiers,
            in_flight: self.in_flight,
        }
    }
}

/// The rate decision with the fewest units left and its group's index and
/// limit, from `resolved` (when the binding decision is an in-flight
/// limit's).
#[cold]
fn rate_origin(
    resolved: &Resolved,
    skipped: u64,
    decisions: &Decisions,
) -> Option<(usize, Decision, Limit)> {
    let limits = resolved
        .groups
        .iter()
        .enumerate()
        .filter(|(g, _)| skipped & (1 << g) == 0)
        .flat_map(|(g, group)| group.limits.iter().map(move |limit| (g, *limit)));
    limits
        .zip(decisions.as_slice().iter().copied())
        .filter(|((_, limit), _)| !limit.is_in_flight())
        .fold(
            None,
            |best: Option<(usize, Decision, Limit)>, ((g, limit), decision)| match best {
                Some((_, b, _)) if b.remaining() <= decision.remaining() => best,
                _ => Some((g, decision, limit)),
            },
        )
}

mod future;
mod keys;
#[cfg(test)]
mod tests;

pub(crate) use future::Decided;
pub use future::{Admitted, CallFuture};
pub use keys::Keys;
