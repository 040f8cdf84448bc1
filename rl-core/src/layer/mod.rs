//! The layers around a store: each concern that wraps a decision is one
//! [`Layer`] in its own module, with one job, and every operation (acquire,
//! acquire-once, peek, refund, reset, and a waiting call's reserve and
//! cancel) passes through the same ones.
//!
//! ```text
//!   Limiter::call / check / acquire_all / peek_all / refund_all / reset_all
//!        │                                                        ▲
//!        ▼                                                        │
//!   observe       counts every outcome (ratewall_decisions_total), logs refusals
//!   lists         admits allow-listed calls, refuses deny-listed identities,
//!                 without asking the store
//!   validate      refuses a batch that could never be decided, for every store
//!   failure       applies the failure policy when the layers below fail
//!   deny_cache    answers a remembered refusal in process     (remote by default)
//!   shadow        turns a refusal of a name in shadow mode into an admission
//!   lease         decides a hot identity's calls from units leased
//!                 beforehand; asks for leases with the acquires it sends on
//!   breaker       fails fast while the backend keeps failing  (remote only)
//!   publish       tells the backend each name's limits        (remote only)
//!        │                                                        ▲
//!        ▼                                                        │
//!   store         memory (synchronous) or a remote Backend (one round trip)
//! ```
//!
//! A call goes down through each layer's [`Layer::before`] until one answers
//! (a cached refusal, an open circuit) or the store does; the answer then
//! comes back up through [`Layer::after`] of every layer it passed. The
//! limiter's builder decides which layers are present: a memory store has
//! no breaker or publisher, and no deny cache unless asked for.
//!
//! Why this order: observing outermost sees every outcome, including a
//! cached refusal and what the failure policy made of an error; the policy
//! sits above everything that can fail (an open breaker is a failure too)
//! and below validation (a batch that can never be decided is not an
//! outage); shadow mode sits below the deny cache, so a shadowed refusal is
//! never remembered; publishing sits next to the store, so it runs only
//! after the backend answered.

pub(crate) mod abandon;
pub(crate) mod breaker;
pub(crate) mod counters;
pub(crate) mod deny_cache;
pub(crate) mod failure;
pub(crate) mod lease;
pub(crate) mod lists;
pub(crate) mod observe;
pub(crate) mod publish;
pub(crate) mod shadow;
pub(crate) mod validate;

use std::fmt::Debug;
use std::time::Duration;

use crate::model::decision::Decisions;
use crate::model::error::Error;
use crate::model::limit::Limit;
use crate::model::policy::FailurePolicy;
use crate::model::reservation::Reservation;
use crate::store::backend::BoxFuture;
use crate::store::target::{Op, Target};
use crate::store::{Store, Stored, run_lease, run_remote};

/// Where a call's answer was decided (the `source` label of
/// `ratewall_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The limiter's store (memory, or the remote backend).
    Backend,
    /// The deny cache: a refusal the backend made, remembered in process.
    Cache,
    /// The in-process fallback of [`FailurePolicy::Local`], while the
    /// backend could not answer.
    Local,
    /// No store: the failure policy let the call through or refused it.
    Policy,
    /// An allow or deny list.
    List,
    /// A lease: units this process reserved in the backend beforehand
    /// (see [`crate::Limit::with_lease`]).
    Lease,
}

impl Source {
    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            Source::Backend => "backend",
            Source::Cache => "cache",
            Source::Local => "local",
            Source::Policy => "policy",
            Source::List => "list",
            Source::Lease => "lease",
        }
    }
}

/// What a call gets back, as it travels up through the layers.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Decisions, one per target (acquire, acquire-once, peek).
    Decided {
        decisions: Decisions,
        source: Source,
    },
    /// Refused, known by its binding refusal only (a remembered refusal:
    /// the other targets were not decided).
    Refused {
        /// The refused target.
        index: usize,
        decision: crate::model::decision::Decision,
        source: Source,
    },
    /// A refund or reset was applied.
    Applied { source: Source },
    /// A refusal of a name in shadow mode: not enforced.
    Shadowed {
        decisions: Decisions,
        source: Source,
    },
    /// The store, or the breaker in front of it, could not answer (before
    /// the failure policy, or for operations it leaves to the caller).
    Failed(Error),
    /// The identity of target `index` is deny-listed (until `until`, if it
    /// expires).
    Denied {
        index: usize,
        until: Option<std::time::SystemTime>,
    },
    /// Every group of the call is allow-listed: admitted without a decision.
    AllowListed,
    /// The failure policy let the call through without a decision.
    FailedOpen(Error),
    /// The call is refused because the limiter could not decide: the
    /// failure policy says so, or the call can never be decided.
    Unavailable(Error),
}

/// Notes layers leave for themselves (or for outer layers) on the way down.
#[derive(Debug, Default)]
pub(crate) struct Notes {
    /// The deny cache's clock when the call reached it (ns), when it is on
    /// for this call: a refusal the store makes is remembered from then.
    pub(crate) deny_since: Option<u64>,
    /// The deny cache let this call through to re-check an expired
    /// refusal (single flight).
    pub(crate) deny_probe: bool,
    /// The breaker's permission for this call.
    pub(crate) breaker: Option<breaker::Permission>,
    /// How long the store took (remote stores).
    pub(crate) store_time: Option<Duration>,
    /// The failure the failure policy answered for.
    pub(crate) failure: Option<Error>,
    /// A reservation's answer (whose decisions the answer carries), from
    /// the store or the in-process fallback.
    pub(crate) reservation: Option<Box<Reservation>>,
}

/// One operation on one batch, as the layers see it.
pub(crate) struct Call<'a> {
    pub(crate) op: Op<'a>,
    pub(crate) targets: &'a [Target<'a>],
    /// The call's name (a function's or a route's): the `limit` label.
    pub(crate) name: &'a str,
    /// The failure policy for this call, resolved.
    pub(crate) policy: FailurePolicy,
    /// Only the in-process fallback is involved (settling a call that the
    /// fallback admitted): the failure layer answers it.
    pub(crate) local_only: bool,
    /// The caller wants every target's decision (a raw `acquire_all`), not
    /// just an admission: no layer may answer with the binding refusal only.
    pub(crate) every_decision: bool,
    /// Every group's identity is allow-listed: there is nothing to decide
    /// (`targets` is empty), the lists layer admits the call.
    pub(crate) allow_listed: bool,
    /// The call's metric keys, when its spec was resolved.
    pub(crate) counters: Option<&'a counters::Prebuilt>,
    pub(crate) notes: Notes,
    /// Work to finish before the call returns (publishing limits).
    pub(crate) follow_up: Option<BoxFuture<'static, ()>>,
    /// Units to lease with this acquire (set by the lease layer; the store
    /// fills in what it granted).
    pub(crate) lease: Option<crate::store::Ask>,
    /// The caller's own requests, one per target in the same order, when
    /// the call was given them ([`crate::Limiter::check`]): a remote store
    /// sends them as they are instead of rendering each key again.
    pub(crate) given: Option<&'a [crate::store::backend::Request<'a>]>,
}

impl Call<'_> {
    /// Adds work to finish before the call returns (after any already set).
    pub(crate) fn then(&mut self, work: BoxFuture<'static, ()>) {
        self.follow_up = Some(match self.follow_up.take() {
            None => work,
            Some(first) => Box::pin(async move {
                first.await;
                work.await;
            }),
        });
    }
}

impl std::fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("op", &self.op)
            .field("name", &self.name)
            .field("targets", &self.targets)
            .field("policy", &self.policy)
            .field("notes", &self.notes)
            .finish_non_exhaustive()
    }
}

impl<'a> Call<'a> {
    #[inline]
    pub(crate) fn new(
        op: Op<'a>,
        targets: &'a [Target<'a>],
        name: &'a str,
        policy: FailurePolicy,
    ) -> Self {
        Self {
            op,
            targets,
            name,
            policy,
            local_only: false,
            every_decision: false,
            allow_listed: false,
            counters: None,
            notes: Notes::default(),
            follow_up: None,
            lease: None,
            given: None,
        }
    }
}

/// What every call of one resolved call spec will be: enough for a layer
/// to tell, once per resolution, whether it has anything to do with such
/// calls ([`Layer::applies`]). The limiter builds it; it is the layers' own
/// view of a call, so no layer reads the limiter's types.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    /// The call's name.
    pub(crate) name: &'a str,
    /// Its groups, as resolved (names, key heads, limits after overrides).
    pub(crate) groups: Vec<PlanGroup<'a>>,
    /// Whether the store is remote.
    pub(crate) remote: bool,
}

/// One group of a planned call.
#[derive(Debug)]
pub(crate) struct PlanGroup<'a> {
    /// The group's name.
    pub(crate) name: &'a str,
    /// The group's own limits (empty for a tiered group: each call's tier
    /// decides).
    pub(crate) limits: &'a [Limit],
    /// Where its calls may decide: the group's own key head and limits, or
    /// each tier's.
    pub(crate) scopes: Vec<PlanScope<'a>>,
}

/// One name a group's calls may decide under, with its key head and
/// limits: the group's own, or one tier's (`api@pro`).
#[derive(Debug)]
pub(crate) struct PlanScope<'a> {
    /// The name (the group's, or `<group>@<tier>`).
    pub(crate) name: &'a str,
    /// `prefix:{name:` (escaped).
    pub(crate) head: &'a str,
    pub(crate) limits: &'a [Limit],
    /// For a tier of the call's first tiered group: the call's name with
    /// the tier (`<call>@<tier>`).
    pub(crate) call: Option<&'a str>,
}

impl Plan<'_> {
    /// Every name these calls may carry: the call's, each group's, and for
    /// a tiered group each tier's (`api@pro`) and the call's with the tier.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name).chain(self.groups.iter().flat_map(|group| {
            std::iter::once(group.name).chain(
                group
                    .scopes
                    .iter()
                    .filter(move |scope| scope.name != group.name)
                    .flat_map(|scope| std::iter::once(scope.name).chain(scope.call)),
            )
        }))
    }
}

/// Which layers a call passes: bit `i` for the `i`-th layer, outermost
/// first.
pub(crate) type Mask = u64;

/// Every layer.
pub(crate) const ALL: Mask = Mask::MAX;

/// One concern around the store.
pub(crate) trait Layer: Send + Sync + Debug {
    /// Whether calls of `plan` need this layer. Asked once per resolved
    /// call spec (again after any runtime change); a layer that answers
    /// `false` is skipped by those calls, because it would do nothing: e.g.
    /// validation of a spec whose batches are valid by construction, shadow
    /// mode when no name of the call is shadowed.
    fn applies(&self, plan: &Plan<'_>) -> bool {
        let _ = plan;
        true
    }

    /// On the way down: may answer instead of the layers below and the store.
    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        let _ = call;
        None
    }

    /// On the way up: may observe or replace the answer.
    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        let _ = (call, answer);
    }

    /// Whether [`Layer::before`] ever does anything: a layer that only
    /// looks at answers says `false`, and the pipeline does not call its
    /// `before` (a call saved per decision; the layer is still passed).
    fn acts_before(&self) -> bool {
        true
    }

    /// Whether [`Layer::after`] ever does anything (as
    /// [`Layer::acts_before`]).
    fn acts_after(&self) -> bool {
        true
    }

    /// Whether this layer only counts and logs an acquire's answer, as
    /// [`observe::Observe`] does: a call whose layers all say so may take
    /// the limiter's direct lane (see [`Pipeline::direct`]), which counts
    /// an admission itself and passes a refusal up through these layers.
    fn only_observes(&self) -> bool {
        false
    }

    /// [`Layer::after`] for a refusal the memory store gave a call on the
    /// direct lane (an observing layer's only work there, see
    /// [`Pipeline::observe_refusal`]). By default the refusal is made into
    /// the call and answer the full road would pass up; a layer may do the
    /// same work without them.
    fn after_refusal(&self, refusal: &LaneRefusal<'_>) {
        let targets = [*refusal.target];
        let mut call = Call::new(Op::Acquire, &targets, refusal.name, refusal.policy);
        let mut answer = Answer::Decided {
            decisions: Decisions::one(*refusal.decision),
            source: Source::Backend,
        };
        self.after(&mut call, &mut answer);
    }

    /// The limits, policy, shadow mode or deny-cache setting of `name`
    /// changed at run time: drop what depended on them.
    fn changed(&self, name: &str) {
        let _ = name;
    }

    /// Every block of `key`'s identity was lifted in the store
    /// ([`crate::settings::Settings::unblock`]): drop what remembers them.
    fn unblocked(&self, key: &crate::model::key::Key) {
        let _ = key;
    }
}

impl<T: Layer> Layer for std::sync::Arc<T> {
    fn applies(&self, plan: &Plan<'_>) -> bool {
        (**self).applies(plan)
    }

    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        (**self).before(call)
    }

    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        (**self).after(call, answer)
    }

    fn changed(&self, name: &str) {
        (**self).changed(name)
    }

    fn unblocked(&self, key: &crate::model::key::Key) {
        (**self).unblocked(key)
    }

    fn acts_before(&self) -> bool {
        (**self).acts_before()
    }

    fn acts_after(&self) -> bool {
        (**self).acts_after()
    }

    fn only_observes(&self) -> bool {
        (**self).only_observes()
    }

    fn after_refusal(&self, refusal: &LaneRefusal<'_>) {
        (**self).after_refusal(refusal)
    }
}

/// A refusal the memory store gave one acquire on the direct lane, as the
/// observing layers see it ([`Layer::after_refusal`]): what the full road
/// would pass up as a [`Call`] of `target` and an [`Answer::Decided`] of
/// `decision` from the store.
#[derive(Debug)]
pub(crate) struct LaneRefusal<'a> {
    /// The call's name (the `limit` label).
    pub(crate) name: &'a str,
    pub(crate) target: &'a Target<'a>,
    /// The store's refusal.
    pub(crate) decision: &'a crate::model::decision::Decision,
    pub(crate) policy: FailurePolicy,
    /// The counter of the call's refusals, when it was built beforehand
    /// (a resolved spec's, or what a raw request's key remembers).
    pub(crate) rejected: Option<&'a crate::model::memo::Counted>,
}

/// A store and the layers around it.
#[derive(Debug)]
pub(crate) struct Pipeline {
    /// Outermost first.
    layers: Vec<Box<dyn Layer>>,
    /// The layers whose `before` does something ([`Layer::acts_before`]).
    befores: Mask,
    /// The layers whose `after` does something ([`Layer::acts_after`]).
    afters: Mask,
    /// The layers that only count and log ([`Layer::only_observes`]).
    observers: Mask,
    pub(crate) store: Store,
}

impl Pipeline {
    /// The layers' type names, outermost first (for the test that holds
    /// the README's diagram to the builder).
    #[cfg(test)]
    pub(crate) fn layer_names(&self) -> Vec<String> {
        self.layers
            .iter()
            .map(|layer| {
                let debug = format!("{layer:?}");
                debug
                    .split([' ', '{', '('])
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    }

    pub(crate) fn new(layers: Vec<Box<dyn Layer>>, store: Store) -> Self {
        let bits = |acts: fn(&dyn Layer) -> bool| {
            layers
                .iter()
                .enumerate()
                .filter(|(_, layer)| acts(&***layer))
                .fold(0, |mask, (i, _)| mask | (1 << i))
        };
        let befores = bits(|layer| layer.acts_before());
        let afters = bits(|layer| layer.acts_after());
        let observers = bits(|layer| layer.only_observes());
        Self {
            layers,
            befores,
            afters,
            observers,
            store,
        }
    }

    /// Whether calls that pass the layers of `mask` may take the direct
    /// lane on a memory store: every one of those layers only observes, so
    /// an acquire the store allowed needs nothing from them but its count
    /// (`ratewall_decisions_total{outcome="allowed", source="backend"}`), and
    /// a refusal goes up through them with [`Pipeline::observe_refusal`].
    pub(crate) fn direct(&self, mask: Mask) -> bool {
        matches!(self.store, Store::Memory(_)) && mask & !self.observers == 0
    }

    /// The layers that only count and log ([`Layer::only_observes`]).
    pub(crate) fn observers(&self) -> Mask {
        self.observers
    }

    /// A refusal of the memory store on a lane, up through the layers of
    /// `mask` that act after the store (as [`Pipeline::run_memory`] passes
    /// the store's answer up), without a call or answer built for them: on
    /// the macro's direct lane all of them only observe
    /// ([`Pipeline::direct`]); the raw requests' lane passes only those
    /// (no other layer of a memory pipeline has work with a refusal there,
    /// see `Requests::lane`).
    pub(crate) fn observe_refusal(&self, mask: Mask, refusal: &LaneRefusal<'_>) {
        let mut bits = mask & self.afters;
        while bits != 0 {
            let i = (Mask::BITS - 1 - bits.leading_zeros()) as usize;
            bits &= !(1 << i);
            self.layers[i].after_refusal(refusal);
        }
    }

    /// Every layer, outermost first.
    pub(crate) fn layers(&self) -> impl Iterator<Item = &dyn Layer> {
        self.layers.iter().map(|l| &**l)
    }

    /// The layers calls of `plan` pass.
    pub(crate) fn mask(&self, plan: &Plan<'_>) -> Mask {
        self.layers
            .iter()
            .enumerate()
            .filter(|(_, layer)| layer.applies(plan))
            .fold(0, |mask, (i, _)| mask | (1 << i))
    }

    /// Down through the layers of `mask`: how deep the call got, and a
    /// layer's answer when one answered.
    #[inline]
    fn down(&self, call: &mut Call<'_>, mask: Mask) -> (usize, Option<Answer>) {
        let mut bits = mask & self.befores;
        while bits != 0 {
            let depth = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(answer) = self.layers[depth].before(call) {
                return (depth, Some(answer));
            }
        }
        (self.layers.len(), None)
    }

    /// Up through the layers of `mask` the call passed (the answer is
    /// changed in place: no copy of it per layer).
    #[inline]
    fn up(&self, call: &mut Call<'_>, depth: usize, mask: Mask, answer: &mut Answer) {
        let mut bits = mask & self.afters & below(depth);
        while bits != 0 {
            let i = (Mask::BITS - 1 - bits.leading_zeros()) as usize;
            bits &= !(1 << i);
            self.layers[i].after(call, answer);
        }
    }

    /// Runs the call through the layers of `mask` synchronously when the
    /// store is in memory; `None` for a remote store (use [`Pipeline::run`]).
    #[inline]
    pub(crate) fn run_now(&self, call: &mut Call<'_>, mask: Mask) -> Option<Answer> {
        let Store::Memory(memory) = &self.store else {
            return None;
        };
        Some(self.run_memory(memory, call, mask))
    }

    /// [`Pipeline::run_now`] on this pipeline's memory store `memory`
    /// (the answer built in the caller's place: no `Option` around it).
    #[inline(always)]
    pub(crate) fn run_memory(
        &self,
        memory: &crate::store::memory::MemoryBackend,
        call: &mut Call<'_>,
        mask: Mask,
    ) -> Answer {
        let (depth, answered) = self.down(call, mask);
        let mut answer = match answered {
            Some(answer) => answer,
            // An acquire (the hot path): the decisions are made straight
            // into the answer (what `stored(call, memory.run(..))` gives,
            // without its intermediate copies).
            None if call.op == Op::Acquire => Answer::Decided {
                decisions: memory.acquire_targets(call.targets),
                source: Source::Backend,
            },
            None => stored(call, memory.run(call.op, call.targets)),
        };
        self.up(call, depth, mask, &mut answer);
        answer
    }

    /// Runs the call through the layers of `mask`.
    pub(crate) async fn run(&self, call: &mut Call<'_>, mask: Mask) -> Answer {
        let backend = match &self.store {
            Store::Memory(_) => {
                return self
                    .run_now(call, mask)
                    .expect("a memory store answers now");
            }
            Store::Remote(backend) => backend,
        };
        let (depth, answered) = self.down(call, mask);
        let answer = match answered {
            Some(answer) => answer,
            None => {
                let started = std::time::Instant::now();
                let result = match &mut call.lease {
                    Some(ask) if call.op == Op::Acquire => {
                        run_lease(&**backend, call.targets, ask).await
                    }
                    _ => run_remote(&**backend, call.op, call.targets, call.given).await,
                };
                call.notes.store_time = Some(started.elapsed());
                stored(call, result)
            }
        };
        let mut answer = answer;
        self.up(call, depth, mask, &mut answer);
        if let Some(follow_up) = call.follow_up.take() {
            follow_up.await;
        }
        answer
    }
}

/// The bits of the layers above depth `depth`.
#[inline]
fn below(depth: usize) -> Mask {
    if depth >= Mask::BITS as usize {
        ALL
    } else {
        (1 << depth) - 1
    }
}

/// A store's result as an answer (a reservation's, beside its decisions, in
/// the call's notes).
fn stored(
    call: &mut Call<'_>,
    result: Result<Stored, crate::model::error::BackendError>,
) -> Answer {
    stored_as(call, result, Source::Backend)
}

/// A store's result as an answer from `source`.
#[inline]
pub(crate) fn stored_as(
    call: &mut Call<'_>,
    result: Result<Stored, crate::model::error::BackendError>,
    source: Source,
) -> Answer {
    match result {
        Ok(Stored::Decided(decisions)) if call.op.decides() => {
            Answer::Decided { decisions, source }
        }
        Ok(Stored::Reserved(reservation)) => {
            let decisions = reservation.decisions().clone();
            call.notes.reservation = Some(reservation);
            Answer::Decided { decisions, source }
        }
        Ok(_) => Answer::Applied { source },
        Err(error) => Answer::Failed(Error::Backend(error)),
    }
}
