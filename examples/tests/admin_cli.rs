//! The `ratewall` CLI (ratewall-redis, feature `cli`), the real binary, against a real `redis-server` after a real
//! limiter on the Redis backend made decisions: it lists the registry,
//! inspects an identity without consuming, resets it, prints JSON, and
//! fails with a clear message and exit code (never a panic).

use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ratewall::{Algorithm, Limit, Limiter, backend::Request};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{RedisCluster, RedisSentinel, RedisServer};
use serde_json::Value;

mod common;

const GATEWAY: &str = env!("CARGO_BIN_EXE_gateway");
const PHONE: &str = "+8613800000000";

fn sms_limits() -> Vec<Limit> {
    ["1/1m", "5/1h"]
        .iter()
        .map(|rate| {
            rate.parse::<Limit>()
                .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
                .unwrap()
        })
        .collect()
}

fn ip_limits() -> Vec<Limit> {
    vec![Limit::per_hour(20).unwrap()]
}

async fn limiter_on(backend: RedisBackend) -> Limiter {
    Limiter::builder()
        .backend(backend)
        .prefix("app")
        .build()
        .unwrap()
}

/// One decision as `#[rate_limit]` makes it (which publishes the limits).
async fn decide(limiter: &Limiter, name: &'static str, identity: &str, limits: &[Limit]) -> bool {
    let key = limiter.key(name, &identity);
    let requests: Vec<Request<'_>> = limits.iter().map(|l| Request::new(&key, l, 1)).collect();
    limiter
        .requests()
        .check(name, &requests, None)
        .await
        .is_ok()
}

/// A limiter that sent one SMS to [`PHONE`] from one IP.
async fn deployment() -> (RedisServer, Limiter) {
    let server = RedisServer::start();
    let limiter = limiter_on(RedisBackend::connect(server.url()).await.unwrap()).await;
    assert!(decide(&limiter, "sms_phone", PHONE, &sms_limits()).await);
    assert!(decide(&limiter, "sms_ip", "203.0.113.7", &ip_limits()).await);
    (server, limiter)
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }

    fn assert_ok(&self) -> &Self {
        assert_eq!(
            self.code, 0,
            "stderr: {}\nstdout: {}",
            self.stderr, self.stdout
        );
        self
    }

    fn assert_failed(&self, code: i32, message: &str) {
        assert_eq!(self.code, code, "stderr: {}", self.stderr);
        assert!(
            self.stderr.contains(message),
            "stderr lacks {message:?}: {}",
            self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        assert!(self.stdout.is_empty(), "stdout: {}", self.stdout);
    }
}

fn admin(args: &[&str]) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(common::ratewall_cli())
        .args(args)
        .env_remove("REDIS_URL")
        .output()
        .expect("run ratewall");
    Run {
        code: status
            .code()
            .expect("ratewall exited, not killed by a signal"),
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

fn on(server: &RedisServer, args: &[&str]) -> Run {
    let url = server.url();
    let mut all = vec!["--redis", url.as_str(), "--prefix", "app"];
    all.extend_from_slice(args);
    admin(&all)
}

#[tokio::test]
async fn limits_lists_every_registered_name_with_its_limits() {
    let (server, _limiter) = deployment().await;
    let run = on(&server, &["limits"]);
    run.assert_ok();
    for part in [
        "2 limit name(s) under prefix `app`",
        "sms_phone",
        "sms_ip",
        "1/1m",
        "5/1h",
        "20/1h",
        "sliding_log",
        "gcra",
        "sl:60000000",
        "ago",
    ] {
        assert!(
            run.stdout.contains(part),
            "{part:?} missing:\n{}",
            run.stdout
        );
    }

    let json = on(&server, &["limits", "--json"]).assert_ok().json();
    assert_eq!(json["registry_key"], "app:{limits}");
    let names: Vec<&str> = json["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sms_ip", "sms_phone"]);
    let phone = &json["names"][1]["limits"];
    assert_eq!(phone[0]["rate"], "1/1m");
    assert_eq!(phone[0]["algorithm"], "sliding_log");
    assert_eq!(phone[0]["suffix"], sms_limits()[0].storage_suffix());
    assert_eq!(phone[1]["threshold"], 5);
}

#[tokio::test]
async fn inspect_shows_the_consumed_state_and_never_consumes() {
    let (server, limiter) = deployment().await;
    let run = on(&server, &["inspect", "sms_phone", PHONE]);
    run.assert_ok();
    assert!(run.stdout.contains("refused"), "{}", run.stdout);
    assert!(run.stdout.contains("REMAINING"), "{}", run.stdout);

    for _ in 0..3 {
        let json = on(&server, &["--json", "inspect", "sms_phone", PHONE])
            .assert_ok()
            .json();
        assert_eq!(json["name"], "sms_phone");
        assert_eq!(json["identity"], PHONE);
        let minute = &json["limits"][0];
        assert_eq!(minute["rate"], "1/1m");
        assert_eq!(minute["limit"], 1);
        assert_eq!(minute["remaining"], 0);
        assert_eq!(minute["allowed"], false);
        let retry = minute["retry_after_ms"].as_u64().unwrap();
        assert!(retry > 50_000 && retry <= 60_000, "retry after {retry} ms");
        let hour = &json["limits"][1];
        assert_eq!(hour["remaining"], 4, "peeks never consume");
        assert_eq!(hour["allowed"], true);
        let key = minute["key"].as_str().unwrap();
        let exists: i64 = server.cmd(&["EXISTS", key]).await;
        assert_eq!(exists, 1, "the reported key holds the state: {key}");
    }

    // An identity the service never saw is full, and inspecting it writes nothing.
    let fresh = on(&server, &["--json", "inspect", "sms_phone", "+33600000000"])
        .assert_ok()
        .json();
    assert_eq!(fresh["limits"][0]["remaining"], 1);
    assert_eq!(fresh["limits"][1]["remaining"], 5);
    assert!(decide(&limiter, "sms_phone", "+33600000000", &sms_limits()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_leases_a_hot_identity_holds() {
    let server = RedisServer::start();
    // A long lease TTL: an identity idle for a fifth of it gives its lease
    // back, and starting the CLI twice on a busy machine can take seconds.
    let limiter = Limiter::builder()
        .backend(RedisBackend::connect(server.url()).await.unwrap())
        .prefix("app")
        .lease_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    // An hourly window, entered well before its end: the lease and the
    // state it is shown with belong to one window, and a window that ends
    // between taking the lease and inspecting it shows a fresh state with
    // no lease (seen once, on a per-minute window).
    let limit = Limit::per_hour(100_000)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .and_then(|l| l.with_lease(1_000))
        .unwrap();
    server.away_from_window_end(Duration::from_secs(3600)).await;
    let spec = ratewall::CallSpec::owned(
        "api_key",
        vec![ratewall::GroupSpec::owned("api_key", vec![limit])],
    );
    // Hot: calls in a tight loop until the limiter holds a lease.
    let started = Instant::now();
    while limiter.leased_units() == 0 {
        assert!(limiter.call(&spec, &[&"key-1"]).await.is_ok());
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no lease taken"
        );
    }
    let json = on(&server, &["--json", "inspect", "api_key", "key-1"])
        .assert_ok()
        .json();
    let state = &json["limits"][0];
    assert_eq!(state["lease"], 1_000);
    let leases = state["leases"].as_array().expect("leases");
    assert!(!leases.is_empty(), "{json}");
    let units = leases[0]["units"].as_u64().unwrap();
    assert!((1..=1_000).contains(&units), "{json}");
    assert!(leases[0]["until_ms"].as_u64() > leases[0]["taken_at_ms"].as_u64());
    let table = on(&server, &["inspect", "api_key", "key-1"]);
    assert!(
        table
            .assert_ok()
            .stdout
            .contains("leases taken by processes"),
        "{}",
        table.stdout
    );
    // Given back: no lease left to show.
    limiter.shutdown().await;
    let json = on(&server, &["--json", "inspect", "api_key", "key-1"])
        .assert_ok()
        .json();
    assert_eq!(json["limits"][0]["leases"], serde_json::json!([]));
}

#[tokio::test]
async fn inspect_escapes_identities_like_the_limiter() {
    let (server, limiter) = deployment().await;
    let hostile = "al{ice}:x%";
    assert!(decide(&limiter, "sms_phone", hostile, &sms_limits()).await);
    let json = on(&server, &["--json", "inspect", "sms_phone", hostile])
        .assert_ok()
        .json();
    assert_eq!(json["limits"][0]["remaining"], 0);
    assert_eq!(json["key"], limiter.key("sms_phone", &hostile).as_str());
}

#[tokio::test]
async fn reset_forgets_the_identity_for_every_limit_of_the_name() {
    let (server, limiter) = deployment().await;
    let before = on(&server, &["--json", "inspect", "sms_phone", PHONE])
        .assert_ok()
        .json();
    assert_eq!(before["limits"][0]["remaining"], 0);
    // (No refused call here: a limiter that saw one keeps refusing in
    // process until its retry_after, whatever another process resets; see
    // `Settings::set_deny_cache`.)

    let run = on(&server, &["reset", "sms_phone", PHONE]);
    run.assert_ok();
    assert!(run.stdout.contains("reset `sms_phone`"), "{}", run.stdout);
    assert!(run.stdout.contains("2 limit(s)"), "{}", run.stdout);

    let json = on(&server, &["--json", "inspect", "sms_phone", PHONE])
        .assert_ok()
        .json();
    assert_eq!(json["limits"][0]["remaining"], 1);
    assert_eq!(json["limits"][1]["remaining"], 5);
    assert!(
        decide(&limiter, "sms_phone", PHONE, &sms_limits()).await,
        "the phone may receive an SMS again"
    );
    // Other names keep their state.
    let ip = on(&server, &["--json", "inspect", "sms_ip", "203.0.113.7"])
        .assert_ok()
        .json();
    assert_eq!(ip["limits"][0]["remaining"], 19);

    let json = on(&server, &["reset", "sms_phone", PHONE, "--json"])
        .assert_ok()
        .json();
    assert_eq!(json["reset"], true);
    for key in json["keys"].as_array().unwrap() {
        let exists: i64 = server.cmd(&["EXISTS", key.as_str().unwrap()]).await;
        assert_eq!(exists, 0, "{key} was deleted");
    }
}

#[tokio::test]
async fn inspect_shows_a_block_unblock_lifts_it_and_reset_lifts_it_too() {
    let server = RedisServer::start();
    // No deny cache: this process decides again after the CLI lifted.
    let limiter = Limiter::builder()
        .backend(RedisBackend::connect(server.url()).await.unwrap())
        .prefix("app")
        .deny_cache(false)
        .build()
        .unwrap();
    // Once an hour, blocked for 2 h once refused.
    let login = [
        Limit::per_hour(1)
            .and_then(|l| l.with_block(Duration::from_secs(7_200)))
            .unwrap(),
        Limit::per_day(100)
            .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
            .unwrap(),
    ];
    assert!(decide(&limiter, "login_user", "alice", &login).await);
    assert!(!decide(&limiter, "login_user", "alice", &login).await);

    let limits = on(&server, &["limits"]);
    limits.assert_ok();
    assert!(limits.stdout.contains("BLOCK"), "{}", limits.stdout);
    assert!(limits.stdout.contains("2h"), "{}", limits.stdout);
    let table = on(&server, &["inspect", "login_user", "alice"]);
    table.assert_ok();
    assert!(table.stdout.contains("BLOCKED"), "{}", table.stdout);
    let json = on(&server, &["--json", "inspect", "login_user", "alice"])
        .assert_ok()
        .json();
    let blocked = json["limits"][0]["blocked_ms"].as_u64().unwrap();
    // (The CLI may have been built since the refusal, on a busy machine.)
    assert!((1..=7_200_000).contains(&blocked), "{json}");
    assert_eq!(json["limits"][0]["block_ms"], 7_200_000);
    // The peek (read just before the blocks) says the same.
    let retry = json["limits"][0]["retry_after_ms"].as_u64().unwrap();
    assert!((blocked..blocked + 1_000).contains(&retry), "{json}");
    assert!(json["limits"][1]["blocked_ms"].is_null(), "{json}");
    assert_eq!(json["blocks"].as_array().unwrap().len(), 1);
    assert_eq!(json["blocks"][0]["suffix"], login[0].storage_suffix());

    let run = on(&server, &["unblock", "login_user", "alice"]);
    run.assert_ok();
    assert!(
        run.stdout
            .contains("lifted the blocks of identity `alice` under `login_user`"),
        "{}",
        run.stdout
    );
    let again = on(&server, &["--json", "unblock", "login_user", "alice"])
        .assert_ok()
        .json();
    assert_eq!(again["lifted"], false);
    assert!(
        on(&server, &["unblock", "login_user", "alice"])
            .assert_ok()
            .stdout
            .contains("was not blocked")
    );
    let json = on(&server, &["--json", "inspect", "login_user", "alice"])
        .assert_ok()
        .json();
    assert!(json["limits"][0]["blocked_ms"].is_null(), "{json}");
    assert!(json["blocks"].as_array().unwrap().is_empty(), "{json}");
    // Lifted, not reset: the hour's state still refuses, so a call is
    // refused and blocks again.
    assert!(!decide(&limiter, "login_user", "alice", &login).await);
    assert!(
        on(&server, &["--json", "inspect", "login_user", "alice"])
            .assert_ok()
            .json()["limits"][0]["blocked_ms"]
            .is_u64()
    );
    // A reset forgets the state and lifts the block.
    on(&server, &["reset", "login_user", "alice"]).assert_ok();
    let exists: i64 = server.cmd(&["EXISTS", "app:{login_user:alice}:b"]).await;
    assert_eq!(exists, 0);
    assert!(decide(&limiter, "login_user", "alice", &login).await);
    assert!(on(&server, &["unblock", "nobody", "alice"]).code == 3);
}

#[tokio::test]
async fn an_unknown_name_exits_3_listing_the_known_ones() {
    let (server, _limiter) = deployment().await;
    on(&server, &["inspect", "sms_phnoe", PHONE]).assert_failed(
        3,
        "unknown limit name `sms_phnoe` under prefix `app`: the registry `app:{limits}` has `sms_ip`, `sms_phone`",
    );
    on(&server, &["reset", "nope", PHONE]).assert_failed(3, "unknown limit name `nope`");
    let url = server.url();
    admin(&[
        "--redis",
        &url,
        "--prefix",
        "other",
        "inspect",
        "sms_phone",
        PHONE,
    ])
    .assert_failed(
        3,
        "the registry `other:{limits}` is empty (no service with this prefix decided a call \
         in the last 7 days); prefixes with a registry in this Redis: `app` (pass one with --prefix)",
    );
    admin(&["--redis", &url, "--prefix", "other", "limits", "--json"])
        .assert_failed(3, "no limits registered under prefix `other`");
}

#[tokio::test]
async fn the_default_prefix_against_the_gateway_exits_3_naming_the_prefix_it_uses() {
    let gateway = common::Service::start(GATEWAY, common::Backend::Redis, &[]);
    let status = gateway
        .http
        .get(gateway.url("/health"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    let redis = gateway.redis();
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.cmd::<i64>(&["EXISTS", "gateway:{limits}"]).await == 0 {
        assert!(Instant::now() < deadline, "the gateway registered no limit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = redis.url();
    for args in [vec!["limits"], vec!["limits", "--json"]] {
        let mut all = vec!["--redis", url.as_str()];
        all.extend(args);
        admin(&all).assert_failed(
            3,
            "no limits registered under prefix `ratewall`: the registry `ratewall:{limits}` is empty (no \
             service with this prefix decided a call in the last 7 days); prefixes with a \
             registry in this Redis: `gateway` (pass one with --prefix)",
        );
    }
    let listed = admin(&["--redis", &url, "--prefix", "gateway", "--json", "limits"])
        .assert_ok()
        .json();
    assert!(!listed["names"].as_array().unwrap().is_empty(), "{listed}");
}

#[tokio::test]
async fn a_redis_without_any_registry_exits_3_and_says_so() {
    let server = RedisServer::start();
    let (): () = server.cmd(&["SET", "unrelated", "x"]).await;
    admin(&["--redis", &server.url(), "limits"]).assert_failed(
        3,
        "no prefix has a registry in this Redis (is it the deployment's Redis?)",
    );
}

#[test]
fn bad_usage_exits_2_with_a_clear_message() {
    admin(&["--redis", "not a url", "limits"]).assert_failed(2, "invalid Redis URL `not a url`");
    admin(&[
        "--redis",
        "redis://:hunter2@127.0.0.1:1/",
        "--prefix",
        "a b",
        "limits",
    ])
    .assert_failed(2, "invalid key prefix \"a b\"");
    let secret = admin(&["--redis", "http://:hunter2@host/", "limits"]);
    secret.assert_failed(2, "invalid Redis URL `http://***@host/`");
    assert!(!secret.stderr.contains("hunter2"), "{}", secret.stderr);
    admin(&["limits"]).assert_failed(2, "no Redis given: pass --redis URL or set REDIS_URL");
    admin(&["--redis", "redis://127.0.0.1:1/", "inspect", "sms_phone"])
        .assert_failed(2, "IDENTITY");
    admin(&[
        "--redis",
        "redis://127.0.0.1:1/",
        "--timeout",
        "soon",
        "limits",
    ])
    .assert_failed(2, "--timeout");
    admin(&["--redis", "redis://127.0.0.1:1/", "frobnicate"]).assert_failed(2, "frobnicate");
}

#[test]
fn redis_down_exits_1_quickly_with_a_clear_message() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}/");
    let started = Instant::now();
    admin(&["--redis", &url, "--timeout", "1s", "limits"])
        .assert_failed(1, &format!("Redis at {url} failed while connecting"));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_stopped_server_exits_1() {
    let (server, _limiter) = deployment().await;
    server.stop();
    on(&server, &["inspect", "sms_phone", PHONE]).assert_failed(1, "failed while connecting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn comma_separated_urls_work_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::connect_cluster(cluster.urls()).await.unwrap();
    let limiter = limiter_on(backend).await;
    for phone in [PHONE, "+33612345678", "+4915112345678"] {
        assert!(decide(&limiter, "sms_phone", phone, &sms_limits()).await);
    }
    let urls = cluster.urls().join(",");
    let listed = admin(&["--redis", &urls, "--prefix", "app", "--json", "limits"])
        .assert_ok()
        .json();
    assert_eq!(listed["names"][0]["name"], "sms_phone");
    for phone in [PHONE, "+33612345678", "+4915112345678"] {
        let state = admin(&[
            "--redis",
            &urls,
            "--prefix",
            "app",
            "--json",
            "inspect",
            "sms_phone",
            phone,
        ])
        .assert_ok()
        .json();
        assert_eq!(state["limits"][0]["remaining"], 0, "{phone}");
    }
    admin(&[
        "--redis",
        &urls,
        "--prefix",
        "app",
        "reset",
        "sms_phone",
        PHONE,
    ])
    .assert_ok();
    assert!(decide(&limiter, "sms_phone", PHONE, &sms_limits()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_deployments_are_reached_through_their_sentinels() {
    let (master, _limiter) = deployment().await;
    let sentinel = RedisSentinel::start(&master);
    // The services' own form: redis+sentinel://sentinels/master-name.
    let url = format!(
        "redis+sentinel://127.0.0.1:{}/{}",
        sentinel.port(),
        sentinel.master_name()
    );
    let state = admin(&[
        "--redis",
        &url,
        "--prefix",
        "app",
        "--json",
        "inspect",
        "sms_phone",
        PHONE,
    ]);
    assert_eq!(state.assert_ok().json()["limits"][0]["remaining"], 0);
    // The old flag says how to write it now.
    admin(&[
        "--redis",
        &sentinel.url(),
        "--sentinel",
        sentinel.master_name(),
        "--prefix",
        "app",
        "limits",
    ])
    .assert_failed(
        2,
        "--sentinel is replaced by the sentinel URL form of --redis, the one the services \
         read: --redis redis+sentinel://host:26379[,host:26379...]/mymaster",
    );
}

#[tokio::test]
async fn deny_lists_and_unlist_change_what_every_instance_decides() {
    let (server, _limiter) = deployment().await;
    // Another instance, reading the shared lists every 100 ms.
    let instance = Limiter::builder()
        .backend(RedisBackend::connect(server.url()).await.unwrap())
        .prefix("app")
        .lists_refresh(Duration::from_millis(100))
        .build()
        .unwrap();
    let run = on(
        &server,
        &[
            "deny",
            PHONE,
            "--name",
            "sms_phone",
            "--for",
            "1h",
            "--json",
        ],
    );
    run.assert_ok();
    let json = run.json();
    assert_eq!(json["entries"][0]["list"], "deny");
    assert_eq!(json["entries"][0]["name"], "sms_phone");
    assert_eq!(json["entries"][0]["identity"], PHONE);
    assert!(json["entries"][0]["expires_at_ms"].as_u64().is_some());
    assert!(
        json["changed"]
            .as_str()
            .unwrap()
            .starts_with("deny `+8613800000000` for `sms_phone`")
    );

    let started = Instant::now();
    loop {
        // A call that reaches Redis reads the lists again when due.
        assert!(decide(&instance, "sms_ip", "198.51.100.1", &ip_limits()).await);
        let key = instance.key("sms_phone", &PHONE);
        let limits = sms_limits();
        let requests: Vec<Request<'_>> = limits.iter().map(|l| Request::new(&key, l, 1)).collect();
        if instance
            .requests()
            .check("sms_phone", &requests, None)
            .await
            .is_err_and(|r| r.is_denied())
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the deny never applied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let table = on(&server, &["lists"]);
    table.assert_ok();
    assert!(
        table.stdout.contains("deny") && table.stdout.contains(PHONE),
        "{}",
        table.stdout
    );
    on(&server, &["unlist", PHONE, "--name", "sms_phone"]).assert_ok();
    let empty = on(&server, &["lists"]);
    empty.assert_ok();
    assert!(
        empty
            .stdout
            .contains("no allow or deny entries under prefix `app`"),
        "{}",
        empty.stdout
    );
    on(&server, &["deny", PHONE, "--for", "soon"]).assert_failed(2, "cannot parse duration");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_calls_in_flight_of_a_concurrency_limit() {
    let server = RedisServer::start();
    let limiter = limiter_on(RedisBackend::connect(server.url()).await.unwrap()).await;
    let exports = ratewall::CallSpec::owned(
        "export",
        vec![ratewall::GroupSpec::owned(
            "exports",
            vec![Limit::per_hour(100).unwrap(), Limit::in_flight(4).unwrap()],
        )],
    );
    let mut running = Vec::new();
    for _ in 0..3 {
        running.push(limiter.call(&exports, &[&"acme"]).await.expect("a slot"));
    }

    let run = on(&server, &["inspect", "exports", "acme"]);
    run.assert_ok();
    assert!(
        run.stdout.contains("in flight now: 3 of 4"),
        "{}",
        run.stdout
    );
    let json = on(&server, &["--json", "inspect", "exports", "acme"])
        .assert_ok()
        .json();
    let slots = &json["limits"][1];
    assert_eq!(slots["algorithm"], "in_flight");
    assert_eq!(slots["rate"], "max_in_flight=4");
    assert_eq!(slots["in_flight"], 3);
    assert_eq!(slots["remaining"], 1);
    assert!(json["limits"][0].get("in_flight").is_none());
    let limits = on(&server, &["limits"]).assert_ok().stdout.clone();
    assert!(limits.contains("max_in_flight=4"), "{limits}");

    drop(running);
    limiter.flush_in_flight().await;
    let json = on(&server, &["--json", "inspect", "exports", "acme"])
        .assert_ok()
        .json();
    assert_eq!(json["limits"][1]["in_flight"], 0);
    assert_eq!(json["limits"][0]["remaining"], 97, "rate units stay taken");
}
