//! The limits registry on a real Redis and Redis Cluster: a limiter's first
//! decision per limit name publishes the name's limits to
//! `<prefix>:{limits}`, with a TTL, readable back by operators' tools.

use std::sync::Arc;
use std::time::Duration;

use ratewall::{Algorithm, Limit, Limiter, Rejection, backend::Request, rate_limit};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::{RedisCluster, RedisSentinel, RedisServer};
use serde_json::Value;

const SEVEN_DAYS_MS: i64 = 7 * 86_400 * 1_000;

fn otp_limits() -> Vec<Limit> {
    vec![
        Limit::per_minute(1)
            .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
            .unwrap(),
        Limit::per_hour(5).and_then(|l| l.with_burst(2)).unwrap(),
    ]
}

async fn limiter_on(server: &RedisServer) -> (Limiter, Arc<RedisBackend>) {
    let backend = Arc::new(RedisBackend::connect(server.url()).await.expect("connect"));
    let limiter = Limiter::builder()
        .shared_backend(backend.clone())
        .prefix("app")
        .build()
        .expect("limiter");
    (limiter, backend)
}

/// One decision through [`Limiter::check`], as the macro makes it.
async fn decide(limiter: &Limiter, name: &'static str, identity: &str, limits: &[Limit]) -> bool {
    let key = limiter.key(name, &identity);
    let requests: Vec<Request<'_>> = limits.iter().map(|l| Request::new(&key, l, 1)).collect();
    limiter
        .requests()
        .check(name, &requests, None)
        .await
        .is_ok()
}

#[tokio::test]
async fn a_limiters_first_decision_publishes_the_names_limits_with_a_ttl() {
    let server = RedisServer::start();
    let (limiter, backend) = limiter_on(&server).await;
    let limits = otp_limits();
    assert!(decide(&limiter, "otp", "+33612345678", &limits).await);

    let value: String = server.cmd(&["HGET", "app:{limits}", "otp"]).await;
    let value: Value = serde_json::from_str(&value).expect("the registry value is JSON");
    assert_eq!(value["v"], 1);
    let described = value["limits"].as_array().expect("limits");
    assert_eq!(described.len(), 2);
    assert_eq!(described[0]["rate"], "1/1m");
    assert_eq!(described[0]["algorithm"], "sliding_log");
    assert_eq!(described[0]["threshold"], 1);
    assert_eq!(described[0]["period_us"], 60_000_000);
    assert_eq!(described[0]["suffix"], limits[0].storage_suffix());
    assert_eq!(described[1]["rate"], "5/1h");
    assert_eq!(described[1]["algorithm"], "gcra");
    assert_eq!(described[1]["burst"], 2);
    assert_eq!(described[1]["suffix"], limits[1].storage_suffix());

    let ttl: i64 = server.cmd(&["PTTL", "app:{limits}"]).await;
    assert!(
        ttl > SEVEN_DAYS_MS - 60_000 && ttl <= SEVEN_DAYS_MS,
        "registry TTL {ttl} ms"
    );

    let registered = backend.registered_limits("app").await.expect("read");
    assert_eq!(registered.len(), 1);
    assert_eq!(registered[0].name, "otp");
    assert_eq!(registered[0].limits, limits);
    let age = registered[0].published_at.elapsed().unwrap_or_default();
    assert!(age < Duration::from_secs(60), "published {age:?} ago");
    assert_eq!(
        backend.registered("app", "otp").await.expect("read"),
        Some(registered[0].clone())
    );
    assert_eq!(backend.registered("app", "nope").await.expect("read"), None);
    assert!(
        backend
            .registered_limits("other")
            .await
            .expect("read")
            .is_empty()
    );
}

#[tokio::test]
async fn the_storage_suffix_in_the_registry_finds_the_identitys_state() {
    let server = RedisServer::start();
    let (limiter, backend) = limiter_on(&server).await;
    assert!(decide(&limiter, "otp", "alice", &otp_limits()).await);
    let registered = backend.registered("app", "otp").await.unwrap().unwrap();
    for limit in &registered.limits {
        let key = format!(
            "{}:{}",
            limiter.key("otp", &"alice"),
            limit.storage_suffix()
        );
        let exists: i64 = server.cmd(&["EXISTS", &key]).await;
        assert_eq!(exists, 1, "{key}");
    }
}

#[tokio::test]
async fn every_key_written_including_the_registry_has_a_ttl() {
    let server = RedisServer::start();
    let (limiter, _backend) = limiter_on(&server).await;
    for identity in ["a", "b", "c"] {
        decide(&limiter, "otp", identity, &otp_limits()).await;
    }
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]).await;
    assert!(keys.contains(&"app:{limits}".to_owned()), "{keys:?}");
    for key in keys {
        let ttl: i64 = server.cmd(&["PTTL", &key]).await;
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}

#[tokio::test]
async fn set_limits_is_published_on_the_next_decision() {
    let server = RedisServer::start();
    let (limiter, backend) = limiter_on(&server).await;
    assert!(decide(&limiter, "otp", "alice", &otp_limits()).await);
    let stricter = vec![Limit::per_minute(2).unwrap()];
    limiter
        .settings()
        .set_limits("otp", stricter.clone())
        .unwrap();
    // The macro resolves the runtime limits; `check` is given them directly.
    decide(&limiter, "otp", "alice", &stricter).await;
    let registered = backend.registered("app", "otp").await.unwrap().unwrap();
    assert_eq!(registered.limits, stricter);
}

#[rate_limit(
    name = "reg_phone",
    key = phone,
    limits = ["1/1m", "10/1d"],
    algorithm = sliding_log,
    also(name = "reg_ip", key = ip, limits = ["20/1h"], algorithm = fixed_window),
    limiter = limiter
)]
async fn send_code(limiter: &Limiter, phone: &str, ip: &str) -> Result<(), Rejection> {
    let _ = (phone, ip);
    Ok(())
}

#[tokio::test]
async fn every_group_of_an_annotated_function_is_registered_under_its_own_name() {
    let server = RedisServer::start();
    let (limiter, backend) = limiter_on(&server).await;
    send_code(&limiter, "+33612345678", "203.0.113.7")
        .await
        .expect("first call allowed");
    let registered = backend.registered_limits("app").await.unwrap();
    let names: Vec<&str> = registered.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["reg_ip", "reg_phone"]);
    let rates: Vec<String> = registered[1].limits.iter().map(Limit::to_string).collect();
    assert_eq!(rates, ["1/1m (sliding_log)", "10/1d (sliding_log)"]);
    assert_eq!(registered[0].limits[0].algorithm(), Algorithm::FixedWindow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_is_one_key_with_a_ttl_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = Arc::new(
        RedisBackend::connect_cluster(cluster.urls())
            .await
            .expect("connect"),
    );
    let limiter = Limiter::builder()
        .shared_backend(backend.clone())
        .prefix("app")
        .build()
        .unwrap();
    let limits = otp_limits();
    for identity in ["a", "b", "c", "d", "e", "f"] {
        assert!(decide(&limiter, "otp", identity, &limits).await);
    }
    let registered = backend.registered_limits("app").await.expect("read");
    assert_eq!(registered.len(), 1);
    assert_eq!(registered[0].limits, limits);

    let mut connection = cluster.async_connection().await;
    let ttl: i64 = redis::cmd("PTTL")
        .arg("app:{limits}")
        .query_async(&mut connection)
        .await
        .expect("PTTL");
    assert!(ttl > 0 && ttl <= SEVEN_DAYS_MS, "registry TTL {ttl} ms");
    let slot: u16 = cluster.masters()[0]
        .cmd(&["CLUSTER", "KEYSLOT", "app:{limits}"])
        .await;
    let tag_slot: u16 = cluster.masters()[0]
        .cmd(&["CLUSTER", "KEYSLOT", "limits"])
        .await;
    assert_eq!(slot, tag_slot, "the registry key hashes on its own tag");
}

/// Calls of `command` the server counted.
async fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats: String = server.cmd(&["INFO", "commandstats"]).await;
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn every_prefix_with_a_registry_is_found_with_scan_among_other_keys() {
    let server = RedisServer::start();
    let backend = Arc::new(RedisBackend::connect(server.url()).await.expect("connect"));
    assert_eq!(
        backend.registered_prefixes().await.expect("scan"),
        Vec::<String>::new()
    );
    for prefix in ["gateway", "app", "team:a"] {
        let limiter = Limiter::builder()
            .shared_backend(backend.clone())
            .prefix(prefix)
            .build()
            .unwrap();
        assert!(decide(&limiter, "otp", "+33612345678", &otp_limits()).await);
    }
    // Several SCAN pages of other keys, and a key that looks like a
    // registry but is not a hash.
    let (): () = server
        .cmd(&[
            "EVAL",
            "for i = 1, 3000 do redis.call('SET', 'filler:' .. i, 'x') end",
            "0",
        ])
        .await;
    let (): () = server.cmd(&["SET", "decoy:{limits}", "x"]).await;
    let keys_before = calls(&server, "keys").await;
    let prefixes = backend.registered_prefixes().await.expect("scan");
    assert_eq!(prefixes, ["app", "gateway", "team:a"]);
    assert!(calls(&server, "scan").await >= 3, "several SCAN pages");
    assert_eq!(calls(&server, "keys").await, keys_before, "never KEYS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_prefix_with_a_registry_is_found_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = Arc::new(
        RedisBackend::connect_cluster(cluster.urls())
            .await
            .expect("connect"),
    );
    for prefix in ["other", "app"] {
        let limiter = Limiter::builder()
            .shared_backend(backend.clone())
            .prefix(prefix)
            .build()
            .unwrap();
        assert!(decide(&limiter, "otp", "a", &otp_limits()).await);
    }
    // Every time: the master of the `{limits}` slot is scanned, not
    // whichever node a command naming no key would go to.
    for _ in 0..3 {
        let prefixes = backend.registered_prefixes().await.expect("scan");
        assert_eq!(prefixes, ["app", "other"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_is_written_to_the_master_named_by_the_sentinels() {
    let master = RedisServer::start();
    let sentinel = RedisSentinel::start(&master);
    let backend = Arc::new(
        RedisBackend::connect_sentinel([sentinel.url()], sentinel.master_name())
            .await
            .expect("connect"),
    );
    let limiter = Limiter::builder()
        .shared_backend(backend.clone())
        .prefix("app")
        .build()
        .unwrap();
    assert!(decide(&limiter, "otp", "alice", &otp_limits()).await);
    let registered = backend.registered_limits("app").await.expect("read");
    assert_eq!(registered.len(), 1);
    assert_eq!(registered[0].limits, otp_limits());
    let ttl: i64 = master.cmd(&["PTTL", "app:{limits}"]).await;
    assert!(ttl > 0 && ttl <= SEVEN_DAYS_MS, "registry TTL {ttl} ms");
}
