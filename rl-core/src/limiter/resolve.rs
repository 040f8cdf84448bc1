//! A [`CallSpec`] resolved against one limiter: each group's key head,
//! its limits after runtime overrides, its partitions in a memory store,
//! a tiered group's tiers ([`TierSet`]), what a tiered permit keeps
//! ([`TierBinding`]), and the failure policy. Made once per thread, spec and registry
//! generation, and kept in a small per-thread table, so the hot path reads
//! no shared map and takes no lock: a cached resolution is checked against
//! the limiter's id and registry generation and used by reference.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use ratewall_grammar::DEFAULT_TIER;
use smallvec::SmallVec;

use crate::layer::counters::Prebuilt;
use crate::layer::{Mask, Plan, PlanGroup, PlanScope};
use crate::limiter::Limiter;
use crate::limiter::spec::{CallSpec, Counting, GroupSpec, check_group, tier_name};
use crate::model::decision::{Decision, Decisions};
use crate::model::error::LimitError;
use crate::model::key::{self, Identity, IdentityRef};
use crate::model::limit::Limit;
use crate::model::lists::ListKind;
use crate::model::policy::FailurePolicy;
use crate::model::settings::Registry;
use crate::store::Store;
use crate::store::target::{KeyRef, Slot, Target};

/// The targets of one call (two inline: most calls have one or two limits).
pub(crate) type Targets<'a> = SmallVec<[Target<'a>; 2]>;

/// One group of a call, resolved.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) name: Cow<'static, str>,
    /// `prefix:{name:` (escaped): every key of the group starts with it.
    pub(crate) head: Box<str>,
    /// The spec's limits, or those set at run time by name.
    pub(crate) limits: Box<[Limit]>,
    pub(crate) cost: u64,
    pub(crate) reset_on_success: bool,
    /// Whether the group's cost is settled after the call.
    pub(crate) settles: bool,
    /// Each limit's partition in the limiter's memory store.
    pub(crate) slots: Box<[Option<Slot>]>,
    /// A tiered group's tiers (its own `limits` are then empty).
    pub(crate) tiers: Option<Box<TierSet>>,
}

impl Group {
    /// The layers' view of this group ([`PlanGroup`]).
    fn plan(&self) -> PlanGroup<'_> {
        let scopes = match &self.tiers {
            None => vec![PlanScope {
                name: &self.name,
                head: &self.head,
                limits: &self.limits,
                call: None,
            }],
            Some(set) => set
                .tiers
                .iter()
                .map(|tier| PlanScope {
                    name: &tier.name,
                    head: &tier.head,
                    limits: &tier.limits,
                    call: tier.call.as_ref().map(|(name, _)| &**name),
                })
                .collect(),
        };
        PlanGroup {
            name: &self.name,
            limits: &self.limits,
            scopes,
        }
    }

    /// This group's target for `identity` under `limit` (one of its
    /// limits, with its `slot`).
    #[inline(always)]
    fn target<'a>(
        &'a self,
        identity: IdentityRef<'a>,
        limit: &'a Limit,
        slot: Option<Slot>,
        cost: u64,
    ) -> Target<'a> {
        Target {
            name: &self.name,
            key: KeyRef {
                head: &self.head,
                identity,
            },
            limit,
            // An in-flight slot is one per call, whatever the cost.
            cost: if limit.is_in_flight() { 1 } else { cost },
            slot,
            lease: 0,
        }
    }
}

/// A spec resolved against one limiter at one registry generation.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// The spec's id ([`CallSpec::id`]).
    spec: u64,
    limiter: u64,
    generation: u64,
    pub(crate) policy: FailurePolicy,
    pub(crate) groups: SmallVec<[Group; 2]>,
    /// Why calls of the spec can never be decided (checked once, here).
    pub(crate) problem: Option<LimitError>,
    /// A problem, or a tiered group (whose calls choose tiers: see
    /// `tier.rs`): the one flag the plain call path tests.
    pub(crate) special: bool,
    /// The layers these calls pass (the ones that have something to do).
    pub(crate) mask: Mask,
    /// The metric keys of these calls' commonest outcomes.
    pub(crate) counters: Prebuilt,
    /// Whether any group has an in-flight limit (its calls take slots).
    pub(crate) in_flight: bool,
    /// The call is one rate limit (one group, one limit, counted on every
    /// admission, not waiting, no tier, no in-flight slot) on a memory
    /// store, and every layer it passes only observes: the limiter's
    /// direct lane ([`Resolved::direct_target`]) decides it. Resolved again
    /// (so re-checked) after any runtime change: lists, shadow mode, limits.
    pub(crate) direct: bool,
    /// Whether any group settles its cost after the call (its permit keeps
    /// what settling needs).
    pub(crate) settles: bool,
}

impl Resolved {
    fn new(limiter: &Limiter, spec: &CallSpec, generation: u64) -> Self {
        let registry = &limiter.registry;
        let memory = match &limiter.pipeline.store {
            Store::Memory(memory) => Some(memory),
            Store::Remote(_) => None,
        };
        let mut problem = spec.check().err();
        let first_tiered = spec.groups().iter().position(GroupSpec::is_tiered);
        let groups: SmallVec<[Group; 2]> = spec
            .groups()
            .iter()
            .enumerate()
            .map(|(index, group)| {
                let head: Box<str> = key::head(limiter.prefix(), group.name()).into();
                let tiers = group.is_tiered().then(|| {
                    let label = (first_tiered == Some(index)).then_some(spec.name());
                    Box::new(TierSet::resolve(limiter, group, label))
                });
                let limits: Box<[Limit]> = match (&tiers, registry.limits(group.name())) {
                    (Some(_), _) => Box::new([]),
                    (None, Some(runtime)) => runtime.iter().copied().collect(),
                    (None, None) => group.limits().into(),
                };
                if problem.is_none() && tiers.is_none() {
                    problem = check_group(group.name(), &limits, group.cost()).err();
                }
                let slots = limits
                    .iter()
                    .map(|limit| memory.map(|m| m.slot(&head, limit)))
                    .collect();
                Group {
                    name: group.name_cow().clone(),
                    head,
                    limits,
                    cost: group.cost(),
                    reset_on_success: group.resets_on_success(),
                    settles: group.settles_cost(),
                    slots,
                    tiers,
                }
            })
            .collect();
        // In-flight limits of the groups, or of any of their tiers: such
        // calls take slots under a lease id.
        let in_flight = groups.iter().any(|g| {
            g.limits.iter().any(Limit::is_in_flight)
                || g.tiers
                    .iter()
                    .flat_map(|set| set.tiers.iter())
                    .any(|tier| tier.limits.iter().any(Limit::is_in_flight))
        });
        let mask = limiter.pipeline.mask(&Plan {
            name: spec.name(),
            groups: groups.iter().map(Group::plan).collect(),
            remote: memory.is_none(),
        });
        let direct = problem.is_none()
            && first_tiered.is_none()
            && !in_flight
            && !spec.waits()
            && spec.counting() == Counting::Every
            && !spec.groups().iter().any(GroupSpec::settles_cost)
            && matches!(&*groups, [group] if group.limits.len() == 1 && !group.reset_on_success)
            && limiter.pipeline.direct(mask);
        let mut resolved = Self {
            spec: spec.id(),
            limiter: limiter.id,
            generation,
            policy: limiter.policy_for(spec.name(), spec.policy()),
            groups,
            special: problem.is_some() || first_tiered.is_some(),
            problem,
            mask,
            counters: Prebuilt::new(spec.name()),
            in_flight,
            direct,
            settles: spec.groups().iter().any(GroupSpec::settles_cost),
        };
        if first_tiered.is_some() {
            resolved.bind_tiers();
        }
        resolved
    }

    /// The one target of a call on the direct lane ([`Resolved::direct`]),
    /// for identity `identity`.
    #[inline(always)]
    pub(crate) fn direct_target<'a>(&'a self, identity: &'a Identity) -> Option<Target<'a>> {
        let [group] = &*self.groups else {
            return None;
        };
        let ([limit], [slot]) = (&*group.limits, &*group.slots) else {
            return None;
        };
        Some(group.target(identity.as_ref(), limit, *slot, group.cost))
    }

    /// Adds the targets of the groups `keep` accepts (by index and group)
    /// to `targets` (built in place: no copy of the batch on the hot path),
    /// each group at its cost in `costs` (empty: the group's own).
    #[inline(always)]
    pub(crate) fn fill_targets<'a>(
        &'a self,
        identities: &'a [Identity],
        costs: &[u64],
        keep: impl Fn(usize, &Group) -> bool,
        targets: &mut Targets<'a>,
    ) {
        // One group of one limit (the common case): one target, no loop.
        if let ([group], [identity]) = (&*self.groups, identities)
            && let ([limit], [slot]) = (&*group.limits, &*group.slots)
        {
            if keep(0, group) {
                let cost = costs.first().copied().unwrap_or(group.cost);
                targets.push(group.target(identity.as_ref(), limit, *slot, cost));
            }
            return;
        }
        for (index, (group, identity)) in self.groups.iter().zip(identities).enumerate() {
            if !keep(index, group) {
                continue;
            }
            let identity = identity.as_ref();
            let cost = costs.get(index).copied().unwrap_or(group.cost);
            for (limit, slot) in group.limits.iter().zip(&*group.slots) {
                targets.push(group.target(identity, limit, *slot, cost));
            }
        }
    }

    /// The groups whose identity is allow-listed for them (bit `i`: group
    /// `i`); 0 without any allow entry.
    #[inline]
    pub(crate) fn allow_listed(&self, registry: &Registry, identities: &[Identity]) -> u64 {
        if !registry.any_listed(ListKind::Allow) {
            return 0;
        }
        self.groups
            .iter()
            .zip(identities)
            .enumerate()
            .filter(|(_, (group, identity))| {
                identity
                    .as_ref()
                    .with_text(|text| registry.listed(ListKind::Allow, &group.name, text))
                    .is_some()
            })
            .fold(0, |mask, (i, _)| mask | (1 << i))
    }

    /// Every group (bit `i`: group `i`).
    pub(crate) fn all_groups(&self) -> u64 {
        (1u64 << self.groups.len()) - 1
    }

    /// The group and limit of target `index` of a call that skipped the
    /// groups in `skipped`.
    pub(crate) fn target_origin(&self, index: usize, skipped: u64) -> Option<(usize, Limit)> {
        self.groups
            .iter()
            .enumerate()
            .filter(|(g, _)| skipped & (1 << g) == 0)
            .flat_map(|(g, group)| group.limits.iter().map(move |limit| (g, *limit)))
            .nth(index)
    }
}

/// Per-thread resolutions, direct-mapped by spec id (a collision only
/// resolves again).
const SLOTS: usize = 64;

thread_local! {
    static CACHE: RefCell<[Option<Arc<Resolved>>; SLOTS]> =
        const { RefCell::new([const { None }; SLOTS]) };
}

/// Runs `f` with `spec` resolved against `limiter`: from this thread's cache
/// when it is current (borrowed in place: no reference count is touched, so
/// threads deciding the same spec share no written cache line), else
/// resolved now and cached.
#[inline(always)]
pub(crate) fn with<R>(
    limiter: &Limiter,
    spec: &CallSpec,
    f: impl FnOnce(&Arc<Resolved>) -> R,
) -> R {
    let id = spec.id();
    let generation = limiter.registry.generation();
    let current = |resolved: &Resolved| {
        resolved.spec == id && resolved.limiter == limiter.id && resolved.generation == generation
    };
    let mut f = Some(f);
    let hit = CACHE.try_with(|cache| match cache.try_borrow() {
        Ok(cache) => match &cache[id as usize % SLOTS] {
            Some(resolved) if current(resolved) => f.take().map(|f| f(resolved)),
            _ => None,
        },
        Err(_) => None,
    });
    match (hit, f) {
        (Ok(Some(out)), _) => out,
        (_, Some(f)) => f(&miss(limiter, spec, generation)),
        (_, None) => unreachable!("`f` is taken only on a hit"),
    }
}

/// Resolves `spec` now and caches it on this thread.
#[cold]
#[inline(never)]
fn miss(limiter: &Limiter, spec: &CallSpec, generation: u64) -> Arc<Resolved> {
    let resolved = Arc::new(Resolved::new(limiter, spec, generation));
    let _ = CACHE.try_with(|cache| {
        if let Ok(mut cache) = cache.try_borrow_mut() {
            cache[resolved.spec as usize % SLOTS] = Some(resolved.clone());
        }
    });
    resolved
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
    pub(crate) fn find(&self, tier: &str) -> Option<u32> {
        self.tiers
            .iter()
            .position(|t| *t.tier == *tier)
            .map(|i| i as u32)
            .or(self.default)
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
    pub(crate) fn new(resolved: &Resolved, chosen: &[u32]) -> Self {
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
        rate_binding(limiter, groups, skipped, decisions)
    }
}

/// The allowed rate decision with the fewest units left among `groups`
/// (their name and limits as declared; the limits as currently set are
/// read from `limiter`), skipping the groups in `skipped`. In-flight limits
/// are not rates and are left out.
pub(crate) fn rate_binding<'a>(
    limiter: &Limiter,
    groups: impl Iterator<Item = (&'a str, &'a [Limit])> + Clone,
    skipped: u64,
    decisions: &Decisions,
) -> Option<(&'a str, Decision, Limit)> {
    let mut index = decisions.binding_index();
    for (g, (name, declared)) in groups.clone().enumerate() {
        if skipped & (1 << g) != 0 {
            continue;
        }
        let runtime = limiter.registry.limits(name);
        let limits = runtime.as_deref().unwrap_or(declared);
        match limits.get(index) {
            Some(limit) if !limit.is_in_flight() => {
                return Some((name, *decisions.binding(), *limit));
            }
            Some(_) => break,
            None => index -= limits.len(),
        }
    }
    // The binding decision was an in-flight limit's: the rate limit with
    // the fewest units left.
    let mut best: Option<(&str, Decision, Limit)> = None;
    let mut at = 0;
    for (g, (name, declared)) in groups.enumerate() {
        if skipped & (1 << g) != 0 {
            continue;
        }
        let runtime = limiter.registry.limits(name);
        let limits = runtime.as_deref().unwrap_or(declared);
        for limit in limits {
            let Some(decision) = decisions.as_slice().get(at).copied() else {
                return best;
            };
            at += 1;
            if limit.is_in_flight() {
                continue;
            }
            if best.is_none_or(|(_, b, _)| decision.remaining() < b.remaining()) {
                best = Some((name, decision, *limit));
            }
        }
    }
    best
}
