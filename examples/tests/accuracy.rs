//! The worst cases and rates that `docs/accuracy.md` publishes, held exactly
//! on small deterministic schedules (the simulation itself is
//! `cargo run --release -p ratewall-examples --example accuracy`).

use ratewall::Algorithm;
use ratewall_examples::accuracy::{
    Adversary, Arrivals, ORIGIN, Run, adversarial_worst, judge, limit, max_in_window,
    saturating_rate,
};

const P: u64 = 1_000_000;

#[test]
fn adversaries_reach_each_algorithms_worst_case_in_a_window_of_length_p() {
    let t = 10;
    let worst = |algorithm, burst, slots| adversarial_worst(limit(algorithm, t, P, burst, slots));
    assert_eq!(
        worst(Algorithm::FixedWindow, t, 10),
        (2 * t, Adversary::WindowEdge, 2 * t)
    );
    // Exactly T in [t, t + P); the closed [t, t + P] holds the whole log
    // again at its last microsecond.
    assert_eq!(
        worst(Algorithm::SlidingLog, t, 10),
        (t, Adversary::Greedy, 2 * t)
    );
    for slots in [2, 10, 100] {
        // A quota in the last microsecond of a slot, and T - 1 more in the
        // last-but-one microsecond before it leaves the window.
        let (open, _, closed) = worst(Algorithm::SlidingWindow, t, slots);
        assert_eq!((open, closed), (2 * t - 1, 2 * t - 1), "{slots} slots");
    }
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        for burst in [1, t, 3 * t] {
            assert_eq!(
                worst(algorithm, burst, 10),
                (burst + t - 1, Adversary::Greedy, burst + t),
                "{algorithm} burst {burst}"
            );
        }
    }
}

#[test]
fn the_saturating_client_is_admitted_exactly_when_a_client_polling_every_microsecond_is() {
    let period = 2_000;
    for algorithm in Algorithm::ALL {
        for (t, slots) in [(1, 4), (3, 4), (5, 10)] {
            let limit = limit(algorithm, t, period, t, slots);
            let mut greedy = Run::new(limit);
            greedy.greedy(ORIGIN, ORIGIN + 6 * period);
            let mut poller = Run::new(limit);
            for at in ORIGIN..ORIGIN + 6 * period {
                while poller.call(at).allowed() {}
            }
            assert_eq!(
                greedy.admitted(),
                poller.admitted(),
                "{algorithm} T={t} N={slots}"
            );
            assert_eq!(greedy.loose_retry_after(), 0, "{algorithm} T={t} N={slots}");
        }
    }
}

#[test]
fn sliding_window_gives_a_saturating_client_one_unit_per_slot_count_plus_one_slots_when_t_is_1() {
    for slots in [1, 2, 10] {
        let mut run = Run::new(limit(Algorithm::SlidingWindow, 1, P, 1, slots));
        run.greedy(ORIGIN, ORIGIN + 20 * P);
        let gaps: Vec<u64> = run.admitted().windows(2).map(|w| w[1] - w[0]).collect();
        let slot = P / slots;
        assert!(
            gaps.iter().all(|&gap| gap == (slots + 1) * slot),
            "{slots} slots: {gaps:?}"
        );
    }
}

#[test]
fn sliding_window_under_admits_a_saturating_client_by_min_t_over_n_plus_1_and_one_unit() {
    // Per period: T·N/(N+1) when T <= N + 1, T - 1 above; over 400
    // periods, give or take the start (at most N + 1 units in all).
    let periods = 400;
    for (t, slots) in [(1, 10), (5, 10), (10, 10), (20, 10), (3, 1), (100, 2)] {
        let (rate, loose) =
            saturating_rate(limit(Algorithm::SlidingWindow, t, P, t, slots), periods);
        let expected = (t as f64 * slots as f64 / (slots + 1) as f64).max((t - 1) as f64);
        let excess = (rate - expected) * periods as f64;
        assert!(
            (-1.0..=(slots + 1) as f64).contains(&excess),
            "T={t} N={slots}: {rate} vs {expected}"
        );
        assert_eq!(loose, 0);
    }
}

#[test]
fn every_other_algorithm_gives_a_saturating_client_exactly_t_per_period() {
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::SlidingWindow {
            continue;
        }
        for t in [1, 7, 100] {
            let (rate, _) = saturating_rate(limit(algorithm, t, P, t, 10), 50);
            assert_eq!(rate, t as f64, "{algorithm} T={t}");
        }
    }
}

#[test]
fn the_judge_finds_no_wrong_decision_in_the_sliding_log_and_some_in_every_approximation() {
    let t = 10;
    let times = Arrivals::Poisson.times(2.0 * t as f64 / P as f64, 300 * P, 7);
    for algorithm in Algorithm::ALL {
        let tally = judge(limit(algorithm, t, P, t, 10), &times);
        assert_eq!(tally.calls, times.len() as u64);
        if algorithm == Algorithm::SlidingLog {
            assert_eq!((tally.over, tally.under, tally.worst_window), (0, 0, t));
        } else {
            assert!(tally.over + tally.under > 0, "{algorithm}");
        }
    }
}

#[test]
fn max_in_window_counts_half_open_and_closed_windows() {
    let times = [0, 0, 5, 10, 10, 19];
    assert_eq!(max_in_window(&times, 10, false), 3); // [0, 10): 0, 0, 5
    assert_eq!(max_in_window(&times, 10, true), 5); // [0, 10]
    assert_eq!(max_in_window(&[], 10, false), 0);
}
