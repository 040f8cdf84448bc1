//! Coalesced calls (`RedisBackendBuilder::coalesce`) decide exactly what
//! calls sent alone decide.
//!
//! Many identities, each driven by its own caller, run random sequences of
//! acquires (idempotent ones too), peeks, refunds and charges over one to
//! three limits of every algorithm (some that block), with costs, all at
//! once, on a coalescing backend and on a backend sending every call alone,
//! both on the same schedule of a manual clock: every identity's sequence
//! of results must be the same on both (each identity's keys are its own,
//! so its results do not depend on how the callers interleave). Also: a
//! lone call goes alone, concurrent calls form coalesced calls within the
//! bound (on a server, and on Sentinel's master), one call's error reaches
//! its caller only, callers of one limit travel as one group and a
//! malformed coalesced layout runs nothing, each waiting caller times out
//! at its own deadline,
//! coalesced calls load the Functions library again when the server lost
//! it (and send their script again when it lost that), and on a Redis
//! Cluster each master's acquires are coalesced apart with no decision
//! lost or doubled while slots move between masters. Each test on one
//! server runs in both call modes, Functions (where the server has them)
//! and scripts; the slot migration in one mode per server (see its
//! comment).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use ratewall::{
    Algorithm, Key, Limit,
    backend::{Backend, Decisions, Request},
    clock::ManualClock,
    error::BackendError,
};
use ratewall_redis::{CallMode, RedisBackend};
use ratewall_tests::harness::{RedisCluster, RedisSentinel, RedisServer, ServerKind};

/// The fixed windows of the raw calls below, which read back what earlier
/// calls wrote on the server's clock: a day, entered at least a minute
/// before it ends ([`RedisServer::away_from_window_end`]), so no window
/// ends between a call and the calls that read what it wrote. (With a
/// minute, a slow run could cross a boundary and see a full key empty.)
const A_DAY: Duration = Duration::from_secs(86_400);

/// A realistic epoch (2023-11), so Lua handles full-size microsecond times.
const EPOCH_US: u64 = 1_700_000_000_000_000;

/// Callers (one identity each) deciding at the same time.
const IDENTITIES: usize = 48;

/// Steps per identity (the clock moves between two steps).
const STEPS: usize = 40;

/// Random cases (`RATEWALL_COALESCE_CASES` overrides).
const CASES: u64 = 6;

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One to three limits of random algorithms and distinct periods, about
/// one in four blocking.
fn limits(rng: &mut Rng) -> Vec<Limit> {
    let mut periods = vec![1_000_000u64, 2_000_000, 5_000_000, 60_000_000];
    let count = 1 + rng.below(3) as usize;
    let mut limits = Vec::with_capacity(count);
    for _ in 0..count {
        let period = periods.remove(rng.below(periods.len() as u64) as usize);
        let algorithm = Algorithm::ALL[rng.below(Algorithm::ALL.len() as u64) as usize];
        let threshold = 1 + rng.below(6);
        let mut limit = Limit::new(threshold, Duration::from_micros(period))
            .and_then(|l| l.with_algorithm(algorithm))
            .expect("limit");
        if algorithm.uses_burst() && rng.below(2) == 0 {
            limit = limit.with_burst(threshold + rng.below(3)).unwrap_or(limit);
        }
        if rng.below(4) == 0 {
            let block = Duration::from_millis(1 + rng.below(3_000));
            limit = limit.with_block(block).unwrap_or(limit);
        }
        limits.push(limit);
    }
    limits
}

/// What one step does.
#[derive(Debug, Clone)]
enum Op {
    Acquire(u64),
    AcquireOnce(u64, u64),
    Peek,
    Refund(u64),
    Charge(u64),
}

fn op(rng: &mut Rng) -> Op {
    let cost = 1 + rng.below(2);
    match rng.below(20) {
        0..=8 => Op::Acquire(cost),
        9..=10 => Op::AcquireOnce(cost, rng.below(3)),
        11..=13 => Op::Peek,
        14..=16 => Op::Refund(cost),
        _ => Op::Charge(cost),
    }
}

/// One identity's case: its limits and its steps.
struct Identity {
    limits: Vec<Limit>,
    ops: Vec<Op>,
}

/// A case: every identity's steps, and the clock's moves between steps.
struct Case {
    identities: Vec<Identity>,
    advances: Vec<u64>,
}

fn case(seed: u64) -> Case {
    let mut rng = Rng(seed);
    let identities = (0..IDENTITIES)
        .map(|_| Identity {
            limits: limits(&mut rng),
            ops: (0..STEPS).map(|_| op(&mut rng)).collect(),
        })
        .collect();
    let advances = (0..STEPS)
        .map(|_| match rng.below(4) {
            0 => 0,
            1 => rng.below(1_000),
            _ => rng.below(1_500_000),
        })
        .collect();
    Case {
        identities,
        advances,
    }
}

/// A result as compared: the decisions, or which error.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Decided(Decisions),
    Done,
    Failed(String),
}

fn outcome<T>(result: Result<T, BackendError>, decided: impl FnOnce(T) -> Outcome) -> Outcome {
    match result {
        Ok(value) => decided(value),
        Err(BackendError::Invalid(error)) => Outcome::Failed(format!("invalid: {error}")),
        Err(error) => Outcome::Failed(format!("{error:?}")),
    }
}

/// Runs step `step` of identity `index` under `prefix`.
async fn run_step(
    backend: &RedisBackend,
    prefix: &str,
    index: usize,
    identity: &Identity,
    step: usize,
    last_at: &mut u64,
) -> Outcome {
    let name = format!("id{index}");
    let key = Key::new(prefix, "coalesce", &name);
    let requests = |cost: u64| -> Vec<Request<'_>> {
        identity
            .limits
            .iter()
            .map(|limit| Request::new(&key, limit, cost))
            .collect()
    };
    match identity.ops[step] {
        Op::Acquire(cost) => {
            let requests = requests(cost);
            let result = backend.acquire(&requests).await;
            if let Ok(decisions) = &result {
                *last_at = decisions.iter().next().map_or(0, |d| d.at_micros());
            }
            outcome(result, Outcome::Decided)
        }
        Op::AcquireOnce(cost, id) => {
            let requests = requests(cost);
            let result = backend.acquire_once(&requests, &format!("r{id}")).await;
            outcome(result, Outcome::Decided)
        }
        Op::Peek => outcome(backend.peek(&requests(1)).await, Outcome::Decided),
        Op::Refund(cost) => outcome(backend.refund(&requests(cost), *last_at).await, |()| {
            Outcome::Done
        }),
        Op::Charge(cost) => outcome(backend.charge(&requests(cost)).await, |()| Outcome::Done),
    }
}

/// Runs `case` on `backend` (its client clock `clock`), every identity at
/// each step at once; each identity's outcomes.
async fn run_case(
    backend: &RedisBackend,
    clock: &ManualClock,
    prefix: &str,
    case: &Case,
) -> Vec<Vec<Outcome>> {
    let mut outcomes = vec![Vec::with_capacity(STEPS); case.identities.len()];
    let mut last_at = vec![0u64; case.identities.len()];
    for step in 0..STEPS {
        clock.advance_micros(case.advances[step]);
        let steps = case
            .identities
            .iter()
            .zip(last_at.iter_mut())
            .enumerate()
            .map(|(index, (identity, last_at))| {
                run_step(backend, prefix, index, identity, step, last_at)
            });
        for (index, outcome) in join_all(steps).await.into_iter().enumerate() {
            outcomes[index].push(outcome);
        }
    }
    outcomes
}

/// A backend calling its code as `mode` says, deciding on `clock`,
/// coalescing (at most `max` calls in one) or not. Keys are kept an hour
/// longer: the manual clock does not move with the server's.
async fn backend(
    server: &RedisServer,
    mode: CallMode,
    clock: &ManualClock,
    coalesce: Option<usize>,
) -> RedisBackend {
    let builder = RedisBackend::builder(server.url())
        .call_mode(mode)
        .client_clock(clock.clone())
        .extra_ttl(Duration::from_secs(3_600))
        .timeout(Duration::from_secs(10));
    let builder = match coalesce {
        Some(max) => builder.coalesce(true).coalesce_max(max),
        None => builder.coalesce(false),
    };
    builder.connect().await.expect("connect")
}

/// The call modes `server` coalesces in: Functions where it has them
/// (`RATEWALL_TEST_SERVER=redis-no-functions` selects one without), and
/// scripts everywhere.
fn modes(server: &RedisServer) -> Vec<CallMode> {
    if server.kind().has_functions() {
        vec![CallMode::Functions, CallMode::Scripts]
    } else {
        vec![CallMode::Scripts]
    }
}

fn cases() -> u64 {
    std::env::var("RATEWALL_COALESCE_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(CASES)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_calls_decide_every_identitys_sequence_exactly_as_calls_sent_alone() {
    let server = RedisServer::start();
    for mode in modes(&server) {
        for seed in 0..cases() {
            differential_case(&server, mode, seed).await;
        }
    }
}

/// Case `seed` run alone and coalesced in `mode`: every identity's results
/// the same.
async fn differential_case(server: &RedisServer, mode: CallMode, seed: u64) {
    let case = case(seed);
    let alone_clock = ManualClock::new(EPOCH_US);
    let alone = backend(server, mode, &alone_clock, None).await;
    assert!(!alone.coalesces());
    let coalesced_clock = ManualClock::new(EPOCH_US);
    // A small bound, so that a step's calls go in several coalesced calls.
    let coalescing = backend(server, mode, &coalesced_clock, Some(16)).await;
    assert!(coalescing.coalesces());
    let expected = run_case(&alone, &alone_clock, &format!("alone{mode:?}{seed}"), &case).await;
    let got = run_case(
        &coalescing,
        &coalesced_clock,
        &format!("coalesced{mode:?}{seed}"),
        &case,
    )
    .await;
    for (index, (expected, got)) in expected.iter().zip(&got).enumerate() {
        for step in 0..STEPS {
            assert_eq!(
                got[step], expected[step],
                "{mode:?} case {seed}, identity {index}, step {step}: {:?} over {:?}",
                case.identities[index].ops[step], case.identities[index].limits
            );
        }
    }
    // The case decided things both ways, not only errors.
    let decided = expected
        .iter()
        .flatten()
        .filter_map(|outcome| match outcome {
            Outcome::Decided(decisions) => Some(decisions.allowed()),
            _ => None,
        });
    let (allowed, refused) = decided.fold(
        (0, 0),
        |(a, r), allowed| {
            if allowed { (a + 1, r) } else { (a, r + 1) }
        },
    );
    assert!(
        allowed > 100 && refused > 100,
        "{mode:?} case {seed}: {allowed} allowed, {refused} refused"
    );
    let counts = coalescing.coalesced().expect("coalescing");
    assert!(counts.batches > 0, "{mode:?} case {seed}: {counts:?}");
    assert!(counts.largest <= 16, "{mode:?} case {seed}: {counts:?}");
    // Every call of the case went, alone or inside a coalesced call
    // (a call refused before it is sent, an invalid one, goes nowhere).
    assert!(
        counts.alone + counts.batched <= (IDENTITIES * STEPS) as u64,
        "{mode:?} case {seed}: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_call_goes_alone_and_concurrent_calls_go_together_within_the_bound() {
    let server = RedisServer::start();
    for mode in modes(&server) {
        for in_flight in [1, 4] {
            lone_and_concurrent_calls(&server, mode, in_flight).await;
        }
    }
}

/// Calls on one key that go in one coalesced call each decide on what the
/// one before wrote (the call reads the keys of its single decisions
/// together first): of 40 at once under 10 an hour, exactly 10 are
/// admitted, each leaving one less; a refund among them gives its unit
/// back to a later one. For every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_one_key_in_one_coalesced_call_each_see_what_the_one_before_wrote() {
    let server = RedisServer::start();
    for mode in modes(&server) {
        same_key_calls(&server, mode).await;
    }
}

/// The calls on one key of one coalesced call, in `mode`.
async fn same_key_calls(server: &RedisServer, mode: CallMode) {
    let backend = RedisBackend::builder(server.url())
        .call_mode(mode)
        .coalesce(true)
        .coalesce_max(64)
        .coalesce_in_flight(1)
        .connect()
        .await
        .expect("connect");
    for algorithm in Algorithm::ALL {
        let limit = Limit::per_hour(10)
            .and_then(|l| l.with_algorithm(algorithm))
            .expect("limit");
        let key = Key::new("same", algorithm.name(), &format!("alice{mode:?}"));
        let before = backend.coalesced().expect("coalescing");
        let calls = (0..40).map(|_| {
            let (backend, key, limit) = (&backend, &key, &limit);
            async move { backend.acquire(&[Request::new(key, limit, 1)]).await }
        });
        let mut left: Vec<u64> = join_all(calls)
            .await
            .into_iter()
            .map(|d| d.expect("decided"))
            .filter(Decisions::allowed)
            .map(|d| d.iter().next().expect("one decision").remaining())
            .collect();
        left.sort_unstable();
        assert_eq!(left, (0..10).collect::<Vec<_>>(), "{mode:?} {algorithm:?}");
        let after = backend.coalesced().expect("coalescing");
        assert!(
            after.batches > before.batches,
            "{mode:?} {algorithm:?}: {after:?}"
        );
    }
}

/// Three lone calls, then 100 at once, on a backend in `mode` coalescing
/// at most 8 calls in one with `in_flight` calls in flight.
async fn lone_and_concurrent_calls(server: &RedisServer, mode: CallMode, in_flight: usize) {
    let backend = RedisBackend::builder(server.url())
        .call_mode(mode)
        .coalesce(true)
        .coalesce_max(8)
        .coalesce_in_flight(in_flight)
        .connect()
        .await
        .expect("connect");
    let limit = Limit::per_minute(1_000).expect("limit");
    let key = Key::new("lone", "sms", &format!("alice{mode:?}{in_flight}"));
    for _ in 0..3 {
        let decisions = backend
            .acquire(&[Request::new(&key, &limit, 1)])
            .await
            .expect("decided");
        assert!(decisions.allowed());
    }
    let counts = backend.coalesced().expect("coalescing");
    assert_eq!((counts.alone, counts.batches, counts.batched), (3, 0, 0));

    let keys: Vec<Key> = (0..100)
        .map(|i| Key::new("many", "sms", &format!("caller{i}-{mode:?}{in_flight}")))
        .collect();
    let calls = keys.iter().map(|key| {
        let backend = &backend;
        let limit = &limit;
        async move { backend.acquire(&[Request::new(key, limit, 1)]).await }
    });
    for decisions in join_all(calls).await {
        assert!(decisions.expect("decided").allowed());
    }
    let counts = backend.coalesced().expect("coalescing");
    assert!(counts.batches > 0, "{in_flight} in flight: {counts:?}");
    assert!(
        counts.largest > 1 && counts.largest <= 8,
        "{in_flight} in flight: {counts:?}"
    );
    assert_eq!(
        counts.alone + counts.batched,
        103,
        "{in_flight} in flight: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_s_error_reaches_its_caller_only() {
    let server = RedisServer::start();
    for mode in modes(&server) {
        error_reaches_its_caller_only(&server, mode).await;
    }
}

/// One call's error among coalesced calls, in `mode`.
async fn error_reaches_its_caller_only(server: &RedisServer, mode: CallMode) {
    let backend = RedisBackend::builder(server.url())
        .call_mode(mode)
        .coalesce(true)
        .connect()
        .await
        .expect("connect");
    let alone = RedisBackend::builder(server.url())
        .call_mode(mode)
        .coalesce(false)
        .connect()
        .await
        .expect("connect");
    // Room for every round below.
    let limit = Limit::per_minute(100).expect("limit");
    let bad = Key::new("err", "sms", &format!("bad{mode:?}"));
    // The bad identity's state key holds a set: reading it as a string
    // raises WRONGTYPE inside the Lua call.
    let state = format!("{}:{}", bad.as_str(), limit.storage_suffix());
    let _: i64 = server.cmd(&["SADD", &state, "x"]).await;
    let alone_error = alone
        .acquire(&[Request::new(&bad, &limit, 1)])
        .await
        .expect_err("a set is no state");
    assert!(
        format!("{alone_error}").contains("WRONGTYPE"),
        "{alone_error}"
    );

    let good: Vec<Key> = (0..20)
        .map(|i| Key::new("err", "sms", &format!("good{i}{mode:?}")))
        .collect();
    // Rounds until three coalesced calls formed (each round's first calls
    // go alone; the bad one, sixth, waits behind them with the others and
    // goes with them). On a busy machine a round's calls may all find a
    // place in flight, so a round may form none: up to 30 rounds.
    let mut rounds = 0;
    while backend.coalesced().expect("coalescing").batches < 3 && rounds < 30 {
        rounds += 1;
        let mut keys: Vec<&Key> = good.iter().collect();
        keys.insert(5, &bad);
        let calls = keys.iter().map(|&key| {
            let backend = &backend;
            let limit = &limit;
            async move { (key, backend.acquire(&[Request::new(key, limit, 1)]).await) }
        });
        for (key, result) in join_all(calls).await {
            if key.as_str() == bad.as_str() {
                let error = result.expect_err("a set is no state");
                assert!(
                    matches!(error, BackendError::Protocol(_))
                        && matches!(alone_error, BackendError::Protocol(_)),
                    "{error:?}"
                );
                assert!(format!("{error}").contains("WRONGTYPE"), "{error}");
            } else {
                assert!(result.expect("decided").allowed());
            }
        }
    }
    let counts = backend.coalesced().expect("coalescing");
    assert!(counts.batches >= 3, "{mode:?}, {rounds} rounds: {counts:?}");
    // The set is untouched: an error writes nothing here.
    let kind: String = server.cmd(&["TYPE", &state]).await;
    assert_eq!(kind, "set");
}

/// The coalesced entry read straight: callers of one limit travel as one
/// group (the limit's arguments once, each caller's key its own), a
/// single acquire answers its six integers flat, and a malformed layout
/// is refused before any of its calls runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_callers_decides_each_on_its_own_key_and_a_malformed_layout_runs_nothing() {
    let server = RedisServer::start();
    for mode in modes(&server) {
        layouts(&server, mode).await;
    }
}

/// How the coalesced entries of `mode` are called straight, `(command,
/// function name or script source)` for `many`, `many_ro` and
/// `many_node`: `FCALL` (`FCALL_RO`) of the library's functions, loaded
/// here, or `EVAL` of their scripts.
async fn coalesced_entries(server: &RedisServer, mode: CallMode) -> [(&'static str, String); 3] {
    if mode == CallMode::Scripts {
        let (ro, node) = ratewall_redis::__private::coalesced_script_sources();
        [
            ("EVAL", RedisBackend::coalesced_script_source().to_owned()),
            ("EVAL", ro.to_owned()),
            ("EVAL", node.to_owned()),
        ]
    } else {
        let library = RedisBackend::library_source();
        let _: String = server.cmd(&["FUNCTION", "LOAD", "REPLACE", library]).await;
        let name = RedisBackend::library_name();
        [
            ("FCALL", format!("{name}_many")),
            ("FCALL_RO", format!("{name}_many_ro")),
            ("FCALL", format!("{name}_many_node")),
        ]
    }
}

/// `call` is refused as a malformed coalesced call (`what` names it).
async fn assert_malformed(server: &RedisServer, call: &[&str], what: &str) {
    let error = server
        .try_cmd::<redis::Value>(call)
        .await
        .expect_err("a malformed coalesced call is refused");
    assert!(
        format!("{error}").contains("malformed coalesced call"),
        "{what}: {error}"
    );
}

/// The decisions of a coalesced call's reply of single acquires, as
/// `lua/many.lua` writes them: six integers (allowed, limit, remaining,
/// retry after, reset after, now), or, with the limit and time of the last
/// six, two when allowed (remaining + 2, reset after) or three when refused
/// (-1 - remaining, retry after, reset after).
fn flat_decisions(reply: &[i64]) -> Vec<[i64; 6]> {
    let mut decisions: Vec<[i64; 6]> = Vec::new();
    let mut rest = reply;
    while let [first, ..] = *rest {
        let (decision, used) = match (first, decisions.last()) {
            (0 | 1, _) => (<[i64; 6]>::try_from(&rest[..6]).unwrap(), 6),
            (first, Some(&[_, limit, _, _, _, now])) if first >= 2 => {
                ([1, limit, first - 2, 0, rest[1], now], 2)
            }
            (first, Some(&[_, limit, _, _, _, now])) => {
                ([0, limit, -1 - first, rest[1], rest[2], now], 3)
            }
            (_, None) => panic!("a short decision first: {reply:?}"),
        };
        decisions.push(decision);
        rest = &rest[used..];
    }
    decisions
}

/// The coalesced entry of `mode` called straight: `FCALL <library>_many`,
/// or `EVAL` of the coalesced script.
async fn layouts(server: &RedisServer, mode: CallMode) {
    server.away_from_window_end(A_DAY).await;
    let [(invoke, many), ..] = coalesced_entries(server, mode).await;
    let many = many.as_str();
    let (a, b) = (
        format!("g{mode:?}:{{a}}:fw:86400000000"),
        format!("g{mode:?}:{{b}}:fw:86400000000"),
    );
    let (a, b) = (a.as_str(), b.as_str());
    // One group of three: a, b, then a again (which sees what the first
    // call on a wrote), under 2 a day.
    let group = ["1", "fw_acquire", "1", "3", "2", "86400000000", "1", "3"];
    let mut call = vec![invoke, many, "3", a, b, a];
    call.extend(group);
    let reply: Vec<i64> = server.cmd(&call).await;
    // The first in six integers; the next two, of its limit and time, in
    // two each (allowed: remaining + 2, reset after).
    assert_eq!(reply.len(), 10, "{reply:?}");
    let decisions = flat_decisions(&reply);
    assert_eq!(decisions.len(), 3, "{reply:?}");
    let (first, second, third) = (&decisions[0], &decisions[1], &decisions[2]);
    assert_eq!(first[..3], [1, 2, 1]);
    assert_eq!(second[..3], [1, 2, 1]);
    assert_eq!(third[..3], [1, 2, 0]);
    // One server time for all three.
    assert!(first[5] == second[5] && second[5] == third[5]);

    // Three groups of one entry, each with its own limit (2, then 5, then
    // 2 again a day), each read with its own: d twice under 2, f
    // under 5, then d a third time under 2 (refused: its 2 are spent,
    // answered with its limit) and e once under 2.
    let (d, e, f) = (
        format!("g{mode:?}:{{d}}:fw:86400000000"),
        format!("g{mode:?}:{{e}}:fw:86400000000"),
        format!("g{mode:?}:{{f}}:fw:86400000000"),
    );
    let (d, e, f) = (d.as_str(), e.as_str(), f.as_str());
    let mut call = vec![invoke, many, "5", d, d, f, d, e, "3"];
    call.extend(["fw_acquire", "1", "3", "2", "86400000000", "1", "2"]);
    call.extend(["fw_acquire", "1", "3", "5", "86400000000", "1", "1"]);
    call.extend(["fw_acquire", "1", "3", "2", "86400000000", "1", "2"]);
    let reply: Vec<i64> = server.cmd(&call).await;
    let decisions = flat_decisions(&reply);
    let firsts: Vec<&[i64]> = decisions.iter().map(|d| &d[..3]).collect();
    let expected: [&[i64]; 5] = [&[1, 2, 1], &[1, 2, 0], &[1, 5, 4], &[0, 2, 0], &[1, 2, 1]];
    assert_eq!(firsts, expected, "{reply:?}");
    assert!(decisions.iter().all(|d| d[5] == decisions[0][5]));

    let c = format!("g{mode:?}:{{c}}:fw:86400000000");
    let c = c.as_str();
    let malformed: [&[&str]; 8] = [
        // A group of no calls.
        &[
            "1",
            c,
            "1",
            "fw_acquire",
            "1",
            "3",
            "2",
            "86400000000",
            "1",
            "0",
        ],
        // No size.
        &["1", c, "1", "fw_acquire", "1", "3", "2", "86400000000", "1"],
        // Two calls' keys for one.
        &[
            "2",
            c,
            a,
            "1",
            "fw_acquire",
            "1",
            "3",
            "2",
            "86400000000",
            "1",
            "1",
        ],
        // An entry the coalesced call does not run.
        &[
            "1",
            c,
            "1",
            "no_such_entry",
            "1",
            "3",
            "2",
            "86400000000",
            "1",
            "1",
        ],
        // A name made like an entry's, of no algorithm.
        &[
            "1",
            c,
            "1",
            "xx_acquire",
            "1",
            "3",
            "2",
            "86400000000",
            "1",
            "1",
        ],
        // A good group, then one whose counts are not numbers.
        &[
            "2",
            c,
            a,
            "2",
            "fw_acquire",
            "1",
            "3",
            "2",
            "86400000000",
            "1",
            "1",
            "fw_acquire",
            "x",
            "3",
            "2",
            "86400000000",
            "1",
            "1",
        ],
        // No group.
        &["0", "0"],
        // A group larger than its keys.
        &[
            "1",
            c,
            "1",
            "fw_acquire",
            "1",
            "3",
            "2",
            "86400000000",
            "1",
            "1000000000",
        ],
    ];
    for layout in malformed {
        let mut call = vec![invoke, many];
        call.extend(layout);
        assert_malformed(server, &call, &format!("{mode:?} {layout:?}")).await;
    }
    // None of them ran a call: c was never written, a is as it was.
    let written: i64 = server.cmd(&["EXISTS", c]).await;
    assert_eq!(written, 0);
    let mut call = vec![invoke, many, "1", a];
    call.extend(["1", "fw_acquire", "1", "3", "2", "86400000000", "1", "1"]);
    let reply: Vec<i64> = server.cmd(&call).await;
    assert_eq!(reply[..3], [0, 2, 0], "a is full after the group's two");
}

/// A coalesced call of more single acquires than Lua can unpack at once
/// (Redis's Lua takes about 8 000 values on its stack; `coalesce_max` has
/// no upper bound): their keys are read in several MGETs, and every call
/// is decided, each on its own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_call_of_nine_thousand_single_acquires_decides_every_one() {
    let server = RedisServer::start();
    for mode in modes(&server) {
        server.away_from_window_end(A_DAY).await;
        let [(invoke, many), ..] = coalesced_entries(&server, mode).await;
        let calls = 9_000;
        let keys: Vec<String> = (0..calls)
            .map(|i| format!("big{mode:?}:{{k{i}}}:fw:86400000000"))
            .collect();
        // Some keys were used once already, in the first MGET and at the
        // edges of the later ones (1 000 keys each): each call sees its
        // own key's state, not its neighbour's.
        let used = [0, 1, 2, 998, 999, 1_000, 1_001, 4_567, 8_998, 8_999];
        for key in used.map(|i| &keys[i]) {
            let one = ["1", "fw_acquire", "1", "3", "2", "86400000000", "1", "1"];
            let mut call = vec![invoke, many.as_str(), "1", key.as_str()];
            call.extend(one);
            let reply: Vec<i64> = server.cmd(&call).await;
            assert_eq!(reply[..3], [1, 2, 1], "{mode:?}");
        }
        let count = calls.to_string();
        let mut call = vec![invoke, many.as_str(), count.as_str()];
        call.extend(keys.iter().map(String::as_str));
        call.extend([
            "1",
            "fw_acquire",
            "1",
            "3",
            "2",
            "86400000000",
            "1",
            count.as_str(),
        ]);
        // (Not `cmd`, whose panic would print all 9 000 keys.)
        let reply: Vec<i64> = match server.try_cmd(&call).await {
            Ok(reply) => reply,
            Err(error) => panic!("{mode:?}: the coalesced call failed: {error}"),
        };
        let decisions = flat_decisions(&reply);
        assert_eq!(decisions.len(), calls, "{mode:?}: a decision per call");
        for (i, decision) in decisions.iter().enumerate() {
            let expected = if used.contains(&i) {
                [1, 2, 0]
            } else {
                [1, 2, 1]
            };
            assert_eq!(decision[..3], expected, "{mode:?}: call {i}");
        }
    }
}

/// The read-only coalesced entry runs no entry that writes, and the one of
/// a cluster master only single acquires: a layout naming any other entry
/// is refused before any call runs, in both call modes; the entries they
/// do run, run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_only_and_the_node_coalesced_entries_refuse_entries_they_do_not_run() {
    let server = RedisServer::start();
    for mode in modes(&server) {
        let [_, (ro_invoke, ro), (node_invoke, node)] = coalesced_entries(&server, mode).await;
        let key = format!("only{mode:?}:{{k}}:fw:60000000");
        let key = key.as_str();
        let layout = |entry: &'static str| [entry, "1", "3", "2", "60000000", "1", "1"];
        for entry in ["fw_acquire", "fw_refund", "gc_acquire", "batch"] {
            let mut call = vec![ro_invoke, ro.as_str(), "1", key, "1"];
            call.extend(layout(entry));
            assert_malformed(&server, &call, &format!("{mode:?} many_ro {entry}")).await;
        }
        for entry in ["fw_peek", "fw_refund", "batch", "batch_ro"] {
            let mut call = vec![node_invoke, node.as_str(), "0", "1", key, "1"];
            call.extend(layout(entry));
            assert_malformed(&server, &call, &format!("{mode:?} many_node {entry}")).await;
        }
        let written: i64 = server.cmd(&["EXISTS", key]).await;
        assert_eq!(written, 0, "{mode:?}: no refused layout ran a call");

        let mut peek = vec![ro_invoke, ro.as_str(), "1", key, "1"];
        peek.extend(layout("fw_peek"));
        let reply: Vec<i64> = server.cmd(&peek).await;
        assert_eq!(reply[..3], [1, 2, 2], "{mode:?}: a peek runs read-only");
        let written: i64 = server.cmd(&["EXISTS", key]).await;
        assert_eq!(written, 0, "{mode:?}: a peek writes nothing");
        let mut acquire = vec![node_invoke, node.as_str(), "0", "1", key, "1"];
        acquire.extend(layout("fw_acquire"));
        let reply: Vec<i64> = server.cmd(&acquire).await;
        assert_eq!(
            reply[..3],
            [1, 2, 1],
            "{mode:?}: a node runs a single acquire"
        );
    }
}

/// Runs 40 concurrent acquires on `backend`, all of which must be allowed.
async fn concurrent_acquires(backend: &RedisBackend, round: usize) {
    let limit = Limit::per_minute(1_000).expect("limit");
    let keys: Vec<Key> = (0..40)
        .map(|i| Key::new("reload", "sms", &format!("r{round}c{i}")))
        .collect();
    let calls = keys.iter().map(|key| {
        let limit = &limit;
        async move { backend.acquire(&[Request::new(key, limit, 1)]).await }
    });
    for decisions in join_all(calls).await {
        assert!(decisions.expect("decided").allowed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_calls_load_the_library_again_after_function_flush() {
    let server = RedisServer::start();
    if !server.kind().has_functions() {
        return;
    }
    let backend = Arc::new(
        RedisBackend::builder(server.url())
            .coalesce(true)
            .connect()
            .await
            .expect("connect"),
    );
    assert!(backend.coalesces());
    for round in 0..5 {
        let _: String = server.cmd(&["FUNCTION", "FLUSH"]).await;
        concurrent_acquires(&backend, round).await;
    }
    // The coalesced entry alone missing (a library of the same name
    // without it): the calls alone succeed, the coalesced ones load the
    // whole library again and succeed too.
    // (library.lua registers them last.)
    let library = RedisBackend::library_source();
    let cut = library
        .find("redis.register_function(RL_PREFIX .. 'many', many)")
        .expect("the library registers its coalesced entry");
    let without_many = &library[..cut];
    let _: String = server.cmd(&["FUNCTION", "FLUSH"]).await;
    let loaded: redis::RedisResult<String> = server
        .try_cmd(&["FUNCTION", "LOAD", "REPLACE", without_many])
        .await;
    loaded.expect("the library without its coalesced entry loads");
    let before = backend.coalesced().expect("coalescing");
    concurrent_acquires(&backend, 10).await;
    let after = backend.coalesced().expect("coalescing");
    assert!(after.batches > before.batches, "{before:?} {after:?}");
    let functions: redis::Value = server.cmd(&["FUNCTION", "LIST"]).await;
    assert!(
        format!("{functions:?}").contains("_many"),
        "the whole library is loaded again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_waiting_caller_times_out_at_its_own_deadline_and_the_queue_goes_on_after() {
    let server = RedisServer::start();
    for mode in modes(&server) {
        waiting_callers_time_out(&server, mode).await;
    }
}

/// Callers waiting behind a paused server, in `mode`.
async fn waiting_callers_time_out(server: &RedisServer, mode: CallMode) {
    let timeout = Duration::from_millis(300);
    let backend = RedisBackend::builder(server.url())
        .call_mode(mode)
        .coalesce(true)
        .timeout(timeout)
        .connect()
        .await
        .expect("connect");
    let limit = Limit::per_minute(1_000).expect("limit");
    let keys: Vec<Key> = (0..20)
        .map(|i| Key::new("late", "sms", &format!("c{i}{mode:?}")))
        .collect();
    server.pause();
    let started = std::time::Instant::now();
    let calls = keys.iter().enumerate().map(|(i, key)| {
        let (backend, limit) = (&backend, &limit);
        async move {
            // Callers arriving one after the other, each with its deadline.
            tokio::time::sleep(Duration::from_millis(10 * i as u64)).await;
            let begun = std::time::Instant::now();
            let result = backend.acquire(&[Request::new(key, limit, 1)]).await;
            (begun.elapsed(), result)
        }
    });
    let results = join_all(calls).await;
    server.resume();
    for (took, result) in results {
        assert!(
            matches!(result, Err(BackendError::Timeout(t)) if t == timeout),
            "{result:?}"
        );
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(2),
            "a caller waited {took:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    // Nothing is left stuck: the next calls are decided.
    concurrent_acquires(&backend, 1).await;
}

#[tokio::test]
async fn a_bound_of_zero_is_refused_when_building() {
    let error = RedisBackend::builder("redis://127.0.0.1:1/")
        .coalesce(true)
        .coalesce_max(0)
        .connect()
        .await
        .expect_err("0 calls in a coalesced call");
    assert!(format!("{error}").contains("coalesce_max(0)"), "{error}");
    let error = RedisBackend::builder("redis://127.0.0.1:1/")
        .coalesce(true)
        .coalesce_in_flight(0)
        .connect()
        .await
        .expect_err("no call in flight");
    assert!(
        format!("{error}").contains("coalesce_in_flight(0)"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_the_sentinels_master_are_coalesced() {
    let server = RedisServer::start();
    let sentinel = RedisSentinel::start(&server);
    let backend = RedisBackend::sentinel_builder([sentinel.url()], sentinel.master_name())
        .coalesce(true)
        .coalesce_max(8)
        .connect()
        .await
        .expect("connect");
    assert!(backend.is_sentinel() && backend.coalesces());
    concurrent_acquires(&backend, 0).await;
    let counts = backend.coalesced().expect("coalescing");
    assert!(counts.batches > 0 && counts.largest <= 8, "{counts:?}");
    assert_eq!(counts.alone + counts.batched, 40, "{counts:?}");
}

/// Scripts coalesce on one server: `EVALSHA` of the coalesced script, and
/// `EVAL` of its source when the server lost its scripts (`SCRIPT FLUSH`
/// before each round), which caches it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_coalesce_and_are_sent_again_after_script_flush() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .call_mode(CallMode::Scripts)
        .coalesce(true)
        .connect()
        .await
        .expect("connect");
    assert!(backend.coalesces());
    for round in 0..5 {
        let _: String = server.cmd(&["SCRIPT", "FLUSH"]).await;
        let before = backend.coalesced().expect("coalescing");
        concurrent_acquires(&backend, 20 + round).await;
        let after = backend.coalesced().expect("coalescing");
        assert!(after.batches > before.batches, "{before:?} {after:?}");
    }
}

/// The hash slot of `key` (CRC16/XMODEM of its hash tag), as Redis
/// Cluster computes it.
fn slot_of(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16_384
}

/// The index in `cluster.masters()` of the master serving each slot.
async fn owners(cluster: &RedisCluster) -> Vec<usize> {
    let reply: redis::Value = cluster.masters()[0].cmd(&["CLUSTER", "SLOTS"]).await;
    let redis::Value::Array(ranges) = reply else {
        panic!("CLUSTER SLOTS: {reply:?}");
    };
    let mut owners = vec![usize::MAX; 16_384];
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            panic!("a range: {range:?}");
        };
        let (redis::Value::Int(first), redis::Value::Int(last), redis::Value::Array(master)) =
            (&fields[0], &fields[1], &fields[2])
        else {
            panic!("a range: {fields:?}");
        };
        let redis::Value::Int(port) = master[1] else {
            panic!("a master: {master:?}");
        };
        let index = cluster
            .masters()
            .iter()
            .position(|m| i64::from(m.port()) == port)
            .expect("a master of the cluster");
        for owner in &mut owners[*first as usize..=*last as usize] {
            *owner = index;
        }
    }
    owners
}

/// Moves `slot` from master `from` to master `to` as `redis-cli --cluster
/// reshard` does (importing, migrating, `MIGRATE` of its keys a few at a
/// time, then the slot's new owner told to every master, itself first),
/// pausing between
/// batches of keys so that calls meet the slot half moved.
async fn migrate(cluster: &RedisCluster, slot: u16, from: usize, to: usize) {
    let (source, target) = (&cluster.masters()[from], &cluster.masters()[to]);
    let source_id: String = source.cmd(&["CLUSTER", "MYID"]).await;
    let target_id: String = target.cmd(&["CLUSTER", "MYID"]).await;
    let slot = slot.to_string();
    let _: String = target
        .cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id])
        .await;
    let _: String = source
        .cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id])
        .await;
    let port = target.port().to_string();
    loop {
        let keys: Vec<String> = source.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "2"]).await;
        if keys.is_empty() {
            break;
        }
        let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        migrate.extend(keys.iter().map(String::as_str));
        let _: String = source.cmd(&migrate).await;
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    // The new owner first, then the old one, then the others (as Redis's
    // documentation orders it).
    let others = (0..cluster.masters().len()).filter(|&i| i != from && i != to);
    for i in [to, from].into_iter().chain(others) {
        let _: String = cluster.masters()[i]
            .cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id])
            .await;
    }
}

/// On a 3-master cluster, each master's single-limit acquires are
/// coalesced apart (`<library>_many_node`), and slots move from one master
/// to another under load: every identity is allowed exactly its limit,
/// whether its calls went alone, coalesced, coalesced on a node that no
/// longer served them (sent again alone), or through a half-moved slot —
/// no decision lost, none counted twice.
///
/// A failed call may or may not have been decided, so it is counted as
/// either, and at most 1 call in 50 may fail. None failed in 30 runs under
/// load (both cores kept busy besides); a first version, which sent every
/// call alone while it read the cluster's map again, saw calls sent alone
/// through redis-rs's cluster client stall until their timeout in about 1
/// run in 5 (once 743 of 1 920).
///
/// That stall is redis-rs's and is still seen, rarely: its cluster client
/// begins a slot refresh that never completes (the last line of its own
/// log), and every call through it times out (here about 1 400 of 1 920
/// calls failed, before the backend opened a stalled connection again).
/// Each slot move is a chance of it under load (5 stalls in 33 loaded runs
/// of this file that moved slots twice, Functions then scripts, 16 of them
/// with a logger taking redis-rs's debug lines; none in 26 that moved them
/// once), so each run moves them once, in one call mode per server: the
/// Functions library on Redis 7, scripts on Valkey and on Redis without
/// `FUNCTION` (`scripts/test` runs all three). The backend opens a new
/// connection after a second of calls unanswered
/// (`reopen_stalled_cluster`): a stall then costs the calls of about two
/// rounds, allowed besides the 1 in 50 when it happened. (One CI run on
/// a machine loaded besides saw 264 of 1 920 fail on Valkey, about four
/// rounds, when this test had the default period, 15 s here; its output
/// does not say whether redis-rs stalled.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_coalesces_per_master_and_no_decision_is_lost_or_doubled_while_slots_move() {
    let cluster = RedisCluster::start();
    let mode = match cluster.masters()[0].kind() {
        ServerKind::Redis => CallMode::Functions,
        _ => CallMode::Scripts,
    };
    slots_move_under_load(&cluster, mode).await;
}

/// Four slots of master 0 move to master 1 under a load coalesced in
/// `mode` (see above).
async fn slots_move_under_load(cluster: &RedisCluster, mode: CallMode) {
    // One call alone per master at a time: the others queue, so that
    // concurrent calls are coalesced even on this small load.
    let backend = Arc::new(
        RedisBackend::cluster_builder(cluster.urls())
            .call_mode(mode)
            .coalesce(true)
            .coalesce_in_flight(1)
            .timeout(Duration::from_secs(3))
            // Should redis-rs's client stall (see above), a new connection
            // after two rounds of calls that time out.
            .reopen_stalled_cluster(Some(Duration::from_secs(1)))
            .connect()
            .await
            .expect("connect"),
    );
    assert!(backend.is_cluster() && backend.coalesces());
    let owners = owners(cluster).await;
    // Four slots of master 0, six identities in each (they move to master
    // 1), and 40 identities anywhere (they stay).
    let moving_slots: Vec<u16> = (0..16_384u16)
        .filter(|&slot| owners[usize::from(slot)] == 0)
        .step_by(997)
        .take(4)
        .collect();
    assert_eq!(moving_slots.len(), 4);
    let mut moving: Vec<String> = Vec::new();
    for &slot in &moving_slots {
        let mut found = 0;
        for i in 0.. {
            let id = format!("m{mode:?}{slot}-{i}");
            if slot_of(&format!("sms:{id}")) == slot {
                moving.push(id);
                found += 1;
                if found == 6 {
                    break;
                }
            }
        }
    }
    let staying: Vec<String> = (0..40).map(|i| format!("s{mode:?}{i}")).collect();
    let identities: Vec<Key> = moving
        .iter()
        .chain(&staying)
        .map(|id| Key::new("mv", "sms", id))
        .collect();
    // GCRA (decided in place) for even identities, the token bucket (its
    // own entry) for odd ones; 20 a day: nothing comes back during the test.
    let gcra = Limit::per_day(20).expect("limit");
    let bucket = Limit::per_day(20)
        .expect("limit")
        .with_algorithm(Algorithm::TokenBucket)
        .expect("limit");
    let limit_of = |i: usize| if i.is_multiple_of(2) { gcra } else { bucket };

    // Every identity's caller acquires `rounds` times, each round all at
    // once; the slots move during the first phase.
    let load = |rounds: usize| {
        let backend = Arc::clone(&backend);
        let identities = identities.clone();
        let (gcra, bucket) = (gcra, bucket);
        async move {
            // Per identity: calls allowed, and calls that failed (which may
            // or may not have been decided: a timeout after the call was
            // sent).
            let mut allowed = vec![(0usize, 0usize); identities.len()];
            for _ in 0..rounds {
                let calls = identities.iter().enumerate().map(|(i, key)| {
                    let backend = &backend;
                    let limit = if i.is_multiple_of(2) { &gcra } else { &bucket };
                    async move { backend.acquire(&[Request::new(key, limit, 1)]).await }
                });
                for (i, result) in join_all(calls).await.into_iter().enumerate() {
                    match result {
                        Ok(decision) => allowed[i].0 += usize::from(decision.allowed()),
                        Err(error) => {
                            eprintln!("{}: {error}", identities[i]);
                            allowed[i].1 += 1;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            allowed
        }
    };
    let moving_load = tokio::spawn(load(18));
    tokio::time::sleep(Duration::from_millis(20)).await;
    for &slot in &moving_slots {
        migrate(cluster, slot, 0, 1).await;
    }
    let first = moving_load.await.expect("the load ran");
    let second = load(12).await;
    // Never more than the limit (no decision lost: every allowed call was
    // counted), and never less than the limit less the calls that failed
    // (none counted twice: only a failed call may have been counted with
    // no answer).
    let mut failed = 0;
    for (i, key) in identities.iter().enumerate() {
        let (allowed, errors) = (first[i].0 + second[i].0, first[i].1 + second[i].1);
        failed += errors;
        assert!(
            allowed <= 20 && allowed + errors >= 20,
            "{mode:?} {key}: allowed {allowed} of 30 under 20 a day, {errors} failed ({:?})",
            limit_of(i).algorithm()
        );
    }
    // Calls may fail only while slots move, and rarely (see above): at
    // most 1 in 50; and when redis-rs's client stalled, the calls of the
    // rounds until a new connection was in use besides (two or three
    // rounds, each ending at the timeout: 31 to 166 calls in 7 stalls of
    // 60 loaded runs on Valkey; four allowed).
    let reopened = backend.cluster_connections_reopened();
    let stalled = if reopened > 0 {
        identities.len() * 4
    } else {
        0
    };
    assert!(
        failed * 50 <= identities.len() * 30 + stalled * 50,
        "{mode:?}: {failed} of {} calls failed, the connection opened again {reopened} times",
        identities.len() * 30
    );
    if reopened > 0 {
        eprintln!(
            "{mode:?}: the cluster connection stalled and was opened again {reopened} times; {failed} calls failed"
        );
    }
    // The moved identities' states are on master 1 now, whole: a peek
    // there (through the cluster) finds nothing left.
    for (i, key) in identities.iter().enumerate().take(moving.len()) {
        let state = format!("{}:{}", key.as_str(), limit_of(i).storage_suffix());
        let here: i64 = cluster.masters()[1].cmd(&["EXISTS", &state]).await;
        assert_eq!(here, 1, "{mode:?}: {state} moved to master 1");
        let left = backend
            .peek(&[Request::new(key, &limit_of(i), 1)])
            .await
            .expect("peek");
        if first[i].1 + second[i].1 == 0 {
            assert!(!left.allowed(), "{key}");
        }
    }
    let mut counts = backend.coalesced().expect("coalescing");
    if counts.rerouted == 0 && reopened > 0 {
        // The stall hid the moves from the coalesced calls: the slots move
        // back under load, once, and no identity is allowed more.
        eprintln!("{mode:?}: no call was rerouted; the slots move back under load");
        let back_load = tokio::spawn(load(6));
        tokio::time::sleep(Duration::from_millis(20)).await;
        for &slot in &moving_slots {
            migrate(cluster, slot, 1, 0).await;
        }
        let third = back_load.await.expect("the load ran");
        for (i, key) in identities.iter().enumerate() {
            let allowed = first[i].0 + second[i].0 + third[i].0;
            assert!(
                allowed <= 20,
                "{mode:?} {key}: allowed {allowed} under 20 a day"
            );
        }
        counts = backend.coalesced().expect("coalescing");
    }
    assert!(
        counts.batches > 0 && counts.batched > counts.batches,
        "{counts:?}"
    );
    assert!(
        counts.rerouted > 0,
        "{mode:?}: calls coalesced on a master that no longer served their slot: {counts:?}"
    );
}

#[test]
fn a_runtime_dropped_while_its_call_is_in_flight_leaves_the_backend_usable() {
    let server = RedisServer::start();
    let runtime = |threads| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let (first, second) = (runtime(1), runtime(1));
    let backend = Arc::new(second.block_on(async {
        RedisBackend::builder(server.url())
            .coalesce(true)
            // One call in flight: the second runtime's calls queue behind
            // the first runtime's.
            .coalesce_in_flight(1)
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect")
    }));
    assert!(backend.coalesces());
    let limit = Limit::per_minute(1_000).expect("limit");
    // The server stops answering: the first runtime's call stays in
    // flight, and the second runtime's calls queue behind it.
    server.pause();
    let in_flight = {
        let (backend, limit) = (backend.clone(), limit);
        first.spawn(async move {
            let key = Key::new("rt", "sms", "first");
            backend.acquire(&[Request::new(&key, &limit, 1)]).await
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let queued: Vec<_> = (0..4)
        .map(|i| {
            let (backend, limit) = (backend.clone(), limit);
            second.spawn(async move {
                let key = Key::new("rt", "sms", &format!("queued{i}"));
                backend.acquire(&[Request::new(&key, &limit, 1)]).await
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // The first runtime goes away with its call (and whatever it spawned).
    drop(in_flight);
    first.shutdown_background();
    server.resume();
    second.block_on(async {
        // The queued callers hear an answer or an error, not silence until
        // their timeout ...
        // (either: their turn was lost with the first runtime's drain).
        for call in queued {
            tokio::time::timeout(Duration::from_secs(4), call)
                .await
                .expect("a queued caller heard back before its timeout")
                .expect("task")
                .ok();
        }
        // ... and the lane is free: the next call is decided.
        let key = Key::new("rt", "sms", "after");
        let decided = tokio::time::timeout(
            Duration::from_secs(4),
            backend.acquire(&[Request::new(&key, &limit, 1)]),
        )
        .await
        .expect("the next call was sent, not left queued behind a lost one");
        assert!(decided.expect("decided").allowed());
    });
}
