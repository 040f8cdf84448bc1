//! What a budget that finds its upstream's limit reads and writes in
//! Redis decides exactly as in memory, under identical manual clocks:
//!
//! - a learned scale (`Backend::adjust`: read, raise toward a believed
//!   ceiling or probing, lower with or without an estimate, found, set):
//!   `learned.lua` against `Learned::adjusted`, scale by scale;
//! - a peek ahead (`Backend::peek_ahead`: what a state holds some time from
//!   now): the batch's `peek` at `now + at` against the memory store's
//!   decision on a copy of the state, for every algorithm, decision by
//!   decision; and a peek ahead changes nothing.
//!
//! Both call modes (Functions and scripts) where the server has them.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use ratewall::{
    Algorithm, Key, Limit,
    backend::{Backend, MemoryBackend, Request},
    clock::{Clock, ManualClock},
    upstream::{Adjust, SCALE_ONE},
};
use ratewall_redis::{CallMode, RedisBackend};
use ratewall_tests::harness::RedisServer;

/// A realistic epoch (2023-11), so Lua handles full-size microsecond times.
const EPOCH_US: u64 = 1_700_000_000_000_000;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64)
}

/// The call modes the test server has.
fn modes() -> Vec<CallMode> {
    if std::env::var("RATEWALL_TEST_SERVER").as_deref() == Ok("redis-no-functions") {
        vec![CallMode::Scripts]
    } else {
        vec![CallMode::Functions, CallMode::Scripts]
    }
}

async fn redis_on(server: &RedisServer, clock: &ManualClock, mode: CallMode) -> RedisBackend {
    RedisBackend::builder(server.url())
        .client_clock(clock.clone())
        .extra_ttl(Duration::from_secs(3_600))
        .timeout(Duration::from_secs(10))
        .call_mode(mode)
        .connect()
        .await
        .expect("connect to the test server")
}

fn adjust() -> impl Strategy<Value = Adjust> {
    let share = || 0..=SCALE_ONE + 10;
    let gap = || (0..3_000_000u64).prop_map(Duration::from_micros);
    prop_oneof![
        Just(Adjust::Read),
        (share(), share(), share(), gap(), gap()).prop_map(
            |(step, approach, headroom, every, believe_for)| Adjust::Raise {
                step,
                approach,
                headroom,
                every,
                believe_for,
            }
        ),
        (
            share(),
            prop_oneof![Just(0u64), 0..3 * SCALE_ONE],
            share(),
            gap(),
            share()
        )
            .prop_map(
                |(keep, estimate, headroom, cooldown, floor)| Adjust::Lower {
                    keep,
                    estimate,
                    headroom,
                    cooldown,
                    floor,
                }
            ),
        (0..3 * SCALE_ONE, share())
            .prop_map(|(estimate, headroom)| Adjust::Found { estimate, headroom }),
        (0..3 * SCALE_ONE).prop_map(|scale| Adjust::Set { scale }),
    ]
}

#[test]
fn a_learned_scale_changes_alike_in_redis_and_in_memory() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        ..Config::default()
    });
    let case = 0u64;
    let case = std::sync::atomic::AtomicU64::new(case);
    runner
        .run(
            &proptest::collection::vec((adjust(), 0..2_000_000u64), 1..40),
            |steps| {
                let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                runtime.block_on(async {
                    for mode in modes() {
                        let clock = ManualClock::new(EPOCH_US);
                        let memory = MemoryBackend::with_clock(clock.clone());
                        let redis = redis_on(&server, &clock, mode).await;
                        let prefix = format!("learned{n}{mode:?}");
                        for (i, (adjust, advance)) in steps.iter().enumerate() {
                            let in_memory = memory.adjust_sync(&prefix, "tpm", *adjust);
                            let in_redis = redis
                                .adjust(&prefix, "tpm", *adjust)
                                .await
                                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                            prop_assert_eq!(
                                in_redis,
                                in_memory,
                                "{:?}, step {}: {:?}",
                                mode,
                                i,
                                adjust
                            );
                            clock.advance(Duration::from_micros(*advance));
                        }
                    }
                    Ok(())
                })
            },
        )
        .expect("Redis and memory learn alike");
}

const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
];

/// A limit of `algorithm`: 20 a second with 10 slots or a burst of 20.
fn limit(algorithm: Algorithm) -> Limit {
    let limit = Limit::new(20, Duration::from_secs(1))
        .and_then(|l| l.with_algorithm(algorithm))
        .expect("limit");
    if algorithm.uses_slots() {
        limit.with_slots(10).expect("slots")
    } else {
        limit
    }
}

#[test]
fn a_peek_ahead_decides_alike_in_redis_and_in_memory_and_changes_nothing() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    // Steps: (acquire cost or 0 for a peek ahead, µs to advance or peek ahead).
    let steps = proptest::collection::vec((0..4u64, 1..2_500_000u64), 1..40);
    runner
        .run(&(0..ALGORITHMS.len(), steps), |(algorithm, steps)| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let limit = limit(ALGORITHMS[algorithm]);
            runtime.block_on(async {
                for mode in modes() {
                    let clock = ManualClock::new(EPOCH_US);
                    let memory = MemoryBackend::with_clock(clock.clone());
                    let redis = redis_on(&server, &clock, mode).await;
                    let key = Key::new(&format!("ahead{n}{mode:?}"), "budget", "gpt");
                    for (i, (cost, micros)) in steps.iter().enumerate() {
                        if *cost == 0 {
                            let one = [Request::new(&key, &limit, 1)];
                            let ahead = Duration::from_micros(*micros);
                            let in_memory = memory.peek_ahead(&one, ahead).await;
                            let in_redis = redis.peek_ahead(&one, ahead).await;
                            prop_assert_eq!(
                                format!("{in_redis:?}"),
                                format!("{in_memory:?}"),
                                "{:?} {:?}, step {}: peek {:?} ahead",
                                mode,
                                ALGORITHMS[algorithm],
                                i,
                                ahead
                            );
                            // Nothing changed: a peek now answers as before it.
                            let now_memory = memory.peek(&one).await;
                            let now_redis = redis.peek(&one).await;
                            prop_assert_eq!(format!("{now_redis:?}"), format!("{now_memory:?}"));
                        } else {
                            let one = [Request::new(&key, &limit, *cost)];
                            let in_memory = memory.acquire(&one).await;
                            let in_redis = redis.acquire(&one).await;
                            prop_assert_eq!(
                                format!("{in_redis:?}"),
                                format!("{in_memory:?}"),
                                "{:?} {:?}, step {}: acquire {}",
                                mode,
                                ALGORITHMS[algorithm],
                                i,
                                cost
                            );
                            clock.advance(Duration::from_micros(micros / 20));
                        }
                    }
                }
                Ok(())
            })
        })
        .expect("Redis and memory peek ahead alike");
}

/// A window's count ahead: what an upstream's `Retry-After` leaves of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_ahead_reads_what_a_sliding_window_still_holds_then() {
    let server = RedisServer::start();
    let clock = ManualClock::new(EPOCH_US);
    let redis = redis_on(&server, &clock, CallMode::Auto).await;
    let limit = Limit::new(1_000, Duration::from_secs(10))
        .and_then(|l| l.with_algorithm(Algorithm::SlidingWindow))
        .and_then(|l| l.with_slots(100))
        .expect("limit");
    let key = Key::new("ahead", "budget", "gpt");
    // 100 a second for 10 s: the window is full, spread evenly.
    for _ in 0..1_000 {
        let one = [Request::new(&key, &limit, 1)];
        assert!(redis.acquire(&one).await.expect("decided").allowed());
        clock.advance(Duration::from_millis(10));
    }
    let one = [Request::new(&key, &limit, 1)];
    let taken = |ahead| {
        let redis = &redis;
        let one = &one;
        async move {
            let d = redis
                .peek_ahead(one, Duration::from_secs(ahead))
                .await
                .expect("peeked");
            d.binding().limit() - d.binding().remaining()
        }
    };
    assert_eq!(taken(0).await, 1_000);
    let half = taken(5).await;
    assert!((495..=505).contains(&half), "{half}");
    assert_eq!(taken(10).await, 0);
    let _ = clock.now_micros();
}
