//! Decisions over raw requests ([`Requests`], `limiter.requests()`):
//! keys and limits the caller builds, rather than a [`CallSpec`] resolved
//! once. For tools, admin pages and hand-made batches; `#[rate_limit]`, the
//! tower layer and [`Limiter::call`] take the call road instead.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hashbrown::{Equivalent, HashMap};
use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::layer::{ALL, Answer, Call, LaneRefusal, Source, counters};
use crate::limiter::Limiter;
use crate::limiter::admission::Admission;
use crate::limiter::attempt::admit;
use crate::limiter::settle::applied;
use crate::model::decision::{Decision, Decisions};
use crate::model::error::{BackendError, Error};
use crate::model::key::Key;
use crate::model::limit::{Limit, StateId};
use crate::model::lists::ListKind;
use crate::model::memo::{Counted, Remembered};
use crate::model::policy::FailurePolicy;
use crate::model::rejection::{Name, Rejection};
use crate::store::Store;
use crate::store::backend::Request;
use crate::store::memory::MemoryBackend;
use crate::store::target::{KeyRef, Op, Slot, Target};

#[cfg(doc)]
use crate::limiter::spec::CallSpec;

/// Decisions over requests the caller builds (a [`Key`], a [`Limit`] and a
/// cost each): `limiter.requests()`. Every operation passes the same layers
/// as a call does (lists, deny cache, failure policy, breaker, metrics).
///
/// ```
/// use ratewall::{Limit, Limiter};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::builder().memory().prefix("demo").build()?;
/// let limit = Limit::per_minute(2)?;
/// let key = limiter.key("say_hi", &7);
/// let requests = limiter.requests();
/// assert!(requests.acquire(&key, &limit, 1).await?.allowed());
/// assert!(requests.acquire(&key, &limit, 1).await?.allowed());
/// let third = requests.acquire(&key, &limit, 1).await?;
/// assert!(!third.allowed());
/// assert_eq!(third.retry_after_secs(), 30); // rounded up: waiting that long suffices
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Requests<'l> {
    pub(crate) limiter: &'l Limiter,
}

impl<'l> Requests<'l> {
    /// Decides `requests` (named `name` in metrics, logs and rejections)
    /// through every layer and applies the failure policy (`policy`
    /// overrides the limiter's; a runtime [`Settings::set_policy`](crate::settings::Settings::set_policy) for
    /// `name` wins over both): the call is admitted, or refused with a
    /// [`Rejection`]. [`Limiter::call`] does the same from a [`CallSpec`].
    ///
    /// # Errors
    /// A [`Rejection`] when the call is not admitted, and why
    /// ([`Rejection::reason`](crate::Rejection::reason)): a limit refuses it, an
    /// identity is on a deny list, the batch can never be decided (no request,
    /// a cost of 0 or above a limit's capacity, one state named twice), or the
    /// backend fails and the failure policy refuses
    /// ([`FailurePolicy::FailClosed`]).
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
        // Allow-listed keys are not decided (see `Settings::allow`).
        if self.limiter.registry.any_listed(ListKind::Allow) {
            return self.check_listed(name, requests, targets, policy).await;
        }
        let policy = self.limiter.policy_for(name, policy);
        let mut call = Call::new(Op::Acquire, targets, name, policy);
        call.given = Some(requests);
        let answer = self.limiter.pipeline.run(&mut call, ALL).await;
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
                    .with_text(|id| self.limiter.registry.listed(ListKind::Allow, name, id))
                    .is_none()
            })
            .copied()
            .collect();
        let policy = self.limiter.policy_for(name, policy);
        let mut call = Call::new(Op::Acquire, &targets, name, policy);
        call.allow_listed = !given.is_empty() && targets.is_empty();
        call.given = (targets.len() == requests.len()).then_some(requests);
        let answer = self.limiter.pipeline.run(&mut call, ALL).await;
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
    ///
    /// Build a key once and reuse it: on the in-memory store a key
    /// remembers, from its first decision, where the store keeps its state
    /// under the limit and the counter of its admissions (one small record
    /// per scope and limit, shared by every key that remembers it), so the
    /// decisions after skip both lookups. A key remembers one store and one
    /// limit's state; used with another it decides as a fresh key does.
    ///
    /// The future decides when first polled, and borrows the key and the
    /// limit, not this handle (`let decided = limiter.requests().acquire(..)`
    /// may be awaited later).
    ///
    /// # Errors
    /// As [`Requests::acquire_all`](crate::call::Requests::acquire_all) of
    /// one request: [`Error::Limit`] for a cost of 0 or above the limit's
    /// capacity, or a concurrency limit; [`Error::Denied`] when the key's
    /// identity is on a deny list; [`Error::Backend`] when the backend
    /// fails and the failure policy does not decide in process.
    pub fn acquire<'a>(
        &self,
        key: &'a Key,
        limit: &'a Limit,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + use<'a, 'l>
    where
        'l: 'a,
    {
        Acquiring {
            requests: *self,
            key,
            limit,
            cost,
            road: None,
            decided: false,
        }
    }

    /// The raw requests' direct lane: the memory store, when it may decide
    /// `request` while no layer has anything to do with it but observe (no
    /// list entry, no shadowed name; the deny cache never answers a call
    /// that wants every decision; the test
    /// `the_raw_lane_knows_every_layer_of_a_memory_pipeline` holds this list
    /// of layers to the builder's). `None` when the request takes the full
    /// road.
    #[inline(always)]
    fn lane(&self, request: &Request<'_>) -> Option<&'l MemoryBackend> {
        let limiter = self.limiter;
        let Store::Memory(memory) = &limiter.pipeline.store else {
            return None;
        };
        let registry = &limiter.registry;
        // What `validate` checks of one acquire: its cost, and that an
        // in-flight limit is taken by a call (an error the full road gives).
        if registry.any_listed(ListKind::Deny)
            || registry.any_listed(ListKind::Allow)
            || registry.any_shadow()
            || request.limit.is_in_flight()
            || request.limit.check_cost(request.cost).is_err()
        {
            return None;
        }
        Some(memory)
    }

    /// Decides `request` on the [`Requests::lane`] of `memory`, as the full
    /// road would: validated (by the lane), decided, and observed; an
    /// admission is counted here, a refusal goes up through the layers.
    ///
    /// The key remembers where the store keeps its state and the counter of
    /// its admissions ([`Remembered`]), found on its first decision here.
    /// An admission returns the store's decision as it is, so it is written
    /// once, in the caller's place for it, not copied there.
    #[inline(always)]
    fn on_lane(&self, memory: &MemoryBackend, request: &Request<'_>) -> Decision {
        let key = request.key;
        let state = request.limit.state_id();
        let remembered = match key.memo().get(memory.id(), state) {
            Some(memo) => Some(memo),
            None => self.remember(memory, request),
        };
        // A key that remembers another store or limit is found again.
        let target = match remembered {
            Some(memo) => {
                let slot = Slot {
                    store: memo.store,
                    partition: memo.partition,
                };
                let key = KeyRef {
                    head: &memo.head,
                    identity: key.identity_ref(),
                };
                Target {
                    slot: Some(slot),
                    ..target_with(request, &memo.name, key)
                }
            }
            None => target_of(request, key.scope()),
        };
        let decision = memory.acquire_target(&target);
        if !decision.allowed() {
            self.refused(&target, &decision, remembered.map(|memo| &memo.rejected));
            return decision;
        }
        match remembered {
            Some(memo) => counters::count(&memo.allowed),
            None => counters::decision(target.name, "allowed", Source::Backend.name()),
        }
        decision
    }

    /// What `request`'s key remembers in `memory` from now on (its first
    /// decision on the lane): the memory shared by every key of its head
    /// and limit state, made if this is the first such key. `None` when
    /// the key remembers another store or limit already.
    #[cold]
    #[inline(never)]
    fn remember<'k>(
        &self,
        memory: &MemoryBackend,
        request: &Request<'k>,
    ) -> Option<&'k Remembered> {
        let (key, limit) = (request.key, request.limit);
        let state = limit.state_id();
        if key.memo().is_empty() {
            let shared = self
                .limiter
                .remembered
                .of(key.head(), state, || Remembered {
                    store: memory.id(),
                    state,
                    partition: memory.slot(key.head(), limit).partition,
                    head: key.head().into(),
                    name: key.scope().into(),
                    allowed: counters::allowed(key.scope()),
                    rejected: counters::rejected(key.scope()),
                });
            key.memo().set(shared);
        }
        key.memo().get(memory.id(), state)
    }

    /// A refusal on [`Requests::lane`], passed up through the observing
    /// layers as the macro's direct lane passes one
    /// ([`Layer::after_refusal`]): the other layers of a memory pipeline
    /// have no work with it there (no shadow mode, no list, no failure, no
    /// deny cache consulted); counted by the key's remembered counter when
    /// it has one.
    ///
    /// [`Layer::after_refusal`]: crate::layer::Layer::after_refusal
    #[cold]
    #[inline(never)]
    fn refused(&self, target: &Target<'_>, decision: &Decision, rejected: Option<&Counted>) {
        let refusal = LaneRefusal {
            name: target.name,
            target,
            decision,
            policy: self.limiter.policy_for(target.name, None),
            rejected,
        };
        let pipeline = &self.limiter.pipeline;
        pipeline.observe_refusal(pipeline.observers(), &refusal);
    }

    /// Decides several limits together, all-or-nothing, in one round trip,
    /// and returns every decision (the deny cache, which knows only a
    /// refusal's binding limit, does not answer these).
    ///
    /// # Errors
    /// [`Error::Limit`] when the batch can never be decided (no request, a cost
    /// of 0 or above a limit's capacity, one state named twice, a concurrency
    /// limit, which only a call's permit takes); [`Error::Denied`] when an
    /// identity is on a deny list; [`Error::Backend`] when the backend fails and
    /// the failure policy does not decide in process (`FailurePolicy::Local`
    /// does; with fail-open or fail-closed the error is returned).
    pub async fn acquire_all(&self, requests: &[Request<'_>]) -> Result<Decisions, Error> {
        self.decide(Op::Acquire, requests).await
    }

    /// Like [`Requests::acquire_all`](crate::call::Requests::acquire_all), idempotent by `request_id`: a retry
    /// with the same id (e.g. after a timeout whose reply was lost) gets the
    /// first call's decisions back instead of being charged again. Needs a
    /// backend that implements [`crate::backend::Backend::acquire_once`] (memory and
    /// Redis do).
    ///
    /// # Errors
    /// As [`Requests::acquire_all`](crate::call::Requests::acquire_all);
    /// [`Error::Backend`] also when the backend refuses `request_id` (the
    /// memory store does when it was first used for a different number of
    /// limits).
    pub async fn acquire_all_once(
        &self,
        requests: &[Request<'_>],
        request_id: &str,
    ) -> Result<Decisions, Error> {
        self.decide(Op::AcquireOnce(request_id), requests).await
    }

    /// Evaluates limits without consuming anything.
    ///
    /// # Errors
    /// [`Error::Limit`] when the batch can never be decided (no request, a cost
    /// of 0 or above a limit's capacity, one state named twice);
    /// [`Error::Backend`] when the backend fails, unless the failure policy is
    /// `FailurePolicy::Local`, which peeks the in-process state instead.
    pub async fn peek_all(&self, requests: &[Request<'_>]) -> Result<Decisions, Error> {
        self.decide(Op::Peek(0), requests).await
    }

    /// Gives back what an allowed decision made at `at_micros` consumed.
    /// Calls of this limiter waiting under these keys try again at once;
    /// the other instances sharing a remote store see the room within one
    /// notice delivery where the store tells of refunds (Redis: typically
    /// a few milliseconds), else within their deny cache's maximum hold
    /// (see [`Permit::settle`](crate::Permit::settle)).
    ///
    /// # Errors
    /// [`Error::Limit`] for a batch with no request or one state named twice;
    /// [`Error::Backend`] when the backend fails, whatever the failure policy
    /// (the units stay taken).
    pub async fn refund_all(&self, requests: &[Request<'_>], at_micros: u64) -> Result<(), Error> {
        self.apply(Op::Refund(at_micros), requests, false).await
    }

    /// Takes each request's cost on top of what its state holds, whatever
    /// the limits say: debt later calls pay ([`crate::backend::Backend::charge`],
    /// what [`crate::Permit::settle_cost`] does above an estimate).
    ///
    /// # Errors
    /// [`Error::Limit`] for a batch with no request, one state named twice, or
    /// a concurrency limit (it counts running calls, not units);
    /// [`Error::Backend`] when the backend fails, whatever the failure policy.
    pub async fn charge_all(&self, requests: &[Request<'_>]) -> Result<(), Error> {
        self.apply(Op::Charge, requests, false).await
    }

    /// Forgets the state of the given keys and limits in the backend. Seen
    /// by the other instances sharing it as a refund is
    /// ([`Requests::refund_all`](crate::call::Requests::refund_all)).
    ///
    /// # Errors
    /// [`Error::Limit`] for a batch with no request or one state named twice;
    /// [`Error::Backend`] when the backend fails, whatever the failure policy.
    pub async fn reset_all(&self, requests: &[Request<'_>]) -> Result<(), Error> {
        self.apply(Op::Reset, requests, false).await
    }

    /// Forgets the requests' state in the in-process fallback and in the
    /// backend.
    ///
    /// # Errors
    /// As [`Requests::reset_all`](crate::call::Requests::reset_all); the
    /// in-process state is forgotten first, and stays forgotten when the
    /// backend then fails.
    pub async fn reset_everywhere(&self, requests: &[Request<'_>]) -> Result<(), Error> {
        self.apply(Op::Reset, requests, true).await?;
        self.apply(Op::Reset, requests, false).await
    }

    /// Gives back what an admission took: from the backend, or from the
    /// in-process fallback for [`Admission::Local`]; nothing for a
    /// fail-open or shadowed one. Each decision is refunded at its own time.
    ///
    /// # Errors
    /// [`Error::Limit`] for requests that name one state twice;
    /// [`Error::Backend`] when the backend fails to refund an
    /// [`Admission::Backend`] (decisions of one time refunded before the
    /// failure stay refunded). An in-process admission
    /// ([`Admission::Local`]) is refunded in process, never in the backend.
    pub async fn refund_admission(
        &self,
        requests: &[Request<'_>],
        admission: &Admission,
    ) -> Result<(), Error> {
        let targets = named_targets(requests, None);
        let name = targets.first().map_or("", |t| t.name);
        let policy = self.limiter.policy_for(name, None);
        self.limiter
            .refund_targets(name, &targets, admission, 0..targets.len(), policy)
            .await
    }

    /// The current state of `identity` under `name` for each of `limits`,
    /// without consuming (e.g. an admin page: remaining and reset per limit).
    /// The key is built before the returned future, which is `Send`.
    ///
    /// # Errors
    /// As [`Requests::peek_all`](crate::call::Requests::peek_all).
    pub fn peek_identity<'a>(
        &'a self,
        name: &str,
        identity: &dyn fmt::Display,
        limits: &'a [Limit],
    ) -> impl Future<Output = Result<Decisions, Error>> + Send + 'a {
        let key = self.limiter.key(name, identity);
        async move {
            let requests: SmallVec<[Request<'_>; 4]> =
                limits.iter().map(|l| Request::new(&key, l, 1)).collect();
            self.peek_all(&requests).await
        }
    }

    /// Forgets `identity` under `name` for each of `limits` (e.g. support
    /// staff unblocking a user), in the backend and in the local fallback.
    ///
    /// # Errors
    /// As [`Requests::reset_everywhere`](crate::call::Requests::reset_everywhere).
    pub fn reset_identity<'a>(
        &'a self,
        name: &str,
        identity: &dyn fmt::Display,
        limits: &'a [Limit],
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        let key = self.limiter.key(name, identity);
        async move {
            let requests: SmallVec<[Request<'_>; 4]> =
                limits.iter().map(|l| Request::new(&key, l, 1)).collect();
            self.reset_everywhere(&requests).await
        }
    }

    /// Runs a deciding `op` on `requests`: every decision, or the error.
    async fn decide(&self, op: Op<'_>, requests: &[Request<'_>]) -> Result<Decisions, Error> {
        let targets = named_targets(requests, None);
        self.decide_targets(op, &targets).await
    }

    /// [`Requests::decide`] of `targets`, each named by its key's scope.
    async fn decide_targets(&self, op: Op<'_>, targets: &[Target<'_>]) -> Result<Decisions, Error> {
        let name = targets.first().map_or("", |t| t.name);
        let mut call = Call::new(op, targets, name, self.limiter.policy_for(name, None));
        call.every_decision = true;
        match self.limiter.pipeline.run(&mut call, ALL).await {
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
                Err(Error::Backend(BackendError::protocol(
                    "no decision for a deciding operation",
                )))
            }
        }
    }

    /// Runs a refund or reset on `requests`, in process only when `local`.
    async fn apply(&self, op: Op<'_>, requests: &[Request<'_>], local: bool) -> Result<(), Error> {
        let targets = named_targets(requests, None);
        let name = targets.first().map_or("", |t| t.name);
        let mut call = Call::new(op, &targets, name, self.limiter.policy_for(name, None));
        call.local_only = local;
        applied(self.limiter.pipeline.run(&mut call, ALL).await)?;
        if matches!(op, Op::Refund(_) | Op::Reset) {
            // Calls waiting under these keys try again.
            self.limiter.room.freed_targets(&targets);
        }
        Ok(())
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
            None => target_of(r, r.key.scope()),
        })
        .collect()
}

/// What the raw lane remembers for the keys of this limiter's memory store
/// ([`Key`]'s memo): one per key head and limit state, shared by the keys
/// that remember it, so a key remembers in one pointer.
#[derive(Debug, Default)]
pub(crate) struct Remembering(Mutex<HashMap<Memorized, Arc<Remembered>>>);

/// A key head and limit state, owned: what [`Remembering`] keeps by.
type Memorized = (Box<str>, StateId);

/// A key head and limit state, borrowed: to look one up without allocating.
#[derive(Hash)]
struct Memorizing<'a>(&'a str, StateId);

impl Equivalent<Memorized> for Memorizing<'_> {
    fn equivalent(&self, key: &Memorized) -> bool {
        *key.0 == *self.0 && key.1 == self.1
    }
}

impl Remembering {
    /// The memory of `head` under `state`, made by `make` if there is none.
    fn of(&self, head: &str, state: StateId, make: impl FnOnce() -> Remembered) -> Arc<Remembered> {
        let mut kept = self.0.lock();
        if let Some(memo) = kept.get(&Memorizing(head, state)) {
            return memo.clone();
        }
        let memo = Arc::new(make());
        kept.insert((head.into(), state), memo.clone());
        memo
    }

    /// How many memories are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().len()
    }
}

/// [`Acquiring`]'s full road, boxed.
type FullRoad<'a> = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send + 'a>>;

/// [`Requests::acquire`]'s future: decided on its first poll, on the
/// lane where it can be, from the arguments where they lie (an `async fn`
/// would first move them into its running state, reading back in wide
/// pieces what its caller had just written in narrow ones); otherwise the
/// full road, boxed (held inline, its future, over 1 KB, would make every
/// `acquire` future that large; a round trip or the full pipeline dwarfs
/// the allocation). Polled again once it has answered, it panics, as an
/// `async fn`'s future does, rather than decide (and take) a second time.
struct Acquiring<'a, 'l> {
    requests: Requests<'l>,
    key: &'a Key,
    limit: &'a Limit,
    cost: u64,
    road: Option<FullRoad<'a>>,
    /// Whether the lane answered.
    decided: bool,
}

impl<'a, 'l: 'a> Future for Acquiring<'a, 'l> {
    type Output = Result<Decision, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(road) = &mut this.road {
            return road.as_mut().poll(cx);
        }
        assert!(!this.decided, "`acquire` polled after it answered");
        // One request: its one target on the stack.
        let request = Request::new(this.key, this.limit, this.cost);
        if let Some(memory) = this.requests.lane(&request) {
            this.decided = true;
            return Poll::Ready(Ok(this.requests.on_lane(memory, &request)));
        }
        let (requests, key) = (this.requests, this.key);
        this.road
            .insert(Box::pin(async move {
                let targets = [target_of(&request, key.scope())];
                Ok(*requests
                    .decide_targets(Op::Acquire, &targets)
                    .await?
                    .binding())
            }))
            .as_mut()
            .poll(cx)
    }
}

/// The target of `request`, named `name`.
#[inline(always)]
fn target_of<'a>(request: &'a Request<'a>, name: &'a str) -> Target<'a> {
    target_with(request, name, KeyRef::of(request.key))
}

/// The target of `request`, named `name`, its key given as `key` (the
/// lane's, whose head comes from what the key remembers: slicing it from
/// the key reads the key's text).
#[inline(always)]
fn target_with<'a>(request: &'a Request<'a>, name: &'a str, key: KeyRef<'a>) -> Target<'a> {
    Target {
        name,
        key,
        limit: request.limit,
        cost: request.cost,
        slot: None,
        lease: request.holder,
    }
}
