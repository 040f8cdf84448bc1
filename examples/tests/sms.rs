//! The SMS service over HTTP, on the in-memory backend and on Redis.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{BACKENDS, Backend, Service, json};
use futures::future::join_all;
use ratewall_tests::RedisServer;
use serde_json::json;

const SMS: &str = env!("CARGO_BIN_EXE_sms");
const TOKEN: &str = "s3cret";

fn start(backend: Backend, env: &[(&str, &str)]) -> Service {
    let mut all = vec![("ADMIN_TOKEN", TOKEN)];
    all.extend_from_slice(env);
    Service::start(SMS, backend, &all)
}

async fn send(service: &Service, phone: &str) -> reqwest::Response {
    service
        .post_json("/sms/send", json!({ "phone": phone }))
        .await
}

#[tokio::test]
async fn one_sms_per_minute_then_429_with_retry_after_and_ietf_fields() {
    for backend in BACKENDS {
        let service = start(backend, &[]);
        let first = send(&service, "+8613800000000").await;
        assert_eq!(first.status(), 200, "{backend:?}");
        let policy = first.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(policy.starts_with("\"sms_phone\";q="), "{policy}");
        assert!(first.headers().contains_key("ratelimit"));
        assert_eq!(json(first).await, json!({ "sent": true }));

        let second = send(&service, "+8613800000000").await;
        assert_eq!(second.status(), 429, "{backend:?}");
        let retry_after: u64 = second.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (59..=60).contains(&retry_after),
            "Retry-After {retry_after}"
        );
        assert_eq!(
            second.headers()["ratelimit-policy"],
            "\"sms_phone\";q=1;w=60"
        );
        assert_eq!(
            second.headers()["ratelimit"].to_str().unwrap(),
            format!("\"sms_phone\";r=0;t={retry_after}")
        );
        let body = json(second).await;
        assert_eq!(body["error"], "rate_limited");
        let retry_ms = body["retry_after_ms"].as_u64().unwrap();
        assert!(retry_ms > 58_000 && retry_ms <= 60_000, "{retry_ms}");

        assert_eq!(
            send(&service, "+8613900000000").await.status(),
            200,
            "another phone is independent"
        );
    }
}

#[tokio::test]
async fn two_hundred_concurrent_sends_for_one_phone_yield_exactly_one_200() {
    for backend in BACKENDS {
        let service = start(backend, &[("SMS_IP_LIMITS", "1000/1h")]);
        let statuses: Vec<u16> = join_all((0..200).map(|_| send(&service, "+4915112345678")))
            .await
            .iter()
            .map(|r| r.status().as_u16())
            .collect();
        assert_eq!(
            statuses.iter().filter(|&&s| s == 200).count(),
            1,
            "{backend:?}"
        );
        assert_eq!(
            statuses.iter().filter(|&&s| s == 429).count(),
            199,
            "{backend:?}"
        );
    }
}

#[tokio::test]
async fn malformed_bodies_and_invalid_phones_get_400_with_the_reason_and_consume_nothing() {
    for backend in BACKENDS {
        let service = start(backend, &[("SMS_IP_LIMITS", "1/1h")]);
        for body in [
            "{",
            "[]",
            "{\"phone\": 8613800000000}",
            "{\"number\": \"+8613800000000\"}",
        ] {
            let response = service.post_raw("/sms/send", body).await;
            assert_eq!(response.status(), 400, "{body}");
            assert!(json(response).await["error"].is_string());
        }
        for (phone, reason) in [
            ("8613800000000", "international form"),
            ("+00000000", "unknown country calling code"),
            ("+999123456789", "unknown country calling code"),
            ("+8612345", "too few digits"),
            ("+123", "not a valid phone number for calling code +1"),
            ("+1234567890123456", "not a valid phone number"),
            ("+3361234567801", "not a valid phone number for region FR"),
            (
                "+15550000001",
                "not a valid phone number for calling code +1",
            ),
            ("+86abc00000000", "not a phone number"),
            ("+8613800000000 x12", "extension"),
        ] {
            let response = send(&service, phone).await;
            assert_eq!(response.status(), 400, "{phone}");
            let body = json(response).await;
            assert_eq!(body["error"], "bad_phone");
            let message = body["message"].as_str().unwrap();
            assert!(message.contains(reason), "{phone}: {message}");
        }
        let admin = service
            .http
            .get(service.url("/admin/limits/+00000000"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(admin.status(), 400, "admin routes validate too");
        // Neither the phone nor the single per-IP unit was consumed.
        assert_eq!(
            send(&service, "+8613800000000").await.status(),
            200,
            "{backend:?}"
        );
    }
}

#[tokio::test]
async fn the_per_ip_limit_refuses_without_consuming_the_phone_limits() {
    for backend in BACKENDS {
        let service = start(backend, &[("SMS_IP_LIMITS", "2/1h")]);
        assert_eq!(send(&service, "+33612345671").await.status(), 200);
        assert_eq!(send(&service, "+33612345672").await.status(), 200);
        let refused = send(&service, "+33612345673").await;
        assert_eq!(refused.status(), 429, "{backend:?}");
        assert_eq!(
            refused.headers()["ratelimit-policy"],
            "\"sms_ip\";q=2;w=3600"
        );
        // The refused phone's minute limit is untouched: all-or-nothing.
        let state = service
            .http
            .get(service.url("/admin/limits/+33612345673"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        let state = json(state).await;
        let remaining: Vec<u64> = state["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["remaining"].as_u64().unwrap())
            .collect();
        assert_eq!(remaining, [1, 5, 10], "{backend:?}");
    }
}

#[tokio::test]
async fn admin_shows_and_resets_a_phone_behind_a_bearer_token() {
    for backend in BACKENDS {
        let service = start(backend, &[]);
        let phone = "+447911123456";
        assert_eq!(send(&service, phone).await.status(), 200);
        assert_eq!(send(&service, phone).await.status(), 429);

        let path = format!("/admin/limits/{phone}");
        let anonymous = service.http.get(service.url(&path)).send().await.unwrap();
        assert_eq!(anonymous.status(), 401);
        let wrong = service
            .http
            .get(service.url(&path))
            .bearer_auth("guess")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401);

        let shown = json(
            service
                .http
                .get(service.url(&path))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap(),
        )
        .await;
        let limits = shown["limits"].as_array().unwrap();
        assert_eq!(limits.len(), 3);
        assert_eq!(
            (
                limits[0]["rate"].as_str().unwrap(),
                limits[0]["remaining"].as_u64().unwrap()
            ),
            ("1/1m (sliding_log)", 0)
        );
        assert!(limits[0]["reset_after_ms"].as_u64().unwrap() > 58_000);
        assert_eq!(limits[2]["remaining"], 9);

        let reset = service
            .http
            .delete(service.url(&path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(reset.status(), 200, "{backend:?}");
        assert_eq!(
            send(&service, phone).await.status(),
            200,
            "unblocked by support staff"
        );
    }
}

#[tokio::test]
async fn admin_routes_do_not_exist_without_a_token() {
    let service = Service::start(SMS, Backend::Memory, &[]);
    let response = service
        .http
        .get(service.url("/admin/limits/+447911123456"))
        .bearer_auth("")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn limits_change_at_runtime_without_a_restart() {
    for backend in BACKENDS {
        let service = start(backend, &[]);
        let phone = "+12025550123";
        assert_eq!(send(&service, phone).await.status(), 200);
        assert_eq!(send(&service, phone).await.status(), 429);

        let bad = service
            .http
            .put(service.url("/admin/config"))
            .bearer_auth(TOKEN)
            .json(&json!({ "phone": ["3 per fortnight"], "ip": ["20/1h"] }))
            .send()
            .await
            .unwrap();
        assert_eq!(bad.status(), 400);
        assert!(
            json(bad).await["message"]
                .as_str()
                .unwrap()
                .contains("3 per fortnight")
        );

        let changed = service
            .http
            .put(service.url("/admin/config"))
            .bearer_auth(TOKEN)
            .json(&json!({ "phone": ["3/1m"], "ip": ["20/1h"] }))
            .send()
            .await
            .unwrap();
        assert_eq!(changed.status(), 200);
        // The earlier send still counts under the new threshold: two more pass.
        assert_eq!(send(&service, phone).await.status(), 200, "{backend:?}");
        assert_eq!(send(&service, phone).await.status(), 200);
        assert_eq!(send(&service, phone).await.status(), 429);
        let config = json(
            service
                .http
                .get(service.url("/admin/config"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(config["phone"], json!(["3/1m"]));
    }
}

#[tokio::test]
async fn forwarded_for_counts_only_from_trusted_proxies() {
    let service = Service::start(
        SMS,
        Backend::Memory,
        &[
            ("TRUSTED_PROXIES", "127.0.0.1/32"),
            ("SMS_IP_LIMITS", "1/1h"),
        ],
    );
    let from = |client: &'static str, phone: &'static str| {
        service
            .http
            .post(service.url("/sms/send"))
            .header("x-forwarded-for", client)
            .json(&json!({ "phone": phone }))
            .send()
    };
    assert_eq!(
        from("198.51.100.1", "+12025550101").await.unwrap().status(),
        200
    );
    assert_eq!(
        from("198.51.100.2", "+12025550102").await.unwrap().status(),
        200,
        "another client behind the proxy"
    );
    assert_eq!(
        from("198.51.100.1", "+12025550103").await.unwrap().status(),
        429,
        "same client, IP limit 1/h"
    );
}

async fn admin(service: &Service, method: reqwest::Method, path: &str) -> reqwest::Response {
    service
        .http
        .request(method, service.url(path))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn every_way_of_writing_a_phone_is_one_identity_with_one_quota() {
    for backend in BACKENDS {
        let service = start(backend, &[("SMS_IP_LIMITS", "100/1h")]);
        assert_eq!(send(&service, "+8613800000000").await.status(), 200);
        for variant in [
            "+008613800000000",
            "0086 138 0000 0000",
            "+86 0 13800000000",
            "+86 (0) 138-0000-0000",
            "tel:+86-138-0000-0000",
        ] {
            assert_eq!(
                send(&service, variant).await.status(),
                429,
                "{backend:?}: {variant} is the same phone"
            );
        }
        // Admin routes take any accepted form and name the E.164 one.
        let shown = json(
            admin(
                &service,
                reqwest::Method::GET,
                "/admin/limits/+86%200%2013800000000",
            )
            .await,
        )
        .await;
        assert_eq!(shown["phone"], "+8613800000000", "{backend:?}");
        assert_eq!(shown["limits"][0]["remaining"], 0);
        let reset = admin(
            &service,
            reqwest::Method::DELETE,
            "/admin/limits/0086%2013800000000",
        )
        .await;
        assert_eq!(reset.status(), 200);
        assert_eq!(
            send(&service, "+008613800000000").await.status(),
            200,
            "{backend:?}: the reset unblocked every form"
        );
        assert_eq!(send(&service, "+8613800000000").await.status(), 429);
    }
}

#[tokio::test]
async fn the_bearer_scheme_is_accepted_in_any_case_and_the_token_still_must_match() {
    for backend in BACKENDS {
        let service = start(backend, &[]);
        let with = |authorization: &'static str| {
            service
                .http
                .get(service.url("/admin/config"))
                .header("authorization", authorization)
                .send()
        };
        for accepted in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "bEaReR  s3cret",
        ] {
            assert_eq!(
                with(accepted).await.unwrap().status(),
                200,
                "{backend:?}: {accepted}"
            );
        }
        for refused in [
            "bearer s3cre",
            "bearer s3cret2",
            "bearer S3CRET",
            "Basic s3cret",
            "bearers3cret",
            "s3cret",
            "bearer",
        ] {
            assert_eq!(
                with(refused).await.unwrap().status(),
                401,
                "{backend:?}: {refused}"
            );
        }
    }
}

#[tokio::test]
async fn the_redis_password_never_reaches_the_log() {
    let redis = RedisServer::start();
    let password = "hunter2-e3b0c442";
    let _: String = redis.cmd(&["CONFIG", "SET", "requirepass", password]).await;
    let url = format!("redis://default:{password}@127.0.0.1:{}/", redis.port());
    let service = Service::launch(
        SMS,
        Some(redis),
        &[
            ("REDIS_URL", &url),
            ("RUST_LOG", "debug"),
            ("ADMIN_TOKEN", TOKEN),
        ],
        true,
    );
    assert_eq!(send(&service, "+8613800000000").await.status(), 200);
    assert_eq!(send(&service, "+8613800000000").await.status(), 429);
    let shown = admin(
        &service,
        reqwest::Method::GET,
        "/admin/limits/+8613800000000",
    )
    .await;
    assert_eq!(
        shown.status(),
        200,
        "the service works on the password-protected Redis"
    );
    let log = service.log();
    assert!(!log.contains(password), "{log}");
    assert!(
        !log.contains("default:"),
        "the user name is masked too: {log}"
    );
    let masked = format!("redis://***@127.0.0.1:{}/", service.redis().port());
    assert!(log.contains(&masked), "the URL is shown masked: {log}");
}

/// Sends an SMS to each of `phones` every 50 ms for `outage`, counting the
/// `200`s per phone and every status seen.
async fn send_during(
    service: &Service,
    phones: &[&'static str],
    outage: Duration,
) -> (HashMap<&'static str, usize>, HashMap<u16, usize>) {
    let mut delivered: HashMap<&str, usize> = phones.iter().map(|p| (*p, 0)).collect();
    let mut statuses = HashMap::new();
    let started = Instant::now();
    while started.elapsed() < outage {
        let responses = join_all(phones.iter().map(|phone| send(service, phone))).await;
        for (phone, response) in phones.iter().zip(responses) {
            *statuses.entry(response.status().as_u16()).or_default() += 1;
            if response.status() == 200 {
                *delivered.get_mut(phone).unwrap() += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (delivered, statuses)
}

#[tokio::test]
async fn during_a_redis_outage_blocked_phones_get_no_sms_fresh_ones_their_share_then_redis_rules() {
    // 4 per minute per phone, shared by 2 instances: 2 per instance while
    // Redis is down.
    let service = Service::launch(
        SMS,
        Some(RedisServer::start()),
        &[
            ("ADMIN_TOKEN", TOKEN),
            ("SMS_PHONE_LIMITS", "4/1m,20/1d"),
            ("SMS_IP_LIMITS", "10000/1h"),
            ("SMS_INSTANCES", "2"),
        ],
        true,
    );
    let refused = "+8613800000001"; // used its 4, then refused
    let full = "+8613800000002"; // used its 4, never refused yet
    let fresh = "+8613800000003";
    for _ in 0..4 {
        assert_eq!(send(&service, refused).await.status(), 200);
        assert_eq!(send(&service, full).await.status(), 200);
    }
    assert_eq!(send(&service, refused).await.status(), 429);

    service.redis().pause();
    let (delivered, statuses) =
        send_during(&service, &[refused, full, fresh], Duration::from_secs(5)).await;
    service.redis().resume();
    let tries: usize = statuses.values().sum();
    assert!(tries >= 60, "{statuses:?}: enough sends to mean something");
    assert_eq!(
        statuses
            .keys()
            .copied()
            .filter(|s| *s != 200 && *s != 429)
            .count(),
        0,
        "{statuses:?}"
    );
    assert_eq!(
        delivered[refused], 0,
        "{delivered:?}: refused before the outage"
    );
    assert_eq!(
        delivered[full], 0,
        "{delivered:?}: at its limit before the outage"
    );
    assert_eq!(
        delivered[fresh], 2,
        "{delivered:?}: its local share, 4 / 2 instances"
    );

    // Back on Redis once a new phone's first send leaves 3 of 4 (Redis'
    // count) rather than 1 of 2 (the local share).
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0.. {
        assert!(Instant::now() < deadline, "Redis never decided again");
        let probe = send(&service, &format!("+86139{i:08}")).await;
        assert_eq!(probe.status(), 200);
        if probe.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .contains("r=3;")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Redis' state rules: it still holds the 4 sends of each blocked phone,
    // and never saw the fresh phone's 2 local ones.
    let blocked = send(&service, refused).await;
    assert_eq!(blocked.status(), 429);
    let retry_after: u64 = blocked.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry_after <= 55,
        "counted from the sends before the outage: {retry_after}"
    );
    assert_eq!(send(&service, full).await.status(), 429);
    assert_eq!(send(&service, fresh).await.status(), 200);
    let reset = admin(
        &service,
        reqwest::Method::DELETE,
        &format!("/admin/limits/{refused}"),
    )
    .await;
    assert_eq!(reset.status(), 200);
    assert_eq!(
        send(&service, refused).await.status(),
        200,
        "unblocked in Redis"
    );
}

#[tokio::test]
async fn admin_lists_refuse_a_phone_at_once_or_let_one_skip_its_limits() {
    for backend in BACKENDS {
        let service = start(backend, &[]);
        let blocked = "+447911123457";
        let path = format!("/admin/lists/deny/{blocked}");
        assert_eq!(
            admin(&service, reqwest::Method::PUT, &path).await.status(),
            200
        );
        let refused = send(&service, blocked).await;
        assert_eq!(refused.status(), 403, "{backend:?}");
        assert!(
            refused.headers().get("retry-after").is_none(),
            "no expiry, no Retry-After"
        );
        assert_eq!(json(refused).await["error"], "denied");
        // Written another way, it is the same phone.
        assert_eq!(send(&service, "+44 7911 123457").await.status(), 403);

        let lists = json(admin(&service, reqwest::Method::GET, "/admin/lists").await).await;
        assert_eq!(lists["entries"][0]["list"], "deny");
        assert_eq!(lists["entries"][0]["identity"], blocked);

        let unlisted = json(
            admin(
                &service,
                reqwest::Method::DELETE,
                &format!("/admin/lists/{blocked}"),
            )
            .await,
        )
        .await;
        assert_eq!(unlisted["unlisted"], true);
        assert_eq!(send(&service, blocked).await.status(), 200);

        let expiring = format!("/admin/lists/deny/{blocked}?for=1h");
        assert_eq!(
            admin(&service, reqwest::Method::PUT, &expiring)
                .await
                .status(),
            200
        );
        let refused = send(&service, blocked).await;
        assert_eq!(refused.status(), 403);
        assert!(
            refused.headers().get("retry-after").is_some(),
            "an expiring entry says when"
        );
        let bad = admin(
            &service,
            reqwest::Method::PUT,
            &format!("/admin/lists/block/{blocked}"),
        )
        .await;
        assert_eq!(bad.status(), 404);
        let soon = admin(&service, reqwest::Method::PUT, &format!("{path}?for=soon")).await;
        assert_eq!(soon.status(), 400);

        // An allow-listed phone skips the per-phone limits (1 per minute).
        let tester = "+447911123458";
        let allow = format!("/admin/lists/allow/{tester}");
        assert_eq!(
            admin(&service, reqwest::Method::PUT, &allow).await.status(),
            200
        );
        for _ in 0..3 {
            assert_eq!(send(&service, tester).await.status(), 200, "{backend:?}");
        }
    }
}
