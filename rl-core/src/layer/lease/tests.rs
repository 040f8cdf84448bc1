use super::*;

fn decision(at: u64, remaining: u64, reset_after_us: u64) -> Decision {
    Decision::new(Figures {
        allowed: true,
        limit: 1_000,
        remaining,
        retry_after_us: 0,
        reset_after_us,
        at_micros: at,
    })
}

#[test]
fn gcra_units_expire_one_interval_apart_from_the_last_one_down() {
    // 1 000 per second: one unit per ms; the take left the TAT 10 ms ahead.
    let limit = Limit::per_second(1_000).unwrap().with_lease(100).unwrap();
    let timing = Timing::new(Duration::from_secs(1));
    let held = Lease::new(&limit, &decision(5_000_000, 990, 10_000), 9, 9, 0, &timing);
    assert_eq!(held.valid(0), 9);
    // The lowest of the 9 units is due 8 intervals before the last one
    // (at 10 ms - 1 µs): from 2 ms on it has expired, and so on.
    assert_eq!(held.valid(1_999_000), 9);
    assert_eq!(held.valid(2_000_000), 8);
    assert_eq!(held.valid(9_999_000), 1);
    assert_eq!(held.valid(10_000_000), 0);
}

#[test]
fn window_units_last_until_the_window_or_the_ttl_ends() {
    let limit = Limit::per_minute(1_000)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .and_then(|l| l.with_lease(100))
        .unwrap();
    let timing = Timing::new(Duration::from_secs(1));
    // 0.5 s left in the window.
    let held = Lease::new(
        &limit,
        &decision(59_500_000, 900, 500_000),
        50,
        50,
        0,
        &timing,
    );
    assert_eq!(held.usable(499_999_999), 50);
    assert_eq!(held.valid(500_000_001), 0);
    // 30 s left: the TTL ends local use first; the units stay valid to
    // give back.
    let held = Lease::new(
        &limit,
        &decision(30_000_000, 900, 30_000_000),
        50,
        50,
        0,
        &timing,
    );
    assert_eq!(held.usable(999_999_999), 50);
    assert_eq!(held.usable(1_000_000_000), 0);
    assert_eq!(held.valid(1_000_000_000), 50);
}

#[test]
fn sliding_window_units_last_until_the_end_of_their_slot() {
    let limit = Limit::per_second(1_000)
        .and_then(|l| l.with_algorithm(Algorithm::SlidingWindow))
        .and_then(|l| l.with_lease(100))
        .unwrap();
    let timing = Timing::new(Duration::from_secs(1));
    // Slots of 100 ms; the take was 30 ms into one.
    let held = Lease::new(
        &limit,
        &decision(1_030_000, 900, 1_000_000),
        50,
        50,
        0,
        &timing,
    );
    assert_eq!(held.valid(69_999_999), 50);
    assert_eq!(held.valid(70_000_001), 0);
}

#[test]
fn a_cold_identity_asks_for_nothing_and_a_hot_one_for_its_rate_within_bounds() {
    let timing = Timing::new(Duration::from_secs(1));
    let limit = Limit::per_minute(1_000_000)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .and_then(|l| l.with_lease(5_000))
        .unwrap();
    let key = Key::new("rl", "api", "t");
    let target = Target {
        name: "api",
        key: KeyRef::of(&key),
        limit: &limit,
        cost: 1,
        slot: None,
        lease: 0,
    };
    let mut entry = Watched::new(&target, 0);
    // 10 calls a second: cold.
    for i in 1..=20 {
        entry.seen(i * 100_000_000, 1);
    }
    assert_eq!(entry.want(2_000_000_000, &timing, &limit), 0);
    // 1 000 a second: a tenth of a second's worth.
    for i in 0..1_000 {
        entry.seen(3_000_000_000 + i * 1_000_000, 1);
    }
    let want = entry.want(4_000_000_000, &timing, &limit);
    assert!((80..=120).contains(&want), "{want}");
    // 1 000 000 a second: the configured most.
    for i in 0..10_000 {
        entry.seen(5_000_000_000 + i * 1_000, 1);
    }
    assert_eq!(entry.want(5_100_000_000, &timing, &limit), 5_000);
    // GCRA: at most the TTL's worth of refill (16 666 at 1 000 000/min).
    let gcra = Limit::per_minute(1_000_000)
        .and_then(|l| l.with_lease(100_000))
        .unwrap();
    assert_eq!(entry.want(5_100_000_000, &timing, &gcra), 16_666);
}
