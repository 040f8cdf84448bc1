//! The limiter: a thin façade over a [`Pipeline`] (a store and the layers
//! around it) and a [`Registry`] of runtime overrides. A call takes one
//! road ([`attempt`]): its spec resolved once per thread, its keys made
//! into targets, the targets run down the pipeline, the answer made into a
//! [`Permit`] or a [`Rejection`]. It decides nothing itself.
//!
//! Its public surface is split by use: calling (here), raw requests
//! ([`Requests`], `limiter.requests()`) and what a running limiter changes
//! by name ([`Settings`], `limiter.settings()`).

pub(crate) mod admission;
pub(crate) mod attempt;
pub(crate) mod auto;
pub(crate) mod builder;
pub(crate) mod call;
pub(crate) mod heard;
pub(crate) mod in_flight;
#[cfg_attr(
    not(any(feature = "tower", feature = "reqwest")),
    allow(
        dead_code,
        reason = "the client integrations (tower, reqwest) call out through it; `Draw` is public"
    )
)]
pub(crate) mod outbound;
pub(crate) mod requests;
pub(crate) mod resolve;
pub(crate) mod room;
pub(crate) mod settings;
pub(crate) mod settle;
pub(crate) mod spec;
pub(crate) mod tier;
pub(crate) mod timer;
pub(crate) mod upstream;
pub(crate) mod wait;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::layer::breaker::Breaker;
use crate::layer::{LaneRefusal, Pipeline};
use crate::model::decision::Decision;
use crate::model::error::{Error, LimitError};
use crate::model::key::{Identity, Key};
use crate::model::policy::FailurePolicy;
use crate::model::rejection::{Name, Rejection};
use crate::model::settings::Registry;
use crate::store::Store;
use crate::store::memory::MemoryBackend;
use crate::store::target::{Op, Target};
use attempt::Attempt;
use builder::LimiterBuilder;
use call::{CallFuture, Keys};
use requests::Requests;
use resolve::Resolved;
use settings::Settings;
use spec::CallSpec;

static GLOBAL: OnceLock<Limiter> = OnceLock::new();

static NEXT_LIMITER: AtomicU64 = AtomicU64::new(1);

/// Decides calls against limits; see the crate docs for the tour.
///
/// ```
/// use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::builder().memory().prefix("demo").build()?;
/// let say_hi = CallSpec::owned("say_hi", vec![GroupSpec::owned("say_hi", vec![Limit::per_minute(2)?])]);
/// assert!(limiter.call(&say_hi, &[&7]).await.is_ok());
/// assert!(limiter.call(&say_hi, &[&7]).await.is_ok());
/// let third = limiter.call(&say_hi, &[&7]).await.unwrap_err();
/// assert_eq!(third.decision().unwrap().retry_after_secs(), 30); // rounded up: waiting that long suffices
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct Limiter {
    /// Tells this limiter's cached resolutions from another's.
    pub(crate) id: u64,
    pub(crate) prefix: Box<str>,
    pub(crate) policy: FailurePolicy,
    pub(crate) registry: Arc<Registry>,
    pub(crate) pipeline: Pipeline,
    breaker: Option<Arc<Breaker>>,
    /// The leases of a remote backend's limiter.
    leases: Option<Arc<crate::layer::lease::Leases>>,
    /// Lease ids and the way back to the store of in-flight slots.
    pub(crate) keeper: Arc<in_flight::Keeper>,
    /// Calls given up on, taken back once a remote store answers again.
    pub(crate) abandoned: Option<Arc<crate::layer::abandon::Abandoned>>,
    /// Whether every remote call carries a request id (else only settled
    /// ones).
    pub(crate) cancel_every_call: bool,
    /// Calls waiting for room, woken when a refund gives some back.
    pub(crate) room: Arc<room::Room>,
    /// What this limiter does with its store's notices of room given back
    /// by other processes, when the store tells of them (held: the store
    /// holds it weakly).
    #[allow(
        dead_code,
        reason = "held, never read: the store's notices reach it while it lives"
    )]
    heard: Option<Arc<heard::Heard>>,
    /// Pauses heard by this process: they move the calls sleeping until a
    /// slot inside one.
    pub(crate) pauses: room::Pauses,
    /// What the raw requests' keys remember of the memory store.
    pub(crate) remembered: requests::Remembering,
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
    /// Starts configuring a limiter (in-memory backend, prefix `ratewall`, fail-open).
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// The process-global limiter, once [`LimiterBuilder::install`] has run.
    ///
    /// # Errors
    /// [`Error::NotInstalled`] until [`LimiterBuilder::install`] has run.
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

    /// Whether decisions go to a remote store (a [`Backend`](crate::backend::Backend)
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
    /// each (see [`Limit::with_lease`](crate::Limit::with_lease)). Call it
    /// before the process exits (e.g. on `SIGTERM`, after the server stopped
    /// taking requests). Dropping a limiter without it gives nothing back:
    /// like a process that dies, its units count as used (a window's until
    /// it ends, a bucket's until time passes them, within the lease TTL).
    /// Nothing to do for a limiter without leases.
    pub async fn shutdown(&self) {
        if let Some(leases) = &self.leases {
            leases.shutdown().await;
        }
    }

    /// Units this process holds unused in its leases now, across
    /// identities and limits (also the `ratewall_leased_units` gauge, per limit
    /// name, refreshed every twentieth of the lease TTL).
    pub fn leased_units(&self) -> u64 {
        self.leases.as_ref().map_or(0, |l| l.outstanding())
    }

    /// Decisions over requests the caller builds ([`Requests`]): keys and
    /// limits rather than a [`CallSpec`].
    pub fn requests(&self) -> Requests<'_> {
        Requests { limiter: self }
    }

    /// What this limiter changes at run time, by name ([`Settings`]):
    /// limits, failure policies, shadow mode, the deny cache, allow and
    /// deny lists.
    pub fn settings(&self) -> Settings<'_> {
        Settings { limiter: self }
    }

    // ---- the call API ----

    /// Decides one call of `spec`, whose group `i` has identity
    /// `identities[i]` (its `Display` form): every limit of every group in
    /// one round trip, all-or-nothing, through every layer. An admitted
    /// call gets a [`Permit`](call::Permit); a refused one a [`Rejection`]
    /// (over the limit, or the limiter could not decide and the failure
    /// policy refuses). [`Limiter::call_with`] takes the other forms of a
    /// call: typed identities, tiers, a wait.
    ///
    /// On the in-memory store the decision is made before this returns
    /// (the future is ready: [`CallFuture::now`] takes it without polling),
    /// unless the spec waits ([`CallSpec::with_wait`]) and the call has to.
    /// The future is `Send` (it borrows the limiter and the spec, not the
    /// identities, which are read before this returns).
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
    #[inline]
    pub fn call<'l>(
        &'l self,
        spec: &'l CallSpec,
        identities: &[&(dyn fmt::Display + Sync)],
    ) -> CallFuture<'l> {
        self.call_with(spec, Keys::new(identities))
    }

    /// Decides one call of `spec` with its [`Keys`]: an identity per group
    /// (through `Display`, or typed: integers and text without `core::fmt`),
    /// the tier of each tiered group, and how long the call may wait for
    /// room. What [`Limiter::call`], `#[rate_limit]` and the tower layer
    /// all call: one road for every shape of call.
    ///
    /// **Tiers.** A tiered group ([`GroupSpec::tiered`](spec::GroupSpec::tiered))
    /// is decided by the limits of the tier the call gives it
    /// ([`Keys::tiers`]; no tier, or an unknown one: the group's `default`
    /// tier, else the failure policy answers, see [`Tier`](spec::Tier)).
    ///
    /// **Waiting** ([`Keys::wait`], or the spec's [`CallSpec::with_wait`]):
    /// a call that would be refused waits for room instead, up to its
    /// maximum wait; the future completes when the call is admitted, or at
    /// once when it cannot be within the wait.
    ///
    /// - **GCRA, token bucket, leaky bucket**: the call reserves the
    ///   earliest slot every limit of the call allows, atomically, in the
    ///   same single round trip as any decision (see
    ///   [`crate::backend::Backend::reserve`]), and sleeps until it: callers queue
    ///   instead of stampeding, and leave at the limit's rate (a leaky bucket
    ///   with `burst = 1` is a true smoother). A slot later than the wait is
    ///   refused at once, with its `retry_after` and nothing reserved.
    ///   Several limits are committed together as of the latest of their
    ///   earliest times, so the slot respects every one of them.
    /// - **Fixed window, sliding window, sliding log**: no queue to join;
    ///   the call retries after each refusal's `retry_after`, until it is
    ///   admitted or the next retry would come after the wait (it is then
    ///   refused at once, never after sleeping past it); sooner when room
    ///   is given back under its keys, by this process or, as a remote
    ///   store tells, by another (on Redis within one pub/sub delivery:
    ///   see [`Permit::settle`](call::Permit::settle)).
    /// - A tiered call waits on the limits of the tiers it is decided by.
    ///
    /// A future dropped while it waits for its slot gives the slot back:
    /// the next call that can use it gets exactly that time. In memory this
    /// happens in `drop`; on a remote backend, `drop` spawns the backend
    /// call on the tokio runtime the call was made on (without one, the slot
    /// stays taken: the limit then admits less, never more). Waiting uses a
    /// timer thread of its own, so it works on any executor.
    ///
    /// A call that cannot wait is refused as unavailable (logged): limits
    /// mixing a window algorithm with GCRA or a bucket (no single time could
    /// be reserved on both), [`Counting::Settled`](spec::Counting::Settled)
    /// (a refund could not give back a queued slot), or an in-flight limit
    /// (its slots free when running calls end, which no wait can be planned
    /// on). [`Permit::waited`](call::Permit::waited) says how long an
    /// admitted call waited; `ratewall_wait_seconds` records it.
    ///
    /// ```
    /// use ratewall::{Algorithm, CallSpec, GroupSpec, Keys, Limit, Limiter, call::Tier};
    /// use std::time::{Duration, Instant};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().build()?;
    /// let smooth = |n| Limit::per_second(n)?.with_algorithm(Algorithm::LeakyBucket)?.with_burst(1);
    /// let export = CallSpec::owned("export", vec![GroupSpec::owned_tiered("export", vec![
    ///     Tier::owned("free", vec![smooth(10)?]),
    ///     Tier::owned("pro", vec![smooth(1000)?]),
    /// ])]);
    /// let start = Instant::now();
    /// for _ in 0..3 {
    ///     let keys = Keys::new(&[&"tenant-1"]).tiers(&["free"]).wait(Duration::from_secs(1));
    ///     limiter.call_with(&export, keys).await?;
    /// }
    /// assert!(start.elapsed() >= Duration::from_millis(200)); // one every 100 ms
    /// // A slot further away than the call may wait is refused at once.
    /// let keys = Keys::new(&[&"tenant-1"]).tiers(&["free"]).wait(Duration::from_millis(10));
    /// let refused = limiter.call_with(&export, keys).await.unwrap_err();
    /// assert!(refused.retry_after().unwrap() > Duration::from_millis(10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    #[inline]
    pub fn call_with<'l>(&'l self, spec: &'l CallSpec, keys: Keys<'_>) -> CallFuture<'l> {
        // One typed key of a one-group spec that does not wait (what the
        // macro and the tower layer pass): nothing to check or render
        // first.
        if let Some(part) = keys.direct(spec) {
            return self.decide_once(spec, &[Identity::of(part)], &[], &[]);
        }
        if let Err(rejection) = keys.check(spec) {
            return CallFuture::ready(Err(rejection));
        }
        let costs = keys.call_costs();
        keys.with_tiers(|tiers| {
            keys.with_identities(|identities| {
                self.decide(spec, identities, tiers, costs, keys.max_wait())
            })
        })
    }

    /// Decides a call whose identities and tiers are rendered, waiting up
    /// to `wait` (else the spec's wait) for room.
    #[inline(always)]
    fn decide<'l>(
        &'l self,
        spec: &'l CallSpec,
        identities: &[Identity],
        tiers: &[&str],
        costs: &[u64],
        wait: Option<Duration>,
    ) -> CallFuture<'l> {
        // A wait of zero, given for this call, over a spec that waits:
        // this call does not.
        let waits = match wait {
            Some(max_wait) => !max_wait.is_zero(),
            None => spec.waits(),
        };
        if waits {
            return self.decide_waiting(spec, identities, tiers, costs, wait);
        }
        self.decide_once(spec, identities, tiers, costs)
    }

    /// Decides a call without waiting: on the direct lane when its spec
    /// takes it, else down the attempt's road.
    #[inline(always)]
    pub(crate) fn decide_once<'l>(
        &'l self,
        spec: &'l CallSpec,
        identities: &[Identity],
        tiers: &[&str],
        costs: &[u64],
    ) -> CallFuture<'l> {
        resolve::with(self, spec, |resolved| {
            if resolved.direct
                && costs.is_empty()
                && let [identity] = identities
                && let Some(decided) = self.decide_direct(spec, resolved, identity)
            {
                return decided;
            }
            let attempt = match Attempt::new(self, spec, resolved, identities, tiers, costs) {
                Ok(attempt) => attempt,
                Err(decided) => return CallFuture::ready(*decided),
            };
            match &self.pipeline.store {
                Store::Memory(memory) => {
                    let decided = attempt.decide_now(self, spec, memory, Op::Acquire, &mut None);
                    CallFuture::ready(decided)
                }
                Store::Remote(_) => {
                    let attempt = attempt.to_owned();
                    CallFuture::remote(async move {
                        attempt
                            .attempt()
                            .decide(self, spec, Op::Acquire, &mut None)
                            .await
                    })
                }
            }
        })
    }

    /// [`Limiter::decide`] for a call that may wait.
    #[cold]
    #[inline(never)]
    fn decide_waiting<'l>(
        &'l self,
        spec: &'l CallSpec,
        identities: &[Identity],
        tiers: &[&str],
        costs: &[u64],
        wait: Option<Duration>,
    ) -> CallFuture<'l> {
        let max_wait = wait.unwrap_or_else(|| spec.wait().unwrap_or_default());
        wait::call(self, spec, identities, tiers, costs, max_wait)
    }

    /// Decides a call on the direct lane ([`Resolved::direct`]): one rate
    /// limit on the memory store, nothing around it but observation. The
    /// store decides; an admission is counted here (all the observing
    /// layers would do with it) and anything else goes up through them and
    /// into a rejection as on the full road. `None` when the call is not
    /// one for this lane after all.
    #[inline(always)]
    fn decide_direct<'l>(
        &'l self,
        spec: &'l CallSpec,
        resolved: &Arc<Resolved>,
        identity: &Identity,
    ) -> Option<CallFuture<'l>> {
        self.lane(
            spec,
            resolved,
            identity,
            with_decision(|decision, limit| CallFuture::direct(self, spec, *decision, *limit)),
        )
        .map(|decided| decided.unwrap_or_else(|rejection| CallFuture::ready(Err(rejection))))
    }

    /// The direct lane itself: decides a call of `resolved` (a spec the
    /// lane takes: [`Resolved::direct`]) for `identity` in the memory store
    /// with `decide` (the store's answer: what the caller makes of an
    /// admission, or the refusal); an admission is counted, a refusal goes
    /// up through the observing layers into its rejection. `None` when the
    /// call is not one for this lane after all.
    #[inline(always)]
    fn lane<T>(
        &self,
        spec: &CallSpec,
        resolved: &Arc<Resolved>,
        identity: &Identity,
        decide: impl FnOnce(&MemoryBackend, &Target<'_>) -> Result<T, Decision>,
    ) -> Option<Result<T, Rejection>> {
        let Store::Memory(memory) = &self.pipeline.store else {
            return None;
        };
        let target = resolved.direct_target(identity)?;
        match decide(memory, &target) {
            Ok(admitted) => {
                crate::layer::counters::count(&resolved.counters.allowed);
                Some(Ok(admitted))
            }
            // By reference: the store has just written the decision, and
            // moving it out would copy it in pieces wider than the store's
            // writes (a load that stalls until they land).
            Err(ref decision) => Some(Err(self.refused_direct(spec, resolved, &target, decision))),
        }
    }

    /// [`Limiter::call_with`] decided now (the memory store), handed to
    /// `admitted` (the decision and its limit) when the direct lane admits
    /// it, else to `decided`: what the tower layer makes of a request
    /// without building a permit it does not need. `None` on a remote
    /// store (await [`Limiter::call_with`] instead).
    #[cfg(any(feature = "tower", feature = "actix"))]
    #[inline]
    pub(crate) fn now_with<'l, R>(
        &'l self,
        spec: &'l CallSpec,
        keys: Keys<'_>,
        admitted: impl FnOnce(&Decision, &crate::model::limit::Limit) -> R,
        decided: impl FnOnce(call::Decided<'l>) -> R,
    ) -> Option<R> {
        if self.pipeline.store.is_remote() {
            return None;
        }
        // Made where the admission is (the decision and limit are not
        // moved out first); kept for the full road when the lane is not
        // taken.
        let mut admitted = Some(admitted);
        if let Some(part) = keys.direct(spec) {
            let identity = Identity::of(part);
            let lane = resolve::with(self, spec, |resolved| {
                if !resolved.direct {
                    return None;
                }
                self.lane(
                    spec,
                    resolved,
                    &identity,
                    with_decision(|decision, limit| {
                        admitted.take().map(|admitted| admitted(decision, limit))
                    }),
                )
            });
            match lane {
                Some(Ok(made)) => return made,
                Some(Err(rejection)) => return Some(decided(Err(rejection))),
                None => {}
            }
        }
        let admitted = admitted?;
        self.call_with(spec, keys).now_with(admitted, decided)
    }

    /// [`Limiter::call_with`] awaited for its admission only (what
    /// `#[rate_limit]` awaits when it keeps no permit): a call of one key on
    /// the direct lane is decided here and nothing but its admission
    /// leaves; any other takes [`Limiter::call_with`].
    #[inline(always)]
    pub(crate) fn admit<'l>(
        &'l self,
        spec: &'l CallSpec,
        keys: Keys<'_>,
    ) -> Result<Result<(), Rejection>, call::Admitted<'l>> {
        if let Some(part) = keys.direct(spec)
            && !self.pipeline.store.is_remote()
        {
            let identity = Identity::of(part);
            let lane = resolve::with(self, spec, |resolved| {
                if !resolved.direct {
                    return None;
                }
                self.lane(spec, resolved, &identity, |memory, target| {
                    memory.admit_target(target)
                })
            });
            if let Some(decided) = lane {
                return Ok(decided);
            }
        }
        self.call_with(spec, keys).admitted().decided()
    }

    /// A refusal on the direct lane, observed and turned into a rejection
    /// as any refusal of the store is.
    #[cold]
    #[inline(never)]
    fn refused_direct(
        &self,
        spec: &CallSpec,
        resolved: &Arc<Resolved>,
        target: &Target<'_>,
        decision: &Decision,
    ) -> Rejection {
        let refusal = LaneRefusal {
            name: spec.name(),
            target,
            decision,
            policy: resolved.policy,
            rejected: Some(&resolved.counters.rejected),
        };
        self.pipeline.observe_refusal(resolved.mask, &refusal);
        // Observing layers leave the answer as it is: the store's refusal,
        // named by the call's one group.
        let group = resolved.groups.first().map(|g| &g.name);
        Rejection::limited_as(
            Name::from(group.unwrap_or(spec.name_cow())),
            *decision,
            *target.limit,
        )
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
        if let Some(abandoned) = &self.abandoned {
            abandoned.flush().await;
        }
    }

    /// A fresh request id (128 random-looking bits, unique to this
    /// process' calls), for a call that may have to be taken back.
    pub(crate) fn call_id(&self) -> String {
        format!(
            "{:016x}{:016x}",
            self.keeper.lease_id(),
            self.keeper.lease_id()
        )
    }

    /// In-flight leases this limiter holds in a remote store (calls running
    /// now with a slot there).
    pub fn in_flight_leases(&self) -> usize {
        self.keeper.live()
    }

    /// Calls this limiter gave up on (a remote store did not answer in time)
    /// whose cancel has not reached the store yet: sent as soon as it
    /// answers again (see [`LimiterBuilder::cancel_abandoned`]). Awaiting
    /// [`Limiter::flush_in_flight`] also waits for them.
    pub fn pending_cancels(&self) -> usize {
        self.abandoned.as_ref().map_or(0, |a| a.pending())
    }

    /// The policy applied to `name`: runtime override, else `given`, else
    /// the limiter's.
    pub(crate) fn policy_for(&self, name: &str, given: Option<FailurePolicy>) -> FailurePolicy {
        self.registry.policy(name).or(given).unwrap_or(self.policy)
    }
}

/// The error of a call given as many identities or tiers as its spec wants.
#[cold]
pub(crate) fn bad_call(spec: &CallSpec, error: LimitError) -> Rejection {
    tracing::error!(call = spec.name(), %error, "rate limit misconfigured");
    Rejection::unavailable(spec.name_cow().clone(), Error::Limit(error))
}

/// The direct lane's store call for a caller that uses an admission's
/// decision: `admitted` makes what the call returns of it and its limit.
#[inline(always)]
fn with_decision<T>(
    admitted: impl FnOnce(&Decision, &crate::model::limit::Limit) -> T,
) -> impl FnOnce(&MemoryBackend, &Target<'_>) -> Result<T, Decision> {
    move |memory, target| {
        let decision = memory.acquire_target(target);
        if decision.allowed() {
            Ok(admitted(&decision, target.limit))
        } else {
            Err(decision)
        }
    }
}
