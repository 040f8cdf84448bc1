//! One table of HTTP cases, run by one function against the tower layer in
//! an axum app and against the actix-web middleware in an actix-web app,
//! both configured by the same `RateLimitLayer` builder, both served on
//! real sockets, on memory and on Redis: a case is a layer and a sequence
//! of requests (method, path, headers, the peer they come from) with the
//! status, the header fields and the body expected of each, and, where
//! said, whether the request made a store call (counted from
//! `ratewall_decisions_total` through a global recorder, so this binary
//! is its own).
//!
//! Peers: the client binds `127.0.0.1` (the proxy, trusted where a case
//! trusts it), `127.0.0.2` (a client without a proxy) or `127.0.0.3`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::routing::get;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use ratewall::Limiter;
use ratewall::actix::RateLimitMiddleware;
use ratewall::http::ProxyHeader;
use ratewall::tower::{KeyFrom, RateLimitLayer, Refusal, RefusalKind};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;

// ---- store calls, counted ----

/// Every `ratewall_decisions_total`, by its `limit` label.
#[derive(Default)]
struct Decisions(Mutex<HashMap<String, Vec<Arc<AtomicU64>>>>);

impl Decisions {
    fn of(&self, limit: &str) -> u64 {
        self.0.lock().unwrap().get(limit).map_or(0, |counts| {
            counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
        })
    }
}

impl Recorder for Decisions {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let count = Arc::new(AtomicU64::new(0));
        if key.name() == "ratewall_decisions_total"
            && let Some(limit) = key.labels().find(|l| l.key() == "limit")
        {
            self.0
                .lock()
                .unwrap()
                .entry(limit.value().to_owned())
                .or_default()
                .push(count.clone());
        }
        Counter::from_arc(count)
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn decisions() -> &'static Decisions {
    static GLOBAL: OnceLock<&'static Decisions> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let decisions: &'static Decisions = Box::leak(Box::default());
        metrics::set_global_recorder(decisions).expect("the only global recorder");
        decisions
    })
}

// ---- the table ----

/// Where a request comes from.
#[derive(Debug, Clone, Copy)]
enum Peer {
    /// `127.0.0.1`: the proxy, trusted where a case trusts it.
    Proxy,
    /// `127.0.0.2`: a client without a proxy.
    Direct,
}

impl Peer {
    fn ip(self) -> IpAddr {
        match self {
            Peer::Proxy => "127.0.0.1".parse().unwrap(),
            Peer::Direct => "127.0.0.2".parse().unwrap(),
        }
    }
}

/// What a header field must be.
#[derive(Debug, Clone)]
enum Expect {
    Is(&'static str),
    StartsWith(&'static str),
    Present,
    Absent,
}

/// One request and what it must get.
#[derive(Debug, Clone)]
struct Step {
    method: &'static str,
    path: &'static str,
    peer: Peer,
    headers: Vec<(&'static str, &'static str)>,
    status: u16,
    fields: Vec<(&'static str, Expect)>,
    body: Vec<&'static str>,
    /// Whether the request is decided by the store (one decision counted);
    /// unchecked when `None`.
    decides: Option<bool>,
}

fn request(method: &'static str, path: &'static str) -> Step {
    Step {
        method,
        path,
        peer: Peer::Direct,
        headers: Vec::new(),
        status: 200,
        fields: Vec::new(),
        body: Vec::new(),
        decides: None,
    }
}

fn get_(path: &'static str) -> Step {
    request("GET", path)
}

impl Step {
    fn via_proxy(mut self) -> Self {
        self.peer = Peer::Proxy;
        self
    }
    fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers.push((name, value));
        self
    }
    fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }
    fn field(mut self, name: &'static str, expect: Expect) -> Self {
        self.fields.push((name, expect));
        self
    }
    fn body(mut self, part: &'static str) -> Self {
        self.body.push(part);
        self
    }
    fn decides(mut self, decides: bool) -> Self {
        self.decides = Some(decides);
        self
    }
}

/// Where a case's layer is applied.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scope {
    /// Around the whole app (before routing).
    App,
    /// On `/users/{id}` only (after routing: axum's `route_layer`,
    /// actix-web's `wrap` on the resource).
    Users,
}

/// A layer (its call named by the runner: unique per run) and its requests.
struct Case {
    name: &'static str,
    scope: Scope,
    layer: fn(&str) -> ratewall::tower::RateLimitLayerBuilder,
    steps: Vec<Step>,
}

/// An RFC 9457 problem of a refusal, with the default fields kept.
fn problem(refusal: &Refusal<'_>) -> http::Response<String> {
    let status = refusal.status();
    let body = format!(
        r#"{{"type":"about:blank","title":"{}","status":{},"detail":"{}","instance":"{}","kind":"{:?}"}}"#,
        status.canonical_reason().unwrap_or(""),
        status.as_u16(),
        refusal.code(),
        refusal.path(),
        refusal.kind(),
    );
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = refusal.headers();
    response.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/problem+json"),
    );
    if refusal.kind() == RefusalKind::Limited {
        response
            .headers_mut()
            .insert("x-refused-by", http::HeaderValue::from_static("limit"));
    }
    response
}

fn cases() -> Vec<Case> {
    use Expect::*;
    vec![
        Case {
            name: "per_ip_429_retry_after_ietf_fields_json",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call)
                    .key("c_ip", ["2/1m"], KeyFrom::client_ip())
                    .trusted_proxies("127.0.0.1".parse().unwrap())
            },
            steps: vec![
                get_("/")
                    .via_proxy()
                    .header("x-forwarded-for", "198.51.100.1")
                    .field("ratelimit-policy", Is("\"c_ip\";q=2;w=60"))
                    .field("ratelimit", StartsWith("\"c_ip\";r=1;t="))
                    .field("x-ratelimit-limit", Absent)
                    .body("ok"),
                get_("/")
                    .via_proxy()
                    .header("x-forwarded-for", "198.51.100.1")
                    .field("ratelimit", StartsWith("\"c_ip\";r=0;t=")),
                get_("/")
                    .via_proxy()
                    .header("x-forwarded-for", "6.6.6.6, 198.51.100.1")
                    .status(429)
                    .field("retry-after", Is("30"))
                    .field("ratelimit-policy", Is("\"c_ip\";q=2;w=60"))
                    .field("ratelimit", StartsWith("\"c_ip\";r=0;t="))
                    .field("content-type", Is("application/json"))
                    .body(r#"{"error":"rate_limited","retry_after_ms":"#),
                get_("/")
                    .via_proxy()
                    .header("x-forwarded-for", "198.51.100.2"),
                // A client without a proxy writes what it likes: its own address counts.
                get_("/").header("x-forwarded-for", "198.51.100.1"),
                get_("/").header("x-forwarded-for", "198.51.100.3"),
                get_("/")
                    .header("x-forwarded-for", "198.51.100.4")
                    .status(429),
            ],
        },
        Case {
            name: "header_key_400_without_it",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call).key("c_key", ["1/1m"], KeyFrom::header("x-api-key"))
            },
            steps: vec![
                get_("/").header("x-api-key", "k1"),
                get_("/").header("x-api-key", "k1").status(429),
                get_("/").header("x-api-key", "k2"),
                get_("/")
                    .status(400)
                    .field("content-type", Is("application/json"))
                    .body(r#"{"error":"rate_limit_key_missing","message":"missing header `x-api-key`"}"#),
                get_("/").header("x-api-key", "").status(400).body("empty header"),
            ],
        },
        Case {
            name: "several_keys_all_or_nothing",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call)
                    .key("c_both_ip", ["3/1h"], KeyFrom::client_ip())
                    .key("c_both_key", ["1/1h"], KeyFrom::header("x-api-key"))
            },
            steps: vec![
                get_("/").header("x-api-key", "k1"),
                get_("/")
                    .header("x-api-key", "k1")
                    .status(429)
                    .field("ratelimit-policy", Is("\"c_both_key\";q=1;w=3600")),
                get_("/").header("x-api-key", "k2"),
                get_("/").header("x-api-key", "k3"),
                get_("/")
                    .header("x-api-key", "k4")
                    .status(429)
                    .field("ratelimit-policy", Is("\"c_both_ip\";q=3;w=3600")),
            ],
        },
        Case {
            name: "tiers_from_a_function_of_the_head",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call)
                    .tiered_key("c_plan", KeyFrom::header("x-api-key"), |parts| {
                        parts.headers.get("x-plan")?.to_str().ok()
                    })
                    .tier("free", ["1/1m"])
                    .tier("pro", ["3/1m"])
                    .tier("default", ["1/1m"])
            },
            steps: vec![
                get_("/").header("x-api-key", "p").header("x-plan", "pro"),
                get_("/").header("x-api-key", "p").header("x-plan", "pro"),
                get_("/")
                    .header("x-api-key", "p")
                    .header("x-plan", "pro")
                    .field("ratelimit", Present),
                get_("/")
                    .header("x-api-key", "p")
                    .header("x-plan", "pro")
                    .status(429),
                get_("/").header("x-api-key", "f").header("x-plan", "free"),
                get_("/")
                    .header("x-api-key", "f")
                    .header("x-plan", "free")
                    .status(429),
            ],
        },
        Case {
            name: "a_key_from_a_function_of_the_uri",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call).key(
                    "c_user",
                    ["1/1m"],
                    KeyFrom::from_fn(|parts| {
                        let query = parts.uri.query()?;
                        query.strip_prefix("user=").map(str::to_owned)
                    }),
                )
            },
            steps: vec![
                get_("/?user=ann"),
                get_("/?user=ann").status(429),
                get_("/?user=bob"),
                get_("/")
                    .status(400)
                    .body(r#""error":"rate_limit_key_missing""#),
            ],
        },
        Case {
            name: "path_parameters_after_routing",
            scope: Scope::Users,
            layer: |call| {
                RateLimitLayer::builder(call).key("c_reads", ["1/1h"], KeyFrom::path_param("id"))
            },
            steps: vec![
                get_("/users/1").body("user"),
                get_("/users/1").status(429),
                get_("/users/%31").status(429),
                get_("/users/2"),
                // Not a limited route.
                get_("/"),
                get_("/"),
            ],
        },
        Case {
            name: "exemptions_make_no_store_call_and_get_no_fields",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call)
                    .key("c_exempt", ["1/1h"], KeyFrom::client_ip())
                    .exempt_methods([http::Method::OPTIONS])
                    .exempt_path_prefix("/health")
                    .exempt_path("/metrics")
                    .exempt_if(|parts| parts.headers.contains_key("x-internal-job"))
            },
            steps: vec![
                get_("/").field("ratelimit", Present).decides(true),
                get_("/").status(429).decides(true),
                request("OPTIONS", "/")
                    .field("ratelimit", Absent)
                    .field("ratelimit-policy", Absent)
                    .decides(false),
                get_("/health")
                    .field("ratelimit", Absent)
                    .decides(false),
                get_("/health/live").decides(false),
                get_("/metrics").field("ratelimit", Absent).decides(false),
                get_("/")
                    .header("x-internal-job", "nightly")
                    .field("ratelimit", Absent)
                    .decides(false),
                // Not exempted: limited like the rest.
                get_("/healthz").status(429).decides(true),
                get_("/health%2Flive").status(429).decides(true),
                request("POST", "/").status(429).decides(true),
            ],
        },
        Case {
            name: "legacy_headers_alone",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call)
                    .key("c_legacy", ["2/1m"], KeyFrom::client_ip())
                    .headers(false)
                    .legacy_headers(true)
            },
            steps: vec![
                get_("/")
                    .field("x-ratelimit-limit", Is("2"))
                    .field("x-ratelimit-remaining", Is("1"))
                    .field("x-ratelimit-reset", Is("30"))
                    .field("ratelimit", Absent),
                get_("/")
                    .field("x-ratelimit-remaining", Is("0"))
                    .field("x-ratelimit-reset", Present),
                get_("/")
                    .status(429)
                    .field("x-ratelimit-limit", Is("2"))
                    .field("x-ratelimit-remaining", Is("0"))
                    .field("x-ratelimit-reset", Present)
                    .field("retry-after", Is("30"))
                    .field("ratelimit", StartsWith("\"c_legacy\";r=0")),
            ],
        },
        Case {
            name: "legacy_headers_beside_the_ietf_fields",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call)
                    .key("c_both_forms", ["5/1m"], KeyFrom::client_ip())
                    .legacy_headers(true)
            },
            steps: vec![
                get_("/")
                    .field("x-ratelimit-limit", Is("5"))
                    .field("x-ratelimit-remaining", Is("4"))
                    .field("x-ratelimit-reset", Is("12"))
                    .field("ratelimit", Is("\"c_both_forms\";r=4;t=12")),
            ],
        },
        Case {
            name: "a_response_hook_answers_with_rfc_9457_problems",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call)
                    .key("c_hook", ["1/1m"], KeyFrom::header("x-api-key"))
                    .legacy_headers(true)
                    .on_refusal(problem)
            },
            steps: vec![
                get_("/").header("x-api-key", "k").field("x-refused-by", Absent),
                get_("/")
                    .header("x-api-key", "k")
                    .status(429)
                    .field("content-type", Is("application/problem+json"))
                    .field("retry-after", Is("60"))
                    .field("ratelimit-policy", Is("\"c_hook\";q=1;w=60"))
                    .field("x-ratelimit-remaining", Is("0"))
                    .field("x-refused-by", Is("limit"))
                    .body(r#""title":"Too Many Requests","status":429,"detail":"rate_limited","instance":"/","kind":"Limited""#),
                get_("/")
                    .status(400)
                    .field("content-type", Is("application/problem+json"))
                    .field("retry-after", Absent)
                    .body(r#""status":400,"detail":"rate_limit_key_missing","instance":"/","kind":"MissingKey""#),
            ],
        },
        Case {
            name: "forwarded_and_x_real_ip_from_a_trusted_proxy_only",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call)
                    .key("c_fwd", ["1/1h"], KeyFrom::client_ip())
                    .trusted_proxies(
                        "127.0.0.1"
                            .parse::<ratewall::http::TrustedProxies>()
                            .unwrap()
                            .with_headers([ProxyHeader::Forwarded, ProxyHeader::XRealIp]),
                    )
            },
            steps: vec![
                get_("/")
                    .via_proxy()
                    .header("forwarded", "for=198.51.100.7;proto=http;by=127.0.0.1"),
                get_("/")
                    .via_proxy()
                    .header("forwarded", "for=\"198.51.100.7:4711\"")
                    .status(429),
                get_("/")
                    .via_proxy()
                    .header("forwarded", "for=\"[2001:db8:cafe::17]:4711\""),
                get_("/")
                    .via_proxy()
                    .header("forwarded", "for=\"[2001:db8:cafe::99]\"")
                    .status(429), // the same /64
                // Two elements: the right-most untrusted one is the client.
                get_("/")
                    .via_proxy()
                    .header("forwarded", "for=198.51.100.8, for=198.51.100.9"),
                get_("/")
                    .via_proxy()
                    .header("forwarded", "for=1.1.1.1")
                    .header("forwarded", "for=198.51.100.9")
                    .status(429),
                // X-Real-IP when there is no Forwarded.
                get_("/")
                    .via_proxy()
                    .header("x-real-ip", "198.51.100.7")
                    .status(429),
                get_("/").via_proxy().header("x-real-ip", "198.51.100.10"),
                // Forwarded first when both are there.
                get_("/")
                    .via_proxy()
                    .header("forwarded", "for=198.51.100.11")
                    .header("x-real-ip", "198.51.100.10"),
                // X-Forwarded-For is not one of these proxies' headers: the
                // proxy itself is the client (once, then refused).
                get_("/").via_proxy().header("x-forwarded-for", "198.51.100.12"),
                get_("/")
                    .via_proxy()
                    .header("x-forwarded-for", "198.51.100.13")
                    .status(429),
                // An obfuscated node: the walk stops at the peer.
                get_("/")
                    .via_proxy()
                    .header("forwarded", "for=198.51.100.14, for=_hidden")
                    .status(429),
                // A client that is not behind the proxy cannot name itself.
                get_("/").header("forwarded", "for=198.51.100.20"),
                get_("/")
                    .header("forwarded", "for=198.51.100.21")
                    .header("x-real-ip", "198.51.100.22")
                    .status(429),
            ],
        },
        Case {
            name: "without_trusted_proxies_every_header_is_ignored",
            scope: Scope::App,
            layer: |call| {
                RateLimitLayer::builder(call).key("c_peer", ["1/1h"], KeyFrom::client_ip())
            },
            steps: vec![
                get_("/").via_proxy().header("forwarded", "for=198.51.100.1"),
                get_("/")
                    .via_proxy()
                    .header("x-forwarded-for", "198.51.100.2")
                    .status(429),
                get_("/")
                    .via_proxy()
                    .header("x-real-ip", "198.51.100.3")
                    .status(429),
                get_("/").header("x-real-ip", "198.51.100.3"),
            ],
        },
    ]
}

// ---- the runner ----

#[derive(Debug, Clone, Copy, PartialEq)]
enum Framework {
    Axum,
    Actix,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Backend {
    Memory,
    Redis,
}

async fn serve_axum(layer: RateLimitLayer, scope: Scope) -> SocketAddr {
    let ok = || {
        get(|| async { "ok" })
            .options(|| async { "ok" })
            .post(|| async { "ok" })
    };
    let users = get(|| async { "user" });
    let app = match scope {
        Scope::App => Router::new()
            .route("/", ok())
            .route("/{*rest}", ok())
            .route("/users/{id}", users)
            .layer(layer),
        Scope::Users => Router::new()
            .route("/users/{id}", users)
            .route_layer(layer)
            .route("/", ok()),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
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

fn serve_actix(layer: RateLimitLayer, scope: Scope) -> SocketAddr {
    use actix_web::{App, HttpServer, web};
    let middleware = RateLimitMiddleware::new(layer);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let ok = || async { "ok" };
    let server = match scope {
        Scope::App => HttpServer::new(move || {
            App::new()
                .wrap(middleware.clone())
                .route("/users/{id}", web::get().to(|| async { "user" }))
                .default_service(web::to(ok))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run(),
        Scope::Users => HttpServer::new(move || {
            App::new()
                .service(
                    web::resource("/users/{id}")
                        .wrap(middleware.clone())
                        .route(web::get().to(|| async { "user" })),
                )
                .default_service(web::to(ok))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run(),
    };
    tokio::spawn(server);
    addr
}

async fn limiter(backend: Backend, redis: Option<&RedisServer>, prefix: &str) -> Arc<Limiter> {
    let builder = Limiter::builder().prefix(prefix);
    Arc::new(match backend {
        Backend::Memory => builder.memory().build().unwrap(),
        Backend::Redis => {
            let url = redis.expect("a server").url();
            let redis = RedisBackend::connect(url).await.expect("connect");
            builder.backend(redis).build().unwrap()
        }
    })
}

/// Runs `case` against `framework` on `backend`; panics at the first step
/// that gets what it should not.
async fn run(case: &Case, framework: Framework, backend: Backend, redis: Option<&RedisServer>) {
    let call = format!("{}_{framework:?}_{backend:?}", case.name).to_lowercase();
    let layer = (case.layer)(&call)
        .limiter(limiter(backend, redis, &call).await)
        .build()
        .unwrap();
    let addr = match framework {
        Framework::Axum => serve_axum(layer, case.scope).await,
        Framework::Actix => serve_actix(layer, case.scope),
    };
    let counted = decisions();
    for (at, step) in case.steps.iter().enumerate() {
        let at = format!(
            "{} on {framework:?} and {backend:?}, step {at}: {step:?}",
            case.name
        );
        let client = reqwest::Client::builder()
            .no_proxy()
            .local_address(step.peer.ip())
            .build()
            .unwrap();
        let method = reqwest::Method::from_bytes(step.method.as_bytes()).unwrap();
        let mut request = client.request(method, format!("http://{addr}{}", step.path));
        for (name, value) in &step.headers {
            request = request.header(*name, *value);
        }
        let before = counted.of(&call);
        let response = request.send().await.unwrap_or_else(|e| panic!("{at}: {e}"));
        assert_eq!(response.status().as_u16(), step.status, "{at}");
        for (name, expect) in &step.fields {
            let value = response.headers().get(*name).map(|v| v.to_str().unwrap());
            let holds = match (expect, value) {
                (Expect::Is(want), Some(got)) => got == *want,
                (Expect::StartsWith(want), Some(got)) => got.starts_with(want),
                (Expect::Present, Some(_)) | (Expect::Absent, None) => true,
                _ => false,
            };
            assert!(
                holds,
                "{at}: `{name}` is {value:?}, expected {expect:?}; {:?}",
                response.headers()
            );
        }
        let body = response.text().await.unwrap();
        for part in &step.body {
            assert!(body.contains(part), "{at}: body {body:?} lacks {part:?}");
        }
        if let Some(decides) = step.decides {
            let made = counted.of(&call) - before;
            assert_eq!(made, u64::from(decides), "{at}: {made} store decisions");
        }
    }
    eprintln!("passed: {} on {framework:?} and {backend:?}", case.name);
}

async fn run_all(backend: Backend) {
    decisions();
    let redis = (backend == Backend::Redis).then(RedisServer::start);
    let cases = cases();
    for case in &cases {
        for framework in [Framework::Axum, Framework::Actix] {
            run(case, framework, backend, redis.as_ref()).await;
        }
    }
    eprintln!(
        "{} cases passed on axum and actix-web, {backend:?}",
        cases.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_passes_on_axum_and_actix_web_in_memory() {
    run_all(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_passes_on_axum_and_actix_web_on_redis() {
    run_all(Backend::Redis).await;
}
