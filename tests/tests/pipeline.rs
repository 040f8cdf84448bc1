//! The decision pipeline against real Redis: every operation passes the same
//! layers (breaker, failure policy, deny cache), invalid batches are refused
//! in one place for every store, and the public call API is everything the
//! macro needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratewall::{
    Algorithm, CallSpec, Error, FailurePolicy, GroupSpec, Key, Limit, Limiter, Rejection,
    backend::{Backend, MemoryBackend, Request},
    builder::BreakerConfig,
    call::{Admission, Counting},
    error::{BackendError, LimitError},
    rate_limit,
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;

/// Calls of the decision scripts or functions in `INFO commandstats`.
async fn decision_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]).await;
    info.lines()
        .filter(|line| {
            [
                "cmdstat_evalsha:",
                "cmdstat_eval:",
                "cmdstat_fcall:",
                "cmdstat_fcall_ro:",
            ]
            .iter()
            .any(|name| line.starts_with(name))
        })
        .filter_map(|line| {
            let calls = line.split("calls=").nth(1)?.split(',').next()?;
            calls.parse::<u64>().ok()
        })
        .sum()
}

fn log_limit(threshold: u64, period: &str) -> Limit {
    format!("{threshold}/{period}")
        .parse::<Limit>()
        .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
        .expect("valid limit")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_1000_callers_on_a_blocked_identity_reaches_redis_once_per_hold() {
    const CALLERS: usize = 1_000;
    const FLOOD: Duration = Duration::from_secs(5);
    const HOLD: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let limiter = Arc::new(
        Limiter::builder()
            .backend(backend)
            .deny_cache_max_hold(HOLD)
            // The shared lists' refresh is a script call of its own (about
            // one a second); this test counts decisions only.
            .lists_refresh(Duration::from_secs(3_600))
            .build()
            .expect("limiter"),
    );
    let spec = Arc::new(CallSpec::owned(
        "flood",
        vec![GroupSpec::owned("flood", vec![Limit::per_hour(1).unwrap()])],
    ));
    // Blocked for an hour: the refusal that blocks it is the initial decision.
    assert!(limiter.call(&spec, &[&"mallory"]).await.is_ok());
    assert!(limiter.call(&spec, &[&"mallory"]).await.is_err());
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]).await;

    let refused = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (limiter, spec, refused) = (limiter.clone(), spec.clone(), refused.clone());
            tokio::spawn(async move {
                while started.elapsed() < FLOOD {
                    match limiter.call(&spec, &[&"mallory"]).await {
                        Ok(_) => panic!("a blocked identity was admitted"),
                        Err(rejection) => {
                            assert!(rejection.retry_after().is_some(), "{rejection}");
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("caller");
    }
    let elapsed = started.elapsed();
    let calls = decision_calls(&server).await;
    let holds = elapsed.as_secs_f64() / HOLD.as_secs_f64();
    eprintln!(
        "flood: {} refusals from {CALLERS} callers in {elapsed:?}, {calls} decision calls reached Redis ({holds:.1} holds)",
        refused.load(Ordering::Relaxed)
    );
    assert!(refused.load(Ordering::Relaxed) > CALLERS as u64);
    // One re-check per hold that ended during the flood.
    let most = holds.ceil() as u64;
    assert!(
        calls <= most,
        "{calls} decision calls, at most {most} expected"
    );
}

#[tokio::test]
async fn with_the_breaker_open_settling_peeking_and_resetting_return_at_once() {
    const TIMEOUT: Duration = Duration::from_millis(300);
    const AT_ONCE: Duration = Duration::from_millis(50);
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect");
    let limiter = Limiter::builder()
        .backend(backend)
        .failure_policy(FailurePolicy::local(1).unwrap())
        .circuit_breaker(BreakerConfig::new(2, Duration::from_secs(60)))
        .build()
        .expect("limiter");
    // The login service's call: failures counted per user (a success
    // forgets them) and per IP.
    let login = CallSpec::owned(
        "login",
        vec![
            GroupSpec::owned("login_user", vec![log_limit(3, "1m")]).reset_on_success(),
            GroupSpec::owned("login_ip", vec![log_limit(100, "1d")]),
        ],
    )
    .with_counting(Counting::Settled);
    let ids: [&(dyn std::fmt::Display + Sync); 2] = [&"alice", &"10.0.0.1"];
    let ok_login = async || {
        let started = Instant::now();
        let permit = limiter.call(&login, &ids).await.expect("admitted");
        let admission = permit.admission().clone();
        permit.settle(false).await; // the password was right
        (started.elapsed(), admission)
    };
    let (up, admission) = ok_login().await;
    assert!(matches!(admission, Admission::Backend(_)), "{admission:?}");
    eprintln!("login with Redis up: {up:?}");

    server.pause();
    let mut times = Vec::new();
    for attempt in 0..10 {
        let (took, admission) = ok_login().await;
        assert!(
            matches!(admission, Admission::Local { .. }),
            "attempt {attempt}: {admission:?}"
        );
        times.push(took);
    }
    let peek_started = Instant::now();
    let key = limiter.key("login_user", &"alice");
    let limit = log_limit(3, "1m");
    let peeked = limiter
        .requests()
        .peek_all(&[Request::new(&key, &limit, 1)])
        .await
        .expect("peeked in process");
    let peek = peek_started.elapsed();
    let reset_started = Instant::now();
    let reset = limiter
        .requests()
        .reset_identity("login_user", &"alice", std::slice::from_ref(&limit))
        .await;
    let reset_took = reset_started.elapsed();
    // The call given up on is retried in the background; its failures open
    // the breaker (two of them, each bounded by the timeout).
    let opening = Instant::now();
    while !limiter.circuit_open() && opening.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let open_after = opening.elapsed();
    assert!(
        limiter.circuit_open(),
        "two failures open the breaker (waited {open_after:?})"
    );
    assert!(
        limiter.pending_cancels() >= 2,
        "the cancel and the reset wait"
    );
    server.resume();
    // Back on Redis as soon as it answers, long before the 60 s open time:
    // the queued cancel and reset are sent and close the circuit.
    let back = Instant::now();
    while (limiter.circuit_open() || limiter.pending_cancels() > 0)
        && back.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !limiter.circuit_open() && limiter.pending_cancels() == 0,
        "the circuit closes once the queued work reached Redis ({:?})",
        back.elapsed()
    );
    let (after, admission) = ok_login().await;
    assert!(
        matches!(admission, Admission::Backend(_)),
        "decided by Redis again after {after:?}: {admission:?}"
    );
    eprintln!(
        "logins with Redis frozen: {times:?}; peek {peek:?} ({} remaining), reset {reset_took:?} ({reset:?})",
        peeked[0].remaining()
    );
    for (attempt, took) in times.iter().enumerate().take(2) {
        assert!(
            *took < TIMEOUT * 2,
            "attempt {attempt} took {took:?}: at most one timeout"
        );
    }
    for (attempt, took) in times.iter().enumerate().skip(2) {
        assert!(
            *took < AT_ONCE,
            "attempt {attempt} took {took:?} with the breaker open"
        );
    }
    assert!(peek < AT_ONCE, "peek took {peek:?}");
    assert_eq!(
        peeked[0].remaining(),
        3,
        "every local failure was given back"
    );
    assert!(reset_took < AT_ONCE, "reset took {reset_took:?}");
    // The backend's part of a reset fails fast: refused by the open circuit,
    // or queued behind the call given up on (sent once Redis answers).
    assert!(
        matches!(
            &reset,
            Err(Error::Backend(
                BackendError::CircuitOpen | BackendError::Unavailable(_)
            ))
        ),
        "the backend's part of a reset fails fast: {reset:?}"
    );
}

/// One invalid batch: what it is, its requests (key, limit, cost), and the
/// error every store answers.
type InvalidBatch = (&'static str, Vec<(Key, Limit, u64)>, LimitError);

/// The invalid batches every store refuses the same way.
fn invalid_batches(key: &Key, other: &Key, limits: &[Limit; 3]) -> Vec<InvalidBatch> {
    let [minute, also_minute, hour] = *limits;
    vec![
        (
            "no limit",
            vec![],
            LimitError::BadCall("a call needs at least one limit".into()),
        ),
        (
            "cost 0",
            vec![(key.clone(), minute, 0)],
            LimitError::ZeroCost,
        ),
        (
            "cost above the capacity",
            vec![(key.clone(), hour, 6)],
            LimitError::CostExceedsCapacity {
                cost: 6,
                capacity: 5,
            },
        ),
        (
            "one state named twice",
            vec![
                (key.clone(), minute, 1),
                (other.clone(), hour, 1),
                (key.clone(), also_minute, 1),
            ],
            LimitError::Overlapping {
                first: minute.to_string(),
                second: also_minute.to_string(),
            },
        ),
    ]
}

#[tokio::test]
async fn memory_and_redis_refuse_exactly_the_same_invalid_batches() {
    let server = RedisServer::start();
    let redis = Arc::new(RedisBackend::connect(server.url()).await.expect("connect"));
    let memory = Arc::new(MemoryBackend::new());
    let stores: [(&str, Arc<dyn Backend>, Limiter); 2] = [
        (
            "redis",
            redis.clone(),
            Limiter::builder()
                .shared_backend(redis.clone())
                .build()
                .unwrap(),
        ),
        (
            "memory",
            memory.clone(),
            Limiter::builder().memory().build().unwrap(),
        ),
    ];
    let key = Key::new("rl", "invalid", "alice");
    let other = Key::new("rl", "invalid", "bob");
    let limits = [
        Limit::per_minute(2).unwrap(),
        Limit::per_minute(3).unwrap(),
        Limit::per_hour(5).unwrap(),
    ];
    for (what, batch, expected) in invalid_batches(&key, &other, &limits) {
        let requests: Vec<Request<'_>> = batch
            .iter()
            .map(|(k, l, c)| Request::new(k, l, *c))
            .collect();
        for (store, backend, limiter) in &stores {
            let at = format!("{what}, {store}");
            let limit_error = |result: Result<ratewall::backend::Decisions, Error>| match result {
                Err(Error::Limit(error)) => error,
                other => panic!("{at}: {other:?}"),
            };
            assert_eq!(
                limit_error(limiter.requests().acquire_all(&requests).await),
                expected,
                "{at}"
            );
            assert_eq!(
                limit_error(limiter.requests().peek_all(&requests).await),
                expected,
                "{at}"
            );
            assert_eq!(
                limit_error(limiter.requests().acquire_all_once(&requests, "id-1").await),
                expected,
                "{at}"
            );
            match limiter.requests().check("invalid", &requests, None).await {
                Err(rejection) => assert!(
                    matches!(rejection.reason(), ratewall::RejectionReason::Unavailable(Error::Limit(e)) if *e == expected),
                    "{at}: {rejection:?}"
                ),
                Ok(admission) => panic!("{at}: admitted {admission:?}"),
            }
            match backend.acquire(&requests).await {
                Err(BackendError::Invalid(error)) => assert_eq!(error, expected, "{at}, backend"),
                other => panic!("{at}, backend: {other:?}"),
            }
        }
    }
    // Nothing was written anywhere.
    let keys: u64 = server.cmd(&["DBSIZE"]).await;
    assert_eq!(keys, 0);
    assert!(memory.is_empty());
}

// The login service's limits, once with the macro and once with the call
// API, decided on two limiters side by side.

#[rate_limit(
    name = "side_user", key = user, period = "1m", threshold = 3, algorithm = sliding_log,
    count = failures, reset_on_success, limiter = limiter,
    also(name = "side_ip", key = ip, period = "1d", threshold = 6, algorithm = fixed_window)
)]
async fn annotated(limiter: &Limiter, ip: &str, user: &str, ok: bool) -> Result<(), Rejection> {
    if ok {
        Ok(())
    } else {
        Err(Rejection::unavailable(
            "wrong password",
            Error::NotInstalled,
        ))
    }
}

static USER: [Limit; 1] = [Limit::from_parts_const(
    3,
    60_000_000,
    Algorithm::SlidingLog,
    3,
    10,
)];
static IP: [Limit; 1] = [Limit::from_parts_const(
    6,
    86_400_000_000,
    Algorithm::FixedWindow,
    6,
    10,
)];
static GROUPS: [GroupSpec; 2] = [
    GroupSpec::new("side_user", &USER).reset_on_success(),
    GroupSpec::new("side_ip", &IP),
];
static SPEC: CallSpec = CallSpec::new("side_user", &GROUPS).with_counting(Counting::Settled);

async fn by_hand(limiter: &Limiter, ip: &str, user: &str, ok: bool) -> Result<(), Rejection> {
    let permit = limiter.call(&SPEC, &[&user, &ip]).await?;
    let out = if ok {
        Ok(())
    } else {
        Err(Rejection::unavailable(
            "wrong password",
            Error::NotInstalled,
        ))
    };
    permit.settle(out.is_err()).await;
    out
}

/// What a call ended in, comparably.
fn outcome(result: Result<(), Rejection>) -> String {
    match result {
        Ok(()) => "ok".into(),
        Err(rejection) if rejection.name() == "wrong password" => "failed".into(),
        Err(rejection) => format!(
            "refused by {} ({} left)",
            rejection.name(),
            rejection.decision().map_or(0, |d| d.remaining())
        ),
    }
}

#[tokio::test]
async fn the_call_api_alone_reproduces_the_macros_counting_and_groups_on_memory_and_redis() {
    let server = RedisServer::start();
    // (ip, user, password right)
    let script = [
        ("ip1", "alice", false),
        ("ip1", "alice", false),
        ("ip1", "alice", true), // forgets alice's failures, gives the IP's unit back
        ("ip1", "alice", false),
        ("ip1", "alice", false),
        ("ip1", "alice", false),
        ("ip1", "alice", false), // refused: 3 failures for alice (nothing taken from the IP)
        ("ip1", "bob", false),   // the IP's 6th failure
        ("ip1", "carol", false), // refused: 6 failures for the IP
        ("ip2", "carol", true),
    ];
    for store in ["memory", "redis"] {
        let build = async || match store {
            "memory" => Limiter::builder().memory().build().unwrap(),
            _ => Limiter::builder()
                .backend(RedisBackend::connect(server.url()).await.expect("connect"))
                .prefix(format!("side{}", rand_suffix()))
                .build()
                .unwrap(),
        };
        let (macro_limiter, api_limiter) = (build().await, build().await);
        let mut macro_outcomes = Vec::new();
        let mut api_outcomes = Vec::new();
        for (ip, user, ok) in script {
            macro_outcomes.push(outcome(annotated(&macro_limiter, ip, user, ok).await));
            api_outcomes.push(outcome(by_hand(&api_limiter, ip, user, ok).await));
        }
        assert_eq!(macro_outcomes, api_outcomes, "{store}");
        assert_eq!(macro_outcomes[5], "failed", "{store}");
        assert_eq!(
            macro_outcomes[6], "refused by side_user (0 left)",
            "{store}"
        );
        assert_eq!(macro_outcomes[7], "failed", "{store}");
        assert_eq!(macro_outcomes[8], "refused by side_ip (0 left)", "{store}");
        assert_eq!(macro_outcomes[9], "ok", "{store}");
    }
}

/// A prefix of its own per limiter, so two limiters on one server share no key.
fn rand_suffix() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
