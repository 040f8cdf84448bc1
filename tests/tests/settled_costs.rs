//! Settled costs ([`GroupSpec::settled`], [`Permit::settle_cost`]): a call
//! takes an estimate, and its real cost replaces it once known, in one
//! step; what goes past the limit is debt later calls pay.
//!
//! The exactness bound: 1 000 concurrent calls with random estimates and
//! random real costs, 100 of them dropped unsettled mid-call, and the sum
//! the store holds is exactly the sum of the real costs plus the dropped
//! calls' estimates, on every algorithm that carries a sum (GCRA, the
//! buckets, the windows), in memory, on Redis and on a Redis Cluster. The
//! clock is a manual one (the Redis backends use it as the client's time),
//! so nothing drains while the calls run and the sum is read back exactly.

use std::sync::Arc;
use std::time::Duration;

use ratewall::{
    Algorithm, CallSpec, FailurePolicy, GroupSpec, Keys, Limit, Limiter, backend::Request,
    call::Admission, clock::ManualClock,
};
use ratewall_redis::{RedisBackend, RedisBackendBuilder};
use ratewall_tests::harness::{RedisCluster, RedisServer};

const EPOCH_US: u64 = 1_700_000_000_000_000;

const CALLS: u64 = 1_000;
/// Every tenth call is dropped unsettled.
const DROP_EVERY: u64 = 10;

/// A budget no test run fills: the sum is read back as capacity minus
/// what remains.
const BUDGET: u64 = 50_000_000;

/// The algorithms whose state is a sum of units (the sliding log keeps an
/// entry per unit, at most 10 000: too few for a token budget).
const SUMMING: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

fn tokens_per_minute(algorithm: Algorithm) -> Limit {
    Limit::new(BUDGET, Duration::from_secs(60))
        .and_then(|l| l.with_algorithm(algorithm))
        .expect("valid limit")
}

fn requests_per_minute() -> Limit {
    Limit::new(1_000_000, Duration::from_secs(60)).expect("valid limit")
}

/// Requests per minute (one each, not settled) and tokens per minute
/// (estimated, settled), decided together; a failing store refuses (no
/// call let through undecided).
fn llm_spec(algorithm: Algorithm) -> CallSpec {
    CallSpec::owned(
        "llm",
        vec![
            GroupSpec::owned("llm_rpm", vec![requests_per_minute()]),
            GroupSpec::owned("llm_tpm", vec![tokens_per_minute(algorithm)]).settled(),
        ],
    )
    .with_policy(FailurePolicy::FailClosed)
}

/// A small deterministic generator (xorshift64*), one per call.
fn random(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move |below| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D) % below
    }
}

/// Units in use under `limit` for `identity` of group `scope`: capacity
/// minus what a peek says remains.
async fn used(limiter: &Limiter, scope: &str, identity: &str, limit: &Limit) -> u64 {
    let key = limiter.key(scope, &identity);
    let decisions = limiter
        .requests()
        .peek_all(&[Request::new(&key, limit, 1)])
        .await
        .expect("peek");
    limit.capacity() - decisions[0].remaining()
}

/// A limiter on the in-memory store over `clock`.
fn in_memory(clock: ManualClock) -> Limiter {
    Limiter::builder()
        .memory()
        .clock(clock)
        .build()
        .expect("limiter")
}

/// A limiter on the Redis `backend` builds, at `clock` (the client's time,
/// so nothing drains while calls run; keys outlive the run), waiting long
/// enough for a loaded machine.
async fn on_redis(backend: RedisBackendBuilder, clock: ManualClock) -> Limiter {
    let backend = backend
        .client_clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .extra_ttl(Duration::from_secs(3_600))
        .connect()
        .await
        .expect("connect");
    Limiter::builder()
        .backend(backend)
        .clock(clock)
        .build()
        .expect("limiter")
}

/// Runs the 1 000 calls concurrently on `identity` and checks the sums.
async fn settle_concurrently(limiter: Arc<Limiter>, algorithm: Algorithm, identity: &str) {
    let spec = Arc::new(llm_spec(algorithm));
    let start = Arc::new(tokio::sync::Barrier::new(CALLS as usize));
    let mut calls = Vec::new();
    let mut expected = 0;
    for call in 0..CALLS {
        let mut draw = random(call + 1);
        let estimate = 1 + draw(20_000);
        let actual = draw(40_001);
        let dropped = call % DROP_EVERY == 0;
        expected += if dropped { estimate } else { actual };
        let (limiter, spec, start) = (limiter.clone(), spec.clone(), start.clone());
        let identity = identity.to_owned();
        calls.push(tokio::spawn(async move {
            start.wait().await;
            let (identities, costs) = ([&identity as _, &identity as _], [1, estimate]);
            let permit = limiter
                .call_with(&spec, Keys::new(&identities).costs(&costs))
                .await
                .unwrap_or_else(|refused| panic!("call {call} refused: {refused}"));
            assert!(
                matches!(permit.admission(), Admission::Backend(_)),
                "call {call}: {:?}",
                permit.admission()
            );
            // The body runs (and other calls with it)...
            tokio::task::yield_now().await;
            if dropped {
                // ...and is cancelled: the estimate stays taken.
                drop(permit);
            } else {
                permit.settle_cost(actual).await;
            }
        }));
    }
    for call in calls {
        call.await.expect("call task");
    }
    let tokens = used(&limiter, "llm_tpm", identity, &tokens_per_minute(algorithm)).await;
    assert_eq!(
        tokens, expected,
        "{algorithm}: the budget holds the real costs and the dropped calls' estimates"
    );
    let requests = used(&limiter, "llm_rpm", identity, &requests_per_minute()).await;
    assert_eq!(
        requests, CALLS,
        "{algorithm}: one request each, never settled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_costs_sum_to_the_real_costs_in_memory() {
    let clock = ManualClock::new(EPOCH_US);
    let limiter = Arc::new(in_memory(clock));
    for algorithm in SUMMING {
        settle_concurrently(limiter.clone(), algorithm, &format!("team-{algorithm}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_costs_sum_to_the_real_costs_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(EPOCH_US);
    let limiter = Arc::new(on_redis(RedisBackend::builder(server.url()), clock).await);
    for algorithm in SUMMING {
        settle_concurrently(limiter.clone(), algorithm, &format!("team-{algorithm}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_costs_sum_to_the_real_costs_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new(EPOCH_US);
    let limiter = Arc::new(on_redis(RedisBackend::cluster_builder(cluster.urls()), clock).await);
    // GCRA and a window: one of each way of carrying a sum.
    for algorithm in [Algorithm::Gcra, Algorithm::FixedWindow] {
        settle_concurrently(limiter.clone(), algorithm, &format!("team-{algorithm}")).await;
    }
}

/// A spec of one settled group on `limit`.
fn one_budget(limit: Limit) -> CallSpec {
    CallSpec::owned(
        "export",
        vec![GroupSpec::owned("export_rows", vec![limit]).settled()],
    )
}

#[tokio::test]
async fn a_real_cost_above_the_estimate_is_debt_the_next_calls_pay() {
    let clock = ManualClock::new(EPOCH_US);
    let limiter = in_memory(clock.clone());
    // 100 rows a minute: one every 600 ms.
    let spec = one_budget(Limit::per_minute(100).expect("limit"));
    let call = |rows: u64| limiter.call_with(&spec, Keys::new(&[&"tenant"]).costs(&[rows]));
    let permit = call(10).await.expect("the estimate fits");
    permit.settle_cost(130).await;
    // 130 rows used: 30 past the budget. Nothing passes until they have
    // drained: 30 rows' worth plus one row for the next call's own.
    let refused = call(1).await.expect_err("in debt");
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(31 * 600)));
    clock.advance(Duration::from_millis(31 * 600) - Duration::from_micros(1));
    assert!(call(1).await.is_err(), "1 µs early");
    clock.advance(Duration::from_micros(1));
    let paid = call(1).await;
    assert!(paid.is_ok(), "the debt is paid: {:?}", paid.err());
}

#[tokio::test]
async fn a_real_cost_below_the_estimate_gives_the_rest_back_and_zero_gives_it_all() {
    let clock = ManualClock::new(EPOCH_US);
    let limiter = in_memory(clock);
    for algorithm in SUMMING {
        let limit = Limit::new(100, Duration::from_secs(60))
            .and_then(|l| l.with_algorithm(algorithm))
            .expect("limit");
        let spec = one_budget(limit);
        let identity = format!("tenant-{algorithm}");
        let call = |rows: u64| limiter.call_with(&spec, Keys::new(&[&identity]).costs(&[rows]));
        call(80).await.expect("fits").settle_cost(30).await;
        assert_eq!(
            used(&limiter, "export_rows", &identity, &limit).await,
            30,
            "{algorithm}"
        );
        call(70).await.expect("fits").settle_cost(0).await;
        assert_eq!(
            used(&limiter, "export_rows", &identity, &limit).await,
            30,
            "{algorithm}"
        );
        assert!(call(71).await.is_err(), "{algorithm}");
    }
}

#[tokio::test]
async fn only_the_settled_group_is_settled_and_all_or_nothing_still_holds() {
    let clock = ManualClock::new(EPOCH_US);
    let limiter = in_memory(clock);
    let spec = llm_spec(Algorithm::Gcra);
    let rpm = requests_per_minute();
    let permit = limiter
        .call_with(&spec, Keys::new(&[&"a", &"a"]).costs(&[1, 5_000]))
        .await
        .expect("admitted");
    permit.settle_cost(7_000).await;
    assert_eq!(used(&limiter, "llm_rpm", "a", &rpm).await, 1);
    // A cost over the token budget's capacity is a bad call, refused as
    // unavailable, and takes nothing from the request budget.
    let refused = limiter
        .call_with(&spec, Keys::new(&[&"a", &"a"]).costs(&[1, BUDGET + 1]))
        .await
        .expect_err("over capacity");
    assert!(refused.to_string().contains("cost"), "{refused}");
    assert_eq!(used(&limiter, "llm_rpm", "a", &rpm).await, 1);
    // Costs must come one per group.
    let refused = limiter
        .call_with(&spec, Keys::new(&[&"a", &"a"]).costs(&[5_000]))
        .await
        .expect_err("one cost for two groups");
    assert!(refused.to_string().contains("cost(s)"), "{refused}");
}

#[tokio::test]
async fn settling_a_call_that_settles_nothing_changes_nothing() {
    let limiter = Limiter::builder().memory().build().expect("limiter");
    let limit = Limit::per_minute(10).expect("limit");
    let spec = CallSpec::owned("plain", vec![GroupSpec::owned("plain", vec![limit])]);
    let permit = limiter.call(&spec, &[&"x"]).await.expect("admitted");
    permit.settle_cost(9).await;
    assert_eq!(used(&limiter, "plain", "x", &limit).await, 1);
}

#[tokio::test]
async fn a_settled_cost_on_a_waiting_call_settles_the_reserved_units() {
    let clock = ManualClock::new(EPOCH_US);
    let limiter = in_memory(clock);
    let limit = Limit::per_minute(100).expect("limit");
    let spec = one_budget(limit);
    // A wait of zero would not wait at all: a millisecond takes the
    // waiting road (a reservation) without sleeping on this frozen clock.
    let keys = |rows: &'static [u64]| {
        Keys::new(&[&"w"])
            .costs(rows)
            .wait(Duration::from_millis(1))
    };
    let permit = limiter.call_with(&spec, keys(&[60])).await.expect("fits");
    permit.settle_cost(20).await;
    assert_eq!(used(&limiter, "export_rows", "w", &limit).await, 20);
    let permit = limiter
        .call_with(&spec, keys(&[80]))
        .await
        .expect("fits again");
    permit.settle_cost(100).await;
    // 120 rows in use, 20 past the budget: the next row waits for 21 rows'
    // worth of drain (600 ms each).
    let refused = limiter
        .call_with(&spec, keys(&[1]))
        .await
        .expect_err("in debt");
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(21 * 600)));
}
