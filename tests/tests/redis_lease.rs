//! Quota leasing against a real Redis: a hot identity's calls decided in
//! process from leased units (far fewer round trips, never more than the
//! limit, nearly all of it usable), cold identities decided by Redis as
//! before, and a killed holder's units back within the lease TTL.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratewall::{
    Algorithm, CallSpec, GroupSpec, Key, Limit, Limiter,
    backend::{Backend, Request},
};
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
    instance_coalescing(server, prefix, true).await
}

/// [`instance`], its backend coalescing concurrent calls or not.
async fn instance_coalescing(server: &RedisServer, prefix: &str, coalesce: bool) -> Arc<Limiter> {
    let backend = RedisBackend::builder(server.url())
        .coalesce(coalesce)
        .connect()
        .await
        .expect("connect");
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
    // The proportions, a lease of at most 2 % of the limit, at a
    // fifth of its 1 000 000 per minute: the demand exhausts a window
    // within a few seconds of a debug build, where a million took about 4 s
    // alone and a minute beside the rest of the suite.
    let (threshold, period, lease) = (200_000, Duration::from_secs(60), 4_000);
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
                let mut refused: BTreeMap<u64, u64> = BTreeMap::new();
                let mut calls = 0u64;
                while !done.load(Ordering::Relaxed) && started.elapsed() < cap {
                    calls += 1;
                    match limiter.call(&spec, &[&"tenant-1"]).await {
                        Ok(permit) => {
                            let at =
                                permit.admission().decisions().expect("decided")[0].at_micros();
                            *admitted.entry(at / period.as_micros() as u64).or_default() += 1;
                        }
                        Err(rejection) => {
                            let at = rejection.decision().expect("rate limited").at_micros();
                            *refused.entry(at / period.as_micros() as u64).or_default() += 1;
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
                (admitted, refused)
            });
        }
    }
    let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
    let mut refused: BTreeMap<u64, u64> = BTreeMap::new();
    while let Some(task) = tasks.join_next().await {
        let (admitted_here, refused_here) = task.expect("caller");
        for (window, count) in admitted_here {
            *admitted.entry(window).or_default() += count;
        }
        for (window, count) in refused_here {
            *refused.entry(window).or_default() += count;
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
        "hot identity, {INSTANCES} instances: {decisions} decisions ({total} admitted, per window {admitted:?}; \
         refused per window {refused:?}) in {elapsed:?}, {calls} calls reached Redis ({:.0} decisions per call)",
        decisions as f64 / calls as f64
    );
    if !done.load(Ordering::Relaxed) {
        // A busy machine may not make the limit's calls in a minute: then the
        // demand never exceeded the limit, and what is judged below is that
        // no call was refused before its window was nearly spent.
        eprintln!("the demand did not exhaust a window within {cap:?}");
    }
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
    // At least 90 % of the limit was usable: a window that refused a call
    // admitted at least that much (leases strand at most one each).
    for (window, count) in &refused {
        let used = admitted.get(window).copied().unwrap_or(0);
        assert!(
            used * 10 >= threshold * 9,
            "window {window} refused {count} calls after only {used} of {threshold} admitted"
        );
    }
    // At least ten times fewer round trips than decisions.
    assert!(
        calls * 10 <= decisions,
        "{calls} calls for {decisions} decisions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_gcra_identity_on_four_instances_stays_within_its_bound_with_few_round_trips() {
    // 3 000 per 6 s (one unit every 2 ms) with a burst of 500: after the
    // burst, the steady rate is what the demand gets, so leases are taken
    // at the limit. (A GCRA lease's unit must be used before its arrival
    // time, so leases save round trips only for an identity that saturates
    // its limit: this rate is one a debug build saturates even on a busy
    // machine, where 16 callers make about 1 000 calls a second.)
    const THRESHOLD: u64 = 3_000;
    const BURST: u64 = 500;
    const PERIOD: Duration = Duration::from_secs(6);
    const RUN: Duration = Duration::from_secs(2);
    const LEASE: u64 = 100;
    const INSTANCES: usize = 4;
    const CALLERS: usize = 4;
    let server = RedisServer::start();
    let limit = Limit::new(THRESHOLD, PERIOD)
        .and_then(|l| l.with_burst(BURST))
        .and_then(|l| l.with_lease(LEASE))
        .expect("limit");
    let spec = Arc::new(CallSpec::owned(
        "steady",
        vec![GroupSpec::owned("steady", vec![limit])],
    ));
    let mut limiters = Vec::new();
    for _ in 0..INSTANCES {
        limiters.push(instance(&server, "gcra").await);
    }
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]).await;
    let first = server_micros(&server).await;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for limiter in &limiters {
        for _ in 0..CALLERS {
            let (limiter, spec) = (limiter.clone(), spec.clone());
            tasks.spawn(async move {
                // When each call was made, in µs since `started`.
                let (mut admitted, mut calls) = (0u64, Vec::new());
                while started.elapsed() < RUN {
                    calls.push(started.elapsed().as_micros() as u64);
                    if limiter.call(&spec, &[&"tenant-2"]).await.is_ok() {
                        admitted += 1;
                    }
                    if calls.len().is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
                (admitted, calls)
            });
        }
    }
    let (mut admitted, mut made) = (0, Vec::new());
    while let Some(task) = tasks.join_next().await {
        let (a, calls) = task.expect("caller");
        admitted += a;
        made.extend(calls);
    }
    let last = server_micros(&server).await;
    let decisions = made.len() as u64;
    for limiter in &limiters {
        limiter.shutdown().await;
    }
    let calls = code_calls(&server).await;
    // GCRA's bound over the run: the burst, plus one unit per interval.
    let interval = limit.emission_interval_micros();
    let bound = BURST + (last - first) / interval + 1;
    // What one exact GCRA without leases would have admitted of the same
    // calls: the demand this machine could make, which a busy machine
    // keeps below the limit.
    made.sort_unstable();
    let exact = exact_gcra(&made, interval, BURST);
    eprintln!(
        "saturated GCRA identity, {INSTANCES} instances: {decisions} decisions, {admitted} admitted \
         (exact GCRA: {exact}, at most {bound}), {calls} calls reached Redis ({:.0} decisions per call)",
        decisions as f64 / calls as f64
    );
    assert!(
        admitted <= bound,
        "{admitted} admitted, at most {bound} allowed"
    );
    // Leases strand at most what the instances hold when the run ends (one
    // lease each); 2 % more for the calls' times being the test's, not
    // Redis'.
    let floor = exact.saturating_sub(INSTANCES as u64 * LEASE + exact / 50);
    assert!(
        admitted >= floor,
        "only {admitted} admitted, an exact GCRA would have admitted {exact} of the same calls"
    );
    assert!(
        calls * 10 <= decisions,
        "{calls} calls for {decisions} decisions"
    );
}

/// How many of the calls made at `times` (µs, ascending) one GCRA admits:
/// one unit every `interval` µs, `burst` at once.
fn exact_gcra(times: &[u64], interval: u64, burst: u64) -> u64 {
    let tolerance = interval * burst;
    let mut tat = 0u64;
    let mut admitted = 0;
    for &at in times {
        let next = tat.max(at) + interval;
        if next - at <= tolerance {
            tat = next;
            admitted += 1;
        }
    }
    admitted
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
    // Every call sent alone (coalesced, several decisions share one call):
    // the calls counted are the decisions' own round trips.
    let limiter = instance_coalescing(&server, "cold", false).await;
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

/// The lease size of the holder (src/bin/rl-lease-holder.rs).
const LEASE: u64 = 5_000;

/// What the server's millisecond expiries may add to a stated bound (µs).
const ROUNDING_US: u64 = 2_000;

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Starts a lease holder for `rate` and `algorithm` with a lease TTL of
/// `ttl`, kills it (SIGKILL) right after a take, and returns what it held
/// and when it was killed.
fn kill_a_holder(
    server: &RedisServer,
    identity: &str,
    ttl: Duration,
    rate: &str,
    algorithm: Algorithm,
) -> (u64, Instant) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rl-lease-holder"))
        .args([
            server.url().as_str(),
            "held",
            identity,
            &ttl.as_millis().to_string(),
            rate,
            &algorithm.to_string(),
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
    (held, killed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_at_its_peak_strands_at_most_one_lease_and_for_no_longer_than_stated() {
    // Per algorithm that leases: the rate, the lease TTL, and how soon the
    // README says a killed holder's units are back. GCRA and the buckets:
    // within the lease TTL (what one holds never spans more than the TTL's
    // worth of refill); the windows: when the window ends (the sliding
    // window: when its last slot has left the window).
    let cases: [(Algorithm, &str, Duration, Duration); 5] = [
        (
            Algorithm::Gcra,
            "100000/10s",
            Duration::from_secs(2),
            Duration::from_secs(2),
        ),
        (
            Algorithm::TokenBucket,
            "100000/10s",
            Duration::from_secs(2),
            Duration::from_secs(2),
        ),
        (
            Algorithm::LeakyBucket,
            "100000/10s",
            Duration::from_secs(2),
            Duration::from_secs(2),
        ),
        (
            Algorithm::FixedWindow,
            "100000/2s",
            Duration::from_secs(1),
            Duration::from_secs(2),
        ),
        (
            Algorithm::SlidingWindow,
            "100000/2s",
            Duration::from_secs(1),
            Duration::from_millis(2_200),
        ),
    ];
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let mut table = Vec::new();
    for (number, (algorithm, rate, ttl, back_within)) in cases.into_iter().enumerate() {
        let limit = rate
            .parse::<Limit>()
            .and_then(|l| l.with_algorithm(algorithm))
            .and_then(|l| l.with_lease(LEASE))
            .expect("limit");
        // A lease's record is listed until its TTL (1 s for the windows)
        // has passed since the take: a test process slowed by load may read
        // it later than that. Such a holder is killed again, on an identity
        // of its own, up to three times; a record never written fails all
        // three.
        let mut attempt = 0;
        let (held, killed, killed_at, key, records) = loop {
            attempt += 1;
            let identity = format!("tenant-{number}-{attempt}");
            let (held, killed) = kill_a_holder(&server, &identity, ttl, rate, algorithm);
            // The server's time just after the kill: the bound below counts
            // from it (a slow read only makes it later, never a false
            // failure).
            let killed_at = server_micros(&server).await;
            // The bound: at most one lease per instance, the take ahead
            // included.
            assert!(
                (1_000..=LEASE).contains(&held),
                "{algorithm}: the holder held {held} units at its peak (lease {LEASE})"
            );
            let key = Key::new("held", "held", &identity);
            let records = backend.leases(&key, &limit).await.expect("lease records");
            if !records.is_empty() || attempt == 3 {
                break (held, killed, killed_at, key, records);
            }
            eprintln!(
                "{algorithm}: no lease record {:?} after the kill (TTL {ttl:?}); again",
                killed.elapsed()
            );
        };
        assert!(
            !records.is_empty(),
            "{algorithm}: Redis records the lease (three holders, the last read {:?} after its kill)",
            killed.elapsed()
        );
        let seen = backend
            .peek(&[Request::new(&key, &limit, 1)])
            .await
            .expect("peek")[0];
        let right_after = seen.remaining();
        // The held units were taken in Redis (nothing over-admits): since
        // the first lease, at most what refilled came back.
        let now = server_micros(&server).await;
        let first = records
            .iter()
            .map(|r| r.taken_at_micros)
            .min()
            .expect("a record");
        if algorithm.uses_burst() {
            let refilled = now.saturating_sub(first) / limit.emission_interval_micros() + 1;
            assert!(
                right_after + held <= limit.burst() + refilled,
                "{algorithm}: the leased units were taken: {right_after} remaining with {held} leased, {refilled} refilled since"
            );
        } else if right_after < limit.burst() {
            // Still the holder's window: its units count as used.
            assert!(
                right_after + held <= limit.burst(),
                "{algorithm}: the leased units were taken: {right_after} remaining with {held} leased"
            );
        }
        // When full capacity must be back, in the server's time (each
        // peek's own: a test process slowed by load observes later, and
        // cannot fail the bound by that). The windows: the stated time
        // after the kill. GCRA and the buckets refill what the holder took,
        // used or stranded alike, at the limit's rate: full once the
        // deficit seen right after the kill has refilled, and what one
        // holder can strand refills within the stated time.
        let mut bound = killed_at + micros(back_within);
        if algorithm.uses_burst() {
            let interval = limit.emission_interval_micros();
            assert!(
                LEASE * interval <= micros(back_within),
                "{algorithm}: a stranded lease refills within {back_within:?}"
            );
            let deficit = limit.burst() - right_after;
            bound = bound.max(seen.at_micros() + deficit * interval);
        }
        let bound = bound + ROUNDING_US;
        let back_at = loop {
            let peek = backend
                .peek(&[Request::new(&key, &limit, 1)])
                .await
                .expect("peek")[0];
            if peek.remaining() == limit.burst() {
                break peek.at_micros();
            }
            assert!(
                peek.at_micros() < bound,
                "{algorithm}: the killed holder's {held} units were not back within {back_within:?} ({} remaining {} us after the kill)",
                peek.remaining(),
                peek.at_micros().saturating_sub(killed_at)
            );
            // Liveness only (the bound above is the server's): a server
            // that stopped answering fails here.
            assert!(
                killed.elapsed() < back_within + Duration::from_secs(30),
                "{algorithm}: no full capacity {:?} after the kill",
                killed.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        table.push(format!(
            "{algorithm:14} held {held:5} of a {LEASE} lease at its peak; full capacity seen {} ms after SIGKILL in the server's time (stated: {back_within:?})",
            back_at.saturating_sub(killed_at) / 1_000
        ));
    }
    eprintln!("{}", table.join("\n"));
}
