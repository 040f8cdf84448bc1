//! The in-memory backend under concurrency, batches and key rotation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratewall::{
    Algorithm, CallSpec, GroupSpec, Key, Limit, Limiter,
    backend::{Backend, MemoryBackend, Request},
    call::Counting,
    clock::ManualClock,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_tasks_on_one_key_admit_exactly_the_threshold() {
    for algorithm in Algorithm::ALL {
        let limiter = Arc::new(Limiter::builder().memory().build().unwrap());
        let limit = Limit::per_hour(100)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let admitted = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..1000)
            .map(|_| {
                let (limiter, admitted) = (limiter.clone(), admitted.clone());
                tokio::spawn(async move {
                    let key = limiter.key("concurrency", &"one-key");
                    if limiter
                        .requests()
                        .acquire(&key, &limit, 1)
                        .await
                        .unwrap()
                        .allowed()
                    {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(admitted.load(Ordering::SeqCst), 100, "{algorithm}");
    }
}

#[tokio::test]
async fn a_batch_refused_by_one_limit_consumes_nothing_from_the_others() {
    let clock = ManualClock::new(1_000_000_000);
    let backend = MemoryBackend::with_clock(clock.clone());
    let phone = Key::new("rl", "sms", "+8613800000000");
    let minute = Limit::per_minute(1)
        .unwrap()
        .with_algorithm(Algorithm::SlidingLog)
        .unwrap();
    let day = Limit::per_day(2)
        .unwrap()
        .with_algorithm(Algorithm::FixedWindow)
        .unwrap();
    let batch = [
        Request::new(&phone, &minute, 1),
        Request::new(&phone, &day, 1),
    ];

    assert!(backend.acquire(&batch).await.unwrap().allowed());
    clock.advance(Duration::from_secs(61));
    assert!(backend.acquire(&batch).await.unwrap().allowed());
    clock.advance(Duration::from_secs(61));
    let refused = backend.acquire(&batch).await.unwrap();
    assert!(!refused.allowed());
    assert!(refused[0].allowed(), "the minute limit alone would allow");
    assert!(!refused[1].allowed(), "the daily limit refuses");
    // The refused batch took nothing from the minute limit.
    let minute_alone = backend.peek(&batch[..1]).await.unwrap();
    assert_eq!(minute_alone[0].remaining(), 1);
}

#[tokio::test]
async fn rotating_keys_do_not_grow_memory_without_bound() {
    let clock = ManualClock::new(1_000_000_000);
    let backend = MemoryBackend::with_clock(clock.clone());
    let limit = Limit::per_second(5).unwrap();
    for round in 0..4u64 {
        for i in 0..40_000u64 {
            let key = Key::new("rl", "rotate", &format!("{round}-{i}"));
            backend
                .acquire(&[Request::new(&key, &limit, 1)])
                .await
                .unwrap();
        }
        clock.advance(Duration::from_secs(2));
    }
    // 160 000 keys were written; expired ones are swept as shards grow.
    assert!(backend.len() < 100_000, "held {} keys", backend.len());
    backend.evict_expired();
    assert_eq!(backend.len(), 0);
}

#[tokio::test]
async fn a_batch_naming_one_state_twice_is_invalid_and_consumes_nothing() {
    let backend = MemoryBackend::new();
    let key = Key::new("dup", "sms", "+33600000000");
    let other = Key::new("dup", "sms", "+33600000001");
    let one = Limit::per_minute(1).unwrap();
    let three = Limit::per_minute(3).unwrap();
    let error = backend
        .acquire(&[Request::new(&key, &one, 1), Request::new(&key, &three, 1)])
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid request: limits 1/1m (gcra) and 3/1m (gcra) share an algorithm and period on one key; keep one"
    );
    assert!(
        backend
            .acquire_once(
                &[Request::new(&key, &one, 1), Request::new(&key, &one, 1)],
                "r1"
            )
            .await
            .is_err()
    );
    // Nothing was consumed: the one-per-minute limit still has its unit.
    let decisions = backend
        .acquire(&[Request::new(&key, &one, 1)])
        .await
        .unwrap();
    assert!(decisions.allowed());
    // The same limit on two different keys is two states, and fine.
    let third = Key::new("dup", "sms", "+33600000002");
    let decisions = backend
        .acquire(&[Request::new(&other, &one, 1), Request::new(&third, &one, 1)])
        .await
        .unwrap();
    assert!(decisions.allowed());
}

#[tokio::test]
async fn cost_above_capacity_is_an_error_not_a_refusal() {
    let limiter = Limiter::builder().build().unwrap();
    let key = limiter.key("cost", &1);
    let err = limiter
        .requests()
        .acquire(&key, &Limit::per_minute(3).unwrap(), 4)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cost 4 exceeds the capacity 3: such a call could never be allowed"
    );
    let backend = MemoryBackend::new();
    let limit = Limit::per_minute(3).unwrap();
    assert!(
        backend
            .acquire(&[Request::new(&key, &limit, 4)])
            .await
            .is_err()
    );
}

#[test]
fn invalid_prefixes_are_refused_at_construction() {
    let err = Limiter::builder().prefix("a{b").build().unwrap_err();
    assert!(err.to_string().contains("invalid key prefix"), "{err}");
}

#[tokio::test]
async fn reset_forgets_one_identity_only() {
    let limiter = Limiter::builder().build().unwrap();
    let limit = Limit::per_hour(1).unwrap();
    let (alice, bob) = (limiter.key("reset", &"alice"), limiter.key("reset", &"bob"));
    limiter.requests().acquire(&alice, &limit, 1).await.unwrap();
    limiter.requests().acquire(&bob, &limit, 1).await.unwrap();
    limiter
        .requests()
        .reset_all(&[Request::new(&alice, &limit, 1)])
        .await
        .unwrap();
    assert!(
        limiter
            .requests()
            .acquire(&alice, &limit, 1)
            .await
            .unwrap()
            .allowed()
    );
    assert!(
        !limiter
            .requests()
            .acquire(&bob, &limit, 1)
            .await
            .unwrap()
            .allowed()
    );
}

/// One group named `name` with `limits` (the public call API, as the macro
/// expands to it).
fn spec(name: &'static str, groups: Vec<GroupSpec>) -> CallSpec {
    CallSpec::owned(name, groups)
}

fn group(name: &'static str, limits: &[&str], algorithm: Algorithm) -> GroupSpec {
    GroupSpec::owned(
        name,
        limits
            .iter()
            .map(|l| {
                l.parse::<Limit>()
                    .unwrap()
                    .with_algorithm(algorithm)
                    .unwrap()
            })
            .collect(),
    )
}

#[tokio::test]
async fn the_call_future_is_send_even_for_identities_that_are_not_sync() {
    static LIMITS: [Limit; 1] = [Limit::from_parts_const(
        1,
        60_000_000,
        Algorithm::Gcra,
        1,
        10,
    )];
    static GROUPS: [GroupSpec; 1] = [GroupSpec::new("send_check", &LIMITS)];
    static SPEC: CallSpec = CallSpec::new("send_check", &GROUPS);
    fn assert_send<T: Send>(value: T) -> T {
        value
    }
    let limiter = Limiter::builder().build().unwrap();
    // `Limiter::call` takes `Sync` identities (so a temporary list of them
    // held across an `.await` keeps the caller's future `Send`); any other
    // goes through `Keys::parts`, read before the call returns.
    let identity: std::rc::Rc<str> = "not-sync".into();
    let first = assert_send(limiter.call_with(
        &SPEC,
        ratewall::Keys::parts(&[ratewall::key::Part::Display(&identity)]),
    ));
    drop(identity);
    assert!(first.await.is_ok());
    assert!(
        limiter.call(&SPEC, &[&"not-sync"]).await.is_err(),
        "same identity, limit 1"
    );
}

#[tokio::test]
async fn runtime_limits_replace_the_compiled_ones_by_name() {
    let live = spec(
        "live",
        vec![group("live", &["1/1m"], Algorithm::SlidingLog)],
    );
    let limiter = Limiter::builder().build().unwrap();
    assert!(limiter.call(&live, &[&"u"]).await.is_ok());
    assert!(limiter.call(&live, &[&"u"]).await.is_err());
    limiter
        .settings()
        .set_limits(
            "live",
            vec![
                Limit::per_minute(3)
                    .unwrap()
                    .with_algorithm(Algorithm::SlidingLog)
                    .unwrap(),
            ],
        )
        .unwrap();
    assert!(
        limiter.call(&live, &[&"u"]).await.is_ok(),
        "threshold raised on the same state"
    );
    assert!(limiter.call(&live, &[&"u"]).await.is_ok());
    assert!(limiter.call(&live, &[&"u"]).await.is_err());
    limiter.settings().clear_limits("live");
    assert!(limiter.call(&live, &[&"u"]).await.is_err());
}

#[tokio::test]
async fn a_refunded_permit_gives_its_units_back_and_a_reset_forgets_the_identity() {
    let login = spec(
        "login",
        vec![
            group("login_user", &["2/1m"], Algorithm::SlidingLog).reset_on_success(),
            group("login_ip", &["5/1d"], Algorithm::FixedWindow),
        ],
    )
    .with_counting(Counting::Settled);
    let limiter = Limiter::builder().build().unwrap();
    for _ in 0..10 {
        let permit = limiter
            .call(&login, &[&"alice", &"10.0.0.1"])
            .await
            .unwrap();
        permit.refund().await;
    }
    let _kept = limiter
        .call(&login, &[&"alice", &"10.0.0.1"])
        .await
        .unwrap();
    let _kept = limiter
        .call(&login, &[&"alice", &"10.0.0.1"])
        .await
        .unwrap();
    let refused = limiter
        .call(&login, &[&"alice", &"10.0.0.1"])
        .await
        .unwrap_err();
    assert_eq!(
        refused.name(),
        "login_user",
        "the rejection names the refusing group"
    );
    // Refused by the user limit: nothing was taken from the IP limit (3 left of 5).
    for user in ["bob", "bob2", "bob3"] {
        let _kept = limiter.call(&login, &[&user, &"10.0.0.1"]).await.unwrap();
    }
    let by_ip = limiter
        .call(&login, &[&"carol", &"10.0.0.1"])
        .await
        .unwrap_err();
    assert_eq!(by_ip.name(), "login_ip");
    // A reset (success with reset-on-success) forgets both identities.
    let permit = limiter.call(&login, &[&"dave", &"10.0.0.2"]).await.unwrap();
    permit.reset().await;
    let fresh = limiter.call(&login, &[&"dave", &"10.0.0.2"]).await.unwrap();
    let remaining: Vec<u64> = fresh
        .admission()
        .decisions()
        .unwrap()
        .iter()
        .map(|d| d.remaining())
        .collect();
    assert_eq!(remaining, [1, 4]);
}

#[tokio::test]
async fn settling_an_uncounted_call_resets_groups_that_ask_for_it_and_refunds_the_others() {
    let settle = spec(
        "settle",
        vec![
            group("settle_user", &["3/1m"], Algorithm::SlidingLog).reset_on_success(),
            group("settle_ip", &["9/1m"], Algorithm::SlidingLog),
        ],
    )
    .with_counting(Counting::Settled);
    let limiter = Limiter::builder().build().unwrap();
    let ids: [&(dyn std::fmt::Display + Sync); 2] = [&"eve", &"10.9.9.9"];
    // Two failures (counted), then a success (not counted).
    for counted in [true, true, false] {
        limiter
            .call(&settle, &ids)
            .await
            .unwrap()
            .settle(counted)
            .await;
    }
    let next = limiter.call(&settle, &ids).await.unwrap();
    let remaining: Vec<u64> = next
        .admission()
        .decisions()
        .unwrap()
        .iter()
        .map(|d| d.remaining())
        .collect();
    // The user was reset (3 - 1 = 2 left); the IP kept its 2 failures (9 - 3 = 6 left).
    assert_eq!(remaining, [2, 6]);
    let (name, decision, _) = next.binding().unwrap();
    assert_eq!((name, decision.remaining()), ("settle_user", 2));
}

/// A backend that always fails, to exercise the limiter's failure handling
/// (the Redis tests do the same against a real, stopped server).
#[derive(Debug, Default)]
struct Broken {
    calls: AtomicU64,
}

impl Backend for Broken {
    fn acquire<'a>(
        &'a self,
        _: &'a [Request<'a>],
    ) -> ratewall::backend::BoxFuture<
        'a,
        Result<ratewall::backend::Decisions, ratewall::error::BackendError>,
    > {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            Err(ratewall::error::BackendError::unavailable(
                "connection refused",
            ))
        })
    }
    fn peek<'a>(
        &'a self,
        r: &'a [Request<'a>],
    ) -> ratewall::backend::BoxFuture<
        'a,
        Result<ratewall::backend::Decisions, ratewall::error::BackendError>,
    > {
        self.acquire(r)
    }
    fn refund<'a>(
        &'a self,
        _: &'a [Request<'a>],
        _: u64,
    ) -> ratewall::backend::BoxFuture<'a, Result<(), ratewall::error::BackendError>> {
        Box::pin(async {
            Err(ratewall::error::BackendError::unavailable(
                "connection refused",
            ))
        })
    }
    fn reset<'a>(
        &'a self,
        _: &'a [Request<'a>],
    ) -> ratewall::backend::BoxFuture<'a, Result<(), ratewall::error::BackendError>> {
        Box::pin(async {
            Err(ratewall::error::BackendError::unavailable(
                "connection refused",
            ))
        })
    }
}

#[tokio::test]
async fn each_failure_policy_is_honoured_and_the_circuit_stops_calling_a_failing_backend() {
    use ratewall::{FailurePolicy, builder::BreakerConfig};
    let limit = Limit::per_minute(4).unwrap();
    for (policy, expected_allowed) in [
        (FailurePolicy::FailOpen, 10),
        (FailurePolicy::FailClosed, 0),
        (FailurePolicy::local(2).unwrap(), 2),
    ] {
        let broken = Arc::new(Broken::default());
        let limiter = Limiter::builder()
            .shared_backend(broken.clone())
            .failure_policy(policy)
            .circuit_breaker(BreakerConfig::new(3, Duration::from_secs(60)))
            .build()
            .unwrap();
        let key = limiter.key("policy", &"id");
        let requests = [Request::new(&key, &limit, 1)];
        let mut allowed = 0;
        for _ in 0..10 {
            match limiter.requests().check("policy", &requests, None).await {
                Ok(_) => allowed += 1,
                Err(rejection) => {
                    if policy == FailurePolicy::FailClosed {
                        assert!(rejection.is_unavailable(), "{policy:?}: a distinct reason");
                    } else {
                        assert!(
                            !rejection.is_unavailable(),
                            "{policy:?}: refused by the local limiter"
                        );
                    }
                }
            }
        }
        assert_eq!(allowed, expected_allowed, "{policy:?}");
        assert_eq!(
            broken.calls.load(Ordering::SeqCst),
            3,
            "{policy:?}: the circuit opened after 3 failures"
        );
        assert!(limiter.circuit_open());
        // The per-call override wins over the limiter's policy.
        let overridden = limiter
            .requests()
            .check("policy", &requests, Some(FailurePolicy::FailClosed))
            .await;
        assert!(overridden.unwrap_err().is_unavailable());
    }
}

#[tokio::test]
async fn shadow_mode_decides_and_counts_but_never_refuses() {
    let limiter = Limiter::builder().build().unwrap();
    let limit = Limit::per_minute(1).unwrap();
    let key = limiter.key("shadowed", &"id");
    let requests = [Request::new(&key, &limit, 1)];
    limiter.settings().set_shadow("shadowed", true);
    assert!(matches!(
        limiter.requests().check("shadowed", &requests, None).await,
        Ok(ratewall::call::Admission::Backend(_))
    ));
    let shadowed = limiter
        .requests()
        .check("shadowed", &requests, None)
        .await
        .unwrap();
    let ratewall::call::Admission::Shadowed(decisions) = shadowed else {
        panic!("expected a shadowed admission: {shadowed:?}")
    };
    assert!(!decisions.allowed());
    limiter.settings().set_shadow("shadowed", false);
    assert!(
        limiter
            .requests()
            .check("shadowed", &requests, None)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_wall_clock_stepping_back_never_makes_state_look_older() {
    let clock = ManualClock::new(1_000_000_000_000);
    let backend = MemoryBackend::with_clock(clock.clone());
    let key = Key::new("rl", "clock", "id");
    let limit = Limit::per_minute(1)
        .unwrap()
        .with_algorithm(Algorithm::SlidingLog)
        .unwrap();
    let request = [Request::new(&key, &limit, 1)];
    assert!(backend.acquire(&request).await.unwrap().allowed());
    clock.set_micros(1_000_000_000_000 - 5_000_000);
    let refused = backend.acquire(&request).await.unwrap();
    assert!(!refused.allowed());
    assert_eq!(
        refused[0].retry_after(),
        Duration::from_secs(60),
        "measured from the latest time seen"
    );
}

#[tokio::test]
async fn a_runtime_policy_overrides_the_given_one_and_the_default() {
    use ratewall::FailurePolicy;
    let limiter = Limiter::builder()
        .shared_backend(Arc::new(Broken::default()))
        .build()
        .unwrap();
    let limit = Limit::per_minute(1).unwrap();
    let key = limiter.key("runtime_policy", &"id");
    let requests = [Request::new(&key, &limit, 1)];
    assert!(
        limiter
            .requests()
            .check("runtime_policy", &requests, None)
            .await
            .is_ok(),
        "default: fail open"
    );
    assert!(
        limiter
            .requests()
            .check("runtime_policy", &requests, Some(FailurePolicy::FailClosed))
            .await
            .is_err()
    );
    limiter
        .settings()
        .set_policy("runtime_policy", Some(FailurePolicy::FailOpen));
    assert!(
        limiter
            .requests()
            .check("runtime_policy", &requests, Some(FailurePolicy::FailClosed))
            .await
            .is_ok()
    );
    limiter.settings().set_policy("runtime_policy", None);
    assert_eq!(
        limiter
            .settings()
            .policy_for("runtime_policy", Some(FailurePolicy::FailClosed)),
        FailurePolicy::FailClosed
    );
}

#[tokio::test]
async fn a_retried_request_id_is_charged_once_through_the_limiter() {
    let limiter = Limiter::builder().build().unwrap();
    let limit = Limit::per_minute(2).unwrap();
    let key = limiter.key("once", &"id");
    let requests = [Request::new(&key, &limit, 1)];
    let first = limiter
        .requests()
        .acquire_all_once(&requests, "req-1")
        .await
        .unwrap();
    let retried = limiter
        .requests()
        .acquire_all_once(&requests, "req-1")
        .await
        .unwrap();
    assert_eq!(first, retried, "the retry replays the first decision");
    assert_eq!(
        limiter.requests().peek_all(&requests).await.unwrap()[0].remaining(),
        1,
        "charged once"
    );
    assert!(
        limiter
            .requests()
            .acquire_all_once(&requests, "req-2")
            .await
            .unwrap()
            .allowed()
    );
    assert!(
        !limiter
            .requests()
            .acquire_all_once(&requests, "req-3")
            .await
            .unwrap()
            .allowed()
    );
}
