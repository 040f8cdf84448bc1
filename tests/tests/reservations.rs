//! Reservations of waiting calls in the in-memory store (the reference the
//! Redis scripts are held to by the differential tests): each waiting call
//! gets the earliest slot every limit allows, later calls (waiting or not)
//! see reserved slots as taken, a cancelled slot goes to the next caller
//! that can use it, and whatever the order of reservations, cancellations,
//! plain calls and time, the calls admitted (each at its slot) are a
//! sequence each limit alone would have admitted.

use std::time::Duration;

use proptest::prelude::*;
use ratewall::{
    Algorithm, Decision, Key, Limit,
    backend::{Backend, MemoryBackend, Request, Reservation},
    clock::ManualClock,
    error::BackendError,
};

#[path = "../../rl-core/tests/support/ledger.rs"]
mod ledger;
use ledger::Ledger;

const T0: u64 = 1_700_000_000_000_000;
const MS: u64 = 1_000;

fn limit(algorithm: Algorithm, per_second: u64, burst: u64) -> Limit {
    Limit::per_second(per_second)
        .and_then(|l| l.with_algorithm(algorithm))
        .and_then(|l| l.with_burst(burst))
        .unwrap()
}

const QUEUEING: [Algorithm; 3] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
];

fn slot(reservation: &Reservation) -> u64 {
    reservation.slot_micros().expect("reserved")
}

#[test]
fn waiting_calls_queue_one_emission_interval_apart_after_the_burst() {
    for algorithm in QUEUEING {
        let store = MemoryBackend::with_clock(ManualClock::new(T0));
        let limit = limit(algorithm, 10, 2);
        let key = Key::new("rl", "jobs", "a");
        let req = [Request::new(&key, &limit, 1)];
        let slots: Vec<u64> = (0..5)
            .map(|_| slot(&store.reserve_sync(&req, 10_000 * MS)) - T0)
            .collect();
        assert_eq!(slots, [0, 0, 100 * MS, 200 * MS, 300 * MS], "{algorithm:?}");
    }
}

#[test]
fn a_slot_beyond_the_longest_wait_is_refused_at_once_and_reserves_nothing() {
    for algorithm in QUEUEING {
        let store = MemoryBackend::with_clock(ManualClock::new(T0));
        let limit = limit(algorithm, 10, 1);
        let key = Key::new("rl", "jobs", "a");
        let req = [Request::new(&key, &limit, 1)];
        assert_eq!(slot(&store.reserve_sync(&req, 150 * MS)), T0);
        assert_eq!(slot(&store.reserve_sync(&req, 150 * MS)), T0 + 100 * MS);
        let before = store.peek_sync(&req);
        let refused = store.reserve_sync(&req, 150 * MS);
        assert!(!refused.allowed() && refused.slot_micros().is_none());
        assert_eq!(refused.wait(), Duration::ZERO);
        // The usual refusal: the time until this call alone would pass.
        assert_eq!(
            refused.decisions().binding().retry_after(),
            Duration::from_millis(200),
            "{algorithm:?}"
        );
        assert_eq!(store.peek_sync(&req), before, "{algorithm:?}");
    }
}

#[test]
fn calls_that_do_not_wait_see_reserved_slots_as_taken() {
    for algorithm in QUEUEING {
        let clock = ManualClock::new(T0);
        let store = MemoryBackend::with_clock(clock.clone());
        let limit = limit(algorithm, 10, 1);
        let key = Key::new("rl", "jobs", "a");
        let req = [Request::new(&key, &limit, 1)];
        for _ in 0..4 {
            store.reserve_sync(&req, 10_000 * MS); // slots 0, 100, 200, 300 ms
        }
        clock.advance(Duration::from_millis(150));
        let refused = store.acquire_sync(&req);
        assert!(!refused.allowed(), "{algorithm:?}");
        assert_eq!(
            refused.binding().retry_after(),
            Duration::from_millis(250),
            "{algorithm:?}: free after the slot at 300 ms"
        );
        clock.advance(Duration::from_millis(250));
        assert!(store.acquire_sync(&req).allowed(), "{algorithm:?}");
    }
}

#[test]
fn a_cancelled_last_slot_goes_to_the_next_caller_exactly() {
    for algorithm in QUEUEING {
        let store = MemoryBackend::with_clock(ManualClock::new(T0));
        let limit = limit(algorithm, 10, 1);
        let key = Key::new("rl", "jobs", "a");
        let req = [Request::new(&key, &limit, 1)];
        store.reserve_sync(&req, 10_000 * MS);
        let dropped = store.reserve_sync(&req, 10_000 * MS);
        assert_eq!(slot(&dropped), T0 + 100 * MS);
        store.cancel_sync(&req, &dropped);
        let next = store.reserve_sync(&req, 10_000 * MS);
        assert_eq!(slot(&next), T0 + 100 * MS, "{algorithm:?}");
        assert!(!next.took_freed_slot(0), "the state itself went back");
        assert_eq!(slot(&store.reserve_sync(&req, 10_000 * MS)), T0 + 200 * MS);
    }
}

#[test]
fn a_cancelled_slot_inside_the_queue_goes_to_the_next_caller_exactly() {
    for algorithm in QUEUEING {
        let store = MemoryBackend::with_clock(ManualClock::new(T0));
        let limit = limit(algorithm, 10, 1);
        let key = Key::new("rl", "jobs", "a");
        let req = [Request::new(&key, &limit, 1)];
        let held: Vec<Reservation> = (0..4)
            .map(|_| store.reserve_sync(&req, 10_000 * MS))
            .collect();
        store.cancel_sync(&req, &held[1]); // the slot at 100 ms, with 200 and 300 ms behind it
        let next = store.reserve_sync(&req, 10_000 * MS);
        assert_eq!(slot(&next), T0 + 100 * MS, "{algorithm:?}");
        assert!(next.took_freed_slot(0));
        assert_eq!(
            slot(&store.reserve_sync(&req, 10_000 * MS)),
            T0 + 400 * MS,
            "{algorithm:?}: then the queue's next slot"
        );
        // Given back again, it is taken again.
        store.cancel_sync(&req, &next);
        assert_eq!(slot(&store.reserve_sync(&req, 10_000 * MS)), T0 + 100 * MS);
    }
}

#[test]
fn a_cancelled_slot_that_has_passed_is_not_handed_out() {
    let clock = ManualClock::new(T0);
    let store = MemoryBackend::with_clock(clock.clone());
    let limit = limit(Algorithm::LeakyBucket, 10, 1);
    let key = Key::new("rl", "jobs", "a");
    let req = [Request::new(&key, &limit, 1)];
    let held: Vec<Reservation> = (0..3)
        .map(|_| store.reserve_sync(&req, 10_000 * MS))
        .collect();
    store.cancel_sync(&req, &held[1]);
    clock.advance(Duration::from_millis(150));
    assert_eq!(slot(&store.reserve_sync(&req, 10_000 * MS)), T0 + 300 * MS);
}

#[test]
fn a_call_over_several_limits_is_committed_on_all_at_the_latest_earliest_time() {
    let clock = ManualClock::new(T0);
    let store = MemoryBackend::with_clock(clock.clone());
    let fast = limit(Algorithm::LeakyBucket, 10, 1); // one per 100 ms
    let slow = limit(Algorithm::Gcra, 2, 1); // one per 500 ms
    let (user, ip) = (Key::new("rl", "user", "u"), Key::new("rl", "ip", "i"));
    let both = [Request::new(&user, &fast, 1), Request::new(&ip, &slow, 1)];
    let slots: Vec<u64> = (0..3)
        .map(|_| slot(&store.reserve_sync(&both, 10_000 * MS)) - T0)
        .collect();
    assert_eq!(slots, [0, 500 * MS, 1_000 * MS]);
    // The fast limit was committed as of 1 s too: a call on it alone finds
    // its next slot after that, not at 100 ms.
    let alone = [Request::new(&user, &fast, 1)];
    assert_eq!(
        slot(&store.reserve_sync(&alone, 10_000 * MS)),
        T0 + 1_100 * MS
    );
    let reserved = store.reserve_sync(&both, 10_000 * MS);
    assert!(
        reserved
            .decisions()
            .iter()
            .all(|d| d.at_micros() == slot(&reserved))
    );
}

#[test]
fn only_gcra_and_the_buckets_reserve() {
    let store = MemoryBackend::new();
    let key = Key::new("rl", "jobs", "a");
    let window = Limit::per_second(5)
        .unwrap()
        .with_algorithm(Algorithm::SlidingLog)
        .unwrap();
    let req = [Request::new(&key, &window, 1)];
    let refused = futures_lite(store.reserve(&req, Duration::from_secs(1)));
    assert!(
        matches!(refused, Err(BackendError::Invalid(_))),
        "{refused:?}"
    );
}

#[test]
fn an_in_flight_limit_is_never_reserved_and_a_refusal_changes_nothing() {
    let store = MemoryBackend::with_clock(ManualClock::new(T0));
    let key = Key::new("rl", "jobs", "a");
    let rate = limit(Algorithm::Gcra, 10, 1);
    let slots = Limit::in_flight(2).unwrap();
    let req = [Request::new(&key, &rate, 1), Request::new(&key, &slots, 1)];
    let refused = futures_lite(store.reserve(&req, Duration::from_secs(1)));
    assert!(
        matches!(&refused, Err(BackendError::Invalid(e)) if e.to_string().contains("in-flight")),
        "{refused:?}"
    );
    assert!(Request::check_reservation(&req).is_err());
    // Unvalidated, the store refuses it all the same and writes nothing.
    let unchecked = store.reserve_sync(&req, 1_000_000);
    assert!(!unchecked.allowed() && unchecked.slot_micros().is_none());
    let rate_only = [Request::new(&key, &rate, 1)];
    assert_eq!(slot(&store.reserve_sync(&rate_only, 1_000_000)), T0);
}

/// Polls a future that is ready at once (the memory store's).
fn futures_lite<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("the memory store answers at once"),
    }
}

// ---- the law: whatever happens, admitted calls conform to every limit ----

#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    /// Reserve over the chosen limits, waiting at most this many ms.
    Reserve(Vec<usize>, u64, u64),
    /// Cancel the n-th held reservation (modulo how many are held).
    Cancel(usize),
    /// A call that does not wait.
    Acquire(Vec<usize>, u64),
}

fn step(limits: usize) -> impl Strategy<Value = Step> {
    let chosen = move || prop::sample::subsequence((0..limits).collect::<Vec<_>>(), 1..=limits);
    prop_oneof![
        3 => (0u64..400).prop_map(Step::Advance),
        6 => (chosen(), 1u64..=2, 0u64..3_000).prop_map(|(l, c, w)| Step::Reserve(l, c, w)),
        2 => (0usize..64).prop_map(Step::Cancel),
        2 => (chosen(), 1u64..=2).prop_map(|(l, c)| Step::Acquire(l, c)),
    ]
}

fn limits() -> impl Strategy<Value = Vec<Limit>> {
    prop::collection::vec(
        (prop::sample::select(QUEUEING.to_vec()), 1u64..=8, 2u64..=4),
        1..=3,
    )
    .prop_map(|specs| {
        specs
            .into_iter()
            .map(|(algorithm, per_second, burst)| limit(algorithm, per_second, burst))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn admitted_calls_each_at_its_slot_conform_to_every_limit(
        (limits, steps) in limits().prop_flat_map(|l| {
            let n = l.len();
            (Just(l), prop::collection::vec(step(n), 1..60))
        })
    ) {
        let clock = ManualClock::new(T0);
        let store = MemoryBackend::with_clock(clock.clone());
        // Each limit on its own identity (the call spans several keys).
        let keys: Vec<Key> = (0..limits.len()).map(|i| Key::new("rl", "law", &format!("k{i}"))).collect();
        let requests = |chosen: &[usize], cost: u64| -> Vec<Request<'_>> {
            chosen.iter().map(|&i| Request::new(&keys[i], &limits[i], cost)).collect()
        };
        // (limit, time, cost) of every admission still standing.
        let mut held: Vec<(Vec<usize>, u64, Reservation)> = Vec::new();
        let mut admitted: Vec<(usize, u64, u64)> = Vec::new();
        for step in &steps {
            match step {
                Step::Advance(ms) => clock.advance(Duration::from_millis(*ms)),
                Step::Reserve(chosen, cost, wait_ms) => {
                    let reservation = store.reserve_sync(&requests(chosen, *cost), wait_ms * MS);
                    if let Some(slot) = reservation.slot_micros() {
                        prop_assert!(slot - reservation.now_micros() <= wait_ms * MS);
                        held.push((chosen.clone(), *cost, reservation));
                    } else {
                        prop_assert!(!reservation.allowed());
                        let _ = slot;
                    }
                }
                Step::Cancel(n) => {
                    if !held.is_empty() {
                        let (chosen, cost, reservation) = held.remove(n % held.len());
                        store.cancel_sync(&requests(&chosen, cost), &reservation);
                    }
                }
                Step::Acquire(chosen, cost) => {
                    let decisions = store.acquire_sync(&requests(chosen, *cost));
                    if decisions.allowed() {
                        let now = decisions[0].at_micros();
                        admitted.extend(chosen.iter().map(|&i| (i, now, *cost)));
                    }
                }
            }
        }
        for (chosen, cost, reservation) in &held {
            let slot = reservation.slot_micros().unwrap();
            admitted.extend(chosen.iter().map(|&i| (i, slot, *cost)));
        }
        // Replay each limit's admissions, in time order, on a fresh store.
        for (i, limit) in limits.iter().enumerate() {
            let mut times: Vec<(u64, u64)> = admitted.iter().filter(|a| a.0 == i).map(|a| (a.1, a.2)).collect();
            times.sort_unstable();
            let replay_clock = ManualClock::new(T0);
            let replay = MemoryBackend::with_clock(replay_clock.clone());
            for (at, cost) in times {
                replay_clock.set_micros(at);
                let decision: Decision = replay.acquire_one(&Request::new(&keys[i], limit, cost));
                prop_assert!(decision.allowed(), "limit {i} ({limit}) admitted a call at +{} µs it alone would refuse", at - T0);
            }
        }
    }
}

// ---- metrics ----

#[test]
fn waits_are_recorded_and_a_slot_given_back_is_counted() {
    use ratewall::{CallSpec, GroupSpec, Limiter};
    let ledger = Ledger::default();
    let _guard = metrics::set_default_local_recorder(&ledger);
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder().clock(clock).prefix("m").build().unwrap();
    let spec = CallSpec::owned(
        "metered",
        vec![GroupSpec::owned(
            "metered",
            vec![limit(Algorithm::LeakyBucket, 10, 1)],
        )],
    )
    .with_wait(Duration::from_secs(1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert_eq!(
            limiter.call(&spec, &[&"q"]).await.unwrap().waited(),
            Duration::ZERO
        );
        assert_eq!(
            limiter.call(&spec, &[&"q"]).await.unwrap().waited(),
            Duration::from_millis(100)
        );
        // Reserved (200 ms) and dropped before its slot: given back.
        drop(limiter.call(&spec, &[&"q"]));
        // Too far for a 50 ms wait: refused at once.
        assert!(
            limiter
                .call_with(
                    &spec,
                    ratewall::Keys::new(&[&"q"]).wait(Duration::from_millis(50))
                )
                .await
                .is_err()
        );
    });
    assert_eq!(
        ledger.histogram("ratewall_wait_seconds", &[("limit", "metered")]),
        [0.0, 0.1]
    );
    assert_eq!(
        ledger.counter(
            "ratewall_operations_total",
            &[("limit", "metered"), ("op", "cancel"), ("result", "ok")]
        ),
        1
    );
    let decisions = |outcome| {
        ledger.counter(
            "ratewall_decisions_total",
            &[
                ("limit", "metered"),
                ("outcome", outcome),
                ("source", "backend"),
            ],
        )
    };
    assert_eq!(decisions("allowed"), 3);
    assert_eq!(decisions("rejected"), 1);
}
