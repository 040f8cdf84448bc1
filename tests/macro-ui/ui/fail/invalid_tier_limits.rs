use ratewall::{Rejection, rate_limit};

#[rate_limit(key = user, tier = plan, tiers(free = ["1/1m"], pro = ["5 every hour"]))]
async fn unreadable(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

#[rate_limit(
    key = user,
    tier = plan,
    algorithm = sliding_log,
    tiers(free = ["0/1m"], pro = ["1/1m", "2/60s"], team = ["20000/1h"]),
)]
async fn bad_limits(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

#[rate_limit(key = user, tier = plan, cost = 3, tiers(free = ["2/1m"], pro = ["10/1m"]))]
async fn too_costly(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

#[rate_limit(key = user, tier = plan, tiers(free = "10/1m"))]
async fn not_a_list(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

#[rate_limit(key = user, tier = plan, tiers(free = []))]
async fn no_limit(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

#[rate_limit(key = user, tier = plan, tiers(free))]
async fn no_value(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

fn main() {}
