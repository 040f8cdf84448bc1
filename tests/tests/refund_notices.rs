//! Refunds visible to every instance promptly: room one instance gives
//! back in Redis (a settled estimate, a refund, a settled call, a reset)
//! clears the refusals the other instances remember for the key and wakes
//! their waiting calls, through the refund notices the Lua code publishes
//! (`ratewall-redis`, `notices.rs`).
//!
//! Two limiters, each over its own `RedisBackend` (two processes, as far
//! as Redis can tell), on one real `redis-server` and on a real 3-master
//! cluster. The bound held: a refund by one instance is usable by the
//! other within 100 ms, where without a notice its deny cache would refuse
//! for up to its maximum hold (1 s); a notice lost while the subscription
//! is down is made up for within that maximum hold. A block lifted by one
//! instance is lifted for the other within the same bound.

use std::fmt::Display;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewall::{
    Algorithm, CallSpec, GroupSpec, Keys, Limit, Limiter, backend::Request, call::Counting,
};
use ratewall_redis::{RedisBackend, RedisBackendBuilder};
use ratewall_tests::harness::{RedisCluster, RedisServer};

const PREFIX: &str = "notices";

/// The bound: a refund by one instance usable by another.
const USABLE_WITHIN: Duration = Duration::from_millis(100);

const HOUR: Duration = Duration::from_secs(3_600);

/// The deny cache's maximum hold (the default).
const MAX_HOLD: Duration = Duration::from_secs(1);

/// Held by each test for its whole run: the tests measure real time, and
/// would otherwise compete with each other (and their servers) for the
/// two cores.
static REAL_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Between two tries of the instance waiting for the room.
const POLL: Duration = Duration::from_millis(2);

/// A limiter over its own backend (deny cache on: the default over a
/// remote store, held up to 1 s).
async fn instance(builder: RedisBackendBuilder) -> Limiter {
    let backend = builder.connect().await.expect("connect");
    Limiter::builder()
        .backend(backend)
        .prefix(PREFIX)
        .build()
        .expect("limiter")
}

/// The listeners subscribed to the prefix's notices, across `nodes` (a
/// cluster's node counts only its own).
async fn subscribers(nodes: &[RedisServer]) -> i64 {
    let mut total = 0;
    for node in nodes {
        let counts: Vec<redis::Value> = node
            .cmd(&["PUBSUB", "NUMSUB", &format!("{PREFIX}:{{refunds}}")])
            .await;
        if let Some(redis::Value::Int(n)) = counts.get(1) {
            total += n;
        }
    }
    total
}

/// Waits until `count` listeners are subscribed.
async fn until_subscribed(nodes: &[RedisServer], count: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while subscribers(nodes).await < count {
        assert!(
            Instant::now() < deadline,
            "{} of {count} limiters subscribed to refund notices",
            subscribers(nodes).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Tokens per hour, estimated and settled (GCRA: a refused call of 10
/// units is told to come back in 6 minutes, so the deny cache holds its
/// refusal for its whole maximum hold).
fn export() -> CallSpec {
    let limit = Limit::per_hour(100).expect("limit");
    CallSpec::owned(
        "export",
        vec![GroupSpec::owned("export_rows", vec![limit]).settled()],
    )
}

/// Calls `spec` for `identity` at `cost` every [`POLL`] until admitted;
/// how long that took.
async fn until_admitted(limiter: &Limiter, spec: &CallSpec, identity: &str, cost: u64) -> Duration {
    let start = Instant::now();
    let give_up = start + Duration::from_secs(5);
    loop {
        let ids: [&(dyn Display + Sync); 1] = [&identity];
        if limiter
            .call_with(spec, Keys::new(&ids).costs(&[cost]))
            .await
            .is_ok()
        {
            return start.elapsed();
        }
        assert!(Instant::now() < give_up, "never admitted");
        tokio::time::sleep(POLL).await;
    }
}

/// B, which remembers a refusal of `identity` since before `remembered`
/// and was told nothing of the room given back since, is admitted by its
/// first call after the deny cache's maximum hold ends.
async fn converges_when_the_hold_ends(
    b: &Limiter,
    spec: &CallSpec,
    identity: &str,
    remembered: Instant,
) {
    // (Plus what the deny cache's clock and `Instant` may differ by.)
    tokio::time::sleep_until((remembered + MAX_HOLD + Duration::from_millis(5)).into()).await;
    let ids: [&(dyn Display + Sync); 1] = [&identity];
    let after = b.call_with(spec, Keys::new(&ids).costs(&[10])).await;
    assert!(
        after.is_ok(),
        "refused {:?} after the refusal was remembered (maximum hold {MAX_HOLD:?})",
        remembered.elapsed()
    );
}

/// Instance A takes the whole budget with an estimate, B is refused (and
/// remembers it), A settles its real cost, and B's next call fits within
/// [`USABLE_WITHIN`]: rounds of it, each on an identity of its own; the
/// delays measured (printed: run with `--nocapture` to read them).
///
/// A round over the bound is played again once, on a fresh identity, and
/// fails the test if it is over again. Investigated: with the machine's
/// load average at 13 to 15 (other builds on the two cores), about one
/// round in fifty took 30 to 170 ms, spent in Redis round trips that took
/// as long (A's refund, B's call after the notice) and in the test's 2 ms
/// sleeps overshooting by as much, while a plain subscriber beside B had
/// the notice within a millisecond of the refund; a notice lost or held
/// back would make every round take the deny cache's full hold (1 s).
async fn settled_estimates_are_usable_by_the_other_instance(a: &Limiter, b: &Limiter, label: &str) {
    let spec = export();
    let mut delays = Vec::new();
    let mut outliers = Vec::new();
    for round in 0..20 {
        let mut delay = settle_and_wait(a, b, &spec, &format!("tenant-{round}")).await;
        if delay > USABLE_WITHIN {
            outliers.push(delay);
            delay = settle_and_wait(a, b, &spec, &format!("tenant-{round}-again")).await;
        }
        assert!(
            delay <= USABLE_WITHIN,
            "{label}: round {round}: the room given back was usable after {delay:?}, twice over the bound (first {:?})",
            outliers.last()
        );
        delays.push(delay);
    }
    delays.sort();
    eprintln!(
        "{label}: a settled estimate usable by the other instance after: min {:?}, median {:?}, max {:?} ({} rounds; played again: {outliers:?})",
        delays[0],
        delays[delays.len() / 2],
        delays[delays.len() - 1],
        delays.len()
    );
}

/// One round of [`settled_estimates_are_usable_by_the_other_instance`] on
/// `identity`: how long after A's settlement B's call was admitted.
async fn settle_and_wait(a: &Limiter, b: &Limiter, spec: &CallSpec, identity: &str) -> Duration {
    let ids: [&(dyn Display + Sync); 1] = [&identity];
    let permit = a
        .call_with(spec, Keys::new(&ids).costs(&[100]))
        .await
        .expect("the estimate fits the empty budget");
    for _ in 0..2 {
        // Refused by Redis, then from B's deny cache.
        let refused = b.call_with(spec, Keys::new(&ids).costs(&[10])).await;
        assert!(refused.is_err());
    }
    permit.settle_cost(30).await;
    until_admitted(b, spec, identity, 10).await
}

/// The raw requests' refund and reset, and a settled call's refund (a
/// cancel by its request id), each clears B's remembered refusal within
/// [`USABLE_WITHIN`].
async fn refunds_and_resets_are_usable_by_the_other_instance(
    a: &Limiter,
    b: &Limiter,
    label: &str,
) {
    let limit = Limit::per_hour(1).expect("limit");
    // Raw requests: a refund of the decision's time, then a reset.
    for (round, reset) in [(0, false), (1, true)] {
        let key = a.key("raw", &format!("user-{round}"));
        let call = [Request::new(&key, &limit, 1)];
        let taken = a.requests().acquire_all(&call).await.expect("decided");
        assert!(taken.allowed());
        for _ in 0..2 {
            assert!(b.requests().check("raw", &call, None).await.is_err());
        }
        if reset {
            a.requests().reset_all(&call).await.expect("reset");
        } else {
            let at = taken.iter().next().expect("one decision").at_micros();
            a.requests().refund_all(&call, at).await.expect("refund");
        }
        let start = Instant::now();
        while b.requests().check("raw", &call, None).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{label}: never admitted"
            );
            tokio::time::sleep(POLL).await;
        }
        let delay = start.elapsed();
        assert!(
            delay <= USABLE_WITHIN,
            "{label}: a {} was usable after {delay:?}",
            if reset { "reset" } else { "refund" }
        );
    }
    // A call counted only if it succeeds: refunded (cancelled by its
    // request id) when it did not.
    let counted = CallSpec::owned("login", vec![GroupSpec::owned("login", vec![limit])])
        .with_counting(Counting::Settled);
    let permit = a.call(&counted, &[&"mallory"]).await.expect("first try");
    for _ in 0..2 {
        assert!(b.call(&counted, &[&"mallory"]).await.is_err());
    }
    permit.settle(false).await;
    let start = Instant::now();
    while b.call(&counted, &[&"mallory"]).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{label}: never admitted"
        );
        tokio::time::sleep(POLL).await;
    }
    let delay = start.elapsed();
    assert!(
        delay <= USABLE_WITHIN,
        "{label}: a settled call's refund was usable after {delay:?}"
    );
}

/// B's call waits for room on a window algorithm (it retries after each
/// refusal's `retry_after`: the end of the hour's window, at least a
/// minute away, see [`RedisServer::away_from_window_end`]); A's refund
/// wakes it: it is admitted within [`USABLE_WITHIN`] of the refund.
async fn a_waiting_call_is_woken_by_the_other_instance(
    a: Arc<Limiter>,
    b: Arc<Limiter>,
    label: &str,
) {
    let limit = Limit::per_hour(1)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .expect("limit");
    let taking = CallSpec::owned("report", vec![GroupSpec::owned("report", vec![limit])])
        .with_counting(Counting::Settled);
    let waiting = Arc::new(
        CallSpec::owned("report_wait", vec![GroupSpec::owned("report", vec![limit])])
            .with_wait(Duration::from_secs(3_600)),
    );
    let permit = a.call(&taking, &[&"acme"]).await.expect("the unit is free");
    let waiter = {
        let (b, waiting) = (b.clone(), waiting.clone());
        tokio::spawn(async move {
            let permit = b.call(&waiting, &[&"acme"]).await;
            (
                Instant::now(),
                permit.map(|p| p.waited()).map_err(|r| r.to_string()),
            )
        })
    };
    // The waiting call was refused and sleeps until its retry.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "{label}: the call did not wait");
    let refused = b.call(&taking, &[&"acme"]).await.unwrap_err();
    let retry = refused.retry_after().expect("a retry time");
    let given = Instant::now();
    permit.settle(false).await;
    let (admitted, waited) = waiter.await.expect("waiter");
    let waited = waited.expect("admitted");
    let delay = admitted.saturating_duration_since(given);
    eprintln!(
        "{label}: a waiting call woken {delay:?} after the refund (its retry was {retry:?} away; waited {waited:?})"
    );
    assert!(
        delay <= USABLE_WITHIN && delay < retry,
        "{label}: the waiting call was admitted {delay:?} after the refund (its retry was {retry:?} away)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_by_one_instance_is_usable_by_another_within_100_ms() {
    let _serial = REAL_TIME.lock().await;
    let server = RedisServer::start();
    let a = instance(RedisBackend::builder(server.url())).await;
    let b = instance(RedisBackend::builder(server.url())).await;
    until_subscribed(std::slice::from_ref(&server), 2).await;
    settled_estimates_are_usable_by_the_other_instance(&a, &b, "standalone").await;
    refunds_and_resets_are_usable_by_the_other_instance(&a, &b, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_by_one_instance_wakes_a_waiting_call_of_another() {
    let _serial = REAL_TIME.lock().await;
    let server = RedisServer::start();
    // The retry after a refusal is at least a minute away (the end of the
    // hour's window): only the refund can admit the call sooner.
    server.away_from_window_end(HOUR).await;
    let a = Arc::new(instance(RedisBackend::builder(server.url())).await);
    let b = Arc::new(instance(RedisBackend::builder(server.url())).await);
    until_subscribed(std::slice::from_ref(&server), 2).await;
    a_waiting_call_is_woken_by_the_other_instance(a, b, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_refund_by_one_instance_is_usable_by_another_within_100_ms() {
    let _serial = REAL_TIME.lock().await;
    let cluster = RedisCluster::start();
    let a = Arc::new(instance(RedisBackend::cluster_builder(cluster.urls())).await);
    // B subscribes on another seed node than A: the notice crosses the
    // cluster bus.
    let mut urls = cluster.urls();
    urls.rotate_left(1);
    let b = Arc::new(instance(RedisBackend::cluster_builder(urls)).await);
    until_subscribed(cluster.nodes(), 2).await;
    settled_estimates_are_usable_by_the_other_instance(&a, &b, "cluster").await;
    refunds_and_resets_are_usable_by_the_other_instance(&a, &b, "cluster").await;
    cluster.masters()[0].away_from_window_end(HOUR).await;
    a_waiting_call_is_woken_by_the_other_instance(a, b, "cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_lost_while_the_subscription_is_down_is_made_up_for_within_the_maximum_hold() {
    let _serial = REAL_TIME.lock().await;
    let server = RedisServer::start();
    let nodes = std::slice::from_ref(&server);
    let a = instance(RedisBackend::builder(server.url())).await;
    let b = instance(RedisBackend::builder(server.url())).await;
    let spec = export();
    // Tries again, on a fresh identity, in the unlikely case a
    // subscription came back before the notice was published (the
    // instances wait half a second before subscribing again).
    for attempt in 0..3 {
        until_subscribed(nodes, 2).await;
        let identity = format!("lost-{attempt}");
        let ids: [&(dyn Display + Sync); 1] = [&identity];
        let permit = a
            .call_with(&spec, Keys::new(&ids).costs(&[100]))
            .await
            .expect("fits");
        // Refused by Redis, held by B's deny cache for its maximum hold
        // from when the call reached it: before `remembered`.
        let refused = b.call_with(&spec, Keys::new(&ids).costs(&[10])).await;
        let remembered = Instant::now();
        assert!(refused.is_err());
        // Every subscription drops: the notice of this settlement
        // reaches no one.
        let killed: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).await;
        assert_eq!(killed, 2);
        permit.settle_cost(30).await;
        if subscribers(nodes).await != 0 {
            eprintln!("attempt {attempt}: a subscription came back before the notice; again");
            continue;
        }
        // B still answers its remembered refusal...
        let refused = b.call_with(&spec, Keys::new(&ids).costs(&[10])).await;
        assert!(refused.is_err(), "the notice was lost: B still remembers");
        // ...until the hold ends: then it asks Redis, which has the room.
        converges_when_the_hold_ends(&b, &spec, &identity, remembered).await;
        // Both subscribe again, and notices are heard again.
        until_subscribed(nodes, 2).await;
        settled_estimates_are_usable_by_the_other_instance(&a, &b, "after a reconnection").await;
        return;
    }
    panic!("the subscriptions always came back before the notice was published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_notices_the_other_instance_sees_a_refund_within_the_maximum_hold() {
    let _serial = REAL_TIME.lock().await;
    let server = RedisServer::start();
    let a = instance(RedisBackend::builder(server.url()).refund_notices(false)).await;
    let b = instance(RedisBackend::builder(server.url()).refund_notices(false)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(subscribers(std::slice::from_ref(&server)).await, 0);
    let spec = export();
    let ids: [&(dyn Display + Sync); 1] = [&"quiet"];
    let permit = a
        .call_with(&spec, Keys::new(&ids).costs(&[100]))
        .await
        .expect("fits");
    let refused = b.call_with(&spec, Keys::new(&ids).costs(&[10])).await;
    let remembered = Instant::now();
    assert!(refused.is_err());
    permit.settle_cost(30).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = b.call_with(&spec, Keys::new(&ids).costs(&[10])).await;
    assert!(refused.is_err(), "no notice: B still remembers");
    converges_when_the_hold_ends(&b, &spec, "quiet", remembered).await;
}

/// A block lifted by one instance (`Settings::unblock`) clears what the
/// other remembers of the identity's refusals within [`USABLE_WITHIN`],
/// where its deny cache (held up to 30 s here) would refuse it for the
/// whole hold; the notice names the identity's key, so another identity
/// blocked beside it stays refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_lifted_by_one_instance_is_lifted_for_another_within_100_ms() {
    let _serial = REAL_TIME.lock().await;
    let server = RedisServer::start();
    let a = instance(RedisBackend::builder(server.url())).await;
    let backend = RedisBackend::builder(server.url())
        .connect()
        .await
        .expect("connect");
    let b = Limiter::builder()
        .backend(backend)
        .prefix(PREFIX)
        .deny_cache_max_hold(Duration::from_secs(30))
        .build()
        .expect("limiter");
    until_subscribed(std::slice::from_ref(&server), 2).await;
    // One call a second; a refusal blocks the identity for an hour.
    let limit = Limit::per_second(1)
        .and_then(|l| l.with_block(HOUR))
        .expect("limit");
    let spec = CallSpec::owned("login", vec![GroupSpec::owned("login", vec![limit])]);
    for identity in ["mallory", "trudy"] {
        drop(a.call(&spec, &[&identity]).await.expect("the first call"));
        for _ in 0..2 {
            // Refused by Redis (which blocks it), then from B's deny cache.
            let refused = b.call(&spec, &[&identity]).await.unwrap_err();
            assert!(refused.retry_after() > Some(Duration::from_secs(3_000)));
        }
    }
    // The state admits again; only the blocks refuse.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let start = Instant::now();
    assert!(
        a.settings()
            .unblock("login", &"mallory")
            .await
            .expect("unblock")
    );
    while b.call(&spec, &[&"mallory"]).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(5), "never admitted");
        tokio::time::sleep(POLL).await;
    }
    let delay = start.elapsed();
    eprintln!("a lifted block usable by the other instance after {delay:?}");
    assert!(
        delay <= USABLE_WITHIN,
        "a lifted block was usable after {delay:?}"
    );
    let still = b.call(&spec, &[&"trudy"]).await.unwrap_err();
    assert!(still.retry_after() > Some(Duration::from_secs(3_000)));
}
