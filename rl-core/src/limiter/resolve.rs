//! A [`CallSpec`] resolved against one limiter: each group's key head,
//! its limits after runtime overrides, its partitions in a memory store,
//! and the failure policy. Made once per thread, spec and registry
//! generation, and kept in a small per-thread table, so the hot path reads
//! no shared map and takes no lock: a cached resolution is checked against
//! the limiter's id and registry generation and used by reference.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ops::Deref;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::layer::counters::Prebuilt;
use crate::layer::{Mask, Plan};
use crate::limiter::Limiter;
use crate::limiter::call::{CallSpec, check_group};
use crate::model::error::LimitError;
use crate::model::key::{self, Identity};
use crate::model::limit::Limit;
use crate::model::policy::FailurePolicy;
use crate::store::Store;
use crate::store::target::{KeyRef, Slot, Target};

/// The targets of one call (two inline: most calls have one or two limits).
pub(crate) type Targets<'a> = SmallVec<[Target<'a>; 2]>;

/// A group's limits: the spec's, or set at run time by name.
#[derive(Debug, Clone)]
pub(crate) enum Limits {
    Spec(Cow<'static, [Limit]>),
    Runtime(Arc<[Limit]>),
}

impl Deref for Limits {
    type Target = [Limit];
    fn deref(&self) -> &[Limit] {
        match self {
            Limits::Spec(limits) => limits,
            Limits::Runtime(limits) => limits,
        }
    }
}

/// One group of a call, resolved.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) name: Cow<'static, str>,
    /// `prefix:{name:` (escaped): every key of the group starts with it.
    pub(crate) head: Box<str>,
    pub(crate) limits: Limits,
    pub(crate) cost: u64,
    pub(crate) reset_on_success: bool,
    /// Each limit's partition in the limiter's memory store.
    pub(crate) slots: SmallVec<[Option<Slot>; 2]>,
}

/// A spec resolved against one limiter at one registry generation.
#[derive(Debug)]
pub(crate) struct Resolved {
    limiter: u64,
    generation: u64,
    pub(crate) policy: FailurePolicy,
    pub(crate) groups: SmallVec<[Group; 2]>,
    /// Why calls of the spec can never be decided (checked once, here).
    pub(crate) problem: Option<LimitError>,
    /// The layers these calls pass (the ones that have something to do).
    pub(crate) mask: Mask,
    /// The metric keys of these calls' commonest outcomes.
    pub(crate) counters: Prebuilt,
}

impl Resolved {
    fn new(limiter: &Limiter, spec: &CallSpec, generation: u64) -> Self {
        let registry = &limiter.registry;
        let memory = match &limiter.pipeline.store {
            Store::Memory(memory) => Some(memory),
            Store::Remote(_) => None,
        };
        let mut problem = spec.check().err();
        let groups: SmallVec<[Group; 2]> = spec
            .groups()
            .iter()
            .map(|group| {
                let limits = match registry.limits(group.name()) {
                    Some(runtime) => Limits::Runtime(runtime),
                    None => Limits::Spec(group.limits_cow().clone()),
                };
                if problem.is_none() {
                    problem = check_group(group.name(), &limits, group.cost()).err();
                }
                let head: Box<str> = key::head(limiter.prefix(), group.name()).into();
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
                    slots,
                }
            })
            .collect();
        let mask = limiter.pipeline.mask(&Plan {
            name: spec.name(),
            groups: &groups,
            remote: memory.is_none(),
        });
        Self {
            limiter: limiter.id,
            generation,
            policy: limiter.policy_for(spec.name(), spec.policy()),
            groups,
            problem,
            mask,
            counters: Prebuilt::new(spec.name()),
        }
    }

    /// The targets of a call whose group `i` has identity `identities[i]`.
    pub(crate) fn targets<'a>(&'a self, identities: &'a [Identity]) -> Targets<'a> {
        let mut targets = Targets::new();
        self.fill_targets(identities, |_| true, &mut targets);
        targets
    }

    /// Adds the targets of the groups `keep` accepts to `targets` (built in
    /// place: no copy of the batch on the hot path).
    pub(crate) fn fill_targets<'a>(
        &'a self,
        identities: &'a [Identity],
        keep: impl Fn(&Group) -> bool,
        targets: &mut Targets<'a>,
    ) {
        for (group, identity) in self.groups.iter().zip(identities) {
            if !keep(group) {
                continue;
            }
            for (limit, slot) in group.limits.iter().zip(&group.slots) {
                targets.push(Target {
                    name: &group.name,
                    key: KeyRef {
                        head: &group.head,
                        identity: identity.as_ref(),
                    },
                    limit,
                    cost: group.cost,
                    slot: *slot,
                });
            }
        }
    }

    /// The group and limit of target `index`.
    pub(crate) fn target_origin(&self, index: usize) -> Option<(usize, Limit)> {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| group.limits.iter().map(move |limit| (g, *limit)))
            .nth(index)
    }
}

/// Per-thread resolutions, direct-mapped by spec id (a collision only
/// resolves again).
const SLOTS: usize = 64;

thread_local! {
    static CACHE: RefCell<[Option<(u64, Arc<Resolved>)>; SLOTS]> =
        const { RefCell::new([const { None }; SLOTS]) };
}

/// Runs `f` with `spec` resolved against `limiter`: from this thread's cache
/// when it is current (borrowed in place: no reference count is touched, so
/// threads deciding the same spec share no written cache line), else
/// resolved now and cached.
pub(crate) fn with<R>(
    limiter: &Limiter,
    spec: &CallSpec,
    f: impl FnOnce(&Arc<Resolved>) -> R,
) -> R {
    let id = spec.id();
    let slot = id as usize % SLOTS;
    let generation = limiter.registry.generation();
    let mut f = Some(f);
    let hit = CACHE
        .try_with(|cache| {
            let cache = cache.try_borrow().ok()?;
            match &cache[slot] {
                Some((spec_id, resolved))
                    if *spec_id == id
                        && resolved.limiter == limiter.id
                        && resolved.generation == generation =>
                {
                    f.take().map(|f| f(resolved))
                }
                _ => None,
            }
        })
        .ok()
        .flatten();
    if let Some(out) = hit {
        return out;
    }
    let resolved = Arc::new(Resolved::new(limiter, spec, generation));
    let _ = CACHE.try_with(|cache| {
        if let Ok(mut cache) = cache.try_borrow_mut() {
            cache[slot] = Some((id, resolved.clone()));
        }
    });
    let f = f.expect("not called on a miss");
    f(&resolved)
}
