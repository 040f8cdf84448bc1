//! The limiter: a thin façade over a [`Pipeline`] (a store and the layers
//! around it) and a [`Registry`] of runtime overrides. It turns what callers
//! hold (a [`CallSpec`] and identities, or [`Request`]s) into a batch of
//! targets, runs it down the pipeline, and turns the answer into a
//! [`Permit`], an [`Admission`], a [`Rejection`] or decisions. It decides
//! nothing itself.

pub(crate) mod builder;
pub(crate) mod call;
pub(crate) mod in_flight;
pub(crate) mod resolve;
pub(crate) mod tier;
pub(crate) mod timer;
pub(crate) mod wait;

#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use smallvec::SmallVec;

use crate::layer::breaker::Breaker;
use crate::layer::{ALL, Answer, Call, Pipeline, Source};
use crate::model::decision::{Decision, Decisions};
use crate::model::error::{Error, LimitError};
use crate::model::key::{Identities, Identity, Key, Part};
use crate::model::limit::Limit;
use crate::model::lists::{ListEntry, ListKind};
use crate::model::policy::FailurePolicy;
use crate::model::rejection::{Name, Rejection};
use crate::model::settings::{Registry, Settings};
use crate::store::backend::Request;
use crate::store::target::{KeyRef, Op, Target};
use builder::LimiterBuilder;
use call::{Admission, CallFuture, CallSpec, Counting, Decided, Permit, Settle};
use resolve::{Resolved, Targets};

static GLOBAL: OnceLock<Limiter> = OnceLock::new();

static NEXT_LIMITER: AtomicU64 = AtomicU64::new(1);

/// Decides calls against limits; see the crate docs for the tour.
///
/// ```
/// use ratewall::{Limit, Limiter};
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
    /// Tells this limiter's cached resolutions from another's.
    pub(crate) id: u64,
    prefix: Box<str>,
    policy: FailurePolicy,
    pub(crate) registry: Arc<Registry>,
    pub(crate) pipeline: Pipeline,
    breaker: Option<Arc<Breaker>>,
    /// The leases of a remote backend's limiter.
    leases: Option<Arc<crate::layer::lease::Leases>>,
    /// Lease ids and the way back to the store of in-flight slots.
    pub(crate) keeper: Arc<in_flight::Keeper>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.pipeline.store)
            .field("prefix", &self.prefix)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Limiter {
    /// Starts configuring a limiter (in-memory backend, prefix `rl`, fail-open).
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// The process-global limiter, once [`LimiterBuilder::install`] has run.
    #[inline]
    pub fn global() -> Result<&'static Limiter, Error> {
        // A match, not `ok_or`: the error is built (and dropped) only when
        // there is no limiter, not on every call of every annotated fn.
        match GLOBAL.get() {
            Some(limiter) => Ok(limiter),
            None => Err(Error::NotInstalled),
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The limiter's default failure policy.
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// The key of `identity` under `scope` (usually the limit's name).
    pub fn key(&self, scope: &str, identity: &dyn fmt::Display) -> Key {
        Key::from_display(&self.prefix, scope, identity)
    }

    /// Whether decisions go to a remote store (a [`Backend`](crate::Backend)
    /// such as Redis): calls then suspend for a round trip, while on the
    /// in-memory store [`CallFuture::now`] always has the result.
    #[inline]
    pub fn is_remote(&self) -> bool {
        self.pipeline.store.is_remote()
    }

    /// Whether the circuit breaker currently skips the backend.
    pub fn circuit_open(&self) -> bool {
        self.breaker.as_ref().is_some_and(|b| b.is_open())
    }

    /// Gives every unused leased unit back to the backend and stops
    /// leasing: later calls are decided by the backend, one round trip
    /// each (see [`Limit::with_lease`]). Call it before the process exits
    /// (e.g. on `SIGTERM`, after the server stopped taking requests).
    /// Dropping a limiter without it gives nothing back: like a process
    /// that dies, its units count as used (a window's until it ends, a
    /// bucket's until time passes them, within the lease TTL). Nothing to
    /// do for a limiter without leases.
    pub async fn shutdown(&self) {
        if let Some(leases) = &self.leases {
            leases.shutdown().await;
        }
    }

    /// Units this process holds unused in its leases now, across
    /// identities and limits (also the `rl_leased_units` gauge, per limit
    /// name, refreshed every twentieth of the lease TTL).
    pub fn leased_units(&self) -> u64 {
        self.leases.as_ref().map_or(0, |l| l.outstanding())
    }

    // ---- the call API ----

    /// Decides one call of `spec`, whose group `i` has identity
    /// `identities[i]` (its `Display` form): every limit of every group in
    /// one round trip, all-or-nothing, through every layer. An admitted
    /// call gets a [`Permit`]; a refused one a [`Rejection`] (over the limit,
    /// or the limiter could not decide and the failure policy refuses).
    ///
    /// On the in-memory store the decision is made before this returns
    /// (the future is ready: [`CallFuture::now`] takes it without polling),
    /// unless the spec waits ([`CallSpec::with_wait`]) and the call has to:
    /// it then behaves as [`Limiter::call_waiting`].
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
    /// let limiter = Limiter::builder().memory().build().unwrap();
    /// let sms = CallSpec::owned("sms", vec![
    ///     GroupSpec::owned("sms_phone", vec![Limit::per_minute(1).unwrap(), Limit::per_hour(5).unwrap()]),
    ///     GroupSpec::owned("sms_ip", vec![Limit::per_hour(20).unwrap()]),
    /// ]);
    /// let phone = "+33612345678";
    /// let ip = std::net::Ipv4Addr::new(192, 0, 2, 7);
    /// assert!(limiter.call(&sms, &[&phone, &ip]).now().unwrap().is_ok());
    /// let refused = limiter.call(&sms, &[&phone, &ip]).now().unwrap().unwrap_err();
    /// assert_eq!(refused.name(), "sms_phone"); // the group that refused
    /// ```
    pub fn call<'l>(
        &'l self,
        spec: &'l CallSpec,
        identities: &[&dyn fmt::Display],
    ) -> CallFuture<'l> {
        if identities.len() != spec.groups().len() {
            let error = LimitError::BadCall(format!(
                "call `{}` has {} group(s) but was given {} identities",
                spec.name(),
                spec.groups().len(),
                identities.len()
            ));
            tracing::error!(call = spec.name(), %error, "rate limit misconfigured");
            return CallFuture::ready(Err(Rejection::unavailable(
                spec.name_cow().clone(),
                Error::Limit(error),
            )));
        }
        let identities: Identities = identities.iter().map(|i| Identity::render(*i)).collect();
        self.call_identities(spec, &identities)
    }

    /// Decides one call of `spec` like [`Limiter::call`], waiting up to
    /// `max_wait` for room instead of being refused (overriding the spec's
    /// own [`CallSpec::with_wait`]); the returned future completes when the
    /// call is admitted, or at once when it cannot be within `max_wait`.
    ///
    /// - **GCRA, token bucket, leaky bucket**: the call reserves the
    ///   earliest slot every limit of the call allows, atomically, in the
    ///   same single round trip as any decision (see [`crate::Backend::reserve`]),
    ///   and sleeps until it: callers queue instead of stampeding, and
    ///   leave at the limit's rate (a leaky bucket with `burst = 1` is a
    ///   true smoother). A slot later than `max_wait` is refused at once,
    ///   with its `retry_after` and nothing reserved. Several limits are
    ///   committed together as of the latest of their earliest times, so
    ///   the slot respects every one of them.
    /// - **Fixed window, sliding window, sliding log**: no queue to join;
    ///   the call retries after each refusal's `retry_after`, until it is
    ///   admitted or the next retry would come after `max_wait` (it is then
    ///   refused at once, never after sleeping past `max_wait`).
    ///
    /// A future dropped while it waits for its slot gives the slot back:
    /// the next call that can use it gets exactly that time (the state
    /// goes back if it was the last slot reserved; otherwise the slot is
    /// kept as given back). In memory this happens in `drop`; on a remote
    /// backend, `drop` spawns the backend call on the tokio runtime the
    /// call was made on (without one, the slot stays taken: the limit
    /// then admits less, never more). Waiting uses a timer thread of its
    /// own, so it works on any executor.
    ///
    /// `Err` (as an unavailable [`Rejection`], logged) for a call that
    /// cannot wait: limits mixing a window algorithm with GCRA or a bucket
    /// (no single time could be reserved on both), or a spec with
    /// [`Counting::Settled`] (a refund could not give back a queued slot),
    /// or a tiered group ([`GroupSpec::tiered`](crate::GroupSpec::tiered): its limits are chosen by
    /// each call, through [`Limiter::call_tiered`], which refuses a spec
    /// that waits the same way), or an in-flight limit
    /// ([`Limit::in_flight`](crate::Limit::in_flight): its slots free when
    /// running calls end, which no wait can be planned on).
    /// [`Permit::waited`] says how long an admitted call waited; the wait
    /// of every admitted waiting call is recorded in `rl_wait_seconds`.
    ///
    /// ```
    /// use ratewall::{Algorithm, CallSpec, GroupSpec, Limit, Limiter};
    /// use std::time::{Duration, Instant};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().build()?;
    /// let smooth = Limit::per_second(20)?.with_algorithm(Algorithm::LeakyBucket)?.with_burst(1)?;
    /// let spec = CallSpec::owned("export", vec![GroupSpec::owned("export", vec![smooth])]);
    /// let start = Instant::now();
    /// for _ in 0..3 {
    ///     limiter.call_waiting(&spec, &[&"tenant-1"], Duration::from_secs(1)).await?;
    /// }
    /// assert!(start.elapsed() >= Duration::from_millis(100)); // one every 50 ms
    /// // A slot further away than the call may wait is refused at once.
    /// let refused = limiter.call_waiting(&spec, &[&"tenant-1"], Duration::from_millis(10)).await.unwrap_err();
    /// assert!(refused.retry_after().unwrap() > Duration::from_millis(10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    pub fn call_waiting<'l>(
        &'l self,
        spec: &'l CallSpec,
        identities: &[&dyn fmt::Display],
        max_wait: std::time::Duration,
    ) -> CallFuture<'l> {
        if identities.len() != spec.groups().len() {
            return self.call(spec, identities);
        }
        let identities: Identities = identities.iter().map(|i| Identity::render(*i)).collect();
        wait::call(self, spec, &identities, max_wait)
    }

    /// [`Limiter::call`] with typed identities: integers and text are
    /// rendered without `core::fmt` (what `#[rate_limit]` expands to, and
    /// what the tower layer passes), anything else through its `Display`.
    /// Every form gives the key its `Display` form would: the two calls
    /// below decide on the same state.
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Limit, Limiter, Part};
    /// let limiter = Limiter::builder().memory().build().unwrap();
    /// let sms = CallSpec::owned("sms", vec![
    ///     GroupSpec::owned("sms_user", vec![Limit::per_minute(1).unwrap()]),
    ///     GroupSpec::owned("sms_ip", vec![Limit::per_hour(20).unwrap()]),
    /// ]);
    /// let admitted = limiter.call_parts(&sms, &[Part::Unsigned(42), Part::Text("192.0.2.7")]);
    /// assert!(admitted.now().unwrap().is_ok());
    /// let ip = std::net::Ipv4Addr::new(192, 0, 2, 7);
    /// let refused = limiter.call(&sms, &[&42u64, &ip]).now().unwrap().unwrap_err();
    /// assert_eq!(refused.name(), "sms_user");
    /// ```
    pub fn call_parts<'l>(&'l self, spec: &'l CallSpec, parts: &[Part<'_>]) -> CallFuture<'l> {
        if parts.len() != spec.groups().len() {
            let shown: SmallVec<[String; 2]> = parts.iter().map(|p| format!("{p:?}")).collect();
            let shown: SmallVec<[&dyn fmt::Display; 2]> =
                shown.iter().map(|s| s as &dyn fmt::Display).collect();
            return self.call(spec, &shown);
        }
        // One key (the common case): no vector.
        if let [part] = parts {
            return self.call_identities(spec, &[Identity::of(*part)]);
        }
        let mut identities = Identities::new();
        for part in parts {
            identities.push(Identity::of(*part));
        }
        self.call_identities(spec, &identities)
    }

    /// [`Limiter::call_parts`] when the call is decided now (the memory
    /// store), handed to `then` where it is made (a permit is large: it is
    /// not moved out first), for a caller that decides before going on
    /// (the tower layer); `None` on a remote store.
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn call_parts_now<'l, R>(
        &'l self,
        spec: &'l CallSpec,
        parts: &[Part<'_>],
        then: impl FnOnce(Decided<'l>) -> R,
    ) -> Option<R> {
        if self.pipeline.store.is_remote() {
            return None;
        }
        // One key of a spec that does not wait: decided here.
        if let ([part], [_], false) = (parts, spec.groups(), spec.waits()) {
            let identities = [Identity::of(*part)];
            return Some(resolve::with(self, spec, |resolved| {
                if resolved.direct
                    && let Some(decided) = self.decide_direct(spec, resolved, &identities[0])
                {
                    return then(decided.map(|decision| self.direct_permit(spec, decision)));
                }
                then(self.decide_now(spec, resolved, &identities))
            }));
        }
        self.call_parts(spec, parts).now().map(then)
    }

    /// [`Limiter::call_parts`] awaited for its admission only (what
    /// `#[rate_limit]` awaits when it keeps no permit): on the memory store
    /// the permit is dropped where it is made, only the admission or the
    /// refusal leaves.
    #[inline]
    pub(crate) fn admit_parts<'l>(
        &'l self,
        spec: &'l CallSpec,
        parts: &[Part<'_>],
    ) -> call::Admitted<'l> {
        // One key of a spec that does not wait, in memory: decided here.
        if let ([part], [_], false, false) = (
            parts,
            spec.groups(),
            spec.waits(),
            self.pipeline.store.is_remote(),
        ) {
            let identities = [Identity::of(*part)];
            return call::Admitted::ready(resolve::with(self, spec, |resolved| {
                if resolved.direct
                    && let Some(admission) = self.decide_direct(spec, resolved, &identities[0])
                {
                    return admission.map(drop);
                }
                self.decide_now(spec, resolved, &identities).map(drop)
            }));
        }
        self.call_parts(spec, parts).admitted()
    }

    /// Decides a call whose identities are rendered.
    #[inline(always)]
    fn call_identities<'l>(
        &'l self,
        spec: &'l CallSpec,
        identities: &[Identity],
    ) -> CallFuture<'l> {
        if spec.waits() {
            return self.call_spec_waiting(spec, identities);
        }
        self.call_now(spec, identities)
    }

    /// [`Limiter::call_identities`] for a spec that waits.
    #[cold]
    #[inline(never)]
    fn call_spec_waiting<'l>(
        &'l self,
        spec: &'l CallSpec,
        identities: &[Identity],
    ) -> CallFuture<'l> {
        wait::call(self, spec, identities, spec.wait().unwrap_or_default())
    }

    /// Decides a call whose identities are rendered, without waiting.
    #[inline]
    pub(crate) fn call_now<'l>(
        &'l self,
        spec: &'l CallSpec,
        identities: &[Identity],
    ) -> CallFuture<'l> {
        if self.pipeline.store.is_remote() {
            return self.call_remote(spec, identities);
        }
        CallFuture::ready(resolve::with(self, spec, |resolved| {
            if resolved.direct
                && let [identity] = identities
                && let Some(decided) = self.decide_direct(spec, resolved, identity)
            {
                return decided.map(|decision| self.direct_permit(spec, decision));
            }
            self.decide_now(spec, resolved, identities)
        }))
    }

    /// Decides a call on the memory store, now.
    #[inline(always)]
    fn decide_now<'l>(
        &'l self,
        spec: &'l CallSpec,
        resolved: &Arc<Resolved>,
        identities: &[Identity],
    ) -> Decided<'l> {
        if resolved.special {
            return self
                .decide_special(spec, resolved, identities)
                .now()
                .expect("a memory store answers now");
        }
        let skipped = resolved.allow_listed(&self.registry, identities);
        let mut targets = Targets::new();
        resolved.fill_targets(identities, |i, _| skipped & (1 << i) == 0, &mut targets);
        if resolved.in_flight {
            self.lease(&mut targets);
        }
        let mut call = Call::new(Op::Acquire, &targets, spec.name(), resolved.policy);
        call.counters = Some(&resolved.counters);
        call.allow_listed = skipped != 0 && skipped == resolved.all_groups();
        let crate::store::Store::Memory(memory) = &self.pipeline.store else {
            unreachable!("decided now only on a memory store");
        };
        let answer = self.pipeline.run_memory(memory, &mut call, resolved.mask);
        self.permit(spec, resolved, identities, skipped, &targets, answer)
    }

    /// Decides a call on the direct lane ([`Resolved::direct`]): one rate
    /// limit on the memory store, nothing around it but observation. The
    /// store decides; an admission is counted here (all the observing
    /// layers would do with it) and anything else goes up through them and
    /// into a rejection as on the full path ([`Limiter::decide_now`]).
    /// `None` when the call is not one for this lane after all.
    #[inline(always)]
    fn decide_direct(
        &self,
        spec: &CallSpec,
        resolved: &Arc<Resolved>,
        identity: &Identity,
    ) -> Option<Result<Decision, Rejection>> {
        self.decide_direct_with(spec, resolved, identity, |decision, _| *decision)
    }

    /// [`Limiter::decide_direct`], with an admission handed to `admitted`
    /// (with its limit) where it is made: a caller that keeps only part of
    /// it (the tower layer) moves neither the decision nor the limit.
    #[inline(always)]
    fn decide_direct_with<T>(
        &self,
        spec: &CallSpec,
        resolved: &Arc<Resolved>,
        identity: &Identity,
        admitted: impl FnOnce(&Decision, &Limit) -> T,
    ) -> Option<Result<T, Rejection>> {
        let (crate::store::Store::Memory(memory), Some(target)) =
            (&self.pipeline.store, resolved.direct_target(identity))
        else {
            return None;
        };
        let decision = memory.acquire_target(&target);
        if decision.allowed {
            crate::layer::counters::count(&resolved.counters.allowed);
            return Some(Ok(admitted(&decision, target.limit)));
        }
        Some(Err(self.refused_direct(spec, resolved, target, decision)))
    }

    /// The permit of a call the direct lane admitted with `decision`.
    #[inline(always)]
    fn direct_permit<'l>(&'l self, spec: &'l CallSpec, decision: Decision) -> Permit<'l> {
        Permit {
            limiter: self,
            spec,
            admission: Admission::Backend(Decisions::one(decision)),
            skipped: 0,
            settle: None,
            waited: std::time::Duration::ZERO,
            tiers: None,
            in_flight: None,
        }
    }

    /// A refusal on the direct lane, observed and turned into a rejection
    /// as any refusal of the store is.
    #[cold]
    #[inline(never)]
    fn refused_direct(
        &self,
        spec: &CallSpec,
        resolved: &Arc<Resolved>,
        target: Target<'_>,
        decision: Decision,
    ) -> Rejection {
        let targets = [target];
        let mut call = Call::new(Op::Acquire, &targets, spec.name(), resolved.policy);
        call.counters = Some(&resolved.counters);
        let mut answer = Answer::Decided {
            decisions: Decisions::one(decision),
            source: Source::Backend,
        };
        self.pipeline.observe(&mut call, resolved.mask, &mut answer);
        // Observing layers leave the answer as it is: the store's refusal,
        // named by the call's one group.
        let group = resolved.groups.first().map(|g| &g.name);
        limited(&targets, 0, decision, None, &|_| {
            Name::from(group.unwrap_or(spec.name_cow()))
        })
    }

    /// On the memory store, a call of `spec` on one key that takes the
    /// direct lane ([`Resolved::direct`]), decided now: what `admitted`
    /// makes of an admission (the store's decision and the limit it
    /// applied), or what `refused` makes of the rejection, made where they
    /// are. `None` for any other call (decide it with
    /// [`Limiter::call_parts_now`]).
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn decide_direct_part<T>(
        &self,
        spec: &CallSpec,
        part: Part<'_>,
        admitted: impl FnOnce(&Decision, &Limit) -> T,
        refused: impl FnOnce(Rejection) -> T,
    ) -> Option<T> {
        if spec.waits() || self.pipeline.store.is_remote() {
            return None;
        }
        let identity = Identity::of(part);
        resolve::with(self, spec, |resolved| {
            if !resolved.direct {
                return None;
            }
            match self.decide_direct_with(spec, resolved, &identity, admitted)? {
                Ok(admitted) => Some(admitted),
                Err(rejection) => Some(refused(rejection)),
            }
        })
    }

    /// Decides a call on the remote store: the future of its round trip.
    fn call_remote<'l>(&'l self, spec: &'l CallSpec, identities: &[Identity]) -> CallFuture<'l> {
        resolve::with(self, spec, |resolved| {
            if resolved.special {
                return self.decide_special(spec, resolved, identities);
            }
            let resolved = resolved.clone();
            let identities: Identities = identities.iter().cloned().collect();
            let skipped = resolved.allow_listed(&self.registry, &identities);
            CallFuture::remote(async move {
                let mut targets = resolved.targets(&identities, skipped);
                if resolved.in_flight {
                    self.lease(&mut targets);
                }
                let mut call = Call::new(Op::Acquire, &targets, spec.name(), resolved.policy);
                call.counters = Some(&resolved.counters);
                call.allow_listed = skipped != 0 && skipped == resolved.all_groups();
                let answer = self.pipeline.run(&mut call, resolved.mask).await;
                self.permit(spec, &resolved, &identities, skipped, &targets, answer)
            })
        })
    }

    /// Gives the in-flight targets of one admission a fresh lease id.
    #[cold]
    fn lease(&self, targets: &mut [Target<'_>]) {
        let lease = self.keeper.lease_id();
        for target in targets.iter_mut().filter(|t| t.limit.is_in_flight()) {
            target.lease = lease;
        }
    }

    /// Waits until every in-flight slot this limiter gave back so far is
    /// back in the store. Slots in memory are back when their permit drops;
    /// in a remote store a dropped permit queues its release, which the
    /// limiter's keeper task sends within about one round trip: await this
    /// where the next call must see the slot free (tests, a graceful
    /// shutdown).
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().build()?;
    /// let jobs = CallSpec::owned("jobs", vec![GroupSpec::owned("jobs", vec![Limit::in_flight(1)?])]);
    /// let running = limiter.call(&jobs, &[&"tenant-7"]).await?;
    /// assert!(limiter.call(&jobs, &[&"tenant-7"]).await.unwrap_err().is_in_flight());
    /// drop(running); // the call ended (or was cancelled)
    /// limiter.flush_in_flight().await;
    /// assert!(limiter.call(&jobs, &[&"tenant-7"]).await.is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    pub async fn flush_in_flight(&self) {
        self.keeper.flush().await;
    }

    /// In-flight leases this limiter holds in a remote store (calls running
    /// now with a slot there).
    pub fn in_flight_leases(&self) -> usize {
        self.keeper.live()
    }

    /// The permit (or rejection) of a call of `spec` that got `answer`.
    #[inline(always)]
    pub(crate) fn permit<'l>(
        &'l self,
        spec: &'l CallSpec,
        resolved: &Arc<Resolved>,
        identities: &[Identity],
        skipped: u64,
        targets: &[Target<'_>],
        answer: Answer,
    ) -> Result<Permit<'l>, Rejection> {
        let admission = match answer {
            // The commonest answer first.
            Answer::Decided {
                decisions,
                source: Source::Backend,
            } if decisions.allowed() => Admission::Backend(decisions),
            answer => self.admission(spec, resolved, skipped, targets, answer)?,
        };
        let settle =
            (spec.counting() == Counting::Settled).then(|| settle(resolved, identities, skipped));
        let mut permit = Permit {
            limiter: self,
            spec,
            admission,
            skipped,
            settle,
            waited: std::time::Duration::ZERO,
            tiers: None,
            in_flight: None,
        };
        // Taken from the admission in place (it is not moved again).
        if resolved.in_flight {
            permit.in_flight = self.keeper.take(targets, &permit.admission);
        }
        Ok(permit)
    }

    /// The admission (or rejection) of every answer but an allowed one
    /// from the store.
    #[inline(never)]
    fn admission(
        &self,
        spec: &CallSpec,
        resolved: &Arc<Resolved>,
        skipped: u64,
        targets: &[Target<'_>],
        answer: Answer,
    ) -> Result<Admission, Rejection> {
        // An owned spec's (or group's) name is copied, not cloned: in place
        // when short.
        let name_of = |index: usize| {
            Name::from(
                resolved
                    .target_origin(index, skipped)
                    .map_or(spec.name_cow(), |(group, _)| {
                        spec.groups()[group].name_cow()
                    }),
            )
        };
        admit(
            || Name::from(spec.name_cow()),
            targets,
            answer,
            resolved.policy,
            name_of,
        )
    }

    /// Gives back what a settled call took, or resets its identities: each
    /// group by its `reset_on_success`, or all of them as `force` says
    /// (`Some(true)`: reset, `Some(false)`: refund).
    pub(crate) async fn settle(
        &self,
        spec: &CallSpec,
        settle: &Settle,
        admission: &Admission,
        force: Option<bool>,
    ) {
        let resolved = &settle.resolved;
        let mut offset = 0;
        for (index, group) in resolved.groups.iter().enumerate() {
            // An allow-listed group took nothing.
            if settle.skipped & (1 << index) != 0 {
                continue;
            }
            let mut targets = Targets::new();
            if settle.chosen.is_empty() {
                resolved.fill_targets(&settle.identities, |i, _| i == index, &mut targets);
            } else {
                resolved.fill_tiered(
                    &settle.identities,
                    &settle.chosen,
                    |i| i == index,
                    &mut targets,
                );
            }
            let range = offset..offset + targets.len();
            offset = range.end;
            let result = if force.unwrap_or(group.reset_on_success) {
                self.reset_targets(spec.name(), &targets, admission, resolved.policy)
                    .await
            } else {
                self.refund_targets(spec.name(), &targets, admission, range, resolved.policy)
                    .await
            };
            if let Err(error) = result {
                tracing::warn!(limit = &*group.name, %error, "rate limit refund or reset failed");
            }
        }
    }

    /// Gives back what `admission` took from `targets` (decisions `range`
    /// of the admission): from the backend, or from the in-process fallback
    /// for a call it admitted (never asking a backend that just failed).
    async fn refund_targets(
        &self,
        name: &str,
        targets: &[Target<'_>],
        admission: &Admission,
        range: std::ops::Range<usize>,
        policy: FailurePolicy,
    ) -> Result<(), Error> {
        let (decisions, local) = match admission {
            Admission::Backend(d) => (d, None),
            Admission::Local { decisions, share } => (decisions, Some(*share)),
            Admission::FailedOpen | Admission::Shadowed(_) | Admission::AllowListed => {
                return Ok(());
            }
        };
        let decisions = decisions.as_slice().get(range).unwrap_or_default();
        let mut times: SmallVec<[u64; 2]> = decisions.iter().map(|d| d.at_micros).collect();
        times.sort_unstable();
        times.dedup();
        for at in times {
            // In-flight slots go back when the permit drops, not here.
            let group: SmallVec<[Target<'_>; 4]> = targets
                .iter()
                .zip(decisions)
                .filter(|(t, d)| d.at_micros == at && !t.limit.is_in_flight())
                .map(|(t, _)| *t)
                .collect();
            if group.is_empty() {
                continue;
            }
            let policy = local.map_or(policy, |share| FailurePolicy::Local { share });
            let mut call = Call::new(Op::Refund(at), &group, name, policy);
            call.local_only = local.is_some();
            applied(self.pipeline.run(&mut call, ALL).await)?;
        }
        Ok(())
    }

    /// Forgets `targets`' state in process and, unless the backend just
    /// failed this call (the admission did not come from it), in the backend.
    async fn reset_targets(
        &self,
        name: &str,
        targets: &[Target<'_>],
        admission: &Admission,
        policy: FailurePolicy,
    ) -> Result<(), Error> {
        // Resetting an in-flight limit would free every caller's slot.
        let kept: SmallVec<[Target<'_>; 4]> = targets
            .iter()
            .filter(|t| !t.limit.is_in_flight())
            .copied()
            .collect();
        if kept.is_empty() {
            return Ok(());
        }
        let targets = &kept[..];
        let mut local = Call::new(Op::Reset, targets, name, policy);
        local.local_only = true;
        applied(self.pipeline.run(&mut local, ALL).await)?;
        if matches!(admission, Admission::Backend(_) | Admission::Shadowed(_)) {
            let mut call = Call::new(Op::Reset, targets, name, policy);
            applied(self.pipeline.run(&mut call, ALL).await)?;
        }
        Ok(())
    }

    // ---- decisions over requests ----

    /// Decides `requests` (named `name` in metrics, logs and rejections)
    /// through every layer and applies the failure policy (`policy`
    /// overrides the limiter's; a runtime [`Limiter::set_policy`] for
    /// `name` wins over both): the call is admitted, or refused with a
    /// [`Rejection`]. [`Limiter::call`] does the same from a [`CallSpec`].
    pub async fn check(
        &self,
        name: &str,
        requests: &[Request<'_>],
        policy: Option<FailurePolicy>,
    ) -> Result<Admission, Rejection> {
        // One request (the commonest check): its one target on the stack.
        if let [request] = requests {
            let targets = [target_of(request, name)];
            return self.check_targets(name, requests, &targets, policy).await;
        }
        let targets = named_targets(requests, Some(name));
        self.check_targets(name, requests, &targets, policy).await
    }

    /// [`Limiter::check`] of `requests` as `targets` (one per request, in
    /// order).
    #[inline(always)]
    async fn check_targets(
        &self,
        name: &str,
        requests: &[Request<'_>],
        targets: &[Target<'_>],
        policy: Option<FailurePolicy>,
    ) -> Result<Admission, Rejection> {
        // Allow-listed keys are not decided (see `Limiter::allow`).
        if self.registry.any_listed(ListKind::Allow) {
            return self.check_listed(name, requests, targets, policy).await;
        }
        let policy = self.policy_for(name, policy);
        let mut call = Call::new(Op::Acquire, targets, name, policy);
        call.given = Some(requests);
        let answer = self.pipeline.run(&mut call, ALL).await;
        // The caller's name, copied only into a rejection.
        admit(
            || Name::copied(name),
            targets,
            answer,
            policy,
            |_| Name::copied(name),
        )
    }

    /// [`Limiter::check`] while the allow list holds an entry: the targets
    /// of allow-listed keys are left out.
    #[cold]
    #[inline(never)]
    async fn check_listed(
        &self,
        name: &str,
        requests: &[Request<'_>],
        given: &[Target<'_>],
        policy: Option<FailurePolicy>,
    ) -> Result<Admission, Rejection> {
        let targets: SmallVec<[Target<'_>; 4]> = given
            .iter()
            .filter(|t| {
                t.key
                    .identity
                    .with_text(|id| self.registry.listed(ListKind::Allow, name, id))
                    .is_none()
            })
            .copied()
            .collect();
        let policy = self.policy_for(name, policy);
        let mut call = Call::new(Op::Acquire, &targets, name, policy);
        call.allow_listed = !given.is_empty() && targets.is_empty();
        call.given = (targets.len() == requests.len()).then_some(requests);
        let answer = self.pipeline.run(&mut call, ALL).await;
        admit(
            || Name::copied(name),
            &targets,
            answer,
            policy,
            |_| Name::copied(name),
        )
    }

    /// Decides one limit for one key, consuming `cost` units when allowed.
    /// Passes every layer; a backend failure is returned as `Err` unless
    /// the failure policy decides in process.
    pub async fn acquire(&self, key: &Key, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        let requests = [Request::new(key, limit, cost)];
        Ok(*self.acquire_all(&requests).await?.binding())
    }

    /// Decides several limits together, all-or-nothing, in one round trip,
    /// and returns every decision (the deny cache, which knows only a
    /// refusal's binding limit, does not answer these).
    pub async fn acquire_all(&self, requests: &[Request<'_>]) -> Result<Decisions, Error> {
        self.decide(Op::Acquire, requests).await
    }

    /// Like [`Limiter::acquire_all`], idempotent by `request_id`: a retry
    /// with the same id (e.g. after a timeout whose reply was lost) gets the
    /// first call's decisions back instead of being charged again. Needs a
    /// backend that implements [`crate::Backend::acquire_once`] (memory and
    /// Redis do).
    pub async fn acquire_all_once(
        &self,
        requests: &[Request<'_>],
        request_id: &str,
    ) -> Result<Decisions, Error> {
        self.decide(Op::AcquireOnce(request_id), requests).await
    }

    /// Evaluates limits without consuming anything.
    pub async fn peek_all(&self, requests: &[Request<'_>]) -> Result<Decisions, Error> {
        self.decide(Op::Peek, requests).await
    }

    /// Gives back what an allowed decision made at `at_micros` consumed.
    pub async fn refund_all(&self, requests: &[Request<'_>], at_micros: u64) -> Result<(), Error> {
        self.apply(Op::Refund(at_micros), requests, false).await
    }

    /// Forgets the state of the given keys and limits in the backend.
    pub async fn reset_all(&self, requests: &[Request<'_>]) -> Result<(), Error> {
        self.apply(Op::Reset, requests, false).await
    }

    /// Forgets the requests' state in the in-process fallback and in the
    /// backend.
    pub async fn reset_everywhere(&self, requests: &[Request<'_>]) -> Result<(), Error> {
        self.apply(Op::Reset, requests, true).await?;
        self.apply(Op::Reset, requests, false).await
    }

    /// Gives back what an admission took: from the backend, or from the
    /// in-process fallback for [`Admission::Local`]; nothing for a
    /// fail-open or shadowed one. Each decision is refunded at its own time.
    pub async fn refund_admission(
        &self,
        requests: &[Request<'_>],
        admission: &Admission,
    ) -> Result<(), Error> {
        let targets = named_targets(requests, None);
        let name = targets.first().map_or("", |t| t.name);
        let policy = self.policy_for(name, None);
        self.refund_targets(name, &targets, admission, 0..targets.len(), policy)
            .await
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
            let requests: SmallVec<[Request<'_>; 4]> =
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
            let requests: SmallVec<[Request<'_>; 4]> =
                limits.iter().map(|l| Request::new(&key, l, 1)).collect();
            self.reset_everywhere(&requests).await
        }
    }

    /// Runs a deciding `op` on `requests`: every decision, or the error.
    async fn decide(&self, op: Op<'_>, requests: &[Request<'_>]) -> Result<Decisions, Error> {
        let targets = named_targets(requests, None);
        let name = targets.first().map_or("", |t| t.name);
        let mut call = Call::new(op, &targets, name, self.policy_for(name, None));
        call.every_decision = true;
        match self.pipeline.run(&mut call, ALL).await {
            Answer::Decided { decisions, .. } | Answer::Shadowed { decisions, .. } => Ok(decisions),
            Answer::Failed(error) | Answer::FailedOpen(error) | Answer::Unavailable(error) => {
                Err(error)
            }
            Answer::Denied { index, .. } => Err(Error::Denied(
                targets
                    .get(index)
                    .map_or_else(String::new, |t| t.name.to_owned()),
            )),
            Answer::Refused { .. } | Answer::Applied { .. } | Answer::AllowListed => {
                Err(Error::Backend(crate::model::error::BackendError::protocol(
                    "no decision for a deciding operation",
                )))
            }
        }
    }

    /// Runs a refund or reset on `requests`, in process only when `local`.
    async fn apply(&self, op: Op<'_>, requests: &[Request<'_>], local: bool) -> Result<(), Error> {
        let targets = named_targets(requests, None);
        let name = targets.first().map_or("", |t| t.name);
        let mut call = Call::new(op, &targets, name, self.policy_for(name, None));
        call.local_only = local;
        applied(self.pipeline.run(&mut call, ALL).await)
    }

    // ---- runtime settings, by name ----

    /// Replaces, for every later decision, the limits of the function or
    /// group named `name` (its `name = ...` in `#[rate_limit]`, by default
    /// `module::function`). Threshold and burst changes apply to the existing
    /// state; a changed algorithm or period starts from fresh state (each
    /// algorithm and period keeps its own key), never a mis-read of the old.
    ///
    /// ```
    /// use ratewall::{Limit, Limiter};
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
        self.registry.limits(name)
    }

    /// Sets, at runtime, the failure policy of `name` (a function's limit
    /// name), over the one given in `#[rate_limit(on_error = ...)]` and the
    /// limiter's default; `None` removes the override.
    pub fn set_policy(&self, name: &str, policy: Option<FailurePolicy>) {
        self.change(name, |s| s.policy = policy);
    }

    /// The policy applied to `name`: runtime override, else `given`, else the default.
    pub fn policy_for(&self, name: &str, given: Option<FailurePolicy>) -> FailurePolicy {
        self.registry.policy(name).or(given).unwrap_or(self.policy)
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
    /// [`LimiterBuilder::deny_cache`]) remembers, for a key and limit the
    /// backend just refused, that it stays refused until its `retry_after`,
    /// and refuses such calls in process (`outcome="rejected"`,
    /// `source="cache"` in `rl_decisions_total`) instead of asking the
    /// backend again. Decisions are unchanged: only what the backend refused
    /// is remembered, from the instant before it was asked, for no longer
    /// than its `retry_after` and re-checked (by one caller) at least every
    /// maximum hold; this limiter's refunds, resets and
    /// [`Limiter::set_limits`] forget the key or name at once. It keeps time
    /// with the process' monotonic clock: turn it off where the backend
    /// decides on a manual clock. A limiter built without it (the memory
    /// store's default) ignores this setting.
    ///
    /// ```
    /// use ratewall::{Limit, Limiter, Request};
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
        self.change(name, |s| s.deny_cache = Some(enabled));
    }

    /// Puts `identity` on the allow list of the limit `name` (`None`: of
    /// every limit), until `expires_at` (`None`: until removed): its calls
    /// bypass that limit (`outcome="allow_listed"`). Replaces an earlier
    /// entry of the identity for that name (an identity is on one list per
    /// name). This limiter applies it from its next call; a remote backend
    /// shares it with every instance of the key prefix, which apply it
    /// within [`LimiterBuilder::lists_refresh`] (plus the time to their next
    /// call). The identity is rendered before the returned future, which is
    /// `Send`.
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
    /// [`Limiter::allow`] is.
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().build()?;
    /// let sms = CallSpec::owned("sms", vec![GroupSpec::owned("sms_phone", vec![Limit::per_hour(5)?])]);
    /// limiter.deny(Some("sms_phone"), &"+33612345678", None).await?;
    /// let refused = limiter.call(&sms, &[&"+33612345678"]).await.unwrap_err();
    /// assert!(refused.is_denied() && refused.retry_after().is_none());
    /// assert!(limiter.unlist(Some("sms_phone"), &"+33612345678").await?);
    /// assert!(limiter.call(&sms, &[&"+33612345678"]).await.is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
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
                identity = %crate::model::mask::Masked(&entry.identity),
                "list entry set"
            );
            self.registry.update_lists(|lists| {
                lists.insert(entry.name.as_deref(), &entry.identity, entry.listed());
                true
            });
            self.lists_changed(entry.name.as_deref());
            Ok(())
        }
    }

    /// Removes `identity` from the lists of the limit `name` (`None`: the
    /// entry for every limit); whether this limiter had it listed.
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
    #[cfg(feature = "config")]
    pub(crate) fn list_locally(&self, entry: ListEntry) {
        let changed = self.registry.update_lists(|lists| {
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
    #[cfg(feature = "config")]
    pub(crate) fn unlist_locally(&self, name: Option<&str>, identity: &str) {
        if self
            .registry
            .update_lists(|lists| lists.remove(name, identity))
        {
            self.lists_changed(name);
        }
    }

    /// Writes a list change to a remote backend (nothing for memory).
    async fn save_list(&self, entry: &ListEntry, removed: bool) -> Result<(), Error> {
        if let crate::store::Store::Remote(backend) = &self.pipeline.store {
            backend
                .save_list_entry(&self.prefix, entry, removed)
                .await?;
        }
        Ok(())
    }

    /// Every allow and deny entry, sorted by name and identity.
    pub fn list_entries(&self) -> Vec<ListEntry> {
        self.registry.list_entries()
    }

    /// Tells the layers that what `name` (or every name) decides changed.
    fn lists_changed(&self, name: Option<&str>) {
        match name {
            Some(name) => self.pipeline.layers().for_each(|l| l.changed(name)),
            None => {
                for (name, _) in self.registry.snapshot() {
                    self.pipeline.layers().for_each(|l| l.changed(&name));
                }
            }
        }
    }

    /// What is set at run time for `name`.
    pub fn settings(&self, name: &str) -> Settings {
        self.registry.get(name)
    }

    /// Every name with runtime settings, sorted by name.
    pub fn overrides(&self) -> Vec<(String, Settings)> {
        self.registry.snapshot()
    }

    /// Changes `name`'s settings and tells every layer.
    fn change(&self, name: &str, change: impl FnOnce(&mut Settings)) {
        if self.registry.update(name, change) {
            for layer in self.pipeline.layers() {
                layer.changed(name);
            }
        }
    }
}

/// The rejection of every call of a spec that can never be decided (logged).
#[cold]
#[inline(never)]
pub(crate) fn misconfigured(spec: &CallSpec, problem: &LimitError) -> Rejection {
    tracing::error!(call = spec.name(), error = %problem, "rate limit misconfigured");
    Rejection::unavailable(spec.name_cow().clone(), Error::Limit(problem.clone()))
}

/// What a settled call keeps to give back what it took.
#[inline(never)]
fn settle(resolved: &Arc<Resolved>, identities: &[Identity], skipped: u64) -> Box<Settle> {
    Box::new(Settle {
        resolved: resolved.clone(),
        identities: identities.iter().cloned().collect(),
        skipped,
        chosen: tier::Chosen::new(),
    })
}

/// A refund's or reset's answer as a result.
fn applied(answer: Answer) -> Result<(), Error> {
    match answer {
        Answer::Failed(error) | Answer::Unavailable(error) | Answer::FailedOpen(error) => {
            Err(error)
        }
        _ => Ok(()),
    }
}

/// The targets of `requests`, each named `name`, or its key's scope.
fn named_targets<'a>(
    requests: &'a [Request<'a>],
    name: Option<&'a str>,
) -> SmallVec<[Target<'a>; 4]> {
    requests
        .iter()
        .map(|r| match name {
            Some(name) => target_of(r, name),
            None => target_of(r, scope_of(r.key.head())),
        })
        .collect()
}

/// The target of `request`, named `name`.
#[inline(always)]
fn target_of<'a>(request: &'a Request<'a>, name: &'a str) -> Target<'a> {
    Target {
        name,
        key: KeyRef::of(request.key),
        limit: request.limit,
        cost: request.cost,
        slot: None,
        lease: request.holder,
    }
}

/// The (escaped) scope of a key head `prefix:{scope:`.
fn scope_of(head: &str) -> &str {
    let open = head.find('{').map_or(0, |i| i + 1);
    head.get(open..head.len().saturating_sub(1)).unwrap_or("")
}

/// An acquire's answer as an admission or a rejection; `name_of(i)` names
/// target `i`'s group (the name a rejection carries).
fn admit<N: Into<Name>, M: Into<Name>>(
    name: impl Fn() -> N,
    targets: &[Target<'_>],
    answer: Answer,
    policy: FailurePolicy,
    name_of: impl Fn(usize) -> M,
) -> Result<Admission, Rejection> {
    match answer {
        Answer::Decided { decisions, source } if decisions.allowed() => Ok(match source {
            Source::Local => Admission::Local {
                decisions,
                share: match policy {
                    FailurePolicy::Local { share } => share,
                    _ => std::num::NonZeroU64::MIN,
                },
            },
            _ => Admission::Backend(decisions),
        }),
        Answer::Decided { decisions, source } => {
            let index = decisions.binding_index();
            // A refusal in process names the limit it applied: the share.
            let share = match (source, policy) {
                (Source::Local, FailurePolicy::Local { share }) => Some(share),
                _ => None,
            };
            Err(limited(
                targets,
                index,
                *decisions.binding(),
                share,
                &name_of,
            ))
        }
        Answer::Refused {
            index, decision, ..
        } => Err(limited(targets, index, decision, None, &name_of)),
        Answer::Shadowed { decisions, .. } => Ok(Admission::Shadowed(decisions)),
        Answer::Denied { index, until } => Err(Rejection::denied_as(name_of(index).into(), until)),
        Answer::AllowListed => Ok(Admission::AllowListed),
        Answer::FailedOpen(_) => Ok(Admission::FailedOpen),
        Answer::Unavailable(error) | Answer::Failed(error) => {
            Err(Rejection::unavailable_as(name().into(), error))
        }
        Answer::Applied { .. } => Err(Rejection::unavailable_as(
            name().into(),
            Error::Backend(crate::model::error::BackendError::protocol(
                "no decision for an acquire",
            )),
        )),
    }
}

/// The rejection of a call refused by target `index` (under the in-process
/// fallback's `share` of its limit, when it decided).
fn limited<N: Into<Name>>(
    targets: &[Target<'_>],
    index: usize,
    decision: Decision,
    share: Option<std::num::NonZeroU64>,
    name_of: &impl Fn(usize) -> N,
) -> Rejection {
    let Some(target) = targets.get(index) else {
        let error = LimitError::BadCall("a refusal of no limit".into());
        return Rejection::unavailable_as(name_of(index).into(), Error::Limit(error));
    };
    let limit = match share {
        Some(share) => crate::layer::failure::local_share(target.limit, share),
        None => *target.limit,
    };
    Rejection::limited_as(name_of(index).into(), decision, limit)
}
