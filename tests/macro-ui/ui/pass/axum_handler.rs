//! An axum handler with extractors (`ClientIp`, `Json`): limits per phone
//! and per IP in one call, a `Response` built from the rejection, and
//! `RateLimit` headers on successful responses. The function stays a valid
//! handler: its future is `Send`.

use std::net::{IpAddr, Ipv4Addr};

use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use ratewall::http::ClientIp;
use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(
    name = "sms_phone",
    key = body["phone"].as_str().unwrap_or_default(),
    limits = ["1/1m", "5/1h", "10/1d"],
    algorithm = sliding_log,
    also(name = "sms_ip", key = ip, limits = ["20/1h"], algorithm = sliding_log),
    on_reject = IntoResponse::into_response,
    headers,
)]
async fn send_sms(ip: ClientIp, Json(body): Json<serde_json::Value>) -> Response {
    Json(serde_json::json!({ "sent": body["phone"] })).into_response()
}

#[rate_limit(key = ip, period = 60, threshold = 5, headers)]
async fn status(ip: ClientIp) -> Result<Response, Rejection> {
    Ok("ok".into_response())
}

#[rate_limit(key = ip, period = 60, threshold = 5, count_if = |r: &Response| r.status() == 401,
             on_reject = |rejection: Rejection| rejection.into_response())]
async fn login(ip: ClientIp, Json(body): Json<serde_json::Value>) -> Response {
    if body["password"] != "hunter2" {
        return http::StatusCode::UNAUTHORIZED.into_response();
    }
    "welcome".into_response()
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    let _router: Router = Router::new()
        .route("/sms", post(send_sms))
        .route("/status", post(status))
        .route("/login", post(login));
    let ip = ClientIp::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let body = serde_json::json!({ "phone": "+15550100" });
    let sent = assert_send(send_sms(ip, Json(body.clone()))).await;
    assert!(sent.headers().contains_key("ratelimit"));
    let refused = send_sms(ip, Json(body)).await;
    assert_eq!(refused.status(), http::StatusCode::TOO_MANY_REQUESTS);
    assert!(
        status(ip)
            .await
            .unwrap()
            .headers()
            .contains_key("ratelimit-policy")
    );
    let denied = login(ip, Json(serde_json::json!({ "password": "x" }))).await;
    assert_eq!(denied.status(), http::StatusCode::UNAUTHORIZED);
}
