//! Tiered keys of the tower layer over real HTTP (axum served on a loopback
//! port, requests from `reqwest`), on both backends: the in-memory store
//! and a `redis-server` started by the harness. The tier comes from a
//! request header through the layer's resolver.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use ratewall::tower::{KeyFrom, RateLimitLayer};
use ratewall::{FailurePolicy, Limiter};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;
use tokio::net::TcpListener;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Memory,
    Redis,
}

const BACKENDS: [Backend; 2] = [Backend::Memory, Backend::Redis];

async fn limiter(backend: Backend) -> (Arc<Limiter>, Option<RedisServer>) {
    let builder = Limiter::builder()
        .prefix("layer")
        .failure_policy(FailurePolicy::FailClosed);
    match backend {
        Backend::Memory => (Arc::new(builder.memory().build().unwrap()), None),
        Backend::Redis => {
            let server = RedisServer::start();
            let redis = RedisBackend::connect(server.url()).await.expect("connect");
            (
                Arc::new(builder.backend(redis).build().unwrap()),
                Some(server),
            )
        }
    }
}

/// Serves `/` behind `layer` on a free loopback port; its URL.
async fn serve(layer: RateLimitLayer) -> String {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    format!("http://{addr}/")
}

/// `GET url` with API key `key` and, if any, plan header `plan`.
async fn get_as(url: &str, key: &str, plan: Option<&str>) -> reqwest::Response {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client.get(url).header("x-api-key", key);
    if let Some(plan) = plan {
        request = request.header("x-plan", plan);
    }
    request.send().await.unwrap()
}

fn policy(response: &reqwest::Response) -> &str {
    response
        .headers()
        .get("ratelimit-policy")
        .unwrap_or_else(|| panic!("no ratelimit-policy in {:?}", response.headers()))
        .to_str()
        .unwrap()
}

/// Per API key, by the plan in `x-plan`: free, pro, and a default for
/// requests without a known plan.
fn plans(limiter: Arc<Limiter>, default: bool) -> RateLimitLayer {
    let mut builder = RateLimitLayer::builder("api")
        .tiered_key("api_key", KeyFrom::header("x-api-key"), |parts| {
            parts.headers.get("x-plan")?.to_str().ok()
        })
        .tier("free", ["2/1m"])
        .tier("pro", ["5/1m", "50/1s"]);
    if default {
        builder = builder.tier("default", ["1/1m"]);
    }
    builder.limiter(limiter).build().unwrap()
}

#[tokio::test]
async fn the_layer_resolver_picks_the_tier_from_a_request_header() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let url = serve(plans(limiter, true)).await;
        for _ in 0..2 {
            let admitted = get_as(&url, "k1", Some("free")).await;
            assert_eq!(admitted.status(), 200, "{backend:?}");
            assert_eq!(policy(&admitted), "\"api_key@free\";q=2;w=60");
        }
        let refused = get_as(&url, "k1", Some("free")).await;
        assert_eq!(refused.status(), 429, "{backend:?}");
        assert_eq!(policy(&refused), "\"api_key@free\";q=2;w=60");
        // The same key upgraded: its next request is decided by pro, on
        // pro's own state.
        let upgraded = get_as(&url, "k1", Some("pro")).await;
        assert_eq!(upgraded.status(), 200, "{backend:?}");
        assert_eq!(policy(&upgraded), "\"api_key@pro\";q=5;w=60");
        // No plan, or one that is not a tier: the default tier.
        assert_eq!(get_as(&url, "k2", None).await.status(), 200);
        let defaulted = get_as(&url, "k2", Some("platinum")).await;
        assert_eq!(defaulted.status(), 429, "{backend:?}");
        assert_eq!(policy(&defaulted), "\"api_key@default\";q=1;w=60");
    }
}

#[tokio::test]
async fn a_tier_configured_at_run_time_applies_to_the_next_request() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let url = serve(plans(limiter.clone(), false)).await;
        // No such tier and no default: the limiter fails closed, 503.
        let unknown = get_as(&url, "k3", Some("gold")).await;
        assert_eq!(unknown.status(), 503, "{backend:?}");
        limiter
            .settings()
            .set_limits("api_key@gold", vec!["3/1m".parse().unwrap()])
            .unwrap();
        for _ in 0..3 {
            let admitted = get_as(&url, "k3", Some("gold")).await;
            assert_eq!(admitted.status(), 200, "{backend:?}");
            assert_eq!(policy(&admitted), "\"api_key@gold\";q=3;w=60");
        }
        assert_eq!(get_as(&url, "k3", Some("gold")).await.status(), 429);
        // A declared tier raised at run time.
        assert_eq!(get_as(&url, "k3", Some("free")).await.status(), 200);
        limiter
            .settings()
            .set_limits("api_key@free", vec!["100/1m".parse().unwrap()])
            .unwrap();
        let raised = get_as(&url, "k3", Some("free")).await;
        assert_eq!(raised.status(), 200, "{backend:?}");
        assert_eq!(policy(&raised), "\"api_key@free\";q=100;w=60");
    }
}

#[test]
fn a_tier_without_a_tiered_key_is_a_build_error() {
    let error = RateLimitLayer::builder("api")
        .key("api_key", ["1/1m"], KeyFrom::header("x-api-key"))
        .tier("pro", ["10/1m"])
        .build()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("add one with `tiered_key` first"),
        "{error}"
    );
    let error = RateLimitLayer::builder("api")
        .tiered_key("api_key", KeyFrom::header("x-api-key"), |_| None)
        .tier("pro plan", ["10/1m"])
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("is not a tier name"), "{error}");
    let error = RateLimitLayer::builder("api")
        .tiered_key("api_key", KeyFrom::header("x-api-key"), |_| None)
        .tier("pro", ["10 per fortnight"])
        .build()
        .unwrap_err();
    assert!(
        error.to_string().starts_with("rate limit `api_key@pro`"),
        "{error}"
    );
}
