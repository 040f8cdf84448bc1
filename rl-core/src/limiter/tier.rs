//! Tiers: limits that depend on who is calling. A tiered group
//! ([`GroupSpec::tiered`]) has named sets of limits ([`Tier`]s: `free`,
//! `pro`), and each call says which one decides it
//! ([`Keys::tiers`](crate::Keys::tiers), `#[rate_limit(tier = .., tiers(..))]`, a tower
//! layer's tier resolver).
//!
//! A tier is a limit name of its own, `<group>@<tier>` (`api@pro`):
//!
//! - its limits are looked up at run time under that name, like any
//!   group's ([`Settings::set_limits`](crate::Settings::set_limits), a limits file, admin overrides), and
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
use std::fmt::{self, Write as _};
use std::sync::Arc;

use ratewall_grammar::{DEFAULT_TIER, TIER_NAME_MAX, TIER_SEPARATOR, check_tier_name};
use smallvec::SmallVec;

use super::Limiter;
use super::call::{Admission, CallSpec, Counting, Decided, GroupSpec, Permit, Settle, check_group};
use super::resolve::{Resolved, Targets};
use crate::layer::Source;
use crate::layer::counters::{self, Prebuilt};
use crate::model::decision::Decision;
use crate::model::error::{Error, LimitError};
use crate::model::key::{self, Identity, Part};
use crate::model::limit::Limit;
use crate::model::policy::FailurePolicy;
use crate::model::rejection::Rejection;
use crate::store::Store;
use crate::store::target::{KeyRef, Slot, Target};

/// One named set of limits of a tiered group ([`GroupSpec::tiered`]).
///
/// A tier name is 1 to 64 ASCII letters, digits, `_`, `-` or `.`. Each
/// tier is a limit name, `<group>@<tier>` (`api@pro`): the scope of its
/// keys (its own state), the name in rejections, `RateLimit` fields and
/// logs, and the name its limits are set under at run time
/// ([`Settings::set_limits`](crate::Settings::set_limits), a limits file), where a name `<group>@<tier>`
/// also adds a tier the code does not declare. Shadow mode, the deny-cache
/// setting and allow/deny entries of the group's name apply to its tiers.
/// The `limit` label of a tiered call's metrics is `<call>@<tier>` (the
/// tier of its first tiered group).
///
/// A call whose tier is none of its group's (or that gives none) is decided
/// by the tier named `default` when the group has one. Otherwise it cannot
/// be decided: an error naming the tier is logged, and the failure policy
/// answers — [`FailurePolicy::FailOpen`] admits it
/// ([`Admission::FailedOpen`]); `FailClosed` and `Local` refuse it as
/// unavailable ([`LimitError::UnknownTier`]), counted under the call's own
/// name. Give a `default` tier when the tier comes from the client.
///
/// ```
/// use ratewall::{Limit, Tier};
/// let pro = Tier::owned("pro", vec![Limit::per_minute(1000)?, "20/1s".parse()?]);
/// assert_eq!((pro.name(), pro.limits().len()), ("pro", 2));
/// # Ok::<(), ratewall::LimitError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Tier {
    name: Cow<'static, str>,
    limits: Cow<'static, [Limit]>,
}

impl Tier {
    /// A tier for a `static` group (what `#[rate_limit(tiers(..))]` emits).
    pub const fn new(name: &'static str, limits: &'static [Limit]) -> Self {
        Self {
            name: Cow::Borrowed(name),
            limits: Cow::Borrowed(limits),
        }
    }

    /// A tier built at run time.
    pub fn owned(name: impl Into<String>, limits: Vec<Limit>) -> Self {
        Self {
            name: Cow::Owned(name.into()),
            limits: Cow::Owned(limits),
        }
    }

    /// The tier's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The declared limits (runtime limits of `<group>@<tier>` replace them).
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }
}

/// Checks a tiered group: a name that can carry tiers, valid and distinct
/// tier names, and each tier's limits as a group's.
pub(crate) fn check_tiers(group: &str, tiers: &[Tier], cost: u64) -> Result<(), LimitError> {
    if group.is_empty() || group.contains(TIER_SEPARATOR) {
        return Err(LimitError::BadTier(format!(
            "tiered group {group:?}: its name must not be empty nor contain `@` (its tiers are named `<group>@<tier>`)"
        )));
    }
    for (index, tier) in tiers.iter().enumerate() {
        check_tier_name(tier.name())
            .map_err(|bad| LimitError::BadTier(format!("group `{group}`: {bad}")))?;
        if tiers[..index].iter().any(|t| t.name() == tier.name()) {
            return Err(LimitError::BadTier(format!(
                "group `{group}` declares tier `{}` twice",
                tier.name()
            )));
        }
        check_group(&tier_name(group, tier.name()), tier.limits(), cost)?;
    }
    Ok(())
}

/// `<group>@<tier>`.
fn tier_name(group: &str, tier: &str) -> String {
    let mut name = String::with_capacity(group.len() + tier.len() + 1);
    name.push_str(group);
    name.push(TIER_SEPARATOR);
    name.push_str(tier);
    name
}

/// The tier each group of one call is decided by: an index into its
/// [`TierSet`], or [`NOT_TIERED`].
pub(crate) type Chosen = SmallVec<[u32; 2]>;

/// A group without tiers, in [`Chosen`].
pub(crate) const NOT_TIERED: u32 = u32::MAX;

/// A tiered group's tiers, resolved against one limiter.
#[derive(Debug)]
pub(crate) struct TierSet {
    /// Declared ones first, in order, then those only configured at run
    /// time, by name.
    pub(crate) tiers: Box<[TierGroup]>,
    /// The index of the `default` tier.
    default: Option<u32>,
}

/// One tier, resolved: what a group is, for calls of this tier.
#[derive(Debug)]
pub(crate) struct TierGroup {
    /// The tier's name (`pro`).
    pub(crate) tier: Box<str>,
    /// `<group>@<tier>`: the key scope, the name in rejections, logs and
    /// runtime overrides.
    pub(crate) name: Cow<'static, str>,
    /// `prefix:{<group>@<tier>:` (escaped).
    pub(crate) head: Box<str>,
    /// The declared limits, or those set at run time for `name`.
    pub(crate) limits: Box<[Limit]>,
    /// Each limit's partition in the limiter's memory store.
    pub(crate) slots: Box<[Option<Slot>]>,
    /// Why this tier's calls can never be decided (e.g. runtime limits a
    /// cost exceeds).
    pub(crate) problem: Option<LimitError>,
    /// For the call's first tiered group: the call's name with this tier
    /// (`<call>@<tier>`, the `limit` label) and its metric keys.
    pub(crate) call: Option<(Box<str>, Prebuilt)>,
    /// For the only tiered group of a call: what its permits keep, built
    /// once (a permit then takes a reference, allocating nothing).
    pub(crate) binding: Option<Arc<TierBinding>>,
}

impl TierSet {
    /// The tiers of `group`: declared, or configured at run time as
    /// `<group>@<tier>`. `call` is the call's name when this is its first
    /// tiered group (each tier then names the call).
    pub(crate) fn resolve(limiter: &Limiter, group: &GroupSpec, call: Option<&str>) -> Self {
        let registry = &limiter.registry;
        let memory = match &limiter.pipeline.store {
            Store::Memory(memory) => Some(memory),
            Store::Remote(_) => None,
        };
        let declared = group.tiers().unwrap_or_default();
        let mut named: Vec<(&str, Cow<'_, [Limit]>)> = declared
            .iter()
            .map(|t| (t.name(), Cow::Borrowed(t.limits())))
            .collect();
        let configured = registry.tiers_of(group.name());
        for (tier, limits) in &configured {
            if !named.iter().any(|(name, _)| name == tier) {
                named.push((tier, Cow::Owned(limits.to_vec())));
            }
        }
        let tiers: Box<[TierGroup]> = named
            .into_iter()
            .map(|(tier, declared)| {
                let name = tier_name(group.name(), tier);
                let limits: Box<[Limit]> = match registry.limits(&name) {
                    Some(runtime) => runtime.iter().copied().collect(),
                    None => declared.iter().copied().collect(),
                };
                let problem = check_group(&name, &limits, group.cost()).err();
                let head: Box<str> = key::head(limiter.prefix(), &name).into();
                let slots = limits
                    .iter()
                    .map(|limit| memory.map(|m| m.slot(&head, limit)))
                    .collect();
                let call = call.map(|call| {
                    let label = tier_name(call, tier);
                    let counters = Prebuilt::new(&label);
                    (label.into_boxed_str(), counters)
                });
                TierGroup {
                    tier: tier.into(),
                    name: Cow::Owned(name),
                    head,
                    limits,
                    slots,
                    problem,
                    call,
                    binding: None,
                }
            })
            .collect();
        let default = tiers
            .iter()
            .position(|t| &*t.tier == DEFAULT_TIER)
            .map(|i| i as u32);
        Self { tiers, default }
    }

    /// The index of tier `tier`, else of the `default` tier.
    #[inline]
    fn find(&self, tier: &str) -> Option<u32> {
        self.tiers
            .iter()
            .position(|t| *t.tier == *tier)
            .map(|i| i as u32)
            .or(self.default)
    }
}

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

/// What a permit of a tiered call keeps: each group's name and limits as
/// decided (a tier's for a tiered group), for [`Permit::binding`].
#[derive(Debug)]
pub(crate) struct TierBinding {
    groups: Box<[GroupAsDecided]>,
}

/// One group as a tiered call decided it: its (tier's) name and limits.
type GroupAsDecided = (Cow<'static, str>, Box<[Limit]>);

impl TierBinding {
    /// The groups of a call with `chosen` tiers.
    fn new(resolved: &Resolved, chosen: &[u32]) -> Self {
        let groups = (0..resolved.groups.len())
            .map(|g| {
                let (name, _, limits, _) = resolved.part(g, chosen);
                (name.clone(), limits.into())
            })
            .collect();
        Self { groups }
    }

    /// [`Permit::binding`] of a tiered call that skipped the groups in
    /// `skipped`.
    pub(crate) fn binding(
        &self,
        limiter: &Limiter,
        skipped: u64,
        decisions: &crate::model::decision::Decisions,
    ) -> Option<(&str, Decision, Limit)> {
        let groups = self
            .groups
            .iter()
            .map(|(name, limits)| (name.as_ref(), limits.as_ref()));
        super::call::rate_binding(limiter, groups, skipped, decisions)
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

/// Renders a tier into at most [`TIER_NAME_MAX`] bytes; a longer one (no
/// tier's) is cut, ending in `…`, which no tier name has.
struct Bounded(arrayvec::ArrayString<TIER_NAME_MAX>, bool);

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if self.1 {
                break;
            }
            if self.0.len() + c.len_utf8() + '…'.len_utf8() > TIER_NAME_MAX {
                self.0.push('…');
                self.1 = true;
            } else {
                self.0.push(c);
            }
        }
        Ok(())
    }
}

/// A tier as text, rendered into at most [`TIER_NAME_MAX`] bytes (a longer
/// one, no tier's, is cut).
pub(crate) fn tier_text(part: Part<'_>) -> arrayvec::ArrayString<TIER_NAME_MAX> {
    let mut out = Bounded(arrayvec::ArrayString::new(), false);
    let _ = match part {
        Part::Text(text) => out.write_str(text),
        Part::Unsigned(n) => out.write_str(itoa::Buffer::new().format(n)),
        Part::Signed(n) => out.write_str(itoa::Buffer::new().format(n)),
        Part::Display(value) => write!(out, "{value}"),
        Part::Ip(ip) => write!(out, "{ip}"),
    };
    out.0
}

/// A tier as logs and errors show it: cut at [`TIER_NAME_MAX`] bytes.
fn shown(tier: &str) -> String {
    let mut out = Bounded(arrayvec::ArrayString::new(), false);
    let _ = out.write_str(tier);
    out.0.to_string()
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
