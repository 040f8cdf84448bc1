//! Quota leasing against a real Redis: a hot identity's calls decided in
//! process from leased units (far fewer round trips, never more than the
//! limit, nearly all of it usable), cold identities decided by Redis as
//! before, and a killed holder's units back within the lease TTL.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratewall::{Algorithm, Backend, CallSpec, GroupSpec, Key, Limit, Limiter, Request};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;

/// Calls of our code (`FCALL`, `FCALL_RO`, `EVALSHA`, `EVAL`) in `INFO
/// commandstats`: decisions, lease takes and returns alike.
async fn code_calls(server: &RedisServer) -> u64 {
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
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The server's time in µs.
async fn server_micros(server: &RedisServer) -> u64 {
    let (seconds, micros): (u64, u64) = server.cmd(&["TIME"]).await;
    seconds * 1_000_000 + micros
}

/// A limiter of its own (one connection) on `server`.
async fn instance(server: &RedisServer, prefix: &str) -> Arc<Limiter> {
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    Arc::new(
        Limiter::builder()
            .backend(backend)
            .prefix(prefix)
            // The shared lists' refresh is a call of its own; these tests
            // count decisions and leases.
            .lists_refresh(Duration::from_secs(3_600))
            .build()
            .expect("limiter"),
    )
}

/// The count a fixed-window state key holds for window `window` (its value:
/// two little-endian doubles, the window index and the count).
async fn window_count(server: &RedisServer, key: &str, window: u64) -> Option<u64> {
    let value: Option<Vec<u8>> = server.cmd(&["GET", key]).await;
    let value = value?;
    let read = |at: usize| f64::from_le_bytes(value[at..at + 8].try_into().expect("8 bytes"));
    (value.len() == 16 && read(0) as u64 == window).then(|| read(8) as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hot_identity_on_four_instances_takes_a_tenth_of_the_round_trips_and_never_exceeds_the_limit()
 {
    // The figures: 1 000 000 per minute, a lease of at most 2 % of
    // it; the demand exhausts a window within about 4 s of a debug build.
    let (threshold, period, lease) = (1_000_000, Duration::from_secs(60), 20_000);
    const INSTANCES: usize = 4;
    const CALLERS: usize = 4;
    let cap = period + Duration::from_secs(10);
    let server = RedisServer::start();
    let limit = Limit::new(threshold, period)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .and_then(|l| l.with_lease(lease))
        .expect("limit");
    let spec = Arc::new(CallSpec::owned(
        "hot",
        vec![GroupSpec::owned("hot", vec![limit])],
    ));
    let mut limiters = Vec::new();
    for _ in 0..INSTANCES {
        limiters.push(instance(&server, "lease").await);
    }
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]).await;

    let decided = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for limiter in &limiters {
        for _ in 0..CALLERS {
            let (limiter, spec, decided, done) =
                (limiter.clone(), spec.clone(), decided.clone(), done.clone());
            tasks.spawn(async move {
                // Admitted units per window (of the decision's time: a
                // leased unit is the window's it was taken in).
                let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
                let mut calls = 0u64;
                while !done.load(Ordering::Relaxed) && started.elapsed() < cap {
                    calls += 1;
                    match limiter.call(&spec, &[&"tenant-1"]).await {
                        Ok(permit) => {
                            let at = permit.admission().decisions().expect("decided")[0].at_micros;
                            *admitted.entry(at / period.as_micros() as u64).or_default() += 1;
                        }
                        Err(rejection) => {
                            // A window's quota spent well before its end:
                            // the demand exceeded the limit.
                            let retry = rejection.retry_after().expect("rate limited");
                            if retry > period / 10 {
                                done.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                    if calls.is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
                decided.fetch_add(calls, Ordering::Relaxed);
                admitted
            });
        }
    }
    let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
    while let Some(task) = tasks.join_next().await {
        for (window, count) in task.expect("caller") {
            *admitted.entry(window).or_default() += count;
        }
    }
    let elapsed = started.elapsed();
    for limiter in &limiters {
        limiter.shutdown().await;
        assert_eq!(limiter.leased_units(), 0);
    }
    let calls = code_calls(&server).await;
    let decisions = decided.load(Ordering::Relaxed);
    let total: u64 = admitted.values().sum();
    eprintln!(
        "hot identity, {INSTANCES} instances: {decisions} decisions ({total} admitted, per window {admitted:?}) in {elapsed:?}, \
         {calls} calls reached Redis ({:.0} decisions per call)",
        decisions as f64 / calls as f64
    );
    assert!(
        done.load(Ordering::Relaxed),
        "the demand did not exhaust a window within {cap:?}: {admitted:?}"
    );
    // Never above the limit in any window; once every lease is given back,
    // Redis counts exactly what was admitted (the last window's key is still
    // there; an earlier window's was replaced).
    let key = format!(
        "{}:fw:{}",
        Key::new("lease", "hot", "tenant-1"),
        period.as_micros()
    );
    let mut checked = 0;
    for (&window, &count) in &admitted {
        assert!(count <= threshold, "window {window}: {count} admitted");
        if let Some(counted) = window_count(&server, &key, window).await {
            assert_eq!(
                counted, count,
                "window {window}: Redis counts {counted}, {count} admitted"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 1, "the last window's count was read from Redis");
    // At least 90 % of the limit was usable (the demand exceeded it).
    let last = admitted.values().last().copied().unwrap_or(0);
    assert!(
        last * 10 >= threshold * 9,
        "only {last} of {threshold} admitted"
    );
    // At least ten times fewer round trips than decisions.
    assert!(
        calls * 10 <= decisions,
        "{calls} calls for {decisions} decisions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_gcra_identity_on_four_instances_stays_within_its_bound_with_few_round_trips() {
    // 100 000 per 6 s (one unit every 60 µs, the 1 000 000 per
    // minute scaled tenfold) with a burst of 10 000: after the burst, the
    // steady rate is what the demand gets, so leases are taken at the limit.
    const THRESHOLD: u64 = 100_000;
    const BURST: u64 = 10_000;
    const PERIOD: Duration = Duration::from_secs(6);
    const RUN: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let limit = Limit::new(THRESHOLD, PERIOD)
        .and_then(|l| l.with_burst(BURST))
        .and_then(|l| l.with_lease(2_000))
        .expect("limit");
    let spec = Arc::new(CallSpec::owned(
        "steady",
        vec![GroupSpec::owned("steady", vec![limit])],
    ));
    let mut limiters = Vec::new();
    for _ in 0..4 {
        limiters.push(instance(&server, "gcra").await);
    }
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]).await;
    let first = server_micros(&server).await;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for limiter in &limiters {
        for _ in 0..4 {
            let (limiter, spec) = (limiter.clone(), spec.clone());
            tasks.spawn(async move {
                let (mut admitted, mut calls) = (0u64, 0u64);
                while started.elapsed() < RUN {
                    calls += 1;
                    if limiter.call(&spec, &[&"tenant-2"]).await.is_ok() {
                        admitted += 1;
                    }
                    if calls.is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
                (admitted, calls)
            });
        }
    }
    let (mut admitted, mut decisions) = (0, 0);
    while let Some(task) = tasks.join_next().await {
        let (a, c) = task.expect("caller");
        admitted += a;
        decisions += c;
    }
    let last = server_micros(&server).await;
    for limiter in &limiters {
        limiter.shutdown().await;
    }
    let calls = code_calls(&server).await;
    // GCRA's bound over the run: the burst, plus one unit per interval.
    let interval = limit.emission_interval_micros();
    let bound = BURST + (last - first) / interval + 1;
    eprintln!(
        "saturated GCRA identity, 4 instances: {decisions} decisions, {admitted} admitted of at most {bound}, \
         {calls} calls reached Redis ({:.0} decisions per call)",
        decisions as f64 / calls as f64
    );
    assert!(
        admitted <= bound,
        "{admitted} admitted, at most {bound} allowed"
    );
    assert!(
        admitted * 10 >= bound * 9,
        "only {admitted} of {bound} admitted"
    );
    assert!(
        calls * 10 <= decisions,
        "{calls} calls for {decisions} decisions"
    );
}

/// What `limit` has left for `key` now.
async fn remaining(backend: &RedisBackend, key: &Key, limit: &Limit) -> u64 {
    backend
        .peek(&[Request::new(key, limit, 1)])
        .await
        .expect("peek")[0]
        .remaining
}

/// Calls of the decision functions only (`FCALL`, `FCALL_RO`): not the
/// limits registry's scripts.
async fn function_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]).await;
    info.lines()
        .filter(|line| line.starts_with("cmdstat_fcall:") || line.starts_with("cmdstat_fcall_ro:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_cold_identities_take_no_lease_and_cost_one_round_trip_per_decision() {
    const IDENTITIES: usize = 1_500;
    const TASKS: usize = 16;
    let server = RedisServer::start();
    let limiter = instance(&server, "cold").await;
    let limit = Limit::per_minute(100)
        .and_then(|l| l.with_lease(20))
        .expect("limit");
    let spec = Arc::new(CallSpec::owned(
        "cold",
        vec![GroupSpec::owned("cold", vec![limit])],
    ));
    // A first call publishes the limits (a script call of its own).
    assert!(limiter.call(&spec, &[&"warm-up"]).await.is_ok());
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]).await;
    let mut decisions = 0;
    for _round in 0..2 {
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..TASKS {
            let (limiter, spec) = (limiter.clone(), spec.clone());
            tasks.spawn(async move {
                for identity in (task..IDENTITIES).step_by(TASKS) {
                    let identity = format!("user-{identity}");
                    let decision = limiter.call(&spec, &[&identity]);
                    assert!(decision.await.is_ok());
                }
            });
        }
        while let Some(task) = tasks.join_next().await {
            task.expect("caller");
        }
        decisions += IDENTITIES as u64;
    }
    let calls = function_calls(&server).await;
    assert_eq!(calls, decisions, "one round trip per decision");
    assert_eq!(limiter.leased_units(), 0);
    let records: Vec<String> = server.cmd(&["KEYS", "cold:*:leases"]).await;
    assert!(records.is_empty(), "no lease was taken: {records:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_units_are_back_within_the_lease_ttl() {
    // The holder (src/bin/rl-lease-holder.rs) leases a GCRA limit of
    // 100 000 per 10 s (one unit per 100 µs) with a 2 s lease TTL: a lease
    // spans at most the TTL's worth of refill, so whatever it held is back
    // within the TTL once its process is gone.
    const TTL: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let limit = Limit::new(100_000, Duration::from_secs(10))
        .and_then(|l| l.with_lease(5_000))
        .expect("limit");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rl-lease-holder"))
        .args([server.url().as_str(), "held", "tenant-3", "2000"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the lease holder");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the holder's output");
    child.kill().expect("SIGKILL the holder");
    let killed = Instant::now();
    child.wait().expect("reap the holder");
    let held: u64 = line
        .strip_prefix("ready ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the holder said {line:?}"));
    assert!(held >= 1_000, "the holder leased only {held} units");

    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let key = Key::new("held", "held", "tenant-3");
    let records = backend.leases(&key, &limit).await.expect("lease records");
    assert!(!records.is_empty(), "Redis records the holder's lease");
    let right_after = remaining(&backend, &key, &limit).await;
    // Every recorded lease's units were taken from the state when it was
    // taken; since the first of them, GCRA has refilled one unit per
    // interval (the holder's own calls only took more).
    let now = server_micros(&server).await;
    let first = records
        .iter()
        .map(|r| r.taken_at_micros)
        .min()
        .expect("a record");
    let refilled = now.saturating_sub(first) / limit.emission_interval_micros() + 1;
    assert!(
        right_after + held <= limit.burst() + refilled,
        "the leased units were taken: {right_after} remaining with {held} leased, {refilled} refilled since"
    );
    loop {
        if remaining(&backend, &key, &limit).await == limit.burst() {
            break;
        }
        assert!(
            killed.elapsed() < TTL + Duration::from_millis(500),
            "the killed holder's units were not back within the TTL"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "a killed holder of {held} leased units: full capacity back {:?} after SIGKILL",
        killed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_window_units_stay_counted_until_their_window_ends_and_no_longer() {
    // A fixed window of 100 000 per 2 s: Redis cannot tell which of a dead
    // holder's units were used, so they all count until the window ends
    // (at most the lease size), and the next window starts whole.
    const PERIOD: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let limit = Limit::new(100_000, PERIOD)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .and_then(|l| l.with_lease(5_000))
        .expect("limit");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rl-lease-holder"))
        .args([
            server.url().as_str(),
            "held",
            "tenant-4",
            "1000",
            "100000/2s",
            "fixed_window",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the lease holder");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the holder's output");
    child.kill().expect("SIGKILL the holder");
    let killed = Instant::now();
    child.wait().expect("reap the holder");
    let held: u64 = line
        .strip_prefix("ready ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the holder said {line:?}"));
    assert!(
        (1_000..=2 * 5_000).contains(&held),
        "the holder leased {held} units"
    );

    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let key = Key::new("held", "held", "tenant-4");
    let right_after = remaining(&backend, &key, &limit).await;
    if right_after < limit.threshold() {
        // Still the holder's window: its units count as used.
        assert!(
            right_after + held <= limit.threshold(),
            "the leased units were taken: {right_after} remaining with {held} leased"
        );
    }
    loop {
        if remaining(&backend, &key, &limit).await == limit.threshold() {
            break;
        }
        assert!(
            killed.elapsed() < PERIOD + Duration::from_millis(500),
            "the killed holder's units outlived their window"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "a killed holder of {held} leased window units: full capacity back {:?} after SIGKILL (window {PERIOD:?})",
        killed.elapsed()
    );
}
