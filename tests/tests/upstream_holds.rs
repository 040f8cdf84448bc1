//! An upstream's word, heard by every instance ([`Limiter::hold`]): two
//! limiters sharing one Redis stand for two processes calling one upstream;
//! what one of them hears (a `429` with `Retry-After`, a remaining count)
//! holds the budget the other one draws on.

use std::time::Duration;

use ratewall::{
    Algorithm, CallSpec, FailurePolicy, GroupSpec, Keys, Limit, Limiter,
    upstream::{Counts, Hold},
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;

/// Requests and tokens per minute, the second settled.
fn chat() -> CallSpec {
    CallSpec::owned(
        "chat",
        vec![
            GroupSpec::owned("chat_rpm", vec![Limit::per_minute(600).expect("limit")]),
            GroupSpec::owned("chat_tpm", vec![Limit::per_minute(60_000).expect("limit")]).settled(),
        ],
    )
    .with_policy(FailurePolicy::FailClosed)
}

async fn instance(server: &RedisServer) -> Limiter {
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect");
    Limiter::builder()
        .backend(backend)
        .build()
        .expect("limiter")
}

const LLM: [Counts; 2] = [Counts::Requests, Counts::Tokens];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_heard_by_one_instance_pauses_every_instance() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let spec = chat();
    let keys = || Keys::new(&[&"gpt", &"gpt"]);
    b.call_with(&spec, keys().costs(&[1, 100]))
        .await
        .expect("room before the upstream spoke")
        .settle_cost(100)
        .await;
    let said = Hold::from_headers([("retry-after", &b"3"[..])], &LLM);
    a.hold(&spec, keys(), &said).await.expect("held");
    let refused = b
        .call_with(&spec, keys().costs(&[1, 100]))
        .await
        .expect_err("paused");
    // Measured by the server's clock from the hold: at most 3 s and a
    // unit's emission ahead (100 ms for the requests, 100 tokens' 100 ms),
    // and (even with both cores busy) well over 1 s.
    let wait = refused.retry_after().expect("a retry time");
    assert!(
        wait > Duration::from_secs(1) && wait <= Duration::from_millis(3_100),
        "{wait:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remaining_count_heard_by_one_instance_bounds_every_instance() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let spec = chat();
    let keys = || Keys::new(&[&"gpt", &"gpt"]);
    // The upstream has 2 500 tokens left (others spend the same key).
    let said = Hold::from_headers(
        [
            ("x-ratelimit-remaining-requests", &b"590"[..]),
            ("x-ratelimit-remaining-tokens", b"2500"),
        ],
        &LLM,
    );
    a.hold(&spec, keys(), &said).await.expect("held");
    b.call_with(&spec, keys().costs(&[1, 2_000]))
        .await
        .expect("2 000 of 2 500")
        .settle_cost(2_000)
        .await;
    let refused = b
        .call_with(&spec, keys().costs(&[1, 1_000]))
        .await
        .expect_err("1 000 more is over what the upstream has left");
    assert_eq!(refused.name(), "chat_tpm");
    // Saying more is left than the budget holds changes nothing.
    let more = Hold::new().left(1, 50_000);
    a.hold(&spec, keys(), &more).await.expect("held");
    assert!(b.call_with(&spec, keys().costs(&[1, 1_000])).await.is_err());
}

#[tokio::test]
async fn holding_an_in_flight_limit_leaves_it_alone_and_a_bad_call_is_an_error() {
    let limiter = Limiter::builder().memory().build().expect("limiter");
    let spec = CallSpec::owned(
        "jobs",
        vec![GroupSpec::owned(
            "jobs",
            vec![Limit::in_flight(2).expect("limit")],
        )],
    );
    let pause = Hold::new().pause(Duration::from_secs(60));
    limiter
        .hold(&spec, Keys::new(&[&"x"]), &pause)
        .await
        .expect("nothing to hold");
    assert!(
        limiter.call(&spec, &[&"x"]).await.is_ok(),
        "slots untouched"
    );
    let error = limiter
        .hold(&spec, Keys::new(&[&"x", &"y"]), &pause)
        .await
        .expect_err("two keys for one group");
    assert!(error.to_string().contains("cannot be held"), "{error}");
}

/// A strict upstream in process: at most `per_second` requests in each
/// aligned second of the local clock, answering `429` with `Retry-After`
/// past it; counts what it served and what it refused.
#[derive(Clone, Default)]
struct StrictUpstream {
    state: std::sync::Arc<std::sync::Mutex<(u64, u64, u64, u64)>>, // (second, count, served, refused)
}

impl StrictUpstream {
    const PER_SECOND: u64 = 10;

    fn answer(&self) -> http::Response<String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch");
        let mut state = self.state.lock().expect("upstream state");
        if state.0 != now.as_secs() {
            state.0 = now.as_secs();
            state.1 = 0;
        }
        if state.1 >= Self::PER_SECOND {
            state.3 += 1;
            return http::Response::builder()
                .status(429)
                .header("retry-after", "1")
                .body(String::new())
                .expect("response");
        }
        state.1 += 1;
        state.2 += 1;
        let left = Self::PER_SECOND - state.1;
        http::Response::builder()
            .header("x-ratelimit-remaining-requests", left.to_string())
            .body("ok".to_owned())
            .expect("response")
    }

    fn served_and_refused(&self) -> (u64, u64) {
        let state = self.state.lock().expect("upstream state");
        (state.2, state.3)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_calling_a_strict_upstream_through_the_client_layer_stay_under_its_limit() {
    use ratewall::tower::UpstreamLayer;
    use ratewall::upstream::Draw;
    use tower::{Layer, Service, ServiceExt};

    let server = RedisServer::start();
    let upstream = StrictUpstream::default();
    // 8 a second, one at a time (burst 1): under the upstream's 10 in any
    // aligned second, with room for the time between our decision and its.
    let spec = || {
        CallSpec::owned(
            "partner",
            vec![GroupSpec::owned(
                "partner_rps",
                vec![
                    Limit::per_second(8)
                        .expect("limit")
                        .with_burst(1)
                        .expect("burst"),
                ],
            )],
        )
    };
    let mut calls = Vec::new();
    for _ in 0..2 {
        let limiter = std::sync::Arc::new(instance(&server).await);
        let layer = UpstreamLayer::new(
            limiter,
            spec(),
            [Counts::Requests],
            |_: &http::Request<String>| Draw::new(["partner-a"]),
        )
        .wait(Duration::from_secs(60));
        let upstream = upstream.clone();
        let client = layer.layer(tower::service_fn(move |_: http::Request<String>| {
            let answer = upstream.answer();
            async move { Ok::<_, std::convert::Infallible>(answer) }
        }));
        for _ in 0..20 {
            let mut client = client.clone();
            calls.push(tokio::spawn(async move {
                client
                    .ready()
                    .await
                    .expect("ready")
                    .call(http::Request::new(String::new()))
                    .await
                    .map(|response| response.status().as_u16())
            }));
        }
    }
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.expect("task").expect("answered"));
    }
    let (served, refused) = upstream.served_and_refused();
    assert_eq!(
        served + refused,
        40,
        "every request was sent once: {statuses:?}"
    );
    // Safety with a margin for a busy machine: a request the scheduler
    // delays past our 125 ms spacing may meet a full second upstream.
    assert!(refused <= 2, "{refused} refused upstream: {statuses:?}");
}

#[tokio::test]
async fn a_429_gives_a_settled_estimate_back_without_reopening_the_pause() {
    use ratewall::tower::UpstreamLayer;
    use ratewall::upstream::Draw;
    use tower::{Layer, Service, ServiceExt};

    let limiter = std::sync::Arc::new(Limiter::builder().memory().build().expect("limiter"));
    // One settled group: the estimate given back and the pause written
    // land on the same state.
    let spec = CallSpec::owned(
        "tokens",
        vec![
            GroupSpec::owned(
                "tokens_tpm",
                vec![Limit::per_minute(60_000).expect("limit")],
            )
            .settled(),
        ],
    );
    let layer = UpstreamLayer::new(
        limiter.clone(),
        spec,
        [Counts::Tokens],
        // The request's body is its estimate.
        |request: &http::Request<String>| {
            Draw::new(["team"]).costs([request.body().parse().expect("a number")])
        },
    )
    .wait(Duration::ZERO);
    let mut client = layer.layer(tower::service_fn(|_: http::Request<String>| async {
        http::Response::builder()
            .status(429)
            .header("retry-after", "20")
            .body(String::new())
    }));
    let answered = client
        .ready()
        .await
        .expect("ready")
        .call(http::Request::new("4000".to_owned()))
        .await
        .expect("answered");
    assert_eq!(answered.status(), 429);
    let refused = client
        .ready()
        .await
        .expect("ready")
        .call(http::Request::new("1".to_owned()))
        .await
        .expect_err("paused for 20 s, even for one token");
    let ratewall::tower::UpstreamError::Refused(rejection) = refused else {
        panic!("refused by the budget, not the client: {refused}");
    };
    assert!(
        rejection.retry_after().expect("a retry time") > Duration::from_secs(19),
        "{rejection}"
    );
}

/// A call waiting for a slot it reserved before the upstream's pause was
/// heard, for a time inside that pause: it goes after the pause, not into
/// it (before, it went at its slot, 2 s after a 5 s pause was heard), and
/// its wait counts from its first slot's ask.
async fn a_slot_reserved_before_a_pause_moves_after_it(limiter: Limiter, algorithm: Algorithm) {
    use std::time::Instant;

    let limiter: &'static Limiter = Box::leak(Box::new(limiter));
    // 600 tokens a minute: one every 100 ms.
    let spec: &'static CallSpec = Box::leak(Box::new(CallSpec::owned(
        "tokens",
        vec![GroupSpec::owned(
            "tokens_tpm",
            vec![
                Limit::per_minute(600)
                    .and_then(|l| l.with_algorithm(algorithm))
                    .expect("limit"),
            ],
        )],
    )));
    let keys = || Keys::new(&[&"team"]);
    let _spent = limiter
        .call_with(spec, keys().costs(&[600]))
        .await
        .expect("the whole minute's budget");
    // 30 tokens: a slot 3 s away.
    let waiting = tokio::spawn(async move {
        let began = Instant::now();
        let permit = limiter
            .call_with(
                spec,
                Keys::new(&[&"team"])
                    .costs(&[30])
                    .wait(Duration::from_secs(60)),
            )
            .await;
        (permit.map(|p| p.waited()), began, Instant::now())
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let heard = Instant::now();
    let said = Hold::from_headers([("retry-after", &b"5"[..])], &[Counts::Tokens]);
    limiter.hold(spec, keys(), &said).await.expect("held");
    let (admitted, began, at) = waiting.await.expect("joined");
    let waited =
        admitted.unwrap_or_else(|r| panic!("{algorithm:?}: the waiting call was refused: {r}"));
    let after = at.duration_since(heard);
    // Its wait counts from its first slot's ask, not from the new one's
    // (less only the store's and the timer's latencies).
    let total = at.duration_since(began);
    assert!(
        waited + Duration::from_millis(250) >= total,
        "{algorithm:?}: waited {waited:?} of {total:?}"
    );
    assert!(
        after >= Duration::from_secs(5),
        "{algorithm:?}: admitted {after:?} after a 5 s pause was heard"
    );
    // Its new slot: the pause, then its 30 tokens' 3 s (with margin for a
    // loaded machine, far below the 60 s it could wait).
    assert!(after < Duration::from_secs(20), "{algorithm:?}: {after:?}");
}

/// The algorithms whose waiting calls reserve a slot (GCRA and the
/// buckets): the ones a pause can move.
fn reserving() -> impl Iterator<Item = Algorithm> {
    Algorithm::ALL.into_iter().filter(|a| a.reserves())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_reserved_before_a_pause_moves_after_it_in_memory() {
    for algorithm in reserving() {
        let limiter = Limiter::builder().memory().build().expect("limiter");
        a_slot_reserved_before_a_pause_moves_after_it(limiter, algorithm).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_reserved_before_a_pause_moves_after_it_in_redis() {
    let server = RedisServer::start();
    for algorithm in reserving() {
        a_slot_reserved_before_a_pause_moves_after_it(instance(&server).await, algorithm).await;
    }
}

#[tokio::test]
async fn a_refusal_remembered_before_a_pause_is_not_answered_after_it() {
    let server = RedisServer::start();
    let limiter = instance(&server).await;
    let spec = CallSpec::owned(
        "tokens",
        vec![GroupSpec::owned(
            "tokens_tpm",
            vec![Limit::per_minute(600).expect("limit")],
        )],
    );
    let keys = || Keys::new(&[&"team"]);
    let _spent = limiter
        .call_with(&spec, keys().costs(&[300]))
        .await
        .expect("half the minute's budget");
    // 400 tokens: 10 s of refill away. The refusal is remembered (the deny
    // cache in front of Redis) for those 10 s.
    let refused = limiter
        .call_with(&spec, keys().costs(&[400]))
        .await
        .expect_err("over the budget");
    let before = refused.retry_after().expect("a retry time");
    assert!(before <= Duration::from_secs(11), "{before:?}");
    let said = Hold::from_headers([("retry-after", &b"60"[..])], &[Counts::Tokens]);
    limiter.hold(&spec, keys(), &said).await.expect("held");
    // The pause, then 40 s of refill: asked of the store, not answered
    // from the refusal remembered before it (which said 10 s).
    let after = limiter
        .call_with(&spec, keys().costs(&[400]))
        .await
        .expect_err("paused")
        .retry_after()
        .expect("a retry time");
    assert!(
        after > Duration::from_secs(60),
        "{after:?} after a 60 s pause (before it: {before:?})"
    );
}

/// 50 a second on `algorithm`, refused when the store fails: its windows
/// (and slots) far shorter than the pause.
fn partner(algorithm: Algorithm) -> CallSpec {
    CallSpec::owned(
        format!("partner_{algorithm}"),
        vec![GroupSpec::owned(
            format!("partner_rps_{algorithm}"),
            vec![
                Limit::per_second(50)
                    .and_then(|l| l.with_algorithm(algorithm))
                    .expect("limit"),
            ],
        )],
    )
    .with_policy(FailurePolicy::FailClosed)
}

/// A limiter over `backend` deciding every call in the store (no refusal
/// remembered in process): each decision carries the store's time.
fn asking_every_time(backend: std::sync::Arc<dyn ratewall::backend::Backend>) -> Limiter {
    Limiter::builder()
        .shared_backend(backend)
        .deny_cache(false)
        .build()
        .expect("limiter")
}

/// The window algorithms: the ones whose pause used to end with the
/// window or slot it was heard in.
const WINDOWS: [Algorithm; 3] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

/// `a` hears a 2 s `Retry-After`; `b` calls in a loop until one call
/// passes. Measured by the store's clock (each decision's time): the
/// pause ends 2 s after it was heard (between `b`'s call before it and
/// its first refusal), every refusal names that end, no call passes
/// before it, and the first call after it passes (within a margin for a
/// busy machine: the loop's sleep and scheduling).
async fn a_pause_holds_a_window_budget_until_it_ends(a: &Limiter, b: &Limiter) {
    const PAUSE_US: u64 = 2_000_000;
    let at_micros = |permit: &ratewall::Permit<'_>| permit.binding().expect("a rate").1.at_micros();
    for algorithm in WINDOWS {
        let spec = partner(algorithm);
        let before = b
            .call(&spec, &[&"partner-a"])
            .await
            .unwrap_or_else(|r| panic!("{algorithm}: room before the pause: {r}"));
        let heard_after = at_micros(&before);
        drop(before);
        let said = Hold::from_headers([("retry-after", &b"2"[..])], &[Counts::Requests]);
        a.hold(&spec, Keys::new(&[&"partner-a"]), &said)
            .await
            .expect("held");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut first_refusal: Option<(u64, u64)> = None;
        let mut refusals = 0;
        let resumed = loop {
            assert!(
                std::time::Instant::now() < deadline,
                "{algorithm}: never resumed"
            );
            match b.call(&spec, &[&"partner-a"]).await {
                Ok(permit) => break at_micros(&permit),
                Err(rejection) => {
                    let refused = rejection.decision().unwrap_or_else(|| {
                        panic!("{algorithm}: not refused by the budget: {rejection}")
                    });
                    let ends = refused.at_micros() + refused.retry_after().as_micros() as u64;
                    let (_, until) = *first_refusal.get_or_insert((refused.at_micros(), ends));
                    assert_eq!(ends, until, "{algorithm}: {refused:?}");
                    assert_eq!(refused.remaining(), 0, "{algorithm}: {refused:?}");
                    refusals += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let (heard_before, until) =
            first_refusal.unwrap_or_else(|| panic!("{algorithm}: not paused at all"));
        // Nothing passes before the pause can have ended (heard after
        // `heard_after`), whatever the refusals said.
        assert!(
            resumed >= heard_after + PAUSE_US,
            "{algorithm}: a call passed {} µs before the pause's end ({refusals} refused)",
            heard_after + PAUSE_US - resumed
        );
        // Every refusal said when: 2 s after the hold, which the store ran
        // between the call before it and the first refusal; the first call
        // passes at that time or later.
        assert!(
            until >= heard_after + PAUSE_US && until <= heard_before + PAUSE_US,
            "{algorithm}: the pause ends at {until}, heard between {heard_after} and {heard_before}"
        );
        assert!(
            resumed >= until,
            "{algorithm}: passed at {resumed}, before {until}"
        );
        assert!(
            resumed - until < 1_000_000,
            "{algorithm}: resumed {} µs after the pause's end",
            resumed - until
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_the_window_algorithms_until_it_ends_in_memory() {
    let store: std::sync::Arc<dyn ratewall::backend::Backend> =
        std::sync::Arc::new(ratewall::backend::MemoryBackend::new());
    let (a, b) = (asking_every_time(store.clone()), asking_every_time(store));
    a_pause_holds_a_window_budget_until_it_ends(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_the_window_algorithms_until_it_ends_in_redis() {
    let server = RedisServer::start();
    let b = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect");
    // `a` as an instance runs (refusals remembered), `b` asking the store.
    let (a, b) = (
        instance(&server).await,
        asking_every_time(std::sync::Arc::new(b)),
    );
    a_pause_holds_a_window_budget_until_it_ends(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_the_window_algorithms_until_it_ends_on_a_cluster() {
    let cluster = ratewall_tests::harness::RedisCluster::start();
    let connect = || async {
        std::sync::Arc::new(
            RedisBackend::connect_cluster(cluster.urls())
                .await
                .expect("connect"),
        )
    };
    let (a, b) = (
        asking_every_time(connect().await),
        asking_every_time(connect().await),
    );
    a_pause_holds_a_window_budget_until_it_ends(&a, &b).await;
}

/// One request a minute, tokens settled; the upstream refuses the first
/// request (`429`, no pause said) and serves the next. Whether the second
/// is sent depends on whether the refused one was given back in the
/// requests group.
async fn second_request_after_a_429(auto: bool) -> Result<u16, String> {
    use ratewall::tower::UpstreamLayer;
    use ratewall::upstream::{Auto, Draw};
    use std::sync::atomic::{AtomicU32, Ordering};
    use tower::{Layer, Service, ServiceExt};

    let limiter = std::sync::Arc::new(Limiter::builder().memory().build().expect("limiter"));
    let spec = CallSpec::owned(
        "llm",
        vec![
            GroupSpec::owned("llm_rpm", vec![Limit::per_minute(1).expect("limit")]),
            GroupSpec::owned("llm_tpm", vec![Limit::per_minute(60_000).expect("limit")]).settled(),
        ],
    );
    let mut layer = UpstreamLayer::new(limiter, spec, LLM, |_: &http::Request<String>| {
        Draw::new(["model"; 2]).costs([1, 100])
    })
    .wait(Duration::ZERO)
    .pause_on_refusal(Duration::from_millis(20));
    if auto {
        layer = layer.auto(Auto::new());
    }
    let answered = std::sync::Arc::new(AtomicU32::new(0));
    let mut client = layer.layer(tower::service_fn(move |_: http::Request<String>| {
        let first = answered.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            http::Response::builder()
                .status(if first { 429 } else { 200 })
                .body(String::new())
        }
    }));
    let mut send = async || {
        client
            .ready()
            .await
            .expect("ready")
            .call(http::Request::new(String::new()))
            .await
    };
    assert_eq!(send().await.expect("sent").status(), 429);
    // Past the 20 ms pause, by a margin a busy machine keeps.
    tokio::time::sleep(Duration::from_millis(300)).await;
    send()
        .await
        .map(|answer| answer.status().as_u16())
        .map_err(|error| error.to_string())
}

#[tokio::test]
async fn a_budget_that_finds_its_limit_gives_a_429_back_in_every_group_requests_too() {
    // Found by its own count, the upstream's limit must not hold the calls
    // the upstream refused (it never counted them).
    assert_eq!(second_request_after_a_429(true).await, Ok(200));
    // Told its limits, a budget keeps a refused request counted.
    let kept = second_request_after_a_429(false).await;
    assert!(kept.is_err(), "the refused request still counts: {kept:?}");
}

#[tokio::test]
async fn a_count_of_zero_said_with_a_pause_holds_a_window_only_for_the_pause() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let limiter = Limiter::builder().memory().build().expect("limiter");
        let spec = CallSpec::owned(
            "api",
            vec![GroupSpec::owned(
                "api_rpm",
                vec![
                    Limit::per_minute(10)
                        .and_then(|l| l.with_algorithm(algorithm))
                        .expect("limit"),
                ],
            )],
        );
        let keys = || Keys::new(&[&"upstream"]);
        // Nothing left, and a pause of 50 ms: the pause holds the budget.
        let said = Hold::new().pause(Duration::from_millis(50)).left(0, 0);
        limiter.hold(&spec, keys(), &said).await.expect("held");
        assert!(
            limiter.call_with(&spec, keys()).await.is_err(),
            "{algorithm}: paused"
        );
        // Past it (by a margin a busy machine keeps), the window is whole:
        // the count of zero was not written into it for the rest of the
        // minute.
        tokio::time::sleep(Duration::from_millis(400)).await;
        for call in 0..10 {
            assert!(
                limiter.call_with(&spec, keys()).await.is_ok(),
                "{algorithm}: call {call} after the pause"
            );
        }
    }
}
