//! Allow and deny lists shared through Redis by every instance of one key
//! prefix: a change made on one instance is honoured by another within its
//! refresh period, and a denied call reaches Redis not at all.

use std::time::{Duration, Instant, SystemTime};

use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;

const REFRESH: Duration = Duration::from_millis(200);

async fn instance(server: &RedisServer) -> Limiter {
    Limiter::builder()
        .backend(RedisBackend::connect(server.url()).await.expect("connect"))
        .prefix("shared")
        .lists_refresh(REFRESH)
        .build()
        .expect("limiter")
}

/// Calls of the decision scripts or functions in `INFO commandstats`.
async fn decision_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]).await;
    info.lines()
        .filter(|l| {
            ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"]
                .iter()
                .any(|n| l.starts_with(n))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// How long until `b` sees `phone` as `denied` (calling another phone in
/// between, so its calls reach Redis and its lists are read again).
async fn until_seen(b: &Limiter, spec: &CallSpec, phone: &str, denied: bool) -> Duration {
    let started = Instant::now();
    loop {
        let _ = b.call(spec, &[&"+33600000999"]).await;
        let result = b.call(spec, &[&phone]).await;
        if result.as_ref().err().is_some_and(|r| r.is_denied()) == denied {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(5), "never seen");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_list_change_on_one_instance_is_honoured_by_another_within_the_refresh_period() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let sms = CallSpec::owned(
        "sms",
        vec![GroupSpec::owned(
            "sms_phone",
            vec![Limit::per_hour(1_000).unwrap()],
        )],
    );
    assert!(b.call(&sms, &[&"+33600000001"]).await.is_ok());

    a.settings()
        .deny(Some("sms_phone"), &"+33600000001", None)
        .await
        .unwrap();
    assert!(
        a.call(&sms, &[&"+33600000001"])
            .await
            .unwrap_err()
            .is_denied(),
        "at once on A"
    );
    let seen = until_seen(&b, &sms, "+33600000001", true).await;
    eprintln!("deny seen by the other instance after {seen:?}");
    assert!(seen <= REFRESH + Duration::from_millis(300), "{seen:?}");

    // Denied calls never reach Redis.
    let before = decision_calls(&server).await;
    for _ in 0..100 {
        assert!(
            b.call(&sms, &[&"+33600000001"])
                .await
                .unwrap_err()
                .is_denied()
        );
    }
    assert_eq!(decision_calls(&server).await, before);

    assert!(
        a.settings()
            .unlist(Some("sms_phone"), &"+33600000001")
            .await
            .unwrap()
    );
    let seen = until_seen(&b, &sms, "+33600000001", false).await;
    eprintln!("unlist seen by the other instance after {seen:?}");
    assert!(seen <= REFRESH + Duration::from_millis(300), "{seen:?}");
}

#[tokio::test]
async fn a_shared_entry_that_expired_no_longer_applies_anywhere() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let sms = CallSpec::owned(
        "sms",
        vec![GroupSpec::owned(
            "sms_phone",
            vec![Limit::per_hour(1_000).unwrap()],
        )],
    );
    let until = SystemTime::now() + Duration::from_millis(600);
    a.settings()
        .deny(None, &"+33600000002", Some(until))
        .await
        .unwrap();
    until_seen(&b, &sms, "+33600000002", true).await;
    let refused = b.call(&sms, &[&"+33600000002"]).await.unwrap_err();
    assert!(
        refused
            .retry_after()
            .is_some_and(|w| w <= Duration::from_millis(600))
    );
    tokio::time::sleep(Duration::from_millis(650)).await;
    assert!(b.call(&sms, &[&"+33600000002"]).await.is_ok());
    assert!(a.call(&sms, &[&"+33600000002"]).await.is_ok());
    let entries = b.settings().list_entries();
    assert!(
        entries
            .iter()
            .all(|e| e.expires_at.is_some_and(|at| at <= SystemTime::now())),
        "{entries:?}"
    );
}
