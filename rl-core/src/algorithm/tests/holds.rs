//! Holds (an upstream's word): pauses and remaining counts, on every
//! algorithm.

use super::*;

#[test]
fn a_pause_refuses_until_it_ends_then_gcra_and_the_buckets_resume_at_their_rate() {
    // 4 per 8 s: one unit every 2 s.
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let mut t = Timeline::new(algorithm, 4, 8);
        t.at(0).hold(5 * S, 0);
        assert!(!t.peek(1).allowed(), "{algorithm}");
        assert!(
            !t.at(5 * S).peek(1).allowed(),
            "{algorithm}: none left at the pause's end"
        );
        // The first call passes just after it; then one per emission.
        assert!(t.at(5 * S + 1).call(1).allowed(), "{algorithm}");
        assert!(!t.peek(1).allowed(), "{algorithm}: no burst after a pause");
        assert!(t.at(7 * S + 1).call(1).allowed(), "{algorithm}");
    }
}

#[test]
fn a_remaining_count_lowers_what_is_left_and_never_raises_it() {
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::InFlight {
            continue;
        }
        let mut t = Timeline::new(algorithm, 10, 60);
        t.at(0).hold(0, 3);
        assert_eq!(t.peek(1).remaining(), 3, "{algorithm}");
        // Saying more is left changes nothing.
        t.hold(0, 8);
        assert_eq!(t.peek(1).remaining(), 3, "{algorithm}");
        assert!(t.call(3).allowed(), "{algorithm}");
        assert!(!t.peek(1).allowed(), "{algorithm}");
        // Nothing said of a fresh state above its capacity.
        let mut fresh = Timeline::new(algorithm, 10, 60);
        fresh.at(0).hold(0, 10);
        assert_eq!(fresh.peek(1).remaining(), 10, "{algorithm}");
    }
}

/// The six rate algorithms (an in-flight limit has no rate to pause).
const RATES: [Algorithm; 6] = [
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
];

/// The algorithms a pause ends for at exactly its end (`until`): GCRA and
/// the buckets hold `until` itself too, and pass from `until + 1`.
fn ends_exactly(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog
    )
}

/// Times to try inside `[from, until)`: its ends, every slot and window
/// boundary in it (and the µs either side), and a time every 0.37 s.
fn inside(from: u64, until: u64, slot: u64) -> Vec<u64> {
    let mut times = vec![from, from + 1, until - 1];
    let mut boundary = (from / slot + 1) * slot;
    while boundary < until {
        times.extend([boundary - 1, boundary, boundary + 1]);
        boundary += slot;
    }
    times.extend((from..until).step_by(370_000));
    times.retain(|&t| t >= from && t < until);
    times
}

#[test]
fn a_pause_refuses_every_call_until_it_ends_then_resumes() {
    // 4 per 10 s (10 slots of 1 s); one unit taken just before the pause.
    // Pauses from the start of a window, inside one and just before its
    // end; shorter than, as long as and longer than the period, crossing
    // one boundary or several.
    for algorithm in RATES {
        for start in [0, 3 * S + 123, 10 * S - 500_000] {
            for pause in [1, 2 * S, 10 * S, 25 * S + 7] {
                let what = format!("{algorithm}, pause of {pause} µs at {start}");
                let mut t = Timeline::new(algorithm, 4, 10);
                assert!(t.at(start).call(1).allowed(), "{what}");
                t.hold(pause, 0);
                let until = start + pause;
                for now in inside(start, until, S) {
                    let d = t.at(now).call(1);
                    assert!(!d.allowed(), "{what}: passed at {now}");
                    assert_eq!(d.remaining(), 0, "{what}: at {now}");
                    let exact = until - now + u64::from(!ends_exactly(algorithm));
                    assert_eq!(us(d.retry_after()), exact, "{what}: at {now}");
                }
                // Then it resumes: at its end (GCRA and the buckets 1 µs
                // later), with the unit taken before it still counted by a
                // window that counts it then.
                let resumed = t.at(until).call(1);
                if ends_exactly(algorithm) {
                    assert!(resumed.allowed(), "{what}: {resumed:?}");
                } else {
                    assert!(!resumed.allowed(), "{what}: {resumed:?}");
                    assert!(t.at(until + 1).call(1).allowed(), "{what}");
                }
            }
        }
    }
}

#[test]
fn a_pause_as_long_as_the_longest_said_holds_a_second_long_window_all_day() {
    // A day's pause (Hold::MAX_PAUSE) over 5 a second: 86 400 windows.
    for algorithm in RATES {
        let mut t = Timeline::new(algorithm, 5, 1);
        let day = 86_400 * S;
        t.at(S / 2).hold(day, 0);
        for now in [S / 2, S, 7 * S + 1, day / 2, day + S / 2 - 1] {
            let d = t.at(now).peek(1);
            assert!(!d.allowed(), "{algorithm} at {now}");
        }
        assert!(t.at(day + S / 2 + 1).call(1).allowed(), "{algorithm}");
    }
}

#[test]
fn a_window_s_count_decides_again_when_a_short_pause_ends() {
    // 3 of 4 taken at 1 s, a 2 s pause: the window's last unit passes at
    // 3 s, and no more until the window ends.
    let mut t = Timeline::new(Algorithm::FixedWindow, 4, 10);
    assert!(t.at(S).call(3).allowed());
    t.hold(2 * S, 0);
    let refused = t.peek(1);
    assert_refused(refused, 2 * S);
    assert_eq!(us(refused.reset_after()), 9 * S, "the window's count lasts");
    assert_allowed(t.at(3 * S).call(1), 0, 7 * S);
    assert_refused(t.peek(1), 7 * S);
    // A full window paused: room comes back at the window's end, not at
    // the pause's.
    let mut t = Timeline::new(Algorithm::FixedWindow, 4, 10);
    assert!(t.at(S).call(4).allowed());
    t.hold(2 * S, 0);
    assert_refused(t.peek(1), 9 * S);
    // The same for the slots: 4 of 4 in slot 1 count until 11 s.
    let mut t = Timeline::new(Algorithm::SlidingWindow, 4, 10);
    assert!(t.at(S).call(4).allowed());
    t.hold(2 * S, 0);
    assert_refused(t.peek(1), 10 * S + S / 4);
}

#[test]
fn refunds_charges_counts_and_shorter_pauses_keep_a_pause() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        // Longer than the period, and shorter (the call taken before still
        // counts at its end).
        for pause in [30 * S, 5 * S] {
            let what = format!("{algorithm}, a pause of {pause} µs");
            let mut t = Timeline::new(algorithm, 4, 10);
            let taken = t.at(S).call(2);
            t.hold(pause, 0);
            let until = S + pause;
            // The call taken before given back, debt taken, a count said, a
            // shorter pause said: still paused until its end.
            t.at(2 * S).refund(2, taken.at_micros());
            t.charge(1);
            t.hold(0, 3);
            t.hold(pause / 5, 0);
            for now in [2 * S, 3 * S, 9 * S, 10 * S, 20 * S, until - 1] {
                if now < until {
                    assert_refused(t.at(now).peek(1), until - now);
                }
            }
            assert!(t.at(until).call(1).allowed(), "{what}");
        }
    }
}

#[test]
fn a_paused_state_lives_until_the_pause_ends_and_is_fresh_from_then() {
    for algorithm in RATES {
        let mut t = Timeline::new(algorithm, 3, 7);
        t.at(123).hold(20 * S, 0);
        let expires = t.cell.expires_at(algorithm);
        assert!(expires >= T0 + 123 + 20 * S, "{algorithm}: {expires}");
        assert!(
            expires <= T0 + 123 + 27 * S,
            "{algorithm}: no longer than needed"
        );
        let fresh = decide(&t.limit, &mut Cell::default(), expires, 3, false);
        let aged = t.at(expires - T0).peek(3);
        assert_eq!(
            (aged.allowed(), aged.remaining()),
            (fresh.allowed(), fresh.remaining()),
            "{algorithm}"
        );
    }
}

#[test]
fn a_sliding_log_paused_holds_at_most_twice_its_threshold_and_stays_sorted() {
    // Debt of 2T, then a pause of three periods: the entries leaving
    // before it ends go, T stay.
    let mut t = Timeline::new(Algorithm::SlidingLog, 4, 10);
    t.at(0).charge(4);
    t.at(S).charge(4);
    assert_eq!(t.cell.log_len(), 8);
    t.at(2 * S).hold(30 * S, 0);
    assert_eq!(t.cell.log_len(), 4);
    // Debt during the pause lands before its entries (in the future): the
    // log stays sorted, so it leaves 10 s after it was taken, and the
    // pause's entries at its end.
    t.at(3 * S).charge(2);
    assert_eq!(t.cell.log_len(), 6);
    assert_refused(t.at(12 * S).peek(1), 20 * S);
    assert!(t.at(32 * S).call(4).allowed());
    // A pause shorter than the period: T entries join the k that still
    // count at its end.
    let mut t = Timeline::new(Algorithm::SlidingLog, 4, 10);
    t.at(0).call(1);
    t.at(5 * S).call(1);
    t.at(6 * S).hold(2 * S, 0);
    assert_eq!(t.cell.log_len(), 6);
    assert_refused(t.peek(1), 2 * S);
    // At its end the two taken before still count.
    assert_allowed(t.at(8 * S).call(1), 1, 10 * S);
}
