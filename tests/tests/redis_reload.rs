//! The Lua code is loaded again whenever the server lacks it, without a
//! single call failing: `SCRIPT FLUSH` and `FUNCTION FLUSH` every 2 ms
//! during a load run, on a standalone server (in both call modes, each
//! with and without coalesced calls) and on every master of a cluster; and the call
//! mode is chosen by what the server allows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ratewall::{
    Algorithm, Key, Limit,
    backend::{Backend, Request},
    error::BackendError,
};
use ratewall_redis::{CallMode, RedisBackend};
use ratewall_tests::harness::{RedisCluster, RedisServer};

/// How long the flushing goes on.
const RUN: Duration = Duration::from_millis(1_500);

/// The longest a run goes on while waiting for the floors of [`check`].
const CAP: Duration = Duration::from_secs(30);

/// A run makes more calls than this.
const MIN_CALLS: u64 = 300;

/// Each server is flushed more often than this during a run.
const MIN_FLUSHES: u64 = 100;

/// The pause between two flushes.
const FLUSH_EVERY: Duration = Duration::from_millis(2);

fn limits() -> Vec<Limit> {
    Algorithm::ALL
        .iter()
        .map(|&a| {
            Limit::new(10_000, Duration::from_secs(1))
                .and_then(|l| l.with_algorithm(a))
                .expect("limit")
        })
        .collect()
}

/// What a load run saw.
#[derive(Debug, Default)]
struct Tally {
    calls: AtomicU64,
    errors: AtomicU64,
    flushes: AtomicU64,
}

impl Tally {
    /// Whether the run made enough calls and flushed each of `servers` often enough.
    fn reached(&self, servers: usize) -> bool {
        self.calls.load(Ordering::Relaxed) > MIN_CALLS
            && self.flushes.load(Ordering::Relaxed) / servers as u64 > MIN_FLUSHES
    }
}

/// 16 workers calling `backend` (single limits of every algorithm, peeks,
/// refunds and multi-limit batches, some over two hash tags) while each of
/// `servers` is flushed every 2 ms (one flusher per server), for [`RUN`] or
/// until the floors are reached.
async fn load_while_flushing(backend: Arc<RedisBackend>, servers: &[RedisServer]) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let limits = Arc::new(limits());
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..16u64 {
        let (backend, limits, stop, tally) =
            (backend.clone(), limits.clone(), stop.clone(), tally.clone());
        workers.spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = Key::from_display("reload", "id", &(worker * 1_000 + n % 100));
                let other = Key::from_display("reload", "ip", &(n % 7));
                let limit = &limits[(n % limits.len() as u64) as usize];
                let next = &limits[((n + 1) % limits.len() as u64) as usize];
                let result: Result<(), BackendError> = match n % 5 {
                    0 | 1 => backend
                        .acquire(&[Request::new(&key, limit, 1)])
                        .await
                        .map(drop),
                    2 => backend
                        .peek(&[Request::new(&key, limit, 1)])
                        .await
                        .map(drop),
                    3 => backend
                        .acquire(&[Request::new(&key, limit, 1), Request::new(&key, next, 1)])
                        .await
                        .map(drop),
                    _ => {
                        let batch = [Request::new(&key, limit, 1), Request::new(&other, next, 1)];
                        match backend.acquire(&batch).await {
                            Ok(decisions) if decisions.allowed() => {
                                let at = decisions[0].at_micros();
                                backend.refund(&batch[..1], at).await
                            }
                            Ok(_) => Ok(()),
                            Err(error) => Err(error),
                        }
                    }
                };
                tally.calls.fetch_add(1, Ordering::Relaxed);
                if let Err(error) = result {
                    tally.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("call failed: {error}");
                }
                n += 1;
            }
        });
    }
    let mut flushers = tokio::task::JoinSet::new();
    for server in servers {
        let mut connection = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to flush");
        let (stop, tally) = (stop.clone(), tally.clone());
        flushers.spawn(async move {
            let mut tick = tokio::time::interval(FLUSH_EVERY);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let _: () = redis::pipe()
                    .cmd("SCRIPT")
                    .arg("FLUSH")
                    .ignore()
                    .cmd("FUNCTION")
                    .arg("FLUSH")
                    .ignore()
                    .query_async(&mut connection)
                    .await
                    .expect("flush");
                tally.flushes.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    // At least `RUN`, and on a busy machine until both floors of `check`
    // are reached (at most `CAP`): what is judged is that no call fails
    // while the server is flushed often, not how fast this machine is.
    let started = tokio::time::Instant::now();
    tokio::time::sleep(RUN).await;
    while !tally.reached(servers.len()) && started.elapsed() < CAP {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = flushers.join_next().await {
        done.expect("flusher");
    }
    while let Some(done) = workers.join_next().await {
        done.expect("worker");
    }
    tally
}

/// No call failed, and each of `servers` was flushed often.
fn check(tally: &Tally, what: &str, servers: usize) {
    let (calls, errors, flushes) = (
        tally.calls.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        tally.flushes.load(Ordering::Relaxed),
    );
    let per_server = flushes / servers as u64;
    eprintln!("{what}: {calls} calls, {per_server} flushes per server, {errors} errors");
    assert!(calls > MIN_CALLS, "{what}: only {calls} calls in {CAP:?}");
    assert!(
        per_server > MIN_FLUSHES,
        "{what}: only {per_server} flushes per server in {CAP:?}"
    );
    assert_eq!(errors, 0, "{what}: {errors} of {calls} calls failed");
}

async fn standalone_run(mode: CallMode, coalesce: bool) {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .call_mode(mode)
        .coalesce(coalesce)
        .connect()
        .await
        .expect("connect");
    assert_eq!(backend.call_mode(), mode);
    assert_eq!(backend.coalesces(), coalesce);
    let backend = Arc::new(backend);
    let tally = load_while_flushing(backend.clone(), std::slice::from_ref(&server)).await;
    check(
        &tally,
        &format!("standalone, {mode:?}, coalesce {coalesce}"),
        1,
    );
    if let Some(counts) = backend.coalesced() {
        eprintln!("coalesced: {counts:?}");
        assert!(counts.batches > 0, "{counts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_functions_and_scripts_every_2ms_causes_no_errors_with_the_library() {
    standalone_run(CallMode::Functions, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_functions_and_scripts_every_2ms_causes_no_errors_with_coalesced_calls() {
    standalone_run(CallMode::Functions, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_functions_and_scripts_every_2ms_causes_no_errors_with_scripts() {
    standalone_run(CallMode::Scripts, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_functions_and_scripts_every_2ms_causes_no_errors_with_coalesced_scripts() {
    standalone_run(CallMode::Scripts, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_every_cluster_master_every_2ms_causes_no_errors() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::connect_cluster(cluster.urls())
        .await
        .expect("connect");
    assert_eq!(backend.call_mode(), CallMode::Functions);
    let tally = load_while_flushing(Arc::new(backend), cluster.masters()).await;
    check(&tally, "cluster", cluster.masters().len());
}

/// Coalesced per master, in both call modes: a coalesced call that finds
/// the library or its script missing on its master loads it (or sends
/// the script's source) and goes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_every_cluster_master_every_2ms_causes_no_errors_with_coalesced_calls() {
    let cluster = RedisCluster::start();
    let modes = if cluster.masters()[0].kind().has_functions() {
        vec![CallMode::Functions, CallMode::Scripts]
    } else {
        vec![CallMode::Scripts]
    };
    for mode in modes {
        let backend = RedisBackend::cluster_builder(cluster.urls())
            .call_mode(mode)
            .coalesce(true)
            .connect()
            .await
            .expect("connect");
        assert!(backend.coalesces());
        let backend = Arc::new(backend);
        let tally = load_while_flushing(backend.clone(), cluster.masters()).await;
        check(
            &tally,
            &format!("cluster, {mode:?}, coalesced"),
            cluster.masters().len(),
        );
        let counts = backend.coalesced().expect("coalescing");
        eprintln!("coalesced: {counts:?}");
        assert!(counts.batches > 0, "{mode:?}: {counts:?}");
    }
}

async fn library_loaded(server: &RedisServer) -> bool {
    let libraries: redis::Value = server
        .cmd(&[
            "FUNCTION",
            "LIST",
            "LIBRARYNAME",
            RedisBackend::library_name(),
        ])
        .await;
    matches!(libraries, redis::Value::Array(items) if !items.is_empty())
}

#[tokio::test]
async fn the_first_call_after_function_flush_succeeds_and_loads_the_library_again() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    assert_eq!(backend.call_mode(), CallMode::Functions, "Redis 7 in Auto");
    assert!(library_loaded(&server).await, "loaded when connecting");
    let limit = Limit::per_minute(2).expect("limit");
    let key = Key::new("again", "api", "alice");
    let _: String = server.cmd(&["FUNCTION", "FLUSH"]).await;
    assert!(!library_loaded(&server).await);
    let decisions = backend
        .acquire(&[Request::new(&key, &limit, 1)])
        .await
        .expect("decided after FUNCTION FLUSH");
    assert_eq!(decisions[0].remaining(), 1);
    assert!(library_loaded(&server).await, "loaded again by the call");
}

#[tokio::test]
async fn a_user_without_functions_gets_scripts_in_auto_and_a_clear_error_when_forced() {
    let server = RedisServer::start();
    let _: String = server
        .cmd(&[
            "ACL",
            "SETUSER",
            "limited",
            "on",
            ">secret",
            "~*",
            "&*",
            "+@all",
            "-function",
        ])
        .await;
    let url = format!("redis://limited:secret@127.0.0.1:{}/", server.port());
    let auto = RedisBackend::connect(url.as_str())
        .await
        .expect("connect in Auto");
    assert_eq!(auto.call_mode(), CallMode::Scripts);
    let limit = Limit::per_minute(1).expect("limit");
    let key = Key::new("acl", "api", "bob");
    let request = [Request::new(&key, &limit, 1)];
    assert!(auto.acquire(&request).await.expect("acquire").allowed());
    assert!(!auto.acquire(&request).await.expect("acquire").allowed());
    let forced = RedisBackend::builder(url.as_str())
        .call_mode(CallMode::Functions)
        .connect()
        .await
        .expect_err("FUNCTION LOAD is not allowed to this user");
    let message = forced.to_string();
    assert!(message.contains("Functions library"), "{message}");
    assert!(!message.contains("secret"), "{message}");
}
