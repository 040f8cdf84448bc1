//! `also(...)`: more keys decided with the function's own in one call, each
//! with its own limits, algorithm, cost and key.

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(
    name = "sms_phone",
    key = phone,
    limits = ["1/1m", "5/1h"],
    algorithm = sliding_log,
    also(name = "sms_ip", key = ip, limits = ["20/1h"], algorithm = fixed_window, cost = 2),
    also(name = "sms_all", period = "1s", threshold = 100, algorithm = gcra, burst = 10),
    limiter = limiter,
    on_error = fail_closed,
)]
async fn send(limiter: &Limiter, ip: std::net::IpAddr, phone: String) -> Result<String, Rejection> {
    Ok(phone)
}

#[rate_limit(
    period = 60,
    threshold = 5,
    also(name = "tenant_calls", key = format_args!("{}-{}", tenant, user), period = 60, threshold = 50),
)]
async fn formatted_key(tenant: &str, user: u32) -> Result<u32, Rejection> {
    Ok(user)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    let limiter = Limiter::builder().build().unwrap();
    let ip = "203.0.113.9".parse().unwrap();
    assert_eq!(send(&limiter, ip, "+1".to_owned()).await.unwrap(), "+1");
    assert_eq!(
        send(&limiter, ip, "+1".to_owned())
            .await
            .unwrap_err()
            .name(),
        "sms_phone"
    );
    assert_eq!(formatted_key("acme", 1).await.unwrap(), 1);
}
