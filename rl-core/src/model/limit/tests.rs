//! The unit tests of `Limit`'s constructors, bounds and text forms.

use super::*;

#[test]
fn zero_values_are_refused_with_the_bad_value_named() {
    assert_eq!(
        Limit::new(0, Duration::from_secs(1)),
        Err(LimitError::ZeroThreshold)
    );
    assert_eq!(Limit::new(1, Duration::ZERO), Err(LimitError::ZeroPeriod));
    assert_eq!(
        Limit::per_second(1).unwrap().with_burst(0),
        Err(LimitError::ZeroBurst)
    );
    assert_eq!(
        Limit::per_second(1).unwrap().with_slots(0),
        Err(LimitError::ZeroSlots)
    );
}

#[test]
fn sliding_log_above_the_cap_suggests_the_sliding_window_counter() {
    let err = Limit::per_minute(20_000)
        .unwrap()
        .with_algorithm(Algorithm::SlidingLog)
        .unwrap_err();
    assert!(err.to_string().contains("sliding-window counter"), "{err}");
}

#[test]
fn values_beyond_exact_integer_range_are_refused() {
    let err = Limit::new(u64::MAX / 2, Duration::from_secs(86_400)).unwrap_err();
    assert!(matches!(err, LimitError::TooLarge { .. }));
}

#[test]
fn sliding_window_period_must_split_into_equal_slots() {
    let limit = Limit::new(10, Duration::from_micros(1_001)).unwrap();
    assert!(matches!(
        limit.with_algorithm(Algorithm::SlidingWindow),
        Err(LimitError::UnevenSlots {
            period_us: 1_001,
            slots: 10
        })
    ));
}

#[test]
fn cost_above_capacity_is_an_error_not_a_forever_reject() {
    let limit = Limit::per_minute(5).unwrap();
    assert!(limit.check_cost(5).is_ok());
    assert_eq!(
        limit.check_cost(6),
        Err(LimitError::CostExceedsCapacity {
            cost: 6,
            capacity: 5
        })
    );
    assert_eq!(limit.check_cost(0), Err(LimitError::ZeroCost));
}

#[test]
fn limits_on_one_key_must_not_share_algorithm_and_period() {
    let hour = |t| Limit::per_hour(t).unwrap();
    assert!(
        Limit::check_distinct(&[
            Limit::per_minute(1).unwrap(),
            hour(5),
            Limit::per_day(10).unwrap()
        ])
        .is_ok()
    );
    let err = Limit::check_distinct(&[hour(5), hour(10)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "limits 5/1h (gcra) and 10/1h (gcra) share an algorithm and period on one key; keep one"
    );
    let windows = hour(5).with_algorithm(Algorithm::SlidingWindow).unwrap();
    assert!(Limit::check_distinct(&[windows, windows.with_slots(20).unwrap()]).is_ok());
    assert_ne!(
        windows.storage_suffix(),
        windows.with_slots(20).unwrap().storage_suffix()
    );
}

#[test]
fn rates_parse_from_text() {
    assert_eq!(
        "5/1h".parse::<Limit>().unwrap(),
        Limit::per_hour(5).unwrap()
    );
    assert_eq!(
        "10/d".parse::<Limit>().unwrap(),
        Limit::per_day(10).unwrap()
    );
    assert_eq!(
        "3/500ms".parse::<Limit>().unwrap(),
        Limit::new(3, Duration::from_millis(500)).unwrap()
    );
    assert_eq!(
        "5 per hour".parse::<Limit>().unwrap(),
        Limit::per_hour(5).unwrap()
    );
    assert_eq!(
        "10/minute".parse::<Limit>().unwrap(),
        Limit::per_minute(10).unwrap()
    );
    assert!(matches!(
        "5 every hour".parse::<Limit>(),
        Err(LimitError::BadRate(_))
    ));
    assert!(matches!(
        "0/1h".parse::<Limit>(),
        Err(LimitError::ZeroThreshold)
    ));
}

#[test]
fn durations_parse_with_units_and_reject_garbage() {
    assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
    assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
    assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86_400));
    assert!(parse_duration("1w").is_err());
    assert!(parse_duration("").is_err());
    assert!(parse_duration("99999999999999999999d").is_err());
}

#[test]
fn display_round_trips_the_rate() {
    assert_eq!(Limit::per_hour(5).unwrap().to_string(), "5/1h (gcra)");
    let leasing = Limit::per_hour(5).unwrap().with_lease(2).unwrap();
    assert_eq!(leasing.to_string(), "5/1h (gcra, lease 2)");
}

#[test]
fn a_lease_survives_changes_that_keep_it_valid_and_fails_the_others() {
    let limit = Limit::per_minute(100).unwrap().with_lease(10).unwrap();
    assert_eq!(limit.with_threshold(50).unwrap().lease(), Some(10));
    assert_eq!(limit.with_burst(20).unwrap().lease(), Some(10));
    assert_eq!(
        limit.with_burst(10),
        Err(LimitError::Lease(LeaseProblem::TooLarge {
            lease: 10,
            capacity: 10,
            burst: true
        }))
    );
    assert!(matches!(
        limit.with_algorithm(Algorithm::SlidingLog),
        Err(LimitError::Lease(LeaseProblem::Algorithm(_)))
    ));
    assert_eq!(limit.without_lease().lease(), None);
    assert_eq!(limit.state_id(), limit.without_lease().state_id());
    assert_eq!(
        Limit::per_minute(5).unwrap().with_lease(0),
        Err(LimitError::Lease(LeaseProblem::Zero))
    );
}
