//! Algorithm laws over random arrival sequences, on the in-memory backend.

use std::time::Duration;

use proptest::prelude::*;
use ratewall::{
    Algorithm, Key, Limit,
    backend::{MemoryBackend, Request},
    clock::ManualClock,
};

const T0: u64 = 1_700_000_000_000_000;

/// Runs arrivals (gap µs, cost) through one key and returns the admitted (time, cost).
fn admitted(limit: &Limit, arrivals: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let clock = ManualClock::new(T0);
    let backend = MemoryBackend::with_clock(clock.clone());
    let key = Key::new("rl", "law", "k");
    let mut out = Vec::new();
    for &(gap, cost) in arrivals {
        clock.advance_micros(gap);
        let cost = cost.min(limit.capacity());
        let d = backend.acquire_one(&Request::new(&key, limit, cost));
        if d.allowed() {
            out.push((d.at_micros(), cost));
        }
    }
    out
}

fn arrivals(period_us: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0u64), 0..period_us / 4, 0..period_us * 2],
            1u64..=3,
        ),
        1..200,
    )
}

fn limit(algorithm: Algorithm, threshold: u64, period_us: u64) -> Limit {
    Limit::new(threshold, Duration::from_micros(period_us))
        .unwrap()
        .with_algorithm(algorithm)
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn sliding_log_never_admits_more_than_threshold_in_any_window(
        threshold in 1u64..8, period_s in 1u64..20, seq in arrivals(10_000_000)
    ) {
        let limit = limit(Algorithm::SlidingLog, threshold, period_s * 1_000_000);
        let got = admitted(&limit, &seq);
        for (i, &(t, _)) in got.iter().enumerate() {
            // Units admitted in the window (t - P, t].
            let units: u64 = got[..=i].iter().filter(|(u, _)| u + limit.period_micros() > t).map(|(_, c)| c).sum();
            prop_assert!(units <= threshold, "{} units in a window ending at {}", units, t);
        }
    }

    #[test]
    fn fixed_window_never_exceeds_threshold_per_aligned_window(
        threshold in 1u64..8, period_s in 1u64..20, seq in arrivals(10_000_000)
    ) {
        let limit = limit(Algorithm::FixedWindow, threshold, period_s * 1_000_000);
        let got = admitted(&limit, &seq);
        let mut per_window = std::collections::HashMap::new();
        for (t, c) in got {
            *per_window.entry(t / limit.period_micros()).or_insert(0) += c;
        }
        prop_assert!(per_window.values().all(|&units| units <= threshold));
    }

    #[test]
    fn gcra_and_buckets_never_exceed_burst_plus_rate_times_elapsed(
        algorithm in prop::sample::select(vec![Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket]),
        threshold in 1u64..8, burst in 1u64..10, period_s in 1u64..20, seq in arrivals(10_000_000)
    ) {
        let limit = limit(algorithm, threshold, period_s * 1_000_000).with_burst(burst).unwrap();
        let got = admitted(&limit, &seq);
        for i in 0..got.len() {
            let mut units = 0;
            for j in i..got.len() {
                units += got[j].1;
                let elapsed = got[j].0 - got[i].0;
                // burst + rate · elapsed, rate = T / P (in units per µs).
                let bound = burst as u128 + elapsed as u128 * threshold as u128 / limit.period_micros() as u128;
                prop_assert!(units as u128 <= bound, "{} units in {} µs > {}", units, elapsed, bound);
            }
        }
    }

    #[test]
    fn sliding_window_admits_at_most_twice_the_threshold_in_any_window(
        threshold in 1u64..8, seq in arrivals(10_000_000)
    ) {
        // Worst case of the weighted estimate: a whole quota at the very end of
        // the oldest slot is counted as spread over it.
        let limit = limit(Algorithm::SlidingWindow, threshold, 10_000_000);
        let got = admitted(&limit, &seq);
        for (i, &(t, _)) in got.iter().enumerate() {
            let units: u64 = got[..=i].iter().filter(|(u, _)| u + limit.period_micros() > t).map(|(_, c)| c).sum();
            prop_assert!(units < 2 * threshold || threshold == 1 && units <= 2, "{} units", units);
        }
    }

    #[test]
    fn every_algorithm_admits_the_full_quota_from_fresh_state(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()), threshold in 1u64..50
    ) {
        let limit = limit(algorithm, threshold, 60_000_000);
        let got = admitted(&limit, &vec![(0, 1); threshold as usize + 5]);
        prop_assert_eq!(got.len() as u64, threshold);
    }
}
