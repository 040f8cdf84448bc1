//! The reqwest middleware (`ratewall::reqwest::UpstreamMiddleware`) over
//! real HTTP: a small axum server on a free port stands for a language
//! model's API (usage in a JSON answer, or in the last event of a streamed
//! one; `429` with `Retry-After` when asked), on memory and on Redis.
//!
//! - The budget holds exactly the real costs once each answer's body is
//!   read, streamed or not; a body dropped before its end keeps the
//!   estimate.
//! - A `429` heard by one client pauses the budget for another client
//!   sharing the store; a request that may wait goes after the pause.
//! - A refusal of the budget is the middleware's error, carrying the
//!   `Rejection`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use ratewall::backend::{Backend, MemoryBackend};
use ratewall::reqwest::{Cost, UpstreamMiddleware, refusal};
use ratewall::upstream::{Counts, Draw};
use ratewall::{CallSpec, FailurePolicy, GroupSpec, Keys, Limit, Limiter};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

/// Tokens: 1 000 a day (nothing comes back during a test: what is left is
/// exactly what was not spent), settled; requests: 1 000 a day.
fn budget() -> CallSpec {
    CallSpec::owned(
        "llm",
        vec![
            GroupSpec::owned("llm_rpd", vec![Limit::per_day(1_000).expect("limit")]),
            GroupSpec::owned("llm_tpd", vec![Limit::per_day(1_000).expect("limit")]).settled(),
        ],
    )
    .with_policy(FailurePolicy::FailClosed)
}

/// The stand-in upstream: `POST /v1/chat` answers with the usage asked in
/// `x-used`: in a JSON body, or streamed as server-sent events with the
/// usage in the last one (`x-stream: 1`, slowly, the usage event split
/// across chunks); `x-refuse: N` answers `429` with `Retry-After: N`.
async fn upstream() -> String {
    async fn chat(headers: HeaderMap) -> Response {
        let number = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
        };
        if let Some(wait) = number("x-refuse") {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", wait.to_string())],
            )
                .into_response();
        }
        let used = number("x-used").unwrap_or(0);
        if number("x-stream") != Some(1) {
            let body =
                format!(r#"{{"choices":[{{"text":"hi"}}],"usage":{{"total_tokens":{used}}}}}"#);
            return ([("content-type", "application/json")], body).into_response();
        }
        let events = vec![
            r#"data: {"choices":[{"delta":{"content":"hel"}}]}"#.to_owned() + "\n\n",
            r#"data: {"choices":[{"delta":{"content":"lo"}}]}"#.to_owned() + "\n\n",
            r#"data: {"choices":[],"usa"#.to_owned(),
            format!(r#"ge":{{"total_tokens":{used}}}}}"#) + "\n\n",
            "data: [DONE]\n\n".to_owned(),
        ];
        let stream = futures_util::stream::unfold(events.into_iter(), |mut events| async move {
            let event = events.next()?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some((Ok::<_, Infallible>(Bytes::from(event)), events))
        });
        (
            [("content-type", "text/event-stream")],
            Body::from_stream(stream),
        )
            .into_response()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    let app = axum::Router::new().route("/v1/chat", axum::routing::post(chat));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// The usage in a JSON answer or a server-sent event's data.
fn total_tokens(json: &[u8]) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_slice(json).ok()?;
    value.get("usage")?.get("total_tokens")?.as_u64()
}

/// A client drawing on `limiter`'s budget: 1 request and 100 tokens (the
/// estimate) each, settled from the answer: the JSON body, or the events
/// of a streamed one.
fn client(limiter: Arc<Limiter>, spec: CallSpec) -> ClientWithMiddleware {
    let middleware = UpstreamMiddleware::new(
        limiter,
        spec,
        [Counts::Requests, Counts::Tokens],
        |_: &reqwest::Request| Draw::new(["model"; 2]).costs([1, 100]),
    )
    .settle_with(|response: &reqwest::Response| {
        let streamed = response
            .headers()
            .get("content-type")
            .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
        if streamed {
            Cost::lines(|line: &[u8]| total_tokens(line.strip_prefix(b"data: ")?))
        } else {
            Cost::body(total_tokens)
        }
    });
    ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build()
}

/// Whether `limiter`'s budget has `tokens` left (and no more): a call of
/// `tokens` fits, one of `tokens + 1` does not (what is probed is given
/// back).
async fn tokens_left(limiter: &Limiter, tokens: u64) -> bool {
    let spec = budget();
    let keys = [&"model" as &(dyn std::fmt::Display + Sync), &"model"];
    let over = [1, tokens + 1];
    let refused = limiter
        .call_with(&spec, Keys::new(&keys).costs(&over))
        .await
        .is_err();
    let exact = [1, tokens];
    let fits = match limiter
        .call_with(&spec, Keys::new(&keys).costs(&exact))
        .await
    {
        Ok(permit) => {
            permit.settle_cost(0).await;
            true
        }
        Err(_) => false,
    };
    refused && fits
}

async fn real_costs_are_held(limiter: Arc<Limiter>) {
    let url = upstream().await;
    let client = client(limiter.clone(), budget());
    let send = |used: u64, stream: bool| {
        client
            .post(format!("{url}/v1/chat"))
            .header("x-used", used.to_string())
            .header("x-stream", u8::from(stream).to_string())
            .send()
    };
    // A JSON answer, read whole.
    let answer = send(37, false).await.expect("answered");
    let text = answer.text().await.expect("a body");
    assert!(text.contains("\"total_tokens\":37"), "{text}");
    assert!(tokens_left(&limiter, 1_000 - 37).await);
    // A streamed answer, read chunk by chunk: the estimate is held until
    // its end, the real cost after it.
    let mut answer = send(12, true).await.expect("answered");
    let first = answer.chunk().await.expect("a chunk").expect("not the end");
    assert!(first.starts_with(b"data: "), "{first:?}");
    assert!(
        tokens_left(&limiter, 1_000 - 37 - 100).await,
        "the estimate while streaming"
    );
    while answer.chunk().await.expect("a chunk").is_some() {}
    assert!(
        tokens_left(&limiter, 1_000 - 37 - 12).await,
        "settled at its end"
    );
    // The same read with `bytes()`, and a JSON body read with `json()`.
    let bytes = send(50, true)
        .await
        .expect("answered")
        .bytes()
        .await
        .expect("a body");
    assert!(bytes.ends_with(b"data: [DONE]\n\n"));
    let json: serde_json::Value = send(1, false)
        .await
        .expect("answered")
        .json()
        .await
        .expect("JSON");
    assert_eq!(json["usage"]["total_tokens"], 1);
    assert!(tokens_left(&limiter, 1_000 - 37 - 12 - 50 - 1).await);
    // A streamed answer dropped before its end keeps its estimate (settled
    // by a task, shortly after).
    let mut dropped = send(5, true).await.expect("answered");
    dropped.chunk().await.expect("a chunk");
    drop(dropped);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(tokens_left(&limiter, 1_000 - 37 - 12 - 50 - 1 - 100).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_holds_the_real_costs_read_from_each_body_in_memory() {
    let limiter = Limiter::builder().memory().build().expect("limiter");
    real_costs_are_held(Arc::new(limiter)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_holds_the_real_costs_read_from_each_body_on_redis() {
    let server = RedisServer::start();
    real_costs_are_held(Arc::new(on_redis(&server).await)).await;
}

async fn on_redis(server: &RedisServer) -> Limiter {
    let backend = RedisBackend::connect(server.url()).await.expect("connect");
    Limiter::builder()
        .backend(backend)
        .build()
        .expect("limiter")
}

/// Two clients, each with its limiter over one store, drawing on a budget
/// that resumes quickly after a pause (a pause leaves none, and the budget
/// refills at its own rate).
async fn a_429_pauses_every_client(one: Arc<Limiter>, other: Arc<Limiter>) {
    let url = upstream().await;
    let spec = || {
        CallSpec::owned(
            "llm",
            vec![
                GroupSpec::owned("llm_rps", vec![Limit::per_second(50).expect("limit")]),
                GroupSpec::owned("llm_tps", vec![Limit::per_second(5_000).expect("limit")])
                    .settled(),
            ],
        )
    };
    let (one, other) = (client(one, spec()), client(other, spec()));
    let refused = one
        .post(format!("{url}/v1/chat"))
        .header("x-refuse", "2")
        .send()
        .await
        .expect("answered");
    assert_eq!(refused.status(), 429);
    // The other client's request that may not wait is refused, not sent.
    let error = other
        .post(format!("{url}/v1/chat"))
        .with_extension(Draw::new(["model"; 2]).costs([1, 100]).wait(Duration::ZERO))
        .send()
        .await
        .expect_err("the budget is paused");
    let rejection = refusal(&error).expect("the middleware's refusal");
    // The 2 s pause, and the rate's step after it (1/50 s).
    let pause = rejection.retry_after().expect("a pause");
    assert!(
        pause > Duration::from_millis(1_500) && pause <= Duration::from_millis(2_100),
        "{pause:?}"
    );
    assert!(matches!(error, reqwest_middleware::Error::Middleware(_)));
    // One that may wait goes after the pause, and is settled.
    let started = Instant::now();
    let answer = other
        .post(format!("{url}/v1/chat"))
        .header("x-used", "10")
        .send()
        .await
        .expect("answered after the pause");
    assert_eq!(answer.status(), 200);
    let waited = started.elapsed();
    assert!(waited > Duration::from_millis(1_400), "{waited:?}");
    answer.bytes().await.expect("a body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_heard_by_one_client_pauses_another_sharing_the_store_in_memory() {
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let limiter = || {
        Arc::new(
            Limiter::builder()
                .shared_backend(store.clone())
                .build()
                .expect("limiter"),
        )
    };
    a_429_pauses_every_client(limiter(), limiter()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_heard_by_one_client_pauses_another_sharing_the_store_on_redis() {
    let server = RedisServer::start();
    let (one, other) = (on_redis(&server).await, on_redis(&server).await);
    a_429_pauses_every_client(Arc::new(one), Arc::new(other)).await;
}
