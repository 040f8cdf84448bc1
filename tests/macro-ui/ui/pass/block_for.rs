//! `block_for` on the function's limits, inside `also(...)`, on a tiered
//! group, beside `max_in_flight` and with `wait`: a refused key stays
//! refused for the block.

use std::time::Duration;

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(name = "login_user", key = user, limits = ["2/1m", "10/1h"], block_for = "15m",
             also(name = "login_ip", key = ip, period = 60, threshold = 100, algorithm = fixed_window,
                  block_for = 3600))]
async fn login(user: &str, ip: &str) -> Result<usize, Rejection> {
    Ok(user.len() + ip.len())
}

#[rate_limit(name = "api", key = user, tier = plan, tiers(free = ["1/1s"], pro = ["100/1s"]),
             block_for = "5s", max_in_flight = 4)]
async fn api(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

#[rate_limit(name = "jobs", key = tenant, period = "100ms", threshold = 1, block_for = "200ms", wait = "2s")]
async fn job(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    assert_eq!(login("alice", "ip").await.unwrap(), 7);
    assert_eq!(login("alice", "ip").await.unwrap(), 7);
    let refused = login("alice", "ip").await.unwrap_err();
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(15 * 60)));
    // Another user is untouched.
    assert!(login("bob", "ip").await.is_ok());
    assert!(api(1, "free").await.is_ok());
    // The block's end, later than the state's own retry (1 s).
    assert_eq!(
        api(1, "free").await.unwrap_err().retry_after(),
        Some(Duration::from_secs(5))
    );
    assert!(api(1, "pro").await.is_ok(), "another tier, its own state");
    // A waiting call on a blocked key waits for the block (and passes).
    assert!(job(1).await.is_ok());
    let started = std::time::Instant::now();
    assert!(job(1).await.is_ok());
    assert!(started.elapsed() >= Duration::from_millis(200));
}
