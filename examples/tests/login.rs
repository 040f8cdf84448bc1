//! The login service over HTTP, on the in-memory backend and on Redis.

mod common;

use std::time::Duration;

use common::{BACKENDS, Backend, Service, json};
use futures::future::join_all;
use serde_json::json;

const LOGIN: &str = env!("CARGO_BIN_EXE_login");

async fn login(service: &Service, username: &str, password: &str) -> reqwest::Response {
    service
        .post_json(
            "/login",
            json!({ "username": username, "password": password }),
        )
        .await
}

async fn captcha(service: &Service, username: &str) -> String {
    let body = json(
        service
            .http
            .get(service.url(&format!(
                "/captcha?username={}",
                username.replace(' ', "%20")
            )))
            .send()
            .await
            .unwrap(),
    )
    .await;
    body["captcha"].as_str().unwrap().to_owned()
}

async fn login_with_captcha(
    service: &Service,
    username: &str,
    password: &str,
    token: &str,
) -> reqwest::Response {
    service
        .post_json(
            "/login",
            json!({ "username": username, "password": password, "captcha": token }),
        )
        .await
}

#[tokio::test]
async fn right_password_logs_in_and_wrong_password_is_401() {
    for backend in BACKENDS {
        let service = Service::start(LOGIN, backend, &[]);
        let ok = login(&service, "alice", "wonderland").await;
        assert_eq!(ok.status(), 200, "{backend:?}");
        assert_eq!(json(ok).await["user"], "alice");
        let wrong = login(&service, "alice", "looking-glass").await;
        assert_eq!(wrong.status(), 401);
        assert_eq!(json(wrong).await["error"], "invalid_credentials");
    }
}

#[tokio::test]
async fn three_failures_in_a_minute_require_a_captcha_even_for_the_right_password() {
    for backend in BACKENDS {
        let service = Service::start(LOGIN, backend, &[]);
        for _ in 0..3 {
            assert_eq!(
                login(&service, "alice", "nope").await.status(),
                401,
                "{backend:?}"
            );
        }
        let locked = login(&service, "Alice ", "wonderland").await;
        assert_eq!(
            locked.status(),
            429,
            "{backend:?}: usernames are normalised"
        );
        assert!(locked.headers().contains_key("retry-after"));
        assert_eq!(json(locked).await["error"], "captcha_required");
        // Another user is not affected.
        assert_eq!(login(&service, "bob", "builder").await.status(), 200);
    }
}

#[tokio::test]
async fn a_valid_captcha_with_the_right_password_succeeds_and_resets_the_count() {
    for backend in BACKENDS {
        let service = Service::start(LOGIN, backend, &[]);
        for _ in 0..3 {
            login(&service, "alice", "nope").await;
        }
        assert_eq!(login(&service, "alice", "wonderland").await.status(), 429);

        let forged = service
            .post_json(
                "/login",
                json!({ "username": "alice", "password": "wonderland", "captcha": "forged" }),
            )
            .await;
        assert_eq!(
            json(forged).await["error"],
            "captcha_required",
            "{backend:?}: a forged captcha does not help"
        );

        let token = captcha(&service, "alice").await;
        let wrong_with_captcha = service
            .post_json(
                "/login",
                json!({ "username": "alice", "password": "nope", "captcha": token }),
            )
            .await;
        assert_eq!(
            wrong_with_captcha.status(),
            401,
            "a captcha lets the attempt through, the password decides"
        );

        let token = captcha(&service, "alice").await;
        let ok = service
            .post_json(
                "/login",
                json!({ "username": "alice", "password": "wonderland", "captcha": token }),
            )
            .await;
        assert_eq!(ok.status(), 200, "{backend:?}");
        // The count starts again: three more failures before the next captcha.
        for _ in 0..3 {
            assert_eq!(
                login(&service, "alice", "nope").await.status(),
                401,
                "{backend:?}"
            );
        }
        assert_eq!(login(&service, "alice", "nope").await.status(), 429);
    }
}

#[tokio::test]
async fn successful_logins_never_count() {
    for backend in BACKENDS {
        let service = Service::start(LOGIN, backend, &[]);
        for _ in 0..10 {
            assert_eq!(
                login(&service, "bob", "builder").await.status(),
                200,
                "{backend:?}"
            );
        }
        for _ in 0..3 {
            assert_eq!(
                login(&service, "bob", "wrong").await.status(),
                401,
                "{backend:?}"
            );
        }
        assert_eq!(login(&service, "bob", "wrong").await.status(), 429);
    }
}

#[tokio::test]
async fn concurrent_wrong_passwords_never_produce_more_than_three_401s() {
    for backend in BACKENDS {
        let service = Service::start(LOGIN, backend, &[]);
        let statuses: Vec<u16> = join_all((0..60).map(|_| login(&service, "alice", "guess")))
            .await
            .iter()
            .map(|r| r.status().as_u16())
            .collect();
        assert_eq!(
            statuses.iter().filter(|&&s| s == 401).count(),
            3,
            "{backend:?}: {statuses:?}"
        );
        assert_eq!(
            statuses.iter().filter(|&&s| s == 429).count(),
            57,
            "{backend:?}"
        );
    }
}

#[tokio::test]
async fn failures_per_ip_are_limited_across_usernames() {
    for backend in BACKENDS {
        let service = Service::start(LOGIN, backend, &[("LOGIN_IP_FAILURES", "5/1d")]);
        for user in ["u1", "u2", "u3", "u4", "u5"] {
            assert_eq!(
                login(&service, user, "x").await.status(),
                401,
                "{backend:?}"
            );
        }
        let refused = login(&service, "u6", "x").await;
        assert_eq!(refused.status(), 429, "{backend:?}");
        assert_eq!(
            refused.headers()["ratelimit-policy"],
            "\"login_ip\";q=5;w=86400"
        );
        assert_eq!(json(refused).await["error"], "rate_limited");
    }
}

#[tokio::test]
async fn malformed_logins_get_400() {
    let service = Service::start(LOGIN, Backend::Memory, &[]);
    for body in [
        "{",
        "{\"username\":\"alice\"}",
        "{\"username\":\"   \",\"password\":\"x\"}",
    ] {
        assert_eq!(
            service.post_raw("/login", body).await.status(),
            400,
            "{body}"
        );
    }
}

#[tokio::test]
async fn a_captcha_opens_one_attempt_for_its_own_username_until_it_expires() {
    for backend in BACKENDS {
        let service = Service::start(LOGIN, backend, &[("LOGIN_CAPTCHA_TTL", "1s")]);
        for user in ["alice", "bob"] {
            for _ in 0..3 {
                login(&service, user, "nope").await;
            }
        }
        let bobs = captcha(&service, "Bob ").await;
        let refused = login_with_captcha(&service, "alice", "wonderland", &bobs).await;
        assert_eq!(refused.status(), 429, "{backend:?}: bob's captcha");
        assert_eq!(json(refused).await["error"], "captcha_required");
        assert_eq!(
            login_with_captcha(&service, "bob", "builder", &bobs)
                .await
                .status(),
            200,
            "{backend:?}: still valid for bob, whose username it was issued for"
        );

        let alices = captcha(&service, "alice").await;
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let expired = login_with_captcha(&service, "alice", "wonderland", &alices).await;
        assert_eq!(expired.status(), 429, "{backend:?}: expired after 1 s");
        assert_eq!(json(expired).await["error"], "captcha_required");
        let fresh = captcha(&service, "alice").await;
        assert_eq!(
            login_with_captcha(&service, "alice", "wonderland", &fresh)
                .await
                .status(),
            200,
            "{backend:?}"
        );
    }
}

#[tokio::test]
async fn captchas_are_issued_at_most_at_the_limit_per_client_ip() {
    for backend in BACKENDS {
        let service = Service::start(
            LOGIN,
            backend,
            &[
                ("LOGIN_CAPTCHA_LIMITS", "3/1m"),
                ("TRUSTED_PROXIES", "127.0.0.1/32"),
            ],
        );
        let from = |client: &'static str, query: &'static str| {
            service
                .http
                .get(service.url(&format!("/captcha{query}")))
                .header("x-forwarded-for", client)
                .send()
        };
        for bad in ["", "?username=", "?user=alice"] {
            let response = from("198.51.100.1", bad).await.unwrap();
            assert_eq!(response.status(), 400, "{backend:?}: {bad:?}");
        }
        for _ in 0..3 {
            let issued = from("198.51.100.1", "?username=alice").await.unwrap();
            assert_eq!(
                issued.status(),
                200,
                "{backend:?}: bad requests took nothing"
            );
            assert_eq!(json(issued).await["captcha"].as_str().unwrap().len(), 32);
        }
        let refused = from("198.51.100.1", "?username=mallory").await.unwrap();
        assert_eq!(refused.status(), 429, "{backend:?}");
        assert!(refused.headers().contains_key("retry-after"));
        assert!(
            refused.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .starts_with("\"login_captcha\";q=3;"),
            "{:?}",
            refused.headers()
        );
        assert_eq!(
            from("198.51.100.2", "?username=alice")
                .await
                .unwrap()
                .status(),
            200,
            "{backend:?}: another client has its own quota"
        );
    }
}

/// Redis frozen (`SIGSTOP`) for 3 s under streams of right-password
/// logins: the calls sent during the freeze time out, are answered in
/// process (the service's `local` policy), and run in Redis when it
/// resumes. Each carried a request id and was cancelled by it once Redis
/// answered again, so no right password is refused for a captcha, during
/// the freeze or after it, and Redis ends with the counts the service
/// settled: none, every login having succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_never_turns_right_passwords_into_captchas_and_ends_with_the_settled_counts()
{
    let service = Service::launch(
        LOGIN,
        Some(ratewall_tests::harness::RedisServer::start()),
        &[],
        true,
    );
    let service = std::sync::Arc::new(service);
    let stop = std::time::Instant::now() + Duration::from_secs(9);
    // Two concurrent streams of bob's right password (fewer than the 3
    // failures a captcha takes: a login reserves its unit until it ran).
    let streams: Vec<_> = (0..2)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while std::time::Instant::now() < stop {
                    let response = login(&service, "bob", "builder").await;
                    let status = response.status().as_u16();
                    let body = response.text().await.unwrap_or_default();
                    statuses.push((status, body));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    service.redis().pause();
    tokio::time::sleep(Duration::from_secs(3)).await;
    service.redis().resume();
    let mut logins = 0;
    for stream in streams {
        for (status, body) in stream.await.unwrap() {
            logins += 1;
            assert_eq!(
                status,
                200,
                "a right password was refused ({body}) around a 3 s freeze of Redis; the service said:\n{}",
                service.log()
            );
        }
    }
    assert!(logins > 40, "only {logins} logins were made");
    // What Redis counts once the service's cancels have landed: nothing for
    // bob's failures, nothing for the IP's (read with a limiter of the
    // service's prefix: a peek takes nothing).
    let reader = ratewall::Limiter::builder()
        .backend(
            ratewall_redis::RedisBackend::connect(service.redis().url())
                .await
                .unwrap(),
        )
        .prefix("login")
        .build()
        .unwrap();
    let user_limit = ratewall::Limit::per_minute(3)
        .and_then(|l| l.with_algorithm(ratewall::Algorithm::SlidingLog))
        .unwrap();
    let ip_limit = ratewall::Limit::per_day(100)
        .and_then(|l| l.with_algorithm(ratewall::Algorithm::FixedWindow))
        .unwrap();
    let settled = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = |name: &'static str, identity: &'static str, limit| {
            let reader = &reader;
            async move {
                reader
                    .requests()
                    .peek_identity(name, &identity, &[limit])
                    .await
                    .unwrap()[0]
                    .remaining()
            }
        };
        let user = left("login_user", "bob", user_limit).await;
        let ip = left("login_ip", "127.0.0.1", ip_limit).await;
        if user == 3 && ip == 100 {
            break;
        }
        assert!(
            std::time::Instant::now() < settled,
            "Redis still counts {} failure(s) of bob and {} of the IP after every login succeeded",
            3 - user,
            100 - ip
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And the next right password is not asked for a captcha.
    assert_eq!(login(&service, "bob", "builder").await.status(), 200);
}
