//! Stores: where decisions are made. The in-memory store (the embedded
//! default, synchronous) and remote backends behind the [`Backend`] trait
//! (`ratewall-redis`).
//!
//! A store only decides: every concern around a decision (breaker, deny
//! cache, failure policy, metrics) is a layer above it (`layer/`), which
//! the store never sees.

pub(crate) mod backend;
pub(crate) mod memory;
pub(crate) mod reserve;
pub(crate) mod sharded;
pub(crate) mod target;

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::model::decision::Decisions;
use crate::model::error::BackendError;
use crate::model::key::Key;
use crate::model::reservation::Reservation;
use backend::{Backend, Request};
use memory::MemoryBackend;
use target::{Op, Target};

/// The store at the bottom of a limiter's pipeline.
#[derive(Debug)]
pub(crate) enum Store {
    /// Decides in process, synchronously (shared with the guards of
    /// in-flight slots, which give theirs back from any thread).
    Memory(Arc<MemoryBackend>),
    /// Decides over the network.
    Remote(Arc<dyn Backend>),
}

impl Store {
    /// Whether calls leave the process (and may fail).
    pub(crate) fn is_remote(&self) -> bool {
        matches!(self, Store::Remote(_))
    }
}

/// What a store did with an operation.
#[derive(Debug)]
pub(crate) enum Stored {
    /// Decisions (acquire, acquire-once, peek).
    Decided(Decisions),
    /// A reservation's answer (boxed: the other answers stay small).
    Reserved(Box<Reservation>),
    /// A refund, reset or cancel was applied.
    Applied,
}

/// Runs `op` on a remote backend: sends `given` (the caller's requests of
/// these targets, when it made them), or else renders each distinct key
/// once; one batch either way.
pub(crate) async fn run_remote(
    backend: &dyn Backend,
    op: Op<'_>,
    targets: &[Target<'_>],
    given: Option<&[Request<'_>]>,
) -> Result<Stored, BackendError> {
    let (keys, built);
    let requests: &[Request<'_>] = match given {
        Some(given) if given.len() == targets.len() => given,
        _ => {
            let index;
            (keys, index) = render(targets);
            built = requests(targets, &keys, &index);
            &built
        }
    };
    match op {
        Op::Acquire => backend.acquire(requests).await.map(Stored::Decided),
        Op::AcquireOnce(id) => backend
            .acquire_once(requests, id)
            .await
            .map(Stored::Decided),
        Op::Peek(0) => backend.peek(requests).await.map(Stored::Decided),
        Op::Peek(ahead) => backend
            .peek_ahead(requests, std::time::Duration::from_micros(ahead))
            .await
            .map(Stored::Decided),
        Op::Refund(at) => backend.refund(requests, at).await.map(|()| Stored::Applied),
        Op::Charge => backend.charge(requests).await.map(|()| Stored::Applied),
        Op::Hold { after, left } => backend
            .hold(requests, std::time::Duration::from_micros(after), left)
            .await
            .map(|()| Stored::Applied),
        Op::Reset => backend.reset(requests).await.map(|()| Stored::Applied),
        Op::Reserve(max_wait) => backend
            .reserve(requests, std::time::Duration::from_micros(max_wait))
            .await
            .map(|reservation| Stored::Reserved(Box::new(reservation))),
        Op::Cancel(reservation) => backend
            .cancel(requests, reservation)
            .await
            .map(|()| Stored::Applied),
        Op::CancelOnce(id) => backend
            .cancel_once(requests, id)
            .await
            .map(|()| Stored::Applied),
    }
}

/// Units leased per call target, asked for by the lease layer
/// (`layer/lease.rs`) and filled in by the store ([`run_lease`]).
#[derive(Debug, Default)]
pub(crate) struct Ask {
    /// Extra units asked for, per target.
    pub(crate) extra: SmallVec<[u64; 2]>,
    /// Extra units the store granted, per target.
    pub(crate) granted: SmallVec<[u64; 2]>,
    /// When the take was sent (ns on the layer's clock).
    pub(crate) sent: u64,
    /// The lease TTL (for the store's record of the lease).
    pub(crate) ttl: Duration,
}

/// Runs an acquire that leases quota ([`Backend::acquire_lease`]): the
/// units granted go into `ask`.
pub(crate) async fn run_lease(
    backend: &dyn Backend,
    targets: &[Target<'_>],
    ask: &mut Ask,
) -> Result<Stored, BackendError> {
    let (keys, index) = render(targets);
    let requests = requests(targets, &keys, &index);
    let leased = backend
        .acquire_lease(&requests, &ask.extra, ask.ttl)
        .await?;
    if leased.granted.len() != targets.len() || leased.decisions.len() != targets.len() {
        return Err(BackendError::protocol(
            "a lease call answered for another number of limits",
        ));
    }
    ask.granted = leased.granted.iter().copied().collect();
    Ok(Stored::Decided(leased.decisions))
}

/// Each distinct key of `targets` rendered once, and each target's index
/// into them.
fn render(targets: &[Target<'_>]) -> (SmallVec<[Key; 4]>, SmallVec<[usize; 4]>) {
    let mut keys: SmallVec<[Key; 4]> = SmallVec::new();
    let mut index: SmallVec<[usize; 4]> = SmallVec::new();
    for (i, target) in targets.iter().enumerate() {
        match targets[..i].iter().position(|t| t.key == target.key) {
            Some(same) => index.push(index[same]),
            None => {
                index.push(keys.len());
                keys.push(target.key.render());
            }
        }
    }
    (keys, index)
}

/// The requests of `targets` over their rendered keys.
fn requests<'k>(
    targets: &[Target<'k>],
    keys: &'k [Key],
    index: &[usize],
) -> SmallVec<[Request<'k>; 4]> {
    targets
        .iter()
        .zip(index)
        .map(|(t, &k)| Request::new(&keys[k], t.limit, t.cost).with_holder(t.lease))
        .collect()
}
