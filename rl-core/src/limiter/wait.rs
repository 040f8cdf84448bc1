//! Waiting calls ([`Keys::wait`](crate::Keys::wait), `CallSpec::with_wait`,
//! `#[rate_limit(wait = "2s")]`): a call that would be refused waits for
//! room instead, up to its maximum wait.
//!
//! - GCRA and the buckets reserve: one operation through the pipeline
//!   ([`Op::Reserve`]) finds and commits the earliest slot every limit
//!   allows, and the call sleeps until it. A [`Reserved`] slot is given back
//!   ([`Op::Cancel`]) when the call's future is dropped before the slot. A
//!   pause this process writes (`Limiter::hold`) after the slot was given,
//!   over one of the call's keys, that ends after the slot, makes the call
//!   reserve again: the store finds its new slot after the pause.
//! - The window algorithms, and every call with a limit that blocks
//!   ([`Limit::with_block`]), retry: the call sleeps for each refusal's
//!   `retry_after` and asks again, as long as the next try is within the
//!   maximum wait; a refund in this process (a settled estimate) wakes one
//!   waiting call of the same name, or under the same key, sooner, a
//!   refund by another process sharing the store too when the store tells
//!   of it (Redis: within one pub/sub delivery), and each woken call
//!   admitted wakes the next ([`room`]). (A reserved slot is not moved
//!   earlier by a refund: the call keeps the slot it queued for.)
//!
//! Nothing here decides: the stores reserve and cancel, the layers apply
//! to both operations as to any other (deny lists, failure policy, shadow
//! mode, metrics).

use std::pin::pin;
use std::time::{Duration, Instant};

use crate::layer::{ALL, counters};
use crate::limiter::admission::Admission;
use crate::limiter::attempt::{Attempt, OwnedAttempt, misconfigured};
use crate::limiter::call::{CallFuture, Decided, Permit};
use crate::limiter::room::{PausedKeys, Pauses};
use crate::limiter::spec::{CallSpec, Counting};
use crate::limiter::{Limiter, resolve, room, timer};
use crate::model::clock::{later, micros};
use crate::model::error::LimitError;
use crate::model::key::{Identities, Identity, Key};
use crate::model::limit::Limit;
use crate::model::rejection::{Rejection, RejectionReason};
use crate::model::reservation::Reservation;
use crate::store::Store;
use crate::store::backend::Request;
use crate::store::target::Op;

/// How the calls of a resolved spec wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// Reserve a slot and sleep until it.
    Reserve,
    /// Sleep for each refusal's `retry_after` and ask again.
    Retry,
}

/// How the calls of `attempt` wait, or why they cannot.
fn how(limiter: &Limiter, spec: &CallSpec, attempt: &Attempt<'_>) -> Result<How, LimitError> {
    // Each group's limits as this call is decided: its own, or its tier's.
    let groups = (0..attempt.resolved.groups.len()).map(|g| {
        let (name, _, limits, _) = attempt.resolved.part(g, &attempt.chosen);
        (name.as_ref(), limits)
    });
    let how = kind(spec, groups)?;
    let reserving = match &limiter.pipeline.store {
        Store::Memory(_) => true,
        Store::Remote(backend) => backend.reserves(),
    };
    Ok(if reserving { how } else { How::Retry })
}

/// Why calls of `spec` as stated (every group's compiled-in limits and
/// every tier's) cannot wait, if they cannot: what a waiting call of it is
/// refused with, unless runtime settings replace those limits. For callers
/// that choose a default wait (the upstream client integrations).
#[cfg_attr(
    not(any(feature = "tower", feature = "reqwest")),
    allow(dead_code, reason = "the client integrations' default wait")
)]
pub(crate) fn stated_cannot_wait(spec: &CallSpec) -> Option<LimitError> {
    let groups = spec.groups().iter().flat_map(|group| {
        let tiers = group.tiers().unwrap_or_default().iter();
        std::iter::once((group.name(), group.limits()))
            .chain(tiers.map(move |tier| (group.name(), tier.limits())))
    });
    kind(spec, groups).err()
}

/// How calls of `spec` whose groups decide `groups` (each group's name and
/// limits) wait, or why they cannot.
fn kind<'a>(
    spec: &CallSpec,
    groups: impl Iterator<Item = (&'a str, &'a [Limit])> + Clone,
) -> Result<How, LimitError> {
    if spec.counting() == Counting::Settled {
        return Err(LimitError::BadCall(format!(
            "call `{}` cannot wait: it counts only some calls (`Counting::Settled`, `count`, `count_if`), and \
             giving back a unit of a limit with queued slots would hand a reserved slot out twice; remove the \
             wait or the selective counting",
            spec.name()
        )));
    }
    if let Some((name, _)) = groups
        .clone()
        .find(|(_, limits)| limits.iter().any(Limit::is_in_flight))
    {
        return Err(LimitError::BadCall(format!(
            "call `{}` cannot wait: its group `{name}` has an in-flight limit; a slot of a concurrency limit frees \
             when a running call ends, which no reserved time or retry can promise, and a waiting call would \
             hold its other groups' units meanwhile; remove the wait or the in-flight limit",
            spec.name(),
        )));
    }
    let limits = || groups.clone().flat_map(|(_, limits)| limits.iter());
    // A limit that blocks refuses a blocked identity until the block ends,
    // which no reserved slot can promise: such a call retries (every
    // algorithm can), sleeping for each refusal's retry_after.
    if limits().any(|l| l.block().is_some()) {
        return Ok(How::Retry);
    }
    let queued = limits().find(|l| l.algorithm().reserves());
    let windowed = limits().find(|l| !l.algorithm().reserves());
    match (queued, windowed) {
        (Some(queue), Some(window)) => Err(LimitError::BadCall(format!(
            "call `{}` cannot wait: it mixes {queue} ({}) with {window} ({}); a waiting call reserves one \
             time on gcra and the buckets but retries the window algorithms, so both cannot be waited for \
             together; give every limit of the call one kind",
            spec.name(),
            queue.algorithm().name(),
            window.algorithm().name(),
        ))),
        (Some(_), None) => Ok(How::Reserve),
        (None, _) => Ok(How::Retry),
    }
}

/// Decides a call of `spec` (with `tiers`) that may wait up to `max_wait`.
pub(crate) fn call<'l>(
    limiter: &'l Limiter,
    spec: &'l CallSpec,
    identities: &[Identity],
    tiers: &[&str],
    costs: &[u64],
    max_wait: Duration,
) -> CallFuture<'l> {
    resolve::with(limiter, spec, |resolved| {
        let attempt = match Attempt::new(limiter, spec, resolved, identities, tiers, costs) {
            Ok(attempt) => attempt,
            Err(decided) => return CallFuture::ready(*decided),
        };
        let how = match how(limiter, spec, &attempt) {
            Ok(how) => how,
            Err(problem) => return CallFuture::ready(Err(misconfigured(spec, &problem))),
        };
        // Without the timer thread nothing can sleep: decide as a call that
        // does not wait.
        let max_wait = if timer::available() {
            max_wait
        } else {
            Duration::ZERO
        };
        match how {
            How::Reserve => reserve(
                limiter,
                spec,
                &attempt,
                max_wait,
                Instant::now(),
                Duration::ZERO,
            ),
            How::Retry => {
                // Room given back by another process is told by key.
                let keys = if limiter.room.hears() {
                    Pauses::keys(&attempt.targets(limiter))
                } else {
                    PausedKeys::new()
                };
                retry(limiter, spec, identities, tiers, costs, max_wait, keys)
            }
        }
    })
}

/// The longest wait (µs) a reservation on `attempt`'s limits may ask for:
/// `max_wait`, bounded so that a queue that long keeps every meter's level
/// below 2^51 (exact in the Redis scripts' doubles; over half an hour for a
/// threshold of a million per period).
fn reservable(attempt: &Attempt<'_>, max_wait: Duration) -> u64 {
    let asked = micros(max_wait);
    (0..attempt.resolved.groups.len())
        .flat_map(|g| attempt.resolved.part(g, &attempt.chosen).2.iter())
        .map(|l| (1u64 << 51) / l.threshold())
        .fold(asked, u64::min)
}

/// Reserves a slot and sleeps until it: a call that started waiting at
/// `started`, for at most `max_wait`, and waited `before` already (a call
/// a pause moved).
fn reserve<'l>(
    limiter: &'l Limiter,
    spec: &'l CallSpec,
    attempt: &Attempt<'_>,
    max_wait: Duration,
    started: Instant,
    before: Duration,
) -> CallFuture<'l> {
    let left = max_wait.saturating_sub(started.elapsed());
    let op = Op::Reserve(reservable(attempt, left));
    // Taken before the store is asked: a pause asked for after this is one
    // the slot may not have seen.
    let asked = Asked {
        at: Instant::now(),
        started,
        max_wait,
        before,
    };
    if let Store::Memory(memory) = &limiter.pipeline.store {
        let mut reservation = None;
        let decided = attempt.decide_now(limiter, spec, memory, op, &mut reservation);
        return match held(limiter, spec, attempt, decided, reservation, asked) {
            Ok((permit, None)) => CallFuture::ready(Ok(admitted(permit))),
            Ok((permit, Some(held))) => CallFuture::remote(sleep_for(permit, held)),
            Err(rejection) => CallFuture::ready(Err(rejection)),
        };
    }
    let owned = attempt.to_owned();
    CallFuture::remote(async move {
        let attempt = owned.attempt();
        let mut reservation = None;
        let decided = attempt.decide(limiter, spec, op, &mut reservation).await;
        match held(limiter, spec, &attempt, decided, reservation, asked)? {
            (permit, None) => Ok(admitted(permit)),
            (permit, Some(held)) => sleep_for(permit, held).await,
        }
    })
}

/// A decided reservation: the permit, with the slot to wait for when it is
/// later than now.
fn held<'l>(
    limiter: &'l Limiter,
    spec: &'l CallSpec,
    attempt: &Attempt<'_>,
    decided: Decided<'l>,
    reservation: Option<Box<Reservation>>,
    asked: Asked,
) -> Result<(Permit<'l>, Option<Reserved<'l>>), Rejection> {
    let mut permit = decided?;
    let local = match permit.admission() {
        Admission::Backend(_) => false,
        Admission::Local { .. } => true,
        // Let through without a reservation (fail-open, shadow mode, allow list).
        _ => return Ok((permit, None)),
    };
    let Some(reservation) = reservation else {
        return Ok((permit, None));
    };
    let wait = reservation.wait();
    if wait.is_zero() {
        return Ok((permit, None));
    }
    // A call moved by a pause counts its wait from its first slot's ask.
    permit.waited = asked.before + wait;
    tracing::debug!(
        call = spec.name(),
        wait_us = wait.as_micros() as u64,
        "waiting for a reserved slot"
    );
    Ok((
        permit,
        Some(Reserved {
            limiter,
            spec,
            attempt: attempt.to_owned(),
            reservation: *reservation,
            local,
            until: later(Instant::now(), wait),
            asked,
            runtime: tokio::runtime::Handle::try_current().ok(),
            armed: true,
        }),
    ))
}

/// Sleeps until the held slot, then admits the call; reserves again
/// ([`again`]) if this process hears a pause over one of the call's keys
/// that the slot falls inside.
async fn sleep_for<'l>(permit: Permit<'l>, mut held: Reserved<'l>) -> Decided<'l> {
    let limiter = held.limiter;
    let keys = Pauses::keys(&held.attempt.attempt().targets(limiter));
    loop {
        // Enabled before the pauses are read, so none heard in between is
        // missed.
        let mut news = pin!(limiter.pauses.news());
        news.as_mut().enable();
        if limiter.pauses.cut(&keys, held.asked.at, held.until) {
            return again(permit, held).await;
        }
        if !room::sleep_or_told(held.until, news).await {
            held.armed = false;
            return Ok(admitted(permit));
        }
    }
}

/// Reserves again, for the rest of the call's wait, a call whose slot a
/// pause heard since cut: the store, which has the pause now, finds the
/// new slot after it. The old slot is not given back: a slot given back
/// is handed to the next reservation, which would put it inside the pause
/// again; it stays taken, as the pause took it (what a pause leaves is
/// the same with or without it, unless the queue reached past the pause).
async fn again<'l>(permit: Permit<'l>, mut held: Reserved<'l>) -> Decided<'l> {
    let (limiter, spec, asked) = (held.limiter, held.spec, held.asked);
    let attempt = held.attempt.clone();
    held.armed = false;
    drop((permit, held));
    tracing::debug!(
        call = spec.name(),
        "a pause was heard over a reserved slot: reserving again, after it"
    );
    reserve(
        limiter,
        spec,
        &attempt.attempt(),
        asked.max_wait,
        asked.started,
        asked.started.elapsed(),
    )
    .await
}

/// Records an admitted waiting call's wait.
fn admitted(permit: Permit<'_>) -> Permit<'_> {
    counters::histogram_record(
        "ratewall_wait_seconds",
        permit.spec.name(),
        permit.waited.as_secs_f64(),
    );
    permit
}

/// When a call's slot was asked for, and its wait: since `started`, at
/// most `max_wait`; `before`: what it waited before this slot was asked
/// for (zero but for a call a pause moved).
#[derive(Debug, Clone, Copy)]
struct Asked {
    at: Instant,
    started: Instant,
    max_wait: Duration,
    before: Duration,
}

/// A reserved slot a call is waiting for: given back if the call's future
/// is dropped first.
struct Reserved<'l> {
    limiter: &'l Limiter,
    spec: &'l CallSpec,
    attempt: OwnedAttempt,
    reservation: Reservation,
    /// Reserved in process by the failure policy's fallback.
    local: bool,
    until: Instant,
    /// When the slot was asked for, and the call's wait.
    asked: Asked,
    /// The runtime a remote backend's cancel is spawned on.
    runtime: Option<tokio::runtime::Handle>,
    armed: bool,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let attempt = self.attempt.attempt();
        let targets = attempt.targets(self.limiter);
        let name = self.spec.name();
        match &self.limiter.pipeline.store {
            Store::Remote(backend) if !self.local => {
                let requests: Vec<(Key, Limit, u64)> = targets
                    .iter()
                    .map(|t| (t.key.render(), *t.limit, t.cost))
                    .collect();
                let reservation = self.reservation.clone();
                let owned = name.to_owned();
                let backend = backend.clone();
                let cancel = async move {
                    let requests: Vec<Request<'_>> = requests
                        .iter()
                        .map(|(key, limit, cost)| Request::new(key, limit, *cost))
                        .collect();
                    let result = backend.cancel(&requests, &reservation).await;
                    let outcome = if result.is_ok() { "ok" } else { "error" };
                    metrics::counter!(
                        "ratewall_operations_total",
                        "limit" => owned.clone(), "op" => "cancel", "result" => outcome
                    )
                    .increment(1);
                    if let Err(error) = result {
                        tracing::warn!(limit = owned, %error, "could not give back the slot of a dropped waiting call; it stays taken");
                    }
                };
                match self
                    .runtime
                    .clone()
                    .or_else(|| tokio::runtime::Handle::try_current().ok())
                {
                    Some(runtime) => drop(runtime.spawn(cancel)),
                    None => tracing::warn!(
                        limit = name,
                        "a waiting call was dropped outside a tokio runtime: its slot stays taken"
                    ),
                }
            }
            _ => {
                let mut call = attempt.call(self.spec, Op::Cancel(&self.reservation), &targets);
                call.local_only = self.local;
                // In process (the memory store, or the fallback's own
                // reservation): the pipeline answers without awaiting.
                let run = self.limiter.pipeline.run(&mut call, ALL);
                let mut run = std::pin::pin!(run);
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                if run.as_mut().poll(&mut cx).is_pending() {
                    tracing::warn!(
                        limit = name,
                        "could not give back the slot of a dropped waiting call"
                    );
                }
            }
        }
    }
}

/// Retries after each refusal's `retry_after` until admitted, or until the
/// next try would come after `max_wait`, or sooner when room is given back
/// to the call's name or under one of its `keys` (rendered; registered
/// only while the limiter hears its store's notices). Each try is a call
/// of its own (resolved again: a limit changed meanwhile applies).
fn retry<'l>(
    limiter: &'l Limiter,
    spec: &'l CallSpec,
    identities: &[Identity],
    tiers: &[&str],
    costs: &[u64],
    max_wait: Duration,
    keys: PausedKeys,
) -> CallFuture<'l> {
    let start = Instant::now();
    let mut first_retry = None;
    if !limiter.pipeline.store.is_remote() {
        match limiter.decide_once(spec, identities, tiers, costs).now() {
            Some(Ok(permit)) => return CallFuture::ready(Ok(admitted(permit))),
            Some(Err(rejection)) => match next_try(&rejection, start, max_wait) {
                None => return CallFuture::ready(Err(rejection)),
                Some(at) => first_retry = Some(at),
            },
            None => {}
        }
    }
    let identities: Identities = identities.iter().cloned().collect();
    let tiers: Vec<Box<str>> = tiers.iter().map(|t| Box::from(*t)).collect();
    let costs: smallvec::SmallVec<[u64; 2]> = costs.iter().copied().collect();
    CallFuture::remote(async move {
        let tiers: Vec<&str> = tiers.iter().map(|t| &**t).collect();
        let freed = limiter.room.of(spec.name());
        // Before the first try: a notice heard between a refusal and the
        // sleep after it is kept for that sleep.
        let watching = limiter.room.watch(&keys);
        let mut woken = false;
        if let Some(at) = first_retry {
            woken = room::sleep_or_freed(at, &freed, &watching).await;
        }
        loop {
            match limiter.decide_once(spec, &identities, &tiers, &costs).await {
                Ok(mut permit) => {
                    permit.waited = start.elapsed();
                    if woken {
                        // Room was given back: it may fit the next one too.
                        limiter.room.freed(spec.name());
                        watching.pass_on();
                    }
                    return Ok(admitted(permit));
                }
                Err(rejection) => {
                    let Some(at) = next_try(&rejection, start, max_wait) else {
                        return Err(rejection);
                    };
                    woken = room::sleep_or_freed(at, &freed, &watching).await;
                }
            }
        }
    })
}

/// When to try a refused call again: after its `retry_after`, if that is
/// within `max_wait` of `start`. Only a call refused by a limit waits
/// (not a deny-listed or undecidable one).
fn next_try(rejection: &Rejection, start: Instant, max_wait: Duration) -> Option<Instant> {
    let RejectionReason::Limited { .. } = rejection.reason() else {
        return None;
    };
    let retry = rejection.retry_after()?.max(Duration::from_micros(1));
    let at = later(Instant::now(), retry);
    (at <= later(start, max_wait)).then_some(at)
}
