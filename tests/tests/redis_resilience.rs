//! Failures of the server: a flushed script cache, a stopped, restarted or
//! frozen server. Calls fail within the timeout, never hang or panic, and the
//! same backend recovers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratewall::{
    Algorithm, Key, Limit,
    backend::{Backend, Request},
    error::BackendError,
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;

/// Slack allowed beyond the configured timeout (scheduling on a loaded machine).
const SLACK: Duration = Duration::from_millis(250);

fn limits() -> Vec<Limit> {
    Algorithm::ALL
        .iter()
        .map(|&a| {
            Limit::new(10_000, Duration::from_secs(1))
                .and_then(|l| l.with_algorithm(a))
                .expect("limit")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_in_the_middle_of_a_load_run_causes_no_errors() {
    let server = RedisServer::start();
    let backend = Arc::new(RedisBackend::connect(server.url()).await.expect("connect"));
    let limits = Arc::new(limits());
    let stop = Arc::new(AtomicBool::new(false));
    let (calls, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..16u64 {
        let (backend, limits, stop) = (backend.clone(), limits.clone(), stop.clone());
        let (calls, errors) = (calls.clone(), errors.clone());
        workers.spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = Key::from_display("flush", "load", &(worker * 1_000 + n % 100));
                let limit = &limits[(n % limits.len() as u64) as usize];
                // Alternate single limits and mixed batches.
                let other = &limits[((n + 1) % limits.len() as u64) as usize];
                let result = if n.is_multiple_of(2) {
                    backend.acquire(&[Request::new(&key, limit, 1)]).await
                } else {
                    backend
                        .acquire(&[Request::new(&key, limit, 1), Request::new(&key, other, 1)])
                        .await
                };
                calls.fetch_add(1, Ordering::Relaxed);
                if let Err(error) = result {
                    errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("call failed: {error}");
                }
                n += 1;
            }
        });
    }
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = calls.load(Ordering::Relaxed);
        let _: String = server.cmd(&["SCRIPT", "FLUSH"]).await;
        let _: String = server.cmd(&["FUNCTION", "FLUSH"]).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            calls.load(Ordering::Relaxed) > before,
            "calls go on after SCRIPT FLUSH and FUNCTION FLUSH"
        );
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = workers.join_next().await {
        done.expect("worker");
    }
    let (calls, errors) = (
        calls.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    assert!(calls > 1_000, "only {calls} calls");
    assert_eq!(errors, 0, "{errors} of {calls} calls failed");
    // Every flush was followed by a reload: the library loaded again (the
    // first load is the connect's), or the code sent with EVAL.
    let stats: String = server.cmd(&["INFO", "commandstats"]).await;
    let count = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let reloads = count("function|load") - 1 + count("eval");
    assert!(
        reloads >= 5,
        "the code was reloaded {reloads} times for 5 flushes"
    );
}

async fn acquire_once(
    backend: &RedisBackend,
    limit: &Limit,
    n: u64,
) -> (Result<bool, BackendError>, Duration) {
    let key = Key::from_display("down", "api", &n);
    let started = Instant::now();
    let result = backend
        .acquire(&[Request::new(&key, limit, 1)])
        .await
        .map(|d| d.allowed());
    (result, started.elapsed())
}

/// Retries until a call succeeds; returns how long that took.
async fn until_it_succeeds(backend: &RedisBackend, limit: &Limit, within: Duration) -> Duration {
    let started = Instant::now();
    let mut n = 0;
    loop {
        let (result, _) = acquire_once(backend, limit, n).await;
        if result.is_ok() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "no successful call within {within:?}: {result:?}"
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One call of a load run: when it started (since the run began), how long
/// it took, and its outcome.
struct Outcome {
    started: Duration,
    took: Duration,
    result: Result<bool, BackendError>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_within_the_timeout_while_redis_is_stopped_mid_run_and_the_same_backend_recovers_after_a_restart()
 {
    let server = Arc::new(RedisServer::start());
    let timeout = Duration::from_millis(300);
    let backend = Arc::new(
        RedisBackend::builder(server.url())
            .timeout(timeout)
            .connect()
            .await
            .expect("connect"),
    );
    let limit = Limit::per_minute(10).expect("limit");
    let run = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..8u64 {
        let (backend, done) = (backend.clone(), done.clone());
        workers.spawn(async move {
            let mut outcomes = Vec::new();
            let mut n = worker * 1_000_000;
            while !done.load(Ordering::Relaxed) {
                let started = run.elapsed();
                let (result, took) = acquire_once(&backend, &limit, n).await;
                outcomes.push(Outcome {
                    started,
                    took,
                    result,
                });
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            outcomes
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stop_begun = run.elapsed();
    let server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .expect("stop");
    let stopped = run.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let restart_begun = run.elapsed();
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .expect("restart");
    let restarted = run.elapsed();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    done.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    while let Some(worker) = workers.join_next().await {
        outcomes.extend(worker.expect("worker"));
    }

    for outcome in &outcomes {
        assert!(
            outcome.took <= timeout + SLACK,
            "a call took {:?} (timeout {timeout:?}): {:?}",
            outcome.took,
            outcome.result
        );
        if let Err(error) = &outcome.result {
            assert!(
                matches!(
                    error,
                    BackendError::Unavailable(_) | BackendError::Timeout(_)
                ),
                "unexpected error kind: {error}"
            );
        }
    }
    let during = |from: Duration, to: Duration| {
        outcomes
            .iter()
            .filter(move |o| o.started >= from && o.started + o.took <= to)
    };
    assert!(
        during(Duration::ZERO, stop_begun).all(|o| o.result.is_ok()),
        "calls failed before the stop"
    );
    assert!(
        during(stopped, restart_begun).count() > 10,
        "calls were made while the server was down"
    );
    assert!(
        during(stopped, restart_begun).all(|o| o.result.is_err()),
        "a call succeeded while the server was down"
    );
    let settled = restarted + Duration::from_secs(1);
    assert!(
        during(settled, Duration::MAX).count() > 10,
        "calls were made after the restart"
    );
    assert!(
        during(settled, Duration::MAX).all(|o| o.result.is_ok()),
        "calls still fail a second after the restart"
    );
    let first_success = outcomes
        .iter()
        .filter(|o| o.started >= restarted && o.result.is_ok())
        .map(|o| o.started + o.took - restarted)
        .min();
    eprintln!(
        "{} calls; first success {first_success:?} after the restart",
        outcomes.len()
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_time_out_while_redis_is_frozen_and_succeed_once_it_resumes() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let backend = RedisBackend::builder(server.url())
        .timeout(timeout)
        .connect()
        .await
        .expect("connect");
    let limit = Limit::per_minute(10).expect("limit");
    assert!(acquire_once(&backend, &limit, 0).await.0.expect("up"));
    server.pause();
    for n in 0..5 {
        let (result, took) = acquire_once(&backend, &limit, n).await;
        let error = result.expect_err("a frozen server answered");
        assert!(
            matches!(
                error,
                BackendError::Timeout(_) | BackendError::Unavailable(_)
            ),
            "{error}"
        );
        assert!(
            took >= timeout - Duration::from_millis(50) && took <= timeout + SLACK,
            "call {n} took {took:?}"
        );
    }
    server.resume();
    until_it_succeeds(&backend, &limit, Duration::from_secs(10)).await;
    for n in 100..110 {
        assert!(
            acquire_once(&backend, &limit, n)
                .await
                .0
                .expect("after resume"),
            "call {n}"
        );
    }
}

/// Issue 24 (5): a refused connection fails fast, and a restarted server
/// decides again within the breaker's open time (+ 250 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_fails_each_call_fast_and_a_restarted_one_decides_again_within_the_open_time()
 {
    use ratewall::{
        CallSpec, FailurePolicy, GroupSpec, Limiter, builder::BreakerConfig, call::Admission,
    };
    /// The bound on a call once the connection is refused.
    const FAST: Duration = Duration::from_millis(50);
    let open_for = BreakerConfig::default().open_for;
    let server = Arc::new(RedisServer::start());
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(1))
        .connect()
        .await
        .expect("connect");
    let limiter = Limiter::builder()
        .backend(backend)
        .failure_policy(FailurePolicy::local(1).expect("policy"))
        .build()
        .expect("limiter");
    let spec = CallSpec::owned(
        "api",
        vec![GroupSpec::owned(
            "api_user",
            vec![Limit::per_second(1_000_000).expect("limit")],
        )],
    );
    // One caller every 10 ms; each call: when it ended, how long it took,
    // whether Redis decided it.
    let call = async |n: u64| {
        let started = Instant::now();
        let permit = limiter.call(&spec, &[&n]).await.expect("admitted");
        let by_redis = matches!(permit.admission(), Admission::Backend(_));
        (Instant::now(), started.elapsed(), by_redis)
    };
    assert!(call(0).await.2, "decided by Redis while it runs");

    let killed = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || server.kill())
            .await
            .expect("kill");
        Instant::now()
    };
    let mut down = Vec::new();
    while killed.elapsed() < Duration::from_secs(1) {
        down.push(call(1).await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    {
        let server = server.clone();
        tokio::task::spawn_blocking(move || server.restart())
            .await
            .expect("restart");
    }
    let restarted = Instant::now();
    let back = loop {
        let (ended, took, by_redis) = call(2).await;
        if by_redis {
            break ended - restarted;
        }
        assert!(
            took < FAST,
            "a call took {took:?} with the breaker open or the connection refused"
        );
        assert!(
            restarted.elapsed() < open_for + Duration::from_secs(5),
            "Redis never decided again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let slowest = down.iter().map(|(_, took, _)| *took).max().expect("calls");
    eprintln!(
        "{} calls while Redis was down, the slowest {slowest:?}; decided by Redis again {back:?} after the restart (open time {open_for:?})",
        down.len()
    );
    assert!(
        down.iter().all(|(_, _, by_redis)| !by_redis),
        "Redis was down"
    );
    for (i, (_, took, _)) in down.iter().enumerate() {
        assert!(
            *took < FAST,
            "call {i} after the kill took {took:?} (connection refused)"
        );
    }
    assert!(
        back <= open_for + Duration::from_millis(250),
        "decided by Redis again {back:?} after the restart (open time {open_for:?})"
    );
}
