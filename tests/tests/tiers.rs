//! Tiers (per-identity limits) through `#[rate_limit(tier = .., tiers(..))]`
//! and `Keys::tiers`, on both backends: the in-memory store and a
//! `redis-server` started by the harness (and a Redis Cluster for the
//! concurrency test). Every behaviour test runs once per backend.

use std::sync::Arc;
use std::time::Duration;

use ratewall::{
    CallSpec, FailurePolicy, GroupSpec, Limiter, Rejection, call::Tier, config::LimitsFile,
    rate_limit,
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{RedisCluster, RedisServer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Memory,
    Redis,
}

const BACKENDS: [Backend; 2] = [Backend::Memory, Backend::Redis];

/// A limiter on `backend` failing closed (and the Redis server it uses).
async fn limiter(backend: Backend) -> (Arc<Limiter>, Option<RedisServer>) {
    let builder = Limiter::builder()
        .prefix("tiers")
        .failure_policy(FailurePolicy::FailClosed);
    match backend {
        Backend::Memory => (Arc::new(builder.memory().build().unwrap()), None),
        Backend::Redis => {
            let server = RedisServer::start();
            let redis = RedisBackend::connect(server.url()).await.expect("connect");
            (
                Arc::new(builder.backend(redis).build().unwrap()),
                Some(server),
            )
        }
    }
}

#[rate_limit(
    name = "api",
    key = user,
    tier = plan,
    tiers(free = ["2/1m"], pro = ["5/1m", "20/1s"]),
    algorithm = sliding_log,
    limiter = limiter,
)]
async fn api(limiter: &Limiter, user: &str, plan: &str) -> Result<(), Rejection> {
    Ok(())
}

/// How many of `n` calls of `user` in `plan` are admitted.
async fn admitted(limiter: &Limiter, user: &str, plan: &str, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += usize::from(api(limiter, user, plan).await.is_ok());
    }
    admitted
}

#[tokio::test]
async fn switching_an_identitys_tier_takes_effect_on_its_next_call() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        assert_eq!(
            admitted(&limiter, "alice", "free", 3).await,
            2,
            "{backend:?}"
        );
        // Upgraded: the very next call is decided by `pro`.
        assert!(api(&limiter, "alice", "pro").await.is_ok(), "{backend:?}");
        assert_eq!(
            admitted(&limiter, "alice", "pro", 10).await,
            4,
            "{backend:?}"
        );
        // Downgraded: the next call is decided by `free` again.
        let refused = api(&limiter, "alice", "free").await.unwrap_err();
        assert_eq!(refused.name(), "api@free", "{backend:?}");
        assert_eq!(refused.limit().unwrap().threshold(), 2, "{backend:?}");
    }
}

#[tokio::test]
async fn the_tiers_states_are_independent() {
    for backend in BACKENDS {
        let (limiter, redis) = limiter(backend).await;
        // Exhausting free takes nothing from pro...
        assert_eq!(admitted(&limiter, "bob", "free", 4).await, 2, "{backend:?}");
        assert_eq!(admitted(&limiter, "bob", "pro", 10).await, 5, "{backend:?}");
        // ...and exhausting pro takes nothing from free.
        assert_eq!(
            admitted(&limiter, "carol", "pro", 10).await,
            5,
            "{backend:?}"
        );
        assert_eq!(
            admitted(&limiter, "carol", "free", 4).await,
            2,
            "{backend:?}"
        );
        if let Some(redis) = redis {
            // Each tier's own keys, in its own hash tag.
            let mut keys: Vec<String> = redis.cmd(&["KEYS", "tiers:{api@*:bob}*"]).await;
            keys.sort();
            assert_eq!(keys.len(), 3, "{keys:?}");
            assert!(keys[0].starts_with("tiers:{api@free:bob}"), "{keys:?}");
            assert!(
                keys[1..]
                    .iter()
                    .all(|k| k.starts_with("tiers:{api@pro:bob}"))
            );
            // A hostile identity stays inside its tier's hash tag, escaped
            // (the key's only braces: its slot is the tag's).
            assert!(api(&limiter, "a}{b:c", "pro").await.is_ok());
            let key = "tiers:{api@pro:a%7D%7Bb%3Ac}:sl:60000000";
            assert_eq!(redis.cmd::<i64>(&["EXISTS", key]).await, 1);
        }
    }
}

#[tokio::test]
async fn a_tier_configured_at_run_time_applies_on_the_next_call() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        // Not declared, not configured: refused (fail closed), naming the tier.
        let unknown = api(&limiter, "dave", "gold").await.unwrap_err();
        assert!(unknown.is_unavailable(), "{backend:?}");
        assert!(
            unknown
                .to_string()
                .contains("tier \"gold\" of `api` is unknown"),
            "{unknown}"
        );
        limiter
            .settings()
            .set_limits("api@gold", vec!["3/1m".parse().unwrap()])
            .unwrap();
        assert_eq!(
            admitted(&limiter, "dave", "gold", 5).await,
            3,
            "{backend:?}"
        );
        // A declared tier changed at run time, through a limits file.
        let file = LimitsFile::parse(
            r#"
            [limits."api@free"]
            rates = ["4/1m"]
            algorithm = "sliding_log"
            "#,
        )
        .unwrap();
        assert_eq!(
            admitted(&limiter, "dave", "free", 1).await,
            1,
            "{backend:?}"
        );
        file.apply(&limiter).unwrap();
        assert_eq!(
            admitted(&limiter, "dave", "free", 5).await,
            3,
            "{backend:?}"
        );
    }
}

#[rate_limit(
    name = "send_user",
    key = user,
    tier = plan,
    tiers(free = ["1/1m"], pro = ["10/1m"], default = ["1/1h"]),
    also(name = "send_ip", key = ip, limits = ["3/1m"]),
    also(name = "send_team", key = team, tier = "shared", tiers(shared = ["100/1m"])),
    algorithm = sliding_log,
    limiter = limiter,
)]
async fn send(
    limiter: &Limiter,
    ip: &str,
    user: &str,
    plan: &str,
    team: &str,
) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn tiered_and_plain_groups_are_decided_together_and_unknown_tiers_take_the_default() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let call = |plan: &'static str| send(&limiter, "10.0.0.1", "erin", plan, "acme");
        assert!(call("free").await.is_ok(), "{backend:?}");
        // Refused by free: the IP and team limits keep their units.
        assert_eq!(call("free").await.unwrap_err().name(), "send_user@free");
        assert!(call("pro").await.is_ok(), "{backend:?}");
        assert!(call("pro").await.is_ok(), "{backend:?}");
        assert_eq!(call("pro").await.unwrap_err().name(), "send_ip");
        // An unknown plan is decided by the default tier, on its own state.
        let other = |plan: &'static str| send(&limiter, "10.0.0.2", "frank", plan, "acme");
        assert!(other("platinum").await.is_ok(), "{backend:?}");
        assert_eq!(
            other("bronze").await.unwrap_err().name(),
            "send_user@default"
        );
    }
}

/// Concurrent callers, two tiers of one identity at once.
const CALLERS: usize = 1_000;
const THRESHOLD: u64 = 100;

static TIERS: std::sync::LazyLock<CallSpec> = std::sync::LazyLock::new(|| {
    CallSpec::owned(
        "race",
        vec![GroupSpec::owned_tiered(
            "race",
            vec![
                Tier::owned("free", vec![format!("{THRESHOLD}/1h").parse().unwrap()]),
                Tier::owned(
                    "pro",
                    vec![
                        format!("{THRESHOLD}/1m")
                            .parse::<ratewall::Limit>()
                            .and_then(|l| l.with_algorithm(ratewall::Algorithm::SlidingLog))
                            .unwrap(),
                    ],
                ),
            ],
        )],
    )
    .with_policy(FailurePolicy::FailClosed)
});

/// `CALLERS` concurrent calls in each of two tiers of one identity, spread
/// over `limiters` (instances, one connection each): exactly `THRESHOLD`
/// admitted per tier.
async fn race(limiters: Vec<Arc<Limiter>>) {
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..2 * CALLERS {
        let limiter = limiters[caller % limiters.len()].clone();
        let tier = if caller % 2 == 0 { "free" } else { "pro" };
        tasks.spawn(async move {
            let admitted = limiter
                .call_with(&TIERS, ratewall::Keys::new(&[&"hot"]).tiers(&[tier]))
                .await
                .map_err(|r| assert!(r.limit().is_some(), "refused by a limit: {r}"))
                .is_ok();
            (tier, admitted)
        });
    }
    let (mut free, mut pro) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        match done.expect("caller task") {
            ("free", true) => free += 1,
            ("pro", true) => pro += 1,
            _ => {}
        }
    }
    assert_eq!((free, pro), (THRESHOLD, THRESHOLD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_callers_per_tier_admit_exactly_its_threshold_on_redis() {
    let server = RedisServer::start();
    let mut limiters = Vec::new();
    for _ in 0..8 {
        // Exactness is the point, not latency: 2 000 calls queued on a busy
        // machine may take longer than the default 1 s timeout.
        let redis = RedisBackend::builder(server.url())
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect");
        limiters.push(Arc::new(
            Limiter::builder()
                .prefix("race")
                .backend(redis)
                .build()
                .unwrap(),
        ));
    }
    race(limiters).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_callers_per_tier_admit_exactly_its_threshold_on_a_cluster() {
    let cluster = RedisCluster::start();
    let mut limiters = Vec::new();
    for _ in 0..4 {
        let redis = RedisBackend::cluster_builder(cluster.urls())
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect");
        limiters.push(Arc::new(
            Limiter::builder()
                .prefix("race")
                .backend(redis)
                .build()
                .unwrap(),
        ));
    }
    race(limiters).await;
}

// ---- tiers combined with the other call shapes ----

#[rate_limit(
    name = "reports",
    key = tenant,
    tier = plan,
    tiers(free = ["4/1s"], pro = ["100/1s"]),
    algorithm = leaky_bucket,
    burst = 1,
    wait = "3s",
    limiter = limiter,
)]
async fn report(limiter: &Limiter, tenant: u64, plan: &str) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiered_call_waits_for_room_on_its_own_tiers_limits() {
    for backend in BACKENDS {
        let (limiter, _server) = limiter(backend).await;
        // The free tier lets one call through every 250 ms: four callers
        // arriving together are all admitted (none refused), the last one
        // about 750 ms after the first.
        let start = std::time::Instant::now();
        let call = || report(&limiter, 1, "free");
        let results = tokio::join!(call(), call(), call(), call());
        let results = [results.0, results.1, results.2, results.3];
        assert!(
            results.iter().all(Result::is_ok),
            "{backend:?}: {results:?}"
        );
        let elapsed = start.elapsed();
        assert!(
            elapsed >= std::time::Duration::from_millis(700),
            "{backend:?}: the free tier's four calls took {elapsed:?}: they did not queue"
        );
        // The pro tier's own, faster queue: four calls at once leave within
        // about 30 ms of each other (one every 10 ms), whatever the free
        // tier does.
        let start = std::time::Instant::now();
        let call = || report(&limiter, 1, "pro");
        let results = tokio::join!(call(), call(), call(), call());
        let results = [results.0, results.1, results.2, results.3];
        assert!(
            results.iter().all(Result::is_ok),
            "{backend:?}: {results:?}"
        );
        assert!(
            start.elapsed() < std::time::Duration::from_millis(700),
            "{backend:?}: the pro tier waited on the free tier's queue: {:?}",
            start.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiered_call_that_would_wait_past_its_deadline_is_refused_at_once() {
    for backend in BACKENDS {
        let (limiter, _server) = limiter(backend).await;
        let spec = CallSpec::owned(
            "exports",
            vec![GroupSpec::owned_tiered(
                "exports",
                vec![Tier::owned(
                    "free",
                    vec![
                        ratewall::Limit::per_second(1)
                            .unwrap()
                            .with_algorithm(ratewall::Algorithm::LeakyBucket)
                            .unwrap()
                            .with_burst(1)
                            .unwrap(),
                    ],
                )],
            )],
        );
        let wait = std::time::Duration::from_millis(100);
        let keys = || ratewall::Keys::new(&[&"t"]).tiers(&["free"]).wait(wait);
        let first = limiter.call_with(&spec, keys()).await;
        assert!(first.is_ok(), "{backend:?}: {first:?}");
        let start = std::time::Instant::now();
        let refused = limiter.call_with(&spec, keys()).await.unwrap_err();
        assert!(
            refused.retry_after().unwrap() > wait,
            "{backend:?}: {refused}"
        );
        assert!(
            start.elapsed() < std::time::Duration::from_secs(1),
            "{backend:?}: refused only after sleeping"
        );
    }
}

/// Runs 20 callers of `tier` at once, each holding its slot for 100 ms
/// (counted inside), on a tiered spec with an in-flight limit of 2 in each
/// tier; the most bodies ever running at once.
async fn most_running(limiter: Arc<Limiter>, spec: Arc<CallSpec>, tier: &'static str) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let running = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (limiter, spec) = (limiter.clone(), spec.clone());
        let (running, most) = (running.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let call = limiter.call_with(&spec, ratewall::Keys::new(&[&"tenant"]).tiers(&[tier]));
            if let Ok(permit) = call.await {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    limiter.flush_in_flight().await;
    most.load(Ordering::SeqCst)
}

fn in_flight_tiers() -> Arc<CallSpec> {
    Arc::new(CallSpec::owned(
        "jobs",
        vec![GroupSpec::owned_tiered(
            "jobs",
            vec![
                Tier::owned(
                    "free",
                    vec![
                        "1000/1m".parse().unwrap(),
                        ratewall::Limit::in_flight(2).unwrap(),
                    ],
                ),
                Tier::owned("pro", vec![ratewall::Limit::in_flight(5).unwrap()]),
            ],
        )],
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_limit_inside_a_tier_holds_in_memory_and_on_redis() {
    for backend in BACKENDS {
        let (limiter, _server) = limiter(backend).await;
        let spec = in_flight_tiers();
        let free = most_running(limiter.clone(), spec.clone(), "free").await;
        assert_eq!(free, 2, "{backend:?}: the free tier's 2 slots");
        let pro = most_running(limiter.clone(), spec.clone(), "pro").await;
        assert_eq!(pro, 5, "{backend:?}: the pro tier's 5 slots, its own");
        assert_eq!(limiter.in_flight_leases(), 0, "{backend:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_limit_inside_a_tier_holds_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::connect_cluster(cluster.urls())
        .await
        .expect("connect");
    let limiter = Arc::new(
        Limiter::builder()
            .backend(backend)
            .prefix("tiers")
            // A call the cluster does not answer in time is refused, never
            // let through without its slot.
            .failure_policy(FailurePolicy::FailClosed)
            .build()
            .unwrap(),
    );
    let spec = in_flight_tiers();
    let free = most_running(limiter.clone(), spec.clone(), "free").await;
    assert!(free <= 2, "the free tier's 2 slots: {free} ran at once");
    assert!(free >= 1);
    let pro = most_running(limiter.clone(), spec, "pro").await;
    assert!(pro <= 5, "the pro tier's 5 slots: {pro} ran at once");
    assert_eq!(limiter.in_flight_leases(), 0);
}
