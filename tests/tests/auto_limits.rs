//! A budget that finds its upstream's limit ([`Auto`], [`Limiter::learn`]):
//! what one instance learns (a `429`, a limit the upstream says) becomes one
//! scale in the store that every instance applies to its own limits. Two
//! limiters sharing one Redis stand for two processes.

use std::sync::Arc;
use std::time::Duration;

use ratewall::tower::UpstreamLayer;
use ratewall::upstream::Draw;
use ratewall::{
    CallSpec, GroupSpec, Keys, Limit, Limiter,
    backend::MemoryBackend,
    clock::ManualClock,
    upstream::{Adjust, Auto, Counts, Hold, SCALE_ONE},
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{RedisCluster, RedisServer};
use tower::{Layer, Service, ServiceExt};

/// Requests and tokens per minute, stated 4 times too high.
fn chat() -> CallSpec {
    CallSpec::owned(
        "chat",
        vec![
            GroupSpec::owned("chat_rpm", vec![Limit::per_minute(2_400).expect("limit")]),
            GroupSpec::owned(
                "chat_tpm",
                vec![
                    Limit::per_minute(240_000).expect("limit"),
                    Limit::in_flight(8).expect("limit"),
                ],
            )
            .settled(),
        ],
    )
}

async fn instance(backend: RedisBackend) -> Limiter {
    Limiter::builder()
        .backend(backend)
        .build()
        .expect("limiter")
}

async fn on(server: &RedisServer) -> Limiter {
    instance(
        RedisBackend::builder(server.url())
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect"),
    )
    .await
}

/// The thresholds `limiter` applies to `group` now (as stated when it
/// learned nothing).
fn thresholds(limiter: &Limiter, spec: &CallSpec, group: usize) -> Vec<u64> {
    let stated = &spec.groups()[group];
    limiter
        .settings()
        .limits(stated.name())
        .map_or_else(|| stated.limits().to_vec(), |l| l.to_vec())
        .iter()
        .map(|l| if l.is_in_flight() { 0 } else { l.threshold() })
        .collect()
}

fn refused(pause: u64) -> Hold {
    Hold::new().pause(Duration::from_secs(pause))
}

/// The budget's identities: one model, in both groups.
fn gpt() -> Keys<'static> {
    Keys::new(&[&"gpt", &"gpt"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_heard_by_one_instance_lowers_every_instances_limit_once() {
    let server = RedisServer::start();
    let (a, b) = (on(&server).await, on(&server).await);
    let spec = chat();
    let (auto_a, auto_b) = (Auto::new(), Auto::new());
    // The overload's first 429 lowers the shared scale to 70 %; the next
    // ones, within its pause, do not lower it again.
    for _ in 0..5 {
        a.learn(&spec, gpt(), &auto_a, false, &refused(5))
            .await
            .expect("learned");
    }
    assert_eq!(thresholds(&a, &spec, 0), [1_680]);
    assert_eq!(
        thresholds(&a, &spec, 1),
        [168_000, 0],
        "in-flight as stated"
    );
    // The other instance, hearing an accepted answer, reads the scale
    // (raising it is not due: it changed less than a second ago).
    b.learn(&spec, gpt(), &auto_b, true, &Hold::new())
        .await
        .expect("learned");
    assert_eq!(thresholds(&b, &spec, 1), [168_000, 0]);
    assert_eq!(auto_b.scale("chat_tpm"), Some(700_000));
    // Its limits decide its calls: 168 000 tokens a minute, not 240 000.
    let call = b
        .call_with(&spec, Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 168_000]))
        .await
        .expect("fits the learned limit");
    call.settle_cost(168_000).await;
    // It refills at 2 800 tokens a second: 50 000 more are 18 s away.
    assert!(
        b.call_with(&spec, Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 50_000]))
            .await
            .is_err(),
        "the learned minute is spent"
    );
}

/// The seam: an instance whose calls were all answered before another one
/// heard a `429` hears nothing while the budget is paused, and would resume
/// with the limits it had. Refused by the paused budget, it reads the scale
/// (when due) before it calls again, by hand or in the client layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_paused_by_another_ones_refusal_resumes_with_the_learned_limit() {
    let server = RedisServer::start();
    let (a, b, c) = (on(&server).await, on(&server).await, on(&server).await);
    let spec = chat();
    // Long enough that two reads a round trip apart fall within it on a
    // loaded machine.
    let every = Duration::from_millis(400);
    let (auto_a, auto_b) = (Auto::new(), Auto::new().every(every));
    // b hears an accepted answer: the stated limits.
    b.learn(&spec, gpt(), &auto_b, true, &Hold::new())
        .await
        .expect("read");
    assert_eq!(thresholds(&b, &spec, 1), [240_000, 0]);
    // a hears a 429 asking for 45 s of the minute, its budget nearly
    // empty (the refusal its own calls cannot explain): it lowers the shared
    // scale to 70 % and pauses the budget for everyone.
    a.learn(&spec, gpt(), &auto_a, false, &refused(45))
        .await
        .expect("lowered");
    a.hold(&spec, gpt(), &refused(45)).await.expect("held");
    assert_eq!(thresholds(&a, &spec, 1), [168_000, 0]);
    // b is paused and still applies what it last heard.
    assert!(b.call_with(&spec, gpt()).await.is_err(), "paused");
    assert_eq!(thresholds(&b, &spec, 1), [240_000, 0]);
    // Its read is due once `every` has passed since the last one.
    tokio::time::sleep(every * 2).await;
    assert_eq!(b.refresh_learned(&spec, &auto_b).await.expect("read"), 2);
    assert_eq!(thresholds(&b, &spec, 1), [168_000, 0]);
    assert_eq!(thresholds(&b, &spec, 0), [1_680]);
    assert_eq!(
        b.refresh_learned(&spec, &auto_b).await.expect("read"),
        0,
        "read at most once per `every`"
    );
    // The client layer does the same for a request the budget refuses.
    let c = Arc::new(c);
    let layer = UpstreamLayer::new(
        c.clone(),
        chat(),
        [Counts::Requests, Counts::Tokens],
        |_: &http::Request<String>| Draw::new(["gpt", "gpt"]),
    )
    .wait(Duration::ZERO)
    .auto(Auto::new());
    let mut client = layer.layer(tower::service_fn(|_: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    }));
    let answer = client
        .ready()
        .await
        .expect("ready")
        .call(http::Request::new(String::new()))
        .await;
    assert!(
        matches!(answer, Err(ratewall::tower::UpstreamError::Refused(_))),
        "paused: {answer:?}"
    );
    assert_eq!(thresholds(&c, &chat(), 1), [168_000, 0]);
}

/// A request of the client layer that waits through a pause another
/// instance heard is decided, when the pause ends, with the limit learned
/// from that refusal: waiting on a window budget, it reads the shared scale
/// between its tries. With the limits it had before the pause, every caller
/// waiting on an instance that heard no refusal would go at once when the
/// pause ends, into an upstream that has room for a few calls only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_through_another_instances_pause_resumes_with_the_learned_limit() {
    let store: Arc<dyn ratewall::backend::Backend> = Arc::new(MemoryBackend::new());
    let instance = || {
        Limiter::builder()
            .shared_backend(store.clone())
            .build()
            .expect("limiter")
    };
    let (a, c) = (instance(), Arc::new(instance()));
    // Ten a minute, a window budget (a waiting call retries) that counts
    // the last minute: no window boundary frees room meanwhile, as a fixed
    // window's may.
    let spec = || {
        CallSpec::owned(
            "paced",
            vec![GroupSpec::owned(
                "paced_rpm",
                vec![
                    Limit::per_minute(10)
                        .and_then(|l| l.with_algorithm(ratewall::Algorithm::SlidingWindow))
                        .expect("limit"),
                ],
            )],
        )
    };
    let model = || Keys::new(&[&"gpt"]);
    // a sends six (the window's count), then hears a 429 that says the
    // limit is 4 and pauses the budget for everyone for 3 s (a margin a
    // busy machine keeps: the request below is made inside it).
    for _ in 0..6 {
        drop(a.call_with(&spec(), model()).await.expect("room"));
    }
    let said = Hold::new().limit(0, 4).pause(Duration::from_secs(3));
    a.learn(&spec(), model(), &Auto::new(), false, &said)
        .await
        .expect("learned");
    a.hold(&spec(), model(), &said).await.expect("held");
    assert_eq!(thresholds(&a, &spec(), 0), [4]);
    // c heard nothing: it still applies the stated ten, under which the
    // window's six leave room. Its request waits (up to 10 s) for the pause.
    assert_eq!(thresholds(&c, &spec(), 0), [10]);
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let layer = UpstreamLayer::new(
        c.clone(),
        spec(),
        [Counts::Requests],
        |_: &http::Request<String>| Draw::new(["gpt"]),
    )
    .wait(Duration::from_secs(10))
    .auto(Auto::new().every(Duration::from_millis(200)));
    let counted = sent.clone();
    let mut client = layer.layer(tower::service_fn(move |_: http::Request<String>| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
    }));
    let answer = client
        .ready()
        .await
        .expect("ready")
        .call(http::Request::new(String::new()))
        .await;
    // Past the pause it read the learned 4, which the window's six exceed
    // for the rest of the minute: refused, nothing sent.
    assert!(
        matches!(answer, Err(ratewall::tower::UpstreamError::Refused(_))),
        "decided with the limit it had before the pause: {answer:?}"
    );
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(thresholds(&c, &spec(), 0), [4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_the_upstream_says_is_taken_at_the_margin_by_every_instance_on_a_cluster() {
    let cluster = RedisCluster::start();
    let connect = || async {
        instance(
            RedisBackend::cluster_builder(cluster.urls())
                .timeout(Duration::from_secs(10))
                .connect()
                .await
                .expect("connect"),
        )
        .await
    };
    let (a, b) = (connect().await, connect().await);
    let spec = chat();
    let auto = || Auto::new().margin(0.98).expect("margin");
    let (auto_a, auto_b) = (auto(), auto());
    let said = Hold::from_headers(
        [
            ("x-ratelimit-limit-requests", &b"600"[..]),
            ("x-ratelimit-limit-tokens", b"60000"),
        ],
        &[Counts::Requests, Counts::Tokens],
    );
    let operations = a
        .learn(&spec, gpt(), &auto_a, true, &said)
        .await
        .expect("learned");
    assert_eq!(operations, 2, "one per group");
    assert_eq!(thresholds(&a, &spec, 0), [588]);
    assert_eq!(thresholds(&a, &spec, 1), [58_800, 0]);
    // Said again: nothing to write.
    let again = a
        .learn(&spec, gpt(), &auto_a, true, &said)
        .await
        .expect("learned");
    assert_eq!(again, 0);
    // A refusal when the upstream says its limit does not lower it: the
    // limit said is the upstream's own word.
    a.learn(
        &spec,
        gpt(),
        &auto_a,
        false,
        &said.clone().pause(Duration::from_secs(1)),
    )
    .await
    .expect("learned");
    assert_eq!(thresholds(&a, &spec, 1), [58_800, 0]);
    b.learn(&spec, gpt(), &auto_b, true, &Hold::new())
        .await
        .expect("learned");
    assert_eq!(thresholds(&b, &spec, 0), [588]);
    assert_eq!(thresholds(&b, &spec, 1), [58_800, 0]);
}

#[tokio::test]
async fn accepted_calls_climb_back_below_the_refusals_level_then_probe_up_to_the_stated_limits() {
    let clock = ManualClock::new(1_000_000);
    let limiter = Limiter::builder()
        .memory()
        .clock(clock.clone())
        .build()
        .expect("limiter");
    let spec = chat();
    let auto = Auto::new().every(Duration::ZERO);
    limiter
        .learn(&spec, gpt(), &auto, false, &refused(1))
        .await
        .expect("learned");
    assert_eq!(thresholds(&limiter, &spec, 1), [168_000, 0]);
    // Toward 95 % of the scale that drew the refusal, a quarter of the gap
    // per accepted answer a second apart: fast far from it.
    let mut seen = Vec::new();
    for _ in 0..3 {
        clock.advance(Duration::from_secs(1));
        limiter
            .learn(&spec, gpt(), &auto, true, &Hold::new())
            .await
            .expect("learned");
        seen.push(thresholds(&limiter, &spec, 1)[0]);
    }
    assert_eq!(seen, [183_000, 194_250, 202_687]);
    // Then a plateau below that level, for the ten minutes it is believed.
    for _ in 0..590 {
        clock.advance(Duration::from_secs(1));
        limiter
            .learn(&spec, gpt(), &auto, true, &Hold::new())
            .await
            .expect("learned");
    }
    assert_eq!(thresholds(&limiter, &spec, 1), [228_000, 0]);
    // Then it probes, 1 % of the scale a second, up to the stated limits.
    for _ in 0..60 {
        clock.advance(Duration::from_secs(1));
        limiter
            .learn(&spec, gpt(), &auto, true, &Hold::new())
            .await
            .expect("learned");
    }
    assert_eq!(
        thresholds(&limiter, &spec, 1),
        [240_000, 0],
        "as stated, no more"
    );
    // The floor: a share of the stated limits a budget keeps.
    let floored = Auto::new()
        .floor(0.25)
        .expect("floor")
        .every(Duration::ZERO);
    for _ in 0..10 {
        clock.advance(Duration::from_secs(1));
        limiter
            .learn(&spec, gpt(), &floored, false, &Hold::new())
            .await
            .expect("learned");
    }
    assert_eq!(thresholds(&limiter, &spec, 1), [60_000, 0]);
}

#[tokio::test]
async fn the_client_layer_learns_from_the_upstreams_refusals() {
    let limiter = Arc::new(Limiter::builder().memory().build().expect("limiter"));
    let spec = CallSpec::owned(
        "partner",
        vec![GroupSpec::owned(
            "partner_rpm",
            vec![Limit::per_minute(1_000).expect("limit")],
        )],
    );
    let layer = UpstreamLayer::new(
        limiter.clone(),
        spec,
        [Counts::Requests],
        |_: &http::Request<String>| Draw::new(["partner-a"]),
    )
    .wait(Duration::ZERO)
    .pause_on_refusal(Duration::from_millis(1))
    .auto(Auto::new());
    let mut client = layer.layer(tower::service_fn(|_: http::Request<String>| async {
        http::Response::builder().status(429).body(String::new())
    }));
    let answered = client
        .ready()
        .await
        .expect("ready")
        .call(http::Request::new(String::new()))
        .await
        .expect("sent");
    assert_eq!(answered.status(), 429);
    // One call of a budget of 1 000 cannot explain the refusal: 70 % kept.
    let learned = limiter.settings().limits("partner_rpm").expect("learned");
    assert_eq!(learned[0].threshold(), 700);
}

#[tokio::test]
async fn a_store_that_cannot_keep_a_scale_is_an_error_and_the_limits_stay() {
    #[derive(Debug)]
    struct Forgetful(MemoryBackend);
    impl ratewall::backend::Backend for Forgetful {
        fn acquire<'a>(
            &'a self,
            requests: &'a [ratewall::backend::Request<'a>],
        ) -> ratewall::backend::BoxFuture<
            'a,
            Result<ratewall::backend::Decisions, ratewall::error::BackendError>,
        > {
            self.0.acquire(requests)
        }
        fn peek<'a>(
            &'a self,
            requests: &'a [ratewall::backend::Request<'a>],
        ) -> ratewall::backend::BoxFuture<
            'a,
            Result<ratewall::backend::Decisions, ratewall::error::BackendError>,
        > {
            self.0.peek(requests)
        }
        fn refund<'a>(
            &'a self,
            requests: &'a [ratewall::backend::Request<'a>],
            at_micros: u64,
        ) -> ratewall::backend::BoxFuture<'a, Result<(), ratewall::error::BackendError>> {
            self.0.refund(requests, at_micros)
        }
        fn reset<'a>(
            &'a self,
            requests: &'a [ratewall::backend::Request<'a>],
        ) -> ratewall::backend::BoxFuture<'a, Result<(), ratewall::error::BackendError>> {
            self.0.reset(requests)
        }
    }
    let limiter = Limiter::builder()
        .backend(Forgetful(MemoryBackend::new()))
        .build()
        .expect("limiter");
    let spec = chat();
    let error = limiter
        .learn(&spec, gpt(), &Auto::new(), false, &refused(1))
        .await
        .expect_err("no scale kept");
    assert!(error.to_string().contains("learned limit"), "{error}");
    assert!(limiter.settings().limits("chat_rpm").is_none());
    // The scale type itself: a store's answer for a name never adjusted.
    assert_eq!(
        MemoryBackend::new().adjust_sync("rl", "chat_rpm", Adjust::Read),
        SCALE_ONE
    );
}
