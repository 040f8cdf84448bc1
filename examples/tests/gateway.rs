//! The gateway service over HTTP, on the in-memory backend and on Redis:
//! per-IP limits on every route, per-key tiers, allow and deny lists, and a
//! route that waits for its slot.

mod common;

use std::time::{Duration, Instant};

use common::{BACKENDS, Service, json};
use futures::future::join_all;

const GATEWAY: &str = env!("CARGO_BIN_EXE_gateway");
const FREE: &str = "demo-free-key";
const PRO: &str = "demo-pro-key";
const INTERNAL: &str = "demo-internal-key";
const REVOKED: &str = "demo-revoked-key";

async fn get(service: &Service, path: &str, key: Option<&str>) -> reqwest::Response {
    let mut request = service.http.get(service.url(path));
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    request.send().await.unwrap()
}

async fn statuses(service: &Service, path: &str, key: Option<&str>, n: usize) -> Vec<u16> {
    let mut seen = Vec::with_capacity(n);
    for _ in 0..n {
        seen.push(get(service, path, key).await.status().as_u16());
    }
    seen
}

#[tokio::test]
async fn every_route_is_limited_per_client_ip_with_rate_limit_headers() {
    for backend in BACKENDS {
        let service = Service::start(GATEWAY, backend, &[("GATEWAY_IP_LIMITS", "4/1m")]);
        assert_eq!(
            statuses(&service, "/health", None, 3).await,
            [200, 200, 200],
            "{backend:?}"
        );
        // A request without a key is refused by the key check, and still counts per IP.
        assert_eq!(get(&service, "/api/whoami", None).await.status(), 401);
        let refused = get(&service, "/api/whoami", Some(FREE)).await;
        assert_eq!(refused.status(), 429, "{backend:?}");
        let retry_after: u64 = refused.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=15).contains(&retry_after), "{retry_after}");
        assert!(
            refused.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("q=4"),
            "{:?}",
            refused.headers()
        );
        assert_eq!(json(refused).await["error"], "rate_limited");
        assert_eq!(get(&service, "/health", None).await.status(), 429);
        // Metrics are not limited.
        assert_eq!(get(&service, "/metrics", None).await.status(), 200);
    }
}

#[tokio::test]
async fn api_routes_need_a_known_key() {
    for backend in BACKENDS {
        let service = Service::start(GATEWAY, backend, &[]);
        for key in [None, Some("not-a-key-at-all"), Some("demo-free-ke")] {
            let response = get(&service, "/api/whoami", key).await;
            assert_eq!(response.status(), 401, "{backend:?} {key:?}");
            assert_eq!(json(response).await["error"], "unauthorized");
        }
        let me = json(get(&service, "/api/whoami", Some(PRO)).await).await;
        assert_eq!(me["client"], "globex");
        assert_eq!(me["plan"], "pro");
    }
}

#[tokio::test]
async fn each_plan_is_decided_by_its_tier_and_each_client_counts_alone() {
    for backend in BACKENDS {
        let service = Service::start(
            GATEWAY,
            backend,
            &[
                ("GATEWAY_FREE_LIMITS", "3/1m"),
                ("GATEWAY_PRO_LIMITS", "6/1m"),
            ],
        );
        assert_eq!(
            statuses(&service, "/api/items/1", Some(FREE), 4).await,
            [200, 200, 200, 429],
            "{backend:?}: free is 3 per minute"
        );
        assert_eq!(
            statuses(&service, "/api/items/1", Some(PRO), 7).await,
            [200, 200, 200, 200, 200, 200, 429],
            "{backend:?}: pro is 6 per minute, on its own count"
        );
        let refused = get(&service, "/api/whoami", Some(FREE)).await;
        assert!(
            refused.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("q=3"),
            "{:?}",
            refused.headers()
        );
    }
}

#[tokio::test]
async fn the_allow_listed_client_skips_its_plan_and_the_deny_listed_one_is_forbidden() {
    for backend in BACKENDS {
        let service = Service::start(GATEWAY, backend, &[("GATEWAY_PRO_LIMITS", "2/1m")]);
        // `internal` is on the pro plan, allow-listed: its plan's limits do not apply.
        assert_eq!(
            statuses(&service, "/api/whoami", Some(INTERNAL), 10).await,
            [200; 10],
            "{backend:?}"
        );
        let denied = get(&service, "/api/whoami", Some(REVOKED)).await;
        assert_eq!(denied.status(), 403, "{backend:?}");
        assert!(denied.headers().get("retry-after").is_none());
        assert_eq!(json(denied).await["error"], "denied");
    }
}

#[tokio::test]
async fn an_admin_lists_and_unlists_a_client_at_run_time() {
    for backend in BACKENDS {
        let service = Service::start(GATEWAY, backend, &[("ADMIN_TOKEN", "admin-secret")]);
        let admin = |method: reqwest::Method, path: &str| {
            service
                .http
                .request(method, service.url(path))
                .bearer_auth("admin-secret")
        };
        assert_eq!(get(&service, "/api/whoami", Some(FREE)).await.status(), 200);
        let listed = admin(reqwest::Method::PUT, "/admin/lists/deny/acme?for=1h")
            .send()
            .await
            .unwrap();
        assert_eq!(listed.status(), 200, "{backend:?}");
        let denied = get(&service, "/api/whoami", Some(FREE)).await;
        assert_eq!(denied.status(), 403, "{backend:?}");
        // An entry with an expiry says when to come back.
        assert!(denied.headers().get("retry-after").is_some());
        let lists = json(
            admin(reqwest::Method::GET, "/admin/lists")
                .send()
                .await
                .unwrap(),
        )
        .await;
        let entries = lists["entries"].as_array().unwrap();
        assert!(
            entries
                .iter()
                .any(|e| e["client"] == "acme" && e["list"] == "deny"),
            "{lists}"
        );
        let unlisted = admin(reqwest::Method::DELETE, "/admin/lists/acme")
            .send()
            .await
            .unwrap();
        assert_eq!(json(unlisted).await["unlisted"], true);
        assert_eq!(get(&service, "/api/whoami", Some(FREE)).await.status(), 200);
        // Unknown clients and lists, and calls without the token.
        let unknown = admin(reqwest::Method::PUT, "/admin/lists/deny/nobody")
            .send()
            .await
            .unwrap();
        assert_eq!(unknown.status(), 404);
        let no_list = admin(reqwest::Method::PUT, "/admin/lists/maybe/acme")
            .send()
            .await
            .unwrap();
        assert_eq!(no_list.status(), 404);
        let anonymous = service
            .http
            .get(service.url("/admin/lists"))
            .send()
            .await
            .unwrap();
        assert_eq!(anonymous.status(), 401);
    }
}

#[tokio::test]
async fn reports_wait_in_line_for_their_slot_instead_of_failing() {
    for backend in BACKENDS {
        // One report per 400 ms per client; a caller waits up to 2 s.
        let service = Service::start(
            GATEWAY,
            backend,
            &[
                ("GATEWAY_REPORT_LIMITS", "5/2s"),
                ("GATEWAY_FREE_LIMITS", "100/1m"),
            ],
        );
        let started = Instant::now();
        let answers = join_all((0..12).map(|_| async {
            let response = service
                .http
                .post(service.url("/api/reports"))
                .header("x-api-key", FREE)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, json(response).await, started.elapsed())
        }))
        .await;
        let mut waits: Vec<u64> = answers
            .iter()
            .filter(|(status, _, _)| *status == 200)
            .map(|(_, body, _)| body["waited_ms"].as_u64().unwrap())
            .collect();
        waits.sort_unstable();
        let refused: Vec<_> = answers.iter().filter(|(s, _, _)| *s == 429).collect();
        assert_eq!(waits.len() + refused.len(), 12, "{backend:?}: {answers:?}");
        // Within 2 s at one per 400 ms: the burst of the bucket, then one
        // slot per 400 ms up to the deadline.
        assert!(
            (5..=11).contains(&waits.len()),
            "{backend:?}: {} admitted, waits {waits:?}",
            waits.len()
        );
        assert!(
            waits.iter().all(|w| *w <= 2_100),
            "{backend:?}: nobody waits past 2 s: {waits:?}"
        );
        assert!(
            waits.last().is_some_and(|w| *w >= 300),
            "{backend:?}: callers over the rate waited in line: {waits:?}"
        );
        // Those whose slot is beyond the deadline are told at once.
        for (_, body, elapsed) in &refused {
            assert_eq!(body["error"], "rate_limited", "{body}");
            assert!(*elapsed < Duration::from_millis(1_500), "{elapsed:?}");
        }
    }
}
