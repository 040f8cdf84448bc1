//! The validation layer: a batch that could never be decided (a cost above
//! a limit's capacity, one state named twice, no limit at all) is refused
//! here, once, whatever the store. Calls of a resolved [`crate::CallSpec`]
//! were checked when it was resolved, and skip it when that suffices.

use super::{Answer, Call, Layer, Plan};
use crate::limiter::resolve::Group;
use crate::model::error::Error;
use crate::model::limit::Limit;
use crate::store::target::validate;

/// Refuses invalid batches before any store sees them.
#[derive(Debug, Default)]
pub(crate) struct Validate;

impl Layer for Validate {
    /// A resolved spec's costs and limits are checked when it is resolved;
    /// its batches can then name one state twice only through two groups
    /// that can have one key head (one name, or a tier's name another group
    /// has) and a limit of the same state.
    fn applies(&self, plan: &Plan<'_>) -> bool {
        plan.groups.iter().enumerate().any(|(i, a)| {
            plan.groups[i + 1..].iter().any(|b| {
                decides(a).any(|(head_a, limits_a)| {
                    decides(b).any(|(head_b, limits_b)| {
                        head_a == head_b
                            && limits_a
                                .iter()
                                .any(|x| limits_b.iter().any(|y| x.state_id() == y.state_id()))
                    })
                })
            })
        })
    }

    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        validate(call.op, call.targets)
            .err()
            .map(|error| Answer::Unavailable(Error::Limit(error)))
    }
}

/// Each key head a group may decide on, with its limits there: its own,
/// or each of its tiers'.
fn decides(group: &Group) -> impl Iterator<Item = (&str, &[Limit])> {
    let own = group
        .tiers
        .is_none()
        .then_some((&*group.head, &*group.limits));
    let tiers = group
        .tiers
        .iter()
        .flat_map(|set| set.tiers.iter())
        .map(|tier| (&*tier.head, &*tier.limits));
    own.into_iter().chain(tiers)
}
