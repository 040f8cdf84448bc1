//! The validation layer: a batch that could never be decided (a cost above
//! a limit's capacity, one state named twice, no limit at all) is refused
//! here, once, whatever the store. Calls of a resolved call spec
//! were checked when it was resolved, and skip it when that suffices.

use super::{Answer, Call, Layer, Plan};
use crate::model::error::Error;
use crate::store::target::validate;

/// Refuses invalid batches before any store sees them.
#[derive(Debug, Default)]
pub(crate) struct Validate;

impl Layer for Validate {
    fn acts_after(&self) -> bool {
        false
    }

    /// A resolved spec's costs and limits are checked when it is resolved;
    /// its batches can then name one state twice only through two groups
    /// that can have one key head (one name, or a tier's name another group
    /// has) and a limit of the same state.
    fn applies(&self, plan: &Plan<'_>) -> bool {
        plan.groups.iter().enumerate().any(|(i, a)| {
            plan.groups[i + 1..].iter().any(|b| {
                a.scopes.iter().any(|x| {
                    b.scopes.iter().any(|y| {
                        x.head == y.head
                            && x.limits
                                .iter()
                                .any(|l| y.limits.iter().any(|m| l.state_id() == m.state_id()))
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
