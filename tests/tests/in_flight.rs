//! Concurrency limits (`max_in_flight`): in memory, on a real Redis server
//! and on a real three-master Redis Cluster. Never more calls running than
//! the limit (counted inside the bodies), a slot back as soon as its call
//! ends or is cancelled, a killed process's slots back after their lease
//! (and not before, while it lives and renews them), and all-or-nothing
//! with rate limits in the same call.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratewall::{Algorithm, CallSpec, GroupSpec, Limit, Limiter, Rejection};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{RedisCluster, RedisServer};

// The recorder ratewall's own integration tests read metrics with.
#[path = "../../rl-core/tests/support/ledger.rs"]
mod ledger;
use ledger::Ledger;

const CALLERS: usize = 1_000;
const MAX: u64 = 10;

/// What a crowd of callers saw.
#[derive(Debug)]
struct Crowd {
    /// The most bodies running at once, counted inside them.
    most: u64,
    admitted: u64,
    refused: u64,
    /// Of `refused`: the store did not answer in time.
    unavailable: u64,
}

/// Whether a crowd started at `started` is over: `window` has passed and
/// the slots were given back and taken again (twice the bound admitted), or
/// eight windows have passed whatever happened (a busy machine slows the
/// releases down; the figures then tell).
fn over(started: Instant, window: Duration, admitted: &AtomicU64) -> bool {
    let elapsed = started.elapsed();
    elapsed >= window && (admitted.load(Ordering::Relaxed) >= 2 * MAX || elapsed >= 8 * window)
}

/// How long caller `caller` of a crowd waits after `rejection` before it
/// asks again: 40–60 ms after a refusal, 250 ms after the store did not
/// answer in time (counted in `unavailable`), as a client backs off.
fn pause(rejection: &Rejection, caller: u64, unavailable: &AtomicU64) -> Duration {
    if rejection.is_unavailable() {
        unavailable.fetch_add(1, Ordering::Relaxed);
        Duration::from_millis(250)
    } else {
        Duration::from_millis(40 + caller * 13 % 21)
    }
}

/// A backend on `server` for a crowd: 1 000 callers on a busy machine may
/// wait longer than the default 1 s for an answer, and a release must not
/// be lost to a timeout.
async fn crowd_backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect")
}

/// `CALLERS` tasks started together on `limiter`, each calling `spec` for
/// the same identity until admitted once (pausing as [`pause`] says after a
/// refusal) or until the crowd is over (see [`over`]), and running a 200–350 ms body
/// when admitted (long enough that the slots fill even when a round trip is
/// slow on a busy machine); returns once every task ended and every slot
/// was given back. A call the store could not answer in time is refused
/// (the limiters below fail closed): it never runs without its slot.
async fn crowd(limiter: Arc<Limiter>, spec: Arc<CallSpec>, window: Duration) -> Crowd {
    let running = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let unavailable = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(CALLERS);
    for caller in 0..CALLERS {
        let (limiter, spec) = (limiter.clone(), spec.clone());
        let (running, most) = (running.clone(), most.clone());
        let (admitted, refused) = (admitted.clone(), refused.clone());
        let unavailable = unavailable.clone();
        tasks.push(tokio::spawn(async move {
            while !over(started, window, &admitted) {
                match limiter.call(&spec, &[&"tenant-1"]).await {
                    Ok(permit) => {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::Relaxed);
                        let body = 200 + (caller as u64 * 7) % 151;
                        tokio::time::sleep(Duration::from_millis(body)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                        return;
                    }
                    Err(rejection) => {
                        assert!(
                            rejection.is_in_flight() || rejection.is_unavailable(),
                            "{rejection}"
                        );
                        refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(pause(&rejection, caller as u64, &unavailable)).await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("caller");
    }
    limiter.flush_in_flight().await;
    Crowd {
        most: most.load(Ordering::SeqCst),
        admitted: admitted.load(Ordering::Relaxed),
        refused: refused.load(Ordering::Relaxed),
        unavailable: unavailable.load(Ordering::Relaxed),
    }
}

fn jobs(limits: Vec<Limit>) -> Arc<CallSpec> {
    Arc::new(CallSpec::owned(
        "jobs",
        vec![GroupSpec::owned("jobs", limits)],
    ))
}

/// The crowd's figures hold the limit and show it was reached and reused.
fn check_crowd(crowd: &Crowd) {
    eprintln!("{crowd:?}");
    // Safety, strictly: never more than the bound at once.
    assert!(crowd.most <= MAX, "{crowd:?}");
    // Liveness, with a margin a busy machine keeps: the crowd came up to
    // the bound (on Redis a slot's release travels through the keeper task,
    // so under load one or two may still be on their way back when the
    // next callers ask).
    assert!(
        crowd.most + 2 >= MAX,
        "the limit was never approached: {crowd:?}"
    );
    assert!(crowd.refused > 0, "{crowd:?}");
    // Slots were given back and taken again, several times over.
    assert!(
        crowd.admitted >= 2 * MAX,
        "{crowd:?} ({} refusals were the store not answering in time)",
        crowd.unavailable
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_never_more_than_max_in_flight_of_1000_slow_callers_run_at_once() {
    let limiter = Arc::new(Limiter::builder().memory().build().expect("limiter"));
    let crowd = crowd(
        limiter.clone(),
        jobs(vec![Limit::in_flight(MAX).unwrap()]),
        Duration::from_millis(2_500),
    )
    .await;
    check_crowd(&crowd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_never_more_than_max_in_flight_of_1000_slow_callers_run_at_once() {
    let server = RedisServer::start();
    let backend = crowd_backend(&server).await;
    let limiter = Arc::new(
        Limiter::builder()
            .backend(backend)
            .prefix("crowd")
            .failure_policy(ratewall::FailurePolicy::FailClosed)
            .build()
            .expect("limiter"),
    );
    let limit = Limit::in_flight(MAX).unwrap();
    let crowd = crowd(
        limiter.clone(),
        jobs(vec![limit]),
        Duration::from_millis(2_500),
    )
    .await;
    check_crowd(&crowd);
    let left: u64 = server
        .cmd(&["ZCARD", "crowd:{jobs:tenant-1}:if:10000000"])
        .await;
    assert_eq!(left, 0, "every slot was given back");
    assert_eq!(limiter.in_flight_leases(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_never_more_than_max_in_flight_of_1000_slow_callers_run_at_once() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::cluster_builder(cluster.urls())
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    let limiter = Arc::new(
        Limiter::builder()
            .backend(backend)
            .prefix("crowd")
            .failure_policy(ratewall::FailurePolicy::FailClosed)
            .build()
            .expect("limiter"),
    );
    // With a rate limit in the same group: one call per decision all the same.
    let limits = vec![
        Limit::per_hour(100_000).unwrap(),
        Limit::in_flight(MAX).unwrap(),
    ];
    let crowd = crowd(limiter.clone(), jobs(limits), Duration::from_millis(2_500)).await;
    check_crowd(&crowd);
    assert_eq!(limiter.in_flight_leases(), 0);
}

/// A limiter of two slots per tenant on `backend` (memory when `None`).
async fn two_slots(backend: Option<RedisBackend>) -> (Arc<Limiter>, Arc<CallSpec>) {
    let builder = Limiter::builder().prefix("drop");
    let limiter = match backend {
        Some(backend) => builder.backend(backend).build(),
        None => builder.memory().build(),
    }
    .expect("limiter");
    (Arc::new(limiter), jobs(vec![Limit::in_flight(2).unwrap()]))
}

/// Two calls hold both slots; one returns, another is cancelled while
/// running: each time the next caller is admitted.
async fn dropped_and_cancelled_calls_give_their_slot_back(
    limiter: Arc<Limiter>,
    spec: Arc<CallSpec>,
) {
    let first = limiter.call(&spec, &[&"t"]).await.expect("first");
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let running = {
        let (limiter, spec) = (limiter.clone(), spec.clone());
        tokio::spawn(async move {
            let _permit = limiter.call(&spec, &[&"t"]).await.expect("second");
            let _ = ready_tx.send(());
            std::future::pending::<()>().await;
        })
    };
    ready_rx.await.expect("second call running");
    let refused = limiter.call(&spec, &[&"t"]).await.unwrap_err();
    assert!(refused.is_in_flight(), "{refused}");
    assert_eq!(refused.limit().map(Limit::threshold), Some(2));

    // The call returns: its slot is back for the next caller.
    drop(first);
    limiter.flush_in_flight().await;
    let third = limiter
        .call(&spec, &[&"t"])
        .await
        .expect("admitted after a return");
    assert!(limiter.call(&spec, &[&"t"]).await.is_err());

    // The running call is cancelled: its slot is back too.
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    limiter.flush_in_flight().await;
    let fourth = limiter
        .call(&spec, &[&"t"])
        .await
        .expect("admitted after a cancellation");
    drop((third, fourth));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_a_dropped_or_cancelled_call_gives_its_slot_back_at_once() {
    let (limiter, spec) = two_slots(None).await;
    dropped_and_cancelled_calls_give_their_slot_back(limiter, spec).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_dropped_or_cancelled_call_gives_its_slot_back_at_once() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let (limiter, spec) = two_slots(Some(backend)).await;
    dropped_and_cancelled_calls_give_their_slot_back(limiter.clone(), spec).await;
    limiter.flush_in_flight().await;
    let left: u64 = server.cmd(&["ZCARD", "drop:{jobs:t}:if:10000000"]).await;
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_dropped_or_cancelled_call_gives_its_slot_back_at_once() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::connect_cluster(cluster.urls())
        .await
        .expect("connect");
    let (limiter, spec) = two_slots(Some(backend)).await;
    dropped_and_cancelled_calls_give_their_slot_back(limiter, spec).await;
}

/// A rate limit refusing takes no slot; a full set of slots consumes no
/// rate-limit unit. `identities` are the two groups' identities (one
/// group holds the rate limit, the other the slots; the same identity
/// puts them in one hash slot, two spread them over a cluster).
async fn rate_and_in_flight_are_all_or_nothing(limiter: &Limiter, identities: [&str; 2]) {
    let rate = Limit::per_hour(3)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .unwrap();
    let slots = Limit::in_flight(1).unwrap();
    let spec = CallSpec::owned(
        "report",
        vec![
            GroupSpec::owned("report_user", vec![rate]),
            GroupSpec::owned("report_tenant", vec![slots]),
        ],
    );
    let [user, tenant] = identities;
    let units_left = || async {
        limiter
            .requests()
            .peek_identity("report_user", &user, &[rate])
            .await
            .expect("peek")[0]
            .remaining()
    };
    let slots_left = || async {
        limiter
            .requests()
            .peek_identity("report_tenant", &tenant, &[slots])
            .await
            .expect("peek")[0]
            .remaining()
    };

    let held = limiter.call(&spec, &[&user, &tenant]).await.expect("first");
    assert_eq!((units_left().await, slots_left().await), (2, 0));
    // The slot is taken: refused, and no unit of the rate limit consumed.
    for _ in 0..3 {
        let refused = limiter.call(&spec, &[&user, &tenant]).await.unwrap_err();
        assert!(refused.is_in_flight(), "{refused}");
        assert_eq!(refused.name(), "report_tenant");
    }
    assert_eq!(units_left().await, 2);
    drop(held);
    limiter.flush_in_flight().await;
    assert_eq!(slots_left().await, 1);

    // Use up the rate limit (each call gives its slot back).
    for _ in 0..2 {
        drop(
            limiter
                .call(&spec, &[&user, &tenant])
                .await
                .expect("within the rate"),
        );
        limiter.flush_in_flight().await;
    }
    assert_eq!(units_left().await, 0);
    // The rate limit refuses: no slot is taken.
    let refused = limiter.call(&spec, &[&user, &tenant]).await.unwrap_err();
    assert!(!refused.is_in_flight());
    assert_eq!(refused.name(), "report_user");
    assert_eq!(slots_left().await, 1, "a refused call holds no slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_rate_and_in_flight_limits_are_all_or_nothing_both_ways() {
    let limiter = Limiter::builder().memory().build().expect("limiter");
    rate_and_in_flight_are_all_or_nothing(&limiter, ["u1", "u1"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_rate_and_in_flight_limits_are_all_or_nothing_both_ways() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let limiter = Limiter::builder()
        .backend(backend)
        .deny_cache(false)
        .build()
        .expect("limiter");
    rate_and_in_flight_are_all_or_nothing(&limiter, ["u1", "u1"]).await;
    rate_and_in_flight_are_all_or_nothing(&limiter, ["u2", "t2"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_rate_and_in_flight_limits_are_all_or_nothing_across_hash_tags() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::connect_cluster(cluster.urls())
        .await
        .expect("connect");
    let limiter = Limiter::builder()
        .backend(backend)
        .deny_cache(false)
        .build()
        .expect("limiter");
    // Different identities: two hash tags, reserve-then-compensate.
    rate_and_in_flight_are_all_or_nothing(&limiter, ["u3", "t3"]).await;
}

/// Reads the helper's `ready` line.
async fn wait_ready(child: &mut tokio::process::Child) -> String {
    use tokio::io::AsyncBufReadExt;
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the holder said nothing within 20 s")
        .expect("read")
        .expect("the holder exited before holding its slots");
    assert!(line.starts_with("ready"), "{line}");
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_s_slots_come_back_after_their_lease_and_not_while_it_renews_them() {
    const LEASE: Duration = Duration::from_millis(1_500);
    let server = RedisServer::start();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_in_flight_holder"))
        .args([
            &server.url(),
            "exports",
            "tenant-9",
            "3",
            &LEASE.as_millis().to_string(),
            "3",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the holder");
    let ready = wait_ready(&mut child).await;
    assert_eq!(ready.split(' ').count(), 4, "three leases: {ready}");

    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let limiter = Limiter::builder()
        .backend(backend)
        .prefix("held")
        .deny_cache(false)
        .build()
        .expect("limiter");
    let limit = Limit::in_flight_with_ttl(3, LEASE).unwrap();
    let spec = CallSpec::owned("check", vec![GroupSpec::owned("exports", vec![limit])]);
    assert!(
        limiter
            .call(&spec, &[&"tenant-9"])
            .await
            .unwrap_err()
            .is_in_flight()
    );

    // Alive for twice its lease: renewed, so the slots stay taken.
    let alive_until = Instant::now() + 2 * LEASE;
    while Instant::now() < alive_until {
        let refused = limiter.call(&spec, &[&"tenant-9"]).await.unwrap_err();
        assert!(refused.is_in_flight(), "{refused}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // SIGKILL: nothing is released; the leases run out.
    let pid = child.id().expect("pid");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let _ = child.wait().await;
    let since_kill = Instant::now();
    let back = loop {
        match limiter.call(&spec, &[&"tenant-9"]).await {
            Ok(permit) => break (since_kill.elapsed(), permit),
            Err(rejection) => assert!(rejection.is_in_flight(), "{rejection}"),
        }
        assert!(
            since_kill.elapsed() < LEASE + Duration::from_secs(2),
            "the killed process's slots were not back within the lease + 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Last renewed at most a third of the lease before the kill.
    assert!(
        back.0 >= LEASE / 2,
        "back after {:?}, before the lease could expire",
        back.0
    );
    assert!(
        back.0 <= LEASE + Duration::from_millis(500),
        "back after {:?}",
        back.0
    );
    // All three slots are back, the dead leases pruned.
    let more = [
        limiter
            .call(&spec, &[&"tenant-9"])
            .await
            .expect("second slot"),
        limiter
            .call(&spec, &[&"tenant-9"])
            .await
            .expect("third slot"),
    ];
    let members: u64 = server
        .cmd(&["ZCARD", "held:{exports:tenant-9}:if:1500000"])
        .await;
    assert_eq!(members, 3, "only the three live slots remain");
    drop((back, more));
}

static MACRO_RUNNING: AtomicU64 = AtomicU64::new(0);
static MACRO_MOST: AtomicU64 = AtomicU64::new(0);

/// The body runs while the slot is held: counted inside it.
#[ratewall::rate_limit(name = "macro_jobs", key = tenant, max_in_flight = 10, limiter = limiter)]
async fn slow_job(
    limiter: &Limiter,
    tenant: &str,
    body_ms: u64,
) -> Result<(), ratewall::Rejection> {
    let now = MACRO_RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    MACRO_MOST.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(body_ms)).await;
    MACRO_RUNNING.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_macro_on_redis_never_more_than_max_in_flight_of_1000_slow_callers_run_at_once() {
    let server = RedisServer::start();
    let backend = crowd_backend(&server).await;
    let limiter = Arc::new(
        Limiter::builder()
            .backend(backend)
            .prefix("macro")
            .failure_policy(ratewall::FailurePolicy::FailClosed)
            .build()
            .expect("limiter"),
    );
    let (started, window) = (Instant::now(), Duration::from_millis(2_500));
    let (admitted, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let unavailable = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..CALLERS as u64)
        .map(|caller| {
            let limiter = limiter.clone();
            let (admitted, refused) = (admitted.clone(), refused.clone());
            let unavailable = unavailable.clone();
            tokio::spawn(async move {
                while !over(started, window, &admitted) {
                    match slow_job(&limiter, "tenant-1", 200 + caller * 7 % 151).await {
                        Ok(()) => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        Err(rejection) => {
                            assert!(
                                rejection.is_in_flight() || rejection.is_unavailable(),
                                "{rejection}"
                            );
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(pause(&rejection, caller, &unavailable)).await;
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("caller");
    }
    limiter.flush_in_flight().await;
    let crowd = Crowd {
        most: MACRO_MOST.load(Ordering::SeqCst),
        admitted: admitted.load(Ordering::Relaxed),
        refused: refused.load(Ordering::Relaxed),
        unavailable: unavailable.load(Ordering::Relaxed),
    };
    check_crowd(&crowd);
    let left: u64 = server
        .cmd(&["ZCARD", "macro:{macro_jobs:tenant-1}:if:10000000"])
        .await;
    assert_eq!(left, 0, "every slot was given back");
}

#[test]
fn metrics_count_the_calls_in_flight_per_name_their_releases_and_leases_found_expired() {
    let ledger = Ledger::default();
    let _recorder = metrics::set_default_local_recorder(&ledger);
    let in_flight = || ledger.gauge("ratewall_in_flight", &[("limit", "m_jobs")]);
    let releases = || ledger.counter("ratewall_in_flight_releases_total", &[("limit", "m_jobs")]);
    let expired = || ledger.counter("ratewall_in_flight_expired_total", &[("limit", "m_jobs")]);
    // One thread: the keeper task records through this thread's recorder.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = RedisServer::start();
        let backend = RedisBackend::connect(server.url()).await.expect("connect");
        let limiter = Limiter::builder()
            .backend(backend)
            .prefix("m")
            .build()
            .expect("limiter");
        let limit = Limit::in_flight_with_ttl(5, Duration::from_secs(1)).unwrap();
        let spec = CallSpec::owned("metered", vec![GroupSpec::owned("m_jobs", vec![limit])]);
        let first = limiter.call(&spec, &[&"t"]).await.expect("first");
        let second = limiter.call(&spec, &[&"t"]).await.expect("second");
        assert_eq!(in_flight(), Some(2.0));
        drop(first);
        limiter.flush_in_flight().await;
        assert_eq!(in_flight(), Some(1.0));
        assert_eq!(releases(), 1);

        // The second's lease disappears (as when renewals fail for longer
        // than the lease): the next renewal finds it expired.
        let lease = format!("{:016x}", second.in_flight().expect("slots").holder());
        let removed: u64 = server
            .cmd(&["ZREM", "m:{m_jobs:t}:if:1000000", &lease])
            .await;
        assert_eq!(removed, 1);
        let deadline = Instant::now() + Duration::from_secs(3);
        while expired() == 0 {
            assert!(
                Instant::now() < deadline,
                "no renewal found the lease expired"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(expired(), 1);
        drop(second);
        limiter.flush_in_flight().await;
        assert_eq!(in_flight(), Some(0.0));
        assert_eq!(releases(), 2);
    });
}
