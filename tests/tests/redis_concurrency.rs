//! Exactness under concurrency: many app instances (one connection each)
//! racing on one key never admit more, or fewer, than the threshold.

use std::sync::Arc;
use std::time::Duration;

use ratewall::{
    Algorithm, Decision, Key, Limit,
    backend::{Backend, Request},
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{RedisCluster, RedisServer};

const INSTANCES: usize = 16;
const CALLERS: usize = 1_000;
const THRESHOLD: u64 = 100;

/// Periods long enough that no window ends during the test (the fixed window
/// additionally waits when its window is about to end).
fn limits() -> [Limit; 2] {
    [
        Limit::new(THRESHOLD, Duration::from_secs(3_600))
            .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
            .expect("limit"),
        Limit::new(THRESHOLD, Duration::from_secs(60))
            .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
            .expect("limit"),
    ]
}

/// `CALLERS` concurrent acquires spread over the backends, all on one key.
async fn race(backends: &Arc<Vec<RedisBackend>>, key: &Key, limit: &Limit) -> Vec<Decision> {
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let (backends, key, limit) = (backends.clone(), key.clone(), *limit);
        tasks.spawn(async move {
            let backend = &backends[caller % backends.len()];
            backend
                .acquire(&[Request::new(&key, &limit, 1)])
                .await
                .map(|d| d[0])
        });
    }
    let mut decisions = Vec::with_capacity(CALLERS);
    while let Some(done) = tasks.join_next().await {
        decisions.push(done.expect("caller task").expect("acquire"));
    }
    decisions
}

fn assert_exact(decisions: &[Decision], limit: &Limit) {
    let mut remaining: Vec<u64> = decisions
        .iter()
        .filter(|d| d.allowed())
        .map(|d| d.remaining())
        .collect();
    assert_eq!(
        remaining.len() as u64,
        THRESHOLD,
        "{}: admitted {} of {CALLERS}",
        limit.algorithm(),
        remaining.len()
    );
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..THRESHOLD).collect::<Vec<_>>(),
        "{}: two callers saw the same state",
        limit.algorithm()
    );
    assert!(
        decisions
            .iter()
            .filter(|d| !d.allowed())
            .all(|d| d.remaining() == 0 && d.retry_after() > Duration::ZERO)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_callers_on_sixteen_instances_admit_exactly_the_threshold() {
    let server = RedisServer::start();
    let mut backends = Vec::new();
    for _ in 0..INSTANCES {
        backends.push(RedisBackend::connect(server.url()).await.expect("connect"));
    }
    let backends = Arc::new(backends);
    for limit in limits() {
        if limit.algorithm() == Algorithm::FixedWindow {
            server.away_from_window_end(limit.period()).await;
        }
        let key = Key::new("race", limit.algorithm().name(), "hot");
        let decisions = race(&backends, &key, &limit).await;
        assert_exact(&decisions, &limit);
    }
    let clients: String = server.cmd(&["CLIENT", "LIST"]).await;
    assert!(
        clients.lines().count() > INSTANCES,
        "each instance has its own connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_callers_on_sixteen_instances_admit_exactly_the_threshold_on_a_cluster() {
    let cluster = RedisCluster::start();
    let mut backends = Vec::new();
    for _ in 0..INSTANCES {
        backends.push(
            RedisBackend::connect_cluster(cluster.urls())
                .await
                .expect("connect"),
        );
    }
    let backends = Arc::new(backends);
    for limit in limits() {
        if limit.algorithm() == Algorithm::FixedWindow {
            cluster.masters()[0]
                .away_from_window_end(limit.period())
                .await;
        }
        let key = Key::new("race", limit.algorithm().name(), "hot");
        let decisions = race(&backends, &key, &limit).await;
        assert_exact(&decisions, &limit);
    }
}
