//! Idempotent decisions (`Backend::acquire_once`): a client that retries a
//! call whose reply was lost (the script ran, the reply never arrived) is
//! charged once. Replies are lost for real, by a TCP proxy in front of a real
//! Redis ([`ratewall_tests::proxy::Proxy`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewall::{
    Algorithm, Key, Limit,
    backend::{Backend, BoxFuture, Decisions, MemoryBackend, Request},
    clock::ManualClock,
    error::BackendError,
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{RedisCluster, RedisServer};
use ratewall_tests::proxy::Proxy;

/// The per-call timeout of backends behind the proxy.
const TIMEOUT: Duration = Duration::from_millis(300);

/// Slack allowed beyond the timeout (scheduling on a loaded machine).
const SLACK: Duration = Duration::from_millis(250);

const EPOCH_US: u64 = 1_700_000_000_000_000;

fn limit(algorithm: Algorithm, threshold: u64, period: Duration) -> Limit {
    Limit::new(threshold, period)
        .and_then(|l| l.with_algorithm(algorithm))
        .expect("valid limit")
}

async fn behind(proxy: &Proxy) -> RedisBackend {
    RedisBackend::builder(proxy.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect through the proxy")
}

fn remaining(decisions: &Decisions) -> Vec<u64> {
    decisions.iter().map(|d| d.remaining()).collect()
}

async fn peek_remaining(backend: &dyn Backend, requests: &[Request<'_>]) -> Vec<u64> {
    remaining(&backend.peek(requests).await.expect("peek"))
}

/// Calls `acquire_once` through the proxy, losing its reply: it must time
/// out within the timeout, and the proxy must have dropped a reply.
async fn lose_reply(
    proxy: &Proxy,
    backend: &RedisBackend,
    requests: &[Request<'_>],
    id: Option<&str>,
) {
    let dropped = proxy.replies_dropped();
    proxy.drop_next_reply();
    let started = Instant::now();
    let result = match id {
        Some(id) => backend.acquire_once(requests, id).await,
        None => backend.acquire(requests).await,
    };
    let took = started.elapsed();
    assert!(
        matches!(result, Err(BackendError::Timeout(_))),
        "the reply was lost, yet: {result:?}"
    );
    assert!(took <= TIMEOUT + SLACK, "the lost call took {took:?}");
    assert_eq!(proxy.replies_dropped(), dropped + 1);
}

/// Retries `acquire_once` through the proxy until the client has
/// reconnected (the proxy closes a connection that lost a reply).
async fn retry_through(
    backend: &RedisBackend,
    requests: &[Request<'_>],
    id: &str,
) -> (Decisions, Duration) {
    let started = Instant::now();
    loop {
        match backend.acquire_once(requests, id).await {
            Ok(decisions) => return (decisions, started.elapsed()),
            Err(error) => assert!(
                started.elapsed() < Duration::from_secs(10),
                "no retry got through the proxy within 10 s: {error}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_reply_is_charged_once_with_a_request_id() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let flaky = behind(&proxy).await;
    let direct = RedisBackend::connect(server.url()).await.expect("connect");
    let one = Limit::per_minute(1).expect("limit");
    let key = Key::new("idem", "pay", "alice");
    let call = [Request::new(&key, &one, 1)];

    lose_reply(&proxy, &flaky, &call, Some("order-42")).await;
    // The script ran: the only unit is gone, and the reply is kept.
    assert_eq!(peek_remaining(&direct, &call).await, [0]);
    let pttl: i64 = server.cmd(&["PTTL", "idem:{pay:alice}:req:order-42"]).await;
    assert!(
        (59_000..=60_000).contains(&pttl),
        "kept for the period: {pttl} ms"
    );

    // Another instance retries with the same id: the kept reply, no charge.
    let retried = direct.acquire_once(&call, "order-42").await.expect("retry");
    assert!(retried.allowed(), "{retried:?}");
    assert_eq!(peek_remaining(&direct, &call).await, [0]);
    // A different call is refused: one unit was taken in all.
    let other = direct.acquire_once(&call, "order-43").await.expect("other");
    assert!(!other.allowed());
    // The same client, once reconnected, gets the same reply again.
    let (again, after) = retry_through(&flaky, &call, "order-42").await;
    assert_eq!(again, retried, "a replay is the reply of the first call");
    assert_eq!(peek_remaining(&direct, &call).await, [0]);
    eprintln!(
        "T=1: lost reply -> retry through the proxy succeeded {after:?} later \
         ({} proxy connections)",
        proxy.connections_accepted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_request_id_a_retry_after_a_lost_reply_is_charged_twice() {
    // The failure mode acquire_once exists for, shown with the same proxy.
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let flaky = behind(&proxy).await;
    let direct = RedisBackend::connect(server.url()).await.expect("connect");
    let two = Limit::per_minute(2).expect("limit");
    let key = Key::new("idem", "pay", "bob");
    let call = [Request::new(&key, &two, 1)];

    lose_reply(&proxy, &flaky, &call, None).await;
    assert!(direct.acquire(&call).await.expect("retry").allowed());
    let control_key = Key::new("idem", "pay", "control");
    let control = [Request::new(&control_key, &two, 1)];
    direct.acquire(&control).await.expect("control");
    direct.acquire(&control).await.expect("control");
    assert_eq!(
        peek_remaining(&direct, &call).await,
        peek_remaining(&direct, &control).await,
        "one logical call took two units"
    );
}

/// SMS-style batch: three limits per phone and one per IP.
struct Batch {
    phone: Key,
    ip: Key,
    limits: [Limit; 4],
}

impl Batch {
    fn new(prefix: &str, phone: &str, ip: &str) -> Self {
        Self {
            phone: Key::new(prefix, "sms", phone),
            ip: Key::new(prefix, "ip", ip),
            limits: [
                limit(Algorithm::SlidingLog, 3, Duration::from_secs(60)),
                limit(Algorithm::Gcra, 5, Duration::from_secs(3_600)),
                limit(Algorithm::FixedWindow, 10, Duration::from_secs(86_400)),
                limit(Algorithm::SlidingWindow, 20, Duration::from_secs(3_600)),
            ],
        }
    }

    fn requests(&self) -> Vec<Request<'_>> {
        vec![
            Request::new(&self.phone, &self.limits[0], 1),
            Request::new(&self.phone, &self.limits[1], 1),
            Request::new(&self.phone, &self.limits[2], 1),
            Request::new(&self.ip, &self.limits[3], 1),
        ]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_limit_batch_retried_after_a_lost_reply_is_charged_once() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let flaky = behind(&proxy).await;
    let direct = RedisBackend::connect(server.url()).await.expect("connect");
    let batch = Batch::new("idem", "+33 6 12 34 56 78", "10.0.0.1");
    let call = batch.requests();
    // What exactly one charge of the batch leaves, on fresh identities.
    let control = Batch::new("idem", "control", "10.0.0.2");
    let once = {
        let requests = control.requests();
        direct.acquire(&requests).await.expect("control");
        peek_remaining(&direct, &requests).await
    };

    lose_reply(&proxy, &flaky, &call, Some("sms-7f3a")).await;
    assert_eq!(peek_remaining(&direct, &call).await, once, "the script ran");

    let retried = direct.acquire_once(&call, "sms-7f3a").await.expect("retry");
    assert!(retried.allowed());
    assert_eq!(retried.len(), 4);
    assert_eq!(
        peek_remaining(&direct, &call).await,
        once,
        "no second charge"
    );
    let (again, _) = retry_through(&flaky, &call, "sms-7f3a").await;
    assert_eq!(again, retried);
    assert_eq!(peek_remaining(&direct, &call).await, once);
    // The kept reply lives as long as the longest period (a day), at most
    // two minutes: a retry comes within seconds.
    let pttl: i64 = server
        .cmd(&["PTTL", "idem:{sms:+33 6 12 34 56 78}:req:sms-7f3a"])
        .await;
    assert!((110_000..=120_000).contains(&pttl), "{pttl}");
    // Reusing the id for another call shape is an error, not a wrong replay.
    let error = direct
        .acquire_once(&call[..2], "sms-7f3a")
        .await
        .expect_err("reused id");
    assert!(matches!(error, BackendError::Protocol(_)), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_replies_are_kept_under_an_escaped_id_in_the_keys_slot() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let one = Limit::per_minute(1).expect("limit");
    let key = Key::new("idem", "otp", "a:{b}");
    let call = [Request::new(&key, &one, 1)];
    assert!(
        backend
            .acquire_once(&call, "x:{y}%")
            .await
            .expect("first")
            .allowed()
    );
    let kept: Vec<String> = server.cmd(&["KEYS", "idem:*:req:*"]).await;
    assert_eq!(kept, ["idem:{otp:a%3A%7Bb%7D}:req:x%3A%7By%7D%25"]);
    // A refused call consumed nothing, so nothing is kept for it.
    let refused = backend.acquire_once(&call, "second").await.expect("second");
    assert!(!refused.allowed());
    let exists: i64 = server
        .cmd(&["EXISTS", "idem:{otp:a%3A%7Bb%7D}:req:second"])
        .await;
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_with_one_request_id_consume_once() {
    let server = RedisServer::start();
    let backend = Arc::new(RedisBackend::connect(server.url()).await.expect("connect"));
    let five = Arc::new(Limit::per_minute(5).expect("limit"));
    let key = Arc::new(Key::new("idem", "race", "carol"));
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (backend, five, key) = (backend.clone(), five.clone(), key.clone());
        calls.spawn(async move {
            backend
                .acquire_once(&[Request::new(&key, &five, 1)], "same")
                .await
                .expect("acquire_once")
        });
    }
    let mut replies = Vec::new();
    while let Some(reply) = calls.join_next().await {
        replies.push(reply.expect("task"));
    }
    assert!(replies.iter().all(|r| *r == replies[0] && r.allowed()));
    let call = [Request::new(&key, &five, 1)];
    let control_key = Key::new("idem", "race", "control");
    let control = [Request::new(&control_key, &five, 1)];
    backend.acquire(&control).await.expect("control");
    assert_eq!(
        peek_remaining(backend.as_ref(), &call).await,
        peek_remaining(backend.as_ref(), &control).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_hash_tag_keeps_its_reply_and_a_refusal_forgets_them() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::connect_cluster(cluster.urls())
        .await
        .expect("connect");
    let mut nodes = cluster.async_connection().await;
    let mut exists = async |key: String| -> i64 {
        redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut nodes)
            .await
            .expect("EXISTS")
    };

    // A batch over two hash tags (phone and IP): decided per tag.
    let batch = Batch::new("idemc", "+44 7700 900123", "192.0.2.1");
    let call = batch.requests();
    let control = Batch::new("idemc", "control", "192.0.2.2");
    let once = {
        let requests = control.requests();
        backend.acquire(&requests).await.expect("control");
        peek_remaining(&backend, &requests).await
    };
    let first = backend.acquire_once(&call, "c-1").await.expect("first");
    assert!(first.allowed());
    let again = backend.acquire_once(&call, "c-1").await.expect("again");
    assert_eq!(again, first);
    assert_eq!(peek_remaining(&backend, &call).await, once);
    assert_eq!(exists(format!("{}:req:c-1", batch.phone)).await, 1);
    assert_eq!(exists(format!("{}:req:c-1", batch.ip)).await, 1);

    // The reply was lost after the phone tag had consumed and before the IP
    // tag was decided: the retry replays the phone tag, decides the IP tag.
    let partial = Batch::new("idemc", "+44 7700 900456", "192.0.2.3");
    let call = partial.requests();
    let phone_part = backend
        .acquire_once(&call[..3], "c-2")
        .await
        .expect("phone tag alone");
    let retried = backend.acquire_once(&call, "c-2").await.expect("retry");
    assert!(retried.allowed());
    assert_eq!(&retried.as_slice()[..3], phone_part.as_slice(), "replayed");
    assert_eq!(peek_remaining(&backend, &call).await, once, "charged once");

    // When a later tag refuses, the earlier tags are given back and forget
    // their kept replies, so a retry decides again instead of replaying.
    let tight = limit(Algorithm::Gcra, 1, Duration::from_secs(60));
    let loose = limit(Algorithm::Gcra, 10, Duration::from_secs(60));
    let user = Key::new("idemc", "user", "dave");
    let ip = Key::new("idemc", "ip", "192.0.2.9");
    let call = [Request::new(&user, &loose, 1), Request::new(&ip, &tight, 1)];
    assert!(backend.acquire(&call[1..]).await.expect("use ip").allowed());
    let before = peek_remaining(&backend, &call[..1]).await;
    let refused = backend.acquire_once(&call, "c-3").await.expect("refused");
    assert!(!refused.allowed());
    assert_eq!(
        peek_remaining(&backend, &call[..1]).await,
        before,
        "given back"
    );
    assert_eq!(exists(format!("{user}:req:c-3")).await, 0, "forgotten");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_backend_replays_allowed_replies_for_the_longest_period_at_most_two_minutes() {
    let clock = ManualClock::new(EPOCH_US);
    let backend = MemoryBackend::with_clock(clock.clone());
    let key = Key::new("idem", "sms", "+1 555 0100");
    let minute = Limit::per_minute(2).expect("limit");
    let hour = Limit::per_hour(10).expect("limit");
    let call = [Request::new(&key, &minute, 1), Request::new(&key, &hour, 1)];

    let first = backend.acquire_once(&call, "a").await.expect("a");
    assert!(first.allowed());
    assert_eq!(remaining(&first), [1, 9]);
    clock.advance(Duration::from_secs(1));
    assert_eq!(backend.acquire_once(&call, "a").await.expect("a"), first);
    let b = backend.acquire_once(&call, "b").await.expect("b");
    assert_eq!(remaining(&b), [0, 8], "a new id is a new call");
    // Refused calls are not kept: the same id decides again later.
    assert!(!backend.acquire_once(&call, "c").await.expect("c").allowed());
    clock.advance(Duration::from_secs(61));
    let c = backend.acquire_once(&call, "c").await.expect("c later");
    assert!(c.allowed(), "{c:?}");
    // Kept for the longest period (an hour), at most two minutes, then
    // forgotten and swept.
    clock.advance(Duration::from_secs(50));
    assert_eq!(backend.acquire_once(&call, "a").await.expect("a"), first);
    let error = backend
        .acquire_once(&call[..1], "a")
        .await
        .expect_err("reused for another shape");
    assert!(matches!(error, BackendError::Protocol(_)), "{error}");
    clock.advance(Duration::from_secs(3_600));
    assert!(backend.evict_expired() >= 3, "kept replies are swept");
    let fresh = backend.acquire_once(&call, "a").await.expect("a again");
    assert_ne!(fresh, first, "decided anew after two minutes");
    assert_eq!(remaining(&fresh), [1, 9]);
}

/// A backend that does not override `acquire_once`.
#[derive(Debug, Default)]
struct Plain(MemoryBackend);

impl Backend for Plain {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.0.acquire(requests)
    }
    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.0.peek(requests)
    }
    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.0.refund(requests, at_micros)
    }
    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        self.0.reset(requests)
    }
}

#[tokio::test]
async fn the_default_acquire_once_is_a_plain_acquire() {
    let backend = Plain::default();
    let key = Key::new("idem", "plain", "x");
    let limit = Limit::per_minute(5).expect("limit");
    let call = [Request::new(&key, &limit, 1)];
    backend.acquire_once(&call, "same").await.expect("first");
    let second = backend.acquire_once(&call, "same").await.expect("second");
    assert_eq!(second[0].remaining(), 3, "not idempotent: charged twice");
}

// ---- taking back a call given up on (`Backend::cancel_once`) ----

/// A call cancelled after it ran gives back what it took; one cancelled
/// before it arrives takes nothing when it does; cancelling twice gives back
/// once. Every algorithm, on `backend`.
async fn cancel_once_takes_back_a_call_whether_it_ran_before_or_after(
    backend: &dyn Backend,
    run: &str,
) {
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm, 5, Duration::from_secs(60));
        let other = limit_per_hour(100);
        let key = Key::new(run, "cancel", algorithm.name());
        let requests = [Request::new(&key, &limit, 2), Request::new(&key, &other, 1)];
        // Ran, then cancelled: everything back, twice cancelled gives back once.
        let before = peek_remaining(backend, &requests).await;
        let taken = backend.acquire_once(&requests, "ran-first").await.unwrap();
        assert!(taken.allowed(), "{algorithm}");
        assert_ne!(
            peek_remaining(backend, &requests).await,
            before,
            "{algorithm}"
        );
        backend.cancel_once(&requests, "ran-first").await.unwrap();
        assert_eq!(
            peek_remaining(backend, &requests).await,
            before,
            "{algorithm}: given back"
        );
        backend.cancel_once(&requests, "ran-first").await.unwrap();
        assert_eq!(
            peek_remaining(backend, &requests).await,
            before,
            "{algorithm}: once"
        );
        // Cancelled first: the late call takes nothing and says it was not
        // admitted.
        backend.cancel_once(&requests, "late").await.unwrap();
        let late = backend.acquire_once(&requests, "late").await.unwrap();
        assert!(
            !late.allowed(),
            "{algorithm}: a cancelled call was admitted"
        );
        assert_eq!(
            peek_remaining(backend, &requests).await,
            before,
            "{algorithm}: took nothing"
        );
        // Another id is a call of its own.
        assert!(
            backend
                .acquire_once(&requests, "fresh")
                .await
                .unwrap()
                .allowed()
        );
    }
}

fn limit_per_hour(threshold: u64) -> Limit {
    Limit::per_hour(threshold).expect("limit")
}

#[tokio::test]
async fn the_memory_backend_takes_back_a_call_by_its_request_id() {
    let memory = MemoryBackend::with_clock(ManualClock::new(EPOCH_US));
    cancel_once_takes_back_a_call_whether_it_ran_before_or_after(&memory, "mem").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_takes_back_a_call_by_its_request_id() {
    let server = RedisServer::start();
    let redis = RedisBackend::connect(server.url()).await.expect("connect");
    cancel_once_takes_back_a_call_whether_it_ran_before_or_after(&redis, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_takes_back_a_call_by_its_request_id_on_every_hash_tag() {
    let cluster = RedisCluster::start();
    let redis = RedisBackend::connect_cluster(cluster.urls())
        .await
        .expect("connect");
    let limit = limit(Algorithm::Gcra, 5, Duration::from_secs(60));
    // Two identities: two hash tags, two masters (most likely), one id.
    let (a, b) = (
        Key::new("c", "cancel", "alice"),
        Key::new("c", "cancel", "bob"),
    );
    let requests = [Request::new(&a, &limit, 1), Request::new(&b, &limit, 1)];
    let before = peek_remaining(&redis, &requests).await;
    assert!(
        redis
            .acquire_once(&requests, "both")
            .await
            .unwrap()
            .allowed()
    );
    redis.cancel_once(&requests, "both").await.unwrap();
    assert_eq!(peek_remaining(&redis, &requests).await, before);
    redis.cancel_once(&requests, "early").await.unwrap();
    assert!(
        !redis
            .acquire_once(&requests, "early")
            .await
            .unwrap()
            .allowed()
    );
    assert_eq!(peek_remaining(&redis, &requests).await, before);
}

/// A limiter that gave up on calls (their replies lost: they ran) takes
/// them back once Redis answers again: with `cancel_abandoned(true)` every
/// call carries a request id, so a plain call's units do not stay taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_takes_back_the_calls_it_gave_up_on_once_redis_answers() {
    let server = RedisServer::start();
    // It reads back exact counts for seconds: a fixed window of a day,
    // entered at least a minute before it ends, ends nowhere near them.
    let day = Duration::from_secs(86_400);
    server.away_from_window_end(day).await;
    let proxy = Proxy::start(server.port()).await;
    let direct = RedisBackend::connect(server.url()).await.expect("connect");
    let limiter = ratewall::Limiter::builder()
        .backend(behind(&proxy).await)
        .prefix("gave")
        .failure_policy(ratewall::FailurePolicy::FailOpen)
        .cancel_abandoned(true)
        .build()
        .unwrap();
    let spec = ratewall::CallSpec::owned(
        "jobs",
        vec![ratewall::GroupSpec::owned(
            "jobs",
            vec![limit(Algorithm::FixedWindow, 10, day)],
        )],
    );
    let key = Key::new("gave", "jobs", "tenant");
    let window = limit(Algorithm::FixedWindow, 10, day);
    let left = || async {
        direct
            .peek(&[Request::new(&key, &window, 1)])
            .await
            .unwrap()[0]
            .remaining()
    };
    assert!(limiter.call(&spec, &[&"tenant"]).await.is_ok());
    assert_eq!(left().await, 9);
    // The next call runs in Redis but its reply is lost: the limiter times
    // out and lets it through (fail open)...
    proxy.drop_next_reply();
    let permit = limiter.call(&spec, &[&"tenant"]).await.unwrap();
    assert_eq!(permit.admission(), &ratewall::call::Admission::FailedOpen);
    drop(permit);
    // ...and takes it back as soon as Redis answers again.
    let deadline = Instant::now() + Duration::from_secs(20);
    while limiter.pending_cancels() > 0 || left().await != 9 {
        assert!(
            Instant::now() < deadline,
            "the abandoned call still counts: {} left, {} cancel(s) pending",
            left().await,
            limiter.pending_cancels()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Calls are decided in Redis again.
    assert!(matches!(
        limiter.call(&spec, &[&"tenant"]).await.unwrap().admission(),
        ratewall::call::Admission::Backend(_)
    ));
    assert_eq!(left().await, 8);
}
