//! Tiers: limits that depend on who is calling. A tiered group
//! ([`GroupSpec::tiered`]) has named sets of limits ([`Tier`]s: `free`,
//! `pro`), and each call says which one decides it
//! ([`Keys::tiers`](crate::Keys::tiers), `#[rate_limit(tier = .., tiers(..))]`, a tower
//! layer's tier resolver).
//!
//! A tier is a limit name of its own, `<group>@<tier>` (`api@pro`):
//!
//! - its limits are looked up at run time under that name, like any
//!   group's ([`Settings::set_limits`](crate::settings::Settings::set_limits), a limits file, admin overrides), and
//!   a name `<group>@<tier>` with limits adds a tier the code does not
//!   declare, usable from the next call;
//! - it is the scope of its keys (`prefix:{api@pro:alice}`), so each tier
//!   keeps its own state, and an identity moving to another tier is
//!   decided by that tier's state from its next call;
//! - it is the name in rejections, `RateLimit` fields and logs, and the
//!   call's `limit` label becomes `<call>@<tier>` (the tier of its first
//!   tiered group).
//!
//! What a tier does not set for itself it takes from its group's name:
//! shadow mode, the deny cache setting and allow/deny list entries of
//! `api` apply to `api@pro` (the failure policy is the call's, by the
//! call's name).
//!
//! A call whose tier is none of the group's is decided by the group's
//! `default` tier when it has one. Otherwise it cannot be decided: an error
//! naming the tier is logged and the failure policy answers (fail open:
//! admitted, [`Admission::FailedOpen`]; fail closed and `local(N)`:
//! refused as unavailable, with [`LimitError::UnknownTier`]). Never a
//! panic. A tier given by a client (a header) should have a `default`.

use std::borrow::Cow;
use std::sync::Arc;

use super::Limiter;
use super::admission::Admission;
use super::call::{Decided, Permit, Settle};
use super::resolve::{Chosen, NOT_TIERED, Resolved, Targets, TierBinding};
use super::spec::{CallSpec, Counting, shown};
use crate::layer::Source;
use crate::layer::counters::{self, Prebuilt};
use crate::model::error::{Error, LimitError};
use crate::model::key::Identity;
use crate::model::limit::Limit;
use crate::model::policy::FailurePolicy;
use crate::model::rejection::Rejection;
use crate::store::target::{KeyRef, Slot, Target};

/// A tier a call gave that its group does not have.
#[derive(Debug)]
pub(crate) struct Unknown<'t> {
    /// The group's index.
    group: usize,
    tier: &'t str,
}

impl Resolved {
    /// The tier of each group of a call giving `tiers`, one per tiered group
    /// in order (a missing one: no tier).
    #[inline]
    pub(crate) fn choose<'t>(&self, tiers: &[&'t str]) -> Result<Chosen, Unknown<'t>> {
        let mut given = tiers.iter();
        let mut chosen = Chosen::new();
        for (index, group) in self.groups.iter().enumerate() {
            match &group.tiers {
                None => chosen.push(NOT_TIERED),
                Some(set) => {
                    let tier = given.next().copied().unwrap_or("");
                    match set.find(tier) {
                        Some(found) => chosen.push(found),
                        None => return Err(Unknown { group: index, tier }),
                    }
                }
            }
        }
        Ok(chosen)
    }

    /// Group `index` as decided with `chosen` tiers: its name, key head,
    /// limits and their memory slots (the tier's, for a tiered group).
    #[inline]
    pub(crate) fn part(
        &self,
        index: usize,
        chosen: &[u32],
    ) -> (&Cow<'static, str>, &str, &[Limit], &[Option<Slot>]) {
        let group = &self.groups[index];
        match (&group.tiers, chosen.get(index)) {
            (Some(set), Some(&tier)) if tier != NOT_TIERED => {
                let tier = &set.tiers[tier as usize];
                (&tier.name, &tier.head, &tier.limits, &tier.slots)
            }
            _ => (&group.name, &group.head, &group.limits, &group.slots),
        }
    }

    /// Why calls with `chosen` tiers can never be decided, if a chosen tier
    /// says so.
    pub(crate) fn tier_problem(&self, chosen: &[u32]) -> Option<&LimitError> {
        self.groups
            .iter()
            .zip(chosen)
            .find_map(|(group, &tier)| match &group.tiers {
                Some(set) if tier != NOT_TIERED => set.tiers[tier as usize].problem.as_ref(),
                _ => None,
            })
    }

    /// The call's name with `chosen` tiers (`<call>@<tier>` of its first
    /// tiered group) and its metric keys.
    pub(crate) fn named<'a>(
        &'a self,
        spec: &'a CallSpec,
        chosen: &[u32],
    ) -> (&'a str, &'a Prebuilt) {
        self.groups
            .iter()
            .zip(chosen)
            .find_map(|(group, &tier)| match &group.tiers {
                Some(set) if tier != NOT_TIERED => set.tiers[tier as usize]
                    .call
                    .as_ref()
                    .map(|(name, counters)| (&**name, counters)),
                _ => None,
            })
            .unwrap_or((spec.name(), &self.counters))
    }

    /// [`Resolved::fill_targets`] with `chosen` tiers, for the groups `keep`
    /// accepts.
    pub(crate) fn fill_tiered<'a>(
        &'a self,
        identities: &'a [Identity],
        costs: &[u64],
        chosen: &[u32],
        keep: impl Fn(usize) -> bool,
        targets: &mut Targets<'a>,
    ) {
        for (index, (group, identity)) in self.groups.iter().zip(identities).enumerate() {
            if !keep(index) {
                continue;
            }
            let (name, head, limits, slots) = self.part(index, chosen);
            let key = KeyRef {
                head,
                identity: identity.as_ref(),
            };
            let cost = costs.get(index).copied().unwrap_or(group.cost);
            for (limit, slot) in limits.iter().zip(slots) {
                targets.push(Target {
                    name,
                    key,
                    limit,
                    // An in-flight slot is one per call, whatever the cost.
                    cost: if limit.is_in_flight() { 1 } else { cost },
                    slot: *slot,
                    lease: 0,
                });
            }
        }
    }

    /// The groups allow-listed for their identity under their (tier's) name.
    pub(crate) fn allow_listed_tiered(
        &self,
        registry: &crate::model::settings::Registry,
        identities: &[Identity],
        chosen: &[u32],
    ) -> u64 {
        use crate::model::lists::ListKind;
        if !registry.any_listed(ListKind::Allow) {
            return 0;
        }
        (0..self.groups.len())
            .zip(identities)
            .filter(|(index, identity)| {
                let (name, ..) = self.part(*index, chosen);
                identity
                    .as_ref()
                    .with_text(|text| registry.listed(ListKind::Allow, name, text))
                    .is_some()
            })
            .fold(0, |mask, (i, _)| mask | (1 << i))
    }

    /// The name of the group of target `index` of a call that skipped the
    /// groups in `skipped`, with `chosen` tiers.
    pub(crate) fn origin_name(
        &self,
        index: usize,
        skipped: u64,
        chosen: &[u32],
    ) -> Option<&Cow<'static, str>> {
        let mut index = index;
        for g in (0..self.groups.len()).filter(|g| skipped & (1 << g) == 0) {
            let (name, _, limits, _) = self.part(g, chosen);
            if index < limits.len() {
                return Some(name);
            }
            index -= limits.len();
        }
        None
    }
}

impl Resolved {
    /// Builds each tier's [`TierBinding`] when the spec has one tiered group
    /// (with several, a permit builds its own).
    pub(crate) fn bind_tiers(&mut self) {
        let mut tiered = self
            .groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.tiers.is_some());
        let (Some((index, group)), None) = (tiered.next(), tiered.next()) else {
            return;
        };
        let count = group.tiers.as_ref().map_or(0, |set| set.tiers.len());
        let bindings: Vec<Arc<TierBinding>> = (0..count as u32)
            .map(|tier| {
                let mut chosen: Chosen = self.groups.iter().map(|_| NOT_TIERED).collect();
                chosen[index] = tier;
                Arc::new(TierBinding::new(self, &chosen))
            })
            .collect();
        if let Some(set) = &mut self.groups[index].tiers {
            for (tier, binding) in set.tiers.iter_mut().zip(bindings) {
                tier.binding = Some(binding);
            }
        }
    }

    /// What a permit of a call with `chosen` tiers keeps.
    pub(crate) fn binding_of(&self, chosen: &[u32]) -> Arc<TierBinding> {
        let prebuilt =
            self.groups
                .iter()
                .zip(chosen)
                .find_map(|(group, &tier)| match &group.tiers {
                    Some(set) if tier != NOT_TIERED => set.tiers[tier as usize].binding.clone(),
                    _ => None,
                });
        prebuilt.unwrap_or_else(|| Arc::new(TierBinding::new(self, chosen)))
    }
}

impl Limiter {
    /// A call whose tier is unknown: logged, then what the failure policy
    /// makes of a call that cannot be decided.
    #[cold]
    #[inline(never)]
    pub(crate) fn unknown_tier<'l>(
        &'l self,
        spec: &'l CallSpec,
        resolved: &Arc<Resolved>,
        identities: &[Identity],
        unknown: Unknown<'_>,
    ) -> Decided<'l> {
        let error = LimitError::UnknownTier {
            group: spec.groups()[unknown.group].name().to_owned(),
            tier: shown(unknown.tier),
        };
        // The call's own name: a tier nobody declared must not become a label.
        let name = spec.name();
        if matches!(resolved.policy, FailurePolicy::FailOpen) {
            tracing::error!(call = name, %error, policy = resolved.policy.name(), "rate limit tier unknown; call let through");
            counters::decision(name, "failed_open", Source::Policy.name());
            // Nothing was taken: settling gives nothing back.
            let all = resolved.all_groups();
            let settle = (spec.counting() == Counting::Settled || resolved.settles).then(|| {
                Box::new(Settle {
                    resolved: resolved.clone(),
                    identities: identities.iter().cloned().collect(),
                    skipped: all,
                    chosen: Chosen::new(),
                    id: None,
                    costs: Default::default(),
                })
            });
            return Ok(Permit {
                limiter: self,
                spec,
                admission: Admission::FailedOpen,
                skipped: all,
                settle,
                waited: std::time::Duration::ZERO,
                tiers: None,
                in_flight: None,
            });
        }
        tracing::error!(call = name, %error, policy = resolved.policy.name(), "rate limit tier unknown; call refused");
        counters::decision(name, "unavailable", Source::Policy.name());
        Err(Rejection::unavailable(
            spec.name_cow().clone(),
            Error::Limit(error),
        ))
    }
}

#[cfg(test)]
mod tests;
