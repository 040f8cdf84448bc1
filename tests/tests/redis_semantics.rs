//! What the Redis backend guarantees on one real server: TTLs, key layout,
//! time source, exact retry_after, write-free refusals, one round trip per
//! batch, and the sliding log's cost at its cap.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ratewall::{
    Algorithm, Key, Limit, Limiter,
    backend::{Backend, Decisions, MemoryBackend, Request},
    clock::{Clock, ManualClock, SystemClock},
    error::BackendError,
};
use ratewall_redis::{CallMode, RedisBackend};
use ratewall_tests::harness::{RedisServer, ServerKind};

const EPOCH_US: u64 = 1_700_000_000_123_456;

fn limit(algorithm: Algorithm, threshold: u64, period: Duration) -> Limit {
    Limit::new(threshold, period)
        .and_then(|l| l.with_algorithm(algorithm))
        .expect("valid limit")
}

fn storage_keys(key: &Key, limit: &Limit) -> Vec<String> {
    vec![format!("{key}:{}", limit.storage_suffix())]
}

async fn client_clock_backend(server: &RedisServer, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(server.url())
        .client_clock(clock.clone())
        .connect()
        .await
        .expect("connect")
}

async fn changes(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "persistence"]).await;
    info.lines()
        .find_map(|line| line.strip_prefix("rdb_changes_since_last_save:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("rdb_changes_since_last_save in INFO")
}

async fn code_calls(server: &RedisServer) -> u64 {
    command_calls(server, &["fcall", "fcall_ro", "evalsha", "eval"]).await
}

/// Calls of `commands` (lower-case names) the server counted, added up.
async fn command_calls(server: &RedisServer, commands: &[&str]) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]).await;
    commands
        .iter()
        .map(|name| {
            info.lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{name}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Takes 3 units of `limit` for `key` (allowed), and gives how long until
/// the limit is back to full, in whole milliseconds rounded up.
async fn take_three(backend: &RedisBackend, key: &Key, limit: &Limit) -> i64 {
    let decision = backend
        .acquire(&[Request::new(key, limit, 3)])
        .await
        .expect("acquire")[0];
    assert!(decision.allowed(), "{decision:?}");
    decision.reset_after().as_micros().div_ceil(1_000) as i64
}

#[tokio::test]
async fn the_backend_takes_functions_where_the_server_has_them_and_scripts_where_it_does_not() {
    let server = RedisServer::start();
    let kind = server.kind();
    // The harness started the server it was asked for.
    let info: String = server.cmd(&["INFO", "server"]).await;
    let is_valkey = info.lines().any(|line| line.trim() == "server_name:valkey");
    assert_eq!(is_valkey, kind == ServerKind::Valkey, "{kind}: {info}");
    let functions = server.try_cmd::<redis::Value>(&["FUNCTION", "LIST"]).await;
    assert_eq!(
        functions.is_ok(),
        kind.has_functions(),
        "{kind}: {functions:?}"
    );

    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let expected = if kind.has_functions() {
        CallMode::Functions
    } else {
        CallMode::Scripts
    };
    assert_eq!(backend.call_mode(), expected, "{kind}");
    // And the calls really go that way: single-limit, batch and peek.
    let functions_before = command_calls(&server, &["fcall", "fcall_ro"]).await;
    let scripts_before = command_calls(&server, &["evalsha", "eval"]).await;
    let key = Key::new("mode", "api", "u1");
    let minute = limit(Algorithm::Gcra, 5, Duration::from_secs(60));
    let hour = limit(Algorithm::SlidingLog, 50, Duration::from_secs(3_600));
    backend
        .acquire(&[Request::new(&key, &minute, 1)])
        .await
        .expect("acquire");
    let both = [Request::new(&key, &minute, 1), Request::new(&key, &hour, 1)];
    backend.acquire(&both).await.expect("acquire a batch");
    backend.peek(&both).await.expect("peek a batch");
    let functions = command_calls(&server, &["fcall", "fcall_ro"]).await - functions_before;
    let scripts = command_calls(&server, &["evalsha", "eval"]).await - scripts_before;
    if kind.has_functions() {
        assert_eq!((functions, scripts), (3, 0), "{kind}: FCALL only");
    } else {
        assert_eq!(functions, 0, "{kind}: no FCALL");
        assert!(scripts >= 3, "{kind}: EVALSHA (and EVAL once per script)");
        // Asking for functions where there are none fails, saying why.
        let error = RedisBackend::builder(server.url())
            .call_mode(CallMode::Functions)
            .connect()
            .await
            .expect_err("no Functions library on this server");
        assert!(
            error.to_string().contains("loading the Functions library"),
            "{error}"
        );
    }
}

#[tokio::test]
async fn every_key_written_expires_exactly_when_the_decision_says_the_limit_is_back_to_full() {
    let server = RedisServer::start();
    let clock = ManualClock::new(EPOCH_US);
    let backend = client_clock_backend(&server, &clock).await;
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm, 4, Duration::from_secs(30));
        let key = Key::new("ttl", algorithm.name(), "alice");
        let expected_ms = take_three(&backend, &key, &limit).await;
        for storage in storage_keys(&key, &limit) {
            let pttl: i64 = server.cmd(&["PTTL", &storage]).await;
            assert!(
                pttl <= expected_ms && pttl > expected_ms - 1_000,
                "{algorithm}: {storage} has PTTL {pttl} ms, expected {expected_ms} ms (the decision's reset_after)"
            );
        }
    }
}

/// A pause of 30 s over windows of 1 s: the key of a window algorithm
/// lives until the pause ends (the windows' own TTLs would end in a second),
/// a full refund of the call taken before it does not delete it, and every
/// refusal until then names its end.
#[tokio::test]
async fn a_paused_window_key_lives_until_the_pause_ends() {
    let server = RedisServer::start();
    let clock = ManualClock::new(EPOCH_US);
    let backend = client_clock_backend(&server, &clock).await;
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        clock.set_micros(EPOCH_US);
        let limit = limit(algorithm, 4, Duration::from_secs(1));
        let key = Key::new("paused", algorithm.name(), "dave");
        let request = [Request::new(&key, &limit, 2)];
        let taken = backend.acquire(&request).await.expect("acquire")[0];
        backend
            .hold(&request, Duration::from_secs(30), 0)
            .await
            .expect("hold");
        backend
            .refund(&request, taken.at_micros())
            .await
            .expect("refund");
        for storage in storage_keys(&key, &limit) {
            let pttl: i64 = server.cmd(&["PTTL", &storage]).await;
            assert!(
                pttl > 29_000 && pttl <= 30_000,
                "{algorithm}: {storage} has PTTL {pttl} ms through a 30 s pause"
            );
        }
        for at in [0, 999_999, 1_000_000, 17_000_001, 29_999_999] {
            clock.set_micros(EPOCH_US + at);
            let refused = backend.peek(&request).await.expect("peek")[0];
            assert!(!refused.allowed(), "{algorithm} at {at} µs: {refused:?}");
            assert_eq!(
                refused.retry_after(),
                Duration::from_micros(30_000_000 - at),
                "{algorithm} at {at} µs"
            );
        }
        clock.set_micros(EPOCH_US + 30_000_000);
        let resumed = backend.acquire(&request).await.expect("acquire")[0];
        assert!(resumed.allowed(), "{algorithm}: {resumed:?}");
    }
}

#[tokio::test]
async fn an_extra_ttl_lengthens_the_keys_of_the_backend_that_sets_it_and_no_other() {
    let server = RedisServer::start();
    // Both on the server's clock: the single-limit calls of `plain` send
    // neither a time nor an extra TTL, those of `kept` send both.
    let kept = RedisBackend::builder(server.url())
        .extra_ttl(Duration::from_secs(3_600))
        .connect()
        .await
        .expect("connect");
    let plain = RedisBackend::connect(server.url()).await.expect("connect");
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm, 4, Duration::from_secs(30));
        // `kept` first, so that `plain` follows a call that set an extra TTL.
        for (backend, name) in [(&kept, "kept"), (&plain, "plain"), (&kept, "kept-again")] {
            let key = Key::new("ttl", algorithm.name(), name);
            let expected_ms = take_three(backend, &key, &limit).await;
            let extra_ms = if name == "plain" { 0 } else { 3_600_000 };
            for storage in storage_keys(&key, &limit) {
                let pttl: i64 = server.cmd(&["PTTL", &storage]).await;
                assert!(
                    pttl <= expected_ms + extra_ms && pttl > expected_ms + extra_ms - 1_000,
                    "{algorithm}, {name}: {storage} has PTTL {pttl} ms, expected {expected_ms} + {extra_ms} ms"
                );
            }
        }
    }
}

#[tokio::test]
async fn after_ten_thousand_distinct_identities_every_key_has_a_ttl() {
    let server = RedisServer::start();
    let backend = Arc::new(RedisBackend::connect(server.url()).await.expect("connect"));
    let limits: Vec<Limit> = Algorithm::ALL
        .iter()
        .map(|&a| limit(a, 3, Duration::from_secs(60)))
        .collect();
    let limits = Arc::new(limits);
    let mut connection = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let started = server_minute(&mut connection).await;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..16u64 {
        let (backend, limits) = (backend.clone(), limits.clone());
        tasks.spawn(async move {
            for identity in (worker..10_000).step_by(16) {
                let key = Key::from_display("rot", "login", &identity);
                let limit = &limits[identity as usize % limits.len()];
                let request = [Request::new(&key, limit, 1)];
                let decision = backend.acquire(&request).await.expect("acquire")[0];
                match identity % 5 {
                    0 => backend
                        .refund(&request, decision.at_micros())
                        .await
                        .expect("refund"),
                    1 => drop(backend.peek(&request).await.expect("peek")),
                    2 => drop(
                        backend
                            .acquire(&[Request::new(&key, limit, 3)])
                            .await
                            .expect("refused acquire"),
                    ),
                    _ => {}
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("worker");
    }
    let crossed_a_minute = server_minute(&mut connection).await != started;
    let mut cursor = "0".to_owned();
    let mut seen = 0usize;
    loop {
        let (next, keys): (String, Vec<String>) = redis::cmd("SCAN")
            .arg(&cursor)
            .arg("MATCH")
            .arg("rot:*")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut connection)
            .await
            .expect("SCAN");
        // A SCAN page may be empty before the scan ends; an empty pipeline
        // is not a command.
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("PTTL").arg(key);
        }
        let ttls: Vec<i64> = if keys.is_empty() {
            Vec::new()
        } else {
            pipe.query_async(&mut connection).await.expect("PTTL")
        };
        // -1: a key without a TTL, what this test looks for. (0: a key in
        // its last millisecond, a fixed window ending as the scan reads it;
        // -2: one that expired since the scan listed it.)
        for (key, ttl) in keys.iter().zip(&ttls) {
            assert_ne!(*ttl, -1, "{key} has no TTL");
        }
        seen += keys.len();
        if next == "0" {
            break;
        }
        cursor = next;
    }
    // Refunded states are fresh again and deleted; the others remain.
    let refunded = 10_000 / 5;
    let expected = 10_000 - refunded;
    if crossed_a_minute {
        // A fixed window's refund made in the next window has nothing to
        // give back (its units were in the window that ended), so such a
        // state stays until it expires: at most one per refunded
        // fixed-window identity.
        // And a fixed window's state written before the minute turned
        // expired with its window (exactly when the decision said the limit
        // was back to full): at most every fixed-window state kept.
        let fixed_refunded = (0..10_000u64).filter(|i| i % 5 == 0 && i % 6 == 0).count();
        let fixed_kept = (0..10_000u64).filter(|i| i % 5 != 0 && i % 6 == 0).count();
        assert!(
            (expected - fixed_kept..=expected + fixed_refunded).contains(&seen),
            "keys left: {seen}, expected {expected} (- up to {fixed_kept} windows ended, + up to {fixed_refunded} across a minute)"
        );
    } else {
        assert_eq!(seen, expected, "keys left: one per identity");
    }
}

/// A period no test here outlives. A fixed window's boundaries fall on
/// multiples of its period in Redis time, so a test whose point is not time
/// (isolation, what a refusal writes) takes windows of a day, entered at
/// least a minute before one ends ([`RedisServer::away_from_window_end`]):
/// no window ends under its calls. (With a minute, a slow run that crossed
/// one saw its first call's window gone: keys missing, a refused call
/// allowed.)
const A_DAY: Duration = Duration::from_secs(86_400);

/// The server's current minute (fixed windows of 60 s turn over with it).
async fn server_minute(connection: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (seconds, _): (u64, u64) = redis::cmd("TIME")
        .query_async(connection)
        .await
        .expect("TIME");
    seconds / 60
}

#[tokio::test]
async fn hostile_identities_are_accepted_and_never_share_state() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    server.away_from_window_end(A_DAY).await;
    let long = "x".repeat(10 * 1024);
    let identities = [
        "{",
        "}",
        "{}",
        "a}{b",
        ":",
        "a:b",
        "a b",
        " ",
        "",
        "%7B",
        "%",
        "日本語",
        "😀",
        "\u{0}",
        "\r\n",
        long.as_str(),
    ];
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra,
    ] {
        let limit = limit(algorithm, 1, A_DAY);
        let keys: Vec<Key> = identities
            .iter()
            .map(|id| Key::new("host", "sms", id))
            .collect();
        for key in &keys {
            let first = backend
                .acquire(&[Request::new(key, &limit, 1)])
                .await
                .expect("acquire");
            assert!(
                first.allowed(),
                "{algorithm}: first call of {:?} refused",
                key.hash_tag()
            );
        }
        for key in &keys {
            let second = backend
                .acquire(&[Request::new(key, &limit, 1)])
                .await
                .expect("acquire");
            assert!(
                !second.allowed(),
                "{algorithm}: second call of {:?} allowed",
                key.hash_tag()
            );
        }
        for key in &keys {
            for storage in storage_keys(key, &limit) {
                let exists: i64 = server.cmd(&["EXISTS", &storage]).await;
                assert_eq!(exists, 1, "{algorithm}: {storage:.60} missing");
            }
        }
    }
    let distinct: HashSet<String> = identities
        .iter()
        .map(|id| Key::new("host", "sms", id).to_string())
        .collect();
    assert_eq!(distinct.len(), identities.len());
}

#[tokio::test]
async fn server_time_gives_one_timeline_to_clients_whose_clocks_differ_by_ten_seconds() {
    let server = RedisServer::start();
    let real = SystemClock.now_micros();
    let ahead = ManualClock::new(real + 5_000_000);
    let behind = ManualClock::new(real - 5_000_000);
    let limiter_ahead = Limiter::builder()
        .backend(RedisBackend::connect(server.url()).await.expect("connect"))
        .clock(ahead)
        .build()
        .expect("limiter");
    let limiter_behind = Limiter::builder()
        .backend(RedisBackend::connect(server.url()).await.expect("connect"))
        .clock(behind)
        .build()
        .expect("limiter");
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm, 5, Duration::from_secs(3_600));
        let key = Key::new("skew", algorithm.name(), "shared");
        let requests = [Request::new(&key, &limit, 1)];
        let reference_clock = ManualClock::new(0);
        let reference = MemoryBackend::with_clock(reference_clock.clone());
        let mut allowed = 0;
        for call in 0..12 {
            let limiter = if call % 2 == 0 {
                &limiter_ahead
            } else {
                &limiter_behind
            };
            let decisions: Decisions = limiter
                .requests()
                .acquire_all(&requests)
                .await
                .expect("acquire");
            let at = decisions[0].at_micros();
            let now = SystemClock.now_micros();
            assert!(
                at.abs_diff(now) < 1_000_000,
                "{algorithm}: decided at {at}, real time {now}"
            );
            reference_clock.set_micros(at);
            assert_eq!(
                decisions,
                reference.acquire_sync(&requests),
                "{algorithm}: call {call}"
            );
            allowed += usize::from(decisions.allowed());
        }
        assert_eq!(allowed, 5, "{algorithm}");
    }
}

#[tokio::test]
async fn a_call_exactly_retry_after_a_rejection_is_allowed_for_every_algorithm() {
    let server = RedisServer::start();
    let clock = ManualClock::new(EPOCH_US);
    let backend = client_clock_backend(&server, &clock).await;
    for algorithm in Algorithm::ALL {
        for cost in [1, 2] {
            let limit = limit(algorithm, 3, Duration::from_secs(10))
                .with_slots(5)
                .expect("slots");
            let key = Key::from_display("retry", algorithm.name(), &cost);
            let request = [Request::new(&key, &limit, cost)];
            clock.advance_micros(1_234_567);
            let refused = loop {
                let decisions = backend.acquire(&request).await.expect("acquire");
                if !decisions.allowed() {
                    break decisions[0];
                }
                clock.advance_micros(100_003);
            };
            let wait = refused.retry_after().as_micros() as u64;
            assert!(wait > 0, "{algorithm}: refused with retry_after 0");
            clock.advance_micros(wait - 1);
            assert!(
                !backend.peek(&request).await.expect("peek").allowed(),
                "{algorithm} cost {cost}: allowed 1 µs before retry_after"
            );
            clock.advance_micros(1);
            assert!(
                backend.acquire(&request).await.expect("acquire").allowed(),
                "{algorithm} cost {cost}: refused exactly retry_after ({wait} µs) after the rejection"
            );
        }
    }
}

#[tokio::test]
async fn refused_calls_and_peeks_write_nothing() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    server.away_from_window_end(A_DAY).await;
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm, 2, A_DAY);
        let key = Key::new("ro", algorithm.name(), "bob");
        let request = [Request::new(&key, &limit, 2)];
        assert!(backend.acquire(&request).await.expect("acquire").allowed());
        let before = changes(&server).await;
        for _ in 0..5 {
            assert!(!backend.acquire(&request).await.expect("acquire").allowed());
            backend.peek(&request).await.expect("peek");
        }
        assert_eq!(
            changes(&server).await,
            before,
            "{algorithm}: refusals or peeks wrote"
        );
    }
}

#[tokio::test]
async fn a_state_given_back_entirely_is_deleted() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    server.away_from_window_end(A_DAY).await;
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm, 3, A_DAY);
        let key = Key::new("fresh", algorithm.name(), "carol");
        let request = [Request::new(&key, &limit, 2)];
        let decision = backend.acquire(&request).await.expect("acquire")[0];
        backend
            .refund(&request, decision.at_micros())
            .await
            .expect("refund");
        for storage in storage_keys(&key, &limit) {
            let exists: i64 = server.cmd(&["EXISTS", &storage]).await;
            assert_eq!(exists, 0, "{algorithm}: {storage} survived a full refund");
        }
        let peek = backend.peek(&request).await.expect("peek")[0];
        assert_eq!(
            (peek.remaining(), peek.reset_after()),
            (limit.capacity(), Duration::ZERO),
            "{algorithm}"
        );
    }
}

#[tokio::test]
async fn costs_above_the_capacity_are_invalid_requests_not_forever_rejections() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let limit = limit(Algorithm::SlidingLog, 3, Duration::from_secs(120));
    let key = Key::new("inv", "x", "y");
    for cost in [0, 4, u64::MAX] {
        let error = backend
            .acquire(&[Request::new(&key, &limit, cost)])
            .await
            .unwrap_err();
        assert!(
            matches!(error, BackendError::Invalid(_)),
            "cost {cost}: {error}"
        );
        let error = backend
            .peek(&[Request::new(&key, &limit, cost)])
            .await
            .unwrap_err();
        assert!(
            matches!(error, BackendError::Invalid(_)),
            "cost {cost}: {error}"
        );
    }
    let keys: i64 = server.cmd(&["DBSIZE"]).await;
    assert_eq!(keys, 0);
}

#[tokio::test]
async fn a_batch_naming_one_state_twice_is_invalid_and_writes_nothing() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let key = Key::new("dup", "sms", "+33600000000");
    for algorithm in Algorithm::ALL {
        let one = limit(algorithm, 1, Duration::from_secs(60));
        let three = limit(algorithm, 3, Duration::from_secs(60));
        let batch = [Request::new(&key, &one, 1), Request::new(&key, &three, 1)];
        let error = backend.acquire(&batch).await.unwrap_err();
        assert!(
            matches!(error, BackendError::Invalid(_)),
            "{algorithm}: {error}"
        );
        let error = backend.acquire_once(&batch, "r1").await.unwrap_err();
        assert!(
            matches!(error, BackendError::Invalid(_)),
            "{algorithm}: {error}"
        );
    }
    let keys: i64 = server.cmd(&["DBSIZE"]).await;
    assert_eq!(keys, 0);
}

/// Every text in a reply, nested or not.
fn texts(value: &redis::Value, out: &mut Vec<String>) {
    match value {
        redis::Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(text) => out.push(text.clone()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|item| texts(item, out));
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            texts(k, out);
            texts(v, out);
        }),
        _ => {}
    }
}

#[tokio::test]
async fn a_batch_or_a_lease_naming_an_unknown_algorithm_is_an_error_and_writes_nothing() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    // One call, so the library is loaded.
    let key = Key::new("known", "api", "u1");
    let known = limit(Algorithm::Gcra, 1, Duration::from_secs(60));
    backend
        .acquire(&[Request::new(&key, &known, 1)])
        .await
        .expect("a known algorithm");
    let (): () = server.cmd(&["FLUSHALL"]).await;
    // Header, then one request: algorithm `zz`, threshold, period, burst,
    // slots, cost, then for a batch its block, for a lease its three
    // numbers.
    let batch_args = [
        "acquire", "s", "0", "0", "zz", "1", "60000000", "1", "0", "1", "0",
    ];
    let lease_args = [
        "lease", "s", "0", "0", "zz", "1", "60000000", "1", "0", "1", "1", "0", "0",
    ];
    let keys = ["2", "{t}:a", "{t}:b"];
    // Each call: what it runs (for messages), then the command.
    let mut calls: Vec<(String, Vec<String>)> = Vec::new();
    if backend.call_mode() == CallMode::Functions {
        let list: redis::Value = server.cmd(&["FUNCTION", "LIST"]).await;
        let mut names = Vec::new();
        texts(&list, &mut names);
        for (suffix, args) in [("_batch", &batch_args[..]), ("_lease", &lease_args[..])] {
            let function = names
                .iter()
                .find(|name| name.starts_with("rl_") && name.ends_with(suffix))
                .unwrap_or_else(|| panic!("no `*{suffix}` function in {names:?}"));
            let call = ["FCALL", function.as_str()]
                .iter()
                .chain(&keys)
                .chain(args)
                .map(|arg| arg.to_string())
                .collect();
            calls.push((function.clone(), call));
        }
    } else {
        // The scripts path: the batch script, sent with its source. (Its
        // lease entry point has no public source; it runs the same
        // lua/lease.lua as the `_lease` function checked on the servers
        // that have functions.)
        let call = ["EVAL", RedisBackend::script_source()]
            .iter()
            .chain(&keys)
            .chain(&batch_args)
            .map(|arg| arg.to_string())
            .collect();
        calls.push(("the batch script".to_owned(), call));
    }
    for (what, call) in &calls {
        let call: Vec<&str> = call.iter().map(String::as_str).collect();
        let error = server
            .try_cmd::<redis::Value>(&call)
            .await
            .expect_err("an unknown algorithm");
        assert!(
            error.to_string().contains("unknown algorithm zz"),
            "{what}: {error}"
        );
    }
    let keys: i64 = server.cmd(&["DBSIZE"]).await;
    assert_eq!(keys, 0);
}

#[tokio::test]
async fn sms_limits_over_two_identities_are_one_call_and_all_or_nothing_on_standalone() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let per_minute = limit(Algorithm::SlidingLog, 1, Duration::from_secs(60));
    let per_hour = limit(Algorithm::SlidingLog, 5, Duration::from_secs(3_600));
    let per_day = limit(Algorithm::FixedWindow, 10, Duration::from_secs(86_400));
    let per_ip = limit(Algorithm::Gcra, 2, Duration::from_secs(3_600));
    let phones: Vec<Key> = (0..3)
        .map(|i| Key::new("sms", "phone", &format!("+33 6 00 00 00 0{i}")))
        .collect();
    let ip = Key::new("sms", "ip", "203.0.113.7");
    // On the scripts path the first call of a script is EVALSHA, refused
    // (NOSCRIPT), then EVAL: decide once elsewhere so only steady-state
    // calls are counted.
    let warm_up = Key::new("sms", "phone", "warm-up");
    let warm_up_ip = Key::new("sms", "ip", "198.51.100.1");
    backend
        .acquire(&[
            Request::new(&warm_up, &per_minute, 1),
            Request::new(&warm_up, &per_hour, 1),
            Request::new(&warm_up, &per_day, 1),
            Request::new(&warm_up_ip, &per_ip, 1),
        ])
        .await
        .expect("warm-up");
    let calls_before = code_calls(&server).await;
    let mut outcomes = Vec::new();
    for phone in &phones {
        let batch = [
            Request::new(phone, &per_minute, 1),
            Request::new(phone, &per_hour, 1),
            Request::new(phone, &per_day, 1),
            Request::new(&ip, &per_ip, 1),
        ];
        outcomes.push(backend.acquire(&batch).await.expect("acquire"));
    }
    assert_eq!(
        code_calls(&server).await - calls_before,
        3,
        "one call of our code per decision"
    );
    assert!(outcomes[0].allowed() && outcomes[1].allowed());
    let refused = &outcomes[2];
    assert!(!refused.allowed());
    assert!(
        !refused[3].allowed(),
        "the per-IP limit refuses the third phone"
    );
    assert!(
        refused[0].allowed() && refused[0].remaining() == 1,
        "the phone's own limits report they would allow it"
    );
    // Nothing was consumed from the third phone's limits.
    let phone = &phones[2];
    let alone = backend
        .acquire(&[Request::new(phone, &per_minute, 1)])
        .await
        .expect("acquire");
    assert!(
        alone.allowed(),
        "the refused call consumed the minute limit"
    );
}

#[tokio::test]
async fn a_full_sliding_log_at_its_cap_stays_below_the_slowlog_threshold() {
    let server = RedisServer::start_with(&["--slowlog-log-slower-than", "10000"]);
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let cap = Limit::SLIDING_LOG_CAP;
    let limit = limit(Algorithm::SlidingLog, cap, Duration::from_secs(60));
    let key = Key::new("cap", "sms", "dave");
    for _ in 0..cap / 100 {
        let decisions = backend
            .acquire(&[Request::new(&key, &limit, 100)])
            .await
            .expect("fill");
        assert!(decisions.allowed());
    }
    let entries: u64 = server.cmd(&["ZCARD", &storage_keys(&key, &limit)[0]]).await;
    assert_eq!(entries, cap);
    let _: String = server.cmd(&["SLOWLOG", "RESET"]).await;
    for call in 0..100 {
        let decision = backend
            .acquire(&[Request::new(&key, &limit, 1 + call % 3)])
            .await
            .expect("acquire")[0];
        assert!(!decision.allowed());
        assert!(decision.retry_after() > Duration::ZERO);
    }
    let slow: Vec<redis::Value> = server.cmd(&["SLOWLOG", "GET", "128"]).await;
    assert!(
        slow.is_empty(),
        "calls on a full log took over 10 ms: {slow:?}"
    );
}

#[tokio::test]
async fn sliding_log_entries_of_one_microsecond_never_collide_even_after_a_refund() {
    // Entries are named by their time: calls in one microsecond (a client
    // clock that stands still) must each add their own, also once a refund
    // has freed some of the names.
    let server = RedisServer::start();
    let clock = ManualClock::new(EPOCH_US);
    let backend = client_clock_backend(&server, &clock).await;
    let limit = limit(Algorithm::SlidingLog, 100, Duration::from_secs(60));
    let key = Key::new("one_us", "sms", "erin");
    let log = &storage_keys(&key, &limit)[0];
    let take = |cost| {
        let backend = &backend;
        let (key, limit) = (&key, &limit);
        async move {
            backend
                .acquire(&[Request::new(key, limit, cost)])
                .await
                .expect("acquire")[0]
        }
    };
    let first = take(3).await;
    assert!(first.allowed());
    for cost in [2, 70] {
        assert!(take(cost).await.allowed());
    }
    let entries: u64 = server.cmd(&["ZCARD", log]).await;
    assert_eq!(entries, 75, "one entry per admitted unit");
    backend
        .refund(&[Request::new(&key, &limit, 3)], first.at_micros())
        .await
        .expect("refund");
    let entries: u64 = server.cmd(&["ZCARD", log]).await;
    assert_eq!(entries, 72);
    // The same microsecond again: 28 units fit exactly, not one more.
    let after = take(28).await;
    assert!(after.allowed());
    assert_eq!(after.remaining(), 0);
    let entries: u64 = server.cmd(&["ZCARD", log]).await;
    assert_eq!(entries, 100, "no entry overwrote another");
    assert!(!take(1).await.allowed());
    let members: Vec<String> = server.cmd(&["ZRANGE", log, "0", "-1"]).await;
    assert_eq!(members.iter().collect::<HashSet<_>>().len(), 100);
}

#[tokio::test]
async fn sliding_log_entries_whose_names_wrap_around_never_overwrite_each_other() {
    // An entry's name repeats every 2^25 µs (33.6 s): in a log of a
    // two minutes, three calls that far apart are all kept.
    let server = RedisServer::start();
    let clock = ManualClock::new(EPOCH_US);
    let backend = client_clock_backend(&server, &clock).await;
    let limit = limit(Algorithm::SlidingLog, 3, Duration::from_secs(120));
    let key = Key::new("wrap", "sms", "frank");
    let log = &storage_keys(&key, &limit)[0];
    let request = [Request::new(&key, &limit, 1)];
    for call in 0..3 {
        if call > 0 {
            clock.advance(Duration::from_micros(1 << 25));
        }
        assert!(backend.acquire(&request).await.expect("acquire").allowed());
    }
    let entries: u64 = server.cmd(&["ZCARD", log]).await;
    assert_eq!(entries, 3, "one entry per admitted call");
    let oldest: Vec<String> = server.cmd(&["ZRANGE", log, "0", "0", "WITHSCORES"]).await;
    assert_eq!(
        oldest[1],
        EPOCH_US.to_string(),
        "each entry keeps its own time"
    );
    assert!(!backend.acquire(&request).await.expect("acquire").allowed());
}

/// A limit that blocks ([`Limit::with_block`]), by the server's time: the
/// refusal blocks the identity in the one script call that decides it,
/// from the refusal's time (Redis `TIME`) for exactly the block; later
/// refusals name the same end, to the microsecond, and do not extend it.
/// The block is one hash beside the state keys, `<key>:b` (field: the
/// limit's storage suffix, value: the end in µs), expiring at the end.
/// Another identity is untouched; past the end, the identity is admitted.
#[tokio::test]
async fn a_refusal_by_a_limit_that_blocks_blocks_the_identity_to_the_microsecond_of_redis_time() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let block = Duration::from_secs(3);
    let limit = Limit::per_second(1)
        .and_then(|l| l.with_block(block))
        .expect("limit");
    let key = Key::new("blk", "login", "mallory");
    let call = [Request::new(&key, &limit, 1)];
    assert!(backend.acquire(&call).await.expect("acquire").allowed());
    let before = code_calls(&server).await;
    let refused = backend.acquire(&call).await.expect("acquire")[0];
    assert_eq!(
        code_calls(&server).await - before,
        1,
        "one call decides and blocks"
    );
    assert!(!refused.allowed());
    assert_eq!((refused.retry_after(), refused.remaining()), (block, 0));
    let end = refused.at_micros() + 3_000_000;
    let block_key = format!("{key}:b");
    let stored: String = server
        .cmd(&["HGET", &block_key, &limit.storage_suffix()])
        .await;
    assert_eq!(stored.parse::<u64>().expect("µs"), end);
    let ttl: i64 = server.cmd(&["PTTL", &block_key]).await;
    assert!(
        (2_000..=3_000).contains(&ttl),
        "the block key expires at its end: {ttl} ms"
    );
    let blocks = backend.blocks(&key).await.expect("blocks");
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].suffix, limit.storage_suffix());
    assert!(blocks[0].left <= block && blocks[0].left > Duration::from_secs(2));
    let other = Key::new("blk", "login", "alice");
    assert!(
        backend
            .acquire(&[Request::new(&other, &limit, 1)])
            .await
            .expect("acquire")
            .allowed(),
        "another identity is untouched"
    );
    // Past the state's own second, still refused until the block's end.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let during = backend.acquire(&call).await.expect("acquire")[0];
    assert!(!during.allowed());
    assert_eq!(
        during.at_micros() + during.retry_after().as_micros() as u64,
        end,
        "the same end, to the microsecond"
    );
    tokio::time::sleep(during.retry_after() + Duration::from_millis(5)).await;
    assert!(backend.acquire(&call).await.expect("acquire").allowed());
}

/// Slots given back and already past are dropped by the next reservation
/// however many there are: more than Lua unpacks at once (about 8 000)
/// are deleted in several `HDEL`s, and the reservation is decided, not
/// failed.
#[tokio::test]
async fn a_reservation_drops_nine_thousand_past_given_back_slots() {
    let server = RedisServer::start();
    let clock = ManualClock::new(EPOCH_US);
    let backend = client_clock_backend(&server, &clock).await;
    let key = Key::new("rl", "freed", "many");
    // Slots a minute apart: the given-back one lives a minute.
    let limit = limit(Algorithm::Gcra, 1, Duration::from_secs(60));
    let requests = [Request::new(&key, &limit, 1)];
    let wait = Duration::from_secs(600);
    let _first = backend.reserve(&requests, wait).await.expect("reserve");
    let second = backend.reserve(&requests, wait).await.expect("reserve");
    let _third = backend.reserve(&requests, wait).await.expect("reserve");
    // Not the last reservation: its slot is given back.
    backend.cancel(&requests, &second).await.expect("cancel");
    let freed: Vec<String> = server.cmd(&["KEYS", "*:freed"]).await;
    assert_eq!(freed.len(), 1, "{freed:?}");
    let freed = freed[0].as_str();
    let past: Vec<String> = (1..=9_000).map(|t| t.to_string()).collect();
    let mut hset = vec!["HSET", freed];
    for t in &past {
        hset.extend([t.as_str(), "1"]);
    }
    let added: i64 = server.cmd(&hset).await;
    assert_eq!(added, 9_000);
    // Kept past its TTL (the given-back slot's, a minute away), however
    // slow the machine: what is tested is the reservation's cleanup.
    let kept: i64 = server.cmd(&["PERSIST", freed]).await;
    assert_eq!(kept, 1);
    let held: i64 = server.cmd(&["HLEN", freed]).await;
    assert_eq!(held, 9_001, "the given-back slot and 9 000 past ones");

    let fourth = backend.reserve(&requests, wait).await;
    assert!(fourth.is_ok(), "{fourth:?}");
    let left: Vec<String> = server.cmd(&["HKEYS", freed]).await;
    let now = clock.now_micros();
    assert!(
        left.iter()
            .all(|slot| slot.parse::<u64>().expect("a slot") >= now),
        "{} slots left, some past",
        left.len()
    );
}
