//! Scaling learned limits, and what a budget learns from each answer.

use super::*;

#[test]
fn scaling_keeps_in_flight_limits_and_at_least_one_unit() {
    let stated = [
        Limit::per_minute(60_000).unwrap(),
        Limit::per_second(1_000)
            .unwrap()
            .with_algorithm(crate::Algorithm::Gcra)
            .unwrap()
            .with_burst(5_000)
            .unwrap(),
        Limit::in_flight(4).unwrap(),
    ];
    let half = scaled(&stated, SCALE_ONE / 2).unwrap();
    assert_eq!(half[0].threshold(), 30_000);
    assert_eq!((half[1].threshold(), half[1].burst()), (500, 2_500));
    assert_eq!(half[2], stated[2]);
    let tiny = scaled(&stated, 1).unwrap();
    assert_eq!((tiny[0].threshold(), tiny[1].burst()), (1, 1));
    // Rounded, not floored twice: 100 said for a threshold of 3.
    let said = (100 * SCALE_ONE) / 3;
    assert_eq!(
        scaled(&[Limit::per_minute(3).unwrap()], said).unwrap()[0].threshold(),
        100
    );
}

#[test]
fn a_lease_that_no_longer_fits_is_dropped_and_one_that_fits_is_kept() {
    let leasing = Limit::per_minute(240_000)
        .unwrap()
        .with_lease(50_000)
        .unwrap();
    let low = scaled(&[leasing], 168_070).unwrap();
    assert_eq!((low[0].threshold(), low[0].lease()), (40_337, None));
    let half = scaled(&[leasing], SCALE_ONE / 2).unwrap();
    assert_eq!(
        (half[0].threshold(), half[0].lease()),
        (120_000, Some(50_000))
    );
    // A scale the limit cannot take is an error, not a panic.
    let log = Limit::per_minute(10_000)
        .unwrap()
        .with_algorithm(crate::Algorithm::SlidingLog)
        .unwrap();
    assert!(scaled(&[log], crate::upstream::SCALE_CEILING).is_err());
}

use crate::clock::ManualClock;
use crate::{Algorithm, GroupSpec, Keys};

/// A budget of `requests` a 10 s sliding window (100 slots of 100 ms:
/// the strict upstream's shape) and `tokens` the same, on a manual clock.
fn budget(requests: u64, tokens: u64) -> (Limiter, ManualClock, CallSpec) {
    let clock = ManualClock::new(1_000_000_000);
    let limiter = Limiter::builder()
        .memory()
        .clock(clock.clone())
        .build()
        .unwrap();
    let window = |n| {
        Limit::new(n, Duration::from_secs(10))
            .and_then(|l| l.with_algorithm(Algorithm::SlidingWindow))
            .and_then(|l| l.with_slots(100))
            .unwrap()
    };
    let spec = CallSpec::owned(
        "llm",
        vec![
            GroupSpec::owned("llm_rpm", vec![window(requests)]),
            GroupSpec::owned("llm_tpm", vec![window(tokens)]).settled(),
        ],
    );
    (limiter, clock, spec)
}

fn threshold(limiter: &Limiter, name: &str) -> u64 {
    limiter.settings().limits(name).unwrap()[0].threshold()
}

fn run<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

/// `calls` calls of `tokens` each, one every `gap_ms`.
fn send(
    limiter: &Limiter,
    clock: &ManualClock,
    spec: &CallSpec,
    calls: u64,
    tokens: u64,
    gap_ms: u64,
) {
    for _ in 0..calls {
        let costs = [1, tokens];
        let keys = Keys::new(&[&"gpt", &"gpt"]).costs(&costs);
        let permit = run(limiter.call_with(spec, keys)).expect("room");
        drop(permit);
        clock.advance(Duration::from_millis(gap_ms));
    }
}

#[test]
fn a_refusal_a_burst_drew_cuts_no_lower_than_what_the_window_holds() {
    // The upstream's limit is the stated 1 000: all of them went out in
    // the window's first second, and it asks for 9 s (until they leave).
    let (limiter, clock, spec) = budget(1_000, 1_000_000);
    send(&limiter, &clock, &spec, 1_000, 10, 1);
    let refused = Hold::new().pause(Duration::from_secs(9));
    let keys = Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 10]);
    run(limiter.learn(&spec, keys, &Auto::new(), false, &refused)).unwrap();
    // 95 % of the 1 000 the window holds then (the old rule kept 10 %).
    assert_eq!(threshold(&limiter, "llm_rpm"), 950);
}

#[test]
fn a_halved_limit_is_found_from_what_the_window_holds_when_the_upstream_has_room() {
    // 100 a second for 10 s: the upstream halved to 500 and asks for 5 s
    // (until half of the window has left).
    let (limiter, clock, spec) = budget(1_000, 1_000_000);
    send(&limiter, &clock, &spec, 1_000, 10, 10);
    let refused = Hold::new().pause(Duration::from_secs(5));
    let keys = Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 10]);
    run(limiter.learn(&spec, keys, &Auto::new(), false, &refused)).unwrap();
    let learned = threshold(&limiter, "llm_rpm");
    assert!((470..=480).contains(&learned), "{learned}");
}

#[test]
fn a_group_the_refusal_was_not_about_is_not_lowered() {
    let (limiter, clock, spec) = budget(1_000, 1_000_000);
    send(&limiter, &clock, &spec, 500, 10, 10);
    // Requests ran out; 200 000 tokens are left, room for the call's 10.
    let refused = Hold::new()
        .pause(Duration::from_secs(5))
        .left(0, 0)
        .left(1, 200_000);
    let keys = Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 10]);
    run(limiter.learn(&spec, keys, &Auto::new(), false, &refused)).unwrap();
    assert!(threshold(&limiter, "llm_rpm") < 500);
    // The tokens' limit implied: 5 000 used + 200 000 left, 95 % of it.
    assert_eq!(threshold(&limiter, "llm_tpm"), 194_750);
}

#[test]
fn groups_refused_together_are_found_together() {
    // 100 requests and 1 300 tokens a second for 10 s; the upstream halved
    // both limits (500 requests, 10 000 tokens) and asks for 5 s: until the
    // requests have room. The tokens had room sooner (their 6 500 then say
    // less than their limit): they are taken as lowered alike, to half.
    let (limiter, clock, spec) = budget(1_000, 20_000);
    send(&limiter, &clock, &spec, 1_000, 13, 10);
    let refused = Hold::new()
        .pause(Duration::from_secs(5))
        .left(0, 0)
        .left(1, 0);
    let keys = Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 13]);
    run(limiter.learn(&spec, keys, &Auto::new(), false, &refused)).unwrap();
    let requests = threshold(&limiter, "llm_rpm");
    assert!((470..=480).contains(&requests), "{requests}");
    let tokens = threshold(&limiter, "llm_tpm");
    assert!((9_400..=9_600).contains(&tokens), "{tokens}");
}

#[test]
fn a_group_refused_with_another_is_never_found_above_what_it_holds() {
    // The same requests, but 500 tokens a second: refused with the
    // requests, the tokens' limit is under the 5 000 they hold now, whatever
    // the requests' share says.
    let (limiter, clock, spec) = budget(1_000, 20_000);
    send(&limiter, &clock, &spec, 1_000, 5, 10);
    let refused = Hold::new()
        .pause(Duration::from_secs(5))
        .left(0, 0)
        .left(1, 0);
    let keys = Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 5]);
    run(limiter.learn(&spec, keys, &Auto::new(), false, &refused)).unwrap();
    assert!(threshold(&limiter, "llm_rpm") < 500);
    assert_eq!(
        threshold(&limiter, "llm_tpm"),
        4_750,
        "95 % of the 5 000 held now"
    );
}

#[test]
fn what_is_left_finds_a_lower_limit_without_a_refusal() {
    let (limiter, clock, spec) = budget(1_000, 1_000_000);
    send(&limiter, &clock, &spec, 300, 10, 10);
    let said = Hold::new().left(0, 100);
    let keys = Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 10]);
    run(limiter.learn(&spec, keys, &Auto::new(), true, &said)).unwrap();
    assert_eq!(threshold(&limiter, "llm_rpm"), 380, "95 % of 300 + 100");
}

#[test]
fn a_pause_past_the_period_keeps_the_usual_share() {
    let (limiter, clock, spec) = budget(1_000, 1_000_000);
    send(&limiter, &clock, &spec, 10, 10, 10);
    let refused = Hold::new().pause(Duration::from_secs(3_600));
    let keys = Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 10]);
    run(limiter.learn(&spec, keys, &Auto::new(), false, &refused)).unwrap();
    assert_eq!(threshold(&limiter, "llm_rpm"), 700);
}

#[test]
fn shares_outside_their_range_are_refused() {
    assert!(Auto::new().keep(0.0).is_err());
    assert!(Auto::new().keep(1.5).is_err());
    assert!(Auto::new().raise(f64::NAN).is_err());
    assert!(Auto::new().raise(0.0).is_ok());
    assert!(Auto::new().margin(-0.1).is_err());
    assert!(Auto::new().floor(0.05).is_ok());
    assert!(Auto::new().headroom(0.0).is_err());
    assert!(Auto::new().approach(0.0).is_ok());
}
