//! Redis Sentinel: the backend finds the master through the sentinels,
//! decides there (never on a replica), and follows a fail-over with the same
//! backend, its refund notices too. Real processes: a master, a replica
//! (`--replicaof`) and a sentinel with a short `down-after-milliseconds`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratewall::{
    Key, Limit, Limiter,
    backend::{Backend, Request},
    error::BackendError,
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{PortReservation, RedisSentinel, RedisServer};

const MASTER_NAME: &str = "rl-master";
/// Short sentinel timings: the master is down after 500 ms of silence.
const DOWN_AFTER_MS: u32 = 500;
const FAILOVER_TIMEOUT_MS: u32 = 2_000;
/// The backend's per-call timeout, and the latency slack allowed on top.
const TIMEOUT: Duration = Duration::from_millis(300);
const SLACK: Duration = Duration::from_millis(250);

/// Calls of the rate limiter's code a server has answered (`FCALL`,
/// `FCALL_RO`, `EVALSHA` or `EVAL`, from `INFO commandstats`).
async fn code_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]).await;
    ["fcall", "fcall_ro", "evalsha", "eval"]
        .iter()
        .map(|name| {
            info.lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{name}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Waits until the sentinel lists `replica` as a healthy replica (it must
/// have heard from it to promote it).
async fn wait_until_sentinel_knows(sentinel: &RedisSentinel, replica: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let port = replica.port().to_string();
    loop {
        let replicas: Vec<Vec<String>> = sentinel.cmd(&["SENTINEL", "REPLICAS", MASTER_NAME]).await;
        let known = replicas.iter().any(|fields| {
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|kv| kv[0] == name)
                    .map(|kv| kv[1].as_str())
            };
            field("port") == Some(port.as_str())
                && field("flags") == Some("slave")
                && field("master-link-status") == Some("ok")
        });
        if known {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the sentinel does not know replica {port}: {replicas:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One call of the load loop run across the fail-over.
struct Attempt {
    started: Instant,
    took: Duration,
    result: Result<u64, BackendError>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_go_to_the_sentinels_master_and_follow_a_failover_with_the_same_backend() {
    let master = RedisServer::start();
    let replica = RedisServer::start_replica_of(&master);
    let sentinel = RedisSentinel::start_monitoring_with(
        MASTER_NAME,
        master.port(),
        1,
        DOWN_AFTER_MS,
        FAILOVER_TIMEOUT_MS,
    );
    wait_until_sentinel_knows(&sentinel, &replica).await;
    // The first sentinel of the list is down: another one suffices.
    let nobody = PortReservation::new();
    let sentinels = [
        format!("redis://127.0.0.1:{}/", nobody.port()),
        sentinel.url(),
    ];
    let backend = Arc::new(
        RedisBackend::sentinel_builder(sentinels, MASTER_NAME)
            .timeout(TIMEOUT)
            .connect()
            .await
            .expect("connect through the sentinels"),
    );
    assert!(backend.is_sentinel() && !backend.is_cluster());
    assert!(format!("{backend:?}").contains("sentinel"));

    let five = Limit::per_minute(5).expect("limit");
    let key = Key::new("sent", "otp", "alice");
    let call = [Request::new(&key, &five, 1)];
    for expected in [4, 3] {
        let decisions = backend.acquire(&call).await.expect("acquire on the master");
        assert!(decisions.allowed());
        assert_eq!(decisions[0].remaining(), expected);
    }
    assert!(code_calls(&master).await >= 2, "decided on the master");
    assert_eq!(code_calls(&replica).await, 0, "never on the replica");
    let synced: i64 = master.cmd(&["WAIT", "1", "2000"]).await;
    assert_eq!(
        synced, 1,
        "the replica has the state before the master dies"
    );

    // A steady loop of calls, on another identity, across the fail-over.
    let stop = Arc::new(AtomicBool::new(false));
    let looping = {
        let (backend, stop) = (backend.clone(), stop.clone());
        tokio::spawn(async move {
            let limit = Limit::per_minute(1_000).expect("limit");
            let key = Key::new("sent", "api", "loop");
            let mut attempts = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let result = backend
                    .acquire(&[Request::new(&key, &limit, 1)])
                    .await
                    .map(|d| d[0].remaining());
                attempts.push(Attempt {
                    started,
                    took: started.elapsed(),
                    result,
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            attempts
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let old_port = master.port();
    master.kill();
    let killed = Instant::now();
    let promoted_port = {
        let sentinel = &sentinel;
        tokio::task::block_in_place(|| {
            sentinel.wait_for_failover(old_port, Duration::from_secs(20))
        })
    };
    let promoted = Instant::now();
    assert_eq!(promoted_port, replica.port(), "the replica was promoted");

    // The same backend decides again, on the promoted replica.
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        match backend.acquire(&call).await {
            Ok(decisions) => break decisions,
            Err(error) => assert!(
                Instant::now() < deadline,
                "no decision within 10 s of the promotion: {error}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(after.allowed());
    assert_eq!(after[0].remaining(), 2, "the replicated state carried over");
    assert!(
        code_calls(&replica).await >= 1,
        "now decided on the new master"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let attempts = looping.await.expect("loop");

    for attempt in &attempts {
        assert!(
            attempt.took <= TIMEOUT + SLACK,
            "a call took {:?}: {:?}",
            attempt.took,
            attempt.result
        );
        if let Err(error) = &attempt.result {
            assert!(
                matches!(
                    error,
                    BackendError::Unavailable(_) | BackendError::Timeout(_)
                ),
                "unexpected error kind: {error}"
            );
        }
    }
    let failed = attempts.iter().filter(|a| a.result.is_err()).count();
    let first_ok = attempts
        .iter()
        .find(|a| a.started >= killed && a.result.is_ok())
        .map(|a| a.started + a.took)
        .expect("the loop decided again after the fail-over");
    let tail: Vec<&Attempt> = attempts.iter().filter(|a| a.started >= first_ok).collect();
    assert!(tail.len() >= 5 && tail.iter().all(|a| a.result.is_ok()));
    eprintln!(
        "sentinel fail-over: {} calls, {failed} failed; replica promoted {:?} after the kill; \
         first decision {:?} after the kill ({:?} after the sentinel named the new master)",
        attempts.len(),
        promoted - killed,
        first_ok - killed,
        first_ok.saturating_duration_since(promoted),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_fails_cleanly_without_a_sentinel_or_with_an_unknown_master_name() {
    let master = RedisServer::start();
    let sentinel = RedisSentinel::start_monitoring_with(
        MASTER_NAME,
        master.port(),
        1,
        DOWN_AFTER_MS,
        FAILOVER_TIMEOUT_MS,
    );
    let unknown = RedisBackend::sentinel_builder([sentinel.url()], "no-such-master")
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect_err("unknown master name");
    assert!(matches!(unknown, BackendError::Unavailable(_)), "{unknown}");
    assert!(unknown.to_string().contains("no-such-master"), "{unknown}");

    let nobody = PortReservation::new();
    let started = Instant::now();
    let unreachable = RedisBackend::connect_sentinel(
        [format!("redis://127.0.0.1:{}/", nobody.port())],
        MASTER_NAME,
    )
    .await
    .expect_err("no sentinel");
    assert!(
        matches!(unreachable, BackendError::Unavailable(_)),
        "{unreachable}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    // With the right name, one working sentinel is enough.
    let backend = RedisBackend::connect_sentinel([sentinel.url()], MASTER_NAME)
        .await
        .expect("connect");
    let limit = Limit::per_minute(1).expect("limit");
    let key = Key::new("sent", "otp", "bob");
    let call = [Request::new(&key, &limit, 1)];
    assert!(backend.acquire(&call).await.expect("first").allowed());
    assert!(!backend.acquire(&call).await.expect("second").allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_over_with_the_old_master_alive_is_followed_and_never_decided_on_the_demoted_node()
{
    let master = RedisServer::start();
    let replica = RedisServer::start_replica_of(&master);
    let sentinel = RedisSentinel::start_monitoring_with(
        MASTER_NAME,
        master.port(),
        1,
        DOWN_AFTER_MS,
        FAILOVER_TIMEOUT_MS,
    );
    wait_until_sentinel_knows(&sentinel, &replica).await;
    let backend = RedisBackend::sentinel_builder([sentinel.url()], MASTER_NAME)
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect");
    let ten = Limit::per_minute(10).expect("limit");
    let key = Key::new("sent", "otp", "carol");
    let call = [Request::new(&key, &ten, 1)];
    assert_eq!(
        backend.acquire(&call).await.expect("first")[0].remaining(),
        9
    );
    let synced: i64 = master.cmd(&["WAIT", "1", "2000"]).await;
    assert_eq!(synced, 1);

    let ok: String = sentinel.cmd(&["SENTINEL", "FAILOVER", MASTER_NAME]).await;
    assert_eq!(ok, "OK");
    let started = Instant::now();
    let old_port = master.port();
    let new_port = tokio::task::block_in_place(|| {
        sentinel.wait_for_failover(old_port, Duration::from_secs(20))
    });
    assert_eq!(new_port, replica.port());
    let named = Instant::now();

    // Keep deciding until a decision lands on the promoted node. The old
    // master still accepts writes until the sentinel demotes it; what is
    // decided there in between is lost (the new master does not replicate
    // from it), which is why the backend listens for the announcement.
    let mut lost = 0;
    let mut failures = 0;
    let first = loop {
        let (new_before, old_before) = (code_calls(&replica).await, code_calls(&master).await);
        match backend.acquire(&call).await {
            Ok(decisions) if code_calls(&replica).await > new_before => break decisions,
            Ok(_) => {
                assert!(code_calls(&master).await > old_before);
                lost += 1;
            }
            Err(_) => failures += 1,
        }
        assert!(
            named.elapsed() < Duration::from_secs(2),
            "still not deciding on the new master 2 s after the sentinel named it"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let switched = named.elapsed();
    assert_eq!(
        first[0].remaining(),
        8,
        "decided on the promoted node's state, as of the promotion"
    );
    let on_old_master = code_calls(&master).await;
    for expected in [7, 6, 5] {
        assert_eq!(
            backend.acquire(&call).await.expect("acquire")[0].remaining(),
            expected
        );
    }
    assert_eq!(
        code_calls(&master).await,
        on_old_master,
        "nothing more decided on the demoted node"
    );
    eprintln!(
        "sentinel switch-over (old master alive): the sentinel named the new master {:?} after \
         SENTINEL FAILOVER; decisions moved {switched:?} later ({lost} decided on the old \
         master in between, {failures} failed)",
        named - started
    );
}

/// Limiters subscribed to refund notices on a server: how many.
async fn notice_subscribers(server: &RedisServer) -> i64 {
    let counts: Vec<redis::Value> = server.cmd(&["PUBSUB", "NUMSUB", "sent:{refunds}"]).await;
    match counts.get(1) {
        Some(redis::Value::Int(n)) => *n,
        _ => 0,
    }
}

/// Waits until `count` limiters are subscribed on `server`.
async fn until_subscribed_on(server: &RedisServer, count: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while notice_subscribers(server).await != count {
        assert!(
            Instant::now() < deadline,
            "{} limiters subscribed on port {}, not {count}",
            notice_subscribers(server).await,
            server.port()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A refund by `a` is usable by `b` (which remembers the refusal) within
/// 100 ms.
async fn refund_usable_by_the_other(a: &Limiter, b: &Limiter, identity: &str) {
    let limit = Limit::per_hour(1).expect("limit");
    let key = a.key("otp", &identity);
    let call = [Request::new(&key, &limit, 1)];
    let taken = a.requests().acquire_all(&call).await.expect("decided");
    assert!(taken.allowed());
    for _ in 0..2 {
        assert!(b.requests().check("otp", &call, None).await.is_err());
    }
    let at = taken.iter().next().expect("one decision").at_micros();
    a.requests().refund_all(&call, at).await.expect("refund");
    let start = Instant::now();
    while b.requests().check("otp", &call, None).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(5), "never admitted");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let delay = start.elapsed();
    assert!(
        delay <= Duration::from_millis(100),
        "{identity}: the refund was usable after {delay:?}"
    );
}

/// Refund notices are heard on the master the sentinels name, and follow
/// a switch-over to the promoted replica without a call to move them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_notices_are_heard_on_the_sentinels_master_and_follow_a_switch_over() {
    let master = RedisServer::start();
    let replica = RedisServer::start_replica_of(&master);
    let sentinel = RedisSentinel::start_monitoring_with(
        MASTER_NAME,
        master.port(),
        1,
        DOWN_AFTER_MS,
        FAILOVER_TIMEOUT_MS,
    );
    wait_until_sentinel_knows(&sentinel, &replica).await;
    let limiter = || async {
        let backend = RedisBackend::sentinel_builder([sentinel.url()], MASTER_NAME)
            .timeout(TIMEOUT)
            .connect()
            .await
            .expect("connect");
        Limiter::builder()
            .backend(backend)
            .prefix("sent")
            .build()
            .expect("limiter")
    };
    let (a, b) = (limiter().await, limiter().await);
    until_subscribed_on(&master, 2).await;
    refund_usable_by_the_other(&a, &b, "before").await;

    let ok: String = sentinel.cmd(&["SENTINEL", "FAILOVER", MASTER_NAME]).await;
    assert_eq!(ok, "OK");
    let new_port = tokio::task::block_in_place(|| {
        sentinel.wait_for_failover(master.port(), Duration::from_secs(20))
    });
    assert_eq!(new_port, replica.port());
    // Both subscriptions move to the promoted node (checked each second).
    until_subscribed_on(&replica, 2).await;
    // Decisions follow too (the first calls may still meet the old master).
    let deadline = Instant::now() + Duration::from_secs(10);
    while code_calls(&replica).await == 0 {
        let key = a.key("warm", &"up");
        let _ = a
            .requests()
            .acquire_all(&[Request::new(&key, &Limit::per_hour(100).expect("limit"), 1)])
            .await;
        let _ = b
            .requests()
            .acquire_all(&[Request::new(&key, &Limit::per_hour(100).expect("limit"), 1)])
            .await;
        assert!(Instant::now() < deadline, "no decision on the new master");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    refund_usable_by_the_other(&a, &b, "after").await;
}
