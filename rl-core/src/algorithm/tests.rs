//! Exact boundary behaviour of every algorithm, on a manual timeline.

use super::{Flight, Log, Meter, Slots, State, Tat, Window};
use crate::model::decision::Decision;
use crate::model::limit::{Algorithm, Limit};
use std::time::Duration;

/// Every algorithm's state, one of which a limit uses.
#[derive(Debug, Default)]
struct Cell {
    window: Window,
    log: Log,
    slots: Slots,
    meter: Meter,
    tat: Tat,
    flight: Flight,
}

impl Cell {
    fn state(&mut self, algorithm: Algorithm) -> &mut dyn Dispatch {
        match algorithm {
            Algorithm::FixedWindow => &mut self.window,
            Algorithm::SlidingLog => &mut self.log,
            Algorithm::SlidingWindow => &mut self.slots,
            Algorithm::TokenBucket | Algorithm::LeakyBucket => &mut self.meter,
            Algorithm::Gcra => &mut self.tat,
            Algorithm::InFlight => &mut self.flight,
        }
    }

    /// The state of `algorithm`, to compare two cells by.
    fn state_of(&self, algorithm: Algorithm) -> &dyn std::fmt::Debug {
        match algorithm {
            Algorithm::FixedWindow => &self.window,
            Algorithm::SlidingLog => &self.log,
            Algorithm::SlidingWindow => &self.slots,
            Algorithm::TokenBucket | Algorithm::LeakyBucket => &self.meter,
            Algorithm::Gcra => &self.tat,
            Algorithm::InFlight => &self.flight,
        }
    }

    fn expires_at(&mut self, algorithm: Algorithm) -> u64 {
        self.state(algorithm).expires()
    }

    fn log_len(&self) -> usize {
        self.log.len()
    }
}

/// [`State`] as a trait object, for the dispatch above.
trait Dispatch {
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision;
    fn admit(&mut self, limit: &Limit, now: u64, cost: u64) -> Result<(), Decision>;
    fn refund(&mut self, limit: &Limit, now: u64, cost: u64, at: u64);
    fn charge(&mut self, limit: &Limit, now: u64, units: u64);
    fn hold(&mut self, limit: &Limit, now: u64, after: u64, left: u64);
    fn expires(&self) -> u64;
}

impl<S: State> Dispatch for S {
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        State::decide(self, limit, now, cost, commit)
    }
    fn admit(&mut self, limit: &Limit, now: u64, cost: u64) -> Result<(), Decision> {
        State::admit(self, limit, now, cost)
    }
    fn refund(&mut self, limit: &Limit, now: u64, cost: u64, at: u64) {
        State::refund(self, limit, now, cost, at)
    }
    fn charge(&mut self, limit: &Limit, now: u64, units: u64) {
        State::charge(self, limit, now, units)
    }
    fn hold(&mut self, limit: &Limit, now: u64, after: u64, left: u64) {
        State::hold(self, limit, now, after, left)
    }
    fn expires(&self) -> u64 {
        State::expires_at(self)
    }
}

fn decide(limit: &Limit, cell: &mut Cell, now: u64, cost: u64, commit: bool) -> Decision {
    cell.state(limit.algorithm())
        .decide(limit, now, cost, commit)
}

fn refund(limit: &Limit, cell: &mut Cell, now: u64, cost: u64, at: u64) {
    cell.state(limit.algorithm()).refund(limit, now, cost, at)
}

const S: u64 = 1_000_000;
/// An aligned start, far from zero (window and slot boundaries at multiples of P).
const T0: u64 = 1_700_000_000 * S;

struct Timeline {
    limit: Limit,
    cell: Cell,
    now: u64,
}

impl Timeline {
    fn new(algorithm: Algorithm, threshold: u64, period_s: u64) -> Self {
        let limit = Limit::new(threshold, Duration::from_secs(period_s))
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        Self {
            limit,
            cell: Cell::default(),
            now: T0,
        }
    }

    fn with_burst(mut self, burst: u64) -> Self {
        self.limit = self.limit.with_burst(burst).unwrap();
        self
    }

    fn call(&mut self, cost: u64) -> Decision {
        decide(&self.limit, &mut self.cell, self.now, cost, true)
    }

    fn peek(&mut self, cost: u64) -> Decision {
        decide(&self.limit, &mut self.cell, self.now, cost, false)
    }

    fn at(&mut self, offset_us: u64) -> &mut Self {
        self.now = T0 + offset_us;
        self
    }

    fn refund(&mut self, cost: u64, at: u64) {
        refund(&self.limit, &mut self.cell, self.now, cost, at);
    }

    fn charge(&mut self, units: u64) {
        let algorithm = self.limit.algorithm();
        self.cell
            .state(algorithm)
            .charge(&self.limit, self.now, units);
    }

    fn hold(&mut self, after: u64, left: u64) {
        let algorithm = self.limit.algorithm();
        self.cell
            .state(algorithm)
            .hold(&self.limit, self.now, after, left);
    }

    /// Unit calls admitted from now until `horizon_us` later, each made as
    /// soon as the last refusal's `retry_after` allows.
    fn admitted_within(&mut self, horizon_us: u64) -> u64 {
        let end = self.now + horizon_us;
        let mut admitted = 0;
        while self.now < end {
            let d = decide(&self.limit, &mut self.cell, self.now, 1, true);
            if d.allowed() {
                admitted += 1;
            } else {
                self.now += us(d.retry_after()).max(1);
            }
        }
        admitted
    }
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

#[track_caller]
fn assert_allowed(d: Decision, remaining: u64, reset_after_us: u64) {
    assert!(d.allowed(), "expected allowed: {d:?}");
    assert_eq!(
        (d.remaining(), us(d.reset_after()), us(d.retry_after())),
        (remaining, reset_after_us, 0),
        "{d:?}"
    );
}

#[track_caller]
fn assert_refused(d: Decision, retry_after_us: u64) {
    assert!(!d.allowed(), "expected refused: {d:?}");
    assert_eq!(us(d.retry_after()), retry_after_us, "{d:?}");
}

// ---------- fixed window ----------

#[test]
fn fixed_window_admits_threshold_per_aligned_window_and_reopens_at_its_end() {
    let mut t = Timeline::new(Algorithm::FixedWindow, 2, 10);
    assert_allowed(t.at(0).call(1), 1, 10 * S);
    assert_allowed(t.at(3 * S).call(1), 0, 7 * S);
    let refused = t.at(4 * S).call(1);
    assert_refused(refused, 6 * S);
    assert_eq!((refused.remaining(), us(refused.reset_after())), (0, 6 * S));
    assert_refused(t.at(10 * S - 1).call(1), 1);
    assert_allowed(t.at(10 * S).call(1), 1, 10 * S);
}

#[test]
fn fixed_window_refusals_consume_nothing() {
    let mut t = Timeline::new(Algorithm::FixedWindow, 1, 10);
    t.at(0).call(1);
    for _ in 0..100 {
        assert!(!t.call(1).allowed());
    }
    assert_allowed(t.at(10 * S).call(1), 0, 10 * S);
}

#[test]
fn fixed_window_cost_counts_units_and_refund_returns_them_within_the_window() {
    let mut t = Timeline::new(Algorithm::FixedWindow, 5, 10);
    let taken = t.at(S).call(3);
    assert_allowed(taken, 2, 9 * S);
    assert_refused(t.call(3), 9 * S);
    t.refund(3, taken.at_micros());
    assert_allowed(t.call(5), 0, 9 * S);
}

#[test]
fn fixed_window_refund_of_a_previous_window_changes_nothing() {
    let mut t = Timeline::new(Algorithm::FixedWindow, 1, 10);
    let old = t.at(0).call(1);
    t.at(10 * S).call(1);
    t.refund(1, old.at_micros());
    assert_refused(t.call(1), 10 * S);
}

// ---------- sliding log ----------

#[test]
fn sliding_log_refuses_until_the_oldest_entry_leaves_the_window() {
    let mut t = Timeline::new(Algorithm::SlidingLog, 2, 10);
    assert_allowed(t.at(0).call(1), 1, 10 * S);
    assert_allowed(t.at(S).call(1), 0, 10 * S);
    let refused = t.at(2 * S).call(1);
    assert_refused(refused, 8 * S);
    assert_eq!(us(refused.reset_after()), 9 * S);
    assert_refused(t.at(10 * S - 1).call(1), 1);
    assert_allowed(t.at(10 * S).call(1), 0, 10 * S);
    assert_refused(t.call(1), S);
}

#[test]
fn sliding_log_retry_after_accounts_for_cost() {
    let mut t = Timeline::new(Algorithm::SlidingLog, 3, 10);
    t.at(0).call(1);
    t.at(S).call(1);
    t.at(2 * S).call(1);
    // cost 2 needs the two oldest entries gone: the second leaves at 11 s.
    assert_refused(t.at(3 * S).call(2), 8 * S);
    assert!(!t.at(11 * S - 1).call(2).allowed());
    assert_allowed(t.at(11 * S).call(2), 0, 10 * S);
}

#[test]
fn sliding_log_counts_calls_in_the_same_microsecond_separately() {
    let mut t = Timeline::new(Algorithm::SlidingLog, 3, 10);
    for remaining in [2, 1, 0] {
        assert_allowed(t.at(5).call(1), remaining, 10 * S);
    }
    assert!(!t.call(1).allowed());
}

#[test]
fn sliding_log_refund_removes_the_refunded_entries() {
    let mut t = Timeline::new(Algorithm::SlidingLog, 2, 10);
    t.at(0).call(1);
    let second = t.at(S).call(1);
    t.refund(1, second.at_micros());
    assert_allowed(t.at(2 * S).call(1), 0, 10 * S);
}

// ---------- sliding window counter ----------

#[test]
fn sliding_window_decays_the_oldest_slot_linearly() {
    // 10 per 10 s, 10 slots of 1 s; all 10 admitted at the start of slot 0.
    let mut t = Timeline::new(Algorithm::SlidingWindow, 10, 10);
    for _ in 0..10 {
        assert!(t.at(0).call(1).allowed());
    }
    let refused = t.call(1);
    // Slot 0 is fully inside the window until 10 s, then decays over 1 s;
    // one unit fits once 10·(1 - r) <= 9, i.e. r = 100 ms into slot 10.
    assert_refused(refused, 10 * S + 100_000);
    assert_eq!(us(refused.reset_after()), 11 * S);
    assert_refused(t.at(10 * S + 99_999).call(1), 1);
    let allowed = t.at(10 * S + 100_000).call(1);
    assert!(allowed.allowed());
    assert_eq!(allowed.remaining(), 0);
}

#[test]
fn sliding_window_counts_full_slots_inside_the_window() {
    let mut t = Timeline::new(Algorithm::SlidingWindow, 4, 10);
    t.at(0).call(2);
    t.at(5 * S).call(2);
    // At 9.5 s both slots are fully inside: 4 counted.
    let refused = t.at(9 * S + 500_000).call(1);
    // Slot 0 leaves between 10 s and 11 s: one unit fits when 2·(1 - r) <= 1 → r = 0.5 s.
    assert_refused(refused, S);
    assert_eq!(us(refused.reset_after()), 16 * S - (9 * S + 500_000));
}

#[test]
fn sliding_window_refund_returns_units_to_their_slot() {
    let mut t = Timeline::new(Algorithm::SlidingWindow, 2, 10);
    let taken = t.at(0).call(2);
    assert!(!t.call(1).allowed());
    t.refund(1, taken.at_micros());
    assert!(t.call(1).allowed());
}

// ---------- token bucket ----------

#[test]
fn token_bucket_starts_full_and_refills_fractionally() {
    // 2 per 10 s, burst 2: one token every 5 s.
    let mut t = Timeline::new(Algorithm::TokenBucket, 2, 10);
    assert_allowed(t.at(0).call(1), 1, 5 * S);
    assert_allowed(t.call(1), 0, 10 * S);
    assert_refused(t.call(1), 5 * S);
    // Slow callers still earn tokens: 4.999999 s is not enough, 5 s is.
    assert_refused(t.at(5 * S - 1).call(1), 1);
    assert_allowed(t.at(5 * S).call(1), 0, 10 * S);
}

#[test]
fn token_bucket_burst_above_threshold_admits_the_burst_then_the_rate() {
    let mut t = Timeline::new(Algorithm::TokenBucket, 1, 10).with_burst(3);
    for _ in 0..3 {
        assert!(t.at(0).call(1).allowed());
    }
    let refused = t.call(1);
    assert_refused(refused, 10 * S);
    assert_eq!(refused.limit(), 3);
    assert_eq!(us(refused.reset_after()), 30 * S);
}

#[test]
fn token_bucket_cost_and_refund() {
    let mut t = Timeline::new(Algorithm::TokenBucket, 4, 8);
    assert_allowed(t.at(0).call(3), 1, 6 * S);
    assert_refused(t.call(2), 2 * S);
    t.refund(3, 0);
    assert_allowed(t.call(4), 0, 8 * S);
}

// ---------- leaky bucket ----------

#[test]
fn leaky_bucket_drains_at_the_rate() {
    let mut t = Timeline::new(Algorithm::LeakyBucket, 2, 10);
    assert_allowed(t.at(0).call(1), 1, 5 * S);
    assert_allowed(t.call(1), 0, 10 * S);
    assert_refused(t.call(1), 5 * S);
    assert_refused(t.at(5 * S - 1).call(1), 1);
    assert_allowed(t.at(5 * S).call(1), 0, 10 * S);
    t.refund(1, 0);
    assert_allowed(t.call(1), 0, 10 * S);
}

// ---------- GCRA ----------

#[test]
fn gcra_admits_the_burst_then_one_per_emission_interval() {
    // 2 per 10 s: I = 5 s, τ = 10 s.
    let mut t = Timeline::new(Algorithm::Gcra, 2, 10);
    assert_allowed(t.at(0).call(1), 1, 5 * S);
    assert_allowed(t.call(1), 0, 10 * S);
    let refused = t.call(1);
    assert_refused(refused, 5 * S);
    assert_eq!(
        (refused.remaining(), us(refused.reset_after())),
        (0, 10 * S)
    );
    assert_refused(t.at(5 * S - 1).call(1), 1);
    assert_allowed(t.at(5 * S).call(1), 0, 10 * S);
}

#[test]
fn gcra_cost_uses_several_intervals_and_refund_gives_them_back() {
    let mut t = Timeline::new(Algorithm::Gcra, 4, 8);
    assert_allowed(t.at(0).call(3), 1, 6 * S);
    assert_refused(t.call(2), 2 * S);
    t.refund(2, 0);
    assert_allowed(t.call(2), 1, 6 * S);
}

#[test]
fn gcra_rounds_the_emission_interval_up_so_it_never_admits_faster() {
    let limit = Limit::new(3, Duration::from_secs(1)).unwrap();
    assert_eq!(limit.emission_interval_micros(), 333_334);
}

// ---------- shared laws ----------

#[test]
fn peeking_never_consumes() {
    for algorithm in Algorithm::ALL {
        let mut t = Timeline::new(algorithm, 2, 10);
        for _ in 0..5 {
            let d = t.at(0).peek(1);
            assert!(d.allowed(), "{algorithm}");
            assert_eq!(d.remaining(), 2, "{algorithm}");
            assert_eq!(d.reset_after(), Duration::ZERO, "{algorithm}");
        }
        assert!(t.call(2).allowed(), "{algorithm}");
        assert!(!t.peek(1).allowed(), "{algorithm}");
    }
}

#[test]
fn a_call_exactly_retry_after_later_is_allowed_for_every_algorithm() {
    for algorithm in Algorithm::ALL {
        let mut t = Timeline::new(algorithm, 3, 7);
        let mut now = 0;
        for step in 0..40u64 {
            now += step * 137_731 % 2_000_000;
            let d = t.at(now).call(1 + step % 2);
            if !d.allowed() {
                let wait = us(d.retry_after());
                assert!(wait > 0, "{algorithm}");
                assert!(
                    !t.at(now + wait - 1).peek(1 + step % 2).allowed(),
                    "{algorithm} at {now}: {d:?}"
                );
                now += wait;
                assert!(
                    t.at(now).call(1 + step % 2).allowed(),
                    "{algorithm} at {now}: {d:?}"
                );
            }
        }
    }
}

#[test]
fn state_expires_exactly_when_it_equals_a_fresh_one() {
    for algorithm in Algorithm::ALL {
        let mut t = Timeline::new(algorithm, 3, 7);
        t.at(123).call(2);
        let expires = t.cell.expires_at(algorithm);
        assert!(expires > T0 + 123, "{algorithm}");
        assert!(
            expires <= T0 + 123 + 8 * S,
            "{algorithm}: no longer than needed"
        );
        let fresh = decide(&t.limit, &mut Cell::default(), expires, 1, false);
        let aged = t.at(expires - T0).peek(1);
        assert_eq!(
            (aged.allowed(), aged.remaining()),
            (fresh.allowed(), fresh.remaining()),
            "{algorithm}"
        );
    }
}

// ---------- settled costs: debt ----------

#[test]
fn debt_charged_to_gcra_and_the_buckets_is_paid_unit_for_unit_by_later_calls() {
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let horizon = 80 * S;
        let baseline = Timeline::new(algorithm, 4, 8)
            .at(0)
            .admitted_within(horizon);
        for debt in [1, 3, 4, 9, 25] {
            let mut t = Timeline::new(algorithm, 4, 8);
            t.at(0).charge(debt);
            assert_eq!(
                t.admitted_within(horizon),
                baseline - debt,
                "{algorithm}: a debt of {debt}"
            );
        }
    }
}

#[test]
fn a_charge_past_the_limit_refuses_until_the_debt_has_drained() {
    // 4 per 8 s: one unit every 2 s. One unit taken, then 5 more charged:
    // 6 units in use, 2 past the capacity of 4.
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let mut t = Timeline::new(algorithm, 4, 8);
        assert!(t.at(0).call(1).allowed());
        t.charge(5);
        let refused = t.peek(1);
        assert_refused(refused, 6 * S);
        assert_eq!(refused.remaining(), 0, "{algorithm}");
        assert!(!t.at(6 * S - 1).peek(1).allowed(), "{algorithm}");
        assert!(t.at(6 * S).call(1).allowed(), "{algorithm}");
    }
}

#[test]
fn a_window_counts_its_debt_until_the_window_ends() {
    let mut t = Timeline::new(Algorithm::FixedWindow, 4, 10);
    assert!(t.at(S).call(1).allowed());
    t.charge(5);
    let refused = t.peek(1);
    assert_refused(refused, 9 * S);
    assert_eq!(refused.remaining(), 0);
    // The next window starts fresh: a window's count never outlives it.
    assert_allowed(t.at(10 * S).call(4), 0, 10 * S);

    let mut t = Timeline::new(Algorithm::SlidingWindow, 4, 10);
    assert!(t.at(0).call(1).allowed());
    t.charge(5);
    assert!(!t.peek(1).allowed());
    // Charged to the current slot, it decays out of the window as that
    // slot does.
    assert!(!t.at(10 * S).peek(1).allowed());
    assert!(t.at(11 * S).call(4).allowed());
}

#[test]
fn the_sliding_log_takes_at_most_its_threshold_of_debt_at_one_time() {
    let mut t = Timeline::new(Algorithm::SlidingLog, 4, 10);
    assert!(t.at(S).call(1).allowed());
    t.charge(100);
    assert_eq!(t.cell.log_len(), 4);
    assert_refused(t.peek(1), 10 * S);
    t.at(2 * S).charge(2);
    assert_eq!(t.cell.log_len(), 6);
    // Room for one more needs three to leave: the third oldest is at 1 s.
    assert_refused(t.at(3 * S).peek(1), 8 * S);
    assert!(t.at(12 * S).call(4).allowed());
}

#[test]
fn a_charge_creates_state_and_gives_it_a_ttl() {
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::InFlight {
            continue;
        }
        let mut t = Timeline::new(algorithm, 3, 7);
        t.at(123).charge(2);
        let expires = t.cell.expires_at(algorithm);
        assert!(expires > T0 + 123, "{algorithm}");
        assert!(!t.peek(2).allowed(), "{algorithm}: 2 of 3 charged");
        assert!(t.peek(1).allowed(), "{algorithm}: 1 of 3 left");
    }
}

#[test]
fn debt_stops_at_the_cap_where_integers_stay_exact() {
    let mut t = Timeline::new(Algorithm::Gcra, 1, 1);
    t.at(0).charge(u64::MAX);
    assert_eq!(t.cell.expires_at(Algorithm::Gcra), T0 + super::DEBT_CAP);
    let mut t = Timeline::new(Algorithm::FixedWindow, 1, 1);
    t.at(0).charge(u64::MAX);
    t.charge(u64::MAX);
    assert!(!t.peek(1).allowed());
}

#[test]
fn debt_read_under_a_longer_interval_stays_within_the_cap() {
    // 10 000 a second (I = 100 µs), as much debt as a state holds, then
    // the limit lowered to 1 a second (I = 1 s): the debt converted would
    // be 10 000 times longer; it is kept to the cap, not overflowed.
    let mut t = Timeline::new(Algorithm::Gcra, 10_000, 1);
    t.at(0).charge(u64::MAX);
    t.limit = Limit::new(1, Duration::from_secs(1)).unwrap();
    let refused = t.at(S).peek(1);
    assert!(!refused.allowed());
    assert!(us(refused.retry_after()) <= super::DEBT_CAP, "{refused:?}");
    t.hold(u64::MAX, 0);
    t.charge(u64::MAX);
    assert!(!t.peek(1).allowed());
}

#[test]
fn the_sliding_log_holds_at_most_twice_its_threshold_of_debt() {
    let mut t = Timeline::new(Algorithm::SlidingLog, 4, 10);
    for step in 0..10 {
        t.at(step).charge(4);
    }
    assert_eq!(t.cell.log_len(), 8);
}

/// `admit` (an admission without its figures) leaves every algorithm's
/// state exactly as `decide` with `commit` does, and refuses with the same
/// decision: calls of varying cost at uneven times, through a live change
/// of the limit halfway.
#[test]
fn admit_decides_and_leaves_the_state_as_a_committed_decide() {
    for algorithm in Algorithm::ALL {
        let limits = [3, 7].map(|threshold| {
            Limit::new(threshold, Duration::from_secs(10))
                .unwrap()
                .with_algorithm(algorithm)
                .unwrap()
        });
        let (mut decided, mut admitted) = (Cell::default(), Cell::default());
        let (mut now, mut refusals) = (1_700_000_000_000_000_u64, 0);
        for step in 0..200_u64 {
            let limit = &limits[usize::from(step >= 100)];
            let cost = 1 + step % 3 % limit.capacity().max(1);
            let decision = decided.state(algorithm).decide(limit, now, cost, true);
            let admission = admitted.state(algorithm).admit(limit, now, cost);
            match admission {
                Ok(()) => assert!(decision.allowed(), "{algorithm:?}, step {step}"),
                Err(refusal) => {
                    assert_eq!(refusal, decision, "{algorithm:?}, step {step}");
                    refusals += 1;
                }
            }
            assert_eq!(
                format!("{:?}", decided.state_of(algorithm)),
                format!("{:?}", admitted.state_of(algorithm)),
                "{algorithm:?}, step {step}"
            );
            now += [137_000, 1_900_000, 20, 4_100_000][step as usize % 4];
        }
        assert!(refusals > 10, "{algorithm:?}: {refusals} refusals");
    }
}

mod holds;
