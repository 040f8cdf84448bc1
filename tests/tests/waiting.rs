//! Waiting calls (`Keys::wait`, `CallSpec::with_wait`,
//! `#[rate_limit(wait = ...)]`) on the in-memory store and on a real Redis
//! server (and a cluster): callers queue on a leaky bucket and leave at its
//! drain rate, none waits past its deadline, a dropped waiter's slot goes to
//! the next caller, window algorithms retry until the deadline, and a call
//! over several limits is reserved at one time that respects all of them.
//!
//! The departure tests print their gap statistics (`--nocapture`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewall::{
    Algorithm, CallSpec, GroupSpec, Key, Limit, Limiter, Permit, Rejection,
    backend::{Backend, MemoryBackend, Request},
    clock::ManualClock,
    rate_limit,
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{RedisCluster, RedisServer};

const T0: u64 = 1_700_000_000_000_000;

fn limit(algorithm: Algorithm, per_second: u64, burst: u64) -> Limit {
    Limit::per_second(per_second)
        .and_then(|l| l.with_algorithm(algorithm))
        .and_then(|l| l.with_burst(burst))
        .unwrap()
}

fn window(algorithm: Algorithm, threshold: u64, period: Duration) -> Limit {
    Limit::new(threshold, period)
        .and_then(|l| l.with_algorithm(algorithm))
        .unwrap()
}

fn spec(name: &str, limits: Vec<Limit>) -> CallSpec {
    CallSpec::owned(name, vec![GroupSpec::owned(name, limits)])
}

fn memory() -> Arc<Limiter> {
    Arc::new(Limiter::builder().memory().prefix("wait").build().unwrap())
}

async fn redis(server: &RedisServer) -> Arc<Limiter> {
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    Arc::new(
        Limiter::builder()
            .backend(backend)
            .prefix("wait")
            .build()
            .unwrap(),
    )
}

/// A limiter on Redis deciding on the manual `clock`.
async fn redis_on(server: &RedisServer, clock: &ManualClock) -> Arc<Limiter> {
    let backend = RedisBackend::builder(server.url())
        .client_clock(clock.clone())
        .extra_ttl(Duration::from_secs(60))
        .connect()
        .await
        .expect("connect");
    Arc::new(
        Limiter::builder()
            .backend(backend)
            .prefix("wait")
            .build()
            .unwrap(),
    )
}

/// Held by the tests that measure real time, so that they do not compete
/// with each other for the two cores.
static REAL_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn at_micros(permit: &Permit<'_>) -> u64 {
    permit.admission().decisions().expect("decided")[0].at_micros()
}

// ---- callers queue and leave at the drain rate ----

/// What one caller saw.
struct Outcome {
    called: Instant,
    returned: Instant,
    /// How long it waited and its slot (the store's time, µs).
    result: Result<(Duration, u64), Rejection>,
}

/// `callers` concurrent calls waiting up to `deadline` on a leaky bucket of
/// `per_second` with a burst of 1; checks the departures and returns how
/// many were admitted.
async fn departures(
    limiter: Arc<Limiter>,
    label: &str,
    per_second: u64,
    callers: usize,
    deadline: Duration,
) -> usize {
    let spec = Arc::new(spec(
        "drain",
        vec![limit(Algorithm::LeakyBucket, per_second, 1)],
    ));
    let interval = Duration::from_secs(1) / per_second as u32;
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (limiter, spec) = (limiter.clone(), spec.clone());
            tokio::spawn(async move {
                let called = Instant::now();
                let result = limiter
                    .call_with(&spec, ratewall::Keys::new(&[&"queue"]).wait(deadline))
                    .await
                    .map(|permit| (permit.waited(), at_micros(&permit)));
                Outcome {
                    called,
                    returned: Instant::now(),
                    result,
                }
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    // Safety is exact: the store's slots (below) and the waits it reserved.
    // Timing is liveness, with margins a busy machine keeps: a wake-up or a
    // round trip there can be late by hundreds of milliseconds.
    let late = Duration::from_millis(500);
    let at_once = Duration::from_secs(1);
    let mut left: Vec<Instant> = Vec::new();
    let mut slots: Vec<u64> = Vec::new();
    let mut overshoot = Duration::ZERO;
    for outcome in &outcomes {
        let took = outcome.returned - outcome.called;
        match &outcome.result {
            Ok((waited, slot)) => {
                assert!(
                    *waited <= deadline,
                    "{label}: reserved a wait of {waited:?}"
                );
                assert!(took <= deadline + late, "{label}: a caller waited {took:?}");
                overshoot = overshoot.max(took.saturating_sub(deadline));
                left.push(outcome.returned);
                slots.push(*slot);
            }
            Err(rejection) => {
                // Refused at once, not after sleeping: its slot was too far.
                assert!(took < at_once, "{label}: a refusal took {took:?}");
                let retry = rejection.retry_after().expect("a limited refusal");
                assert!(
                    retry > deadline - took,
                    "{label}: refused with retry_after {retry:?}"
                );
            }
        }
    }
    // The store gave every admitted caller its own slot, at least one
    // interval after the previous one (exactly one while callers queue; a
    // caller that arrives after the queue drained is admitted at its own
    // time, later).
    slots.sort_unstable();
    for (k, pair) in slots.windows(2).enumerate() {
        assert!(
            pair[1] - pair[0] >= interval.as_micros() as u64,
            "{label}: slot {} only {} µs after slot {k}",
            k + 1,
            pair[1] - pair[0]
        );
    }
    left.sort_unstable();
    let first = left[0];
    // Every caller leaves at its place in the queue, within what a late
    // wake-up (of it, or of the first caller) can move it.
    let mut worst = 0f64;
    for (k, t) in left.iter().enumerate() {
        let offset = (*t - first).as_secs_f64() - k as f64 * interval.as_secs_f64();
        worst = worst.max(offset.abs());
        assert!(
            offset.abs() <= late.as_secs_f64(),
            "{label}: departure {k} is {offset:+.4} s off its place in the queue"
        );
    }
    let gaps: Vec<f64> = left
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
    let min = gaps.iter().copied().fold(f64::INFINITY, f64::min);
    let max = gaps.iter().copied().fold(0f64, f64::max);
    let span = (*left.last().unwrap() - first).as_secs_f64();
    let rate = (left.len() - 1) as f64 / span;
    println!(
        "{label}: {} of {callers} admitted, {} refused at once; gaps (ms): mean {mean:.2}, sd {sd:.2}, \
         min {min:.2}, max {max:.2} (interval {:.0}); rate {rate:.2}/s; worst offset from the queue place \
         {:.2} ms; longest call past its deadline {overshoot:?}",
        left.len(),
        callers - left.len(),
        interval.as_secs_f64() * 1e3,
        worst * 1e3,
    );
    // The rate the slots above set, seen from outside: within what a late
    // wake-up at either end can move it.
    let expected = (left.len() - 1) as f64 * interval.as_secs_f64();
    assert!(
        (span - expected).abs() <= late.as_secs_f64(),
        "{label}: left at {rate:.2}/s over {span:.3} s"
    );
    left.len()
}

async fn hundred_callers_leave_at_ten_per_second(limiter: Arc<Limiter>, label: &str) {
    // 3 s of queue at 10/s: slots at 0, 100, ..., 3000 ms; the rest refused.
    let admitted = departures(limiter, label, 10, 100, Duration::from_secs(3)).await;
    assert!(
        (30..=32).contains(&admitted),
        "{label}: {admitted} admitted"
    );
}

async fn hundred_callers_leave_at_a_hundred_per_second(limiter: Arc<Limiter>, label: &str) {
    let admitted = departures(limiter, label, 100, 100, Duration::from_secs(2)).await;
    assert_eq!(admitted, 100, "{label}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiters_on_a_leaky_bucket_of_ten_per_second_leave_at_ten_per_second_in_memory() {
    let _real_time = REAL_TIME.lock().await;
    hundred_callers_leave_at_ten_per_second(memory(), "memory 10/s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiters_on_a_leaky_bucket_of_ten_per_second_leave_at_ten_per_second_on_redis() {
    let _real_time = REAL_TIME.lock().await;
    let server = RedisServer::start();
    hundred_callers_leave_at_ten_per_second(redis(&server).await, "redis 10/s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiters_on_a_leaky_bucket_of_a_hundred_per_second_all_leave_within_a_second_in_memory()
 {
    let _real_time = REAL_TIME.lock().await;
    hundred_callers_leave_at_a_hundred_per_second(memory(), "memory 100/s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiters_on_a_leaky_bucket_of_a_hundred_per_second_all_leave_within_a_second_on_redis()
 {
    let _real_time = REAL_TIME.lock().await;
    let server = RedisServer::start();
    hundred_callers_leave_at_a_hundred_per_second(redis(&server).await, "redis 100/s").await;
}

// ---- a dropped waiter gives its slot back ----

/// Waits until the queue of `key` under `limit` makes a new call wait
/// `expected` (a peek at the frozen clock): the reservations and give-backs
/// made so far have landed.
async fn until_queue_wait(limiter: &Limiter, key: &Key, limit: &Limit, expected: Duration) {
    let started = Instant::now();
    loop {
        let peek = limiter
            .requests()
            .peek_all(&[Request::new(key, limit, 1)])
            .await
            .unwrap();
        if peek.binding().retry_after() == expected {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the queue never made a call wait {expected:?}: {peek:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A leaky bucket of 5/s (one slot every 200 ms) on a frozen clock: A
/// passes at once, B's slot (200 ms) is dropped while B waits, and the
/// next caller gets exactly B's slot.
async fn a_dropped_waiter_returns_its_slot(limiter: Arc<Limiter>) {
    let limit = limit(Algorithm::LeakyBucket, 5, 1);
    let spec = spec("dropped", vec![limit]);
    let key = limiter.key("dropped", &"queue");
    let wait = Duration::from_secs(5);
    let a = limiter
        .call_with(&spec, ratewall::Keys::new(&[&"queue"]).wait(wait))
        .await
        .unwrap();
    assert_eq!(a.waited(), Duration::ZERO);
    let mut b = Box::pin(limiter.call_with(&spec, ratewall::Keys::new(&[&"queue"]).wait(wait)));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut b)
            .await
            .is_err(),
        "B waits for its slot"
    );
    until_queue_wait(&limiter, &key, &limit, Duration::from_millis(400)).await;
    drop(b);
    until_queue_wait(&limiter, &key, &limit, Duration::from_millis(200)).await;
    let c = limiter
        .call_with(&spec, ratewall::Keys::new(&[&"queue"]).wait(wait))
        .await
        .unwrap();
    assert_eq!(at_micros(&c), at_micros(&a) + 200_000, "C got B's slot");
    assert_eq!(c.waited(), Duration::from_millis(200));
}

/// As above on GCRA, with C behind B: B's slot (200 ms) is given back
/// while C (400 ms) waits, so the state cannot go back; D gets 200 ms, E
/// the queue's next slot, 600 ms. `server` is where to see the give-back
/// land (a remote backend gives back from a spawned task).
async fn a_dropped_waiter_inside_the_queue_returns_its_slot(
    limiter: Arc<Limiter>,
    server: Option<&RedisServer>,
) {
    let limit = limit(Algorithm::Gcra, 5, 1);
    let spec = Arc::new(spec("inside", vec![limit]));
    let key = limiter.key("inside", &"queue");
    let wait = Duration::from_secs(5);
    let a = limiter
        .call_with(&spec, ratewall::Keys::new(&[&"queue"]).wait(wait))
        .await
        .unwrap();
    let a_at = at_micros(&a);
    let mut b = Box::pin(limiter.call_with(&spec, ratewall::Keys::new(&[&"queue"]).wait(wait)));
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut b)
            .await
            .is_err()
    );
    until_queue_wait(&limiter, &key, &limit, Duration::from_millis(400)).await;
    let c = {
        let (limiter, spec) = (limiter.clone(), spec.clone());
        tokio::spawn(async move {
            let permit = limiter
                .call_with(&spec, ratewall::Keys::new(&[&"queue"]).wait(wait))
                .await
                .unwrap();
            (at_micros(&permit), permit.waited())
        })
    };
    until_queue_wait(&limiter, &key, &limit, Duration::from_millis(600)).await;
    drop(b);
    if let Some(server) = server {
        let freed = format!("{key}:{}:freed", limit.storage_suffix());
        let started = Instant::now();
        while server.cmd::<i64>(&["EXISTS", &freed]).await == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "B's slot was not given back"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let d = limiter
        .call_with(&spec, ratewall::Keys::new(&[&"queue"]).wait(wait))
        .await
        .unwrap();
    assert_eq!(at_micros(&d), a_at + 200_000, "D got B's slot");
    let e = limiter
        .call_with(&spec, ratewall::Keys::new(&[&"queue"]).wait(wait))
        .await
        .unwrap();
    assert_eq!(
        at_micros(&e),
        a_at + 600_000,
        "E got the next slot of the queue"
    );
    assert_eq!(
        c.await.unwrap(),
        (a_at + 400_000, Duration::from_millis(400))
    );
}

fn frozen_memory(clock: &ManualClock) -> Arc<Limiter> {
    Arc::new(
        Limiter::builder()
            .memory()
            .clock(clock.clone())
            .prefix("wait")
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_returns_its_slot_to_the_next_caller_in_memory() {
    let clock = ManualClock::new(T0);
    a_dropped_waiter_returns_its_slot(frozen_memory(&clock)).await;
    a_dropped_waiter_inside_the_queue_returns_its_slot(frozen_memory(&clock), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_returns_its_slot_to_the_next_caller_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    a_dropped_waiter_returns_its_slot(redis_on(&server, &clock).await).await;
    a_dropped_waiter_inside_the_queue_returns_its_slot(
        redis_on(&server, &clock).await,
        Some(&server),
    )
    .await;
}

// ---- window algorithms retry until the deadline ----

/// 12 callers on a sliding log of 3 per 400 ms, each waiting up to 1 s:
/// admitted in waves at 0, 400 and 800 ms (never more than 3 in any 400
/// ms of the store's time), the rest refused when their next try would
/// come after 1 s; nobody returns after its deadline.
async fn window_waiters_retry_until_their_deadline(limiter: Arc<Limiter>, label: &str) {
    let spec = Arc::new(spec(
        "window",
        vec![window(Algorithm::SlidingLog, 3, Duration::from_millis(400))],
    ));
    let deadline = Duration::from_secs(1);
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (limiter, spec) = (limiter.clone(), spec.clone());
            tokio::spawn(async move {
                let called = Instant::now();
                let result = limiter
                    .call_with(&spec, ratewall::Keys::new(&[&"w"]).wait(deadline))
                    .await
                    .map(|p| (at_micros(&p), p.waited()));
                (called.elapsed(), result)
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut refused = 0;
    let mut longest = Duration::ZERO;
    for task in tasks {
        let (took, result) = task.await.unwrap();
        longest = longest.max(took);
        assert!(
            took <= deadline + Duration::from_millis(20),
            "{label}: a caller returned after {took:?}"
        );
        match result {
            Ok((at, waited)) => {
                assert!(waited <= took);
                admitted.push(at);
            }
            Err(rejection) => {
                // Its next try would have come after the deadline.
                let retry = rejection.retry_after().expect("limited");
                assert!(
                    took + retry > deadline,
                    "{label}: gave up early ({took:?} + {retry:?})"
                );
                refused += 1;
            }
        }
    }
    admitted.sort_unstable();
    for w in admitted.windows(4) {
        assert!(
            w[3] - w[0] >= 400_000,
            "{label}: 4 admitted within 400 ms: {w:?}"
        );
    }
    println!(
        "{label}: {} admitted, {refused} refused, longest call {longest:?}",
        admitted.len()
    );
    assert_eq!(admitted.len(), 9, "{label}: three waves of three");
}

/// A caller whose retry would come after its deadline is refused at once.
async fn a_window_waiter_never_sleeps_past_its_deadline(limiter: Arc<Limiter>) {
    let spec = spec(
        "short",
        vec![window(Algorithm::FixedWindow, 1, Duration::from_secs(60))],
    );
    // The window is full for at least 2 s more: a first call that lands at
    // the end of a minute (the windows follow the clock's minutes) lets
    // that minute go and fills the next one.
    loop {
        let permit = limiter
            .call_with(
                &spec,
                ratewall::Keys::new(&[&"x"]).wait(Duration::from_millis(300)),
            )
            .await
            .unwrap();
        let reset = permit.admission().decisions().expect("decided")[0].reset_after();
        if reset >= Duration::from_secs(2) {
            break;
        }
        drop(permit);
        tokio::time::sleep(reset + Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let refused = limiter
        .call_with(
            &spec,
            ratewall::Keys::new(&[&"x"]).wait(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(50));
    assert!(refused.retry_after().unwrap() > Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_waiters_retry_until_their_deadline_and_never_oversleep_in_memory() {
    let _real_time = REAL_TIME.lock().await;
    window_waiters_retry_until_their_deadline(memory(), "memory").await;
    a_window_waiter_never_sleeps_past_its_deadline(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_waiters_retry_until_their_deadline_and_never_oversleep_on_redis() {
    let _real_time = REAL_TIME.lock().await;
    let server = RedisServer::start();
    window_waiters_retry_until_their_deadline(redis(&server).await, "redis").await;
    a_window_waiter_never_sleeps_past_its_deadline(redis(&server).await).await;
}

// ---- several limits: one slot that respects every one ----

/// Reserves 8 calls over a per-user leaky bucket (10/s) and a per-IP GCRA
/// (4/s, burst 2) at one frozen time, then 4 on the user's limit alone:
/// each multi-limit call gets one slot for both limits, the latest of
/// their earliest times, and replaying every limit's admissions on a
/// fresh store admits them all.
async fn several_limits_reserve_one_slot_that_respects_each(
    backend: &dyn Backend,
    clock: &ManualClock,
) {
    clock.set_micros(T0);
    let user_limit = limit(Algorithm::LeakyBucket, 10, 1);
    let ip_limit = limit(Algorithm::Gcra, 4, 2);
    let (user, ip) = (
        Key::new("multi", "user", "u1"),
        Key::new("multi", "ip", "10.0.0.1"),
    );
    let both = [
        Request::new(&user, &user_limit, 1),
        Request::new(&ip, &ip_limit, 1),
    ];
    let alone = [Request::new(&user, &user_limit, 1)];
    let mut slots = Vec::new();
    for _ in 0..8 {
        let reservation = backend
            .reserve(&both, Duration::from_secs(10))
            .await
            .unwrap();
        let slot = reservation.slot_micros().expect("reserved");
        assert!(
            reservation
                .decisions()
                .iter()
                .all(|d| d.at_micros() == slot)
        );
        slots.push(slot - T0);
    }
    // The second call waits for the user's bucket (the IP has a burst of
    // 2), the later ones for the IP's GCRA (one per 250 ms): each at the
    // later of the two earliest times.
    assert_eq!(
        slots,
        [
            0, 100_000, 250_000, 500_000, 750_000, 1_000_000, 1_250_000, 1_500_000
        ]
    );
    let mut user_only = Vec::new();
    for _ in 0..4 {
        let reservation = backend
            .reserve(&alone, Duration::from_secs(10))
            .await
            .unwrap();
        user_only.push(reservation.slot_micros().unwrap() - T0);
    }
    // Committed as of each slot, the user's bucket is taken up to 1.6 s:
    // calls on it alone queue behind, 100 ms apart.
    assert_eq!(user_only, [1_600_000, 1_700_000, 1_800_000, 1_900_000]);
    // Replay each limit's admissions on a fresh store: all allowed.
    let replay = |limit: Limit, times: Vec<u64>| {
        let clock = ManualClock::new(T0);
        let store = MemoryBackend::with_clock(clock.clone());
        let key = Key::new("replay", "k", "k");
        for at in times {
            clock.set_micros(T0 + at);
            assert!(
                store.acquire_one(&Request::new(&key, &limit, 1)).allowed(),
                "{limit} at +{at} µs"
            );
        }
    };
    replay(ip_limit, slots.clone());
    let mut user_times = slots;
    user_times.extend(user_only);
    replay(user_limit, user_times);
}

#[tokio::test]
async fn a_call_over_several_limits_waits_for_one_slot_that_respects_each_in_memory() {
    let clock = ManualClock::new(T0);
    let backend = MemoryBackend::with_clock(clock.clone());
    several_limits_reserve_one_slot_that_respects_each(&backend, &clock).await;
}

#[tokio::test]
async fn a_call_over_several_limits_waits_for_one_slot_that_respects_each_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let backend = RedisBackend::builder(server.url())
        .client_clock(clock.clone())
        .extra_ttl(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    several_limits_reserve_one_slot_that_respects_each(&backend, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_two_hash_tags_on_a_cluster_waits_for_one_slot_that_respects_each() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new(T0);
    let backend = RedisBackend::cluster_builder(cluster.urls())
        .client_clock(clock.clone())
        .extra_ttl(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    several_limits_reserve_one_slot_that_respects_each(&backend, &clock).await;
}

/// The same through the limiter, in real time: callers over both limits
/// leave one per 250 ms (the slower limit), each at one slot for both.
async fn several_limits_in_real_time(limiter: Arc<Limiter>, label: &str) {
    let spec = Arc::new(CallSpec::owned(
        "multi",
        vec![
            GroupSpec::owned("multi_user", vec![limit(Algorithm::LeakyBucket, 10, 1)]),
            GroupSpec::owned("multi_ip", vec![limit(Algorithm::Gcra, 4, 1)]),
        ],
    ));
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let (limiter, spec) = (limiter.clone(), spec.clone());
            tokio::spawn(async move {
                let permit = limiter
                    .call_with(
                        &spec,
                        ratewall::Keys::new(&[&"u1", &"10.0.0.1"]).wait(Duration::from_secs(3)),
                    )
                    .await
                    .unwrap();
                let decisions = permit.admission().decisions().unwrap().clone();
                assert_eq!(decisions[0].at_micros(), decisions[1].at_micros());
                (Instant::now(), decisions[0].at_micros())
            })
        })
        .collect();
    let mut left = Vec::new();
    for task in tasks {
        left.push(task.await.unwrap());
    }
    left.sort_unstable();
    let slots: Vec<u64> = left.windows(2).map(|w| w[1].1 - w[0].1).collect();
    assert!(
        slots.iter().all(|&gap| gap == 250_000),
        "{label}: slot gaps {slots:?}"
    );
    for w in left.windows(2) {
        let gap = w[1].0 - w[0].0;
        assert!(
            gap >= Duration::from_millis(150) && gap <= Duration::from_millis(350),
            "{label}: departures {gap:?} apart"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_over_several_limits_leave_at_the_slowest_rate_in_memory_and_on_redis() {
    let _real_time = REAL_TIME.lock().await;
    several_limits_in_real_time(memory(), "memory").await;
    let server = RedisServer::start();
    several_limits_in_real_time(redis(&server).await, "redis").await;
}

// ---- what cannot wait ----

#[tokio::test]
async fn a_call_mixing_a_window_and_a_bucket_cannot_wait_and_says_why() {
    let limiter = memory();
    let mixed = CallSpec::owned(
        "mixed",
        vec![
            GroupSpec::owned("mixed_user", vec![limit(Algorithm::Gcra, 10, 1)]),
            GroupSpec::owned(
                "mixed_ip",
                vec![window(Algorithm::FixedWindow, 10, Duration::from_secs(1))],
            ),
        ],
    );
    let refused = limiter
        .call_with(
            &mixed,
            ratewall::Keys::new(&[&"u", &"ip"]).wait(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(refused.is_unavailable());
    let message = refused.to_string();
    assert!(
        message.contains("cannot wait") && message.contains("fixed_window"),
        "{message}"
    );
    // Without waiting, the same spec is decided as usual.
    assert!(limiter.call(&mixed, &[&"u", &"ip"]).await.is_ok());
}

#[tokio::test]
async fn a_call_counting_only_some_calls_cannot_wait() {
    let limiter = memory();
    let settled = spec("settled", vec![limit(Algorithm::Gcra, 10, 1)])
        .with_counting(ratewall::call::Counting::Settled);
    let refused = limiter
        .call_with(
            &settled,
            ratewall::Keys::new(&[&"u"]).wait(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(refused.is_unavailable() && refused.to_string().contains("Counting::Settled"));
}

#[tokio::test]
async fn a_tiered_call_waits_on_its_tiers_limits_and_a_tier_that_mixes_kinds_cannot_wait() {
    let limiter = memory();
    let tiered = CallSpec::owned(
        "tiered",
        vec![GroupSpec::owned_tiered(
            "tiered",
            vec![
                // One call every 100 ms.
                ratewall::call::Tier::owned("free", vec![limit(Algorithm::LeakyBucket, 10, 1)]),
                // A bucket and a window in one tier: no single wait fits both.
                ratewall::call::Tier::owned(
                    "mixed",
                    vec![
                        limit(Algorithm::LeakyBucket, 10, 1),
                        "100/1h"
                            .parse::<Limit>()
                            .unwrap()
                            .with_algorithm(Algorithm::FixedWindow)
                            .unwrap(),
                    ],
                ),
            ],
        )],
    )
    .with_wait(Duration::from_secs(1));
    let start = std::time::Instant::now();
    for _ in 0..3 {
        let permit = limiter
            .call_with(&tiered, ratewall::Keys::new(&[&"u"]).tiers(&["free"]))
            .await
            .expect("admitted after waiting for its slot");
        assert!(permit.waited() <= Duration::from_millis(200));
    }
    assert!(
        start.elapsed() >= Duration::from_millis(150),
        "the free tier's queue"
    );
    let refused = limiter
        .call_with(&tiered, ratewall::Keys::new(&[&"u"]).tiers(&["mixed"]))
        .await
        .unwrap_err();
    assert!(
        refused.is_unavailable() && refused.to_string().contains("mixes"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_call_with_an_in_flight_limit_cannot_wait_and_says_why() {
    let limiter = memory();
    // The in-flight limit in another group of the call than the rate.
    let both = CallSpec::owned(
        "export",
        vec![
            GroupSpec::owned("export_rate", vec![limit(Algorithm::LeakyBucket, 10, 1)]),
            GroupSpec::owned("export_running", vec![Limit::in_flight(2).unwrap()]),
        ],
    );
    let refused = limiter
        .call_with(
            &both,
            ratewall::Keys::new(&[&"u", &"u"]).wait(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(refused.is_unavailable(), "{refused:?}");
    assert!(
        refused
            .to_string()
            .contains("`export_running` has an in-flight limit"),
        "{refused}"
    );
    // A spec that waits is refused the same through `call`, however free
    // its slots are, and a window limit beside it changes nothing.
    let waiting = both.clone().with_wait(Duration::from_secs(1));
    let refused = limiter.call(&waiting, &[&"u", &"u"]).await.unwrap_err();
    assert!(refused.is_unavailable() && refused.to_string().contains("in-flight"));
    let alone =
        spec("running", vec![Limit::in_flight(1).unwrap()]).with_wait(Duration::from_secs(1));
    let refused = limiter.call(&alone, &[&"u"]).await.unwrap_err();
    assert!(refused.is_unavailable() && refused.to_string().contains("in-flight"));
    // Nothing was taken: without waiting, the same spec holds its slots.
    let permit = limiter.call(&both, &[&"u", &"u"]).await.unwrap();
    assert!(permit.in_flight().is_some());
    // A wait of zero given for one call (as a client layer configured not
    // to wait passes it), even over a spec that waits, is a call that does
    // not wait: decided at once, its slot held. (Each call has a rate key
    // of its own; the in-flight key is `u`'s.)
    let keys: [[&(dyn std::fmt::Display + Sync); 2]; 4] =
        [[&"a", &"u"], [&"b", &"u"], [&"c", &"u"], [&"d", &"u"]];
    let zero = |i: usize| ratewall::Keys::new(&keys[i]).wait(Duration::ZERO);
    for (i, spec) in [&both, &waiting].into_iter().enumerate() {
        let decided = limiter
            .call_with(spec, zero(i))
            .await
            .expect("decided as a call that does not wait");
        assert!(decided.in_flight().is_some());
    }
    // Two slots, the first permit holds one: a second is at the limit.
    let second = limiter.call_with(&both, zero(2)).await.expect("a slot");
    let third = limiter
        .call_with(&both, zero(3))
        .await
        .expect_err("both slots held");
    assert!(!third.is_unavailable(), "refused by the limit: {third:?}");
    drop((permit, second));
}

#[tokio::test]
async fn a_group_made_in_flight_at_run_time_stops_its_calls_from_waiting() {
    let limiter = memory();
    let queued = spec("queued", vec![limit(Algorithm::Gcra, 10, 1)]);
    assert!(
        limiter
            .call_with(
                &queued,
                ratewall::Keys::new(&[&"u"]).wait(Duration::from_secs(1))
            )
            .await
            .is_ok()
    );
    limiter
        .settings()
        .set_limits("queued", vec![Limit::in_flight(3).unwrap()])
        .unwrap();
    let refused = limiter
        .call_with(
            &queued,
            ratewall::Keys::new(&[&"u"]).wait(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(refused.is_unavailable() && refused.to_string().contains("in-flight"));
}

#[tokio::test]
async fn redis_never_reserves_an_in_flight_limit() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let key = Key::new("wait", "jobs", "a");
    let rate = limit(Algorithm::Gcra, 10, 1);
    let slots = Limit::in_flight(2).unwrap();
    let req = [Request::new(&key, &rate, 1), Request::new(&key, &slots, 1)];
    let refused = backend.reserve(&req, Duration::from_secs(1)).await;
    assert!(
        matches!(&refused, Err(ratewall::error::BackendError::Invalid(e)) if e.to_string().contains("in-flight")),
        "{refused:?}"
    );
}

// ---- the macro ----

static SMOOTH: std::sync::LazyLock<Limiter> =
    std::sync::LazyLock::new(|| Limiter::builder().memory().prefix("macro").build().unwrap());

#[rate_limit(
    name = "export",
    period = "1s",
    threshold = 20,
    burst = 1,
    algorithm = leaky_bucket,
    key = tenant,
    wait = "1s",
    limiter = &*SMOOTH
)]
async fn export(tenant: u64) -> Result<Instant, Rejection> {
    Ok(Instant::now())
}

#[tokio::test]
async fn a_function_with_wait_queues_its_callers_at_the_limits_rate() {
    let _real_time = REAL_TIME.lock().await;
    let start = Instant::now();
    let mut times = Vec::new();
    for _ in 0..4 {
        times.push(export(7).await.unwrap());
    }
    // One every 50 ms after the first.
    assert!(
        times[3] - start >= Duration::from_millis(150),
        "{:?}",
        times[3] - start
    );
    // Another tenant has its own queue.
    let other = Instant::now();
    assert!(export(8).await.unwrap() - other < Duration::from_millis(40));
}

// ---- TTLs on Redis ----

#[tokio::test]
async fn a_reserved_slot_keeps_its_state_until_the_slot_has_drained_and_a_given_back_slot_until_its_time()
 {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.unwrap();
    let limit = limit(Algorithm::LeakyBucket, 1, 1); // one per second
    let key = Key::new("ttl", "jobs", "q");
    let req = [Request::new(&key, &limit, 1)];
    let held = reserve_n(&backend, &req, 3).await;
    let state = format!("{key}:{}", limit.storage_suffix());
    // Slots at 0, 1 and 2 s: the state is fresh again at 3 s, counted from
    // the server's now (not from the slot).
    let ttl: i64 = server.cmd(&["PTTL", &state]).await;
    assert!((2_900..=3_000).contains(&ttl), "state TTL {ttl} ms");
    backend.cancel(&req, &held[1]).await.unwrap();
    let freed: i64 = server.cmd(&["PTTL", &format!("{state}:freed")]).await;
    assert!(
        (900..=1_000).contains(&freed),
        "given-back slot TTL {freed} ms"
    );
}

async fn reserve_n(
    backend: &RedisBackend,
    req: &[Request<'_>],
    n: usize,
) -> Vec<ratewall::backend::Reservation> {
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(backend.reserve(req, Duration::from_secs(10)).await.unwrap());
    }
    held
}

/// A settled estimate's refund wakes a caller waiting on a window in this
/// process at once (not at its `retry_after`), and each one admitted wakes
/// the next while the room fits.
async fn a_refund_wakes_the_window_waiters_it_fits(limiter: Arc<Limiter>, label: &str) {
    let name = format!("wake-{label}");
    let spec = Arc::new(CallSpec::owned(
        name.clone(),
        vec![
            GroupSpec::owned(
                name.clone(),
                vec![
                    window(Algorithm::SlidingWindow, 100, Duration::from_secs(60))
                        .with_slots(60)
                        .unwrap(),
                ],
            )
            .settled(),
        ],
    ));
    let estimate = limiter
        .call_with(&spec, ratewall::Keys::new(&[&"model"]).costs(&[100]))
        .await
        .expect("the whole minute, as an estimate");
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let (limiter, spec) = (limiter.clone(), spec.clone());
        waiters.push(tokio::spawn(async move {
            let started = Instant::now();
            let keys = ratewall::Keys::new(&[&"model"])
                .costs(&[30])
                .wait(Duration::from_secs(120));
            let permit = limiter.call_with(&spec, keys).await.map(|_| ());
            (permit, started.elapsed())
        }));
    }
    // Let them meet the full minute and go to sleep (its room comes back
    // in a minute).
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The call used 35: 65 given back, room for two of the three.
    estimate.settle_cost(35).await;
    // Two are woken well before the minute's room would come back (20 s
    // of margin for a loaded machine against the 60 s they slept for); the
    // third, for which the room does not fit, sleeps on.
    let deadline = Instant::now() + Duration::from_secs(20);
    while waiters.iter().filter(|w| w.is_finished()).count() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (done, sleeping): (Vec<_>, Vec<_>) = waiters.into_iter().partition(|w| w.is_finished());
    assert_eq!((done.len(), sleeping.len()), (2, 1), "{label}");
    for waiter in done {
        let (permit, waited) = waiter.await.expect("task");
        permit.expect("admitted");
        assert!(waited < Duration::from_secs(20), "{label}: {waited:?}");
    }
    for waiter in sleeping {
        waiter.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_wakes_the_window_waiters_it_fits_in_memory_and_on_redis() {
    a_refund_wakes_the_window_waiters_it_fits(memory(), "memory").await;
    let server = RedisServer::start();
    a_refund_wakes_the_window_waiters_it_fits(redis(&server).await, "redis").await;
}
