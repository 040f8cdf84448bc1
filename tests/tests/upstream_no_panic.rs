//! No header value and no duration makes an upstream budget panic: what
//! an upstream says goes through `Hold::from_headers` and `Limiter::hold`,
//! and through the tower client layer, whatever it says; a pause is held
//! for at most `Hold::MAX_PAUSE` (a group's reset too).

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use ratewall::tower::{UpstreamError, UpstreamLayer};
use ratewall::upstream::Draw;
use ratewall::{
    Algorithm, CallSpec, GroupSpec, Keys, Limit, Limiter,
    upstream::{Counts, Hold},
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;
use tower::{Layer, Service, ServiceExt};

const LLM: [Counts; 2] = [Counts::Requests, Counts::Tokens];

/// Requests and tokens a minute on `algorithm`, the tokens settled (but
/// on a sliding log, which carries no debt).
fn chat(algorithm: Algorithm) -> CallSpec {
    let limit = |n| {
        Limit::per_minute(n)
            .and_then(|l| l.with_algorithm(algorithm))
            .expect("limit")
    };
    CallSpec::owned(
        "chat",
        vec![
            GroupSpec::owned("chat_rpm", vec![limit(600)]),
            if algorithm == Algorithm::SlidingLog {
                GroupSpec::owned("chat_tpm", vec![limit(6_000)])
            } else {
                GroupSpec::owned("chat_tpm", vec![limit(6_000)]).settled()
            },
        ],
    )
}

const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
];

/// The header names an upstream's budget is read from, and one it ignores.
const NAMES: [&str; 24] = [
    "retry-after",
    "Retry-After",
    "retry-after-ms",
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "anthropic-ratelimit-tokens-remaining",
    "ratelimit-remaining",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "anthropic-ratelimit-output-tokens-limit",
    "ratelimit-reset",
    "RateLimit-Reset",
    "x-unrelated",
];

/// Header values: numbers of every size (the 10^19 seconds of the report
/// among them), fractions, HTTP dates, structured fields, and bytes.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        any::<f64>().prop_map(|n| n.to_string().into_bytes()),
        Just(b"9300000000000000000".to_vec()),
        Just(b"1e308".to_vec()),
        Just(b"Fri, 31 Dec 9999 23:59:59 GMT".to_vec()),
        Just(b"Thu, 01 Jan 1970 00:00:00 GMT".to_vec()),
        (any::<u64>(), any::<u64>())
            .prop_map(|(r, t)| format!("\"default\";r={r};t={t}").into_bytes()),
        // Go durations (OpenAI's resets), of any size and shape.
        (any::<u32>(), any::<u64>(), any::<f32>())
            .prop_map(|(h, m, s)| format!("{h}h{m}m{s}s").into_bytes()),
        "[0-9.]{0,12}(h|m|s|ms|us|µs|ns|x){0,2}[0-9.]{0,6}s?".prop_map(String::into_bytes),
        // RFC 3339 timestamps (Anthropic's resets), valid or not.
        "[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,12})?(Z|[+-][0-9]{2}:[0-9]{2})?"
            .prop_map(String::into_bytes),
        Just(b"9999-12-31T23:59:60.999999999-23:59".to_vec()),
        Just(b"0000-01-01T00:00:00+23:59".to_vec()),
        // Structured fields with quoted names and parameters of every kind.
        ("[ -~]{0,12}", any::<i64>(), any::<i64>(), any::<i64>()).prop_map(|(name, r, t, q)| {
            format!("{name:?};r={r};t={t};q={q}, \"b\";r={t}").into_bytes()
        }),
        "[ -~]{0,40}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::MAX),
        Just(Duration::ZERO),
        (any::<u64>(), 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
        (0..100_000u64).prop_map(Duration::from_millis),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_headers_are_held_without_panic_and_a_pause_is_capped(
        headers in proptest::collection::vec((0..NAMES.len(), value()), 0..6),
        pause in duration(),
        algorithm in 0..ALGORITHMS.len(),
    ) {
        let hold = Hold::from_headers(
            headers.iter().map(|(n, v)| (NAMES[*n], v.as_slice())),
            &LLM,
        )
        .pause(pause);
        prop_assert!(hold.paused().is_some_and(|p| p <= Hold::MAX_PAUSE));
        for group in 0..LLM.len() {
            prop_assert!(hold.paused_in(group).is_some_and(|p| p <= Hold::MAX_PAUSE));
            prop_assert!(hold.reset_in(group).is_none_or(|r| r <= Hold::MAX_PAUSE));
        }
        let limiter = Limiter::builder().memory().build().expect("limiter");
        let spec = chat(ALGORITHMS[algorithm]);
        let keys = || Keys::new(&[&"gpt", &"gpt"]);
        runtime().block_on(async {
            limiter.hold(&spec, keys(), &hold).await.expect("held");
            // Paused: refused, for no longer than the cap (and its rate's
            // step after it).
            if let Err(rejection) = limiter.call_with(&spec, keys().costs(&[1, 100])).await {
                let wait = rejection.retry_after().expect("a limited refusal");
                assert!(wait <= Hold::MAX_PAUSE + Duration::from_secs(60), "{wait:?}");
            }
            // A call that may wait for as long as the pause (any duration):
            // it reserves or retries without panicking; dropped after a
            // moment, it gives back what it reserved.
            let waiting = limiter.call_with(&spec, keys().costs(&[1, 100]).wait(pause));
            let _ = tokio::time::timeout(Duration::from_millis(5), waiting).await;
        });
    }

    #[test]
    fn any_answer_and_any_setting_of_the_client_layer_is_heard_without_panic(
        status in prop_oneof![Just(200u16), Just(429), Just(503), 100..600u16],
        headers in proptest::collection::vec((0..NAMES.len(), value()), 0..6),
        pause_on_refusal in duration(),
        max_pause in duration(),
    ) {
        let limiter = Arc::new(Limiter::builder().memory().build().expect("limiter"));
        let layer = UpstreamLayer::new(limiter, chat(Algorithm::Gcra), LLM, |_: &http::Request<()>| {
            Draw::new(["gpt"; 2]).costs([1, 100])
        })
        .pause_on_refusal(pause_on_refusal)
        .max_pause(max_pause)
        .wait(Duration::ZERO);
        let upstream = tower::service_fn(move |_: http::Request<()>| {
            let mut response = http::Response::builder().status(status);
            for (name, value) in &headers {
                if let Ok(value) = http::HeaderValue::from_bytes(value) {
                    response = response.header(NAMES[*name], value);
                }
            }
            let response = response.body(()).expect("response");
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        let mut client = layer.layer(upstream);
        runtime().block_on(async {
            for _ in 0..2 {
                let client = client.ready().await.expect("ready");
                match client.call(http::Request::new(())).await {
                    Ok(response) => assert_eq!(response.status().as_u16(), status),
                    Err(UpstreamError::Refused(rejection)) => {
                        let wait = rejection.retry_after().expect("a limited refusal");
                        assert!(wait <= Hold::MAX_PAUSE + Duration::from_secs(60), "{wait:?}");
                    }
                    Err(UpstreamError::Service(never)) => match never {},
                }
            }
        });
    }
}

/// The report's case: `retry-after: 9300000000000000000`, and a pause of
/// `Duration::MAX`, on a real Redis for every algorithm: held for one day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_pauses_are_held_for_a_day_on_redis() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    let limiter = Limiter::builder()
        .backend(backend)
        .build()
        .expect("limiter");
    for algorithm in ALGORITHMS {
        let spec = chat(algorithm);
        let keys = || Keys::new(&[&"gpt", &"gpt"]);
        for hold in [
            Hold::from_headers([("retry-after", &b"9300000000000000000"[..])], &LLM),
            Hold::new().pause(Duration::MAX),
        ] {
            assert_eq!(hold.paused(), Some(Hold::MAX_PAUSE));
            limiter.hold(&spec, keys(), &hold).await.expect("held");
        }
        let refused = limiter
            .call_with(&spec, keys().costs(&[1, 100]))
            .await
            .expect_err("paused");
        let wait = refused.retry_after().expect("a limited refusal");
        assert!(
            wait <= Hold::MAX_PAUSE + Duration::from_secs(60),
            "{algorithm:?}: {wait:?}"
        );
    }
}
