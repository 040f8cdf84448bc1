//! Failure policies against real Redis faults.
//!
//! For each fault — the server (a) killed, (b) frozen with SIGSTOP, (c)
//! restarted with an empty dataset, and (d) a cluster master killed and its
//! replica promoted — three limiters (fail-open, fail-closed and local with
//! `share = 2`), each with its own backend and circuit breaker, call
//! `Limiter::check` every 20 ms while the fault comes and goes. Every call is
//! checked against its policy and for latency, and the same limiters must
//! decide in Redis again after recovery. Each test prints a table (policy,
//! fault, calls, errors/fallbacks, max latency, time to recover).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ratewall::{
    Algorithm, FailurePolicy, Key, Limit, Limiter, Rejection, backend::Request,
    builder::BreakerConfig, call::Admission,
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{RedisCluster, RedisServer};
use tokio::time::MissedTickBehavior;

/// The backends' per-call timeout.
const TIMEOUT: Duration = Duration::from_millis(200);
/// Latency allowed beyond the timeout (scheduling on a loaded 2-core box).
const SLACK: Duration = Duration::from_millis(250);
/// Time between two calls of one loop.
const TICK: Duration = Duration::from_millis(20);
/// The limit: sliding log (exact, so the local fallback's count is exact
/// too), `THRESHOLD` per minute: the local fallback's `THRESHOLD / SHARE`
/// is reached within an outage; Redis may refuse late in long runs.
const THRESHOLD: u64 = 60;
/// `FailurePolicy::Local { share }`: the fallback allows `THRESHOLD / SHARE`.
const SHARE: u64 = 2;
/// Circuit breaker of every limiter.
const BREAKER_FAILURES: u32 = 3;
const BREAKER_OPEN: Duration = Duration::from_millis(300);
/// Calls before the fault, and how long a fault lasts.
const BEFORE: Duration = Duration::from_millis(500);
const OUTAGE: Duration = Duration::from_millis(1_500);
/// No loop runs longer than this, whatever happens.
const MAX_RUN: Duration = Duration::from_secs(40);
/// The limit name given to `Limiter::check`.
const NAME: &str = "policies";

fn policies() -> [(&'static str, FailurePolicy); 3] {
    [
        ("fail-open", FailurePolicy::FailOpen),
        ("fail-closed", FailurePolicy::FailClosed),
        ("local{share:2}", FailurePolicy::local(SHARE).unwrap()),
    ]
}

fn limit() -> Limit {
    Limit::new(THRESHOLD, Duration::from_secs(60))
        .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
        .expect("valid limit")
}

/// What one `check` ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Redis decided (allowed or refused by the full limit).
    Redis { allowed: bool, remaining: u64 },
    /// The backend failed and the call was let through.
    FailedOpen,
    /// The backend failed and the call was refused as unavailable.
    Unavailable,
    /// The backend failed and the local limiter (threshold / share) decided.
    Local { allowed: bool },
}

impl Outcome {
    fn is_redis(self) -> bool {
        matches!(self, Outcome::Redis { .. })
    }

    fn from_check(result: Result<Admission, Rejection>) -> Self {
        let local = THRESHOLD / SHARE;
        match result {
            Ok(Admission::Backend(decisions)) => Outcome::Redis {
                allowed: true,
                remaining: decisions[0].remaining(),
            },
            Ok(Admission::FailedOpen) => Outcome::FailedOpen,
            Ok(Admission::Local { decisions, share }) => {
                assert_eq!(share.get(), SHARE);
                assert_eq!(
                    decisions[0].limit(),
                    local,
                    "the local limit is threshold / share"
                );
                Outcome::Local { allowed: true }
            }
            Ok(other) => panic!("unexpected admission {other:?}"),
            Err(rejection) if rejection.is_unavailable() => Outcome::Unavailable,
            Err(rejection) => {
                let threshold = rejection.limit().expect("a limited rejection").threshold();
                let decision = rejection.decision().expect("a limited rejection");
                assert!(decision.retry_after() > Duration::ZERO, "{rejection}");
                match threshold {
                    THRESHOLD => Outcome::Redis {
                        allowed: false,
                        remaining: decision.remaining(),
                    },
                    t if t == local => Outcome::Local { allowed: false },
                    other => panic!("refused by a limit of {other}: {rejection}"),
                }
            }
        }
    }

    /// Whether `policy` may produce this outcome at all.
    fn honours(self, policy: FailurePolicy) -> bool {
        match self {
            Outcome::Redis { .. } => true,
            Outcome::FailedOpen => policy == FailurePolicy::FailOpen,
            Outcome::Unavailable => policy == FailurePolicy::FailClosed,
            Outcome::Local { .. } => matches!(policy, FailurePolicy::Local { .. }),
        }
    }
}

/// One call: when it started (since the run began), how long it took.
#[derive(Debug, Clone, Copy)]
struct Call {
    started: Duration,
    took: Duration,
    outcome: Outcome,
}

impl Call {
    fn ended(&self) -> Duration {
        self.started + self.took
    }
}

/// One loop per policy, each with its own limiter, backend and key.
struct Loops {
    run: Instant,
    stop: Arc<AtomicBool>,
    logs: Vec<Arc<Mutex<Vec<Call>>>>,
    tasks: tokio::task::JoinSet<()>,
}

impl Loops {
    fn start(limiters: Vec<Limiter>, keys: Vec<Key>) -> Self {
        let run = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut logs = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        for (limiter, key) in limiters.into_iter().zip(keys) {
            let log = Arc::new(Mutex::new(Vec::new()));
            logs.push(log.clone());
            let stop = stop.clone();
            tasks.spawn(async move {
                let limit = limit();
                let mut ticks = tokio::time::interval(TICK);
                ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
                while !stop.load(Ordering::Relaxed) && run.elapsed() < MAX_RUN {
                    ticks.tick().await;
                    let requests = [Request::new(&key, &limit, 1)];
                    let started = run.elapsed();
                    let clock = Instant::now();
                    let result = limiter.requests().check(NAME, &requests, None).await;
                    let took = clock.elapsed();
                    let outcome = Outcome::from_check(result);
                    log.lock().expect("log").push(Call {
                        started,
                        took,
                        outcome,
                    });
                }
            });
        }
        Self {
            run,
            stop,
            logs,
            tasks,
        }
    }

    fn now(&self) -> Duration {
        self.run.elapsed()
    }

    /// Waits until every loop has had a call decided by Redis that ended
    /// after `lifted`.
    async fn wait_recovered(&self, lifted: Duration, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let recovered = self.logs.iter().all(|log| {
                log.lock()
                    .expect("log")
                    .iter()
                    .any(|c| c.outcome.is_redis() && c.ended() > lifted)
            });
            if recovered {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the limiters did not decide in Redis again within {within:?} of the recovery"
            );
            tokio::time::sleep(TICK).await;
        }
    }

    async fn finish(mut self) -> Vec<Vec<Call>> {
        self.stop.store(true, Ordering::Relaxed);
        while let Some(done) = self.tasks.join_next().await {
            done.expect("a loop panicked");
        }
        self.logs
            .iter()
            .map(|log| log.lock().expect("log").clone())
            .collect()
    }
}

/// When the fault was in effect, as seen by the test.
struct Timeline {
    /// When the fault was injected: every call that ended before was
    /// allowed by Redis.
    injected: Duration,
    /// Calls wholly inside this window must not reach Redis (`None` when the
    /// fault is too short to say).
    outage: Option<(Duration, Duration)>,
    /// When the fault was lifted (server back, resumed, fail-over done).
    lifted: Duration,
    /// Every call started this long after `lifted` must reach Redis.
    settle: Duration,
    /// The server came back empty: the first Redis decision after `lifted`
    /// is on fresh state.
    fresh: bool,
}

/// One row of the printed table.
struct Row {
    policy: &'static str,
    fault: &'static str,
    calls: usize,
    redis: usize,
    redis_refused: usize,
    fallbacks: String,
    max_latency: Duration,
    recover: Duration,
    client_outage: Duration,
}

fn verify(
    fault: &'static str,
    (policy_name, policy): (&'static str, FailurePolicy),
    timeline: &Timeline,
    calls: &[Call],
) -> Row {
    let what = format!("{policy_name} / {fault}");
    assert!(calls.len() > 50, "{what}: only {} calls", calls.len());
    for call in calls {
        assert!(
            call.took <= TIMEOUT + SLACK,
            "{what}: a call took {:?} (timeout {TIMEOUT:?}): {call:?}",
            call.took
        );
        assert!(
            call.outcome.honours(policy),
            "{what}: {:?} breaks the policy",
            call.outcome
        );
    }
    let before: Vec<&Call> = calls
        .iter()
        .filter(|c| c.ended() < timeline.injected)
        .collect();
    assert!(before.len() >= 10, "{what}: {} calls before", before.len());
    assert!(
        before
            .iter()
            .all(|c| matches!(c.outcome, Outcome::Redis { allowed: true, .. })),
        "{what}: a call failed before the fault: {:?}",
        before.iter().find(|c| !c.outcome.is_redis())
    );
    if let Some((from, to)) = timeline.outage {
        let inside: Vec<&Call> = calls
            .iter()
            .filter(|c| c.started >= from && c.ended() <= to)
            .collect();
        assert!(
            inside.len() >= 5,
            "{what}: {} calls during the outage",
            inside.len()
        );
        assert!(
            inside.iter().all(|c| !c.outcome.is_redis()),
            "{what}: Redis answered during the outage"
        );
    }
    let local_allowed = calls
        .iter()
        .filter(|c| c.outcome == Outcome::Local { allowed: true })
        .count() as u64;
    let local_refused = calls
        .iter()
        .filter(|c| c.outcome == Outcome::Local { allowed: false })
        .count() as u64;
    if let FailurePolicy::Local { share } = policy {
        let local = THRESHOLD / share.get();
        assert!(
            local_allowed <= local,
            "{what}: local admitted {local_allowed}"
        );
        if local_allowed + local_refused > local {
            assert_eq!(
                local_allowed, local,
                "{what}: the fallback admits exactly threshold / share"
            );
        }
        if timeline.outage.is_some() {
            assert!(local_allowed > 0, "{what}: the fallback never decided");
        }
    }
    // Recovery: the same limiter decides in Redis again.
    let first = calls
        .iter()
        .find(|c| c.outcome.is_redis() && c.ended() > timeline.lifted)
        .unwrap_or_else(|| panic!("{what}: no Redis decision after the recovery"));
    let recover = first.ended() - timeline.lifted;
    let settled: Vec<&Call> = calls
        .iter()
        .filter(|c| c.started >= timeline.lifted + timeline.settle)
        .collect();
    assert!(
        settled.len() >= 10,
        "{what}: {} calls after recovery",
        settled.len()
    );
    assert!(
        settled.iter().all(|c| c.outcome.is_redis()),
        "{what}: calls still fail {:?} after the recovery: {:?}",
        timeline.settle,
        settled.iter().find(|c| !c.outcome.is_redis())
    );
    if timeline.fresh {
        // Calls decided together right after the restart end in any order:
        // the first of them *decided* saw the empty dataset. A limiter
        // reconnects at its first call once the server is up, which can be
        // before the harness returns from the restart (`lifted`): every
        // call that ended after the restart began counts (those the old
        // server decided had used more of the limit).
        let freshest = calls
            .iter()
            .filter(|c| c.ended() > timeline.injected)
            .filter_map(|c| match c.outcome {
                Outcome::Redis {
                    allowed: true,
                    remaining,
                } => Some(remaining),
                _ => None,
            })
            .max();
        assert_eq!(
            freshest,
            Some(THRESHOLD - 1),
            "{what}: the restarted server starts from an empty dataset"
        );
    }
    let failed_from = calls.iter().find(|c| !c.outcome.is_redis());
    let client_outage = failed_from.map_or(Duration::ZERO, |f| first.ended() - f.started);
    let count = |o: Outcome| calls.iter().filter(|c| c.outcome == o).count();
    let fallbacks = match policy {
        FailurePolicy::FailOpen => format!("{} failed-open", count(Outcome::FailedOpen)),
        FailurePolicy::FailClosed => format!("{} unavailable", count(Outcome::Unavailable)),
        _ => format!("{local_allowed} local ok + {local_refused} local refused"),
    };
    Row {
        policy: policy_name,
        fault,
        calls: calls.len(),
        redis: calls.iter().filter(|c| c.outcome.is_redis()).count(),
        redis_refused: calls
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Redis { allowed: false, .. }))
            .count(),
        fallbacks,
        max_latency: calls.iter().map(|c| c.took).max().unwrap_or_default(),
        recover,
        client_outage,
    }
}

fn print_table(rows: &[Row]) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| policy | fault | calls | decided in Redis (of which refused) | errors / fallbacks | max latency | recover after fault lifted | client-side outage |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} ({}) | {} | {} ms | {} ms | {} ms |",
            r.policy,
            r.fault,
            r.calls,
            r.redis,
            r.redis_refused,
            r.fallbacks,
            r.max_latency.as_millis(),
            r.recover.as_millis(),
            r.client_outage.as_millis()
        );
    }
    eprintln!("{out}");
}

async fn limiters(connect: impl AsyncFn() -> RedisBackend) -> Vec<Limiter> {
    let mut limiters = Vec::new();
    for (_, policy) in policies() {
        let limiter = Limiter::builder()
            .backend(connect().await)
            .failure_policy(policy)
            .circuit_breaker(BreakerConfig::new(BREAKER_FAILURES, BREAKER_OPEN))
            .prefix("pol")
            .build()
            .expect("limiter");
        limiters.push(limiter);
    }
    limiters
}

fn keys(fault: &str) -> Vec<Key> {
    policies()
        .iter()
        .map(|(name, _)| Key::new("pol", fault, name))
        .collect()
}

async fn standalone_limiters(server: &RedisServer) -> Vec<Limiter> {
    let url = server.url();
    limiters(async || {
        RedisBackend::builder(url.clone())
            .timeout(TIMEOUT)
            .connect()
            .await
            .expect("connect")
    })
    .await
}

fn report(fault: &'static str, timeline: &Timeline, logs: &[Vec<Call>]) {
    let rows: Vec<Row> = policies()
        .into_iter()
        .zip(logs)
        .map(|(policy, calls)| verify(fault, policy, timeline, calls))
        .collect();
    print_table(&rows);
}

/// Standalone recovery bound: breaker open time, one timed-out probe, the
/// connection manager's longest reconnect delay, and slack.
const STANDALONE_SETTLE: Duration = Duration::from_millis(1_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_are_honoured_while_redis_is_killed_and_the_same_limiters_recover() {
    let server = Arc::new(RedisServer::start());
    let loops = Loops::start(standalone_limiters(&server).await, keys("kill"));
    tokio::time::sleep(BEFORE).await;
    let injected = loops.now();
    server.kill();
    let down = loops.now();
    tokio::time::sleep(OUTAGE).await;
    let restarting = loops.now();
    let back = server.clone();
    tokio::task::spawn_blocking(move || back.restart())
        .await
        .expect("restart");
    let lifted = loops.now();
    loops.wait_recovered(lifted, Duration::from_secs(10)).await;
    tokio::time::sleep(STANDALONE_SETTLE + Duration::from_millis(400)).await;
    let logs = loops.finish().await;
    let timeline = Timeline {
        injected,
        outage: Some((down, restarting)),
        lifted,
        settle: STANDALONE_SETTLE,
        fresh: true,
    };
    report("killed (SIGKILL), restarted 1.5 s later", &timeline, &logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_are_honoured_while_redis_is_frozen_and_calls_never_hang() {
    let server = RedisServer::start();
    let loops = Loops::start(standalone_limiters(&server).await, keys("pause"));
    tokio::time::sleep(BEFORE).await;
    let injected = loops.now();
    server.pause();
    let frozen = loops.now();
    tokio::time::sleep(OUTAGE).await;
    let resuming = loops.now();
    server.resume();
    let lifted = loops.now();
    loops.wait_recovered(lifted, Duration::from_secs(10)).await;
    tokio::time::sleep(STANDALONE_SETTLE + Duration::from_millis(400)).await;
    let logs = loops.finish().await;
    let timeline = Timeline {
        injected,
        // A call sent just before SIGSTOP may still be answered.
        outage: Some((frozen + TIMEOUT, resuming)),
        lifted,
        settle: STANDALONE_SETTLE,
        fresh: false,
    };
    report("paused (SIGSTOP 1.5 s)", &timeline, &logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_are_honoured_across_a_restart_with_an_empty_dataset() {
    let server = Arc::new(RedisServer::start());
    let loops = Loops::start(standalone_limiters(&server).await, keys("restart"));
    tokio::time::sleep(BEFORE).await;
    let injected = loops.now();
    let back = server.clone();
    tokio::task::spawn_blocking(move || back.restart())
        .await
        .expect("restart");
    let lifted = loops.now();
    loops.wait_recovered(lifted, Duration::from_secs(10)).await;
    tokio::time::sleep(STANDALONE_SETTLE + Duration::from_millis(400)).await;
    let logs = loops.finish().await;
    let timeline = Timeline {
        injected,
        outage: None,
        lifted,
        settle: STANDALONE_SETTLE,
        fresh: true,
    };
    report("restarted (empty dataset, script cache)", &timeline, &logs);
}

/// Keys whose slot master 0 of the harness cluster serves (0..=5460).
async fn keys_on_first_master(cluster: &RedisCluster) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut n = 0u32;
    for (name, _) in policies() {
        loop {
            let key = Key::new("pol", "cluster", &format!("{name}-{n}"));
            n += 1;
            let slot: u16 = cluster.masters()[1]
                .cmd(&["CLUSTER", "KEYSLOT", key.as_str()])
                .await;
            if slot <= 5460 {
                keys.push(key);
                break;
            }
        }
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_are_honoured_through_a_cluster_failover_and_the_same_limiters_follow_it() {
    let cluster = Arc::new(RedisCluster::start_with_replicas(1));
    let keys = keys_on_first_master(&cluster).await;
    let urls = cluster.urls();
    let limiters = limiters(async || {
        RedisBackend::cluster_builder(urls.clone())
            .timeout(TIMEOUT)
            .connect()
            .await
            .expect("connect")
    })
    .await;
    let loops = Loops::start(limiters, keys);
    tokio::time::sleep(BEFORE).await;
    let injected = loops.now();
    cluster.kill_master(0);
    let down = loops.now();
    let waiting = cluster.clone();
    let promoted = tokio::task::spawn_blocking(move || {
        waiting.wait_for_failover(0, Duration::from_secs(20)).port()
    })
    .await
    .expect("failover");
    let lifted = loops.now();
    loops.wait_recovered(lifted, Duration::from_secs(10)).await;
    let settle = Duration::from_millis(3_000);
    tokio::time::sleep(settle + Duration::from_millis(400)).await;
    let logs = loops.finish().await;
    eprintln!(
        "master 0 killed at {down:?}; replica on port {promoted} promoted, cluster ok at {lifted:?} \
         (fail-over took {:?})",
        lifted - down
    );
    let timeline = Timeline {
        injected,
        // Until the cluster notices (node timeout 2 s), and after.
        outage: Some((
            down + Duration::from_millis(100),
            lifted.min(down + Duration::from_secs(2)),
        )),
        lifted,
        settle,
        fresh: false,
    };
    report("cluster master killed, replica promoted", &timeline, &logs);
}
