//! Every algorithm of the grammar's table works in every place that must
//! know it: the in-memory store, the Redis Lua code (both ways of calling it:
//! the Functions library and the scripts, single-limit and batch entry
//! points) and the documentation's tables.
//!
//! This is the enumeration test of the checklist for a new algorithm
//! (`CONTRIBUTING.md`): it walks `Algorithm::ALL` (and the concurrency limit),
//! so an algorithm added to the grammar but missing from one place fails
//! here by name, where a `match` cannot catch it (a Lua module, a docs row).

use std::path::Path;
use std::time::Duration;

use ratewall::{
    Algorithm, Decision, Key, Limit,
    backend::{Backend, MemoryBackend, Request},
    clock::ManualClock,
};
use ratewall_redis::{CallMode, RedisBackend};
use ratewall_tests::harness::RedisServer;

/// A realistic epoch (2023-11), so Lua handles full-size microsecond times.
const EPOCH_US: u64 = 1_700_000_000_000_000;

/// The threshold every case uses.
const THRESHOLD: u64 = 3;

fn limit(algorithm: Algorithm) -> Limit {
    let limit = Limit::per_minute(THRESHOLD).expect("limit");
    if algorithm == Algorithm::InFlight {
        return Limit::in_flight(THRESHOLD).expect("in-flight limit");
    }
    limit.with_algorithm(algorithm).expect("algorithm")
}

/// What one backend decided for the sequence every case runs: a single
/// limit taken `THRESHOLD + 1` times (the last refused), a peek, a refund
/// of the first call, one more take, then a two-limit batch (the batch
/// entry point) and a reset.
#[derive(Debug, PartialEq)]
struct Trace {
    singles: Vec<Decision>,
    peek: Decision,
    after_refund: Decision,
    batch: Vec<Decision>,
    after_reset: Decision,
}

async fn trace(
    backend: &dyn Backend,
    clock: &ManualClock,
    algorithm: Algorithm,
    run: &str,
) -> Trace {
    let limit = limit(algorithm);
    let other = Limit::per_hour(100).expect("limit");
    let key = Key::new(run, algorithm.name(), "alice");
    let second = Key::new(run, algorithm.name(), "bob");
    // An in-flight limit's slot is held under a lease id, one per admission.
    let holder = |i: u64| {
        if algorithm == Algorithm::InFlight {
            i + 1
        } else {
            0
        }
    };
    let mut singles = Vec::new();
    for i in 0..=THRESHOLD {
        let request = [Request::new(&key, &limit, 1).with_holder(holder(i))];
        let decisions = backend.acquire(&request).await.expect("acquire");
        singles.push(*decisions.binding());
        clock.advance(Duration::from_millis(1));
    }
    let peek = *backend
        .peek(&[Request::new(&key, &limit, 1).with_holder(holder(99))])
        .await
        .expect("peek")
        .binding();
    if algorithm != Algorithm::InFlight {
        let first = [Request::new(&key, &limit, 1)];
        backend
            .refund(&first, singles[0].at_micros())
            .await
            .expect("refund");
    }
    let after_refund = *backend
        .acquire(&[Request::new(&key, &limit, 1).with_holder(holder(100))])
        .await
        .expect("acquire after refund")
        .binding();
    let batch = backend
        .acquire(&[
            Request::new(&second, &limit, 1).with_holder(holder(200)),
            Request::new(&second, &other, 1),
        ])
        .await
        .expect("batch")
        .as_slice()
        .to_vec();
    backend
        .reset(&[Request::new(&key, &limit, 1).with_holder(holder(300))])
        .await
        .expect("reset");
    let after_reset = *backend
        .acquire(&[Request::new(&key, &limit, 1).with_holder(holder(301))])
        .await
        .expect("acquire after reset")
        .binding();
    Trace {
        singles,
        peek,
        after_refund,
        batch,
        after_reset,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_decides_alike_in_memory_and_on_redis_through_functions_and_scripts() {
    let server = RedisServer::start();
    let every = Algorithm::ALL.into_iter().chain([Algorithm::InFlight]);
    assert_eq!(every.clone().count(), Algorithm::EVERY.len());
    for algorithm in every {
        let clock = ManualClock::new(EPOCH_US);
        let memory = MemoryBackend::with_clock(clock.clone());
        let expected = trace(&memory, &clock, algorithm, "mem").await;
        // The sequence shows the algorithm at work: the threshold admitted,
        // then a refusal.
        assert!(
            expected.singles[..THRESHOLD as usize]
                .iter()
                .all(|d| d.allowed()),
            "{algorithm}: {expected:?}"
        );
        assert!(
            !expected.singles[THRESHOLD as usize].allowed(),
            "{algorithm}: {expected:?}"
        );
        assert!(expected.after_reset.allowed(), "{algorithm}: {expected:?}");
        for mode in [CallMode::Functions, CallMode::Scripts] {
            let clock = ManualClock::new(EPOCH_US);
            let redis = RedisBackend::builder(server.url())
                .client_clock(clock.clone())
                .extra_ttl(Duration::from_secs(3_600))
                .timeout(Duration::from_secs(10))
                .call_mode(mode)
                .connect()
                .await
                .expect("connect");
            let run = format!("r{mode:?}");
            let got = trace(&redis, &clock, algorithm, &run).await;
            assert_eq!(
                got, expected,
                "{algorithm} on Redis ({mode:?}) decides unlike memory"
            );
        }
    }
}

/// The rows of the table in `text` whose first cell is an algorithm's name
/// in backticks (`| `gcra` ...`, or the same inside `//!` crate docs).
fn rows_naming(text: &str, algorithm: Algorithm) -> usize {
    let cell = format!("| `{}`", algorithm.name());
    text.lines()
        .map(|line| line.trim_start().trim_start_matches("//!").trim_start())
        .filter(|line| line.starts_with(&cell))
        .count()
}

#[test]
fn every_rate_algorithm_has_a_row_in_the_guide() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (file, text) in [(
        "rl-core/docs/guide/algorithms.md",
        std::fs::read_to_string(root.join("rl-core/docs/guide/algorithms.md")),
    )] {
        let text = text.expect(file);
        for algorithm in Algorithm::ALL {
            assert!(
                rows_naming(&text, algorithm) >= 1,
                "{file}: no table row for `{algorithm}` (its \"Algorithms\" table lists every algorithm)"
            );
        }
    }
}
