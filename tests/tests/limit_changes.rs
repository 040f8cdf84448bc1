//! A limit changed at run time keeps its history, for every algorithm, on
//! memory and on Redis: the calls made still count under the new limit.
//! Raised then lowered (and lowered then raised) within one instant, every
//! algorithm admits exactly what the sliding log (which keeps one entry per
//! call) admits for the same sequence.

use std::time::Duration;

use ratewall::{
    Algorithm, Key, Limit,
    backend::{Backend, MemoryBackend, Request},
    clock::ManualClock,
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;

/// A realistic epoch, mid-minute (no fixed window boundary is crossed).
const EPOCH_US: u64 = 1_700_000_010_000_000;

/// One sequence: per phase, the threshold in force (per minute) and the
/// calls made under it.
const SEQUENCES: [&[(u64, u32)]; 3] = [
    // The cases: 3/1m raised to 6/1m after 3 calls, then lowered to 2.
    &[(3, 5), (6, 5), (2, 3)],
    // Lowered after 2 calls: nothing more passes; raised again: the rest.
    &[(6, 2), (2, 3), (6, 6)],
    // Raised from 1, lowered back to 1, raised to 4.
    &[(1, 2), (3, 3), (1, 2), (4, 3)],
];

fn limit(algorithm: Algorithm, threshold: u64) -> Limit {
    Limit::new(threshold, Duration::from_secs(60))
        .and_then(|l| l.with_algorithm(algorithm))
        .expect("limit")
}

/// Calls admitted per phase of `sequence` for `algorithm` on `store`, all
/// at one instant, under key `id`.
async fn admitted(
    store: &dyn Backend,
    algorithm: Algorithm,
    sequence: &[(u64, u32)],
    id: &str,
) -> Vec<u32> {
    let key = Key::new("changes", "user", id);
    let mut phases = Vec::new();
    for &(threshold, calls) in sequence {
        let limit = limit(algorithm, threshold);
        let mut passed = 0;
        for _ in 0..calls {
            let decisions = store
                .acquire(&[Request::new(&key, &limit, 1)])
                .await
                .expect("decided");
            passed += u32::from(decisions.allowed());
        }
        phases.push(passed);
    }
    phases
}

#[tokio::test]
async fn a_limit_raised_then_lowered_admits_what_the_sliding_log_admits_for_every_algorithm() {
    let server = RedisServer::start();
    let clock = ManualClock::new(EPOCH_US);
    let redis = RedisBackend::builder(server.url())
        .client_clock(clock.clone())
        .extra_ttl(Duration::from_secs(600))
        .connect()
        .await
        .expect("connect");
    let memory = MemoryBackend::with_clock(clock.clone());
    let stores: [(&str, &dyn Backend); 2] = [("memory", &memory), ("redis", &redis)];
    let mut table = Vec::new();
    for (number, sequence) in SEQUENCES.iter().enumerate() {
        for (store_name, store) in stores {
            let log = admitted(
                store,
                Algorithm::SlidingLog,
                sequence,
                &format!("log{number}"),
            )
            .await;
            for algorithm in Algorithm::ALL {
                let got =
                    admitted(store, algorithm, sequence, &format!("{algorithm}{number}")).await;
                table.push(format!(
                    "{sequence:?} {store_name:6} {algorithm:14} {got:?} (sliding log {log:?})"
                ));
                assert_eq!(
                    got, log,
                    "{algorithm} on {store_name}, sequence {sequence:?}: admitted per phase"
                );
            }
        }
    }
    eprintln!("{}", table.join("\n"));
}
