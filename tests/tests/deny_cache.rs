//! The deny cache, end to end through the limiter: a flood on a blocked
//! identity stays in process, and no decision changes because of it.
//!
//! The backend is the in-memory one behind a counting wrapper, which the
//! limiter treats as remote (the deny cache is on by default there).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use ratewall::{
    Algorithm, Key, Limit, Limiter, Rejection,
    backend::{Backend, BoxFuture, Decisions, MemoryBackend, Request},
    clock::ManualClock,
    error::BackendError,
    rate_limit,
};

#[path = "../../rl-core/tests/support/ledger.rs"]
mod ledger;
use ledger::Ledger;

/// The in-memory backend, counting the calls that reach it.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryBackend,
    acquires: AtomicU64,
}

impl Backend for Counting {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(requests)
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
        self.inner.refund(requests, at_micros)
    }

    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.reset(requests)
    }
}

/// A limiter over a counting backend, and the backend.
fn counted(deny_cache: Option<bool>) -> (Limiter, Arc<Counting>) {
    let backend = Arc::new(Counting::default());
    // Held as long as the refusal lasts: these tests check the mechanism, not
    // the staleness bound (tested on its own below).
    let mut builder = Limiter::builder()
        .shared_backend(backend.clone())
        .deny_cache_max_hold(Duration::from_secs(3_600));
    if let Some(enabled) = deny_cache {
        builder = builder.deny_cache(enabled);
    }
    (builder.build().expect("limiter"), backend)
}

fn calls(backend: &Counting) -> u64 {
    backend.acquires.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_flood_of_a_million_calls_on_a_blocked_identity_makes_at_most_ten_backend_calls() {
    let (limiter, backend) = counted(None);
    let limit = Limit::per_hour(3).unwrap();
    let key = limiter.key("otp", &"+33 6 12 34 56 78");
    let call = [Request::new(&key, &limit, 1)];
    let mut admitted = 0;
    for _ in 0..1_000_000 {
        if limiter.requests().check("otp", &call, None).await.is_ok() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3, "exactly the quota is admitted");
    assert!(calls(&backend) <= 10, "{} backend calls", calls(&backend));
    // Another identity is decided by the backend as usual.
    let other = limiter.key("otp", &"+1 555 0100");
    assert!(
        limiter
            .requests()
            .check("otp", &[Request::new(&other, &limit, 1)], None)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_remembered_refusal_reports_the_backend_decision_with_the_wait_left() {
    let (limiter, backend) = counted(None);
    let limit = Limit::per_minute(1).unwrap();
    let key = limiter.key("sms", &"alice");
    let call = [Request::new(&key, &limit, 1)];
    limiter
        .requests()
        .check("sms", &call, None)
        .await
        .expect("first call");
    let from_backend = limiter
        .requests()
        .check("sms", &call, None)
        .await
        .unwrap_err();
    let before = calls(&backend);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let remembered = limiter
        .requests()
        .check("sms", &call, None)
        .await
        .unwrap_err();
    assert_eq!(calls(&backend), before, "answered in process");
    let (b, r) = (
        from_backend.decision().unwrap(),
        remembered.decision().unwrap(),
    );
    assert!(!r.allowed());
    assert_eq!(r.remaining(), 0);
    assert_eq!(r.limit(), b.limit());
    assert!(r.retry_after() > Duration::ZERO);
    assert!(
        r.retry_after() <= b.retry_after() - Duration::from_millis(20),
        "{:?} then {:?}",
        b.retry_after(),
        r.retry_after()
    );
    assert_eq!(remembered.name(), "sms");
    assert_eq!(remembered.limit(), Some(&limit));
}

#[tokio::test]
async fn a_remembered_refusal_ends_at_its_retry_after() {
    let (limiter, backend) = counted(None);
    let limit = Limit::new(1, Duration::from_millis(50)).unwrap();
    let key = limiter.key("burst", &1);
    let call = [Request::new(&key, &limit, 1)];
    limiter
        .requests()
        .check("burst", &call, None)
        .await
        .expect("first call");
    let refused = limiter
        .requests()
        .check("burst", &call, None)
        .await
        .unwrap_err();
    tokio::time::sleep(refused.retry_after().unwrap()).await;
    let before = calls(&backend);
    assert!(limiter.requests().check("burst", &call, None).await.is_ok());
    assert_eq!(calls(&backend), before + 1);
}

#[tokio::test]
async fn a_refund_forgets_the_refusal_so_the_freed_unit_can_be_used() {
    let (limiter, backend) = counted(None);
    let limit = Limit::per_hour(1).unwrap();
    let key = limiter.key("login", &"bob");
    let call = [Request::new(&key, &limit, 1)];
    let admission = limiter
        .requests()
        .check("login", &call, None)
        .await
        .expect("first");
    assert!(
        limiter
            .requests()
            .check("login", &call, None)
            .await
            .is_err()
    );
    let before = calls(&backend);
    assert!(
        limiter
            .requests()
            .check("login", &call, None)
            .await
            .is_err()
    );
    assert_eq!(calls(&backend), before, "remembered");
    // Count-failures mode: the first call is not counted after all.
    limiter
        .requests()
        .refund_admission(&call, &admission)
        .await
        .unwrap();
    assert!(limiter.requests().check("login", &call, None).await.is_ok());
    // And a reset forgets too.
    assert!(
        limiter
            .requests()
            .check("login", &call, None)
            .await
            .is_err()
    );
    limiter.requests().reset_everywhere(&call).await.unwrap();
    assert!(limiter.requests().check("login", &call, None).await.is_ok());
}

#[tokio::test]
async fn a_call_with_any_remembered_refusal_is_refused_and_consumes_nothing_elsewhere() {
    let (limiter, backend) = counted(None);
    let per_phone = Limit::per_hour(1).unwrap();
    let per_ip = Limit::per_hour(100).unwrap();
    let phone = limiter.key("sms", &"+1");
    let ip = limiter.key("ip", &"10.0.0.1");
    let call = [
        Request::new(&phone, &per_phone, 1),
        Request::new(&ip, &per_ip, 1),
    ];
    limiter
        .requests()
        .check("send", &call, None)
        .await
        .expect("first");
    let refused = limiter
        .requests()
        .check("send", &call, None)
        .await
        .unwrap_err();
    assert_eq!(refused.name(), "send");
    let before = calls(&backend);
    for _ in 0..50 {
        assert!(limiter.requests().check("send", &call, None).await.is_err());
    }
    assert_eq!(calls(&backend), before);
    let ip_state = limiter
        .requests()
        .peek_all(&[Request::new(&ip, &per_ip, 1)])
        .await
        .unwrap();
    assert_eq!(
        ip_state[0].remaining(),
        99,
        "only the first call took from the IP"
    );
    // The IP was not the refusing limit: another phone from it is decided.
    let other = limiter.key("sms", &"+2");
    let other_call = [
        Request::new(&other, &per_phone, 1),
        Request::new(&ip, &per_ip, 1),
    ];
    assert!(
        limiter
            .requests()
            .check("send", &other_call, None)
            .await
            .is_ok()
    );
}

#[rate_limit(period = "1h", threshold = 1, algorithm = fixed_window, key = user, name = "otp_macro", limiter = limiter)]
async fn send_otp(limiter: &Limiter, user: u32) -> Result<u32, Rejection> {
    Ok(user)
}

fn hourly(threshold: u64) -> Limit {
    Limit::per_hour(threshold)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .unwrap()
}

#[tokio::test]
async fn new_limits_for_a_name_forget_its_remembered_refusals() {
    let (limiter, backend) = counted(None);
    send_otp(&limiter, 7).await.expect("first");
    assert!(send_otp(&limiter, 7).await.is_err());
    let before = calls(&backend);
    assert!(send_otp(&limiter, 7).await.is_err());
    assert_eq!(calls(&backend), before, "remembered");
    // The same limit set again still forgets: the next call asks the backend.
    limiter
        .settings()
        .set_limits("otp_macro", vec![hourly(1)])
        .unwrap();
    assert!(send_otp(&limiter, 7).await.is_err());
    assert_eq!(calls(&backend), before + 1);
    // A higher threshold applies to the existing state at once.
    limiter
        .settings()
        .set_limits("otp_macro", vec![hourly(2)])
        .unwrap();
    assert_eq!(send_otp(&limiter, 7).await.unwrap(), 7);
}

#[tokio::test]
async fn the_cache_can_be_turned_off_per_name_and_in_the_builder() {
    let limit = Limit::per_hour(1).unwrap();
    for (deny_cache, per_name_off, expected) in [
        (None, false, 2),
        (None, true, 11),
        (Some(false), false, 11),
        (Some(true), false, 2),
    ] {
        let (limiter, backend) = counted(deny_cache);
        if per_name_off {
            limiter.settings().set_deny_cache("sms", false);
        }
        let key = limiter.key("sms", &"carol");
        let call = [Request::new(&key, &limit, 1)];
        for _ in 0..11 {
            let _ = limiter.requests().check("sms", &call, None).await;
        }
        assert_eq!(
            calls(&backend),
            expected,
            "builder {deny_cache:?}, off for the name: {per_name_off}"
        );
    }
}

#[tokio::test]
async fn shadowed_refusals_are_never_remembered() {
    let (limiter, backend) = counted(None);
    let limit = Limit::per_hour(1).unwrap();
    let key = limiter.key("new_limit", &"dave");
    let call = [Request::new(&key, &limit, 1)];
    limiter
        .requests()
        .check("new_limit", &call, None)
        .await
        .expect("first");
    assert!(
        limiter
            .requests()
            .check("new_limit", &call, None)
            .await
            .is_err()
    );
    limiter.settings().set_shadow("new_limit", true);
    for _ in 0..5 {
        assert!(
            limiter
                .requests()
                .check("new_limit", &call, None)
                .await
                .is_ok()
        );
    }
    assert_eq!(calls(&backend), 7, "every shadowed call is decided");
}

#[test]
fn every_refusal_is_counted_as_rejected_with_where_it_was_decided_and_memory_limiters_do_not_remember()
 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ledger = Ledger::default();
    let _guard = metrics::set_default_local_recorder(&ledger);
    let limit = Limit::per_hour(1).unwrap();
    runtime.block_on(async {
        let (remote, _) = counted(None);
        let memory = Limiter::builder().memory().build().unwrap();
        for limiter in [&remote, &memory] {
            let key = limiter.key("metered", &"erin");
            let call = [Request::new(&key, &limit, 1)];
            for _ in 0..5 {
                let _ = limiter.requests().check("metered", &call, None).await;
            }
        }
    });
    let decisions = ledger.counters("ratewall_decisions_total");
    let count = |outcome, source| {
        ledger.counter(
            "ratewall_decisions_total",
            &[("outcome", outcome), ("source", source)],
        )
    };
    assert_eq!(count("allowed", "backend"), 2, "{decisions:?}");
    assert_eq!(
        count("rejected", "backend"),
        1 + 4,
        "the remote limiter's first refusal, and every refusal in memory: {decisions:?}"
    );
    assert_eq!(count("rejected", "cache"), 3, "{decisions:?}");
    assert_eq!(
        ledger.counter("ratewall_decisions_total", &[]),
        2 + 5 + 3,
        "no other outcome: {decisions:?}"
    );
}

fn limit(algorithm: Algorithm, threshold: u64, period_us: u64) -> Limit {
    Limit::new(threshold, Duration::from_micros(period_us))
        .unwrap()
        .with_algorithm(algorithm)
        .unwrap()
        .with_slots(4)
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// What the deny cache relies on: with no other traffic, a refusal
    /// stays a refusal, for the same or a higher cost, until its
    /// `retry_after`.
    #[test]
    fn a_refusal_holds_until_its_retry_after_for_every_algorithm(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        threshold in 1u64..6,
        gaps in prop::collection::vec((0u64..3_000_000, 1u64..=3), 1..40),
        probes in prop::collection::vec((0.0f64..1.0, 0u64..2), 1..8),
    ) {
        let limit = limit(algorithm, threshold, 4_000_000);
        let clock = ManualClock::new(1_700_000_000_000_000);
        let backend = MemoryBackend::with_clock(clock.clone());
        let key = Key::new("rl", "law", "k");
        for (gap, cost) in gaps {
            clock.advance_micros(gap);
            let cost = cost.min(limit.capacity());
            let decision = backend.acquire_one(&Request::new(&key, &limit, cost));
            if decision.allowed() {
                continue;
            }
            let now = decision.at_micros();
            let wait = decision.retry_after().as_micros() as u64;
            for &(fraction, extra) in &probes {
                let at = now + (wait as f64 * fraction) as u64;
                let probe_cost = (cost + extra).min(limit.capacity());
                clock.set_micros(at.min(now + wait - 1));
                let peeked = backend.peek_sync(&[Request::new(&key, &limit, probe_cost)]);
                prop_assert!(
                    !peeked.allowed(),
                    "{algorithm}: refused at {now} for {wait} µs, allowed at {}",
                    at - now
                );
            }
            clock.set_micros(now);
        }
    }
}

#[tokio::test]
async fn a_reset_made_by_another_process_is_seen_within_the_maximum_hold() {
    // Two limiters on one backend stand for two processes of one deployment.
    let backend = Arc::new(Counting::default());
    let service = Limiter::builder()
        .shared_backend(backend.clone())
        .deny_cache_max_hold(Duration::from_millis(50))
        .build()
        .unwrap();
    let operator = Limiter::builder()
        .shared_backend(backend.clone())
        .build()
        .unwrap();
    let limit = hourly(1);
    let key = service.key("unblock", &"user");
    let call = [Request::new(&key, &limit, 1)];
    service
        .requests()
        .check("unblock", &call, None)
        .await
        .expect("first call");
    assert!(
        service
            .requests()
            .check("unblock", &call, None)
            .await
            .is_err()
    );
    let before = calls(&backend);
    assert!(
        service
            .requests()
            .check("unblock", &call, None)
            .await
            .is_err(),
        "refused from the cache"
    );
    assert_eq!(calls(&backend), before);
    operator.requests().reset_all(&call).await.unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(
        service
            .requests()
            .check("unblock", &call, None)
            .await
            .is_ok(),
        "the reset is seen after the hold"
    );
}

/// The in-memory backend behind a switch that makes every call fail.
#[derive(Debug, Default)]
struct Switchable {
    inner: MemoryBackend,
    down: std::sync::atomic::AtomicBool,
}

impl Switchable {
    fn answer<T: Send + 'static>(
        &self,
        up: BoxFuture<'static, Result<T, BackendError>>,
    ) -> BoxFuture<'static, Result<T, BackendError>> {
        if self.down.load(Ordering::SeqCst) {
            Box::pin(async { Err(BackendError::unavailable("connection refused")) })
        } else {
            up
        }
    }
}

impl Backend for Switchable {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = self.inner.acquire_sync(requests);
        self.answer(Box::pin(std::future::ready(Ok(result))))
    }

    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let result = self.inner.peek_sync(requests);
        self.answer(Box::pin(std::future::ready(Ok(result))))
    }

    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        if !self.down.load(Ordering::SeqCst) {
            self.inner.refund_sync(requests, at_micros);
        }
        self.answer(Box::pin(std::future::ready(Ok(()))))
    }

    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        if !self.down.load(Ordering::SeqCst) {
            self.inner.reset_sync(requests);
        }
        self.answer(Box::pin(std::future::ready(Ok(()))))
    }
}

#[tokio::test]
async fn while_the_backend_fails_what_it_refused_or_left_without_room_stays_refused() {
    use ratewall::{
        CallSpec, FailurePolicy, GroupSpec, RejectionReason, builder::BreakerConfig,
        call::Admission,
    };
    let backend = Arc::new(Switchable::default());
    let limiter = Limiter::builder()
        .shared_backend(backend.clone())
        .failure_policy(FailurePolicy::local(2).unwrap())
        .circuit_breaker(BreakerConfig::new(2, Duration::from_millis(100)))
        .build()
        .unwrap();
    let log = |t: u64, p: &str| {
        format!("{t}/{p}")
            .parse::<Limit>()
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap()
    };
    let sms = CallSpec::owned(
        "sms",
        vec![GroupSpec::owned(
            "sms_phone",
            vec![log(2, "1m"), log(10, "1d")],
        )],
    );
    // Before the outage: "blocked" was refused, "full" took its last unit
    // (never refused), "fresh" was never seen.
    for _ in 0..2 {
        assert!(limiter.call(&sms, &[&"blocked"]).await.is_ok());
    }
    assert!(limiter.call(&sms, &[&"blocked"]).await.is_err());
    for _ in 0..2 {
        assert!(limiter.call(&sms, &[&"full"]).await.is_ok());
    }

    backend.down.store(true, Ordering::SeqCst);
    for round in 0..5 {
        for phone in ["blocked", "full"] {
            let refused = limiter.call(&sms, &[&phone]).await.unwrap_err();
            assert!(
                matches!(refused.reason(), RejectionReason::Limited { .. }),
                "round {round}, {phone}: refused as over its limit, not for the outage: {refused}"
            );
            assert!(refused.retry_after().unwrap() > Duration::from_secs(50));
        }
    }
    assert!(limiter.circuit_open(), "the outage opened the breaker");
    // A fresh phone gets its local share (2 / 2 instances = 1 per minute).
    let local = limiter.call(&sms, &[&"fresh"]).await.unwrap();
    assert!(matches!(
        local.admission(),
        ratewall::call::Admission::Local { .. }
    ));
    assert!(limiter.call(&sms, &[&"fresh"]).await.is_err());

    // The backend's state rules again once it answers: a reset made
    // meanwhile by another process is seen.
    backend.down.store(false, Ordering::SeqCst);
    let key = limiter.key("sms_phone", &"full");
    let limits = [log(2, "1m"), log(10, "1d")];
    let requests: Vec<Request<'_>> = limits.iter().map(|l| Request::new(&key, l, 1)).collect();
    backend.inner.reset_sync(&requests);
    tokio::time::sleep(Duration::from_millis(150)).await; // the breaker's probe is due
    let full = limiter
        .call(&sms, &[&"full"])
        .await
        .expect("reset in the backend");
    assert!(matches!(full.admission(), Admission::Backend(_)));
    assert!(
        limiter.call(&sms, &[&"blocked"]).await.is_err(),
        "still blocked in the backend"
    );
}
