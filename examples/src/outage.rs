//! What the `sms` service decides while Redis is down.
//!
//! The service's limiter uses [`rl_core::FailurePolicy::Local`]: when Redis
//! cannot decide, the call is decided in process with the per-instance share
//! of each limit. On its own that would give a phone Redis had already
//! blocked a fresh local quota for the length of the outage. [`OutageGuard`]
//! is a [`Backend`] layer in front of Redis that prevents it: it remembers,
//! for every key and limit, until when Redis last said it was at its limit,
//! and while Redis fails it refuses those at once (a normal refusal, with
//! the remaining wait); every other call gets Redis' error and so the
//! limiter's local fallback.
//!
//! What it remembers, from each answer Redis gives to a decision:
//! - a refused limit: blocked until its `retry_after` from now;
//! - a limit the admitted call left with fewer units than it costs: blocked
//!   until its `reset_after` from now (the time until its state is fresh;
//!   Redis' next admission may come earlier, so this errs on refusing);
//! - any other limit: not blocked (forgets an earlier entry, e.g. after a
//!   reset made by another process).
//!
//! It is consulted only when Redis fails, so once Redis answers again its
//! state rules. A reset through this process forgets the key here too.
//!
//! While Redis fails, the guard asks it again at most once per
//! [`RETRY_EVERY`] (one probe at a time) and answers the other
//! calls at once. It must see every call of an outage, so build the limiter
//! with [`rl_core::BreakerConfig::disabled`]: the limiter's own circuit
//! breaker would apply the failure policy without asking the guard.
//!
//! Memory is bounded: at most [`CAPACITY`] keys; a full map drops its
//! expired entries, then the quarter of the keys that end soonest. A
//! decision allocates nothing here unless it blocks a key not yet held.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rl_core::{Backend, BackendError, BoxFuture, Decision, Decisions, Limit, Request};

/// Keys remembered at most.
pub const CAPACITY: usize = 100_000;

/// How long after a failure the inner backend is not asked again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// Until when one key was at one of its limits, as Redis last said.
#[derive(Debug, Clone, Copy)]
struct Blocked {
    until: Instant,
    /// The limit's capacity as Redis reported it (`Decision::limit`).
    capacity: u64,
}

/// Per key, its blocked limits.
type Blocks = HashMap<Box<str>, Vec<(Limit, Blocked)>>;

/// A [`Backend`] layer that refuses, while the inner backend fails, what the
/// inner backend last said was at its limit; see the module docs.
#[derive(Debug)]
pub struct OutageGuard<B> {
    inner: B,
    blocked: Mutex<Blocks>,
    epoch: Instant,
    /// Nanoseconds after `epoch` before which the inner backend is not
    /// asked again (0: it answered last time).
    down_until: AtomicU64,
    /// Whether a probe of a failing backend is under way.
    probing: AtomicBool,
}

/// Whether a call may ask the inner backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    Yes,
    AsProbe,
    No,
}

impl<B: Backend> OutageGuard<B> {
    /// Guards `inner`.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            blocked: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            down_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// How many keys are remembered as blocked (expired ones included until
    /// swept).
    pub fn remembered(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Blocks> {
        self.blocked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn ask(&self) -> Ask {
        let until = self.down_until.load(Ordering::Acquire);
        if until == 0 {
            Ask::Yes
        } else if self.nanos(Instant::now()) < until {
            Ask::No
        } else if !self.probing.swap(true, Ordering::AcqRel) {
            Ask::AsProbe
        } else {
            Ask::No
        }
    }

    fn answered(&self, ask: Ask) {
        self.down_until.store(0, Ordering::Release);
        if ask == Ask::AsProbe {
            self.probing.store(false, Ordering::Release);
        }
    }

    fn failed(&self, ask: Ask) {
        let retry = u64::try_from(RETRY_EVERY.as_nanos()).unwrap_or(u64::MAX);
        let until = self.nanos(Instant::now()).saturating_add(retry).max(1);
        self.down_until.store(until, Ordering::Release);
        if ask == Ask::AsProbe {
            self.probing.store(false, Ordering::Release);
        }
    }

    /// Records what the inner backend said about `requests`.
    fn learn(&self, requests: &[Request<'_>], decisions: &Decisions) {
        let now = Instant::now();
        let admitted = decisions.allowed();
        let mut blocked = self.lock();
        for (request, decision) in requests.iter().zip(decisions.iter()) {
            let wait = if !decision.allowed {
                Some(decision.retry_after)
            } else if admitted && decision.remaining < request.cost {
                Some(decision.reset_after)
            } else {
                None
            };
            let key = request.key.as_str();
            match wait {
                Some(wait) if !wait.is_zero() => {
                    let entry = Blocked {
                        until: now + wait,
                        capacity: decision.limit,
                    };
                    if let Some(limits) = blocked.get_mut(key) {
                        match limits.iter_mut().find(|(l, _)| l == request.limit) {
                            Some((_, held)) => *held = entry,
                            None => limits.push((*request.limit, entry)),
                        }
                    } else {
                        if blocked.len() >= CAPACITY {
                            make_room(&mut blocked, now);
                        }
                        blocked.insert(key.into(), vec![(*request.limit, entry)]);
                    }
                }
                _ => unblock(&mut blocked, request),
            }
        }
    }

    /// Forgets `requests`' keys and limits (they were reset).
    fn forget(&self, requests: &[Request<'_>]) {
        let mut blocked = self.lock();
        for request in requests {
            unblock(&mut blocked, request);
        }
    }

    /// While the inner backend fails: a refusal when a request is known to
    /// be blocked, else the failure (and so the limiter's failure policy).
    fn without_backend(
        &self,
        requests: &[Request<'_>],
        error: BackendError,
    ) -> Result<Decisions, BackendError> {
        let now = Instant::now();
        let blocked = self.lock();
        let known: Vec<Option<(Duration, u64)>> = requests
            .iter()
            .map(|request| {
                blocked
                    .get(request.key.as_str())
                    .and_then(|limits| limits.iter().find(|(l, _)| l == request.limit))
                    .filter(|(_, b)| b.until > now)
                    .map(|(_, b)| (b.until - now, b.capacity))
            })
            .collect();
        drop(blocked);
        if known.iter().all(Option::is_none) {
            return Err(error);
        }
        let at_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        Ok(Decisions::new(requests.iter().zip(known).map(
            |(request, known)| match known {
                Some((wait, capacity)) => Decision {
                    allowed: false,
                    limit: capacity,
                    remaining: 0,
                    retry_after: wait,
                    reset_after: wait,
                    at_micros,
                },
                // Not known to be blocked: reported as Redis would a limit
                // that alone would admit the call (the call is refused by
                // another one, so nothing is consumed).
                None => Decision {
                    allowed: true,
                    limit: request.limit.capacity(),
                    remaining: 0,
                    retry_after: Duration::ZERO,
                    reset_after: Duration::ZERO,
                    at_micros,
                },
            },
        )))
    }

    /// Asks the inner backend with `call` (made only when it is asked: a
    /// backend may decide as soon as its future is made).
    async fn decide<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        call: impl FnOnce() -> BoxFuture<'a, Result<Decisions, BackendError>>,
    ) -> Result<Decisions, BackendError> {
        let ask = self.ask();
        if ask == Ask::No {
            return self.without_backend(
                requests,
                BackendError::unavailable(
                    "Redis failed less than a second ago; not asked again yet",
                ),
            );
        }
        match call().await {
            Ok(decisions) => {
                self.answered(ask);
                self.learn(requests, &decisions);
                Ok(decisions)
            }
            Err(error @ BackendError::Invalid(_)) => {
                self.answered(ask);
                Err(error)
            }
            Err(error) => {
                self.failed(ask);
                self.without_backend(requests, error)
            }
        }
    }
}

/// Forgets `request`'s key and limit.
fn unblock(blocked: &mut Blocks, request: &Request<'_>) {
    let key = request.key.as_str();
    if let Some(limits) = blocked.get_mut(key) {
        limits.retain(|(l, _)| l != request.limit);
        if limits.is_empty() {
            blocked.remove(key);
        }
    }
}

/// When the last of a key's blocks ends.
fn last_end(limits: &[(Limit, Blocked)]) -> Option<Instant> {
    limits.iter().map(|(_, b)| b.until).max()
}

/// Drops expired entries, then, if still three quarters full, the quarter
/// of the keys that end soonest (so a full map costs one pass per quarter
/// of the capacity inserted, not one per insert).
fn make_room(blocked: &mut Blocks, now: Instant) {
    blocked.retain(|_, limits| {
        limits.retain(|(_, b)| b.until > now);
        !limits.is_empty()
    });
    let keep = CAPACITY * 3 / 4;
    if blocked.len() > keep {
        let mut ends: Vec<Instant> = blocked.values().filter_map(|l| last_end(l)).collect();
        let cut = blocked.len() - keep;
        let (_, cutoff, _) = ends.select_nth_unstable(cut - 1);
        let cutoff = *cutoff;
        blocked.retain(|_, limits| last_end(limits).is_some_and(|end| end > cutoff));
    }
}

impl<B: Backend> Backend for OutageGuard<B> {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        Box::pin(self.decide(requests, || self.inner.acquire(requests)))
    }

    fn acquire_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        Box::pin(self.decide(requests, || self.inner.acquire_once(requests, request_id)))
    }

    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.inner.peek(requests)
    }

    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.forget(requests);
        self.inner.refund(requests, at_micros)
    }

    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        self.forget(requests);
        self.inner.reset(requests)
    }

    fn publish_limits<'a>(
        &'a self,
        prefix: &'a str,
        name: &'a str,
        limits: &'a [Limit],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.publish_limits(prefix, name, limits)
    }
}

#[cfg(test)]
mod tests {
    use rl_core::{Algorithm, Key, MemoryBackend};

    use super::*;

    /// A backend that answers like the one inside, or fails on demand.
    #[derive(Debug, Default)]
    struct Switch {
        memory: MemoryBackend,
        down: AtomicBool,
    }

    impl Backend for Switch {
        fn acquire<'a>(
            &'a self,
            requests: &'a [Request<'a>],
        ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
            if self.down.load(Ordering::Relaxed) {
                return Box::pin(async { Err(BackendError::unavailable("down")) });
            }
            self.memory.acquire(requests)
        }
        fn peek<'a>(
            &'a self,
            requests: &'a [Request<'a>],
        ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
            self.memory.peek(requests)
        }
        fn refund<'a>(
            &'a self,
            requests: &'a [Request<'a>],
            at_micros: u64,
        ) -> BoxFuture<'a, Result<(), BackendError>> {
            self.memory.refund(requests, at_micros)
        }
        fn reset<'a>(
            &'a self,
            requests: &'a [Request<'a>],
        ) -> BoxFuture<'a, Result<(), BackendError>> {
            self.memory.reset(requests)
        }
    }

    fn limit() -> Limit {
        Limit::per_minute(2)
            .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
            .unwrap()
    }

    #[tokio::test]
    async fn while_down_a_key_at_its_limit_is_refused_and_others_get_the_failure() {
        let guard = OutageGuard::new(Switch::default());
        let limit = limit();
        let (full, refused, fresh) = (
            Key::new("t", "p", "full"),
            Key::new("t", "p", "refused"),
            Key::new("t", "p", "fresh"),
        );
        let call = |key| [Request::new(key, &limit, 1)];
        for _ in 0..2 {
            assert!(guard.acquire(&call(&full)).await.unwrap().allowed());
            assert!(guard.acquire(&call(&refused)).await.unwrap().allowed());
        }
        assert!(!guard.acquire(&call(&refused)).await.unwrap().allowed());
        assert!(guard.acquire(&call(&fresh)).await.unwrap().allowed());

        guard.inner.down.store(true, Ordering::Relaxed);
        for key in [&full, &refused] {
            let decisions = guard.acquire(&call(key)).await.expect("refused locally");
            assert!(!decisions.allowed());
            let wait = decisions.binding().retry_after;
            assert!(wait > Duration::from_secs(59) && wait <= Duration::from_secs(60));
        }
        assert!(
            guard.acquire(&call(&fresh)).await.is_err(),
            "one unit left: the failure policy decides"
        );
        // A multi-key call is refused by its blocked key, whatever the other.
        let both = [
            Request::new(&fresh, &limit, 1),
            Request::new(&full, &limit, 1),
        ];
        let decisions = guard.acquire(&both).await.unwrap();
        assert!(!decisions.allowed());
        assert!(decisions[0].allowed && !decisions[1].allowed);

        // A reset forgets, even while down.
        let _ = guard.reset(&call(&full)).await;
        assert!(guard.acquire(&call(&full)).await.is_err());
    }

    #[tokio::test]
    async fn once_the_backend_answers_it_rules_and_unblocked_keys_are_forgotten() {
        let guard = OutageGuard::new(Switch::default());
        let limit = limit();
        let key = Key::new("t", "p", "a");
        let call = [Request::new(&key, &limit, 1)];
        guard.acquire(&call).await.unwrap();
        guard.acquire(&call).await.unwrap();
        assert_eq!(guard.remembered(), 1);
        // Reset behind the guard's back (another process): Redis rules.
        guard.inner.memory.reset(&call).await.unwrap();
        assert!(guard.acquire(&call).await.unwrap().allowed());
        assert_eq!(guard.remembered(), 0, "one unit left: not blocked");
    }

    #[tokio::test]
    async fn after_a_failure_the_backend_is_asked_again_only_by_a_probe() {
        let guard = OutageGuard::new(Switch::default());
        let limit = limit();
        let key = Key::new("t", "p", "a");
        let call = [Request::new(&key, &limit, 1)];
        guard.inner.down.store(true, Ordering::Relaxed);
        assert!(guard.acquire(&call).await.is_err());
        guard.inner.down.store(false, Ordering::Relaxed);
        assert!(
            guard.acquire(&call).await.is_err(),
            "within RETRY_EVERY of the failure the backend is not asked"
        );
        guard.down_until.store(1, Ordering::Release); // as if RETRY_EVERY had passed
        assert!(guard.acquire(&call).await.unwrap().allowed(), "the probe");
        let again = guard.acquire(&call).await;
        assert!(again.as_ref().unwrap().allowed(), "closed again: {again:?}");
    }

    #[test]
    fn a_full_map_makes_room_by_dropping_what_ends_first() {
        let now = Instant::now();
        let limit = limit();
        let mut blocked = HashMap::new();
        let capacity = CAPACITY;
        for i in 0..capacity {
            let entry = Blocked {
                until: now + Duration::from_secs(1 + i as u64),
                capacity: 2,
            };
            blocked.insert(i.to_string().into_boxed_str(), vec![(limit, entry)]);
        }
        make_room(&mut blocked, now);
        assert_eq!(blocked.len(), capacity * 3 / 4);
        assert!(!blocked.contains_key("0"), "ends first");
        assert!(blocked.contains_key((capacity - 1).to_string().as_str()));
    }
}
