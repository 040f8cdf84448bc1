//! Allow and deny lists, through the limiter: a deny-listed identity is
//! refused without a backend call, with its own reason; entries apply per
//! limit name or to every name, expire, and come from a limits file too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ratewall::{
    CallSpec, GroupSpec, Limit, Limiter, RejectionReason,
    backend::{Backend, BoxFuture, Decisions, MemoryBackend, Request},
    error::BackendError,
};

/// The in-memory backend, counting the calls that reach it.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryBackend,
    calls: AtomicU64,
}

impl Backend for Counting {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(requests)
    }

    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.peek(requests)
    }

    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.refund(requests, at_micros)
    }

    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.reset(requests)
    }
}

fn sms() -> CallSpec {
    CallSpec::owned(
        "send",
        vec![
            GroupSpec::owned("sms_phone", vec![Limit::per_hour(5).unwrap()]),
            GroupSpec::owned("sms_ip", vec![Limit::per_hour(20).unwrap()]),
        ],
    )
}

#[tokio::test]
async fn a_deny_listed_identity_is_refused_without_any_backend_call() {
    let backend = Arc::new(Counting::default());
    let limiter = Limiter::builder()
        .shared_backend(backend.clone())
        .build()
        .unwrap();
    let spec = sms();
    assert!(
        limiter
            .call(&spec, &[&"+33600000001", &"10.0.0.1"])
            .await
            .is_ok()
    );
    let before = backend.calls.load(Ordering::SeqCst);
    limiter
        .settings()
        .deny(Some("sms_phone"), &"+33600000001", None)
        .await
        .unwrap();
    for _ in 0..1_000 {
        let refused = limiter
            .call(&spec, &[&"+33600000001", &"10.0.0.1"])
            .await
            .unwrap_err();
        assert!(refused.is_denied(), "{refused}");
        assert_eq!(refused.name(), "sms_phone");
        assert_eq!(refused.retry_after(), None, "no expiry, no Retry-After");
    }
    assert_eq!(
        backend.calls.load(Ordering::SeqCst),
        before,
        "0 backend calls"
    );
    // The same IP with another phone is not denied, and other names are not.
    assert!(
        limiter
            .call(&spec, &[&"+33600000002", &"10.0.0.1"])
            .await
            .is_ok()
    );
    assert!(
        limiter
            .settings()
            .unlist(Some("sms_phone"), &"+33600000001")
            .await
            .unwrap()
    );
    assert!(
        !limiter
            .settings()
            .unlist(Some("sms_phone"), &"+33600000001")
            .await
            .unwrap()
    );
    assert!(
        limiter
            .call(&spec, &[&"+33600000001", &"10.0.0.1"])
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn an_entry_for_every_name_applies_to_every_group_and_expires() {
    let limiter = Limiter::builder().memory().build().unwrap();
    let spec = sms();
    let until = SystemTime::now() + Duration::from_millis(300);
    limiter
        .settings()
        .deny(None, &"10.6.6.6", Some(until))
        .await
        .unwrap();
    let refused = limiter
        .call(&spec, &[&"+33600000003", &"10.6.6.6"])
        .await
        .unwrap_err();
    assert!(matches!(
        refused.reason(),
        RejectionReason::Denied { until: Some(_) }
    ));
    assert_eq!(
        refused.name(),
        "sms_ip",
        "named after the group whose identity is listed"
    );
    let wait = refused
        .retry_after()
        .expect("an expiring entry says how long");
    assert!(
        wait <= Duration::from_millis(300) && wait > Duration::ZERO,
        "{wait:?}"
    );
    tokio::time::sleep(wait + Duration::from_millis(20)).await;
    assert!(
        limiter
            .call(&spec, &[&"+33600000003", &"10.6.6.6"])
            .await
            .is_ok(),
        "expired"
    );
    let entries = limiter.settings().list_entries();
    assert!(entries.is_empty() || entries.iter().all(|e| e.expires_at.is_some()));
}

#[tokio::test]
async fn a_deny_listed_identity_is_refused_by_the_raw_api_too() {
    let limiter = Limiter::builder().memory().build().unwrap();
    limiter.settings().deny(None, &"bob", None).await.unwrap();
    let key = limiter.key("anything", &"bob");
    let limit = Limit::per_minute(1).unwrap();
    let error = limiter
        .requests()
        .acquire(&key, &limit, 1)
        .await
        .unwrap_err();
    assert!(matches!(error, ratewall::Error::Denied(_)), "{error}");
}

#[cfg(feature = "config")]
#[tokio::test]
async fn lists_come_from_a_limits_file_and_a_reload_removes_what_it_no_longer_lists() {
    use ratewall::{config::LimitsFile, lists::ListKind};
    let first = LimitsFile::parse(
        r#"
        [lists]
        deny = ["10.6.6.6"]
        [lists.sms_phone]
        deny = ["+33 6 00"]
        "#,
    )
    .unwrap();
    let limiter = Limiter::builder().memory().build().unwrap();
    first.apply(&limiter).unwrap();
    let entries = limiter.settings().list_entries();
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| e.kind == ListKind::Deny));
    let spec = sms();
    assert!(
        limiter
            .call(&spec, &[&"+33 6 00", &"10.0.0.1"])
            .await
            .unwrap_err()
            .is_denied()
    );
    let second = LimitsFile::parse("[lists]\ndeny = [\"10.6.6.6\"]").unwrap();
    second.apply_over(&first, &limiter).unwrap();
    assert_eq!(limiter.settings().list_entries().len(), 1);
    assert!(
        limiter
            .call(&spec, &[&"+33 6 00", &"10.0.0.1"])
            .await
            .is_ok()
    );
    let bad = LimitsFile::parse("[lists]\nblock = [\"x\"]").unwrap_err();
    assert!(bad.to_string().contains("unknown key `block`"), "{bad}");
    let both = LimitsFile::parse("[lists.sms]\nallow = [\"x\"]\ndeny = [\"x\"]").unwrap_err();
    assert!(
        both.to_string().contains("allow list and the deny list"),
        "{both}"
    );
}

#[tokio::test]
async fn a_number_and_its_text_are_one_listed_identity() {
    let limiter = Limiter::builder().memory().build().unwrap();
    let spec = CallSpec::owned(
        "user",
        vec![GroupSpec::owned("user", vec![Limit::per_hour(5).unwrap()])],
    );
    limiter.settings().deny(None, &42u64, None).await.unwrap();
    assert!(
        limiter
            .call(&spec, &[&42u64])
            .await
            .unwrap_err()
            .is_denied()
    );
    assert!(limiter.call(&spec, &[&"42"]).await.unwrap_err().is_denied());
    assert!(
        limiter.call(&spec, &[&"042"]).await.is_ok(),
        "another identity"
    );
}

#[tokio::test]
async fn an_allow_listed_identity_bypasses_its_limit_but_not_the_others() {
    let backend = Arc::new(Counting::default());
    let limiter = Limiter::builder()
        .shared_backend(backend.clone())
        .build()
        .unwrap();
    let spec = CallSpec::owned(
        "send",
        vec![
            GroupSpec::owned("sms_phone", vec![Limit::per_hour(1).unwrap()]),
            GroupSpec::owned("sms_ip", vec![Limit::per_hour(3).unwrap()]),
        ],
    )
    .with_counting(ratewall::call::Counting::Settled);
    limiter
        .settings()
        .allow(Some("sms_phone"), &"+15550100", None)
        .await
        .unwrap();
    // The phone's limit (1/h) no longer applies; the IP's (3/h) still does.
    for _ in 0..3 {
        let permit = limiter
            .call(&spec, &[&"+15550100", &"10.0.0.1"])
            .await
            .unwrap();
        let (name, decision, _) = permit.binding().unwrap();
        assert_eq!(name, "sms_ip", "only the IP was decided");
        assert_eq!(decision.limit(), 3);
        permit.settle(true).await;
    }
    let refused = limiter
        .call(&spec, &[&"+15550100", &"10.0.0.1"])
        .await
        .unwrap_err();
    assert_eq!(refused.name(), "sms_ip");
    // A settled call that did not count gives back the IP's unit only.
    let permit = limiter
        .call(&spec, &[&"+15550100", &"10.0.0.2"])
        .await
        .unwrap();
    permit.settle(false).await;
    for _ in 0..3 {
        let permit = limiter
            .call(&spec, &[&"+15550100", &"10.0.0.2"])
            .await
            .unwrap();
        permit.settle(true).await;
    }
    assert!(
        limiter
            .call(&spec, &[&"+15550100", &"10.0.0.2"])
            .await
            .is_err(),
        "3 of 3 kept"
    );

    // Allow-listed everywhere: admitted without a decision, without the backend.
    limiter
        .settings()
        .allow(None, &"10.0.0.1", None)
        .await
        .unwrap();
    let before = backend.calls.load(Ordering::SeqCst);
    for _ in 0..10 {
        let permit = limiter
            .call(&spec, &[&"+15550100", &"10.0.0.1"])
            .await
            .unwrap();
        assert!(matches!(
            permit.admission(),
            ratewall::call::Admission::AllowListed
        ));
        assert!(permit.binding().is_none());
        permit.settle(false).await;
    }
    assert_eq!(
        backend.calls.load(Ordering::SeqCst),
        before,
        "no backend call"
    );
    // Another phone from that IP is decided for its own limit.
    assert!(
        limiter
            .call(&spec, &[&"+15550101", &"10.0.0.1"])
            .await
            .is_ok()
    );
    assert!(
        limiter
            .call(&spec, &[&"+15550101", &"10.0.0.1"])
            .await
            .is_err()
    );
    // The raw API honours the lists too.
    let key = limiter.key("sms_ip", &"10.0.0.1");
    let limit = Limit::per_hour(3).unwrap();
    let admitted = limiter
        .requests()
        .check("sms_ip", &[Request::new(&key, &limit, 1)], None)
        .await
        .unwrap();
    assert!(matches!(admitted, ratewall::call::Admission::AllowListed));
}
