//! The tower layer over real HTTP (axum served on a loopback port, requests
//! from `reqwest`) and real gRPC (a tonic server and client), on both
//! backends: the in-memory store and a `redis-server` started by the
//! harness. Every test runs once per backend.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use bytes::{Buf, BufMut};
use ratewall::http::{IpPrefix, TrustedProxies};
use ratewall::tower::{KeyFrom, MissingKey, RateLimitLayer};
use ratewall::{Algorithm, FailurePolicy, Limit, Limiter};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;
use tokio::net::TcpListener;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Memory,
    Redis,
}

const BACKENDS: [Backend; 2] = [Backend::Memory, Backend::Redis];

const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

/// A limiter on `backend` (and the Redis server it uses, kept alive).
async fn limiter(backend: Backend) -> (Arc<Limiter>, Option<RedisServer>) {
    limiter_with(backend, FailurePolicy::FailOpen).await
}

async fn limiter_with(
    backend: Backend,
    policy: FailurePolicy,
) -> (Arc<Limiter>, Option<RedisServer>) {
    let builder = Limiter::builder().prefix("layer").failure_policy(policy);
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

/// Serves `app` on a free loopback port, with the peer address available.
async fn serve(app: Router) -> SocketAddr {
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
    addr
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn ok() -> axum::routing::MethodRouter {
    get(|| async { "ok" })
}

/// `GET url` with the given headers (the future borrows neither).
fn send(
    url: &str,
    headers: &[(&str, &str)],
) -> impl std::future::Future<Output = reqwest::Response> + use<> {
    let mut request = client().get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    async move { request.send().await.unwrap() }
}

/// A request from `client` through the trusted loopback proxy.
async fn from(url: &str, client: &str) -> reqwest::Response {
    send(url, &[("x-forwarded-for", client)]).await
}

fn header<'r>(response: &'r reqwest::Response, name: &str) -> &'r str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no `{name}` in {:?}", response.headers()))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn a_per_ip_limit_refuses_with_429_retry_after_ietf_fields_and_json() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let layer = RateLimitLayer::builder("ip_api")
            .key("ip_api", ["3/1m"], KeyFrom::client_ip())
            .limiter(limiter)
            .trusted_proxies("127.0.0.1".parse().unwrap())
            .build()
            .unwrap();
        let addr = serve(Router::new().route("/", ok()).layer(layer)).await;
        let url = format!("http://{addr}/");
        for remaining in [2, 1, 0] {
            let admitted = from(&url, "198.51.100.1").await;
            assert_eq!(admitted.status(), 200, "{backend:?}");
            assert_eq!(header(&admitted, "ratelimit-policy"), "\"ip_api\";q=3;w=60");
            let fields = header(&admitted, "ratelimit");
            assert!(
                fields.starts_with(&format!("\"ip_api\";r={remaining};t=")),
                "{backend:?}: {fields}"
            );
        }
        let refused = from(&url, "198.51.100.1").await;
        assert_eq!(refused.status(), 429, "{backend:?}");
        assert_eq!(header(&refused, "retry-after"), "20"); // GCRA: 3 per minute, one per 20 s
        assert_eq!(header(&refused, "ratelimit-policy"), "\"ip_api\";q=3;w=60");
        assert!(header(&refused, "ratelimit").starts_with("\"ip_api\";r=0;t="));
        assert_eq!(header(&refused, "content-type"), "application/json");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert_eq!(body["error"], "rate_limited");
        assert!(body["retry_after_ms"].as_u64().unwrap() > 19_000);
        // Another client has its own quota.
        assert_eq!(
            from(&url, "198.51.100.2").await.status(),
            200,
            "{backend:?}"
        );
    }
}

/// An annotated function limited under the layer's name, keyed by the
/// client's address.
#[ratewall::rate_limit(name = "shared_ip", key = ip, limits = ["3/1m"], limiter = limiter)]
async fn shared_ip(limiter: &Limiter, ip: std::net::IpAddr) -> Result<(), ratewall::Rejection> {
    Ok(())
}

#[tokio::test]
async fn a_layer_and_a_function_under_one_name_share_each_client_ips_counter() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let layer = RateLimitLayer::builder("shared_ip")
            .key("shared_ip", ["3/1m"], KeyFrom::client_ip())
            .limiter(limiter.clone())
            .trusted_proxies("127.0.0.1".parse().unwrap())
            .headers(false)
            .build()
            .unwrap();
        let addr = serve(Router::new().route("/", ok()).layer(layer)).await;
        let url = format!("http://{addr}/");
        let ip: std::net::IpAddr = "198.51.100.7".parse().unwrap();
        // One unit through the layer, one through the function, one through
        // the call API with the address as text: the same counter.
        assert_eq!(
            from(&url, "198.51.100.7").await.status(),
            200,
            "{backend:?}"
        );
        assert!(shared_ip(&limiter, ip).await.is_ok(), "{backend:?}");
        let spec = ratewall::CallSpec::owned(
            "shared_ip",
            vec![ratewall::GroupSpec::owned(
                "shared_ip",
                vec!["3/1m".parse().unwrap()],
            )],
        );
        assert!(
            limiter.call(&spec, &[&"198.51.100.7"]).await.is_ok(),
            "{backend:?}"
        );
        assert_eq!(
            from(&url, "198.51.100.7").await.status(),
            429,
            "{backend:?}"
        );
        assert!(shared_ip(&limiter, ip).await.is_err(), "{backend:?}");
        // The number of the same value is another identity.
        let number = u64::from(u32::from(std::net::Ipv4Addr::new(198, 51, 100, 7)));
        assert!(limiter.call(&spec, &[&number]).await.is_ok(), "{backend:?}");
    }
}

#[tokio::test]
async fn ipv6_clients_are_limited_per_64_so_a_host_cannot_rotate_addresses() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let layer = RateLimitLayer::builder("ip6")
            .key("ip6", ["20/1h"], KeyFrom::client_ip())
            .limiter(limiter)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", ok())
            .layer(layer)
            .layer(Extension("127.0.0.1".parse::<TrustedProxies>().unwrap()));
        let url = format!("http://{}/", serve(app).await);
        // 25 sends from 25 addresses of one /64 (the measured problem): 20 pass.
        let mut admitted = 0;
        for i in 1..=25 {
            let address = format!("2001:db8:aa:bb::{i:x}");
            if from(&url, &address).await.status() == 200 {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 20, "{backend:?}");
        // The neighbouring /64 is another client.
        assert_eq!(from(&url, "2001:db8:aa:bc::1").await.status(), 200);
    }
}

#[tokio::test]
async fn hierarchical_per_ip_limits_per_64_and_per_48_are_decided_together() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let layer = RateLimitLayer::builder("net")
            .key("net_64", ["3/1h"], KeyFrom::client_ip())
            .key("net_48", ["5/1h"], KeyFrom::client_network(IpPrefix::V6_48))
            .limiter(limiter)
            .trusted_proxies("127.0.0.1".parse().unwrap())
            .build()
            .unwrap();
        let url = format!(
            "http://{}/",
            serve(Router::new().route("/", ok()).layer(layer)).await
        );
        let refused_by = |response: &reqwest::Response| {
            (response.status() == 429).then(|| header(response, "ratelimit-policy").to_owned())
        };
        for i in 1..=3 {
            let response = from(&url, &format!("2001:db8:1:1::{i}")).await;
            assert_eq!(response.status(), 200, "{backend:?}");
        }
        let spent_64 = from(&url, "2001:db8:1:1::99").await;
        assert_eq!(refused_by(&spent_64).unwrap(), "\"net_64\";q=3;w=3600");
        // A refused request took nothing from the /48: two more /64s fit it.
        for net in [2, 3] {
            let response = from(&url, &format!("2001:db8:1:{net}::1")).await;
            assert_eq!(response.status(), 200, "{backend:?} /64 #{net}");
        }
        let spent_48 = from(&url, "2001:db8:1:4::1").await;
        assert_eq!(refused_by(&spent_48).unwrap(), "\"net_48\";q=5;w=3600");
        // Another /48, and IPv4 clients (keyed in full by both keys), pass.
        assert_eq!(from(&url, "2001:db8:2:1::1").await.status(), 200);
        assert_eq!(from(&url, "192.0.2.1").await.status(), 200);
    }
}

#[tokio::test]
async fn a_per_header_limit_counts_each_value_and_answers_400_without_it() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let layer = RateLimitLayer::builder("keyed")
            .key("keyed", ["2/1m"], KeyFrom::header("x-api-key"))
            .limiter(limiter)
            .build()
            .unwrap();
        let url = format!(
            "http://{}/",
            serve(Router::new().route("/", ok()).layer(layer)).await
        );
        let with = |key: &'static str| send(&url, &[("x-api-key", key)]);
        assert_eq!(with("k1").await.status(), 200);
        assert_eq!(with("k1").await.status(), 200);
        assert_eq!(with("k1").await.status(), 429, "{backend:?}");
        assert_eq!(with("k2").await.status(), 200, "{backend:?}");
        // Keys are escaped: a value cannot reach another's counter.
        assert_eq!(with("k1}").await.status(), 200, "{backend:?}");
        let missing = send(&url, &[]).await;
        assert_eq!(missing.status(), 400);
        let body: serde_json::Value = missing.json().await.unwrap();
        assert_eq!(body["error"], "rate_limit_key_missing");
        assert_eq!(body["message"], "missing header `x-api-key`");
    }
}

#[tokio::test]
async fn several_keys_are_all_or_nothing_a_refusal_consumes_no_other_key() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let layer = RateLimitLayer::builder("both")
            .key("both_ip", ["3/1h"], KeyFrom::client_ip())
            .key("both_key", ["1/1h"], KeyFrom::header("x-api-key"))
            .limiter(limiter)
            .trusted_proxies("127.0.0.1".parse().unwrap())
            .build()
            .unwrap();
        let url = format!(
            "http://{}/",
            serve(Router::new().route("/", ok()).layer(layer)).await
        );
        let call = |ip: &'static str, key: &'static str| {
            send(&url, &[("x-forwarded-for", ip), ("x-api-key", key)])
        };
        assert_eq!(call("192.0.2.9", "k1").await.status(), 200);
        for _ in 0..5 {
            let refused = call("192.0.2.9", "k1").await;
            assert_eq!(refused.status(), 429);
            assert_eq!(
                header(&refused, "ratelimit-policy"),
                "\"both_key\";q=1;w=3600"
            );
        }
        // The five refusals took nothing from the IP: two more keys fit it.
        assert_eq!(call("192.0.2.9", "k2").await.status(), 200, "{backend:?}");
        assert_eq!(call("192.0.2.9", "k3").await.status(), 200, "{backend:?}");
        let by_ip = call("192.0.2.9", "k4").await;
        assert_eq!(header(&by_ip, "ratelimit-policy"), "\"both_ip\";q=3;w=3600");
        // Refused by the IP, k4 kept its unit: from another IP it passes.
        assert_eq!(call("192.0.2.10", "k4").await.status(), 200, "{backend:?}");
    }
}

#[tokio::test]
async fn limits_set_at_run_time_apply_to_the_next_request() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let log = |threshold, period| {
            Limit::new(threshold, period)
                .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
                .unwrap()
        };
        let layer = RateLimitLayer::builder("live")
            .key("live", [log(1, HOUR)], KeyFrom::header("x-api-key"))
            .limiter(limiter.clone())
            .build()
            .unwrap();
        let url = format!(
            "http://{}/",
            serve(Router::new().route("/", ok()).layer(layer)).await
        );
        let with_key = || send(&url, &[("x-api-key", "k")]);
        assert_eq!(with_key().await.status(), 200);
        assert_eq!(with_key().await.status(), 429);
        // Raised: the one request made counts against the new threshold.
        limiter
            .settings()
            .set_limits("live", vec![log(3, HOUR)])
            .unwrap();
        let raised = with_key().await;
        assert_eq!(raised.status(), 200, "{backend:?}");
        assert_eq!(header(&raised, "ratelimit-policy"), "\"live\";q=3;w=3600");
        assert_eq!(with_key().await.status(), 200, "{backend:?}");
        assert_eq!(with_key().await.status(), 429, "{backend:?}");
        // Lowered below what was made: refused at once.
        limiter
            .settings()
            .set_limits("live", vec![log(2, HOUR)])
            .unwrap();
        let lowered = with_key().await;
        assert_eq!(lowered.status(), 429, "{backend:?}");
        assert_eq!(header(&lowered, "ratelimit-policy"), "\"live\";q=2;w=3600");
        // Back to the compiled-in limit.
        limiter.settings().clear_limits("live");
        assert_eq!(
            header(&with_key().await, "ratelimit-policy"),
            "\"live\";q=1;w=3600"
        );
    }
}

#[tokio::test]
async fn route_layers_key_by_path_parameter_and_a_layer_before_routing_cannot() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let by_id = RateLimitLayer::builder("user_reads")
            .key("user_reads", ["1/1h"], KeyFrom::path_param("id"))
            .limiter(limiter.clone())
            .headers(false)
            .build()
            .unwrap();
        // Wrapping a whole router runs before routing: no path parameters.
        let before_routing = tower::Layer::layer(&by_id, Router::new().route("/{id}", ok()));
        let app = Router::new()
            .route("/users/{id}", ok())
            .route_layer(by_id)
            .nest_service("/outer", before_routing);
        let base = format!("http://{}", serve(app).await);
        let user = |id: &str| send_owned(format!("{base}/users/{id}"));
        let first = user("1").await;
        assert_eq!(first.status(), 200);
        assert!(first.headers().get("ratelimit").is_none(), "headers(false)");
        assert_eq!(user("1").await.status(), 429, "{backend:?}");
        assert_eq!(
            user("%31").await.status(),
            429,
            "{backend:?}: decoded before keying"
        );
        assert_eq!(user("2").await.status(), 200, "{backend:?}");
        // route_layer leaves unmatched requests alone.
        assert_eq!(
            send_owned(format!("{base}/users/1/more")).await.status(),
            404
        );
        // Before routing there are no parameters: a 500 that says why.
        let outer = send_owned(format!("{base}/outer/1")).await;
        assert_eq!(outer.status(), 500);
        let body: serde_json::Value = outer.json().await.unwrap();
        assert_eq!(body["error"], "rate_limit_misconfigured");
        assert!(body["message"].as_str().unwrap().contains("route_layer"));
    }
}

async fn send_owned(url: String) -> reqwest::Response {
    send(&url, &[]).await
}

/// The authenticated user, as an earlier layer puts it in the extensions.
#[derive(Debug, Clone)]
struct User(String);

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|token| User(token.to_owned()));
    if let Some(user) = user {
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

#[tokio::test]
async fn an_identity_from_an_earlier_layer_is_a_key_and_its_absence_is_configurable() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let per_user = |missing| {
            RateLimitLayer::builder("per_user")
                .key("per_user", ["1/1h"], KeyFrom::extension::<User>())
                .limiter(limiter.clone())
                .on_missing_key(missing)
                .build()
                .unwrap()
        };
        let app = Router::new()
            .route("/strict", ok())
            .layer(per_user(MissingKey::Reject))
            .route("/lenient", ok().layer(per_user(MissingKey::Allow)))
            .layer(middleware::from_fn(authenticate));
        let base = format!("http://{}", serve(app).await);
        let as_user = |path: &str, user: &str| {
            let url = format!("{base}{path}");
            let token = format!("Bearer {user}");
            async move { send(&url, &[("authorization", &token)]).await }
        };
        assert_eq!(as_user("/strict", "ann").await.status(), 200);
        assert_eq!(as_user("/strict", "ann").await.status(), 429, "{backend:?}");
        assert_eq!(
            as_user("/lenient", "ann").await.status(),
            429,
            "{backend:?}: one name, one counter"
        );
        assert_eq!(as_user("/strict", "bob").await.status(), 200, "{backend:?}");
        let anonymous = send_owned(format!("{base}/strict")).await;
        assert_eq!(anonymous.status(), 500);
        let body: serde_json::Value = anonymous.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains("User"));
        for _ in 0..3 {
            assert_eq!(send_owned(format!("{base}/lenient")).await.status(), 200);
        }
    }
}

#[tokio::test]
async fn an_unavailable_limiter_that_fails_closed_answers_503() {
    let (limiter, redis) = limiter_with(Backend::Redis, FailurePolicy::FailClosed).await;
    let layer = RateLimitLayer::builder("closed")
        .key("closed", ["100/1m"], KeyFrom::client_ip())
        .limiter(limiter)
        .build()
        .unwrap();
    let url = format!(
        "http://{}/",
        serve(Router::new().route("/", ok()).layer(layer)).await
    );
    assert_eq!(send(&url, &[]).await.status(), 200);
    redis.unwrap().kill();
    let down = send(&url, &[]).await;
    assert_eq!(down.status(), 503);
    let body: serde_json::Value = down.json().await.unwrap();
    assert_eq!(body["error"], "rate_limiter_unavailable");
}

// ---- gRPC: a tonic server behind the layer, called by a tonic client ----

/// A codec of UTF-8 strings (no protobuf needed).
#[derive(Debug, Clone, Copy, Default)]
struct Text;

impl tonic::codec::Codec for Text {
    type Encode = String;
    type Decode = String;
    type Encoder = Text;
    type Decoder = Text;

    fn encoder(&mut self) -> Text {
        Text
    }

    fn decoder(&mut self) -> Text {
        Text
    }
}

impl tonic::codec::Encoder for Text {
    type Item = String;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: String,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Self::Error> {
        dst.put_slice(item.as_bytes());
        Ok(())
    }
}

impl tonic::codec::Decoder for Text {
    type Item = String;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<String>, Self::Error> {
        let bytes = src.copy_to_bytes(src.remaining());
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))
    }
}

/// `test.Greeter/Hello`: answers `hello NAME`.
#[derive(Debug, Clone)]
struct Greeter;

impl tonic::server::NamedService for Greeter {
    const NAME: &'static str = "test.Greeter";
}

struct Hello;

impl tonic::server::UnaryService<String> for Hello {
    type Response = String;
    type Future = Ready<Result<tonic::Response<String>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<String>) -> Self::Future {
        ready(Ok(tonic::Response::new(format!(
            "hello {}",
            request.into_inner()
        ))))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Greeter {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move { Ok(tonic::server::Grpc::new(Text).unary(Hello, request).await) })
    }
}

async fn hello(channel: &tonic::transport::Channel, name: &str) -> Result<String, tonic::Status> {
    let mut client = tonic::client::Grpc::new(channel.clone());
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unknown(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static("/test.Greeter/Hello");
    client
        .unary(tonic::Request::new(name.to_owned()), path, Text)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_tonic_client_gets_resource_exhausted_with_the_retry_pushback() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let layer = RateLimitLayer::builder("grpc")
            .key("grpc", ["2/1m"], KeyFrom::client_ip())
            .limiter(limiter)
            .build()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .layer(layer)
                .add_service(Greeter)
                .serve_with_incoming(incoming),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        assert_eq!(hello(&channel, "ann").await.unwrap(), "hello ann");
        assert_eq!(hello(&channel, "bob").await.unwrap(), "hello bob");
        let status = hello(&channel, "cy").await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::ResourceExhausted,
            "{backend:?}: {status:?}"
        );
        assert!(
            status
                .message()
                .starts_with("rate limited by `grpc`: retry after "),
            "{}",
            status.message()
        );
        let pushback = status.metadata().get("grpc-retry-pushback-ms").unwrap();
        let pushback: u64 = pushback.to_str().unwrap().parse().unwrap();
        assert!((29_000..=30_000).contains(&pushback), "{pushback}");
        assert_eq!(
            status.metadata().get("ratelimit-policy").unwrap(),
            "\"grpc\";q=2;w=60"
        );
    }
}

#[tokio::test]
async fn in_flight_slots_are_held_until_the_response_is_ready_and_refused_as_too_many_in_flight() {
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let layer = RateLimitLayer::builder("reports")
            .key("reports_ip", ["100/1m"], KeyFrom::client_ip())
            .in_flight("reports_tenant", 2, KeyFrom::header("x-tenant"))
            .limiter(limiter.clone())
            .trusted_proxies("127.0.0.1".parse().unwrap())
            .build()
            .unwrap();
        // Each request waits in the handler until the test lets one go.
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let entered = Arc::new(tokio::sync::Semaphore::new(0));
        let handler = {
            let (gate, entered) = (gate.clone(), entered.clone());
            get(move || async move {
                entered.add_permits(1);
                gate.acquire().await.unwrap().forget();
                "report"
            })
        };
        let addr = serve(Router::new().route("/", handler).layer(layer)).await;
        let url = format!("http://{addr}/");
        let headers = [("x-forwarded-for", "198.51.100.7"), ("x-tenant", "acme")];
        let first = tokio::spawn(send(&url, &headers));
        let second = tokio::spawn(send(&url, &headers));
        entered.acquire_many(2).await.unwrap().forget();

        let refused = send(&url, &headers).await;
        assert_eq!(refused.status(), 429, "{backend:?}");
        assert_eq!(header(&refused, "retry-after"), "1");
        assert!(refused.headers().get("ratelimit").is_none(), "{backend:?}");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert_eq!(body["error"], "too_many_in_flight");
        assert_eq!(body["max_in_flight"], 2);
        // Another tenant has its own slots.
        let other = [("x-forwarded-for", "198.51.100.7"), ("x-tenant", "globex")];
        let other = tokio::spawn(send(&url, &other));
        entered.acquire().await.unwrap().forget();

        // One of the two held requests is let go (the gate is fair: not `other`).
        gate.add_permits(1);
        while !first.is_finished() && !second.is_finished() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let (done, second) = if first.is_finished() {
            (first.await.unwrap(), second)
        } else {
            (second.await.unwrap(), first)
        };
        assert_eq!(done.status(), 200, "{backend:?}");
        // The binding rate limit's fields, not the slots'.
        assert!(header(&done, "ratelimit").starts_with("\"reports_ip\";"));
        limiter.flush_in_flight().await;
        let third = tokio::spawn(send(&url, &headers));
        entered.acquire().await.unwrap().forget();
        gate.add_permits(3);
        for response in [second, third, other] {
            assert_eq!(response.await.unwrap().status(), 200, "{backend:?}");
        }
    }
}

#[tokio::test]
async fn grpc_refusal_hooks_answer_refused_calls_with_their_own_status() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for backend in BACKENDS {
        let (limiter, _redis) = limiter(backend).await;
        let hooked = Arc::new(AtomicUsize::new(0));
        let counter = hooked.clone();
        // A tonic Status of the application's, keeping the server's pushback.
        let layer = RateLimitLayer::builder("grpc_hook")
            .key("grpc_hook", ["1/1m"], KeyFrom::client_ip())
            .limiter(limiter.clone())
            .on_refusal(
                |_: &ratewall::tower::Refusal<'_>| -> http::Response<String> {
                    unreachable!("gRPC calls are answered by the gRPC hook")
                },
            )
            .on_grpc_refusal(move |refusal: &ratewall::tower::Refusal<'_>| {
                counter.fetch_add(1, Ordering::Relaxed);
                let mut status = tonic::Status::unavailable(format!("busy: {}", refusal.code()));
                let pushback = refusal.retry_after().unwrap().as_millis().to_string();
                status
                    .metadata_mut()
                    .insert("grpc-retry-pushback-ms", pushback.parse().unwrap());
                status
            })
            .build()
            .unwrap();
        let channel = grpc_server(layer).await;
        assert_eq!(hello(&channel, "ann").await.unwrap(), "hello ann");
        assert_eq!(
            hooked.load(Ordering::Relaxed),
            0,
            "not called when admitted"
        );
        let status = hello(&channel, "bob").await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::Unavailable,
            "{backend:?}: {status:?}"
        );
        assert_eq!(status.message(), "busy: rate_limited");
        let pushback: u64 = status
            .metadata()
            .get("grpc-retry-pushback-ms")
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((59_000..=60_000).contains(&pushback), "{pushback}");
        assert_eq!(hooked.load(Ordering::Relaxed), 1);

        // The response parts: the default answer with another code.
        let layer = RateLimitLayer::builder("grpc_parts")
            .key("grpc_parts", ["1/1m"], KeyFrom::client_ip())
            .limiter(limiter)
            .on_grpc_refusal(|refusal: &ratewall::tower::Refusal<'_>| {
                let mut response = refusal.default_grpc_response();
                response
                    .headers_mut()
                    .insert("grpc-status", http::HeaderValue::from(4)); // DEADLINE_EXCEEDED
                response
            })
            .build()
            .unwrap();
        let channel = grpc_server(layer).await;
        assert!(hello(&channel, "ann").await.is_ok());
        let status = hello(&channel, "bob").await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{backend:?}");
        assert!(status.message().starts_with("rate limited by `grpc_parts`"));
        assert_eq!(
            status.metadata().get("ratelimit-policy").unwrap(),
            "\"grpc_parts\";q=1;w=60"
        );
    }
}

/// A tonic server of [`Greeter`] behind `layer`, and a channel to it.
async fn grpc_server(layer: RateLimitLayer) -> tonic::transport::Channel {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(Greeter)
            .serve_with_incoming(incoming),
    );
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}
