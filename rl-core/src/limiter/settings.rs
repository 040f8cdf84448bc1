//! What a running limiter changes by name ([`Settings`],
//! `limiter.settings()`): limits, failure policies, shadow mode, the deny
//! cache, and the allow and deny lists. Every change applies to the next
//! decision: the registry's generation moves, and each resolved call spec
//! is resolved again.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::limiter::Limiter;
use crate::model::error::{Error, LimitError};
use crate::model::limit::Limit;
use crate::model::lists::{ListEntry, ListKind};
use crate::model::mask::Masked;
use crate::model::policy::FailurePolicy;
use crate::model::settings::NameSettings;
use crate::store::Store;
use crate::store::backend::Block;

/// The runtime settings of one limiter, by name: `limiter.settings()`.
///
/// ```
/// use ratewall::{Limit, Limiter};
/// let limiter = Limiter::builder().build().unwrap();
/// let settings = limiter.settings();
/// settings.set_limits("sms", vec![Limit::per_minute(2).unwrap()]).unwrap();
/// assert!(settings.set_limits("sms", vec![]).is_err());
/// assert_eq!(settings.limits("sms").unwrap()[0].threshold(), 2);
/// settings.clear_limits("sms");
/// assert!(settings.limits("sms").is_none());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Settings<'l> {
    pub(crate) limiter: &'l Limiter,
}

impl<'l> Settings<'l> {
    /// Replaces, for every later decision, the limits of the function or
    /// group named `name` (its `name = ...` in `#[rate_limit]`, by default
    /// `module::function`). Threshold and burst changes apply to the existing
    /// state; a changed algorithm or period starts from fresh state (each
    /// algorithm and period keeps its own key), never a mis-read of the old.
    ///
    /// ```
    /// use ratewall::{Limit, Limiter};
    /// let limiter = Limiter::builder().build().unwrap();
    /// limiter.settings().set_limits("sms", vec![Limit::per_minute(2).unwrap()]).unwrap();
    /// assert!(limiter.settings().set_limits("sms", vec![]).is_err());
    /// assert_eq!(limiter.settings().limits("sms").unwrap()[0].threshold(), 2);
    /// limiter.settings().clear_limits("sms");
    /// assert!(limiter.settings().limits("sms").is_none());
    /// ```
    ///
    /// # Errors
    /// [`LimitError::NoLimits`] for an empty list and
    /// [`LimitError::Overlapping`] for limits that would share state (see
    /// [`Limit::check_distinct`]); the name's limits are then unchanged.
    pub fn set_limits(&self, name: &str, limits: Vec<Limit>) -> Result<(), LimitError> {
        if limits.is_empty() {
            return Err(LimitError::NoLimits);
        }
        Limit::check_distinct(&limits)?;
        tracing::info!(limit = name, limits = ?limits.iter().map(ToString::to_string).collect::<Vec<_>>(), "limits changed");
        let limits: Arc<[Limit]> = limits.into();
        self.change(name, |s| s.limits = Some(limits));
        Ok(())
    }

    /// [`Settings::set_limits`] for what a budget learned of its upstream
    /// ([`crate::upstream::Auto`]): logged at debug level (it may change every second).
    pub(crate) fn apply_learned(&self, name: &str, limits: Vec<Limit>) -> Result<(), LimitError> {
        Limit::check_distinct(&limits)?;
        let limits: Arc<[Limit]> = limits.into();
        self.change(name, |s| s.limits = Some(limits));
        Ok(())
    }

    /// Goes back to the compiled-in limits of `name`.
    pub fn clear_limits(&self, name: &str) {
        self.change(name, |s| s.limits = None);
    }

    /// The runtime limits of `name`, if set.
    pub fn limits(&self, name: &str) -> Option<Arc<[Limit]>> {
        self.limiter.registry.limits(name)
    }

    /// Sets, at runtime, the failure policy of `name` (a function's limit
    /// name), over the one given in `#[rate_limit(on_error = ...)]` and the
    /// limiter's default; `None` removes the override.
    pub fn set_policy(&self, name: &str, policy: Option<FailurePolicy>) {
        self.change(name, |s| s.policy = policy);
    }

    /// The policy applied to `name`: runtime override, else `given`, else the default.
    pub fn policy_for(&self, name: &str, given: Option<FailurePolicy>) -> FailurePolicy {
        self.limiter
            .registry
            .policy(name)
            .or(given)
            .unwrap_or(self.limiter.policy)
    }

    /// Puts `name` (a function's or a group's limit name) in shadow mode:
    /// its decisions are made, logged and counted as usual
    /// (`outcome="shadow_rejected"`), but never refuse a call — for rolling
    /// out a new limit safely.
    pub fn set_shadow(&self, name: &str, shadow: bool) {
        self.change(name, |s| s.shadow = shadow);
    }

    /// Turns the deny cache on or off, at run time, for calls of `name` (a
    /// function's or a group's limit name); an explicit off for any name of
    /// a call wins. Off forgets what was remembered for `name`.
    ///
    /// The deny cache (on by default for remote backends, see
    /// [`LimiterBuilder::deny_cache`](crate::builder::LimiterBuilder::deny_cache)) remembers, for a key and limit the
    /// backend just refused, that it stays refused until its `retry_after`,
    /// and refuses such calls in process (`outcome="rejected"`,
    /// `source="cache"` in `ratewall_decisions_total`) instead of asking the
    /// backend again. Decisions are unchanged: only what the backend refused
    /// is remembered, from the instant before it was asked, for no longer
    /// than its `retry_after` and re-checked (by one caller) at least every
    /// maximum hold; this limiter's refunds, resets and
    /// [`Settings::set_limits`](crate::settings::Settings::set_limits) forget the key or name at once.
    /// Another instance's refunds and resets (settled estimates included)
    /// are forgotten as the backend tells of them
    /// ([`Backend::subscribe_refunds`](crate::backend::Backend::subscribe_refunds)):
    /// on Redis within one pub/sub delivery, typically a few milliseconds
    /// (see `ratewall_redis::RedisBackendBuilder::refund_notices`); a
    /// notice lost while the subscription is down, or a backend that tells
    /// nothing, within the maximum hold
    /// ([`LimiterBuilder::deny_cache_max_hold`](crate::builder::LimiterBuilder::deny_cache_max_hold),
    /// 1 s by default). It keeps time
    /// with the process' monotonic clock: turn it off where the backend
    /// decides on a manual clock. A limiter built without it (the memory
    /// store's default) ignores this setting.
    ///
    /// ```
    /// use ratewall::{Limit, Limiter, backend::Request};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().deny_cache(true).build()?;
    /// let limit = Limit::per_hour(1)?;
    /// let key = limiter.key("sms", &"+1 555");
    /// let call = [Request::new(&key, &limit, 1)];
    /// assert!(limiter.requests().check("sms", &call, None).await.is_ok());
    /// assert!(limiter.requests().check("sms", &call, None).await.is_err()); // remembered
    /// limiter.settings().set_deny_cache("sms", false); // every call asks the backend again
    /// assert!(limiter.requests().check("sms", &call, None).await.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    pub fn set_deny_cache(&self, name: &str, enabled: bool) {
        self.change(name, |s| s.deny_cache = Some(enabled));
    }

    /// Puts `identity` on the allow list of the limit `name` (`None`: of
    /// every limit), until `expires_at` (`None`: until removed): its calls
    /// bypass that limit (`outcome="allow_listed"`). Replaces an earlier
    /// entry of the identity for that name (an identity is on one list per
    /// name). This limiter applies it from its next call; a remote backend
    /// shares it with every instance of the key prefix, which apply it
    /// within [`LimiterBuilder::lists_refresh`](crate::builder::LimiterBuilder::lists_refresh) (plus the time to their next
    /// call). The identity is rendered before the returned future, which is
    /// `Send`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the limiter's remote backend cannot save the
    /// entry; this limiter's lists are then unchanged too. A limiter on the
    /// memory store does not fail.
    pub fn allow<'a>(
        &'a self,
        name: Option<&str>,
        identity: &dyn fmt::Display,
        expires_at: Option<std::time::SystemTime>,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        self.list(ListKind::Allow, name, identity, expires_at)
    }

    /// Puts `identity` on the deny list of the limit `name` (`None`: of
    /// every limit), until `expires_at` (`None`: until removed): its calls
    /// are refused at once, without asking the backend
    /// ([`crate::RejectionReason::Denied`]; over HTTP `403`, with a
    /// `Retry-After` only when the entry expires). Shared as
    /// [`Settings::allow`](crate::settings::Settings::allow) is.
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().build()?;
    /// let sms = CallSpec::owned("sms", vec![GroupSpec::owned("sms_phone", vec![Limit::per_hour(5)?])]);
    /// limiter.settings().deny(Some("sms_phone"), &"+33612345678", None).await?;
    /// let refused = limiter.call(&sms, &[&"+33612345678"]).await.unwrap_err();
    /// assert!(refused.is_denied() && refused.retry_after().is_none());
    /// assert!(limiter.settings().unlist(Some("sms_phone"), &"+33612345678").await?);
    /// assert!(limiter.call(&sms, &[&"+33612345678"]).await.is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    ///
    /// # Errors
    /// As [`Settings::allow`](crate::settings::Settings::allow).
    pub fn deny<'a>(
        &'a self,
        name: Option<&str>,
        identity: &dyn fmt::Display,
        expires_at: Option<std::time::SystemTime>,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        self.list(ListKind::Deny, name, identity, expires_at)
    }

    fn list<'a>(
        &'a self,
        kind: ListKind,
        name: Option<&str>,
        identity: &dyn fmt::Display,
        expires_at: Option<std::time::SystemTime>,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        let entry = ListEntry::new(
            kind,
            name,
            crate::model::lists::key_form(identity),
            expires_at,
        );
        async move {
            self.save_list(&entry, false).await?;
            tracing::info!(
                list = kind.name(),
                limit = entry.name.as_deref().unwrap_or("*"),
                identity = %Masked(&entry.identity),
                "list entry set"
            );
            self.limiter.registry.update_lists(|lists| {
                lists.insert(entry.name.as_deref(), &entry.identity, entry.listed());
                true
            });
            self.lists_changed(entry.name.as_deref());
            Ok(())
        }
    }

    /// Removes `identity` from the lists of the limit `name` (`None`: the
    /// entry for every limit); whether this limiter had it listed.
    ///
    /// # Errors
    /// [`Error::Backend`] when the limiter's remote backend cannot save the
    /// removal; this limiter's lists are then unchanged too. A limiter on the
    /// memory store does not fail.
    pub fn unlist<'a>(
        &'a self,
        name: Option<&str>,
        identity: &dyn fmt::Display,
    ) -> impl Future<Output = Result<bool, Error>> + Send + 'a {
        let entry = ListEntry::new(
            ListKind::Deny,
            name,
            crate::model::lists::key_form(identity),
            None,
        );
        async move {
            self.save_list(&entry, true).await?;
            let removed = self
                .limiter
                .registry
                .update_lists(|lists| lists.remove(entry.name.as_deref(), &entry.identity));
            if removed {
                self.lists_changed(entry.name.as_deref());
            }
            Ok(removed)
        }
    }

    /// Sets a list entry on this limiter only (e.g. from its limits file,
    /// which every instance reads for itself).
    #[cfg(feature = "serde")]
    pub(crate) fn list_locally(&self, entry: ListEntry) {
        let changed = self.limiter.registry.update_lists(|lists| {
            let listed = entry.listed();
            let name = entry.name.as_deref();
            let same = lists.check(
                name.unwrap_or(""),
                &entry.identity,
                std::time::SystemTime::now(),
            ) == Some(listed);
            lists.insert(name, &entry.identity, listed);
            !same
        });
        if changed {
            self.lists_changed(entry.name.as_deref());
        }
    }

    /// Removes a list entry from this limiter only.
    #[cfg(feature = "serde")]
    pub(crate) fn unlist_locally(&self, name: Option<&str>, identity: &str) {
        if self
            .limiter
            .registry
            .update_lists(|lists| lists.remove(name, identity))
        {
            self.lists_changed(name);
        }
    }

    /// Writes a list change to a remote backend (nothing for memory).
    async fn save_list(&self, entry: &ListEntry, removed: bool) -> Result<(), Error> {
        if let crate::store::Store::Remote(backend) = &self.limiter.pipeline.store {
            backend
                .save_list_entry(&self.limiter.prefix, entry, removed)
                .await?;
        }
        Ok(())
    }

    /// The blocks of `identity` under the limit `name` (a function's, a
    /// group's or a tier's `<group>@<tier>`) that have not ended: one per
    /// limit of `name` that refused it and blocks ([`Limit::with_block`]),
    /// with the time left by the store's clock, sorted by the limit's
    /// storage suffix; empty when it is not blocked. Read from the store
    /// every instance shares (a remote backend's, or the memory store). The
    /// identity is rendered before the returned future, which is `Send`.
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
    /// use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().build()?;
    /// let login = Limit::per_minute(1)?.with_block(Duration::from_secs(900))?;
    /// let spec = CallSpec::owned("login", vec![GroupSpec::owned("login_user", vec![login])]);
    /// limiter.call(&spec, &[&"alice"]).await?;
    /// let refused = limiter.call(&spec, &[&"alice"]).await.unwrap_err();
    /// assert_eq!(refused.retry_after(), Some(Duration::from_secs(900))); // blocked for 15 minutes
    /// let blocks = limiter.settings().blocked("login_user", &"alice").await?;
    /// assert_eq!((blocks.len(), blocks[0].suffix.as_str()), (1, "gc:60000000"));
    /// assert!(limiter.settings().unblock("login_user", &"alice").await?);
    /// assert!(limiter.settings().blocked("login_user", &"alice").await?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`] when the limiter's remote backend cannot answer.
    pub fn blocked<'a>(
        &'a self,
        name: &str,
        identity: &dyn fmt::Display,
    ) -> impl Future<Output = Result<Vec<Block>, Error>> + Send + 'a {
        let key = self.limiter.key(name, identity);
        async move {
            Ok(match &self.limiter.pipeline.store {
                Store::Memory(memory) => memory.blocks_sync(&key),
                Store::Remote(backend) => backend.blocks(&key).await?,
            })
        }
    }

    /// Lifts every block of `identity` under the limit `name` (see
    /// [`Settings::blocked`]; the limits' state is kept: a reset forgets
    /// both), in the store every instance shares, in this limiter's
    /// in-process fallback, and from its deny cache; whether a block had not
    /// ended. A call of this limiter named `name` that waits for room tries
    /// again at once (and one waiting under the key, where the limiter
    /// hears refund notices). The other instances forget their remembered refusals of the
    /// identity as the backend tells of a lifted block, as of a reset
    /// ([`Backend::subscribe_refunds`](crate::backend::Backend::subscribe_refunds):
    /// `ratewall_redis` does); a backend that tells nothing, or a notice
    /// lost, leaves another instance's deny cache refusing for at most its
    /// maximum hold (1 s by default). The identity is rendered before the
    /// returned future, which is `Send`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the limiter's remote backend cannot lift
    /// them; this limiter's in-process fallback and deny cache forget them
    /// all the same.
    pub fn unblock<'a>(
        &'a self,
        name: &str,
        identity: &dyn fmt::Display,
    ) -> impl Future<Output = Result<bool, Error>> + Send + 'a {
        let key = self.limiter.key(name, identity);
        let name: Box<str> = name.into();
        async move {
            let lifted = match &self.limiter.pipeline.store {
                Store::Memory(memory) => Ok(memory.unblock_sync(&key)),
                Store::Remote(backend) => backend.unblock(&key).await,
            };
            for layer in self.limiter.pipeline.layers() {
                layer.unblocked(&key);
            }
            let lifted = lifted?;
            if lifted {
                // Calls waiting under the name or the key try again.
                self.limiter.room.freed(&name);
                self.limiter.room.freed_key(key.as_str());
            }
            tracing::info!(
                limit = &*name,
                identity = %Masked(key.identity()),
                lifted,
                "blocks lifted"
            );
            Ok(lifted)
        }
    }

    /// Every allow and deny entry, sorted by name and identity.
    pub fn list_entries(&self) -> Vec<ListEntry> {
        self.limiter.registry.list_entries()
    }

    /// Tells the layers that what `name` (or every name) decides changed.
    fn lists_changed(&self, name: Option<&str>) {
        match name {
            Some(name) => self.limiter.pipeline.layers().for_each(|l| l.changed(name)),
            None => {
                for (name, _) in self.limiter.registry.snapshot() {
                    self.limiter
                        .pipeline
                        .layers()
                        .for_each(|l| l.changed(&name));
                }
            }
        }
    }

    /// What is set at run time for `name`.
    pub fn of(&self, name: &str) -> NameSettings {
        self.limiter.registry.get(name)
    }

    /// Every name with runtime settings, sorted by name.
    pub fn all(&self) -> Vec<(String, NameSettings)> {
        self.limiter.registry.snapshot()
    }

    /// Changes `name`'s settings and tells every layer.
    fn change(&self, name: &str, change: impl FnOnce(&mut NameSettings)) {
        if self.limiter.registry.update(name, change) {
            for layer in self.limiter.pipeline.layers() {
                layer.changed(name);
            }
        }
    }
}
