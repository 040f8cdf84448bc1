//! The abandon layer: calls the limiter gave up on, taken back once the
//! backend answers again, before it decides anything else.
//!
//! A call to a remote store that times out (or whose connection breaks)
//! may still run: Redis frozen for a few seconds executes what it had
//! received when it resumes. The limiter has meanwhile answered the call
//! by its failure policy (and, for a settled call, given its units back in
//! process only), so whatever the late call takes in the store is taken for
//! nothing: a count-failures limit then counts failures that never
//! happened. Such calls carry a request id ([`Backend::acquire_once`]);
//! when one is given up on, its cancel by id ([`Backend::cancel_once`]) is
//! queued here and sent as soon as the backend answers again, whether the
//! call ran before (its units are given back) or runs after (a tombstone
//! makes it take nothing). While cancels wait, this layer answers every
//! decision as a backend failure (the failure policy above decides it), so
//! no call is decided on state a cancel is about to change, and queues a
//! reset or cancel behind them (answered at once as not yet applied: it is
//! sent in order once the backend answers). What the sending task learns
//! feeds the circuit breaker: its failures open it, its success closes it,
//! so a limiter whose backend is away fails fast on every kind of call and
//! is back on the backend as soon as the backend answers again.
//!
//! The queue is bounded ([`CAPACITY`]); past it, the oldest cancel is
//! dropped (logged, counted). A process that dies before sending its
//! cancels leaves those calls counted in the store, as used, until their
//! limits refill: the store cannot tell an abandoned call from a used one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::breaker::{Breaker, Permission};
use super::{Answer, Call, Layer, Plan};
use crate::model::error::{BackendError, Error};
use crate::model::key::Key;
use crate::model::limit::Limit;
use crate::store::backend::{Backend, Request};
use crate::store::target::{Op, Target};

/// Cancels kept at most; past it the oldest is dropped.
pub(crate) const CAPACITY: usize = 10_000;

/// How soon a cancel the backend failed is sent again.
const RETRY: Duration = Duration::from_millis(100);

/// What to send once the backend answers: a call taken back by its request
/// id, or a reset that could not be sent (both idempotent: sending one
/// twice does what sending it once does). Each with its requests (key,
/// limit, cost, in-flight lease id).
#[derive(Debug)]
struct Cancel {
    requests: Box<[(Key, Limit, u64, u64)]>,
    /// The request id to cancel; `None`: reset the requests' state.
    id: Option<Box<str>>,
}

/// The queue of cancels and the task that sends them.
#[derive(Debug)]
pub(crate) struct Abandoned {
    backend: Arc<dyn Backend>,
    /// Whether the backend takes calls back by request id
    /// ([`Backend::cancels_once`]).
    pub(crate) cancels: bool,
    queue: Mutex<VecDeque<Cancel>>,
    running: AtomicBool,
    /// Told each time the queue empties.
    drained: Notify,
    /// The limiter's circuit breaker, told what each send learns.
    breaker: Option<Arc<Breaker>>,
}

/// Whether a call that failed with `error` may still run in the store: it
/// was sent, but its answer never came.
fn may_still_run(error: &Error) -> bool {
    matches!(
        error,
        Error::Backend(BackendError::Timeout(_) | BackendError::Unavailable(_))
    )
}

impl Abandoned {
    /// The queue of cancels for `backend`; each send's outcome is told to
    /// `breaker`.
    pub(crate) fn new(backend: Arc<dyn Backend>, breaker: Option<Arc<Breaker>>) -> Self {
        Self {
            cancels: backend.cancels_once(),
            backend,
            queue: Mutex::new(VecDeque::new()),
            running: AtomicBool::new(false),
            drained: Notify::new(),
            breaker,
        }
    }

    /// Queues the cancel of the call `id` over `targets` (or, without an
    /// id, a reset of `targets`) and makes sure the task sending them runs.
    pub(crate) fn push(self: &Arc<Self>, targets: &[Target<'_>], id: Option<&str>) {
        let cancel = Cancel {
            requests: targets
                .iter()
                .map(|t| (t.key.render(), *t.limit, t.cost, t.lease))
                .collect(),
            id: id.map(Box::from),
        };
        let mut queue = self.queue.lock();
        if queue.len() >= CAPACITY {
            queue.pop_front();
            metrics::counter!("ratewall_abandoned_total", "result" => "dropped").increment(1);
            tracing::warn!(
                capacity = CAPACITY,
                "too many abandoned calls waiting for the backend: the oldest will stay counted there"
            );
        }
        queue.push_back(cancel);
        drop(queue);
        metrics::counter!("ratewall_abandoned_total", "result" => "queued").increment(1);
        self.ensure_task();
    }

    /// Cancels waiting to be sent.
    pub(crate) fn pending(&self) -> usize {
        self.queue.lock().len()
    }

    /// Waits until every cancel queued so far was sent (or dropped).
    pub(crate) async fn flush(self: &Arc<Self>) {
        loop {
            let mut drained = std::pin::pin!(self.drained.notified());
            drained.as_mut().enable();
            if self.pending() == 0 {
                return;
            }
            self.ensure_task();
            drained.await;
        }
    }

    /// Starts the sending task on the current Tokio runtime unless it runs
    /// (without a runtime the cancels wait for the next call made on one).
    fn ensure_task(self: &Arc<Self>) {
        if self.running.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        runtime.spawn(send(Arc::downgrade(self)));
    }

    /// Sends the oldest cancel; whether the backend took it.
    async fn send_one(&self) -> Option<Result<(), BackendError>> {
        let (requests, id) = {
            let queue = self.queue.lock();
            let cancel = queue.front()?;
            (cancel.requests.clone(), cancel.id.clone())
        };
        let batch: Vec<Request<'_>> = requests
            .iter()
            .map(|(key, limit, cost, holder)| Request::new(key, limit, *cost).with_holder(*holder))
            .collect();
        let result = match &id {
            Some(id) => self.backend.cancel_once(&batch, id).await,
            None => self.backend.reset(&batch).await,
        };
        if result.is_ok() {
            let mut queue = self.queue.lock();
            if queue
                .front()
                .is_some_and(|c| c.id == id && *c.requests == *requests)
            {
                queue.pop_front();
            }
            metrics::counter!("ratewall_abandoned_total", "result" => "cancelled").increment(1);
        }
        if let Some(breaker) = &self.breaker {
            match &result {
                Ok(()) => breaker.success(Permission::Call),
                Err(_) => breaker.failure(Permission::Call),
            }
        }
        Some(result)
    }
}

/// The task: sends queued cancels one by one while the backend answers,
/// trying again every 100 ms while it does not (each try is bounded by
/// the backend's own timeout); ends when the queue is empty or the limiter
/// is gone.
async fn send(abandoned: Weak<Abandoned>) {
    loop {
        let Some(this) = abandoned.upgrade() else {
            return;
        };
        match this.send_one().await {
            None => {
                this.running.store(false, Ordering::Release);
                this.drained.notify_waiters();
                // A cancel queued between the check and the flag: go on.
                if this.pending() == 0 || this.running.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
            Some(Ok(())) => {}
            Some(Err(error)) => {
                tracing::debug!(%error, pending = this.pending(), "backend still failing; abandoned calls wait");
                drop(this);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

impl Layer for Arc<Abandoned> {
    /// Remote stores only (the memory store never gives a call up).
    fn applies(&self, plan: &Plan<'_>) -> bool {
        plan.remote
    }

    /// While cancels wait, a decision is answered as a backend failure, and
    /// a reset or cancel for the backend is queued behind them.
    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        if call.local_only || self.pending() == 0 {
            return None;
        }
        let message = match call.op {
            Op::Acquire | Op::AcquireOnce(_) | Op::Reserve(_) | Op::Peek(_) => {
                "calls given up on earlier are being taken back first"
            }
            Op::Reset => {
                self.push(call.targets, None);
                "queued behind calls given up on earlier: sent once the backend answers"
            }
            Op::CancelOnce(id) => {
                self.push(call.targets, Some(id));
                "queued behind calls given up on earlier: sent once the backend answers"
            }
            _ => return None,
        };
        self.ensure_task();
        Some(Answer::Failed(Error::Backend(BackendError::unavailable(
            message,
        ))))
    }

    /// What failed and must still reach the backend is queued: an acquire
    /// with a request id that was sent but not answered (to be cancelled
    /// by that id), a cancel by id or a reset that failed in any way (each
    /// idempotent, sent again).
    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        let Answer::Failed(error) = &*answer else {
            return;
        };
        match call.op {
            Op::AcquireOnce(id) if may_still_run(error) => self.push(call.targets, Some(id)),
            Op::CancelOnce(id) if !call.local_only => self.push(call.targets, Some(id)),
            Op::Reset if !call.local_only => self.push(call.targets, None),
            _ => {}
        }
    }
}
