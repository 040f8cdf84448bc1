//! Tiers combine with the other call shapes: a tiered function may wait for
//! room (each call waits on its tier's limits) and may cap its calls in
//! flight (each tier holds its own slots).

use std::time::Duration;

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(
    name = "reports",
    key = tenant,
    tier = plan,
    tiers(free = ["2/1s"], pro = ["20/1s"]),
    algorithm = leaky_bucket,
    burst = 1,
    wait = "2s"
)]
async fn report(tenant: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(tenant + plan.len() as u64)
}

#[rate_limit(
    name = "exports",
    key = tenant,
    tier = plan,
    tiers(free = ["10/1m"], pro = ["1000/1m"]),
    max_in_flight = 1
)]
async fn export(tenant: u64, plan: &str) -> Result<u64, Rejection> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(tenant + plan.len() as u64)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    // The free tier's leaky bucket lets one call through every 500 ms: the
    // second waits for its slot instead of being refused.
    let start = std::time::Instant::now();
    report(1, "free").await.unwrap();
    report(1, "free").await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(400));
    // One export at a time per tenant and tier.
    let (a, b) = tokio::join!(export(7, "free"), export(7, "free"));
    assert!(a.is_ok() != b.is_ok(), "one runs, the other is refused");
    // Another tier holds its own slot.
    let (c, d) = tokio::join!(export(7, "free"), export(7, "pro"));
    assert!(c.is_ok() && d.is_ok());
}
