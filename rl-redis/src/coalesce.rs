//! [`Coalescer`]: the calls of several callers on one connection decided by
//! one `FCALL` (or `EVALSHA`) (see
//! [`RedisBackendBuilder::coalesce`](crate::RedisBackendBuilder::coalesce)).
//!
//! No timer. A call made while fewer than `in_flight` calls of its lane
//! are in flight and none waits is sent at once, alone, as it would be
//! without coalescing. Calls made while they are all in flight wait in the
//! lane's queue; when a call in flight returns, up to `max` of them (oldest
//! first) go as one `FCALL <library>_many` (see `lua/many.lua`), and the
//! reply is split back to each caller. So a lone call is never delayed,
//! and under load each lane has `in_flight` calls in flight. A drain that
//! answered its callers yields before it takes the queue again, so that
//! those who call again at once join the next coalesced call rather than
//! the one after (measured: more calls per coalesced call, and more
//! decisions per second at 16 and 64 callers; at 256 within the noise).
//!
//! On one server, two lanes: calls that may write go in `<library>_many`;
//! read-only calls (peeks) in `<library>_many_ro`, flagged `no-writes` like
//! their own entries, so that a peek is refused nowhere its own entry is
//! not. On a Redis Cluster, a lane per master (see [`crate::nodes`]) for
//! the single-limit acquires, in `<library>_many_node`, whose keys may be
//! of any slots the node serves; every other call goes alone there. In
//! [`CallMode::Scripts`], the same entries as scripts (`EVALSHA`,
//! `lua/many_script.lua`). A call
//! of a coalesced call that meets a slot served elsewhere (moved, or
//! moving) failed before it wrote anything, and is sent again alone.
//!
//! Each caller keeps its own deadline: one whose deadline passes gets
//! [`ratewall::error::BackendError::Timeout`] (its call may still run, as a
//! call alone that timed out after it was sent); a caller that gave up
//! before its turn came is not sent at all.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redis::RedisError;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::{Connection, Link, Reloader};
use crate::call_mode::CallMode;
#[cfg(feature = "cluster")]
use crate::script::{Entry, Op};
use crate::script::{Plan, SubCall, Via, is_missing_code, many_command, parse_many};

/// The most calls coalesced into one by default.
pub(crate) const DEFAULT_MAX: usize = 64;

/// The most calls of one lane in flight at once by default (measured, see
/// `docs/perf/coalesce_in_flight.md`: one pipelines less than calls alone;
/// two did best at 16 callers and as well as three or four at 64 and 256,
/// with larger coalesced calls; four better at 1 024).
pub(crate) const DEFAULT_IN_FLIGHT: usize = 2;

/// What one call comes back with: its reply's integers, or the error it
/// met (`None`: the deadline passed).
type Outcome = Result<Vec<i64>, Option<RedisError>>;

/// A call waiting for its turn.
struct Waiting {
    call: SubCall,
    deadline: Instant,
    reply: oneshot::Sender<Outcome>,
}

/// Where a lane's coalesced calls go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Destination {
    /// The one server: `<library>_many`, or `_many_ro` for read-only calls.
    Server,
    /// A Redis Cluster master: `<library>_many_node`, sent to the node
    /// serving the first call's slot.
    #[cfg(feature = "cluster")]
    Node,
}

/// One lane's state.
#[derive(Default)]
struct Queue {
    /// The lane's calls in flight (alone, or drains running).
    in_flight: usize,
    waiting: VecDeque<Waiting>,
}

/// The calls of one lane.
pub(crate) struct Lane {
    queue: Mutex<Queue>,
    destination: Destination,
}

impl Queue {
    /// A place in flight is given up without sending the queue (no runtime
    /// to send it on, or a drain dropped with its runtime): when no other
    /// call is in flight to hand the queue over, the waiting callers hear
    /// it at once (their channels close) rather than at their timeouts.
    fn give_up_place(&mut self) {
        self.in_flight -= 1;
        if self.in_flight == 0 {
            self.waiting.clear();
        }
    }
}

impl Lane {
    fn new(destination: Destination) -> Self {
        Self {
            queue: Mutex::default(),
            destination,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock leaves a queue that is still whole.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a backend's coalescing did so far (see
/// [`RedisBackend::coalesced`](crate::RedisBackend::coalesced)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoalescedCalls {
    /// Calls sent as their own single call: made while nothing was in
    /// flight, or alone in the queue when their turn came.
    pub alone: u64,
    /// Coalesced calls sent (`FCALL <library>_many` or `_many_ro`, or
    /// `EVALSHA` of the coalesced script in
    /// [`CallMode::Scripts`](crate::CallMode::Scripts)), each carrying the
    /// calls of two or more callers.
    pub batches: u64,
    /// Calls that went inside coalesced calls.
    pub batched: u64,
    /// The most calls one coalesced call carried.
    pub largest: u64,
    /// Calls of coalesced calls on a Redis Cluster node that met a slot
    /// the node no longer serves (or is moving), and were sent again alone.
    pub rerouted: u64,
}

/// The counts behind [`CoalescedCalls`].
#[derive(Default)]
struct Counts {
    alone: AtomicU64,
    batches: AtomicU64,
    batched: AtomicU64,
    largest: AtomicU64,
    rerouted: AtomicU64,
}

/// The lanes: two on one server, one per master on a Redis Cluster.
enum Lanes {
    /// `[0]`: calls that may write; `[1]`: read-only calls.
    Server([Arc<Lane>; 2]),
    #[cfg(feature = "cluster")]
    Cluster(crate::nodes::Nodes<Lane>),
}

impl Lanes {
    fn server() -> Self {
        Lanes::Server([
            Arc::new(Lane::new(Destination::Server)),
            Arc::new(Lane::new(Destination::Server)),
        ])
    }
}

/// Coalesces the calls made on one connection, to one server or to a
/// Redis Cluster's masters (see the module docs).
pub(crate) struct Coalescer {
    connection: Connection,
    reloader: Arc<Reloader>,
    target: Arc<str>,
    /// [`CallMode::Functions`] or [`CallMode::Scripts`].
    mode: CallMode,
    /// The most calls in one coalesced call (at least 1).
    max: usize,
    /// The most calls of one lane in flight at once (at least 1).
    in_flight: usize,
    lanes: Lanes,
    counts: Counts,
}

impl Coalescer {
    /// A coalescer over `connection` calling its Lua code as `mode` says
    /// (whose Functions library is reloaded through `reloader`); at most
    /// `max` calls in one, and `in_flight` calls of a lane at once.
    pub(crate) fn new(
        connection: Connection,
        reloader: Arc<Reloader>,
        target: Arc<str>,
        mode: CallMode,
        max: usize,
        in_flight: usize,
    ) -> Self {
        #[cfg(feature = "cluster")]
        let lanes = if connection.is_cluster() {
            Lanes::Cluster(crate::nodes::Nodes::new())
        } else {
            Lanes::server()
        };
        #[cfg(not(feature = "cluster"))]
        let lanes = Lanes::server();
        Self {
            connection,
            reloader,
            target,
            mode,
            max: max.max(1),
            in_flight: in_flight.max(1),
            lanes,
            counts: Counts::default(),
        }
    }

    fn link(&self) -> Link<'_> {
        Link {
            connection: &self.connection,
            reloader: &self.reloader,
            mode: self.mode,
            target: &self.target,
        }
    }

    /// What coalescing did so far.
    pub(crate) fn counts(&self) -> CoalescedCalls {
        CoalescedCalls {
            alone: self.counts.alone.load(Ordering::Relaxed),
            batches: self.counts.batches.load(Ordering::Relaxed),
            batched: self.counts.batched.load(Ordering::Relaxed),
            largest: self.counts.largest.load(Ordering::Relaxed),
            rerouted: self.counts.rerouted.load(Ordering::Relaxed),
        }
    }

    /// The lane `plan` queues in; `None`: it goes alone (on a cluster: not
    /// a single-limit acquire, or its node not known yet).
    fn lane(self: &Arc<Self>, plan: &Plan<'_, '_>) -> Option<Arc<Lane>> {
        match &self.lanes {
            Lanes::Server(lanes) => Some(Arc::clone(&lanes[usize::from(plan.entry.read_only())])),
            #[cfg(feature = "cluster")]
            Lanes::Cluster(nodes) => {
                if !matches!(plan.entry, Entry::Single(Op::Acquire, _)) {
                    return None;
                }
                let slot = crate::nodes::slot_of(plan.first_key()?.as_bytes());
                let (lane, stale) = nodes.lane(slot);
                if stale {
                    self.read_nodes();
                }
                lane
            }
        }
    }

    /// Reads the cluster's map in a task of its own, when it is due.
    #[cfg(feature = "cluster")]
    fn read_nodes(self: &Arc<Self>) {
        let Lanes::Cluster(nodes) = &self.lanes else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !nodes.claim_read(Instant::now()) {
            return;
        }
        let coalescer = Arc::clone(self);
        runtime.spawn(async move {
            let deadline = Instant::now() + READ_NODES_WITHIN;
            let reply = coalescer
                .connection
                .query::<redis::Value>(deadline, &redis::cmd("CLUSTER").arg("SLOTS").clone())
                .await
                .and_then(Result::ok);
            if reply.is_none() {
                tracing::debug!(
                    "could not read the cluster's slots; calls are grouped by the last map read"
                );
            }
            if let Lanes::Cluster(nodes) = &coalescer.lanes {
                nodes.update(reply, || Lane::new(Destination::Node));
            }
        });
    }

    /// Sends `plan` by `deadline`: at once when its lane has nothing in
    /// flight, else with the calls waiting beside it. `Err(None)` when the
    /// deadline passed first.
    pub(crate) async fn send(self: &Arc<Self>, deadline: Instant, plan: &Plan<'_, '_>) -> Outcome {
        let Some(lane) = self.lane(plan) else {
            self.counts.alone.fetch_add(1, Ordering::Relaxed);
            return self
                .link()
                .run(deadline, plan.entry, |via| plan.command(via))
                .await;
        };
        if self.take_turn(&lane) {
            return self.alone(lane, deadline, plan).await;
        }
        // Written out outside the lock (the lane may have emptied meanwhile).
        let call = plan.sub_call();
        let receiver = {
            let mut queue = lane.lock();
            if self.free(&queue) {
                queue.in_flight += 1;
                None
            } else {
                let (reply, receiver) = oneshot::channel();
                queue.waiting.push_back(Waiting {
                    call,
                    deadline,
                    reply,
                });
                Some(receiver)
            }
        };
        let Some(receiver) = receiver else {
            return self.alone(lane, deadline, plan).await;
        };
        match tokio::time::timeout_at(deadline, receiver).await {
            Ok(Ok(outcome)) => outcome,
            // The drain was dropped with its runtime.
            Ok(Err(_)) => Err(Some(RedisError::from((
                redis::ErrorKind::Io,
                "the coalesced call was dropped before it was answered",
            )))),
            Err(_) => Err(None),
        }
    }

    /// Whether a call may go now: fewer than the bound in flight, and none
    /// waiting before it.
    fn free(&self, queue: &Queue) -> bool {
        queue.in_flight < self.in_flight && queue.waiting.is_empty()
    }

    /// Takes one of `lane`'s places in flight if one is free; whether it did.
    fn take_turn(&self, lane: &Lane) -> bool {
        let mut queue = lane.lock();
        let free = self.free(&queue);
        if free {
            queue.in_flight += 1;
        }
        free
    }

    /// Sends `plan` alone as the lane's call in flight; when it is done
    /// (or dropped), the calls that queued meanwhile go.
    async fn alone(
        self: &Arc<Self>,
        lane: Arc<Lane>,
        deadline: Instant,
        plan: &Plan<'_, '_>,
    ) -> Outcome {
        let _turn = Turn {
            coalescer: self,
            lane,
        };
        self.counts.alone.fetch_add(1, Ordering::Relaxed);
        self.link()
            .run(deadline, plan.entry, |via| plan.command(via))
            .await
    }

    /// One of the lane's calls in flight is done: frees its place, or hands
    /// it and the queue to a drain task.
    fn hand_over(self: &Arc<Self>, lane: &Arc<Lane>) {
        let mut queue = lane.lock();
        if queue.waiting.is_empty() {
            queue.in_flight -= 1;
            return;
        }
        drop(queue);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // The guard is made here, not in the task: a task dropped
            // before it first runs (its runtime shutting down) still frees
            // the lane.
            let guard = Draining {
                coalescer: Arc::clone(self),
                lane: Arc::clone(lane),
                done: false,
            };
            runtime.spawn(guard.drain());
        } else {
            // No runtime to send them on.
            lane.lock().give_up_place();
        }
    }

    /// Sends `batch` (the one call alone as it would go alone), and answers
    /// each caller.
    async fn send_batch(&self, lane: &Lane, batch: Vec<Waiting>) {
        let Some(deadline) = batch.iter().map(|waiting| waiting.deadline).max() else {
            return;
        };
        let outcomes = if let [waiting] = batch.as_slice() {
            self.counts.alone.fetch_add(1, Ordering::Relaxed);
            let call = &waiting.call;
            vec![
                self.link()
                    .run(deadline, call.entry(), |via| call.command(via))
                    .await,
            ]
        } else {
            let count = batch.len() as u64;
            self.counts.batches.fetch_add(1, Ordering::Relaxed);
            self.counts.batched.fetch_add(count, Ordering::Relaxed);
            self.counts.largest.fetch_max(count, Ordering::Relaxed);
            tracing::trace!(calls = count, "coalesced rate-limit calls");
            let calls: Vec<&SubCall> = batch.iter().map(|waiting| &waiting.call).collect();
            self.run_many(lane.destination, deadline, &calls).await
        };
        for (waiting, outcome) in batch.into_iter().zip(outcomes) {
            // A caller that gave up meanwhile no longer listens.
            let _ = waiting.reply.send(outcome);
        }
    }

    /// Sends `calls` as one coalesced call. In [`CallMode::Functions`], it
    /// reloads the library when the server lacks it (once for every call
    /// that noticed); when it is missing again, each call goes alone by
    /// `EVAL` of its entry's source, as a call alone would. In
    /// [`CallMode::Scripts`], `EVALSHA`, then `EVAL` of the source when the
    /// server lacks the script, as a call alone. One outcome per call, in
    /// order.
    async fn run_many(
        &self,
        destination: Destination,
        deadline: Instant,
        calls: &[&SubCall],
    ) -> Vec<Outcome> {
        let every = |outcome: Outcome| calls.iter().map(|_| outcome.clone()).collect();
        let mut via = match self.mode {
            CallMode::Scripts => Via::ScriptSha,
            _ => Via::Function,
        };
        let mut reloaded = false;
        loop {
            let seen = self.reloader.generation();
            let reply = match destination {
                Destination::Server => {
                    self.connection
                        .query::<redis::Value>(deadline, &many_command(calls, via))
                        .await
                }
                #[cfg(feature = "cluster")]
                Destination::Node => {
                    let slot = calls
                        .first()
                        .and_then(|call| call.first_key())
                        .map_or(0, crate::nodes::slot_of);
                    let command = crate::script::many_node_command(calls, via);
                    self.connection
                        .query_at_slot::<redis::Value>(deadline, slot, &command)
                        .await
                }
            };
            match reply {
                None => return every(Err(None)),
                Some(Ok(value)) => {
                    let outcomes = match parse_many(calls.len(), value) {
                        Ok(replies) => replies.into_iter().map(|r| r.map_err(Some)).collect(),
                        Err(error) => every(Err(Some(error))),
                    };
                    #[cfg(feature = "cluster")]
                    if destination == Destination::Node {
                        return self.reroute(deadline, calls, outcomes).await;
                    }
                    return outcomes;
                }
                Some(Err(error)) if via == Via::ScriptSha && is_missing_code(&error) => {
                    // EVAL of the source runs it and caches it.
                    via = Via::ScriptSource;
                }
                Some(Err(error)) if via == Via::Function && is_missing_code(&error) => {
                    if reloaded || !self.link().reload(deadline, seen).await {
                        break;
                    }
                    reloaded = true;
                    tracing::debug!(
                        "the server lacked the rate-limit code; retrying the coalesced call"
                    );
                }
                Some(Err(error)) => return every(Err(Some(error))),
            }
        }
        tracing::debug!(
            "the server lacked the rate-limit code again; sending each coalesced call by EVAL"
        );
        let alone = calls.iter().map(|call| async move {
            self.connection
                .query::<Vec<i64>>(deadline, &call.command(Via::ScriptSource))
                .await
                .map_or(Err(None), |reply| reply.map_err(Some))
        });
        futures_util::future::join_all(alone).await
    }

    /// Sends alone (following the cluster's redirections) each call of a
    /// coalesced call on a cluster node that met a slot the node does not
    /// serve: it failed at its first read, before it wrote anything. The
    /// map is read again.
    #[cfg(feature = "cluster")]
    async fn reroute(
        &self,
        deadline: Instant,
        calls: &[&SubCall],
        mut outcomes: Vec<Outcome>,
    ) -> Vec<Outcome> {
        let elsewhere: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(_, outcome)| matches!(outcome, Err(Some(error)) if served_elsewhere(error)))
            .map(|(i, _)| i)
            .collect();
        if elsewhere.is_empty() {
            return outcomes;
        }
        if let Lanes::Cluster(nodes) = &self.lanes {
            nodes.stale();
        }
        self.counts
            .rerouted
            .fetch_add(elsewhere.len() as u64, Ordering::Relaxed);
        tracing::debug!(
            calls = elsewhere.len(),
            "coalesced calls met slots served elsewhere; sending them alone"
        );
        let alone = elsewhere.iter().map(|&i| {
            let call = calls[i];
            self.link()
                .run(deadline, call.entry(), |via| call.command(via))
        });
        for (i, outcome) in elsewhere
            .iter()
            .zip(futures_util::future::join_all(alone).await)
        {
            outcomes[*i] = outcome;
        }
        outcomes
    }
}

/// How long a read of the cluster's map may take.
#[cfg(feature = "cluster")]
const READ_NODES_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether a call's error says that its key's slot is served by another
/// node (moved, or moving and the key not here), where the call did not
/// run: Redis refuses a script's access to such a key before running it.
#[cfg(feature = "cluster")]
fn served_elsewhere(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        redis::ErrorKind::Server(
            redis::ServerErrorKind::Moved
                | redis::ServerErrorKind::Ask
                | redis::ServerErrorKind::TryAgain
        )
    ) || error.to_string().contains("non local key")
}

/// The turn of a call sent alone: when it ends (done or dropped), the lane
/// is handed over.
struct Turn<'c> {
    coalescer: &'c Arc<Coalescer>,
    lane: Arc<Lane>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.coalescer.hand_over(&self.lane);
    }
}

/// A drain under way: dropped before it emptied its queue (its runtime
/// shut down, before or after it first ran), it frees the lane and drops
/// the waiting calls, whose callers hear it at once.
struct Draining {
    coalescer: Arc<Coalescer>,
    lane: Arc<Lane>,
    done: bool,
}

impl Draining {
    /// Sends the lane's queue, up to `max` calls at a time, until it is
    /// empty.
    async fn drain(mut self) {
        let coalescer = Arc::clone(&self.coalescer);
        let lane = Arc::clone(&self.lane);
        loop {
            let batch: Vec<Waiting> = {
                let mut queue = lane.lock();
                // Callers that gave up: their calls are not sent.
                queue.waiting.retain(|waiting| !waiting.reply.is_closed());
                if queue.waiting.is_empty() {
                    queue.in_flight -= 1;
                    self.done = true;
                    return;
                }
                let count = queue.waiting.len().min(coalescer.max);
                queue.waiting.drain(..count).collect()
            };
            coalescer.send_batch(&lane, batch).await;
            // The callers just answered run first: those that call again
            // at once join the next batch (a yield, not a timer: nothing
            // else to run, it goes on at once).
            tokio::task::yield_now().await;
        }
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        if !self.done {
            self.lane.lock().give_up_place();
        }
    }
}
