//! A `RedisBackend` on the application's own connection
//! (`RedisBackend::with_connection`, `builder_with_connection`,
//! `with_cluster_connection`): the Functions library loaded on it (the
//! scripts where `FUNCTION` is refused:
//! `RATEWALL_TEST_SERVER=redis-no-functions`), a flush through the
//! application's handle recovered from, the timeout applied, refund
//! notices told and (with a pub/sub client) heard, and the application's
//! connection unchanged and working after the limiter and backend are
//! dropped, on a real `redis-server` and a real 3-master cluster. (That
//! it decides exactly as a backend from a URL: `redis_differential.rs`
//! and `redis_cluster.rs` run their cases on both.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ratewall::{
    Key, Limit, Limiter,
    backend::{Backend, Request},
    error::BackendError,
};
use ratewall_redis::{CallMode, RedisBackend};
use ratewall_tests::harness::{RedisCluster, RedisServer};
use redis::aio::{ConnectionLike, ConnectionManager};

fn per_hour(n: u64) -> Limit {
    Limit::per_hour(n).expect("limit")
}

/// The call mode the server takes: the library where it has `FUNCTION`.
fn expected_mode(server: &RedisServer) -> CallMode {
    if server.kind().has_functions() {
        CallMode::Functions
    } else {
        CallMode::Scripts
    }
}

/// What says which connection this is and what state it is in, from
/// `CLIENT INFO` on it: its id (the same id: the same connection, never
/// reopened), name, database, flags, RESP version, subscriptions,
/// transaction and tracking state.
async fn client_state(connection: &mut impl ConnectionLike) -> BTreeMap<String, String> {
    let info: String = redis::cmd("CLIENT")
        .arg("INFO")
        .query_async(connection)
        .await
        .expect("CLIENT INFO");
    let kept = [
        "id", "name", "db", "flags", "sub", "psub", "ssub", "multi", "watch", "resp", "redir",
        "user",
    ];
    info.split_whitespace()
        .filter_map(|field| field.split_once('='))
        .filter(|(name, _)| kept.contains(name))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// The normal (not pub/sub) client connections the server has, seen
/// through `connection`.
async fn clients(connection: &mut impl ConnectionLike) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("normal")
        .query_async(connection)
        .await
        .expect("CLIENT LIST");
    list.lines().count()
}

/// `SET` then `GET` on the application's handle.
async fn set_and_get(connection: &mut impl ConnectionLike, key: &str, value: &str) {
    let () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(connection)
        .await
        .expect("SET on the application's connection");
    let read: String = redis::cmd("GET")
        .arg(key)
        .query_async(connection)
        .await
        .expect("GET on the application's connection");
    assert_eq!(read, value);
}

/// One identity's limit decided by a limiter over `backend`: allowed once,
/// then refused (through the limiter's raw requests), then given back and
/// allowed again (the backend directly).
async fn decide(limiter: &Limiter, identity: &str) {
    let limit = per_hour(1);
    let key = limiter.key("own", &identity);
    let call = [Request::new(&key, &limit, 1)];
    let taken = limiter
        .requests()
        .acquire_all(&call)
        .await
        .expect("decided");
    assert!(taken.allowed());
    let refused = limiter
        .requests()
        .acquire_all(&call)
        .await
        .expect("decided");
    assert!(!refused.allowed());
    let at = taken.iter().next().expect("one decision").at_micros();
    limiter
        .requests()
        .refund_all(&call, at)
        .await
        .expect("refunded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_connection_manager_is_unchanged_and_keeps_working_after_the_limiter_is_dropped()
 {
    let server = RedisServer::start();
    let mut connection = ConnectionManager::new(server.client())
        .await
        .expect("the application's connection");
    let before = client_state(&mut connection).await;
    let clients_before = clients(&mut connection).await;

    let backend = RedisBackend::with_connection(connection.clone())
        .await
        .expect("a backend on the application's connection");
    assert_eq!(backend.call_mode(), expected_mode(&server));
    assert!(!backend.is_cluster());
    assert!(
        clients(&mut connection).await <= clients_before,
        "the backend opened a connection of its own"
    );
    let limiter = Limiter::builder()
        .backend(backend)
        .prefix("app")
        .build()
        .expect("limiter");
    decide(&limiter, "alice").await;
    // The application's commands interleave with the limiter's.
    set_and_get(&mut connection, "app:greeting", "hello").await;
    decide(&limiter, "bob").await;
    assert_eq!(client_state(&mut connection).await, before);

    drop(limiter);
    tokio::time::sleep(Duration::from_millis(50)).await;
    set_and_get(&mut connection, "app:greeting", "still here").await;
    let after = client_state(&mut connection).await;
    assert_eq!(
        after, before,
        "the backend changed the application's connection (or it was reopened)"
    );
    assert_eq!(after.get("name").map(String::as_str), Some(""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multiplexed_connection_on_resp3_is_used_as_it_is_and_keeps_working() {
    let server = RedisServer::start();
    let client = redis::Client::open(format!("{}?protocol=resp3", server.url())).expect("client");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("the application's connection");
    let before = client_state(&mut connection).await;
    assert_eq!(before.get("resp").map(String::as_str), Some("3"));

    let backend = RedisBackend::builder_with_connection(connection.clone())
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("a backend on the application's connection");
    assert_eq!(backend.call_mode(), expected_mode(&server));
    // Every kind of reply over RESP3: decisions, a peek, the registry.
    let limit = per_hour(2);
    let key = Key::new("app", "own", "carol");
    let call = [Request::new(&key, &limit, 1)];
    assert_eq!(
        backend.acquire(&call).await.expect("acquire")[0].remaining(),
        1
    );
    assert_eq!(backend.peek(&call).await.expect("peek")[0].remaining(), 1);
    backend
        .publish_limits("app", "own", &[limit])
        .await
        .expect("registry");
    let registered = backend.registered_limits("app").await.expect("registry");
    assert_eq!(registered.len(), 1, "{registered:?}");
    drop(backend);

    set_and_get(&mut connection, "app:greeting", "hello").await;
    assert_eq!(client_state(&mut connection).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_functions_library_is_loaded_on_the_given_connection_or_the_scripts_are_used() {
    let server = RedisServer::start();
    let connection = ConnectionManager::new(server.client())
        .await
        .expect("the application's connection");
    let backend = RedisBackend::with_connection(connection.clone())
        .await
        .expect("a backend on the application's connection");
    if server.kind().has_functions() {
        assert_eq!(backend.call_mode(), CallMode::Functions);
        let libraries: Vec<redis::Value> = server
            .cmd(&[
                "FUNCTION",
                "LIST",
                "LIBRARYNAME",
                RedisBackend::library_name(),
            ])
            .await;
        assert_eq!(libraries.len(), 1, "the library was not loaded");
    } else {
        assert_eq!(backend.call_mode(), CallMode::Scripts);
    }
    // Forced modes as on a backend from a URL.
    let scripts = RedisBackend::builder_with_connection(connection.clone())
        .call_mode(CallMode::Scripts)
        .connect()
        .await
        .expect("scripts");
    assert_eq!(scripts.call_mode(), CallMode::Scripts);
    let functions = RedisBackend::builder_with_connection(connection)
        .call_mode(CallMode::Functions)
        .connect()
        .await;
    if server.kind().has_functions() {
        assert_eq!(
            functions.expect("functions").call_mode(),
            CallMode::Functions
        );
    } else {
        let error = functions.expect_err("FUNCTION is refused");
        assert!(matches!(error, BackendError::Protocol(_)), "{error:?}");
        assert!(
            error
                .to_string()
                .contains("starting on the application's Redis connection"),
            "{error}"
        );
    }
    let limit = per_hour(1);
    let key = Key::new("app", "own", "dave");
    let call = [Request::new(&key, &limit, 1)];
    assert!(backend.acquire(&call).await.expect("acquire").allowed());
    assert!(!scripts.acquire(&call).await.expect("acquire").allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_through_the_applications_connection_is_recovered_from() {
    let server = RedisServer::start();
    let mut connection = ConnectionManager::new(server.client())
        .await
        .expect("the application's connection");
    let backend = RedisBackend::with_connection(connection.clone())
        .await
        .expect("a backend on the application's connection");
    let limit = per_hour(100);
    let key = Key::new("app", "own", "erin");
    let call = [Request::new(&key, &limit, 1)];
    for round in 0..5u64 {
        if server.kind().has_functions() {
            let () = redis::cmd("FUNCTION")
                .arg("FLUSH")
                .query_async(&mut connection)
                .await
                .expect("FUNCTION FLUSH");
        }
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut connection)
            .await
            .expect("SCRIPT FLUSH");
        let decided = backend.acquire(&call).await.expect("decided after a flush");
        assert_eq!(decided[0].remaining(), 99 - round);
    }
    if server.kind().has_functions() {
        let libraries: Vec<redis::Value> = server
            .cmd(&[
                "FUNCTION",
                "LIST",
                "LIBRARYNAME",
                RedisBackend::library_name(),
            ])
            .await;
        assert_eq!(libraries.len(), 1, "the library was not loaded again");
    }
    set_and_get(&mut connection, "app:greeting", "hello").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_applies_on_the_applications_connection_and_it_works_after() {
    let server = RedisServer::start();
    let mut connection = ConnectionManager::new(server.client())
        .await
        .expect("the application's connection");
    let timeout = Duration::from_millis(200);
    let backend = RedisBackend::builder_with_connection(connection.clone())
        .timeout(timeout)
        .connect()
        .await
        .expect("a backend on the application's connection");
    let limit = per_hour(100);
    let key = Key::new("app", "own", "frank");
    let call = [Request::new(&key, &limit, 1)];
    assert!(backend.acquire(&call).await.expect("acquire").allowed());

    server.pause();
    let start = Instant::now();
    let stalled = backend.acquire(&call).await;
    let took = start.elapsed();
    server.resume();
    assert!(
        matches!(stalled, Err(BackendError::Timeout(t)) if t == timeout),
        "{stalled:?}"
    );
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(1),
        "the call took {took:?} for a timeout of {timeout:?}"
    );
    // The reply the backend stopped waiting for came and was thrown away:
    // the application's replies are its own.
    set_and_get(&mut connection, "app:greeting", "hello").await;
    assert_eq!(
        backend.acquire(&call).await.expect("acquire")[0].remaining(),
        97,
        "the timed-out call was applied by the server when it resumed"
    );

    // Errors name the connection, not an address it does not know.
    server.stop();
    let error = backend
        .acquire(&call)
        .await
        .expect_err("the server is down");
    assert!(
        error
            .to_string()
            .contains("on the application's Redis connection"),
        "{error}"
    );
}

/// The subscriptions to `prefix`'s refund notices on `server`.
async fn subscribers(server: &RedisServer, prefix: &str) -> i64 {
    let counts: Vec<redis::Value> = server
        .cmd(&["PUBSUB", "NUMSUB", &format!("{prefix}:{{refunds}}")])
        .await;
    match counts.get(1) {
        Some(redis::Value::Int(n)) => *n,
        _ => 0,
    }
}

/// `b` checks `call` (refused: it remembers the refusal), `a` gives its
/// unit back with `give_back`, and `b` is admitted well before its deny
/// cache's maximum hold (1 s) ends: it was told. How long that took.
async fn refusal_forgotten(b: &Limiter, call: &[Request<'_>], give_back: impl Future) -> Duration {
    for _ in 0..2 {
        assert!(b.requests().check("own", call, None).await.is_err());
    }
    give_back.await;
    let start = Instant::now();
    while b.requests().check("own", call, None).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(5), "never admitted");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_notices_are_told_always_and_heard_with_a_pubsub_client() {
    const PREFIX: &str = "notices";
    let server = RedisServer::start();
    let connection = ConnectionManager::new(server.client())
        .await
        .expect("the application's connection");
    let limiter = |backend: RedisBackend| {
        Limiter::builder()
            .backend(backend)
            .prefix(PREFIX)
            .build()
            .expect("limiter")
    };
    // Another instance, from the URL: it subscribes.
    let url = limiter(RedisBackend::connect(server.url()).await.expect("url"));
    // No pub/sub client: no subscription.
    let deaf = limiter(
        RedisBackend::with_connection(connection.clone())
            .await
            .expect("backend"),
    );
    // With one: subscribed through it.
    let hearing = limiter(
        RedisBackend::builder_with_connection(connection.clone())
            .pubsub_client(server.client())
            .connect()
            .await
            .expect("backend"),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while subscribers(&server, PREFIX).await < 2 {
        assert!(Instant::now() < deadline, "the limiters never subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        subscribers(&server, PREFIX).await,
        2,
        "the URL's and the pub/sub client's; none for the backend without one"
    );

    let limit = per_hour(1);
    // Bound: without a notice the refusal is remembered for up to 1 s.
    let told = Duration::from_millis(600);
    for (round, (a, b, label)) in [
        (&deaf, &url, "told by a backend without a pub/sub client"),
        (&url, &hearing, "heard through the pub/sub client"),
    ]
    .into_iter()
    .enumerate()
    {
        let key = a.key("own", &format!("user-{round}"));
        let call = [Request::new(&key, &limit, 1)];
        let taken = a.requests().acquire_all(&call).await.expect("decided");
        assert!(taken.allowed());
        let at = taken.iter().next().expect("one decision").at_micros();
        let refund = async {
            a.requests().refund_all(&call, at).await.expect("refund");
        };
        let delay = refusal_forgotten(b, &call, refund).await;
        assert!(delay < told, "{label}: usable after {delay:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connection_is_used_as_a_cluster_and_keeps_working_after_the_limiter_is_dropped()
{
    let cluster = RedisCluster::start();
    let mut connection = cluster.async_connection().await;

    // Given to the standalone constructor: refused, naming the right one.
    let error = RedisBackend::with_connection(connection.clone())
        .await
        .expect_err("a cluster connection is not a server's");
    assert!(
        error.to_string().contains("with_cluster_connection"),
        "{error}"
    );

    let backend = RedisBackend::with_cluster_connection(connection.clone())
        .await
        .expect("a backend on the application's cluster connection");
    assert!(backend.is_cluster());
    let mode = if cluster.masters()[0].kind().has_functions() {
        CallMode::Functions
    } else {
        CallMode::Scripts
    };
    assert_eq!(backend.call_mode(), mode);
    if mode == CallMode::Functions {
        for master in cluster.masters() {
            let libraries: Vec<redis::Value> = master
                .cmd(&[
                    "FUNCTION",
                    "LIST",
                    "LIBRARYNAME",
                    RedisBackend::library_name(),
                ])
                .await;
            assert_eq!(libraries.len(), 1, "not loaded on {}", master.url());
        }
    }
    let limiter = Limiter::builder()
        .backend(backend)
        .prefix("app")
        .build()
        .expect("limiter");
    // Identities on every master, and a call over two hash tags.
    for n in 0..12 {
        decide(&limiter, &format!("user-{n}")).await;
    }
    let limit = per_hour(1);
    let (phone, ip) = (limiter.key("sms", &"phone"), limiter.key("ip", &"10.0.0.1"));
    let call = [
        Request::new(&phone, &limit, 1),
        Request::new(&ip, &limit, 1),
    ];
    assert!(
        limiter
            .requests()
            .acquire_all(&call)
            .await
            .expect("decided")
            .allowed()
    );
    assert!(
        !limiter
            .requests()
            .acquire_all(&call)
            .await
            .expect("decided")
            .allowed()
    );

    // A flush through the application's handle (every master) is recovered from.
    if mode == CallMode::Functions {
        let () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut connection)
            .await
            .expect("FUNCTION FLUSH");
    }
    decide(&limiter, "after-the-flush").await;

    drop(limiter);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for n in 0..12 {
        set_and_get(&mut connection, &format!("app:value:{n}"), "kept").await;
    }
}
