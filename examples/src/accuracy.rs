//! How accurate each algorithm is, measured on the in-memory backend under
//! a manual clock: the worst case admitted in any window of length `P`, the
//! long-run rate of a saturating client, and how often a decision differs
//! from what an exact sliding log would decide.
//!
//! Everything here drives [`MemoryBackend::acquire_sync`] through the public
//! API, one identity per [`Run`], cost 1 per call. Randomness comes from
//! `rand`'s portable `Xoshiro256PlusPlus` with fixed seeds, so a run is
//! reproducible. `cargo run --release -p ratewall-examples --example accuracy`
//! writes the tables of `docs/accuracy.md`.
//!
//! A "window of length `P`" is the half-open `[t, t + P)`: `P` microseconds.
//! That is the sense in which the sliding log admits exactly `T` (an entry
//! leaves when `entry + P <= now`); a closed `[t, t + P]` spans `P + 1`
//! microseconds and can hold one more for every algorithm.

use std::collections::VecDeque;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use ratewall::{
    Algorithm, Decision, Key, Limit,
    backend::{MemoryBackend, Request},
    clock::ManualClock,
};

/// Where every run starts (µs): a multiple of every period used here, so
/// fixed windows and sliding-window slots start at the origin.
pub const ORIGIN: u64 = 1_000_000_000_000;

/// One identity under one limit, alone on its own backend and manual clock.
#[derive(Debug)]
pub struct Run {
    backend: MemoryBackend,
    clock: ManualClock,
    key: Key,
    limit: Limit,
    now: u64,
    admitted: Vec<u64>,
    loose_retry_after: u64,
}

impl Run {
    /// A fresh identity under `limit`, the clock at [`ORIGIN`].
    pub fn new(limit: Limit) -> Self {
        let clock = ManualClock::new(ORIGIN);
        Self {
            backend: MemoryBackend::with_clock(clock.clone()),
            clock,
            key: Key::new("acc", "sim", "client"),
            limit,
            now: ORIGIN,
            admitted: Vec::new(),
            loose_retry_after: 0,
        }
    }

    fn set_time(&mut self, at: u64) {
        assert!(
            at >= self.now,
            "time only moves forward ({at} < {})",
            self.now
        );
        self.now = at;
        self.clock.set_micros(at);
    }

    /// One call of cost 1 at `at` (µs, not before the previous call).
    pub fn call(&mut self, at: u64) -> Decision {
        self.set_time(at);
        let decision = *self
            .backend
            .acquire_sync(&[Request::new(&self.key, &self.limit, 1)])
            .binding();
        if decision.allowed() {
            self.admitted.push(at);
        }
        decision
    }

    /// Whether a call at `at` would be allowed, without consuming.
    fn would_allow(&mut self, at: u64) -> bool {
        self.set_time(at);
        self.backend
            .peek_sync(&[Request::new(&self.key, &self.limit, 1)])
            .allowed()
    }

    /// `calls` calls in the same microsecond; returns how many were admitted.
    pub fn burst(&mut self, at: u64, calls: u64) -> u64 {
        (0..calls).filter(|_| self.call(at).allowed()).count() as u64
    }

    /// A saturating client over `[from, until)`: it calls again at once
    /// when allowed, and exactly `retry_after` later when refused. It is
    /// admitted at every microsecond a client calling every microsecond
    /// would be: each `retry_after` is checked to be tight (a peek one
    /// microsecond earlier must refuse), and the call at `retry_after` must
    /// be allowed (it is the next call), else [`Run::loose_retry_after`]
    /// counts it.
    pub fn greedy(&mut self, from: u64, until: u64) {
        let mut at = from.max(self.now);
        let mut expect_allowed = false;
        while at < until {
            let decision = self.call(at);
            if decision.allowed() {
                expect_allowed = false;
                continue;
            }
            if expect_allowed {
                self.loose_retry_after += 1;
            }
            let wait = decision.retry_after().as_micros() as u64;
            assert!(wait > 0, "a refusal with retry_after 0");
            if wait > 1 && self.would_allow(at + wait - 1) {
                self.loose_retry_after += 1;
            }
            at += wait;
            expect_allowed = true;
        }
    }

    /// The admission times, in order.
    pub fn admitted(&self) -> &[u64] {
        &self.admitted
    }

    /// How many refusals had a `retry_after` that was not exactly the wait
    /// until the next admission (0 for every algorithm when it is exact).
    pub fn loose_retry_after(&self) -> u64 {
        self.loose_retry_after
    }
}

/// The most admissions in any half-open window `[t, t + period)`
/// (`closed`: `[t, t + period]`), of sorted admission times.
pub fn max_in_window(times: &[u64], period: u64, closed: bool) -> u64 {
    let mut first = 0;
    let mut best = 0;
    for (last, &t) in times.iter().enumerate() {
        while if closed {
            times[first] + period < t
        } else {
            times[first] + period <= t
        } {
            first += 1;
        }
        best = best.max(last - first + 1);
    }
    best as u64
}

/// A limit of `threshold` per `period_us` under `algorithm` (burst and
/// slots as given; each is ignored by the algorithms that do not use it).
pub fn limit(
    algorithm: Algorithm,
    threshold: u64,
    period_us: u64,
    burst: u64,
    slots: u64,
) -> Limit {
    Limit::from_parts(threshold, period_us, algorithm, burst, slots).expect("a valid limit")
}

/// The slot length of `limit` (µs): `P / slots` for the sliding-window
/// counter, `P / 10` for the others (where it only places a burst).
fn slot_of(limit: &Limit) -> u64 {
    let slots = if limit.algorithm() == Algorithm::SlidingWindow {
        limit.slots()
    } else {
        Limit::DEFAULT_SLOTS
    };
    limit.period_micros() / slots
}

/// A deterministic adversary, from a fresh identity at [`ORIGIN`] (a
/// window and slot boundary), each followed by a saturating client
/// ([`Run::greedy`]) until `3P`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adversary {
    /// Saturating from the start: a full burst, then the steady rate.
    Greedy,
    /// `capacity` calls in the last microsecond of the first window (`P - 1`),
    /// then saturating from the next window's first microsecond.
    WindowEdge,
    /// `capacity` calls in the last microsecond of the first slot (`S - 1`,
    /// `S = P / slots`), then saturating.
    SlotEdge,
}

impl Adversary {
    /// Every adversary.
    pub const ALL: [Adversary; 3] = [
        Adversary::Greedy,
        Adversary::WindowEdge,
        Adversary::SlotEdge,
    ];

    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Adversary::Greedy => "saturate",
            Adversary::WindowEdge => "window edge",
            Adversary::SlotEdge => "slot edge",
        }
    }

    /// Plays this adversary against a fresh identity under `limit`.
    pub fn play(self, limit: Limit) -> Run {
        let p = limit.period_micros();
        let mut run = Run::new(limit);
        let edge = match self {
            Adversary::Greedy => None,
            Adversary::WindowEdge => Some(p - 1),
            Adversary::SlotEdge => Some(slot_of(&limit) - 1),
        };
        if let Some(edge) = edge {
            run.burst(ORIGIN + edge, limit.capacity());
        }
        run.greedy(ORIGIN, ORIGIN + 3 * p);
        run
    }
}

/// The worst case of the deterministic adversaries: the most admitted in
/// any `[t, t + P)`, the adversary that found it, and the most in any
/// closed `[t, t + P]` under that adversary.
pub fn adversarial_worst(limit: Limit) -> (u64, Adversary, u64) {
    let p = limit.period_micros();
    let mut worst = (0, Adversary::Greedy, 0);
    for adversary in Adversary::ALL {
        let run = adversary.play(limit);
        let open = max_in_window(run.admitted(), p, false);
        let closed = max_in_window(run.admitted(), p, true);
        if (open, closed) > (worst.0, worst.2) {
            worst = (open, adversary, closed);
        }
    }
    worst
}

/// A schedule for the randomized search: groups of calls, each `calls`
/// calls from `offset` (µs after [`ORIGIN`]) spaced by `spacing` µs
/// (0: all in one microsecond).
#[derive(Debug, Clone, Copy)]
struct Group {
    offset: u64,
    calls: u64,
    spacing: u64,
}

/// The calls of a schedule, in time order.
fn calls_of(schedule: &[Group]) -> Vec<u64> {
    let mut times: Vec<u64> = schedule
        .iter()
        .flat_map(|g| (0..g.calls).map(move |i| g.offset + i * g.spacing))
        .collect();
    times.sort_unstable();
    times
}

fn score(limit: Limit, schedule: &[Group]) -> u64 {
    let mut run = Run::new(limit);
    for at in calls_of(schedule) {
        run.call(ORIGIN + at);
    }
    max_in_window(run.admitted(), limit.period_micros(), false)
}

/// Randomized search for the worst case in any `[t, t + P)`: `restarts`
/// hill climbs of `steps` mutations each over schedules of 1 to 6 groups
/// of calls within `3P`, keeping a mutation when it admits at least as
/// many in some window. Moves are multi-scale (`P / 2^k`, `k` in 0..=20),
/// so a climb can home in on a boundary to the microsecond, but nothing
/// tells it where the boundaries are.
pub fn random_search(limit: Limit, seed: u64, restarts: u32, steps: u32) -> u64 {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let p = limit.period_micros();
    let span = 3 * p;
    let most = 2 * limit.capacity();
    let random_group = |rng: &mut Xoshiro256PlusPlus| Group {
        offset: rng.random_range(0..span),
        calls: rng.random_range(1..=most),
        spacing: if rng.random_bool(0.5) {
            0
        } else {
            rng.random_range(1..=p)
        },
    };
    let mut best = 0;
    for _ in 0..restarts {
        let mut schedule: Vec<Group> = (0..rng.random_range(1..=6))
            .map(|_| random_group(&mut rng))
            .collect();
        let mut current = score(limit, &schedule);
        for _ in 0..steps {
            let mut next = schedule.clone();
            let i = rng.random_range(0..next.len());
            let step = (p >> rng.random_range(0..=20u32)).max(1);
            let up = rng.random_bool(0.5);
            let nudge = |v: u64, max: u64| {
                if up {
                    (v + step).min(max)
                } else {
                    v.saturating_sub(step)
                }
            };
            match rng.random_range(0..5) {
                0 => next[i].offset = nudge(next[i].offset, span - 1),
                1 => next[i].spacing = nudge(next[i].spacing, p),
                2 => next[i].calls = rng.random_range(1..=most),
                3 if next.len() < 6 => next.push(random_group(&mut rng)),
                _ if next.len() > 1 => {
                    next.swap_remove(i);
                }
                _ => next[i] = random_group(&mut rng),
            }
            let s = score(limit, &next);
            if s >= current {
                (schedule, current) = (next, s);
            }
        }
        best = best.max(current);
    }
    best
}

/// The long-run rate of a saturating client ([`Run::greedy`]), in units
/// per period: admissions in `[P, (periods + 1)·P)` over `periods`
/// (the first period, with its initial burst, is left out). Also returns
/// the count of loose `retry_after`s seen.
pub fn saturating_rate(limit: Limit, periods: u64) -> (f64, u64) {
    let p = limit.period_micros();
    let mut run = Run::new(limit);
    run.greedy(ORIGIN, ORIGIN + (periods + 1) * p);
    let counted = run.admitted().iter().filter(|&&t| t >= ORIGIN + p).count();
    (counted as f64 / periods as f64, run.loose_retry_after())
}

/// How calls arrive in the wrong-decision runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrivals {
    /// A Poisson process: exponential gaps, one call per arrival.
    Poisson,
    /// Batches at Poisson times, each of 1 to 9 calls (uniform, mean 5) in
    /// one microsecond: the same mean rate, clumped.
    Batches,
}

impl Arrivals {
    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Arrivals::Poisson => "poisson",
            Arrivals::Batches => "batches",
        }
    }

    /// Call times (µs after [`ORIGIN`], sorted) over `duration` µs at a mean
    /// of `rate` calls per µs.
    pub fn times(self, rate: f64, duration: u64, seed: u64) -> Vec<u64> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let batch_mean = match self {
            Arrivals::Poisson => 1.0,
            Arrivals::Batches => 5.0,
        };
        let mean_gap = batch_mean / rate;
        let mut times = Vec::with_capacity((rate * duration as f64 * 1.1) as usize);
        let mut t = 0.0_f64;
        loop {
            t += -(1.0 - rng.random::<f64>()).ln() * mean_gap;
            if t >= duration as f64 {
                return times;
            }
            let size = match self {
                Arrivals::Poisson => 1,
                Arrivals::Batches => rng.random_range(1..=9),
            };
            times.extend(std::iter::repeat_n(t as u64, size));
        }
    }
}

/// Decisions of one algorithm on one arrival stream, judged call by call
/// against an exact sliding log holding the same admitted history: a call
/// is over-admitted if admitting it put more than `T` admissions in
/// `(now - P, now]`, under-admitted if it was refused although admitting it
/// would have kept at most `T` there.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// Calls decided.
    pub calls: u64,
    /// Calls admitted.
    pub admitted: u64,
    /// Admitted, but an exact sliding log would have refused.
    pub over: u64,
    /// Refused, but an exact sliding log would have admitted.
    pub under: u64,
    /// The most admitted in any `[t, t + P)`.
    pub worst_window: u64,
}

impl Tally {
    /// Wrong decisions, in percent of the calls.
    pub fn wrong_percent(&self) -> f64 {
        100.0 * (self.over + self.under) as f64 / self.calls.max(1) as f64
    }

    /// Over-admissions, in percent of the calls.
    pub fn over_percent(&self) -> f64 {
        100.0 * self.over as f64 / self.calls.max(1) as f64
    }

    /// Under-admissions, in percent of the calls.
    pub fn under_percent(&self) -> f64 {
        100.0 * self.under as f64 / self.calls.max(1) as f64
    }
}

/// Decides every call of `times` (µs after [`ORIGIN`]) under `limit` and
/// judges each decision ([`Tally`]).
pub fn judge(limit: Limit, times: &[u64]) -> Tally {
    let (t, p) = (limit.threshold(), limit.period_micros());
    let mut run = Run::new(limit);
    let mut window: VecDeque<u64> = VecDeque::new();
    let mut tally = Tally::default();
    for &offset in times {
        let at = ORIGIN + offset;
        while window.front().is_some_and(|&oldest| oldest + p <= at) {
            window.pop_front();
        }
        let exact_allows = (window.len() as u64) < t;
        let allowed = run.call(at).allowed();
        tally.calls += 1;
        if allowed {
            tally.admitted += 1;
            window.push_back(at);
        }
        match (allowed, exact_allows) {
            (true, false) => tally.over += 1,
            (false, true) => tally.under += 1,
            _ => {}
        }
    }
    tally.worst_window = max_in_window(run.admitted(), p, false);
    tally
}
