//! Allow and deny lists shared through Redis by every instance of one key
//! prefix: a change made on one instance is honoured by another within its
//! refresh period, even one that only sees deny-listed identities, and a
//! denied call is decided without Redis.

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

/// The call every test here makes: one phone number, far below its limit.
fn sms() -> CallSpec {
    CallSpec::owned(
        "sms",
        vec![GroupSpec::owned(
            "sms_phone",
            vec![Limit::per_hour(1_000).unwrap()],
        )],
    )
}

#[tokio::test]
async fn a_list_change_on_one_instance_is_honoured_by_another_within_the_refresh_period() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let sms = sms();
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

    // Denied calls are decided in process: the only scripts they run are
    // the lists' reads, at most one per refresh period.
    let before = decision_calls(&server).await;
    let started = Instant::now();
    for _ in 0..100 {
        assert!(
            b.call(&sms, &[&"+33600000001"])
                .await
                .unwrap_err()
                .is_denied()
        );
    }
    let periods = (started.elapsed().as_micros() / REFRESH.as_micros()) as u64 + 1;
    let ran = decision_calls(&server).await - before;
    assert!(
        ran <= periods,
        "{ran} scripts ran for 100 denied calls over {periods} refresh period(s)"
    );

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
    let sms = sms();
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

#[tokio::test]
async fn an_instance_that_only_sees_denied_calls_honours_an_unlist_within_the_refresh_period() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let sms = sms();
    a.settings()
        .deny(Some("sms_phone"), &"+33600000003", None)
        .await
        .unwrap();
    // B learns of the entry, then sees only that phone's (denied) calls.
    until_seen(&b, &sms, "+33600000003", true).await;
    for _ in 0..20 {
        assert!(
            b.call(&sms, &[&"+33600000003"])
                .await
                .unwrap_err()
                .is_denied()
        );
    }
    assert!(
        a.settings()
            .unlist(Some("sms_phone"), &"+33600000003")
            .await
            .unwrap()
    );
    let started = Instant::now();
    loop {
        match b.call(&sms, &[&"+33600000003"]).await {
            Ok(_) => break,
            Err(refused) => assert!(refused.is_denied(), "{refused}"),
        }
        // The refresh period, plus a margin a busy machine keeps.
        assert!(
            started.elapsed() < REFRESH + Duration::from_secs(1),
            "the unlist was not seen within {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "unlist seen by an instance fed only denied calls after {:?}",
        started.elapsed()
    );
}
