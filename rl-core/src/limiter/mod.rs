//! The limiter: a backend, a key prefix and a failure policy, usually
//! installed once per process as the global limiter the macro uses.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use std::time::Instant;

use crate::backend::{Backend, Request};
use crate::breaker::{Breaker, BreakerConfig, Permission};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Decisions};
use crate::deny_cache::DenyCache;
use crate::error::{BackendError, Error, LimitError};
use crate::key::{Key, valid_prefix};
use crate::limit::Limit;
use crate::mask::Masked;
use crate::memory::MemoryBackend;
use crate::policy::FailurePolicy;
use crate::rejection::Rejection;

static GLOBAL: OnceLock<Limiter> = OnceLock::new();

/// A limit name and its limits in one call.
type NamedLimits<'a> = (&'a str, smallvec::SmallVec<[Limit; 4]>);

enum Store {
    Memory(MemoryBackend),
    Remote(Arc<dyn Backend>),
}

/// Decides calls against limits; see the crate docs for the tour.
///
/// ```
/// use rl_core::{Limit, Limiter};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::builder().memory().prefix("demo").build()?;
/// let limit = Limit::per_minute(2)?;
/// let key = limiter.key("say_hi", &7);
/// assert!(limiter.acquire(&key, &limit, 1).await?.allowed);
/// assert!(limiter.acquire(&key, &limit, 1).await?.allowed);
/// let third = limiter.acquire(&key, &limit, 1).await?;
/// assert!(!third.allowed);
/// assert_eq!(third.retry_after_secs(), 30); // rounded up: waiting that long suffices
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct Limiter {
    store: Store,
    prefix: Box<str>,
    policy: FailurePolicy,
    /// In-process limiter for [`FailurePolicy::Local`].
    fallback: MemoryBackend,
    /// Limits set at runtime by name, replacing the compiled-in ones.
    overrides: RwLock<HashMap<Box<str>, Arc<[Limit]>>>,
    /// Whether `overrides` holds anything (skips the lock on the hot path).
    any_override: AtomicBool,
    /// Failure policies set at runtime by name, over the macro's and the limiter's.
    policies: RwLock<HashMap<Box<str>, FailurePolicy>>,
    any_policy: AtomicBool,
    /// Names in shadow mode: decided and logged, never refused.
    shadowed: RwLock<std::collections::HashSet<Box<str>>>,
    any_shadow: AtomicBool,
    breaker: Breaker,
    /// When each limit name was last published to a remote backend.
    published: parking_lot::Mutex<HashMap<Box<str>, Instant>>,
    /// Refusals remembered locally (see [`Limiter::set_deny_cache`]).
    deny_cache: DenyCache,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend: &dyn fmt::Debug = match &self.store {
            Store::Memory(memory) => memory,
            Store::Remote(remote) => remote,
        };
        f.debug_struct("Limiter")
            .field("backend", backend)
            .field("prefix", &self.prefix)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// How a call got through [`Limiter::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    /// The backend allowed it.
    Backend(Decisions),
    /// The backend failed and the in-process fallback allowed it.
    Local {
        /// The fallback's decisions.
        decisions: Decisions,
        /// The share the fallback divided the limits by.
        share: u64,
    },
    /// The backend failed and the policy let the call through.
    FailedOpen,
    /// Over the limit, but the limit is in shadow mode: nothing was consumed.
    Shadowed(Decisions),
}

impl Admission {
    /// The decisions behind the admission, when there were any.
    pub fn decisions(&self) -> Option<&Decisions> {
        match self {
            Admission::Backend(d)
            | Admission::Local { decisions: d, .. }
            | Admission::Shadowed(d) => Some(d),
            Admission::FailedOpen => None,
        }
    }
}

impl Limiter {
    /// Starts configuring a limiter (in-memory backend, prefix `rl`, fail-open).
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// The process-global limiter, once [`LimiterBuilder::install`] has run.
    pub fn global() -> Result<&'static Limiter, Error> {
        GLOBAL.get().ok_or(Error::NotInstalled)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The failure policy applied by [`Limiter::check`].
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// The key of `identity` under `scope` (usually the limit's name).
    pub fn key(&self, scope: &str, identity: &dyn fmt::Display) -> Key {
        Key::from_display(&self.prefix, scope, identity)
    }

    /// Replaces, for every later decision, the limits of the function or
    /// group named `name` (its `name = ...` in `#[rate_limit]`, by default
    /// `module::function`). Threshold and burst changes apply to the existing
    /// state; a changed algorithm or period starts from fresh state (each
    /// algorithm and period keeps its own key), never a mis-read of the old.
    ///
    /// ```
    /// use rl_core::{Limit, Limiter};
    /// let limiter = Limiter::builder().build().unwrap();
    /// limiter.set_limits("sms", vec![Limit::per_minute(2).unwrap()]).unwrap();
    /// assert!(limiter.set_limits("sms", vec![]).is_err());
    /// assert_eq!(limiter.limits("sms").unwrap()[0].threshold(), 2);
    /// limiter.clear_limits("sms");
    /// assert!(limiter.limits("sms").is_none());
    /// ```
    ///
    /// Refuses an empty list and limits that would share state (see
    /// [`Limit::check_distinct`]).
    pub fn set_limits(&self, name: &str, limits: Vec<Limit>) -> Result<(), LimitError> {
        if limits.is_empty() {
            return Err(LimitError::NoLimits);
        }
        Limit::check_distinct(&limits)?;
        tracing::info!(limit = name, limits = ?limits.iter().map(ToString::to_string).collect::<Vec<_>>(), "limits changed");
        self.overrides.write().insert(name.into(), limits.into());
        self.any_override.store(true, Ordering::Release);
        self.published.lock().remove(name);
        self.deny_cache.forget_name(name);
        Ok(())
    }

    /// Goes back to the compiled-in limits of `name`.
    pub fn clear_limits(&self, name: &str) {
        let mut overrides = self.overrides.write();
        overrides.remove(name);
        self.any_override
            .store(!overrides.is_empty(), Ordering::Release);
        self.deny_cache.forget_name(name);
        self.published.lock().remove(name);
    }

    /// The runtime limits of `name`, if set.
    pub fn limits(&self, name: &str) -> Option<Arc<[Limit]>> {
        if !self.any_override.load(Ordering::Acquire) {
            return None;
        }
        self.overrides.read().get(name).cloned()
    }

    /// The current state of `identity` under `name` for each of `limits`,
    /// without consuming (e.g. an admin page: remaining and reset per limit).
    /// The key is built before the returned future, which is `Send`.
    pub fn peek_identity<'a>(
        &'a self,
        name: &str,
        identity: &dyn fmt::Display,
        limits: &'a [Limit],
    ) -> impl Future<Output = Result<Decisions, Error>> + Send + 'a {
        let key = self.key(name, identity);
        async move {
            let requests: smallvec::SmallVec<[Request<'_>; 4]> =
                limits.iter().map(|l| Request::new(&key, l, 1)).collect();
            self.peek_all(&requests).await
        }
    }

    /// Forgets `identity` under `name` for each of `limits` (e.g. support
    /// staff unblocking a user), in the backend and in the local fallback.
    pub fn reset_identity<'a>(
        &'a self,
        name: &str,
        identity: &dyn fmt::Display,
        limits: &'a [Limit],
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        let key = self.key(name, identity);
        async move {
            let requests: smallvec::SmallVec<[Request<'_>; 4]> =
                limits.iter().map(|l| Request::new(&key, l, 1)).collect();
            self.reset_everywhere(&requests).await
        }
    }

    /// Decides one limit for one key, consuming `cost` units when allowed.
    /// Backend failures are returned as `Err` (no policy is applied).
    pub async fn acquire(&self, key: &Key, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        let requests = [Request::new(key, limit, cost)];
        Ok(*self.acquire_all(&requests).await?.binding())
    }

    /// Decides several limits together, all-or-nothing, in one round trip.
    pub async fn acquire_all(&self, requests: &[Request<'_>]) -> Result<Decisions, Error> {
        validate(requests)?;
        match &self.store {
            Store::Memory(memory) => Ok(memory.acquire_sync(requests)),
            Store::Remote(backend) => Ok(backend.acquire(requests).await?),
        }
    }

    /// Like [`Limiter::acquire_all`], idempotent by `request_id`: a retry
    /// with the same id (e.g. after a timeout whose reply was lost) gets the
    /// first call's decisions back instead of being charged again. Needs a
    /// backend that implements [`Backend::acquire_once`] (memory and Redis do).
    pub async fn acquire_all_once(
        &self,
        requests: &[Request<'_>],
        request_id: &str,
    ) -> Result<Decisions, Error> {
        validate(requests)?;
        match &self.store {
            Store::Memory(memory) => Ok(memory.acquire_once_sync(requests, request_id)?),
            Store::Remote(backend) => Ok(backend.acquire_once(requests, request_id).await?),
        }
    }

    /// Evaluates limits without consuming anything.
    pub async fn peek_all(&self, requests: &[Request<'_>]) -> Result<Decisions, Error> {
        validate(requests)?;
        match &self.store {
            Store::Memory(memory) => Ok(memory.peek_sync(requests)),
            Store::Remote(backend) => Ok(backend.peek(requests).await?),
        }
    }

    /// Gives back what an allowed decision made at `at_micros` consumed.
    pub async fn refund_all(&self, requests: &[Request<'_>], at_micros: u64) -> Result<(), Error> {
        validate(requests)?;
        self.deny_cache.forget(requests);
        match &self.store {
            Store::Memory(memory) => memory.refund_sync(requests, at_micros),
            Store::Remote(backend) => backend.refund(requests, at_micros).await?,
        }
        Ok(())
    }

    /// Forgets the state of the given keys and limits.
    pub async fn reset_all(&self, requests: &[Request<'_>]) -> Result<(), Error> {
        self.deny_cache.forget(requests);
        match &self.store {
            Store::Memory(memory) => memory.reset_sync(requests),
            Store::Remote(backend) => backend.reset(requests).await?,
        }
        Ok(())
    }

    /// Decides like [`Limiter::acquire_all`] and applies the failure policy
    /// (`policy` overrides the limiter's): the call is admitted, or refused
    /// with a [`Rejection`]. Logs and counts every outcome. This is what the
    /// `#[rate_limit]` macro calls.
    pub async fn check(
        &self,
        name: &'static str,
        requests: &[Request<'_>],
        policy: Option<FailurePolicy>,
    ) -> Result<Admission, Rejection> {
        self.check_named(name, &[], requests, policy).await
    }

    /// [`Limiter::check`] where `names[i]` names the limit of `requests[i]`
    /// in rejections and logs (`name` is used for metrics and where `names`
    /// is short).
    pub(crate) async fn check_named(
        &self,
        name: &'static str,
        names: &[&'static str],
        requests: &[Request<'_>],
        policy: Option<FailurePolicy>,
    ) -> Result<Admission, Rejection> {
        if let Some(done) = self.check_in_memory(name, names, requests, policy) {
            return done;
        }
        let deny_since = self.deny_lookup(name, names, requests)?;
        let result = match &self.store {
            Store::Memory(_) => self.acquire_all(requests).await,
            Store::Remote(backend) => {
                let permission = self.breaker.permission();
                if permission == Permission::Skip {
                    Err(Error::Backend(BackendError::unavailable(
                        "circuit open after consecutive backend failures",
                    )))
                } else {
                    let started = Instant::now();
                    let result = self.acquire_all(requests).await;
                    metrics::histogram!("rl_backend_seconds", "limit" => name)
                        .record(started.elapsed().as_secs_f64());
                    match &result {
                        Err(Error::Backend(_)) => self.breaker.failure(permission),
                        _ => {
                            self.breaker.success(permission);
                            // Only once the backend answered: an outage never
                            // costs a call a second timeout.
                            let stale = self.stale_groups(name, names, requests);
                            if !stale.is_empty() {
                                Box::pin(self.publish(&**backend, stale)).await;
                            }
                        }
                    }
                    result
                }
            }
        };
        self.conclude(name, names, requests, policy, deny_since, result)
    }

    /// The whole decision, synchronously, when the store is in memory (so
    /// the macro's plain path needs no future state at all).
    pub(crate) fn check_in_memory(
        &self,
        name: &'static str,
        names: &[&'static str],
        requests: &[Request<'_>],
        policy: Option<FailurePolicy>,
    ) -> Option<Result<Admission, Rejection>> {
        let Store::Memory(memory) = &self.store else {
            return None;
        };
        let deny_since = match self.deny_lookup(name, names, requests) {
            Ok(since) => since,
            Err(rejection) => return Some(Err(rejection)),
        };
        let result = validate(requests)
            .map(|()| memory.acquire_sync(requests))
            .map_err(Error::from);
        Some(self.conclude(name, names, requests, policy, deny_since, result))
    }

    /// The deny cache's verdict before deciding: a remembered refusal, or
    /// the time to remember a new one from (taken before the backend call,
    /// so a remembered refusal never outlives the real one).
    fn deny_lookup(
        &self,
        name: &'static str,
        names: &[&'static str],
        requests: &[Request<'_>],
    ) -> Result<Option<u64>, Rejection> {
        let since = self
            .deny_cache
            .enabled(name, names)
            .then(|| self.deny_cache.now());
        if let Some(now) = since
            && let Some(hit) = self.deny_cache.lookup(requests, now)
        {
            return Err(self.reject_cached(name, names, requests, hit));
        }
        Ok(since)
    }

    /// Turns a backend's answer into an admission or a rejection: counts,
    /// logs, shadow mode, the deny cache and the failure policy.
    fn conclude(
        &self,
        name: &'static str,
        names: &[&'static str],
        requests: &[Request<'_>],
        policy: Option<FailurePolicy>,
        deny_since: Option<u64>,
        result: Result<Decisions, Error>,
    ) -> Result<Admission, Rejection> {
        match result {
            Ok(decisions) if decisions.allowed() => {
                crate::counters::decision(name, "allowed");
                Ok(Admission::Backend(decisions))
            }
            Ok(decisions) if self.shadowed(name, names, &decisions) => {
                metrics::counter!("rl_decisions_total", "limit" => name, "outcome" => "shadow_rejected")
                    .increment(1);
                let retry_after_ms = decisions.binding().retry_after.as_millis() as u64;
                tracing::info!(
                    limit = name,
                    retry_after_ms,
                    "shadow mode: would have rate limited"
                );
                Ok(Admission::Shadowed(decisions))
            }
            Ok(decisions) => {
                if let Some(since) = deny_since {
                    self.deny_cache
                        .remember(name, names, requests, &decisions, since);
                }
                Err(self.reject(name, names, requests, &decisions))
            }
            Err(Error::Limit(error)) => {
                tracing::error!(limit = name, %error, "rate limit misconfigured");
                Err(Rejection::unavailable(name, Error::Limit(error)))
            }
            Err(error) => {
                self.on_failure(name, names, requests, self.policy_for(name, policy), error)
            }
        }
    }

    fn reject(
        &self,
        name: &'static str,
        names: &[&'static str],
        requests: &[Request<'_>],
        decisions: &Decisions,
    ) -> Rejection {
        crate::counters::decision(name, "rejected");
        let binding = decisions.binding();
        let index = decisions.iter().position(|d| d == binding).unwrap_or(0);
        let request = &requests[index];
        let name = names.get(index).copied().unwrap_or(name);
        tracing::info!(
            limit = name,
            identity = %Masked(request.key.identity()),
            rate = %request.limit,
            retry_after_ms = binding.retry_after.as_millis() as u64,
            "rate limited"
        );
        Rejection::limited(name, *binding, *request.limit)
    }

    /// A refusal answered by the deny cache, without the backend.
    fn reject_cached(
        &self,
        name: &'static str,
        names: &[&'static str],
        requests: &[Request<'_>],
        hit: crate::deny_cache::Hit,
    ) -> Rejection {
        crate::counters::decision(name, "rejected_cached");
        let request = &requests[hit.index];
        let name = names.get(hit.index).copied().unwrap_or(name);
        tracing::debug!(
            limit = name,
            identity = %Masked(request.key.identity()),
            retry_after_ms = hit.decision.retry_after.as_millis() as u64,
            "rate limited (remembered refusal)"
        );
        Rejection::limited(name, hit.decision, *request.limit)
    }

    /// Turns the deny cache on or off, at run time, for calls of `name` (a
    /// function's or a group's limit name); an explicit off for any name of
    /// a call wins. Off forgets what was remembered for `name`.
    ///
    /// The deny cache (on by default for remote backends, see
    /// [`LimiterBuilder::deny_cache`]) remembers, for a key and limit the
    /// backend just refused, that it stays refused until its `retry_after`,
    /// and refuses such calls in process (`outcome="rejected_cached"` in
    /// `rl_decisions_total`) instead of asking the backend again. Decisions
    /// are unchanged: only what the backend refused is remembered, from the
    /// instant before it was asked, for no longer than its `retry_after`;
    /// this limiter's refunds, resets and [`Limiter::set_limits`] forget
    /// the key or name at once. It keeps time with the process' monotonic
    /// clock: turn it off where the backend decides on a manual clock.
    ///
    /// ```
    /// use rl_core::{Limit, Limiter, Request};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().deny_cache(true).build()?;
    /// let limit = Limit::per_hour(1)?;
    /// let key = limiter.key("sms", &"+1 555");
    /// let call = [Request::new(&key, &limit, 1)];
    /// assert!(limiter.check("sms", &call, None).await.is_ok());
    /// assert!(limiter.check("sms", &call, None).await.is_err()); // remembered
    /// limiter.set_deny_cache("sms", false); // every call asks the backend again
    /// assert!(limiter.check("sms", &call, None).await.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    pub fn set_deny_cache(&self, name: &str, enabled: bool) {
        self.deny_cache.set(name, enabled);
    }

    fn on_failure(
        &self,
        name: &'static str,
        names: &[&'static str],
        requests: &[Request<'_>],
        policy: FailurePolicy,
        error: Error,
    ) -> Result<Admission, Rejection> {
        metrics::counter!("rl_decisions_total", "limit" => name, "outcome" => "error").increment(1);
        tracing::warn!(limit = name, %error, ?policy, "rate limiter backend failed; applying failure policy");
        match policy {
            FailurePolicy::FailClosed => Err(Rejection::unavailable(name, error)),
            FailurePolicy::Local { share } => {
                metrics::counter!("rl_decisions_total", "limit" => name, "outcome" => "fallback")
                    .increment(1);
                let shared = local_limits(requests, share);
                let local = local_requests(requests, &shared);
                let decisions = self.fallback.acquire_sync(&local);
                if decisions.allowed() {
                    Ok(Admission::Local { decisions, share })
                } else {
                    Err(self.reject(name, names, &local, &decisions))
                }
            }
            _ => Ok(Admission::FailedOpen),
        }
    }

    /// Puts `name` (a function's or a group's limit name) in shadow mode:
    /// its decisions are made, logged and counted as usual
    /// (`outcome="shadow_rejected"`), but never refuse a call — for rolling
    /// out a new limit safely.
    pub fn set_shadow(&self, name: &str, shadow: bool) {
        self.deny_cache.forget_name(name);
        let mut shadowed = self.shadowed.write();
        if shadow {
            shadowed.insert(name.into());
        } else {
            shadowed.remove(name);
        }
        self.any_shadow
            .store(!shadowed.is_empty(), Ordering::Release);
    }

    /// How often a remote backend is told again about a limit name's rates.
    const REPUBLISH: std::time::Duration = std::time::Duration::from_secs(3_600);

    /// The groups of a call whose rates a remote backend has not been told
    /// about within [`Self::REPUBLISH`] (marked as told). Synchronous and
    /// cheap, so the common call carries no publishing state.
    fn stale_groups(
        &self,
        name: &'static str,
        names: &[&'static str],
        requests: &[Request<'_>],
    ) -> Vec<NamedLimits<'static>> {
        let mut published = self.published.lock();
        let mut stale: Vec<NamedLimits<'static>> = Vec::new();
        for (i, request) in requests.iter().enumerate() {
            let group = names.get(i).copied().unwrap_or(name);
            if let Some((_, limits)) = stale.iter_mut().find(|(n, _)| *n == group) {
                limits.push(*request.limit);
            } else if published
                .get(group)
                .is_none_or(|at| at.elapsed() > Self::REPUBLISH)
            {
                published.insert(group.into(), Instant::now());
                stale.push((group, smallvec::smallvec![*request.limit]));
            }
        }
        stale
    }

    /// Tells a remote backend about the rates of `groups` (failures are only
    /// logged, and retried on the next call).
    async fn publish(&self, backend: &dyn Backend, groups: Vec<NamedLimits<'static>>) {
        for (group, limits) in groups {
            if let Err(error) = backend.publish_limits(&self.prefix, group, &limits).await {
                self.published.lock().remove(group);
                tracing::debug!(limit = group, %error, "could not publish limits");
            }
        }
    }

    /// Sets, at runtime, the failure policy of `name` (a function's limit
    /// name), over the one given in `#[rate_limit(on_error = ...)]` and the
    /// limiter's default; `None` removes the override.
    pub fn set_policy(&self, name: &str, policy: Option<FailurePolicy>) {
        let mut policies = self.policies.write();
        match policy {
            Some(policy) => policies.insert(name.into(), policy),
            None => policies.remove(name),
        };
        self.any_policy
            .store(!policies.is_empty(), Ordering::Release);
    }

    /// The policy applied to `name`: runtime override, else `given`, else the default.
    pub fn policy_for(&self, name: &str, given: Option<FailurePolicy>) -> FailurePolicy {
        let runtime = self
            .any_policy
            .load(Ordering::Acquire)
            .then(|| self.policies.read().get(name).copied());
        runtime.flatten().or(given).unwrap_or(self.policy)
    }

    /// Whether a refusal of `name`, or of the refusing group, is shadowed.
    fn shadowed(&self, name: &str, names: &[&'static str], decisions: &Decisions) -> bool {
        if !self.any_shadow.load(Ordering::Acquire) {
            return false;
        }
        let shadowed = self.shadowed.read();
        if shadowed.contains(name) {
            return true;
        }
        let binding = decisions.binding();
        let index = decisions.iter().position(|d| d == binding).unwrap_or(0);
        names
            .get(index)
            .is_some_and(|group| shadowed.contains(*group))
    }

    /// Whether the circuit breaker currently skips the backend.
    pub fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    /// Gives back what an admission took: from the backend, or from the
    /// local fallback for [`Admission::Local`]; nothing for a fail-open one.
    /// Each decision is refunded at its own time.
    pub async fn refund_admission(
        &self,
        requests: &[Request<'_>],
        admission: &Admission,
    ) -> Result<(), Error> {
        match admission {
            Admission::Backend(decisions) => {
                let mut times: smallvec::SmallVec<[u64; 2]> =
                    decisions.iter().map(|d| d.at_micros).collect();
                times.sort_unstable();
                times.dedup();
                for at in times {
                    let group: smallvec::SmallVec<[Request<'_>; 4]> = requests
                        .iter()
                        .zip(decisions.iter())
                        .filter(|(_, d)| d.at_micros == at)
                        .map(|(r, _)| *r)
                        .collect();
                    self.refund_all(&group, at).await?;
                }
            }
            Admission::Local { decisions, share } => {
                let shared = local_limits(requests, *share);
                let local = local_requests(requests, &shared);
                let at = decisions.iter().next().map_or(0, |d| d.at_micros);
                self.fallback.refund_sync(&local, at);
            }
            Admission::FailedOpen | Admission::Shadowed(_) => {}
        }
        Ok(())
    }

    /// Forgets the requests' state in the backend and in the local fallback.
    pub async fn reset_everywhere(&self, requests: &[Request<'_>]) -> Result<(), Error> {
        self.fallback.reset_sync(requests);
        self.reset_all(requests).await
    }
}

fn local_limits(requests: &[Request<'_>], share: u64) -> smallvec::SmallVec<[Limit; 4]> {
    requests
        .iter()
        .map(|r| local_share(r.limit, share))
        .collect()
}

fn local_requests<'a>(
    requests: &[Request<'a>],
    shared: &'a [Limit],
) -> smallvec::SmallVec<[Request<'a>; 4]> {
    requests
        .iter()
        .zip(shared)
        .map(|(r, limit)| Request::new(r.key, limit, r.cost.min(limit.capacity())))
        .collect()
}

/// `limit` with its threshold and burst divided by `share` (at least 1).
fn local_share(limit: &Limit, share: u64) -> Limit {
    let share = share.max(1);
    limit
        .with_threshold((limit.threshold() / share).max(1))
        .and_then(|l| l.with_burst((limit.burst() / share).max(1)))
        .unwrap_or(*limit)
}

fn validate(requests: &[Request<'_>]) -> Result<(), LimitError> {
    requests.iter().try_for_each(|r| r.limit.check_cost(r.cost))
}

/// Configures a [`Limiter`].
#[derive(Debug, Default)]
pub struct LimiterBuilder {
    backend: Option<Arc<dyn Backend>>,
    prefix: Option<String>,
    policy: FailurePolicy,
    clock: Option<Arc<dyn Clock>>,
    breaker: BreakerConfig,
    deny_cache: Option<bool>,
    deny_cache_max_hold: Option<std::time::Duration>,
}

impl LimiterBuilder {
    /// Whether [`Limiter::check`] remembers the backend's refusals and
    /// refuses repeats in process until their `retry_after` (see
    /// [`Limiter::set_deny_cache`]). Default: on for a remote backend, off
    /// for the in-memory one, whose decisions cost about as much as a
    /// remembered refusal and follow the limiter's [`Clock`].
    pub fn deny_cache(mut self, enabled: bool) -> Self {
        self.deny_cache = Some(enabled);
        self
    }

    /// How long a remembered refusal is trusted at most (default 1 s). A
    /// reset made by another process (e.g. `rl-admin reset`) is seen within
    /// this bound; a flood on a refused key reaches the backend at most once
    /// per this period.
    pub fn deny_cache_max_hold(mut self, max_hold: std::time::Duration) -> Self {
        self.deny_cache_max_hold = Some(max_hold);
        self
    }

    /// The circuit breaker in front of a remote backend (default: open after
    /// 5 consecutive failures, for 2 s; [`BreakerConfig::disabled`] to turn off).
    pub fn circuit_breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// Use the in-memory backend (the default when no backend is given).
    pub fn memory(mut self) -> Self {
        self.backend = None;
        self
    }

    /// Use a backend such as `rl_redis::RedisBackend`.
    pub fn backend(mut self, backend: impl Backend) -> Self {
        self.backend = Some(Arc::new(backend));
        self
    }

    /// Use a shared backend.
    pub fn shared_backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// The key prefix (default `rl`): no braces, no whitespace.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// What to do when the backend fails (default: [`FailurePolicy::FailOpen`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The clock of the in-memory backend and of the local fallback
    /// (default: the system clock). Remote backends keep their own time.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> Result<Limiter, Error> {
        let prefix = self.prefix.unwrap_or_else(|| "rl".to_owned());
        if !valid_prefix(&prefix) {
            return Err(Error::BadPrefix(prefix));
        }
        let clock: Arc<dyn Clock> = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let store = match self.backend {
            Some(backend) => Store::Remote(backend),
            None => Store::Memory(MemoryBackend::with_shared_clock(clock.clone())),
        };
        let deny_cache = self.deny_cache.unwrap_or(matches!(store, Store::Remote(_)));
        Ok(Limiter {
            store,
            prefix: prefix.into_boxed_str(),
            policy: self.policy,
            fallback: MemoryBackend::with_shared_clock(clock),
            overrides: RwLock::default(),
            any_override: AtomicBool::new(false),
            policies: RwLock::default(),
            any_policy: AtomicBool::new(false),
            shadowed: RwLock::default(),
            any_shadow: AtomicBool::new(false),
            breaker: Breaker::new(self.breaker),
            published: parking_lot::Mutex::default(),
            deny_cache: DenyCache::with_max_hold(
                deny_cache,
                crate::deny_cache::DEFAULT_CAPACITY,
                self.deny_cache_max_hold
                    .unwrap_or(crate::deny_cache::DEFAULT_MAX_HOLD),
            ),
        })
    }

    /// Builds the limiter and installs it as the process-global one used by
    /// `#[rate_limit]`. Fails if one is already installed.
    pub fn install(self) -> Result<&'static Limiter, Error> {
        let limiter = self.build()?;
        let mut fresh = false;
        let installed = GLOBAL.get_or_init(|| {
            fresh = true;
            limiter
        });
        if fresh {
            Ok(installed)
        } else {
            Err(Error::AlreadyInstalled)
        }
    }
}
