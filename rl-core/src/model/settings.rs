//! The runtime overrides of one limiter, by name: limits, failure policy,
//! shadow mode and the deny cache, in one map behind one lock.
//!
//! Writers take the lock, change one name's [`NameSettings`] and bump the
//! generation; readers on the hot path compare the generation with the one
//! their cached resolution was made at, and take the lock only when it
//! changed (see [`crate::limiter::resolve`]). Every reader sees either the
//! settings before a change or after it, never a mix.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;
use ratewall_grammar::inherited;

use crate::model::limit::Limit;
use crate::model::lists::{ListEntry, ListKind, Listed, Lists};
use crate::model::policy::FailurePolicy;

/// What is set at run time for one name (a function's, a group's or a
/// route's limit name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NameSettings {
    /// Limits replacing the compiled-in ones.
    pub limits: Option<Arc<[Limit]>>,
    /// The failure policy, over the call's and the limiter's.
    pub policy: Option<FailurePolicy>,
    /// Decided and logged, never refused.
    pub shadow: bool,
    /// The deny cache on or off for calls with this name.
    pub deny_cache: Option<bool>,
}

impl NameSettings {
    fn is_empty(&self) -> bool {
        *self == NameSettings::default()
    }
}

/// Every name's [`NameSettings`].
#[derive(Debug, Default)]
pub(crate) struct Registry {
    names: RwLock<HashMap<Box<str>, NameSettings>>,
    /// Bumped on every change.
    generation: AtomicU64,
    /// Whether any name is in shadow mode (skips the lock on refusals).
    any_shadow: AtomicBool,
    /// Whether any name sets the deny cache.
    any_deny: AtomicBool,
    /// Allow and deny lists.
    lists: RwLock<Lists>,
    /// Whether the lists hold an allow / a deny entry (skips their lock).
    any_allowed: AtomicBool,
    any_denied: AtomicBool,
}

impl Registry {
    /// Changes one name's settings; returns whether anything changed.
    pub(crate) fn update(&self, name: &str, change: impl FnOnce(&mut NameSettings)) -> bool {
        let mut names = self.names.write();
        let mut settings = names.get(name).cloned().unwrap_or_default();
        let before = settings.clone();
        change(&mut settings);
        if settings == before {
            return false;
        }
        if settings.is_empty() {
            names.remove(name);
        } else {
            names.insert(name.into(), settings);
        }
        self.any_shadow
            .store(names.values().any(|s| s.shadow), Ordering::Release);
        self.any_deny.store(
            names.values().any(|s| s.deny_cache.is_some()),
            Ordering::Release,
        );
        self.generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Changes since the limiter was built.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The settings of `name`.
    pub(crate) fn get(&self, name: &str) -> NameSettings {
        if self.generation() == 0 {
            return NameSettings::default();
        }
        self.names.read().get(name).cloned().unwrap_or_default()
    }

    /// The runtime failure policy of `name` (what [`Registry::get`] would
    /// say of it, without copying the rest of its settings).
    #[inline]
    pub(crate) fn policy(&self, name: &str) -> Option<FailurePolicy> {
        if self.generation() == 0 {
            return None;
        }
        self.names.read().get(name).and_then(|s| s.policy)
    }

    /// The runtime limits of `name`.
    pub(crate) fn limits(&self, name: &str) -> Option<Arc<[Limit]>> {
        if self.generation() == 0 {
            return None;
        }
        self.names.read().get(name).and_then(|s| s.limits.clone())
    }

    #[inline]
    pub(crate) fn any_shadow(&self) -> bool {
        self.any_shadow.load(Ordering::Acquire)
    }

    /// Whether `name` (or, for a tier `api@pro`, its group `api`) is in
    /// shadow mode.
    pub(crate) fn shadowed(&self, name: &str) -> bool {
        if !self.any_shadow() {
            return false;
        }
        let names = self.names.read();
        inherited(name).any(|name| names.get(name).is_some_and(|s| s.shadow))
    }

    /// The tiers of group `group` configured at run time: every name
    /// `<group>@<tier>` with limits, sorted by tier.
    pub(crate) fn tiers_of(&self, group: &str) -> Vec<(String, Arc<[Limit]>)> {
        if self.generation() == 0 {
            return Vec::new();
        }
        let mut tiers: Vec<(String, Arc<[Limit]>)> = self
            .names
            .read()
            .iter()
            .filter_map(|(name, settings)| {
                let (of, tier) = ratewall_grammar::split_tier(name)?;
                (of == group).then(|| Some((tier.to_owned(), settings.limits.clone()?)))?
            })
            .collect();
        tiers.sort_by(|a, b| a.0.cmp(&b.0));
        tiers
    }

    /// The deny-cache setting for a call with these names (a tier's taking
    /// its group's): an explicit off for any of them wins, then an explicit
    /// on; `None` when none is set.
    pub(crate) fn deny_cache<'a>(&self, names: impl Iterator<Item = &'a str>) -> Option<bool> {
        if !self.any_deny.load(Ordering::Acquire) {
            return None;
        }
        let settings = self.names.read();
        let mut verdict = None;
        for name in names.flat_map(inherited) {
            match settings.get(name).and_then(|s| s.deny_cache) {
                Some(false) => return Some(false),
                Some(true) => verdict = Some(true),
                None => {}
            }
        }
        verdict
    }

    /// Changes the lists; bumps the generation when `change` says it changed
    /// something.
    pub(crate) fn update_lists(&self, change: impl FnOnce(&mut Lists) -> bool) -> bool {
        let mut lists = self.lists.write();
        lists.sweep(std::time::SystemTime::now());
        let changed = change(&mut lists);
        self.any_allowed
            .store(lists.any(ListKind::Allow), Ordering::Release);
        self.any_denied
            .store(lists.any(ListKind::Deny), Ordering::Release);
        if changed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        changed
    }

    /// Whether the lists hold an entry of `kind`.
    #[inline]
    pub(crate) fn any_listed(&self, kind: ListKind) -> bool {
        match kind {
            ListKind::Allow => self.any_allowed.load(Ordering::Acquire),
            ListKind::Deny => self.any_denied.load(Ordering::Acquire),
        }
    }

    /// The list entry of `kind` that applies to `identity` (key form) under
    /// `name` now, if any.
    pub(crate) fn listed(&self, kind: ListKind, name: &str, identity: &str) -> Option<Listed> {
        if !self.any_listed(kind) {
            return None;
        }
        self.lists
            .read()
            .check(name, identity, std::time::SystemTime::now())
            .filter(|l| l.kind == kind)
    }

    /// Every list entry.
    pub(crate) fn list_entries(&self) -> Vec<ListEntry> {
        self.lists.read().entries()
    }

    /// Every name with settings.
    pub(crate) fn snapshot(&self) -> Vec<(String, NameSettings)> {
        let mut all: Vec<_> = self
            .names
            .read()
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_bumps_the_generation_once_and_empty_settings_disappear() {
        let registry = Registry::default();
        assert_eq!(registry.generation(), 0);
        assert!(registry.update("sms", |s| s.shadow = true));
        assert!(!registry.update("sms", |s| s.shadow = true), "no change");
        assert_eq!(registry.generation(), 1);
        assert!(registry.shadowed("sms") && !registry.shadowed("login"));
        assert!(registry.update("sms", |s| s.shadow = false));
        assert!(!registry.any_shadow());
        assert!(registry.snapshot().is_empty());
    }

    #[test]
    fn an_explicit_off_for_any_name_of_a_call_wins() {
        let registry = Registry::default();
        assert_eq!(registry.deny_cache(["f"].into_iter()), None);
        registry.update("f", |s| s.deny_cache = Some(true));
        assert_eq!(registry.deny_cache(["g", "f"].into_iter()), Some(true));
        registry.update("ip", |s| s.deny_cache = Some(false));
        assert_eq!(registry.deny_cache(["f", "ip"].into_iter()), Some(false));
    }
}
