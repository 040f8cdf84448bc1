//! The shadow layer: a refusal of a name in shadow mode is decided, counted
//! and logged as usual (`outcome="shadow_rejected"`) but not enforced, for
//! rolling out a new limit safely.

use std::sync::Arc;

use super::{Answer, Call, Layer, Plan};
use crate::model::settings::Registry;

/// Lets refusals of shadowed names through.
#[derive(Debug)]
pub(crate) struct Shadow {
    registry: Arc<Registry>,
}

impl Shadow {
    pub(crate) fn new(registry: Arc<Registry>) -> Self {
        Self { registry }
    }
}

impl Layer for Shadow {
    fn acts_before(&self) -> bool {
        false
    }

    fn applies(&self, plan: &Plan<'_>) -> bool {
        self.registry.any_shadow() && plan.names().any(|name| self.registry.shadowed(name))
    }

    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        if !call.op.admits() || !self.registry.any_shadow() {
            return;
        }
        let Answer::Decided { decisions, source } = answer else {
            return;
        };
        if decisions.allowed() {
            return;
        }
        let refusing = decisions.binding_index();
        let group = call.targets.get(refusing).map_or(call.name, |t| t.name);
        if self.registry.shadowed(call.name) || self.registry.shadowed(group) {
            *answer = Answer::Shadowed {
                decisions: std::mem::replace(decisions, crate::model::decision::Decisions::new([])),
                source: *source,
            };
        }
    }
}
